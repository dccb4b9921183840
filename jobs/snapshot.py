"""Spark entry point for the snapshot stage: `spark-submit jobs/snapshot.py --config conf/x.toml`."""

from __future__ import annotations

import sys

from sweeper.cli import main

if __name__ == "__main__":
    sys.exit(main(["snapshot", *sys.argv[1:]]))
