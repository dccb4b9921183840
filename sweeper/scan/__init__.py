"""Scanners: ZooKeeper and S3 metadata into rows for the snapshot tables."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class RowChunk:
    """Rows of one table as tuples in `columns`' order: what a scanner hands over for its many rows (the packer
    turns each column into Arrow at once); a dict a row stays for the few."""

    table: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]

    def dicts(self) -> Iterator[Row]:
        for values in self.rows:
            yield {"record_type": self.table, **dict(zip(self.columns, values, strict=True))}


def as_rows(items: Iterable[Row | RowChunk]) -> Iterator[Row]:
    """A scanner's output as one dict a row, chunks opened (for tests and small callers)."""
    for item in items:
        if isinstance(item, RowChunk):
            yield from item.dicts()
        else:
            yield item


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
