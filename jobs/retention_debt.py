"""Spark entry point for the retention-debt stage: `spark-submit jobs/retention_debt.py --config conf/x.toml
[--run-id R]` (a reconciled run; default the latest)."""

from __future__ import annotations

import sys

from sweeper.cli import main

if __name__ == "__main__":
    sys.exit(main(["retention-debt", *sys.argv[1:]]))
