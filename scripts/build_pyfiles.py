"""Build the zip that spark-submit ships to executors: the `sweeper` package, code and data (sweeper/resources).

    python3 scripts/build_pyfiles.py build/ledger_sweeper.zip [PACKAGE_DIR]

PACKAGE_DIR is the `sweeper` package to ship, where the submitting Python imports it from (spark-submit.sh asks
that Python: an installed wheel's site-packages/sweeper, or this checkout's sweeper/ in a development install);
by default this checkout's. Only the standard library, so it runs with whatever Python the submitting machine has.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

CHECKOUT_PACKAGE = Path(__file__).resolve().parents[1] / "sweeper"
SKIP_SUFFIXES = (".pyc", ".pyo")


def build(out: Path, package: Path = CHECKOUT_PACKAGE) -> list[str]:
    """Write the zip (replacing any old one) and return its member names (`sweeper/...`)."""
    package = Path(package).resolve()
    if not (package / "__init__.py").is_file() or package.name != "sweeper":
        raise SystemExit(f"build_pyfiles.py: {package} is not the sweeper package")
    out.parent.mkdir(parents=True, exist_ok=True)
    members = sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                     and not p.name.endswith(SKIP_SUFFIXES) and not p.name.startswith("."))
    tmp = out.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in members:
            zf.write(path, path.relative_to(package.parent).as_posix())
    tmp.replace(out)
    return [p.relative_to(package.parent).as_posix() for p in members]


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: build_pyfiles.py OUT.zip [PACKAGE_DIR]")
    names = build(Path(sys.argv[1]), *(Path(a) for a in sys.argv[2:]))
    print(f"{sys.argv[1]}: {len(names)} files of {Path(*sys.argv[2:3]) if len(sys.argv) == 3 else CHECKOUT_PACKAGE}")
