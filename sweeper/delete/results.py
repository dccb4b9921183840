"""What the delete phase reports for one PendingDeleteLedgerInfo record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DELETED = "deleted"
WOULD_DELETE = "would_delete"
ALREADY_GONE = "already_gone"
NOT_FOUND = "not_found"  # an operator-listed id no snapshot ever saw, with no znode (sweeper.delete.decide)
IN_USE = "in_use"
MISMATCH = "mismatch"
INVALID = "invalid"
FAILED = "failed"
# A rule of today's config forbids it (shared BookKeeper unverified, protected, out of scope, another cluster's):
# the detail starts with the rule's name (sweeper.rules.owner).
REFUSED = "refused"

# The detail of a `failed` delete whose answer never came (ZooKeeper's ConnectionLoss or a timeout, Oxia's gRPC
# UNAVAILABLE, an S3 DeleteObjects answered 500 or not at all): it may have been applied (DESIGN.md invariant 18).
# The journal's outcome row carries it, so the next look at the target, in this task, another or a later attempt,
# files a target now gone as `deleted` by this run (`answer_lost_deleted`), not `already_gone`.
ANSWER_LOST = "delete sent, its answer lost: unknown whether it was applied"


def answer_lost_deleted(why: str, by: str = "this run") -> str:
    """The detail of a `deleted` result known from a lost answer and the target's absence afterwards."""
    return f"deleted by {by}; the answer to its delete was lost ({why})"


# Every outcome but `failed` settles the record: PIP-186 acknowledges in-use, gone and mismatched
# records instead of retrying them, since retrying cannot change the answer.
FINAL_OUTCOMES = frozenset({DELETED, WOULD_DELETE, ALREADY_GONE, NOT_FOUND, IN_USE, MISMATCH, INVALID, REFUSED})


@dataclass
class DeleteResult:
    ledger_id: int | None
    ledger_type: str | None
    component: str | None
    topic_name: str | None
    outcome: str
    detail: str = ""
    error: str | None = None
    attempt: int = 1
    duration_ms: int = 0
    zk_path: str | None = None
    zk_version: int | None = None
    s3_bucket: str | None = None
    s3_keys: list[str] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.outcome in FINAL_OUTCOMES


def result_for(record: Mapping[str, Any], outcome: str, detail: str = "", **fields: Any) -> DeleteResult:
    """A result carrying the record's identity; tolerant of malformed records (they are reported, not raised)."""
    context = record.get("offloadContext") or {}
    ledger_id = record.get("ledgerId")
    result = DeleteResult(
        ledger_id=ledger_id if isinstance(ledger_id, int) else None,
        ledger_type=record.get("ledgerType"),
        component=record.get("ledgerComponent"),
        topic_name=record.get("topicName"),
        outcome=outcome,
        detail=detail,
        s3_bucket=context.get("bucket") if isinstance(context, Mapping) else None,
        s3_keys=list(context.get("keys") or []) if isinstance(context, Mapping) else [],
    )
    for name, value in fields.items():
        setattr(result, name, value)
    return result
