"""Why a ledger nothing references is (or is not) an orphan: one pure function, plain records.

Reconcile gathers, for every Pulsar ledger that no managed ledger, cursor, schema locator,
bucket property or compaction reference points at, the facts about its would-be owner; this
module turns those facts into a verdict. Anything we cannot establish is `unknown`, never an
orphan: a sweeper that guesses deletes data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    IN_USE = "in_use"
    ORPHAN = "orphan"
    UNKNOWN = "unknown"
    NON_PULSAR = "non_pulsar"


class Reason(StrEnum):
    REFERENCED = "referenced"
    NOT_PULSAR = "not_pulsar"
    TOPIC_DELETED = "topic_deleted"
    DROPPED_FROM_LIST = "dropped_from_list"
    CURSOR_LEDGER_REPLACED = "cursor_ledger_replaced"
    CURSOR_DELETED = "cursor_deleted"
    SCHEMA_VERSION_DELETED = "schema_version_deleted"
    SCHEMA_DELETED = "schema_deleted"
    BUCKET_SNAPSHOT_LEAKED = "bucket_snapshot_leaked"
    COMPACTED_LEDGER_LEAKED = "compacted_ledger_leaked"
    BOOKKEEPER_DELETED_BUT_PRESENT = "bookkeeper_deleted_but_present"
    # unknown: the owner could not be established or read
    NO_OWNER = "owner_missing_from_metadata"
    UNKNOWN_COMPONENT = "unknown_component"
    OWNER_UNREADABLE = "owner_metadata_quarantined"
    COMPACTION_REFERENCE_UNREADABLE = "compaction_reference_in_cursor_ledger"


MANAGED_LEDGER = "managed-ledger"
SCHEMA = "schema"
BUCKET = "delayed-index-bucket"
COMPACTED = "compacted-ledger"


@dataclass(frozen=True, slots=True)
class LedgerFacts:
    """What reconcile knows about one BookKeeper ledger and its owner, from one snapshot."""

    is_pulsar: bool
    referenced: bool  # some live reference points at this ledger id
    component: str | None = None
    managed_ledger: str | None = None  # owner ML: from metadata, or resolved from the topic name
    cursor: str | None = None
    schema_id: str | None = None
    owner_topic: str | None = None  # bucket / compacted ledgers name a topic, not a managed ledger
    listed_as_bookkeeper_deleted: bool = False  # an ML lists it offloaded with bookkeeperDeleted=true
    owner_exists: bool = False  # the managed ledger (or schema locator) is in the snapshot
    owner_quarantined: bool = False  # its managed ledger, a cursor of it, or its schema locator is undecodable
    cursor_exists: bool = False
    compaction_readable: bool | None = None  # None: the topic has no __compaction cursor


@dataclass(frozen=True, slots=True)
class Classification:
    verdict: Verdict
    reason: Reason
    detail: str = ""


def classify(f: LedgerFacts) -> Classification:
    if not f.is_pulsar:
        return Classification(Verdict.NON_PULSAR, Reason.NOT_PULSAR)
    if f.referenced:
        return Classification(Verdict.IN_USE, Reason.REFERENCED)
    if f.component == MANAGED_LEDGER:
        return _managed_ledger(f)
    if f.component == SCHEMA:
        return _schema(f)
    if f.component in (BUCKET, COMPACTED):
        return _topic_owned(f)
    return Classification(Verdict.UNKNOWN, Reason.UNKNOWN_COMPONENT, f"component={f.component!r}")


def _unknown_owner(f: LedgerFacts, what: str) -> Classification | None:
    if not (f.managed_ledger or f.schema_id or f.owner_topic):
        return Classification(Verdict.UNKNOWN, Reason.NO_OWNER, f"{what} ledger without owner metadata")
    if f.owner_quarantined:
        owner = f.managed_ledger or f.schema_id or f.owner_topic
        return Classification(Verdict.UNKNOWN, Reason.OWNER_UNREADABLE, f"metadata of {owner} could not be decoded")
    return None


def _managed_ledger(f: LedgerFacts) -> Classification:
    if f.listed_as_bookkeeper_deleted and f.owner_exists and not f.owner_quarantined:
        return Classification(Verdict.ORPHAN, Reason.BOOKKEEPER_DELETED_BUT_PRESENT,
                              f"{f.managed_ledger} lists it offloaded with bookkeeperDeleted=true")
    if (unknown := _unknown_owner(f, "managed-ledger")) is not None:
        return unknown
    if not f.owner_exists:
        return Classification(Verdict.ORPHAN, Reason.TOPIC_DELETED, f"managed ledger {f.managed_ledger} is gone")
    if f.cursor is None:
        return Classification(Verdict.ORPHAN, Reason.DROPPED_FROM_LIST,
                              f"{f.managed_ledger} exists but does not list it")
    if not f.cursor_exists:
        return Classification(Verdict.ORPHAN, Reason.CURSOR_DELETED, f"cursor {f.cursor} is gone")
    return Classification(Verdict.ORPHAN, Reason.CURSOR_LEDGER_REPLACED,
                          f"cursor {f.cursor} points at another cursor ledger")


def _schema(f: LedgerFacts) -> Classification:
    if (unknown := _unknown_owner(f, "schema")) is not None:
        return unknown
    if not f.owner_exists:
        return Classification(Verdict.ORPHAN, Reason.SCHEMA_DELETED, f"schema {f.schema_id} is gone")
    return Classification(Verdict.ORPHAN, Reason.SCHEMA_VERSION_DELETED,
                          f"schema {f.schema_id} does not list this version")


def _topic_owned(f: LedgerFacts) -> Classification:
    what = "bucket" if f.component == BUCKET else "compacted"
    if (unknown := _unknown_owner(f, what)) is not None:
        return unknown
    if not f.owner_exists:
        return Classification(Verdict.ORPHAN, Reason.TOPIC_DELETED, f"topic {f.owner_topic} is gone")
    if f.component == BUCKET:
        return Classification(Verdict.ORPHAN, Reason.BUCKET_SNAPSHOT_LEAKED,
                              f"no cursor of {f.owner_topic} holds this bucket snapshot")
    if f.compaction_readable is False:
        return Classification(Verdict.UNKNOWN, Reason.COMPACTION_REFERENCE_UNREADABLE,
                              "the compacted-ledger reference is in the cursor ledger, out of a ZooKeeper scan's reach")
    return Classification(Verdict.ORPHAN, Reason.COMPACTED_LEDGER_LEAKED,
                          f"{f.owner_topic}'s compaction points at another ledger")


@dataclass(frozen=True, slots=True)
class ObjectFacts:
    """What reconcile knows about one tiered-storage object."""

    referenced: bool  # some managed ledger lists (uuid, ledger id) in an offload context
    offload_complete: bool | None = None  # of the referencing context
    offload_in_flight: bool = False  # incomplete and recent: still being written
    owner_quarantined: bool = False


class ObjectReason(StrEnum):
    REFERENCED = "offload_referenced"
    IN_FLIGHT = "offload_in_flight"
    STALE_INCOMPLETE = "offload_incomplete_and_stale"
    UNREFERENCED = "offload_unreferenced"
    OWNER_UNREADABLE = "owner_metadata_quarantined"


def classify_object(f: ObjectFacts) -> tuple[Verdict, ObjectReason]:
    """Only an object no offload context names is an orphan; an incomplete one is never guessed at."""
    if f.referenced:
        if f.offload_complete:
            return Verdict.IN_USE, ObjectReason.REFERENCED
        if f.offload_in_flight:
            return Verdict.IN_USE, ObjectReason.IN_FLIGHT
        return Verdict.UNKNOWN, ObjectReason.STALE_INCOMPLETE
    if f.owner_quarantined:
        return Verdict.UNKNOWN, ObjectReason.OWNER_UNREADABLE
    return Verdict.ORPHAN, ObjectReason.UNREFERENCED
