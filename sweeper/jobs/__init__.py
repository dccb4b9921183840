"""The Spark entry points: one module per stage, each with a `main(argv=None) -> int` that runs the stage's command
(sweeper.cli) with the arguments spark-submit passed, so a job and `sweeper STAGE` are one code path.

    spark-submit ... jobs/sweep.py --config conf/prod.toml     # the repository's jobs/ wrappers import these
    python -m sweeper.jobs.sweep --config conf/prod.toml       # the same without spark-submit

They live in the package, so an installed wheel has them; spark-submit.sh ships the installed package (a zip of
this `sweeper`) to the executors and submits the wrapper.
"""

from __future__ import annotations

import sys

# Job module -> the CLI command it runs.
STAGES: dict[str, str] = {
    "snapshot": "snapshot",
    "reconcile": "reconcile",
    "retention_debt": "retention-debt",
    "emit": "emit",
    "delete": "delete",
    "sweep": "sweep",
}


def run(stage: str, argv: list[str] | None = None) -> int:
    """Run job `stage` with `argv` (default: this process's arguments after the script)."""
    from sweeper.cli import main

    return main([STAGES[stage], *(sys.argv[1:] if argv is None else argv)])
