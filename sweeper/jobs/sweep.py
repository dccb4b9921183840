"""Spark entry point for a whole run: the stages in order under one run id (`--until`, `--execute`)."""

from __future__ import annotations

import sys

from sweeper.jobs import run


def main(argv: list[str] | None = None) -> int:
    return run("sweep", argv)


if __name__ == "__main__":
    sys.exit(main())
