"""Why a ledger nothing references is (or is not) an orphan: one pure function, plain records.

Reconcile gathers, for every Pulsar ledger that no managed ledger, cursor, schema locator,
bucket property or compaction reference points at, the facts about its would-be owner; this
module turns those facts into a verdict. Anything we cannot establish is `unknown`, never an
orphan: a sweeper that guesses deletes data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sweeper import names


class Verdict(StrEnum):
    IN_USE = "in_use"
    ORPHAN = "orphan"
    UNKNOWN = "unknown"
    NON_PULSAR = "non_pulsar"
    OTHER_CLUSTER = "other_cluster"  # another Pulsar cluster's data in a shared store: never ours to delete


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
    OWNER_NAME_INVALID = "owner_name_not_pulsar_form"
    COMPACTION_REFERENCE_UNREADABLE = "compaction_reference_in_cursor_ledger"
    COMPACTION_POINTER_MAY_LAG = "compaction_pointer_may_lag"
    COMPACTION_UNRECORDED = "compaction_pointer_not_recorded"
    NAMESPACE_UNKNOWN = "namespace_unknown"
    # Another Pulsar cluster writes to these bookies and not all of them were read: nothing is an orphan.
    SHARED_BOOKKEEPER_UNVERIFIED = "shared_bookkeeper_unverified"
    OFFLOADED_COPY_UNVERIFIED = "offloaded_copy_not_verified"  # bookkeeperDeleted, but the S3 copy is not proven
    OWNED_BY_PEER = "owned_by_peer_cluster"  # its owner exists only in a peer cluster's metadata


class Sharing(StrEnum):
    """Who else writes to this BookKeeper, as far as this run knows ([safety] bookkeeper_dedicated, peer_metadata).

    BookKeeper's ledger metadata names no cluster, and every cluster has `public/default`: an owner name
    proves nothing until every cluster sharing the bookies has been read.
    """

    DEDICATED = "dedicated"  # the operator declared that only this cluster writes here
    PEERS_READ = "peers_read"  # every peer in [safety] peer_metadata was read into this snapshot
    UNVERIFIED = "unverified"  # shared, and some cluster sharing it is unknown or unread


MANAGED_LEDGER = "managed-ledger"
SCHEMA = "schema"
BUCKET = "delayed-index-bucket"
COMPACTED = "compacted-ledger"


@dataclass(frozen=True, slots=True)
class CompactionPointer:
    """The `__compaction` cursor's `CompactedTopicLedger` as ZooKeeper holds it.

    Pulsar writes a cursor's mark-delete properties to its znode only when the cursor ledger is
    switched or the cursor closes (`ManagedCursorImpl.persistPositionMetaStore`); each compaction's
    `markDelete(..., {CompactedTopicLedger: C})` goes only into the cursor ledger. So while the
    cursor has a cursor ledger (`cursorsLedgerId != -1`) ZooKeeper's value may lag: the current
    compacted ledger can be newer than it. Ledger ids only grow, so a compacted ledger with a
    lower id than ZooKeeper's value is from an older compaction; nothing else can be concluded.
    """

    zk_ledger: int | None  # CompactedTopicLedger in the cursor znode's properties, if any
    cursor_ledger_active: bool  # cursorsLedgerId != -1: the znode may lag the cursor ledger


class CompactionRef(StrEnum):
    CURRENT = "current"  # this is the ledger the pointer names
    SUPERSEDED = "superseded"  # a newer compaction is known: this one is garbage
    UNKNOWN = "unknown"  # it may be the current compacted ledger: never delete


def compaction_reference(ledger_id: int, pointer: CompactionPointer) -> tuple[CompactionRef, Reason | None]:
    """What a compacted ledger is to its topic, given the ZooKeeper view of the `__compaction` cursor.

    The same rule serves reconcile and the delete stage's re-verification.
    """
    value = pointer.zk_ledger
    if value is not None and ledger_id == value:
        return CompactionRef.CURRENT, None
    if pointer.cursor_ledger_active:
        if value is not None and ledger_id < value:
            return CompactionRef.SUPERSEDED, None
        reason = Reason.COMPACTION_POINTER_MAY_LAG if value is not None else Reason.COMPACTION_REFERENCE_UNREADABLE
        return CompactionRef.UNKNOWN, reason
    if value is None:
        # A closed cursor with no pointer: nothing says another compacted ledger replaced this one.
        return CompactionRef.UNKNOWN, Reason.COMPACTION_UNRECORDED
    return CompactionRef.SUPERSEDED, None


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
    # Its offloaded copy is in this cluster's bucket: data and index objects, non-empty, with this cluster's
    # pulsarClusterName and the listing managed ledger's name in their metadata.
    offloaded_copy_verified: bool = False
    owner_exists: bool = False  # the managed ledger (or schema locator) is in the snapshot
    owner_quarantined: bool = False  # its managed ledger, a cursor of it, or its schema locator is undecodable
    cursor_exists: bool = False
    ledger_id: int | None = None
    # The topic's `__compaction` cursor as ZooKeeper shows it (see `compaction_reference`); None: no such cursor.
    compaction: CompactionPointer | None = None
    # The owner's tenant/namespace is known to this cluster's metadata (/managed-ledgers or namespace policies).
    namespace_known: bool = True
    sharing: Sharing = Sharing.UNVERIFIED
    # With peers read: the owner (managed ledger, schema, topic) / its namespace exists in a peer's metadata.
    owner_at_peer: bool = False
    namespace_at_peer: bool = False


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
        verdict = _managed_ledger(f)
    elif f.component == SCHEMA:
        verdict = _schema(f)
    elif f.component in (BUCKET, COMPACTED):
        verdict = _topic_owned(f)
    else:
        return Classification(Verdict.UNKNOWN, Reason.UNKNOWN_COMPONENT, f"component={f.component!r}")
    return shared_bookkeeper_rule(verdict, f)


def shared_bookkeeper_rule(verdict: Classification, f: LedgerFacts) -> Classification:
    """An orphan verdict stands only when every cluster writing to these bookies has been read.

    Unverified sharing turns every orphan into `unknown`, whatever its reason: a peer's live ledger of a
    topic this cluster also has would otherwise look dropped from our list. With every peer read, the
    references were the union of all clusters'; a ledger whose owner exists only at a peer is the peer's
    to collect, never ours.
    """
    if verdict.verdict is not Verdict.ORPHAN:
        return verdict
    if f.sharing is Sharing.UNVERIFIED:
        return Classification(Verdict.UNKNOWN, Reason.SHARED_BOOKKEEPER_UNVERIFIED,
                              f"would be {verdict.reason.value} ({verdict.detail}), but another cluster may write to "
                              "these bookies: set [safety] bookkeeper_dedicated = true, or list every other cluster "
                              "in [safety] peer_metadata")
    if f.sharing is Sharing.PEERS_READ and not f.owner_exists and (
            f.owner_at_peer or (f.namespace_at_peer and not f.namespace_known)):
        return Classification(Verdict.OTHER_CLUSTER, Reason.OWNED_BY_PEER,
                              f"{verdict.detail} here, but its owner is in a peer cluster's metadata")
    return verdict


def _unknown_owner(f: LedgerFacts, what: str) -> Classification | None:
    if not (f.managed_ledger or f.schema_id or f.owner_topic):
        return Classification(Verdict.UNKNOWN, Reason.NO_OWNER, f"{what} ledger without owner metadata")
    invalid = _invalid_owner_name(f)
    if invalid:
        return Classification(Verdict.UNKNOWN, Reason.OWNER_NAME_INVALID, invalid)
    if f.owner_quarantined:
        owner = f.managed_ledger or f.schema_id or f.owner_topic
        return Classification(Verdict.UNKNOWN, Reason.OWNER_UNREADABLE, f"metadata of {owner} could not be decoded")
    return None


def _invalid_owner_name(f: LedgerFacts) -> str | None:
    """An owner name Pulsar cannot have written (so it names nothing we could check against)."""
    if f.component == SCHEMA:
        parts = (f.schema_id or "").split("/")
        if len(parts) not in (3, 4) or not all(parts):
            return f"schemaId {f.schema_id!r} is not tenant/namespace/topic"
        return None
    if f.component in (BUCKET, COMPACTED) and f.owner_topic is not None and names.parse_topic(f.owner_topic) is None:
        return f"topic {f.owner_topic!r} is not a persistent topic name"
    if f.managed_ledger is not None and names.parse_managed_ledger(f.managed_ledger) is None:
        return f"managed ledger {f.managed_ledger!r} is not tenant/namespace/persistent/<encoded topic>"
    return None


def _owner_gone(f: LedgerFacts, orphan: Classification) -> Classification:
    """The owner is not in this cluster's metadata: an orphan only if the namespace is this cluster's.

    BookKeeper's ledger metadata names no cluster, so a ledger of a namespace this cluster does not
    know may belong to another Pulsar cluster sharing the bookies; only an operator who declares
    the BookKeeper dedicated lets a deleted namespace's ledgers be orphans.
    """
    if f.namespace_known or f.sharing is not Sharing.UNVERIFIED:
        return orphan
    return Classification(Verdict.UNKNOWN, Reason.NAMESPACE_UNKNOWN,
                          f"{orphan.detail}, and its namespace is unknown to this cluster's metadata (another "
                          "cluster sharing BookKeeper?); set [safety] bookkeeper_dedicated = true if none does")


def _managed_ledger(f: LedgerFacts) -> Classification:
    if f.listed_as_bookkeeper_deleted and f.owner_exists and not f.owner_quarantined:
        if not f.offloaded_copy_verified:
            # The BookKeeper copy may be the only one left: an offload whose objects were lost, or a bucket this
            # run could not list ([offload] enabled = false) proves nothing. Pulsar sets bookkeeperDeleted when its
            # trim deletes the BookKeeper copy of a complete offload (ManagedLedgerImpl.internalTrimLedgers,
            # offloadedLedgersToDelete / isOffloadedNeedsDelete); the copy it then reads is
            # BlobStoreManagedLedgerOffloader's `<uuid>-ledger-<id>` and `-index` objects, which
            # reconcile.frames.verified_offloads looks for.
            return Classification(Verdict.UNKNOWN, Reason.OFFLOADED_COPY_UNVERIFIED,
                                  f"{f.managed_ledger} lists it offloaded with bookkeeperDeleted=true, but its "
                                  "offloaded objects were not found complete in this cluster's bucket")
        return Classification(Verdict.ORPHAN, Reason.BOOKKEEPER_DELETED_BUT_PRESENT,
                              f"{f.managed_ledger} lists it offloaded with bookkeeperDeleted=true; its offloaded "
                              "copy is in the bucket")
    if (unknown := _unknown_owner(f, "managed-ledger")) is not None:
        return unknown
    if not f.owner_exists:
        return _owner_gone(f, Classification(Verdict.ORPHAN, Reason.TOPIC_DELETED,
                                             f"managed ledger {f.managed_ledger} is gone"))
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
        return _owner_gone(f, Classification(Verdict.ORPHAN, Reason.SCHEMA_DELETED, f"schema {f.schema_id} is gone"))
    return Classification(Verdict.ORPHAN, Reason.SCHEMA_VERSION_DELETED,
                          f"schema {f.schema_id} does not list this version")


def _topic_owned(f: LedgerFacts) -> Classification:
    what = "bucket" if f.component == BUCKET else "compacted"
    if (unknown := _unknown_owner(f, what)) is not None:
        return unknown
    if not f.owner_exists:
        return _owner_gone(f, Classification(Verdict.ORPHAN, Reason.TOPIC_DELETED, f"topic {f.owner_topic} is gone"))
    if f.component == BUCKET:
        return Classification(Verdict.ORPHAN, Reason.BUCKET_SNAPSHOT_LEAKED,
                              f"no cursor of {f.owner_topic} holds this bucket snapshot")
    if f.compaction is None:
        return Classification(Verdict.ORPHAN, Reason.COMPACTED_LEDGER_LEAKED,
                              f"{f.owner_topic} has no compaction cursor")
    if f.ledger_id is None:
        return Classification(Verdict.UNKNOWN, Reason.COMPACTION_POINTER_MAY_LAG, "ledger id unknown")
    ref, why = compaction_reference(f.ledger_id, f.compaction)
    if ref is CompactionRef.SUPERSEDED:
        return Classification(Verdict.ORPHAN, Reason.COMPACTED_LEDGER_LEAKED,
                              f"{f.owner_topic}'s compaction is at ledger {f.compaction.zk_ledger}, a newer one")
    if ref is CompactionRef.CURRENT:  # reconcile counts the pointer as a reference; kept for direct callers
        return Classification(Verdict.IN_USE, Reason.REFERENCED)
    assert why is not None
    detail = {
        Reason.COMPACTION_POINTER_MAY_LAG: (
            f"ZooKeeper says compaction is at ledger {f.compaction.zk_ledger}, but the cursor has a cursor "
            "ledger whose last entry may name this newer one"),
        Reason.COMPACTION_REFERENCE_UNREADABLE: (
            "the compacted-ledger reference is in the cursor ledger, out of a ZooKeeper scan's reach"),
        Reason.COMPACTION_UNRECORDED: "the compaction cursor records no compacted ledger",
    }[why]
    return Classification(Verdict.UNKNOWN, why, detail)


@dataclass(frozen=True, slots=True)
class ObjectFacts:
    """What reconcile knows about one tiered-storage object."""

    referenced: bool  # some managed ledger lists (uuid, ledger id) in an offload context
    offload_complete: bool | None = None  # of the referencing context
    offload_in_flight: bool = False  # incomplete and recent: still being written
    owner_quarantined: bool = False
    # The object's own user metadata (S3 returns its keys lower-cased), None when not read.
    metadata_read: bool = True
    cluster_name: str | None = None  # `pulsarClusterName` (LedgerOffloader.METADATA_PULSAR_CLUSTER_NAME)
    managed_ledger: str | None = None  # `ManagedLedgerName`, the offloading topic's managed ledger
    local_cluster: str = ""  # [pulsar] cluster_name: this cluster


class ObjectReason(StrEnum):
    REFERENCED = "offload_referenced"
    IN_FLIGHT = "offload_in_flight"
    STALE_INCOMPLETE = "offload_incomplete_and_stale"
    UNREFERENCED = "offload_unreferenced"
    OWNER_UNREADABLE = "owner_metadata_quarantined"
    METADATA_NOT_READ = "object_metadata_not_read"
    OWNER_MISSING = "object_owner_metadata_missing"
    OWNER_NAME_INVALID = "object_owner_name_not_pulsar_form"
    OTHER_CLUSTER = "offloaded_by_another_cluster"
    LOCAL_CLUSTER_UNSET = "local_cluster_name_not_configured"


def classify_object(f: ObjectFacts) -> tuple[Verdict, ObjectReason]:
    """Only an object of this cluster that no offload context names is an orphan; nothing is guessed.

    Geo-replicated clusters share namespace offload policies and may offload into one bucket; like
    Pulsar's own scanner (`OffloaderObjectsScannerUtils`), an object counts only when its
    `pulsarClusterName` metadata is this cluster's, and it must name its managed ledger.
    """
    if f.referenced:
        if f.offload_complete:
            return Verdict.IN_USE, ObjectReason.REFERENCED
        if f.offload_in_flight:
            return Verdict.IN_USE, ObjectReason.IN_FLIGHT
        return Verdict.UNKNOWN, ObjectReason.STALE_INCOMPLETE
    if f.owner_quarantined:
        return Verdict.UNKNOWN, ObjectReason.OWNER_UNREADABLE
    if not f.metadata_read:
        return Verdict.UNKNOWN, ObjectReason.METADATA_NOT_READ
    if not f.cluster_name or not f.managed_ledger:
        return Verdict.UNKNOWN, ObjectReason.OWNER_MISSING
    if not f.local_cluster:
        return Verdict.UNKNOWN, ObjectReason.LOCAL_CLUSTER_UNSET
    if f.cluster_name != f.local_cluster:
        return Verdict.OTHER_CLUSTER, ObjectReason.OTHER_CLUSTER
    if names.parse_managed_ledger(f.managed_ledger) is None:
        return Verdict.UNKNOWN, ObjectReason.OWNER_NAME_INVALID
    return Verdict.ORPHAN, ObjectReason.UNREFERENCED
