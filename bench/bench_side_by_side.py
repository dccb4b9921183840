"""Any bench script, this checkout against an earlier commit, alternately, in one run (issue 46: "measured side by
side in one session").

    .venv/bin/python bench/bench_side_by_side.py --baseline 4cbad41 --rounds 1 -- bench/bench_sweep.py \
        --topics 100000 --max-rollovers 16

Runs alternate (baseline, ours, baseline, ours, ...) so that the machine's drift hits both alike. Each run is the
script as that tree has it, with that tree's `sweeper` first on sys.path; its stage table (the lines
`<stage> <seconds> ...` and `total <seconds> ...` that bench_sweep prints) is read back and the best of the rounds
compared per stage. The baseline tree is a `git worktree` of `--baseline` in a temporary directory, sharing this
checkout's venv and jars (bench_floor.baseline_tree).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_floor import REPO, _env, baseline_tree

ROW = re.compile(r"^(snapshot|reconcile|retention_debt|emit|delete|reclaim|total)\s+([0-9]+\.[0-9])\b")


def run_once(tree: Path, script: str, args: list[str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, str(tree / script), *args], cwd=tree, capture_output=True, text=True,
                         env={**_env(), "PYTHONPATH": str(tree)}, timeout=4 * 3600)
    times = {m.group(1): float(m.group(2)) for m in map(ROW.match, out.stdout.splitlines()) if m}
    if out.returncode != 0 or "total" not in times:
        raise SystemExit(f"{script} in {tree} failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n"
                         f"{out.stderr[-3000:]}")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("script", help="the bench script, relative to the repository (e.g. bench/bench_sweep.py)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    ns = parser.parse_args()
    script_args = [a for a in ns.args if a != "--"]
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "ours": []}
    with tempfile.TemporaryDirectory(prefix="bench-pair-") as tmp:
        base = baseline_tree(ns.baseline, Path(tmp))
        try:
            for round_no in range(1, ns.rounds + 1):
                for name, tree in (("baseline", base), ("ours", REPO)):
                    times = run_once(tree, ns.script, script_args)
                    runs[name].append(times)
                    print(f"round {round_no} {name:8s} " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()),
                          flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
    print(f"best of {ns.rounds} (seconds; ratio = baseline / ours, above 1 means ours is faster):")
    for stage in runs["ours"][0]:
        best = {name: min(r.get(stage, float("inf")) for r in rs) for name, rs in runs.items()}
        if best["ours"] > 0 and best["baseline"] != float("inf"):
            print(f"  {stage:<15} baseline {best['baseline']:8.1f}  ours {best['ours']:8.1f}  "
                  f"ratio {best['baseline'] / best['ours']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
