"""Build the zip that spark-submit ships to executors: our packages plus the data files they read.

    python3 scripts/build_pyfiles.py build/ledger_sweeper.zip

Only the standard library, so it runs with whatever Python the submitting machine has.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sweeper", "jobs")
# Non-Python files executors read through the zip importer (sweeper.pending_delete's Avro schema).
DATA_GLOBS = ("schemas/avro/*.avsc",)


def build(out: Path) -> list[str]:
    """Write the zip (replacing any old one) and return its member names."""
    out.parent.mkdir(parents=True, exist_ok=True)
    members = sorted(
        [p for top in PACKAGES for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts]
        + [p for pattern in DATA_GLOBS for p in REPO.glob(pattern)]
    )
    tmp = out.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in members:
            zf.write(path, path.relative_to(REPO).as_posix())
    tmp.replace(out)
    return [p.relative_to(REPO).as_posix() for p in members]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: build_pyfiles.py OUT.zip")
    names = build(Path(sys.argv[1]))
    print(f"{sys.argv[1]}: {len(names)} files")
