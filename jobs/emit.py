"""Spark entry point for the emit stage (PIP-186 phase 1): `spark-submit jobs/emit.py --config conf/x.toml`."""

from __future__ import annotations

import sys

from sweeper.cli import main

if __name__ == "__main__":
    sys.exit(main(["emit", *sys.argv[1:]]))
