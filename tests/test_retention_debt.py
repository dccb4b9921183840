"""Retention debt against the sandbox's ground truth, at several sizes: expired-but-unloaded topics with
the right ledgers and bytes, idle cursors with what each alone pins, bad or missing policies `unknown`."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.retention_scenarios import FOREVER_NS, SIZE_NS, TIME_NS
from harness.zkserver import ServerClock
from sweeper.reconcile.stage import SafetySettings, run_reconcile
from sweeper.retention.debt import run_retention_debt
from sweeper.retention.debt_types import RetentionSettings
from sweeper.retention.errors import RetentionDebtRefused
from sweeper.rules.safety import CircuitBreaker, Scope
from sweeper.tables import TableStore, open_table_store
from sweeper.vocabulary import DAY_MS
from tests.support.admin_server import AdminServer
from tests.support.config import BASE_CONFIG
from tests.support.seeded import SeededSnapshotMaker


def _debt(store: TableStore, run_id: str) -> tuple[dict[str, dict[str, Any]], dict[tuple[str, str], dict[str, Any]]]:
    rows = [r.asDict() for r in store.read("retention_debt").where(f"run_id = '{run_id}'").collect()]
    topics = {r["managed_ledger"]: r for r in rows if r["kind"] == "topic"}
    cursors = {(r["managed_ledger"], r["cursor"]): r for r in rows if r["kind"] == "cursor"}
    assert len(topics) + len(cursors) == len(rows)
    return topics, cursors


@pytest.mark.parametrize(("seed", "topics"), [(11, 30), (23, 250)])
def test_retention_debt_is_the_sandboxs_ground_truth(
        seed: int, topics: int, seeded_snapshot: SeededSnapshotMaker, zk_clock: ServerClock,
        spark: SparkSession) -> None:
    cluster, _, store, run_id = seeded_snapshot(SandboxSpec(seed=seed, topics=topics))
    run_reconcile(spark, store, run_id, SafetySettings(breaker=CircuitBreaker(1.0), bookkeeper_dedicated=True))
    settings = RetentionSettings(delete_after_ms=30 * DAY_MS)
    result = run_retention_debt(spark, store, run_id, settings)
    found, cursors = _debt(store, run_id)
    expected = {e.managed_ledger: e for e in cluster.retention}
    assert len(expected) >= 13 * max(1, topics // 100) - 2 * (max(1, topics // 100) - 1)
    # Recall and precision: every scenario that owes something (or cannot be judged) has its row, and no
    # regular topic (kept forever) or young one has any.
    assert set(found) == {ml for ml, e in expected.items() if e.status != "none" or e.cursors}
    for ml, row in found.items():
        e = expected[ml]
        assert (row["status"], row["reason"]) == (e.status, e.reason), (e.scenario, row["detail"])
        assert row["ledger_ids"] == e.trimmable, e.scenario
        assert row["reclaimable_bytes"] == e.trimmable_bytes, e.scenario
        if e.status == "candidate":
            assert row["unloaded_evidence"] == "not_trimmed_since" and row["bundle_owned"] is None
        if e.status == "unknown":
            assert row["policy_source"] is None and row["reclaimable_bytes"] == 0  # never "expired"
    expected_cursors = {(ml, c.name): c for ml, e in expected.items() for c in e.cursors}
    assert set(cursors) == set(expected_cursors)
    for key, row in cursors.items():
        c = expected_cursors[key]
        assert row["idle_ms"] >= c.min_idle_ms, key
        assert row["ledger_ids"] == c.pinned and row["reclaimable_bytes"] == c.pinned_bytes, key
        assert row["position_may_lag"] is c.position_may_lag, key
        # Deletion at 30 days: the 60-day closed cursor is a candidate; the one whose cursor ledger may hold
        # four more hours of acknowledgements is not yet; system cursors and unknown topics never are.
        want = ("unknown" if expected[key[0]].status == "unknown" else "protected" if c.system
                else "candidate" if c.min_idle_ms >= 30 * DAY_MS else "idle")
        assert row["status"] == want, (key, row["detail"])
    # The report by cause adds up, per namespace.
    report = {(r["tenant"], r["namespace"]): r.asDict()
              for r in store.read("reclaimable_report").where(f"run_id = '{run_id}'").collect()}
    tenant, ns = TIME_NS.split("/")
    unloaded = sum(e.trimmable_bytes for ml, e in expected.items()
                   if ml.startswith(TIME_NS + "/") and e.reason == "expired_not_trimmed")
    assert report[(tenant, ns)]["expired_unloaded_bytes"] == unloaded
    assert report[(tenant, ns)]["idle_cursor_bytes"] >= sum(
        c.pinned_bytes for ml, e in expected.items() if ml.startswith(TIME_NS + "/") for c in e.cursors)
    orphan_bytes = sum(r["orphan_bytes"] for r in report.values())
    assert orphan_bytes == sum(r["size_bytes"] or 0 for r in store.read("orphans").where(
        f"run_id = '{run_id}' and status = 'candidate'").collect())
    assert result.counts.topics.get("candidate", 0) == sum(1 for e in expected.values() if e.status == "candidate")
    with pytest.raises(RetentionDebtRefused, match="already"):
        run_retention_debt(spark, store, run_id, settings)


def test_a_bundle_nobody_owns_has_no_topic_loaded(
        zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, zk_clock: ServerClock, spark: SparkSession) -> None:
    """With ownership readable (a live broker owns bundles), a topic whose bundle nobody owns is unloaded even
    when its list changed a minute ago; in an owned bundle only the clocks can tell."""
    size_tenant, size_ns = SIZE_NS.split("/")
    zk.create(f"/namespace/{size_tenant}/{size_ns}/0x00000000_0xffffffff", b'{"nativeUrl": "pulsar://b:6650"}',
              ephemeral=True, makepath=True)
    zk.create("/namespace/tenant-0/retention-time/0x80000000_0xc0000000", b"{}", makepath=True)  # not ephemeral
    cluster, _, store, run_id = seeded_snapshot(SandboxSpec(seed=5, topics=10))
    run_retention_debt(spark, store, run_id, RetentionSettings())
    found, _ = _debt(store, run_id)
    loaded = next(e.managed_ledger for e in cluster.retention if e.scenario == "expired_loaded")
    assert found[loaded]["status"] == "candidate" and found[loaded]["unloaded_evidence"] == "bundle_not_owned"
    assert found[loaded]["bundle_owned"] is False
    over_quota = next(e.managed_ledger for e in cluster.retention if e.scenario == "over_quota")
    assert found[over_quota]["bundle_owned"] is True
    assert found[over_quota]["unloaded_evidence"] == "not_trimmed_since"


def test_repairs_outside_the_allow_list_are_out_of_scope(
        seeded_snapshot: SeededSnapshotMaker, zk_clock: ServerClock, spark: SparkSession) -> None:
    _, _, store, run_id = seeded_snapshot(SandboxSpec(seed=5, topics=10))
    settings = RetentionSettings(delete_after_ms=DAY_MS, scope=Scope(allow=("tenant-1",)))
    run_retention_debt(spark, store, run_id, settings)
    found, cursors = _debt(store, run_id)
    statuses = {(row["tenant"], row["status"]) for row in [*found.values(), *cursors.values()]}
    assert ("tenant-0", "candidate") not in statuses and ("tenant-1", "candidate") in statuses
    assert ("tenant-0", "out_of_scope") in statuses


def _row(kind: str, ml: str, owned: bool | None, policy: str, cursor: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "managed_ledger": ml, "cursor": cursor, "tenant": "t", "namespace": "ns",
            "topic_name": f"persistent://t/ns/{ml.rsplit('/', 1)[1]}", "bundle_owned": owned, "topic_policy": policy,
            "status": "candidate", "reason": "expired_not_trimmed", "detail": "", "reclaimable_ledgers": 2,
            "reclaimable_bytes": 100, "reclaimable_offloaded_bytes": 0, "ledger_ids": [1, 2],
            "policy_source": "namespace", "retention_minutes": 1, "retention_size_mb": -1, "ttl_seconds": 0,
            "eligible_since_ms": 5,
            "unloaded_evidence": "not_trimmed_since", "idle_pinned_bytes": 7}


def test_a_topic_level_policy_not_ruled_out_makes_the_topic_unknown_unless_the_broker_says_none() -> None:
    from sweeper.retention.debt import finalize_topic_policies
    from sweeper.vocabulary import NOT_SET, RULED_OUT, SET, UNCHECKED

    def fresh() -> list[dict[str, Any]]:
        return [_row("topic", "t/ns/persistent/a", True, UNCHECKED), _row("cursor", "t/ns/persistent/a", True,
                                                                          UNCHECKED, "sub"),
                _row("topic", "t/ns/persistent/b", False, UNCHECKED), _row("topic", "t/ns/persistent/c", None,
                                                                           RULED_OUT)]

    asked: list[str] = []

    def broker(topic: str) -> tuple[str, str]:
        asked.append(topic)
        return NOT_SET, "none of its own"

    rows = fresh()
    assert finalize_topic_policies(rows, broker) == 1
    assert asked == ["persistent://t/ns/a"]  # b's bundle has no live owner: asking would load it
    a, a_sub, b, c = rows
    assert (a["status"], a["topic_policy"], a["reclaimable_bytes"]) == ("candidate", NOT_SET, 100)
    assert a_sub["status"] == "candidate"
    assert (b["status"], b["reason"], b["reclaimable_bytes"], b["ledger_ids"]) == (
        "unknown", "topic_policy_may_exist", 0, [])
    assert c["status"] == "candidate" and c["topic_policy"] == RULED_OUT
    rows = fresh()
    finalize_topic_policies(rows, lambda topic: (SET, "retention 10 min of its own"))
    assert (rows[0]["status"], rows[0]["reason"], rows[1]["status"]) == ("unknown", "topic_policy_set", "unknown")
    rows = fresh()
    assert finalize_topic_policies(rows, None) == 0  # [retention] topic_policies = "system_topic": never asks
    assert [r["status"] for r in rows] == ["unknown", "unknown", "unknown", "candidate"]


class _TopicPolicyBroker(AdminServer):
    """Answers the admin v2 topic-policy GETs as Pulsar does (204: none set; 200 with the value; 405 with
    topic-level policies disabled), redirecting the first request of a path once (307, as a broker that does
    not own the topic)."""

    def __init__(self, answers: dict[str, tuple[int, bytes]]) -> None:
        self.answers = answers
        super().__init__(self._answer)

    @property
    def seen(self) -> list[str]:
        return [path for _, path, _ in self.requests]

    def _answer(self, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        if not path.startswith("/owner"):
            return 307, {"Location": f"/owner{path}"}, b""
        status, body = self.answers.get(path.removeprefix("/owner/admin/v2/persistent/"), (204, b""))
        return status, {}, body


@pytest.mark.integration  # an HTTP server answering as the broker
def test_the_broker_is_asked_for_local_and_global_topic_policies_of_the_partitioned_topic() -> None:
    from sweeper.broker.system_topic import AdminClient
    from sweeper.retention.policies import TopicPolicyLookup
    from sweeper.vocabulary import NOT_SET, SET, UNREAD

    broker = _TopicPolicyBroker({
        "t/ns/ttl/messageTTL?isGlobal=true": (200, b"3600"),
        "t/ns/off/retention?isGlobal=false": (405, b'{"reason": "Topic level policies is disabled"}'),
        "t/ns/nulls/retention?isGlobal=false": (200, b"null"),
    })
    try:
        admin = AdminClient(BASE_CONFIG.replace(system_topic={"admin_url": broker.url}).system_topic)
        assert admin.topic_policy("persistent://t/ns/plain-partition-3")[0] == NOT_SET
        assert [p for p in broker.seen if p.startswith("/owner")] == [
            f"/owner/admin/v2/persistent/t/ns/plain/{s}?isGlobal={g}"
            for s in ("retention", "messageTTL") for g in ("false", "true")]  # the partitioned topic, redirected
        verdict, detail = admin.topic_policy("persistent://t/ns/ttl")
        assert verdict == SET and "global messageTTL (3600)" in detail
        verdict, detail = admin.topic_policy("persistent://t/ns/off")
        assert verdict == UNREAD and "HTTP 405" in detail
        assert admin.topic_policy("persistent://t/ns/nulls")[0] == NOT_SET
        lookup = TopicPolicyLookup(admin, 1000.0)
        assert lookup("persistent://t/ns/ttl")[0] == SET
    finally:
        broker.close()
    # The broker gone: that topic and every later one are unread (unknown), and nobody is asked again.
    asked = len(broker.seen)
    verdict, detail = lookup("persistent://t/ns/plain")
    assert verdict == UNREAD and "unreachable" in detail
    assert lookup("persistent://t/ns/other") == (UNREAD, f"not asked: {detail}") and len(broker.seen) == asked


def test_admin_mode_asks_the_broker_only_about_owned_topics_whose_policies_may_be_overridden(
        zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, zk_clock: ServerClock, spark: SparkSession) -> None:
    """[retention] topic_policies = "admin": in the namespace whose __change_events holds events, a topic in an
    owned bundle is judged under its namespace's policy once the broker says it has none of its own; namespaces
    whose __change_events holds no event are never asked about (the unowned case: the finalize test above)."""
    from harness.sandbox.retention_scenarios import TOPIC_POLICY_NS
    from sweeper.vocabulary import NOT_SET, NOT_USED, RULED_OUT

    tenant, ns = TOPIC_POLICY_NS.split("/")
    zk.create(f"/namespace/{tenant}/{ns}/0x00000000_0xffffffff", b"{}", ephemeral=True, makepath=True)
    cluster, _, store, run_id = seeded_snapshot(SandboxSpec(seed=5, topics=10))
    asked: list[str] = []

    def broker(topic: str) -> tuple[str, str]:
        asked.append(topic)
        return NOT_SET, "none of its own"

    result = run_retention_debt(spark, store, run_id, RetentionSettings(topic_policies="admin"),
                                topic_policy_lookup=broker)
    found, cursors = _debt(store, run_id)
    in_ns = {ml: row for ml, row in found.items() if ml.startswith(f"{TOPIC_POLICY_NS}/")}
    assert in_ns and asked and result.counts.topic_policy_calls == len(asked)
    # Its __change_events is Pulsar's own: protected, never acted on, so never asked about.
    protected = {ml for ml, row in in_ns.items() if row["status"] == "protected"}
    assert [found[ml]["topic"] for ml in protected] == ["__change_events"]
    assert all(found[ml]["topic_policy"] == NOT_USED for ml in protected)
    in_ns = {ml: row for ml, row in in_ns.items() if ml not in protected}
    assert {row["topic_name"] for row in in_ns.values()} == set(asked)
    for row in in_ns.values():
        assert row["bundle_owned"] is True and row["topic_policy"] == NOT_SET, row["detail"]
        assert row["status"] != "unknown" and row["reason"] != "topic_policy_may_exist", row["detail"]
    # Its one user topic: an idle subscription at the first ledger keeps everything, and now says so.
    user_topic = next(ml for ml in in_ns if "/unknown-" in ml)
    assert (found[user_topic]["status"], cursors[(user_topic, "old-sub")]["status"]) == ("none", "idle")
    assert cursors[(user_topic, "old-sub")]["reclaimable_bytes"] == found[user_topic]["idle_pinned_bytes"] > 0
    assert all(row["topic_policy"] == RULED_OUT for ml, row in found.items() if ml not in in_ns
               and row["status"] not in ("unknown", "protected"))
    assert len(cluster.retention) > len(in_ns)


@pytest.mark.parametrize("regular_retention", [(-1, -1), (60 * 24 * 60, 20)], ids=["forever", "60d-20MiB"])
def test_skipping_topics_that_cannot_owe_changes_no_row(
        regular_retention: tuple[int, int], seeded_snapshot: SeededSnapshotMaker, zk_clock: ServerClock,
        spark: SparkSession, tmp_path: Path) -> None:
    """The step judges only the topics `may_owe` lets through, on the driver when they are few; on the same
    snapshot, judging every topic, or judging in Spark tasks after the semi-join on names, gives exactly the same
    rows. Under keep-forever regular namespaces few topics may owe; under a finite retention (60 days, 20 MiB)
    many of their topics owe through the time or the size rule and many are held by a cursor on their first
    ledger, so both sides of every rule are crossed."""
    spec = SandboxSpec(seed=31, topics=120, regular_retention=regular_retention)
    _, _, store, run_id = seeded_snapshot(spec)
    variants = {"everything in Spark": {"skip_topics_that_cannot_owe": False, "driver_assess_max_rows": 0},
                "skipping in Spark": {"driver_assess_max_rows": 0}}
    stores = {}
    for i, name in enumerate(variants):
        shutil.copytree(tmp_path / "tables", tmp_path / f"tables-{i}")
        stores[name] = open_table_store(str(tmp_path / f"tables-{i}"), spark, engine="delta-rs")
    counts = run_retention_debt(spark, store, run_id, RetentionSettings(delete_after_ms=30 * DAY_MS)).counts
    for name, overrides in variants.items():
        run_retention_debt(spark, stores[name], run_id, RetentionSettings(delete_after_ms=30 * DAY_MS, **overrides))

    def rows(s: TableStore) -> list[dict[str, Any]]:
        return sorted(({k: v for k, v in r.asDict().items() if k != "captured_at"}
                       for r in s.read("retention_debt").where(f"run_id = '{run_id}'").collect()),
                      key=lambda r: (r["managed_ledger"], r["kind"], r["cursor"] or ""))

    skipped = rows(store)
    for name in variants:
        assert rows(stores[name]) == skipped, name
    regular = [r for r in skipped if r["namespace"].startswith("ns-")]
    if regular_retention == (-1, -1):
        assert counts.topics_judged < 30 and not regular  # only a few scenario topics may owe
    else:
        owing = {r["reason"] for r in regular}
        assert len(regular) >= 20 and owing <= {"expired_not_trimmed", "expired_awaiting_broker_trim"}, owing
        assert len(regular) <= counts.topics_judged < 120, counts  # a cursor on the first ledger holds the rest
        return
    forever = [r for r in skipped if r["managed_ledger"].startswith(f"{FOREVER_NS}/")]
    assert {(r["kind"], r["cursor"]) for r in forever} == {("topic", None), ("cursor", "stale-sub")}


def test_the_column_wise_summaries_are_retention_summarize_of_each_topic() -> None:
    """`_summaries` computes, from the tables' aggregates and without a topic's rows together, exactly what
    `retention.summarize` makes of the topic's facts: the slowest position by ledger then entry, the compaction
    cursor's apart, the least recently seen cursor, the first entry only when it is the lowest id, once."""
    import dataclasses
    import random

    import numpy as np
    import pyarrow as pa

    from sweeper.retention.debt_reads import _Topics
    from sweeper.retention.debt_select import _summaries
    from sweeper.rules.retention import COMPACTION_CURSOR, Cursor, Ledger, Position, TopicSummaries, summarize

    rng = random.Random(3)
    now = 1_700_000_000_000
    mls, ledger_rows, cursor_rows, expected = [], [], [], []
    for t in range(600):
        name = f"t/ns/persistent/topic-{t}"
        listed = [Ledger(rng.randrange(0, 40), rng.choice([0, 1, 10]), rng.choice([0, 5, 1000]),
                         now - rng.randrange(0, 10**9)) for _ in range(rng.randrange(0, 5))]
        if rng.random() < 0.8:
            listed.sort(key=lambda x: x.ledger_id)  # as Pulsar lists them; the rest are out of order
        cursors = [Cursor(rng.choice(["a", "b", COMPACTION_CURSOR]),
                          Position(rng.randrange(-1, 40), rng.randrange(-1, 3)), -1, now - rng.randrange(0, 10**9),
                          rng.choice([0, now])) for _ in range(rng.randrange(0, 4))]
        mls.append({"managed_ledger": name, "tenant": "t", "namespace": "ns", "topic": f"topic-{t}",
                    "ledger_count": len(listed)})
        ledger_rows += [{"managed_ledger": name, "position": i, **dataclasses.asdict(x)}
                        for i, x in enumerate(listed)]
        cursor_rows += [{"managed_ledger": name, "cursor": c.name, "cursors_ledger_id": -1,
                         "mark_delete_ledger_id": c.mark_delete.ledger_id,
                         "mark_delete_entry_id": c.mark_delete.entry_id, "zk_mtime_ms": c.zk_mtime_ms,
                         "last_active_ms": c.last_active_ms} for c in cursors]
        summary = summarize(listed, cursors)
        if listed and (summary.first is None or listed[0].ledger_id != summary.first.ledger_id):
            summary = dataclasses.replace(summary, first=None)  # not in id order: judged in full
        expected.append(summary)
    # Rows of a managed ledger the run has no row for count for nothing; a null mark-delete is -1, as judged.
    cursor_rows.append({"managed_ledger": "gone", "cursor": "a", "cursors_ledger_id": -1, "mark_delete_ledger_id": 0,
                        "mark_delete_entry_id": 0, "zk_mtime_ms": 0, "last_active_ms": 0})
    mls.append({"managed_ledger": "t/ns/persistent/nulls", "tenant": "t", "namespace": "ns", "topic": "nulls",
                "ledger_count": 0})
    cursor_rows.append({"managed_ledger": "t/ns/persistent/nulls", "cursor": "a", "cursors_ledger_id": -1,
                        "mark_delete_ledger_id": None, "mark_delete_entry_id": None, "zk_mtime_ms": 5,
                        "last_active_ms": None})
    expected.append(summarize([], [Cursor("a", Position(-1, -1), -1, 5)]))
    # Two first entries in one list (two snapshot rows for one list): not summarized.
    twice = [Ledger(3, 10, 100, now), Ledger(3, 10, 100, now), Ledger(4, 0, 0, 0)]
    mls.append({"managed_ledger": "t/ns/persistent/twice", "tenant": "t", "namespace": "ns", "topic": "twice",
                "ledger_count": 3})
    ledger_rows += [{"managed_ledger": "t/ns/persistent/twice", "position": i, **dataclasses.asdict(x)}
                    for i, x in zip([0, 0, 1], twice, strict=True)]
    expected.append(dataclasses.replace(summarize(twice, []), first=None))
    ledgers = pa.Table.from_pylist(ledger_rows).rename_columns({"closed_ms": "timestamp_ms"})
    lists = ledgers.group_by("managed_ledger").aggregate([("ledger_id", "min"), ("ledger_id", "max"),
                                                         ("ledger_id", "count"), ("size", "sum")])
    firsts = ledgers.filter(pa.compute.equal(ledgers["position"], 0))
    cursors_table = pa.Table.from_pylist(cursor_rows, schema=pa.schema(
        [("managed_ledger", pa.string()), ("cursor", pa.string()), ("cursors_ledger_id", pa.int64()),
         ("mark_delete_ledger_id", pa.int64()), ("mark_delete_entry_id", pa.int64()), ("zk_mtime_ms", pa.int64()),
         ("last_active_ms", pa.int64())]))
    got = _summaries(_Topics(pa.Table.from_pylist(mls), cursors_table, lists, firsts, None))
    want = TopicSummaries.of(expected)
    for field in dataclasses.fields(TopicSummaries):
        g, w = getattr(got, field.name), getattr(want, field.name)
        if field.name.startswith("first_") and field.name != "first_known":
            g, w = g[want.first_known], w[want.first_known]  # unset values are not compared
        if field.name.startswith("slowest_"):
            g, w = g[want.has_cursor], w[want.has_cursor]
        if field.name.startswith("compaction_"):
            g, w = g[want.has_compaction], w[want.has_compaction]
        if field.name == "current_ledger_id":
            g, w = g[want.ledger_count > 0], w[want.ledger_count > 0]
        assert np.array_equal(g, w), field.name


@pytest.mark.parametrize("driver_assess_max_rows", [500_000, 0], ids=["driver", "spark"])
def test_what_pulsar_protects_is_protected_with_its_reason_never_a_candidate(
        driver_assess_max_rows: int, seeded_snapshot: SeededSnapshotMaker, zk_clock: ServerClock,
        spark: SparkSession) -> None:
    """Issue 26, item 1: with subscription deletion on (30 days) every 60-day idle subscription would be a
    candidate. A replicated subscription (its cursor's `pulsar.replicated.subscription` = 1, as
    PersistentSubscription writes it), the pending-ack stores of both spellings
    (`<topic>-<sub>__transaction_pending_ack` / `__pending_ack_state`, `<topic>-<sub>-transaction-pendingack` /
    `pendingack`) and what the operator protects
    ([retention] protected_subscriptions / protected_topics, through RetentionSettings.from_config) are `protected`
    with their reason; the ordinary idle subscription next to them is still a candidate. Both per-topic passes
    (the driver's Arrow and Spark's shuffle) carry the replicated flag."""
    from harness.sandbox.model import Cursor, ManagedLedger, MlLedger

    cluster = build_cluster(SandboxSpec(seed=5, topics=10))
    base = next(ml for ml in cluster.managed_ledgers if ml.topic == "idle-forever-0")
    stale = next(c for c in base.cursors if c.name == "stale-sub")

    def idle_cursor(name: str, long_properties: dict[str, int] | None = None) -> Cursor:
        return Cursor(name, -1, stale.mark_delete, dict(long_properties or {}), zk_mtime_ms=stale.zk_mtime_ms,
                      last_active_ms=stale.last_active_ms)

    base.cursors += [idle_cursor("geo-sub", {"pulsar.replicated.subscription": 1}),
                     idle_cursor("not-geo", {"pulsar.replicated.subscription": 0}), idle_cursor("audit-keep")]
    next_id = max(x.ledger_id for ml in cluster.managed_ledgers for x in ml.ledgers) + 1000
    added: dict[str, str] = {}  # local name -> its cursor

    def copy_of(local: str, cursor: str) -> None:
        ledgers = [MlLedger(next_id + len(added) * 100 + i, x.entries, x.size, x.timestamp_ms)
                   for i, x in enumerate(base.ledgers)]
        cluster.managed_ledgers.append(ManagedLedger(base.tenant, base.namespace, local, ledgers, [idle_cursor(cursor)],
                                                     {}, "NONE", zk_mtime_ms=base.zk_mtime_ms))
        added[local] = cursor

    copy_of("idle-forever-0-stale-sub__transaction_pending_ack", "__pending_ack_state")
    copy_of("idle-forever-0-stale-sub-transaction-pendingack", "pendingack")
    copy_of("ledger-audit", "reader")
    _, cfg, store, run_id = seeded_snapshot(
        cluster, retention={"cursor_idle_days": 30, "protected_subscriptions": "audit-*",
                            "protected_topics": f"{base.tenant}/{base.namespace}/ledger-*"})
    settings = dataclasses.replace(RetentionSettings.from_config(cfg),
                                   driver_assess_max_rows=driver_assess_max_rows)
    result = run_retention_debt(spark, store, run_id, settings)
    found, cursors = _debt(store, run_id)

    def status(local: str, cursor: str | None = None) -> tuple[str, str]:
        ml = f"{base.tenant}/{base.namespace}/persistent/{local}"
        row = found[ml] if cursor is None else cursors[(ml, cursor)]
        return row["status"], row["reason"]

    assert status(base.topic, "stale-sub") == ("candidate", "idle_cursor")  # deletion is on: the control
    assert status(base.topic, "not-geo") == ("candidate", "idle_cursor")  # the property set, but not to 1
    assert status(base.topic, "geo-sub") == ("protected", "replicated_subscription")
    assert status(base.topic, "audit-keep") == ("protected", "operator_protected_subscription")
    for local, reason in (("idle-forever-0-stale-sub__transaction_pending_ack", "transaction_pending_ack_store"),
                          ("idle-forever-0-stale-sub-transaction-pendingack", "transaction_pending_ack_store"),
                          ("ledger-audit", "operator_protected_topic")):
        assert status(local) == ("protected", reason), found[f"{base.tenant}/{base.namespace}/persistent/{local}"]
        cursor_reason = "transaction_pending_ack_cursor" if "pending" in local else reason
        assert status(local, added[local]) == ("protected", cursor_reason)
    assert all(row["status"] != "candidate" for row in found.values() if row["system_topic"])
    assert result.counts.topics.get("protected", 0) >= 3
