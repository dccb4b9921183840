"""Spark entry point for the delete stage (PIP-186 phase 2): `spark-submit jobs/delete.py --config conf/x.toml`."""

from __future__ import annotations

import sys

from sweeper.cli import main

if __name__ == "__main__":
    sys.exit(main(["delete", *sys.argv[1:]]))
