"""What a commit says of itself, the same for both engines: the keys we add to its metadata, the result an append
returns, and a commit as a history entry."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# Keys we add to every commit's metadata (user keys cannot override them).
COMMIT_ID_KEY = "sweeper.commit_id"
TABLE_KEY = "sweeper.table"
ENGINE_KEY = "sweeper.engine"
ROWS_KEY = "sweeper.rows"
FILES_KEY = "sweeper.files"
ADDED_KEY = "sweeper.added_columns"  # in the metadata of a commit that added columns (schema evolution)


@dataclass(frozen=True)
class CommitResult:
    table: str
    version: int  # Delta table version created by this commit (the current one when nothing was committed)
    rows: int
    files: int
    engine: str


def to_millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)


def parse_user_metadata(value: Any) -> dict[str, str]:
    if not value:
        return {}
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return {"userMetadata": str(value)}
    if not isinstance(parsed, dict):
        return {"userMetadata": str(value)}
    return {str(k): str(v) for k, v in parsed.items()}


def history_entry(version: int, timestamp: Any, operation: Any, parameters: Any, metrics: Any,
                  user_metadata: Any, engine_info: Any) -> dict[str, Any]:
    """One commit, in the same shape for both engines."""
    metadata = parse_user_metadata(user_metadata)
    metrics = dict(metrics or {})
    # Rows added: our delta-rs commits record it in their metadata, Delta-Spark and delta-rs's own
    # writer in their operation metrics.
    rows = metadata.get(ROWS_KEY, metrics.get("numOutputRows", metrics.get("num_added_rows")))
    return {
        "version": int(version),
        "timestamp": to_millis(timestamp),  # ms since the epoch, UTC
        "operation": operation,
        "rows": int(rows) if rows is not None else None,
        "operation_parameters": dict(parameters or {}),
        "operation_metrics": metrics,
        "metadata": metadata,  # what append(commit_metadata=...) recorded, plus sweeper.* keys
        "engine_info": engine_info,
    }
