"""Data files the product reads at run time, shipped inside the package (the wheel and spark-submit's zip) and read
with `importlib.resources`, never by a path relative to a checkout.

- `pending_delete_ledger_info.avsc`: PIP-186's record schema (the repository's copy is
  `schemas/avro/pending_delete_ledger_info.avsc`; tests/test_wheel.py checks the two agree);
- `cluster.example.toml`: the example config for a real cluster (`sweeper init-config` prints it; the repository's
  copy is `conf/cluster.example.toml`, checked the same way).
"""

from __future__ import annotations

from importlib import resources

PENDING_DELETE_SCHEMA = "pending_delete_ledger_info.avsc"
EXAMPLE_CONFIG = "cluster.example.toml"


def read_text(name: str) -> str:
    """One shipped file's text; works from a directory, a wheel's install and a zip on sys.path alike."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
