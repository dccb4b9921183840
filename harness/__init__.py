"""The test and development harness: the embedded sandbox, the real-Pulsar testbed, local ZooKeeper, S3 and Spark
standalone servers, and the process and port helpers they share.

Not product code (issues 22 and 36): it lives beside the `sweeper` package, never inside it, so neither the wheel nor
the zip spark-submit ships to executors carries it, and no product module imports it. Its commands (`sweeper
sandbox`, `sweeper testbed`, `sweeper audit`, `sweep --sandbox`) reach the CLI as a plugin, `harness.cli_plugin`,
through the `ledger_sweeper.cli` entry point of a checkout installed for development.
"""

from __future__ import annotations

import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


def python_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a Python child that imports the harness (`python -m harness...`): the checkout on its
    path, whatever directory the parent runs in."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), env.get("PYTHONPATH", "")) if p)
    return env
