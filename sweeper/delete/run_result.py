"""What a delete run returns: its counts (one `runs` row) and its result, with each record's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sweeper import runs
from sweeper.delete.results import DeleteResult


@dataclass(frozen=True)
class DeleteCounts(runs.StageCounts):
    """Where the records came from, what was resolved from an interrupted attempt, and each record's outcome."""

    # Inputs: the run's emitted records (or a drained topic, or an operator's list) and the due retries.
    emitted: int = 0
    already_final: int = 0
    not_due: int = 0
    due_retries: int = 0
    from_topic: int = 0
    from_json: int = 0
    records: int = 0
    deferred_by_cap: int = 0
    shadow_topics: int = 0
    missing_permissions: int = 0
    # An earlier attempt of the run that stopped: its deletes are on record as its own (sweeper.delete.journal).
    interrupted_attempts: int = 0
    interrupted_deleted: int = 0
    interrupted_recovered: int = 0
    interrupted_still_present: int = 0
    # The `interrupted` row of a stopped attempt itself (sweeper.delete.journal.resolve_interrupted).
    recovered_from_journal: int = 0  # deleted by it, known only from its intents
    attempted_still_present: int = 0
    # Outcomes (sweeper.delete.results), one per record.
    deleted: int = 0
    would_delete: int = 0
    already_gone: int = 0
    not_found: int = 0
    in_use: int = 0
    mismatch: int = 0
    invalid: int = 0
    refused: int = 0
    failed: int = 0
    queued_for_retry: int = 0
    dead_lettered: int = 0
    acknowledged: int = 0  # messages acknowledged on the drained topic
    # The run's settings, recorded with its counts.
    execute: int = 0
    deletes_per_second_per_task: int = 0


@dataclass
class DeleteRunResult:
    run_id: str
    execute: bool
    counts: DeleteCounts
    duration_s: float
    results: list[DeleteResult] = field(default_factory=list)
    guards: dict[str, Any] = field(default_factory=dict)

    @property
    def queued(self) -> int:
        return self.counts.queued_for_retry
