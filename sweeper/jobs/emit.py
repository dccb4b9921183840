"""Spark entry point for the emit stage (PIP-186 phase 1): publish a run's candidates to the pending-delete topic."""

from __future__ import annotations

import sys

from sweeper.jobs import run


def main(argv: list[str] | None = None) -> int:
    return run("emit", argv)


if __name__ == "__main__":
    sys.exit(main())
