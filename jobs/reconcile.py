"""Spark entry point for the reconcile stage: `spark-submit jobs/reconcile.py --config conf/x.toml [--run-id R]`."""

from __future__ import annotations

import sys

from sweeper.cli import main

if __name__ == "__main__":
    sys.exit(main(["reconcile", *sys.argv[1:]]))
