"""Spark entry point for the retention-debt stage on a reconciled run (default: the latest)."""

from __future__ import annotations

import sys

from sweeper.jobs import run


def main(argv: list[str] | None = None) -> int:
    return run("retention_debt", argv)


if __name__ == "__main__":
    sys.exit(main())
