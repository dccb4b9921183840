"""Scanners: ZooKeeper and S3 metadata into rows for the snapshot tables."""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]


def quarantine_row(source: str, path: str, error_kind: str, error: str, *, raw: bytes | None = None,
                   zk_version: int | None = None, ledger_id: int | None = None, owner: str | None = None) -> Row:
    """A `quarantine` row: what could not be read or decoded, why, and the bytes as found."""
    return {
        "record_type": "quarantine",
        "source": source,
        "path": path,
        "ledger_id": ledger_id,
        "owner": owner,
        "error_kind": error_kind,
        "error": error,
        "zk_version": zk_version,
        "raw": raw,
    }
