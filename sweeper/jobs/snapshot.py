"""Spark entry point for the snapshot stage: scan the metadata into tables."""

from __future__ import annotations

import sys

from sweeper.jobs import run


def main(argv: list[str] | None = None) -> int:
    return run("snapshot", argv)


if __name__ == "__main__":
    sys.exit(main())
