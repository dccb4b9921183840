from __future__ import annotations

import pytest

from sweeper.rules.classify import (
    Classification,
    CompactionPointer,
    CompactionRef,
    LedgerFacts,
    Reason,
    Sharing,
    Verdict,
    classify,
    compaction_reference,
)

ML = "t/ns/persistent/orders"


def verdict(**facts: object) -> Classification:
    """A dedicated BookKeeper unless the facts say otherwise: the reasons are what these tests are about."""
    return classify(LedgerFacts(**{"is_pulsar": True, "referenced": False,  # type: ignore[arg-type]
                                   "sharing": Sharing.DEDICATED, **facts}))


def test_only_pulsar_ledgers_are_ever_orphans() -> None:
    assert classify(LedgerFacts(is_pulsar=False, referenced=False, component="managed-ledger",
                                managed_ledger=ML)).verdict is Verdict.NON_PULSAR


def test_any_reference_means_in_use_whatever_the_owner_says() -> None:
    # A shadow topic lists its source's ledgers: the metadata names the source, the reference is the shadow's.
    assert verdict(referenced=True, component="managed-ledger", managed_ledger="other").verdict is Verdict.IN_USE


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({"component": "managed-ledger", "managed_ledger": ML}, Reason.TOPIC_DELETED),
        ({"component": "managed-ledger", "managed_ledger": ML, "owner_exists": True}, Reason.DROPPED_FROM_LIST),
        ({"component": "managed-ledger", "managed_ledger": ML, "owner_exists": True, "cursor": "s"},
         Reason.CURSOR_DELETED),
        ({"component": "managed-ledger", "managed_ledger": ML, "owner_exists": True, "cursor": "s",
          "cursor_exists": True}, Reason.CURSOR_LEDGER_REPLACED),
        ({"component": "managed-ledger", "managed_ledger": ML, "owner_exists": True,
          "listed_as_bookkeeper_deleted": True, "offloaded_copy_verified": True},
         Reason.BOOKKEEPER_DELETED_BUT_PRESENT),
        ({"component": "schema", "schema_id": "t/ns/x"}, Reason.SCHEMA_DELETED),
        ({"component": "schema", "schema_id": "t/ns/x", "owner_exists": True}, Reason.SCHEMA_VERSION_DELETED),
        ({"component": "delayed-index-bucket", "owner_topic": "persistent://t/ns/x"}, Reason.TOPIC_DELETED),
        ({"component": "delayed-index-bucket", "owner_topic": "persistent://t/ns/x", "owner_exists": True},
         Reason.BUCKET_SNAPSHOT_LEAKED),
        # ZooKeeper's pointer is authoritative when the cursor has no cursor ledger
        ({"component": "compacted-ledger", "owner_topic": "persistent://t/ns/x", "owner_exists": True,
          "ledger_id": 50, "compaction": CompactionPointer(40, cursor_ledger_active=False)},
         Reason.COMPACTED_LEDGER_LEAKED),
        # with an active cursor ledger, only an id below ZooKeeper's pointer is provably an older compaction
        ({"component": "compacted-ledger", "owner_topic": "persistent://t/ns/x", "owner_exists": True,
          "ledger_id": 30, "compaction": CompactionPointer(40, cursor_ledger_active=True)},
         Reason.COMPACTED_LEDGER_LEAKED),
        ({"component": "compacted-ledger", "owner_topic": "persistent://t/ns/x", "owner_exists": True,
          "ledger_id": 30, "compaction": None}, Reason.COMPACTED_LEDGER_LEAKED),
        # a deleted namespace's ledgers are orphans when the operator declares BookKeeper dedicated
        ({"component": "managed-ledger", "managed_ledger": ML, "namespace_known": False}, Reason.TOPIC_DELETED),
    ],
)
def test_orphan_reasons(facts: dict[str, object], expected: Reason) -> None:
    result = verdict(**facts)
    assert (result.verdict, result.reason) == (Verdict.ORPHAN, expected)
    assert result.detail


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({"component": "managed-ledger"}, Reason.NO_OWNER),
        ({"component": None}, Reason.UNKNOWN_COMPONENT),
        ({"component": "future-thing", "managed_ledger": ML}, Reason.UNKNOWN_COMPONENT),
        ({"component": "managed-ledger", "managed_ledger": ML, "owner_quarantined": True}, Reason.OWNER_UNREADABLE),
        # a quarantined owner also blocks the bookkeeperDeleted shortcut
        ({"component": "managed-ledger", "managed_ledger": ML, "owner_exists": True, "owner_quarantined": True,
          "listed_as_bookkeeper_deleted": True}, Reason.OWNER_UNREADABLE),
        ({"component": "schema", "schema_id": "t/ns/x", "owner_quarantined": True}, Reason.OWNER_UNREADABLE),
        ({"component": "compacted-ledger", "owner_topic": "persistent://t/ns/x", "owner_exists": True,
          "ledger_id": 50, "compaction": CompactionPointer(None, cursor_ledger_active=True)},
         Reason.COMPACTION_REFERENCE_UNREADABLE),
        # Issue 11 (1): the stale compaction pointer. ZooKeeper names 40 while the cursor ledger is
        # active; 50 may be the current compacted ledger, named only in the cursor ledger.
        ({"component": "compacted-ledger", "owner_topic": "persistent://t/ns/x", "owner_exists": True,
          "ledger_id": 50, "compaction": CompactionPointer(40, cursor_ledger_active=True)},
         Reason.COMPACTION_POINTER_MAY_LAG),
        ({"component": "compacted-ledger", "owner_topic": "persistent://t/ns/x", "owner_exists": True,
          "ledger_id": 50, "compaction": CompactionPointer(None, cursor_ledger_active=False)},
         Reason.COMPACTION_UNRECORDED),
        ({"component": "delayed-index-bucket"}, Reason.NO_OWNER),
        # Issue 11 (3): an owner gone in a namespace this cluster does not know may be another cluster's.
        ({"component": "managed-ledger", "managed_ledger": ML, "namespace_known": False,
          "sharing": Sharing.UNVERIFIED}, Reason.NAMESPACE_UNKNOWN),
        ({"component": "schema", "schema_id": "t/ns/x", "namespace_known": False, "sharing": Sharing.UNVERIFIED},
         Reason.NAMESPACE_UNKNOWN),
        ({"component": "delayed-index-bucket", "owner_topic": "persistent://t/ns/x", "namespace_known": False,
          "sharing": Sharing.UNVERIFIED}, Reason.NAMESPACE_UNKNOWN),
        # Issue 11 (9): owner names Pulsar cannot have written are unknown, never a crash or a guess.
        ({"component": "managed-ledger", "managed_ledger": "weird-name"}, Reason.OWNER_NAME_INVALID),
        ({"component": "managed-ledger", "managed_ledger": "t/ns/persistent/bad%zz"}, Reason.OWNER_NAME_INVALID),
        ({"component": "compacted-ledger", "owner_topic": "not-a-topic"}, Reason.OWNER_NAME_INVALID),
        ({"component": "schema", "schema_id": "justone"}, Reason.OWNER_NAME_INVALID),
        # Issue 24 (4): layouts newer than this version stay unknown. Pulsar 5.0's scalable topics name their
        # segments' managed ledgers t/ns/segment/<topic>/<descriptor> (TopicName.getPersistenceNamingEncoding of
        # a segment:// name), an owner root this version does not read; and a component it does not know.
        ({"component": "managed-ledger", "managed_ledger": "t/ns/segment/orders/0000-7fff-1"},
         Reason.OWNER_NAME_INVALID),
        ({"component": "managed-ledger", "managed_ledger": "t/ns/segment/orders/0000-7fff-1", "owner_exists": True,
          "namespace_known": True}, Reason.OWNER_NAME_INVALID),
        ({"component": "scalable-topic-segment", "managed_ledger": ML}, Reason.UNKNOWN_COMPONENT),
    ],
)
def test_what_cannot_be_established_is_unknown_never_orphan(facts: dict[str, object], expected: Reason) -> None:
    result = verdict(**facts)
    assert (result.verdict, result.reason) == (Verdict.UNKNOWN, expected)


def test_objects_only_unreferenced_are_orphans() -> None:
    from sweeper.rules.classify import ObjectFacts, ObjectReason, classify_object

    ours = {"cluster_name": "east", "managed_ledger": ML, "local_cluster": "east"}
    assert classify_object(ObjectFacts(referenced=True, offload_complete=True)) == (
        Verdict.IN_USE, ObjectReason.REFERENCED)
    assert classify_object(ObjectFacts(referenced=True, offload_complete=False, offload_in_flight=True)) == (
        Verdict.IN_USE, ObjectReason.IN_FLIGHT)
    assert classify_object(ObjectFacts(referenced=True, offload_complete=False)) == (
        Verdict.UNKNOWN, ObjectReason.STALE_INCOMPLETE)
    assert classify_object(ObjectFacts(referenced=False, owner_quarantined=True, **ours))[0] is Verdict.UNKNOWN
    assert classify_object(ObjectFacts(referenced=False, **ours)) == (Verdict.ORPHAN, ObjectReason.UNREFERENCED)


@pytest.mark.parametrize(("facts", "expected"), [
    # Issue 11 (2): a geo-replicated peer offloading into the same bucket: never ours.
    ({"cluster_name": "west", "managed_ledger": ML}, (Verdict.OTHER_CLUSTER, "offloaded_by_another_cluster")),
    ({"cluster_name": None, "managed_ledger": ML}, (Verdict.UNKNOWN, "object_owner_metadata_missing")),
    ({"cluster_name": "east", "managed_ledger": None}, (Verdict.UNKNOWN, "object_owner_metadata_missing")),
    ({"cluster_name": "east", "managed_ledger": ML, "metadata_read": False},
     (Verdict.UNKNOWN, "object_metadata_not_read")),
    ({"cluster_name": "east", "managed_ledger": "weird-name"}, (Verdict.UNKNOWN, "object_owner_name_not_pulsar_form")),
    ({"cluster_name": "east", "managed_ledger": ML, "local_cluster": ""},
     (Verdict.UNKNOWN, "local_cluster_name_not_configured")),
])
def test_an_object_is_ours_only_when_its_own_metadata_says_so(facts: dict[str, object],
                                                              expected: tuple[Verdict, str]) -> None:
    from sweeper.rules.classify import ObjectFacts, classify_object

    verdict_, reason = classify_object(ObjectFacts(referenced=False, **{"local_cluster": "east", **facts}))
    assert (verdict_, reason.value) == expected


@pytest.mark.parametrize(("ledger", "pointer", "expected"), [
    (40, CompactionPointer(40, True), CompactionRef.CURRENT),
    (40, CompactionPointer(40, False), CompactionRef.CURRENT),
    (39, CompactionPointer(40, True), CompactionRef.SUPERSEDED),
    (41, CompactionPointer(40, True), CompactionRef.UNKNOWN),  # the stale-pointer case: may be current
    (41, CompactionPointer(40, False), CompactionRef.SUPERSEDED),  # a closed cursor's pointer is the truth
    (41, CompactionPointer(None, True), CompactionRef.UNKNOWN),
    (41, CompactionPointer(None, False), CompactionRef.UNKNOWN),
])
def test_compaction_reference(ledger: int, pointer: CompactionPointer, expected: CompactionRef) -> None:
    assert compaction_reference(ledger, pointer)[0] is expected


# Issue 26 (3): on a BookKeeper other clusters may write to, an owner name proves nothing.
SHARED_CASES = [
    {"component": "managed-ledger", "managed_ledger": ML},
    {"component": "managed-ledger", "managed_ledger": ML, "owner_exists": True},
    {"component": "managed-ledger", "managed_ledger": ML, "owner_exists": True, "cursor": "s"},
    {"component": "managed-ledger", "managed_ledger": ML, "owner_exists": True, "cursor": "s", "cursor_exists": True},
    {"component": "managed-ledger", "managed_ledger": ML, "owner_exists": True, "listed_as_bookkeeper_deleted": True,
     "offloaded_copy_verified": True},
    {"component": "schema", "schema_id": "t/ns/x", "owner_exists": True},
    {"component": "schema", "schema_id": "t/ns/x"},
    {"component": "delayed-index-bucket", "owner_topic": "persistent://t/ns/x", "owner_exists": True},
    {"component": "compacted-ledger", "owner_topic": "persistent://t/ns/x", "owner_exists": True, "ledger_id": 1},
]


@pytest.mark.parametrize("facts", SHARED_CASES)
def test_unverified_shared_bookkeeper_makes_every_orphan_unknown(facts: dict[str, object]) -> None:
    assert verdict(**facts).verdict is Verdict.ORPHAN  # the same facts on a dedicated BookKeeper
    shared = verdict(**{**facts, "sharing": Sharing.UNVERIFIED})
    assert (shared.verdict, shared.reason) == (Verdict.UNKNOWN, Reason.SHARED_BOOKKEEPER_UNVERIFIED)
    assert "peer_metadata" in shared.detail and "bookkeeper_dedicated" in shared.detail


@pytest.mark.parametrize(("facts", "expected"), [
    # the owner exists only at a peer: the peer's ledger, its own to collect
    ({"owner_at_peer": True}, (Verdict.OTHER_CLUSTER, Reason.OWNED_BY_PEER)),
    ({"namespace_known": False, "namespace_at_peer": True}, (Verdict.OTHER_CLUSTER, Reason.OWNED_BY_PEER)),
    # the owner exists here (a peer may have the same name): nobody references it, every cluster was read
    ({"owner_exists": True, "owner_at_peer": True}, (Verdict.ORPHAN, Reason.DROPPED_FROM_LIST)),
    # a namespace no cluster knows any more: nobody anywhere references it
    ({"namespace_known": False}, (Verdict.ORPHAN, Reason.TOPIC_DELETED)),
])
def test_with_every_peer_read_a_peers_ledger_is_never_ours(facts: dict[str, object],
                                                           expected: tuple[Verdict, Reason]) -> None:
    result = verdict(component="managed-ledger", managed_ledger=ML, sharing=Sharing.PEERS_READ, **facts)
    assert (result.verdict, result.reason) == expected


def test_bookkeeper_copy_of_an_offloaded_ledger_is_kept_until_the_offloaded_copy_is_seen() -> None:
    # Issue 26 (7): with offload disabled, or the objects lost, the BookKeeper copy may be the only one.
    facts = {"component": "managed-ledger", "managed_ledger": ML, "owner_exists": True,
             "listed_as_bookkeeper_deleted": True}
    unseen = verdict(**facts)
    assert (unseen.verdict, unseen.reason) == (Verdict.UNKNOWN, Reason.OFFLOADED_COPY_UNVERIFIED)
    assert verdict(**facts, offloaded_copy_verified=True).verdict is Verdict.ORPHAN
