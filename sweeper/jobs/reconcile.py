"""Spark entry point for the reconcile stage: the data-quality gates, then the orphans of a snapshot."""

from __future__ import annotations

import sys

from sweeper.jobs import run


def main(argv: list[str] | None = None) -> int:
    return run("reconcile", argv)


if __name__ == "__main__":
    sys.exit(main())
