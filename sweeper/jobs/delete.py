"""Spark entry point for the delete stage (PIP-186 phase 2): re-verify and delete a run's pending deletes."""

from __future__ import annotations

import sys

from sweeper.jobs import run


def main(argv: list[str] | None = None) -> int:
    return run("delete", argv)


if __name__ == "__main__":
    sys.exit(main())
