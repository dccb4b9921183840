"""Issue 26: what Pulsar protects, and the rules every acting stage re-applies, on plain records."""

from __future__ import annotations

import pytest

from sweeper.rules.classify import Sharing
from sweeper.rules.owner import OUT_OF_SCOPE, PROTECTED, SHARED_UNVERIFIED, ActingRules, Owner, refusal
from sweeper.rules.protection import (
    Protected,
    Protection,
    cursor_protection,
    managed_ledger_protection,
    topic_protection,
)
from sweeper.rules.safety import Scope

DEDICATED = ActingRules(sharing=Sharing.DEDICATED)


@pytest.mark.parametrize(("local", "expected"), [
    ("orders-sub-a__transaction_pending_ack", Protected.PENDING_ACK_STORE),  # SystemTopicNames.PENDING_ACK_STORE_SUFFIX
    ("orders-partition-3-sub-a__transaction_pending_ack", Protected.PENDING_ACK_STORE),
    ("orders-sub-a-transaction-pendingack", Protected.PENDING_ACK_STORE),  # MLPendingAckStore before 2.8
    ("__transaction_buffer_snapshot", Protected.TRANSACTION_BUFFER),
    ("__transaction_buffer_snapshot_segments-partition-0", Protected.TRANSACTION_BUFFER),
    ("__transaction_buffer_snapshot_indexes", Protected.TRANSACTION_BUFFER),
    ("__change_events", Protected.TOPIC_POLICIES),
    ("orders", None),
    ("transaction_pending_ack_like_but_not", None),
])
def test_pulsars_own_topics_are_protected(local: str, expected: Protected | None) -> None:
    assert topic_protection("t", "ns", local) is expected


def test_transaction_coordinator_topics_are_protected_in_pulsar_system_only() -> None:
    assert topic_protection("pulsar", "system", "transaction_coordinator_assign-partition-0") is (
        Protected.TRANSACTION_COORDINATOR)
    assert topic_protection("pulsar", "system", "__transaction_log_3") is Protected.TRANSACTION_COORDINATOR
    assert topic_protection("t", "ns", "transaction_coordinator_assign") is None


@pytest.mark.parametrize(("cursor", "properties", "expected"), [
    ("sub", {"pulsar.replicated.subscription": 1}, Protected.REPLICATED_SUBSCRIPTION),
    ("sub", {"pulsar.replicated.subscription": 0}, None),
    ("sub", {}, None),
    ("__pending_ack_state", {}, Protected.PENDING_ACK_CURSOR),
    ("pendingack", {}, Protected.PENDING_ACK_CURSOR),
    ("__compaction", {}, Protected.COMPACTION_CURSOR),
    ("pulsar.repl.west", {}, Protected.PULSAR_CURSOR),
    ("pulsar.dedup", {}, Protected.PULSAR_CURSOR),
])
def test_protected_cursors(cursor: str, properties: dict[str, int], expected: Protected | None) -> None:
    assert cursor_protection(cursor, properties) is expected


def test_the_brokers_is_replicated_counts_like_the_property() -> None:
    assert cursor_protection("sub", {}, replicated=True) is Protected.REPLICATED_SUBSCRIPTION


def test_operator_globs_add_to_what_pulsar_protects() -> None:
    extra = Protection.of(subscriptions="audit-*, billing", topics="t/ns/keep-*, persistent://t/other/x")
    assert cursor_protection("audit-2024", None, extra) is Protected.OPERATOR_SUBSCRIPTION
    assert cursor_protection("billing", None, extra) is Protected.OPERATOR_SUBSCRIPTION
    assert cursor_protection("other", None, extra) is None
    assert topic_protection("t", "ns", "keep-this-partition-0", extra) is Protected.OPERATOR_TOPIC
    assert topic_protection("t", "other", "x", extra) is Protected.OPERATOR_TOPIC
    assert topic_protection("t", "ns", "drop-this", extra) is None
    assert managed_ledger_protection("t/ns/persistent/keep-it", None, None, extra) is Protected.OPERATOR_TOPIC


def test_a_record_on_an_unverified_shared_bookkeeper_is_refused_whatever_else() -> None:
    owner = Owner.of_record("persistent://t/ns/orders", None, None)
    assert refusal(owner, ActingRules())[0] == SHARED_UNVERIFIED  # type: ignore[index]
    assert refusal(owner, ActingRules(sharing=Sharing.PEERS_READ)) is None
    assert refusal(owner, DEDICATED) is None
    # Offloaded objects name their cluster: sharing is not their rule.
    assert refusal(owner, ActingRules(), owner_exists=True, bookkeeper=False) is None


def test_scope_and_protection_are_todays() -> None:
    denied = ActingRules(scope=Scope(deny=("t/ns",)), sharing=Sharing.DEDICATED)
    found = refusal(Owner.of_record(None, "t/ns/orders", None), denied)
    assert found is not None and found[0] == OUT_OF_SCOPE and "t/ns" in found[1]
    pending_ack = Owner.of_record("persistent://t/ns/orders-sub__transaction_pending_ack", None,
                                  "__pending_ack_state")
    found = refusal(pending_ack, DEDICATED)
    assert found is not None and found[0] == PROTECTED and "transaction_pending_ack_store" in found[1]
    # A data ledger the topic dropped from its list is garbage whoever owns the topic: only cursors are protected.
    dropped = Owner.of_record("persistent://t/ns/orders-sub__transaction_pending_ack", None, None)
    assert refusal(dropped, DEDICATED) is None
    replicated_cursor = Owner.of_record("persistent://t/ns/orders", None, "__pending_ack_state")
    assert refusal(replicated_cursor, DEDICATED)[0] == PROTECTED  # type: ignore[index]
    # A deleted topic keeps no state to protect: its ledgers are judged by the other rules.
    assert refusal(pending_ack, DEDICATED, owner_exists=False) is None
