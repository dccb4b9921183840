"""Pulsar's retention rules as pure functions: each test fails when the rule it names is removed."""

from __future__ import annotations

import dataclasses
import json
import random
import zlib

import pytest

from sweeper.rules.protection import Protection
from sweeper.rules.retention import (
    COMPACTION_CURSOR,
    MEGABYTE,
    MINUTE_MS,
    BrokerRetention,
    Cursor,
    CursorDebt,
    CursorStatus,
    DebtReason,
    Ledger,
    NamespacePolicy,
    Policy,
    Position,
    TopicFacts,
    TopicStatus,
    Trim,
    assess_topic,
    bundle_owned,
    change_events_may_hold_policies,
    cursor_status,
    effective_policy,
    is_system_topic,
    last_possible_ack_ms,
    may_owe,
    parse_bundle_range,
    parse_namespace_policies,
    summarize,
    topic_protection,
    topic_status,
    trim_bound,
    trimmable,
    ttl_position,
    unloaded_evidence,
)
from sweeper.vocabulary import DAY_MS

NOW = 1_700_000_000_000
BROKER = BrokerRetention()
KEEP_FOREVER = Policy(-1, -1)


def ledgers(*closed_days_ago: float, size: int = 1000, entries: int = 10) -> tuple[Ledger, ...]:
    """Closed ledgers 1..n closed that many days ago, then the current ledger n+1 (entries and size 0)."""
    out = [Ledger(i + 1, entries, size, int(NOW - d * DAY_MS)) for i, d in enumerate(closed_days_ago)]
    return (*out, Ledger(len(out) + 1, 0, 0, 0))


def ids(trim: Trim) -> list[int]:
    return [x.ledger_id for x in trim.ledgers]


# --- policies -----------------------------------------------------------------------------------------

def test_namespace_policy_fields_as_pulsar_reads_them() -> None:
    read = parse_namespace_policies(json.dumps({
        "retention_policies": {"retentionTimeInMinutes": 60, "retentionSizeInMB": 5},
        "message_ttl_in_seconds": 30, "deleted": False, "offload_policies": {"s3Secret": "x"}}).encode())
    assert read == NamespacePolicy(True, None, 60, 5, 30, False)
    # Not set: the broker default applies (None); an inner field missing is Java's default, 0.
    assert parse_namespace_policies(b'{"replication_clusters": ["c"]}') == NamespacePolicy(True)
    assert parse_namespace_policies(b'{"retention_policies": {"retentionSizeInMB": -1}}').retention_minutes == 0
    assert parse_namespace_policies(b'{"retention_policies": null, "message_ttl_in_seconds": null}').readable


@pytest.mark.parametrize("data", [
    b"{not json", b"[1, 2]", b'{"retention_policies": 5}', b'{"retention_policies": {"retentionTimeInMinutes": "1"}}',
    b'{"message_ttl_in_seconds": true}', b'{"deleted": "no"}', b"\xff\xfe", None,
])
def test_a_bad_policy_is_unreadable_never_a_default(data: bytes | None) -> None:
    read = parse_namespace_policies(data)
    assert not read.readable and read.error
    policy, reason, _ = effective_policy(read, BROKER)
    assert policy is None and reason is DebtReason.POLICY_UNREADABLE


def test_effective_policy_falls_back_to_the_broker_only_for_fields_not_set() -> None:
    broker = BrokerRetention(retention_minutes=10, retention_size_mb=20, ttl_seconds=30)
    policy, reason, _ = effective_policy(NamespacePolicy(True, None, None, None, None), broker)
    assert reason is None and policy is not None
    assert (policy.retention_minutes, policy.retention_size_mb, policy.ttl_seconds) == (10, 20, 30)
    policy, _, _ = effective_policy(NamespacePolicy(True, None, -1, 7, 0), broker)
    assert policy is not None and (policy.retention_minutes, policy.retention_size_mb, policy.ttl_seconds) == (-1, 7, 0)
    assert effective_policy(None, broker)[1] is DebtReason.POLICY_MISSING
    assert effective_policy(NamespacePolicy(True, deleted=True), broker)[1] is DebtReason.NAMESPACE_DELETED


def test_change_events_rule_out_topic_policies_only_when_provably_empty() -> None:
    closed_empty = (0, 5, "CLOSED", -1)
    assert not change_events_may_hold_policies([closed_empty], has_compaction=False)
    assert not change_events_may_hold_policies([], has_compaction=False)
    assert change_events_may_hold_policies([(3, 4, "CLOSED", 2), closed_empty], False)  # events were written
    assert change_events_may_hold_policies([(0, 5, "OPEN", -1)], False)  # an open ledger may hold some
    assert change_events_may_hold_policies([(0, 5, None, None)], False)  # BookKeeper metadata unread
    assert change_events_may_hold_policies([(0, 5, "CLOSED", 0)], False)  # closed with one entry
    assert change_events_may_hold_policies([closed_empty], has_compaction=True)


# --- internalTrimLedgers ------------------------------------------------------------------------------

def test_time_retention_counts_from_the_close_timestamp_strictly() -> None:
    list_ = ledgers(3, 2, 1)
    assert ids(trimmable(list_, [], Policy(2 * 24 * 60, -1), NOW)) == [1]  # 2 days: only the 3-day-old one
    exactly = (Ledger(1, 1, 10, NOW - 60 * MINUTE_MS), Ledger(2, 0, 0, 0))
    assert ids(trimmable(exactly, [], Policy(60, -1), NOW)) == []  # now - ts must exceed the retention
    assert ids(trimmable(exactly, [], Policy(60, -1), NOW + 1)) == [1]


def test_infinite_retention_never_trims() -> None:
    assert ids(trimmable(ledgers(400, 300), [], KEEP_FOREVER, NOW)) == []
    assert ids(trimmable(ledgers(400, 300), [], Policy(0, 0), NOW)) == [1, 2]  # Pulsar's default: consumed goes


def test_size_quota_trims_while_what_remains_is_at_least_the_quota() -> None:
    ten_mb = 10 * MEGABYTE
    list_ = ledgers(0.001, 0.001, 0.001, 0.001, 0.001, size=ten_mb)  # 50 MiB closed, none old
    assert ids(trimmable(list_, [], Policy(-1, 25), NOW)) == [1, 2]  # 40 >= 25, 30 >= 25, 20 < 25 stops
    assert ids(trimmable(list_, [], Policy(-1, 30), NOW)) == [1, 2]  # 30 >= 30 still goes
    assert ids(trimmable(list_, [], Policy(-1, 31), NOW)) == [1]


def test_the_walk_stops_at_the_first_ledger_that_stays() -> None:
    list_ = (Ledger(1, 1, 10, NOW - 9 * DAY_MS), Ledger(2, 1, 10, NOW - DAY_MS // 2),
             Ledger(3, 1, 10, NOW - 8 * DAY_MS), Ledger(4, 0, 0, 0))
    assert ids(trimmable(list_, [], Policy(24 * 60, -1), NOW)) == [1]


def test_the_last_listed_ledger_is_never_trimmed() -> None:
    old_current = (Ledger(1, 5, 100, NOW - 90 * DAY_MS), Ledger(2, 5, 100, NOW - 80 * DAY_MS))
    assert ids(trimmable(old_current, [], Policy(0, 0), NOW)) == [1]


def test_only_ledgers_before_the_slowest_mark_delete_go() -> None:
    list_ = ledgers(9, 8, 7, 6)  # ledgers 1-4 of 10 entries, current 5
    policy = Policy(0, 0)
    at_end_of_2 = Position(2, 9)  # the last entry of ledger 2: ledger 2 is consumed too
    middle_of_3 = Position(3, 4)
    assert trim_bound(list_, [at_end_of_2]) == 3
    assert ids(trimmable(list_, [at_end_of_2], policy, NOW)) == [1, 2]
    assert ids(trimmable(list_, [middle_of_3, Position(4, 9)], policy, NOW)) == [1, 2]  # the slowest decides
    assert ids(trimmable(list_, [Position(1, -1)], policy, NOW)) == []
    assert ids(trimmable(list_, [], policy, NOW)) == [1, 2, 3, 4]  # no durable cursor: every closed ledger


def test_ttl_moves_cursors_past_whole_expired_ledgers_only() -> None:
    list_ = ledgers(9, 8, 1)  # ledgers 1, 2 old; 3 one day old; 4 current
    start = Position(1, -1)
    assert ttl_position(list_, start, 0, NOW) == start  # no TTL
    assert ttl_position(list_, start, 2 * 86_400, NOW) == Position(2, 9)  # stops at ledger 3 (not expired)
    assert ttl_position(list_, Position(3, 2), 2 * 86_400, NOW) == Position(3, 2)  # never backwards
    every = ledgers(9, 8, 7)
    assert ttl_position(every, start, 86_400, NOW) == Position(3, 9)  # never into the last listed ledger
    stamped_last = (Ledger(1, 10, 1, NOW - 9 * DAY_MS), Ledger(2, 10, 1, NOW - 8 * DAY_MS))  # e.g. terminated
    assert ttl_position(stamped_last, start, 86_400, NOW) == Position(1, 9)
    gap = (Ledger(1, 10, 1, NOW - 9 * DAY_MS), Ledger(2, 10, 1, NOW), Ledger(3, 10, 1, NOW - 8 * DAY_MS),
           Ledger(4, 0, 0, 0))
    assert ttl_position(gap, start, 86_400, NOW) == Position(1, 9)  # stops at the first not expired


def test_ttl_frees_unacknowledged_data_but_not_the_compaction_cursors() -> None:
    facts = TopicFacts(ledgers(9, 8, 1), (Cursor("sub", Position(1, -1), -1, NOW),), NOW, Policy(0, -1, 86_400))
    debt = assess_topic(facts, BROKER, NOW, report_idle_ms=365 * DAY_MS)
    assert ids(debt.trim) == [1, 2]
    compaction = TopicFacts(facts.ledgers, (Cursor(COMPACTION_CURSOR, Position(1, -1), -1, NOW),), NOW, facts.policy)
    assert ids(assess_topic(compaction, BROKER, NOW, 365 * DAY_MS).trim) == []
    without_ttl = TopicFacts(facts.ledgers, facts.cursors, NOW, Policy(0, -1, 0))
    assert ids(assess_topic(without_ttl, BROKER, NOW, 365 * DAY_MS).trim) == []  # unacknowledged data is kept


# --- idle cursors ---------------------------------------------------------------------------------------

def test_an_active_cursor_ledger_may_hide_a_rollover_period_of_acknowledgements() -> None:
    closed = Cursor("a", Position(1, 0), -1, zk_mtime_ms=NOW - 10 * DAY_MS, last_active_ms=NOW - 11 * DAY_MS)
    assert last_possible_ack_ms(closed, BROKER) == NOW - 10 * DAY_MS
    active = Cursor("a", Position(1, 0), 77, zk_mtime_ms=NOW - 10 * DAY_MS)
    assert last_possible_ack_ms(active, BROKER) == NOW - 10 * DAY_MS + BROKER.cursor_rollover_ms
    recent_active = Cursor("a", Position(1, 0), -1, zk_mtime_ms=NOW - 10 * DAY_MS, last_active_ms=NOW - DAY_MS)
    assert last_possible_ack_ms(recent_active, BROKER) == NOW - DAY_MS


def test_what_an_idle_cursor_pins_alone_and_what_idle_cursors_pin_together() -> None:
    old = NOW - 30 * DAY_MS
    list_ = ledgers(20, 19, 18, 17)  # 4 closed ledgers of 1000 bytes
    idle_a = Cursor("a", Position(1, -1), -1, old)
    idle_b = Cursor("b", Position(1, -1), -1, old)
    busy = Cursor("c", Position(4, 9), 12, NOW)
    policy = Policy(24 * 60, -1)
    one = assess_topic(TopicFacts(list_, (idle_a, busy), NOW, policy), BROKER, NOW, report_idle_ms=7 * DAY_MS)
    assert [c.name for c in one.cursors] == ["a"]
    assert ids(one.cursors[0].pinned) == [1, 2, 3, 4] and one.cursors[0].pinned.bytes == 4000
    assert not one.cursors[0].position_may_lag
    two = assess_topic(TopicFacts(list_, (idle_a, idle_b, busy), NOW, policy), BROKER, NOW, 7 * DAY_MS)
    assert [c.pinned.bytes for c in two.cursors] == [0, 0]  # each alone: the other still holds
    assert two.idle_pinned.bytes == 4000  # together they hold it all
    # Retention still holds what is young: an idle cursor pins only what retention would free.
    young = ledgers(20, 19, 0.1, 0.1)
    three = assess_topic(TopicFacts(young, (idle_a, busy), NOW, policy), BROKER, NOW, 7 * DAY_MS)
    assert ids(three.cursors[0].pinned) == [1, 2]
    # A lagging position is flagged: the cursor may be further, pinning less.
    lagging = Cursor("a", Position(1, -1), 99, old)
    four = assess_topic(TopicFacts(list_, (lagging, busy), NOW, policy), BROKER, NOW, 7 * DAY_MS)
    assert four.cursors[0].position_may_lag


def test_a_cursor_is_idle_only_past_the_threshold_from_its_last_possible_acknowledgement() -> None:
    list_ = ledgers(20, 19)
    recent = Cursor("a", Position(1, -1), 5, NOW - 7 * DAY_MS)  # + 4 h rollover: idle < 7 days
    debt = assess_topic(TopicFacts(list_, (recent,), NOW, Policy(0, -1)), BROKER, NOW, 7 * DAY_MS)
    assert debt.cursors == ()
    closed = Cursor("a", Position(1, -1), -1, NOW - 7 * DAY_MS)
    assert [c.name for c in assess_topic(TopicFacts(list_, (closed,), NOW, Policy(0, -1)), BROKER, NOW,
                                         7 * DAY_MS).cursors] == ["a"]


def test_system_cursors_are_protected() -> None:
    list_ = ledgers(20, 19)
    old = NOW - 90 * DAY_MS
    names = [COMPACTION_CURSOR, "pulsar.repl.west", "pulsar.dedup", "orders-sub"]
    cursors = tuple(Cursor(n, Position(1, -1), -1, old) for n in names)
    debt = assess_topic(TopicFacts(list_, cursors, old, Policy(0, 0)), BROKER, NOW, 7 * DAY_MS)
    statuses = {c.name: cursor_status(c, debt.status, DAY_MS, True) for c in debt.cursors}
    assert statuses == {COMPACTION_CURSOR: CursorStatus.PROTECTED, "pulsar.repl.west": CursorStatus.PROTECTED,
                        "pulsar.dedup": CursorStatus.PROTECTED, "orders-sub": CursorStatus.CANDIDATE}
    assert {c.name: c.protected for c in debt.cursors} == {
        COMPACTION_CURSOR: "compaction_cursor", "pulsar.repl.west": "pulsar_system_cursor",
        "pulsar.dedup": "pulsar_system_cursor", "orders-sub": None}


def test_replicated_subscriptions_and_pending_ack_cursors_are_never_candidates() -> None:
    """Issue 26: a replicated subscription (its cursor's `pulsar.replicated.subscription` = 1), the pending-ack
    cursors of both spellings, and what the operator protects are `protected` with their reason, however idle."""
    list_ = ledgers(20, 19)
    old = NOW - 90 * DAY_MS
    cursors = (Cursor("geo-sub", Position(1, -1), -1, old, replicated=True),
               Cursor("__pending_ack_state", Position(1, -1), -1, old), Cursor("pendingack", Position(1, -1), -1, old),
               Cursor("audit-keep", Position(1, -1), -1, old), Cursor("orders-sub", Position(1, -1), -1, old))
    extra = Protection.of(subscriptions="audit-*")
    facts = TopicFacts(list_, cursors, old, Policy(0, 0), protection=extra)
    debt = assess_topic(facts, BROKER, NOW, 7 * DAY_MS)
    assert {c.name: (cursor_status(c, debt.status, DAY_MS, True), c.protected) for c in debt.cursors} == {
        "geo-sub": (CursorStatus.PROTECTED, "replicated_subscription"),
        "__pending_ack_state": (CursorStatus.PROTECTED, "transaction_pending_ack_cursor"),
        "pendingack": (CursorStatus.PROTECTED, "transaction_pending_ack_cursor"),
        "audit-keep": (CursorStatus.PROTECTED, "operator_protected_subscription"),
        "orders-sub": (CursorStatus.CANDIDATE, None)}


@pytest.mark.parametrize(("namespace", "local", "reason"), [
    ("public/default", "orders-geo-sub__transaction_pending_ack", "transaction_pending_ack_store"),
    ("public/default", "orders-partition-3-sub__transaction_pending_ack", "transaction_pending_ack_store"),
    ("public/default", "orders-sub-transaction-pendingack", "transaction_pending_ack_store"),
    ("public/default", "__transaction_buffer_snapshot", "transaction_buffer_snapshot"),
    ("public/default", "__transaction_buffer_snapshot_segments-partition-1", "transaction_buffer_snapshot"),
    ("public/default", "__change_events-partition-0", "topic_policy_events"),
    ("pulsar/system", "transaction_coordinator_assign-partition-0", "transaction_coordinator"),
    ("pulsar/system", "__transaction_log_0", "transaction_coordinator"),
    ("pulsar/functions", "assignments", "system_topic"),
    ("public/default", "__some_future_system_topic", "system_topic"),
])
def test_pulsars_transaction_and_policy_topics_are_protected_never_loaded(namespace: str, local: str,
                                                                           reason: str) -> None:
    debt = assess_topic(TopicFacts(ledgers(20, 19), (), NOW - 10 * DAY_MS, Policy(0, 0)), BROKER, NOW, 7 * DAY_MS)
    assert debt.status is TopicStatus.CANDIDATE  # it owes: only protection keeps it from the repair
    assert is_system_topic(namespace, local)
    assert topic_protection(namespace, local) == reason
    assert topic_status(debt, True, topic_protection(namespace, local)) is TopicStatus.PROTECTED
    assert cursor_status(cursor_debt(), debt.status, DAY_MS, True,
                         topic_protection(namespace, local)) is CursorStatus.PROTECTED


def test_operator_protected_topics_and_ordinary_names() -> None:
    extra = Protection.of(topics="public/default/ledger-*")
    assert topic_protection("public/default", "ledger-audit", extra) == "operator_protected_topic"
    assert topic_protection("public/default", "ledger-audit") is None  # not without the glob
    assert not is_system_topic("public/default", "ledger-audit")  # the operator's, not Pulsar's
    for local in ("orders", "orders-sub-transaction", "my__transaction_pending_ack_notes", "_x"):
        assert topic_protection("public/default", local, extra) is None, local


def cursor_debt(name: str = "sub", idle_days: float = 40, protected: str | None = None) -> CursorDebt:
    cursor = Cursor(name, Position(1, -1), -1, NOW)
    return CursorDebt(name, int(idle_days * DAY_MS), False, protected, Trim((), ()), cursor)


def test_only_idle_user_subscriptions_past_the_deletion_threshold_in_scope_are_candidates() -> None:
    thirty = 30 * DAY_MS
    assert cursor_status(cursor_debt(), TopicStatus.NONE, thirty, True) is CursorStatus.CANDIDATE
    assert cursor_status(cursor_debt(), TopicStatus.NONE, 0, True) is CursorStatus.IDLE  # deletion off
    assert cursor_status(cursor_debt(idle_days=20), TopicStatus.NONE, thirty, True) is CursorStatus.IDLE
    assert cursor_status(cursor_debt(), TopicStatus.NONE, thirty, False) is CursorStatus.OUT_OF_SCOPE
    assert cursor_status(cursor_debt(protected="compaction_cursor"), TopicStatus.NONE, thirty,
                         True) is CursorStatus.PROTECTED
    assert cursor_status(cursor_debt(), TopicStatus.NONE, thirty, True,
                         topic_protected="system_topic") is CursorStatus.PROTECTED
    assert cursor_status(cursor_debt(), TopicStatus.UNKNOWN, thirty, True) is CursorStatus.UNKNOWN
    # Protection does not depend on the policy: a protected cursor on a topic that cannot be judged stays protected.
    assert cursor_status(cursor_debt(protected="replicated_subscription"), TopicStatus.UNKNOWN, thirty,
                         True) is CursorStatus.PROTECTED


# --- unloaded topics ------------------------------------------------------------------------------------

def test_trimmable_ledgers_untouched_past_the_retention_check_mean_unloaded() -> None:
    slack = 2 * BROKER.check_interval_ms + 60_000
    assert unloaded_evidence(NOW - slack - 1, NOW, None, False, BROKER) == "not_trimmed_since"
    assert unloaded_evidence(NOW - slack, NOW, None, False, BROKER) is None
    assert unloaded_evidence(NOW - slack - 1, NOW, None, True, BROKER) is None  # TTL passes take longer
    assert unloaded_evidence(NOW, NOW, False, False, BROKER) == "bundle_not_owned"
    assert unloaded_evidence(NOW, NOW, True, False, BROKER) is None
    # [retention] untrimmed_margin_seconds replaces the minute for the broker's write.
    narrow, since = dataclasses.replace(BROKER, untrimmed_margin_ms=5_000), NOW - 2 * BROKER.check_interval_ms - 5_001
    assert unloaded_evidence(since, NOW, None, False, narrow) == "not_trimmed_since"
    assert unloaded_evidence(since, NOW, None, False, BROKER) is None


def test_expired_ledgers_are_a_candidate_only_on_a_topic_that_looks_unloaded() -> None:
    list_ = ledgers(20, 19, 18)
    policy = Policy(24 * 60, -1)
    consumed = (Cursor("s", Position(3, 9), -1, NOW - 10 * DAY_MS),)
    unloaded = assess_topic(TopicFacts(list_, consumed, NOW - 10 * DAY_MS, policy), BROKER, NOW, 7 * DAY_MS)
    assert unloaded.status is TopicStatus.CANDIDATE and unloaded.reason is DebtReason.EXPIRED_UNLOADED
    assert ids(unloaded.trim) == [1, 2, 3] and unloaded.trim.bytes == 3000
    assert unloaded.unloaded_evidence == "not_trimmed_since"
    # The list changed a minute ago (a rollover, a load): a loaded broker's next check trims it.
    loaded = assess_topic(TopicFacts(list_, consumed, NOW - 60_000, policy), BROKER, NOW, 7 * DAY_MS)
    assert loaded.status is TopicStatus.AWAITING_BROKER
    # A cursor that moved a minute ago made them trimmable only then.
    moved = (Cursor("s", Position(3, 9), -1, NOW - 60_000),)
    assert assess_topic(TopicFacts(list_, moved, NOW - 10 * DAY_MS, policy), BROKER, NOW,
                        7 * DAY_MS).status is TopicStatus.AWAITING_BROKER
    # Expiry itself is a moment: closed 25 h ago with a 1-day retention is trimmable for an hour only.
    fresh = (Ledger(1, 10, 5, NOW - 25 * 60 * MINUTE_MS), Ledger(2, 0, 0, 0))
    hour = assess_topic(TopicFacts(fresh, (), NOW - 10 * DAY_MS, policy), BROKER, NOW, 7 * DAY_MS)
    assert hour.status is TopicStatus.CANDIDATE and hour.eligible_since_ms == NOW - 60 * MINUTE_MS + 1
    # Its bundle owned by nobody: unloaded whatever the clocks say.
    owned_by_nobody = TopicFacts(list_, consumed, NOW - 60_000, policy, bundle_owned=False)
    assert assess_topic(owned_by_nobody, BROKER, NOW, 7 * DAY_MS).unloaded_evidence == "bundle_not_owned"


def test_an_unknown_policy_is_never_expired_and_never_acted_on() -> None:
    list_ = ledgers(400, 300)
    idle = Cursor("s", Position(1, -1), -1, NOW - 90 * DAY_MS)
    facts = TopicFacts(list_, (idle,), NOW - 90 * DAY_MS, None, DebtReason.POLICY_UNREADABLE, "bad json")
    debt = assess_topic(facts, BROKER, NOW, 7 * DAY_MS)
    assert debt.status is TopicStatus.UNKNOWN and debt.reason is DebtReason.POLICY_UNREADABLE
    assert debt.trim.ledgers == () and debt.cursors[0].pinned.ledgers == ()
    assert cursor_status(debt.cursors[0], debt.status, DAY_MS, True) is CursorStatus.UNKNOWN
    may_exist = TopicFacts(list_, (), NOW - 90 * DAY_MS, Policy(0, 0), DebtReason.TOPIC_POLICY_MAY_EXIST)
    assert assess_topic(may_exist, BROKER, NOW, 7 * DAY_MS).status is TopicStatus.UNKNOWN


def test_repairs_stay_inside_the_allow_list_and_off_system_topics() -> None:
    list_ = ledgers(20, 19)
    debt = assess_topic(TopicFacts(list_, (), NOW - 10 * DAY_MS, Policy(0, 0)), BROKER, NOW, 7 * DAY_MS)
    assert topic_status(debt, True) is TopicStatus.CANDIDATE
    assert topic_status(debt, False) is TopicStatus.OUT_OF_SCOPE
    assert topic_status(debt, True, protected="system_topic") is TopicStatus.PROTECTED
    assert topic_status(debt, False, protected="transaction_pending_ack_store") is TopicStatus.PROTECTED


# --- bundles --------------------------------------------------------------------------------------------

def test_bundle_ranges_and_the_topic_hash() -> None:
    assert parse_bundle_range("0x00000000_0x40000000") == (0, 0x40000000)
    assert parse_bundle_range("0x40000000_0x00000000") is None
    assert parse_bundle_range("bundle") is None and parse_bundle_range("0x0_0x1") is None
    name = "persistent://t/ns/topic-1"
    h = zlib.crc32(name.encode())
    assert bundle_owned(name, [(h, h + 1)]) and not bundle_owned(name, [(h + 1, 0xFFFFFFFF)])
    assert bundle_owned(name, [(0, 0xFFFFFFFF)]) or h == 0xFFFFFFFF
    assert not bundle_owned(name, [])


# --- what the step may skip before its shuffle ------------------------------------------------------

def _random_facts(rng: random.Random, policy: Policy | None) -> TopicFacts:
    """Topics near every edge `may_owe` decides on: ledgers closed around the retention time, sizes around the
    quota, cursors on a ledger's last entry or past the list, TTL and compaction cursors, idle and busy cursors."""
    count = rng.randrange(0, 7)
    listed = []
    for i in range(count):
        entries = rng.choice([0, 1, 10, 10, 500])
        closed = 0 if i == count - 1 or rng.random() < 0.05 else int(NOW - rng.uniform(0, 120) * DAY_MS)
        size = rng.choice([0, 1000, MEGABYTE // 2, MEGABYTE, 3 * MEGABYTE])
        listed.append(Ledger(10 + 2 * i, entries if i < count - 1 else 0, size if i < count - 1 else 0, closed))
    cursors = []
    for i in range(rng.randrange(0, 4)):
        if listed and rng.random() < 0.85:
            on = rng.choice(listed)
            at = Position(on.ledger_id, rng.choice([-1, 0, on.entries - 2, on.entries - 1, on.entries]))
        else:
            at = Position(rng.choice([-1, 5, 11, 99]), rng.randrange(-1, 3))
        seen = int(NOW - rng.choice([rng.uniform(0, 6.9), rng.uniform(0, 30)]) * DAY_MS)
        cursors.append(Cursor(rng.choice([f"sub-{i}", COMPACTION_CURSOR]), at, rng.choice([-1, 99]), seen,
                              rng.choice([0, seen - rng.randrange(0, DAY_MS)])))
    return TopicFacts(tuple(listed), tuple(cursors), int(NOW - rng.uniform(0, 30) * DAY_MS), policy,
                      None if policy else DebtReason.POLICY_MISSING)


def test_a_topic_may_owe_nothing_only_when_the_step_would_report_nothing() -> None:
    """`may_owe` lets the step judge only some topics: wherever it says no, `assess_topic` must find no debt and
    no idle cursor, under every kind of policy; and it must say no often, or it saves nothing."""
    rng = random.Random(5)
    policies = [KEEP_FOREVER, Policy(-1, -1, ttl_seconds=3600), Policy(60 * 24 * 30, -1), Policy(-1, 1),
                Policy(0, 0), Policy(0, 0, 60), Policy(60 * 24 * 7, 2, 86_400 * 20), Policy(0, -1, 86_400 * 40), None]
    skipped = reported = 0
    for _ in range(20_000):
        policy = rng.choice(policies)
        facts = _random_facts(rng, policy)
        debt = assess_topic(facts, BROKER, NOW, 7 * DAY_MS)
        owes = debt.status is not TopicStatus.NONE or bool(debt.cursors)
        if not may_owe(policy, False, summarize(facts.ledgers, facts.cursors), NOW, 7 * DAY_MS):
            skipped += 1
            assert not owes, facts
        reported += owes
    assert skipped > 5000 and reported > 5000  # both sides exercised
    # A topic is judged only with a cursor old enough to be idle or a ledger that trimming would take first.
    stale = Cursor("stale", Position(1, -1), -1, NOW - 60 * DAY_MS)
    assert may_owe(KEEP_FOREVER, False, summarize(ledgers(90, 60), [stale]), NOW, 7 * DAY_MS)
    assert assess_topic(TopicFacts(ledgers(90, 60), (stale,), NOW, KEEP_FOREVER), BROKER, NOW, 7 * DAY_MS).cursors
    busy = Cursor("busy", Position(1, 3), -1, NOW - DAY_MS)
    assert not may_owe(KEEP_FOREVER, False, summarize(ledgers(90, 60), [busy]), NOW, 7 * DAY_MS)
    assert may_owe(KEEP_FOREVER, True, summarize((), ()), NOW, 7 * DAY_MS)  # quarantined: reported unknown
    assert may_owe(None, False, summarize((), ()), NOW, 7 * DAY_MS)
    # A size quota of 0 trims everything consumed: the busy cursor on ledger 1 pins it, one on its last entry not.
    assert not may_owe(Policy(-1, 0), False, summarize(ledgers(90, 60), [busy]), NOW, 7 * DAY_MS)
    done = Cursor("done", Position(1, 9), -1, NOW - DAY_MS)
    assert may_owe(Policy(-1, 0), False, summarize(ledgers(90, 60), [done]), NOW, 7 * DAY_MS)
    # A week's retention: the oldest ledger decides (closed 90 days ago: expired; 3 days ago: the walk stops there).
    assert may_owe(Policy(7 * 24 * 60, -1), False, summarize(ledgers(90, 3), []), NOW, 7 * DAY_MS)
    assert not may_owe(Policy(7 * 24 * 60, -1), False, summarize(ledgers(3, 90), []), NOW, 7 * DAY_MS)
    # TTL can move the busy cursor past expired ledgers: judged, unless the compaction cursor holds ledger 1.
    ttl = Policy(0, -1, 86_400)
    assert may_owe(ttl, False, summarize(ledgers(90, 60), [busy]), NOW, 7 * DAY_MS)
    compaction = Cursor(COMPACTION_CURSOR, Position(0, 0), -1, NOW - DAY_MS)
    assert not may_owe(ttl, False, summarize(ledgers(90, 60), [busy, compaction]), NOW, 7 * DAY_MS)
    # Ledger 0 exists (BookKeeper ids start there): a subscription on (0, 0) is not a compaction cursor, TTL moves it.
    from_zero = (Ledger(0, 10, 1000, NOW - 90 * DAY_MS), Ledger(1, 10, 1000, NOW - 60 * DAY_MS), Ledger(2, 0, 0, 0))
    at_zero = Cursor("sub", Position(0, 0), -1, NOW - DAY_MS)
    assert may_owe(ttl, False, summarize(from_zero, [at_zero]), NOW, 7 * DAY_MS)
    assert assess_topic(TopicFacts(from_zero, (at_zero,), NOW, ttl), BROKER, NOW, 7 * DAY_MS).trim.ledgers
    # A list naming its current ledger twice has nothing before it to trim.
    twice = (Ledger(5, 10, 1000, NOW - 90 * DAY_MS), Ledger(5, 10, 1000, NOW - 90 * DAY_MS))
    assert not may_owe(Policy(0, 0), False, summarize(twice, []), NOW, 7 * DAY_MS)
    assert not assess_topic(TopicFacts(twice, (), NOW, Policy(0, 0)), BROKER, NOW, 7 * DAY_MS).trim.ledgers
