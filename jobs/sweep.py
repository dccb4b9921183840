"""Spark entry point for a whole run: `spark-submit jobs/sweep.py --config conf/x.toml [--until reconcile]`."""

from __future__ import annotations

import sys

from sweeper.cli import main

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
