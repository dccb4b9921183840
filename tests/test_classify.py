from __future__ import annotations

import pytest

from sweeper.classify import Classification, LedgerFacts, Reason, Verdict, classify

ML = "t/ns/persistent/orders"


def verdict(**facts: object) -> Classification:
    return classify(LedgerFacts(**{"is_pulsar": True, "referenced": False, **facts}))  # type: ignore[arg-type]


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
          "listed_as_bookkeeper_deleted": True}, Reason.BOOKKEEPER_DELETED_BUT_PRESENT),
        ({"component": "schema", "schema_id": "t/ns/x"}, Reason.SCHEMA_DELETED),
        ({"component": "schema", "schema_id": "t/ns/x", "owner_exists": True}, Reason.SCHEMA_VERSION_DELETED),
        ({"component": "delayed-index-bucket", "owner_topic": "persistent://t/ns/x"}, Reason.TOPIC_DELETED),
        ({"component": "delayed-index-bucket", "owner_topic": "persistent://t/ns/x", "owner_exists": True},
         Reason.BUCKET_SNAPSHOT_LEAKED),
        ({"component": "compacted-ledger", "owner_topic": "persistent://t/ns/x", "owner_exists": True,
          "compaction_readable": True}, Reason.COMPACTED_LEDGER_LEAKED),
        ({"component": "compacted-ledger", "owner_topic": "persistent://t/ns/x", "owner_exists": True,
          "compaction_readable": None}, Reason.COMPACTED_LEDGER_LEAKED),
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
          "compaction_readable": False}, Reason.COMPACTION_REFERENCE_UNREADABLE),
        ({"component": "delayed-index-bucket"}, Reason.NO_OWNER),
    ],
)
def test_what_cannot_be_established_is_unknown_never_orphan(facts: dict[str, object], expected: Reason) -> None:
    result = verdict(**facts)
    assert (result.verdict, result.reason) == (Verdict.UNKNOWN, expected)


def test_objects_only_unreferenced_are_orphans() -> None:
    from sweeper.classify import ObjectFacts, ObjectReason, classify_object

    assert classify_object(ObjectFacts(referenced=True, offload_complete=True)) == (
        Verdict.IN_USE, ObjectReason.REFERENCED)
    assert classify_object(ObjectFacts(referenced=True, offload_complete=False, offload_in_flight=True)) == (
        Verdict.IN_USE, ObjectReason.IN_FLIGHT)
    assert classify_object(ObjectFacts(referenced=True, offload_complete=False)) == (
        Verdict.UNKNOWN, ObjectReason.STALE_INCOMPLETE)
    assert classify_object(ObjectFacts(referenced=False, owner_quarantined=True))[0] is Verdict.UNKNOWN
    assert classify_object(ObjectFacts(referenced=False)) == (Verdict.ORPHAN, ObjectReason.UNREFERENCED)
