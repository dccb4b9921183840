"""The small-run floor (issue 37): the README's sandbox sweep, this checkout against an earlier commit, in one run.

    .venv/bin/python bench/bench_floor.py --baseline 03565cf --rounds 3
    .venv/bin/python bench/bench_floor.py --baseline 2f27f67 --rounds 3 --history 30   # tables of 30 earlier runs

Both trees sweep the same running sandbox (`sweeper sandbox up`; the README's first command leaves one up) as the
README's `sweeper sweep --sandbox` does: a new process, so a cold Spark JVM, with a fresh tables root each time.
Runs alternate (baseline, ours, baseline, ours, ...) so that the machine's drift hits both alike. Each run's stage
time is snapshot + reconcile + retention debt as the sweep's summary prints them; the best of the rounds is compared.
The baseline tree is a `git worktree` of `--baseline` in a temporary directory, using this checkout's venv and jars.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run in the tree under test (its `sweeper` first on sys.path): one dry-run sweep, its stage seconds as JSON.
CHILD = """
import dataclasses, json, sys, tempfile
from sweeper.config import load
from sweeper.spark import get_spark
from sweeper.tables import open_table_store
from sweeper import pipeline
cfg = load(sys.argv[1])
root = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="floor-")
sweeps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
cfg = dataclasses.replace(cfg, tables=dataclasses.replace(cfg.tables, root=root))
spark = get_spark(cfg.spark.app_name, master=cfg.spark.master or None)
store = open_table_store(cfg.tables.root, spark, engine=cfg.tables.engine)
for _ in range(sweeps):
    result = pipeline.sweep(spark, cfg, store, log=lambda *a: None)
print("RESULT " + json.dumps({k: v["seconds"] for k, v in result.stages.items()}), flush=True)
"""

STAGES = ("snapshot", "reconcile", "retention_debt")


def sweep_once(tree: Path, config: Path, script: Path, *extra: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, str(script), str(config), *extra], cwd=tree, capture_output=True,
                         text=True, env={**_env(), "PYTHONPATH": str(tree)}, timeout=3600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"the sweep in {tree} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME")}


def baseline_tree(ref: str, where: Path) -> Path:
    tree = where / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref], check=True,
                   capture_output=True)
    (tree / ".venv").symlink_to(REPO / ".venv")
    (tree / "jvm").mkdir(exist_ok=True)
    (tree / "jvm" / "target").symlink_to(REPO / "jvm" / "target")
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the commit to compare with (e.g. the one before issue 37)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--history", type=int, default=0,
                        help="sweep this many times first (baseline code, one process) into a tables root that each "
                             "measured run then starts from a copy of: a scheduled sweep's tables hold its past runs")
    parser.add_argument("--config", default=str(REPO / "var" / "sandbox" / "sweeper.toml"),
                        help="the running sandbox's config (written by `sweeper sandbox up`)")
    args = parser.parse_args()
    config = Path(args.config).resolve()
    if not config.exists():
        raise SystemExit(f"no sandbox config at {config}: run `.venv/bin/sweeper sandbox up` first")
    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        base = baseline_tree(args.baseline, Path(tmp))
        script = Path(tmp) / "sweep_once.py"  # a file, not `python -c`: Spark's workers re-import __main__
        script.write_text(CHILD)
        history = Path(tmp) / "history"
        try:
            if args.history:
                sweep_once(base, config, script, str(history), str(args.history))
                print(f"{args.history} earlier runs in the tables each run starts from", flush=True)
            times: dict[str, list[float]] = {"baseline": [], "ours": []}
            for round_no in range(1, args.rounds + 1):
                for name, tree in (("baseline", base), ("ours", REPO)):
                    root = Path(tmp) / f"{name}-{round_no}"
                    if args.history:
                        shutil.copytree(history, root)
                    stages = sweep_once(tree, config, script, str(root))
                    total = round(sum(stages.get(s, 0.0) for s in STAGES), 1)
                    times[name].append(total)
                    print(f"round {round_no} {name:8s} stage time {total:5.1f} s  "
                          + ", ".join(f"{s} {stages.get(s, 0.0):.1f}" for s in STAGES), flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
    best = {name: min(values) for name, values in times.items()}
    print(f"best of {args.rounds}: baseline {best['baseline']:.1f} s, ours {best['ours']:.1f} s, "
          f"ratio {best['baseline'] / best['ours']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
