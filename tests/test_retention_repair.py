"""The retention repair's plan, re-checks, cap and dry run, on the sandbox (no broker needed: a dry run
never calls one). What the broker does with `--execute` is tested on the real Pulsar testbed
(tests/real_pulsar/test_retention.py): the sandbox's endpoint has no trim."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxSpec
from harness.zkserver import ServerClock
from sweeper import runs
from sweeper.broker.errors import RedirectRefused
from sweeper.broker.system_topic import AdminClient, broker_web_origins, redirect_target
from sweeper.codecs import pulsar as codec
from sweeper.connections import Connections
from sweeper.errors import ConfigError
from sweeper.names import encode_local_name
from sweeper.pipeline import repair_stage
from sweeper.ratelimit import TokenBucket
from sweeper.retention.debt import run_retention_debt
from sweeper.retention.debt_types import RetentionSettings
from sweeper.retention.errors import RetentionRepairRefused
from sweeper.retention.journal import (
    DELETE_CALL,
    DELETE_SUBSCRIPTION,
    DELETED,
    INTERRUPTED,
    LOAD_TOPIC,
    LOADED,
    STATS_CALL,
    TRIM_CALL,
    TRIMMED,
    UNKNOWN,
    Intent,
    NodeNow,
    settle,
)
from sweeper.retention.policies import TopicPolicyLookup
from sweeper.retention.repair import run_repair
from sweeper.retention.repair_plan import (
    DEFERRED,
    NOT_NEEDED,
    SKIPPED,
    SKIPPED_ACTIVE,
    SKIPPED_GONE,
    WOULD_DELETE,
    WOULD_LOAD,
    plan_actions,
    plan_age_refusal,
    replication_refusal,
    subscription_activity,
)
from sweeper.rules.protection import REPLICATED_SUBSCRIPTION_PROPERTY
from sweeper.runs import record as record_run
from sweeper.table_schemas import RETENTION_DEBT
from sweeper.tables import open_table_store
from sweeper.vocabulary import SET, UNREAD
from tests.support.admin_server import AdminServer, Answer, pulsar_like_answers
from tests.support.config import BASE_CONFIG, ZkTarget
from tests.support.gates import record_gated_reconcile
from tests.support.seeded import SeededSnapshotMaker, sandbox_config


def row(kind: str, ml: str, status: str = "candidate", cursor: str | None = None, size: int = 10,
        version: int = 1) -> dict[str, Any]:
    return {"kind": kind, "status": status, "managed_ledger": ml, "cursor": cursor, "tenant": "t", "namespace": "ns",
            "topic_name": f"persistent://t/ns/{ml.rsplit('/', 1)[1]}", "reclaimable_bytes": size, "zk_version": version}


def test_the_plan_deletes_subscriptions_before_trimming_and_acts_only_on_candidates() -> None:
    plan = plan_actions([
        row("topic", "t/ns/persistent/a", size=100),
        row("cursor", "t/ns/persistent/a", cursor="idle", size=5),
        row("cursor", "t/ns/persistent/b", cursor="idle", size=500),
        row("topic", "t/ns/persistent/c", status="awaiting_broker", size=10_000),
        row("topic", "t/ns/persistent/d", status="unknown", size=10_000),
        row("cursor", "t/ns/persistent/d", status="idle", cursor="x", size=10_000),
        row("cursor", "t/ns/persistent/e", status="protected", cursor="__compaction"),
    ])
    got = [(a.action, a.managed_ledger.rsplit("/", 1)[1], a.cursor, a.check_version) for a in plan]
    assert got == [
        (DELETE_SUBSCRIPTION, "b", "idle", True), (LOAD_TOPIC, "b", None, False),  # 500 bytes: first
        (DELETE_SUBSCRIPTION, "a", "idle", True), (LOAD_TOPIC, "a", None, False),  # we loaded it: no version check
    ]


def test_the_brokers_live_stats_veto_a_deletion() -> None:
    idle = {"subscriptions": {"s": {"consumers": [], "lastAckedTimestamp": 0, "lastConsumedTimestamp": 100}}}
    assert subscription_activity(idle, "s", since_ms=1_000) is None
    assert subscription_activity(idle, "s", since_ms=50) == "lastConsumedTimestamp 100 is after 50"
    connected = {"subscriptions": {"s": {"consumers": [{"consumerName": "c"}]}}}
    assert subscription_activity(connected, "s", 0) == "1 consumer(s) connected"
    assert subscription_activity({"subscriptions": {}}, "s", 0) == "gone"


def test_admin_paths_encode_names_as_pulsar_decodes_them() -> None:
    admin = AdminClient(BASE_CONFIG.system_topic.__class__(admin_url="http://broker:8080"))
    assert admin.topic_url("persistent://t/ns/odd:name with space%x", "/trim") == (
        "http://broker:8080/admin/v2/persistent/t/ns/odd%3Aname%20with%20space%25x/trim")
    assert admin.topic_url("persistent://t/c/ns/old") == "http://broker:8080/admin/persistent/t/c/ns/old"


def test_calls_are_paced() -> None:
    slept: list[float] = []
    pacer = TokenBucket(4.0, sleep=slept.append)  # the one pacer (issue 22): the repair's calls use it too
    for _ in range(3):
        pacer.acquire(1)
    # No time passes between calls here (the sleep is recorded, not slept): the calls are 0.25 s apart.
    assert len(slept) == 2 and 0.2 < slept[0] <= 0.25 and 0.45 < slept[1] <= 0.5


def test_a_dry_run_rechecks_each_znode_and_respects_the_cap(
        zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, zk_clock: ServerClock, spark: SparkSession) -> None:
    cluster, cfg, store, run_id = seeded_snapshot(SandboxSpec(seed=4, topics=20), retention={"cursor_idle_days": 30.0})
    run_retention_debt(spark, store, run_id, RetentionSettings.from_config(cfg))
    by_scenario = {e.scenario: e for e in cluster.retention}

    dry = run_repair(cfg, store, run_id, "repair-1")
    outcomes = {(r["action"], r["managed_ledger"], r["cursor"]): r["outcome"] for r in dry.rows}
    for scenario in ("expired_unloaded", "partly_consumed", "over_quota", "ttl_expired"):
        assert outcomes[(LOAD_TOPIC, by_scenario[scenario].managed_ledger, None)] == WOULD_LOAD, scenario
    stale = by_scenario["idle_cursor"].managed_ledger
    assert outcomes[(DELETE_SUBSCRIPTION, stale, "stale-sub")] == WOULD_DELETE
    assert outcomes[(LOAD_TOPIC, stale, None)] == WOULD_LOAD
    acted_on = {ml for _, ml, _ in outcomes}
    for scenario in ("expired_loaded", "idle_lagging", "idle_compaction", "unknown_retention-bad",
                     "change_events_empty"):
        assert by_scenario[scenario].managed_ledger not in acted_on, scenario
    assert all(r["dry_run"] for r in dry.rows)

    # Between plan and act: a topic loaded (its list rewritten), a subscription deleted by someone else.
    ml_path = f"/managed-ledgers/{by_scenario['expired_unloaded'].managed_ledger}"
    zk.set(ml_path, zk.get(ml_path)[0])
    zk.delete(f"/managed-ledgers/{stale}/{encode_local_name('stale-sub')}")
    again = run_repair(cfg, store, run_id, "repair-2")
    outcomes = {(r["action"], r["managed_ledger"], r["cursor"]): r["outcome"] for r in again.rows}
    assert outcomes[(LOAD_TOPIC, by_scenario["expired_unloaded"].managed_ledger, None)] == SKIPPED_ACTIVE
    assert outcomes[(DELETE_SUBSCRIPTION, stale, "stale-sub")] == SKIPPED_GONE

    capped = run_repair(cfg.replace(retention={"max_actions_per_run": 2}), store, run_id, "repair-3")
    assert [r["outcome"] for r in capped.rows].count(DEFERRED) == len(capped.rows) - 2
    assert store.read("retention_actions").count() == len(dry.rows) + len(again.rows) + len(capped.rows)

    with pytest.raises(RetentionRepairRefused, match="no successful reconcile that passed the data-quality gates"):
        run_repair(cfg, store, run_id, "repair-4", execute=True)  # a snapshot alone: never acted on
    record_gated_reconcile(store, run_id, {}, cfg)
    with pytest.raises(RetentionRepairRefused, match="admin_url"):
        run_repair(cfg, store, run_id, "repair-4", execute=True)


def test_subscription_deletion_needs_a_day_at_least_and_never_a_config_switch() -> None:
    with pytest.raises(ConfigError, match="cursor_idle_days"):
        BASE_CONFIG.replace(retention={"cursor_idle_days": 0.5})
    forced = BASE_CONFIG.replace(retention={"cursor_idle_days": 0.5, "force_cursor_idle": True})
    assert forced.retention.cursor_idle_days == 0.5
    with pytest.raises(ConfigError, match="--execute"):
        BASE_CONFIG.replace(retention={"execute": True})
    assert BASE_CONFIG.retention.cursor_idle_days == 0  # off unless set


# ---- issue 26: a plan is a request; admin calls stay in this cluster; outcomes are durable as they happen ----

TOKEN = "secret-token-26"


def _redirecting_to(target: str) -> Callable[[str, str], tuple[int, dict[str, str], bytes]]:
    return lambda method, path: (307, {"Location": f"{target}{path}"}, b"")


def _broker_answers(stats: dict[str, Any] | None = None) -> Callable[[str, str], tuple[int, dict[str, str], bytes]]:
    """A broker that owns every topic: idle subscriptions in its stats, deletes and trims succeed."""

    def answer(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        if method == "GET" and path.endswith("/stats"):
            subscriptions = stats or {"idle-sub": {"consumers": []}}
            return 200, {}, json.dumps({"subscriptions": subscriptions}).encode()
        return 204, {}, b""

    return answer


@pytest.fixture
def servers() -> Iterator[list[AdminServer]]:
    started: list[AdminServer] = []
    yield started
    for server in started:
        server.close()


def _serve(servers: list[AdminServer], answer: Answer) -> AdminServer:
    server = AdminServer(answer)
    servers.append(server)
    return server


def _register_broker(zk: KazooClient, url: str) -> None:
    """As a broker registers (ephemeral, LocalBrokerData / BrokerLookupData JSON)."""
    host_port = url.removeprefix("http://")
    zk.create(f"/loadbalance/brokers/{host_port}", json.dumps({"webServiceUrl": url}).encode(), ephemeral=True,
              makepath=True)


def _seed_topic(zk: KazooClient, ml: str, cursors: dict[str, dict[str, int]], mark: tuple[int, int] = (3, 7),
                replication_clusters: list[str] | None = None) -> None:
    """A managed ledger with idle cursors at `mark`, and its namespace's policies, as Pulsar writes them."""
    info = codec.pb.ManagedLedgerInfo()
    ledger = info.ledgerInfo.add()
    ledger.ledgerId, ledger.entries, ledger.size, ledger.timestamp = 3, 10, 1000, 1
    zk.create(f"/managed-ledgers/{ml}", codec.encode_managed_ledger_info(info), makepath=True)
    for name, long_properties in cursors.items():
        cursor = codec.pb.ManagedCursorInfo()
        cursor.cursorsLedgerId, cursor.markDeleteLedgerId, cursor.markDeleteEntryId = -1, *mark
        for key, value in long_properties.items():
            prop = cursor.properties.add()
            prop.name, prop.value = key, value
        zk.create(f"/managed-ledgers/{ml}/{encode_local_name(name)}", codec.encode_managed_cursor_info(cursor))
    namespace = "/".join(ml.split("/")[:2])
    policies = {"replication_clusters": ["sandbox"] if replication_clusters is None else replication_clusters}
    if not zk.exists(f"/admin/policies/{namespace}"):
        zk.create(f"/admin/policies/{namespace}", json.dumps(policies).encode(), makepath=True)


def _plan_row(plan: str, ml: str, cursor: str | None = None, size: int = 100, mark: tuple[int, int] = (3, 7),
              topic_name: str | None = None, captured_at: datetime | None = None) -> dict[str, Any]:
    """A retention_debt row written by hand: the repair must judge it, whoever wrote it."""
    tenant, namespace, _, local = ml.split("/")
    return {"run_id": plan, "captured_at": captured_at or datetime.now(UTC), "kind": "cursor" if cursor else "topic",
            "status": "candidate", "reason": "idle_cursor" if cursor else "expired_not_trimmed",
            "tenant": tenant, "namespace": namespace, "topic": local,
            "topic_name": topic_name or f"persistent://{tenant}/{namespace}/{local}", "managed_ledger": ml,
            "cursor": cursor, "reclaimable_bytes": size, "mark_delete_ledger_id": mark[0],
            "mark_delete_entry_id": mark[1], "zk_version": 0}


def _repair_setup(zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, admin_url: str = "",
                  **retention: Any) -> tuple[Any, Any]:
    cfg = sandbox_config(zk_target.hosts, tmp_path / "tables",
                         system_topic={"admin_url": admin_url, "auth_token_env": "SWEEPER_TEST_TOKEN"},
                         retention={"cursor_idle_days": 30.0, "actions_per_second": 1000.0, **retention})
    return cfg, open_table_store(cfg.tables.root, spark, engine="delta-rs")


def _write_plan(store: Any, cfg: Any, rows: list[dict[str, Any]], started: datetime | None = None) -> str:
    plan = rows[0]["run_id"]
    store.append_rows("retention_debt", rows, RETENTION_DEBT)
    record_gated_reconcile(store, plan, {}, cfg, started)
    record_run(store, plan, "retention_debt", "succeeded", started or datetime.now(UTC), {}, cfg)
    return plan


def _outcomes(rows: list[dict[str, Any]]) -> dict[tuple[str, str | None], tuple[str, str]]:
    return {(r["topic_name"].rsplit("/", 1)[1], r["cursor"]): (r["outcome"], r["detail"]) for r in rows}


def test_a_redirect_outside_the_cluster_is_refused_and_its_host_receives_nothing(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, servers: list[AdminServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWEEPER_TEST_TOKEN", TOKEN)
    peer = _serve(servers, _broker_answers())  # another cluster's broker, owner of a global namespace
    ours = _serve(servers, _redirecting_to(peer.url))
    _register_broker(zk, ours.url)
    _seed_topic(zk, "t/ns/persistent/orders", {"idle-sub": {}})
    cfg, store = _repair_setup(zk_target, spark, tmp_path, ours.url)
    plan = _write_plan(store, cfg, [_plan_row("plan-1", "t/ns/persistent/orders", "idle-sub")])

    result = run_repair(cfg, store, plan, "repair-1", execute=True)

    assert peer.requests == []  # no request at all, so no token either
    assert [(m, a) for m, _, a in ours.requests] == [("GET", f"Bearer {TOKEN}")]  # the stats call, refused
    outcome, detail = _outcomes(result.rows)[("orders", "idle-sub")]
    assert outcome == SKIPPED and detail.startswith("redirect_outside_cluster:")
    assert peer.url.removeprefix("http://") in detail and TOKEN not in detail
    on_disk = {(r["cursor"], r["outcome"]) for r in store.read("retention_actions").collect()}
    assert ("idle-sub", SKIPPED) in on_disk
    # The rule is the base admin client's, so every admin call keeps it: the partitioned-topic read too.
    with pytest.raises(RedirectRefused, match="redirect_outside_cluster"):
        AdminClient(cfg.system_topic).partitions("persistent://t/ns/orders")
    assert peer.requests == []


def test_a_redirect_to_a_broker_of_this_cluster_is_followed(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, servers: list[AdminServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWEEPER_TEST_TOKEN", TOKEN)
    owner = _serve(servers, _broker_answers())
    ours = _serve(servers, _redirecting_to(owner.url))
    _register_broker(zk, ours.url)
    _register_broker(zk, owner.url)
    _seed_topic(zk, "t/ns/persistent/orders", {"idle-sub": {}})
    cfg, store = _repair_setup(zk_target, spark, tmp_path, ours.url)
    plan = _write_plan(store, cfg, [_plan_row("plan-1", "t/ns/persistent/orders", "idle-sub")])

    result = run_repair(cfg, store, plan, "repair-1", execute=True)

    got = _outcomes(result.rows)
    assert got[("orders", "idle-sub")][0] == DELETED and got[("orders", None)][0] == TRIMMED
    assert [(m, p.rsplit("/", 1)[1], a) for m, p, a in owner.requests] == [
        ("GET", "stats", f"Bearer {TOKEN}"), ("DELETE", "idle-sub", f"Bearer {TOKEN}"),
        ("POST", "trim", f"Bearer {TOKEN}")]


def test_redirect_targets_compare_scheme_host_and_port() -> None:
    allowed = frozenset({("http", "broker-1", 8080), ("https", "broker-1", 8443)})
    assert redirect_target("http://lb:80/a", "http://BROKER-1:8080/b", allowed, "GET") == "http://BROKER-1:8080/b"
    assert redirect_target("https://broker-1:8443/a", "/b?x=1", allowed, "GET") == "https://broker-1:8443/b?x=1"
    for refused in ("http://broker-1:8081/b", "https://broker-1:8080/b", "http://broker-1/b", "ftp://broker-1:8080/",
                    "http://peer:8080/b"):
        with pytest.raises(RedirectRefused, match="redirect_outside_cluster"):
            redirect_target("http://lb/a", refused, allowed, "DELETE")
    assert broker_web_origins(b'{"webServiceUrl": "http://b:8080", "webServiceUrlTls": "https://b:8443"}') == {
        ("http", "b", 8080), ("https", "b", 8443)}
    assert broker_web_origins(b"not json") == set() and broker_web_origins(b'{"webServiceUrl": null}') == set()


def test_a_namespace_whose_replication_clusters_leave_this_cluster_out_is_skipped(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    _seed_topic(zk, "t/global/persistent/a", {"idle-sub": {}}, replication_clusters=["east", "west"])
    _seed_topic(zk, "t/shared/persistent/b", {"idle-sub": {}}, replication_clusters=["east", "sandbox"])
    _seed_topic(zk, "t/local/persistent/c", {"idle-sub": {}}, replication_clusters=[])
    cfg, store = _repair_setup(zk_target, spark, tmp_path)
    plan = _write_plan(store, cfg, [_plan_row("plan-1", f"t/{ns}/persistent/{t}", "idle-sub")
                                    for ns, t in (("global", "a"), ("shared", "b"), ("local", "c"))])

    got = _outcomes(run_repair(cfg, store, plan, "repair-1").rows)

    assert got[("a", "idle-sub")][0] == SKIPPED and got[("a", None)][0] == SKIPPED
    assert got[("a", "idle-sub")][1].startswith("not_replicated_here: t/global's replication_clusters ['east', 'west']")
    assert got[("b", "idle-sub")][0] == WOULD_DELETE and got[("c", "idle-sub")][0] == WOULD_DELETE
    assert replication_refusal("t/ns", None, "sandbox", "no namespace policies at /admin/policies/t/ns") is not None
    assert replication_refusal("t/ns", ["east"], "") is not None  # no cluster name: cannot tell


def test_an_old_plan_is_refused_with_execute(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    _seed_topic(zk, "t/ns/persistent/orders", {"idle-sub": {}})
    cfg, store = _repair_setup(zk_target, spark, tmp_path, "http://127.0.0.1:9")
    old = datetime.now(UTC) - timedelta(hours=30)
    plan = _write_plan(store, cfg, [_plan_row("plan-1", "t/ns/persistent/orders", "idle-sub", captured_at=old)], old)

    with pytest.raises(RetentionRepairRefused, match=r"30.0 h old, above \[retention\] plan_max_age_hours = 24"):
        run_repair(cfg, store, plan, "repair-1", execute=True)
    assert not store.exists("retention_actions")
    # A dry run still shows what the plan asks, re-checked today; and a longer allowance lets it through.
    assert _outcomes(run_repair(cfg, store, plan, "repair-2").rows)[("orders", "idle-sub")][0] == WOULD_DELETE
    assert plan_age_refusal("p", 1000.0, 1000.0 + 47 * 3600, 48.0) is None
    assert plan_age_refusal("p", None, 0.0, 48.0) is not None


def test_a_plan_whose_snapshot_never_passed_the_gates_is_never_executed(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    """DESIGN.md invariant 19: `reconcile --skip-gates` (an audit) leaves a run whose plan can be read, never acted
    on; nor can a plan whose run has no reconcile that passed the gates."""
    _seed_topic(zk, "t/ns/persistent/orders", {"idle-sub": {}})
    cfg, store = _repair_setup(zk_target, spark, tmp_path, "http://127.0.0.1:9")
    rows = [_plan_row("plan-1", "t/ns/persistent/orders", "idle-sub")]
    store.append_rows("retention_debt", rows, RETENTION_DEBT)
    record_run(store, "plan-1", "retention_debt", "succeeded", datetime.now(UTC), {}, cfg)

    with pytest.raises(RetentionRepairRefused, match="no successful reconcile that passed the data-quality gates"):
        run_repair(cfg, store, "plan-1", "repair-1", execute=True)
    record_run(store, "plan-1", "reconcile", "succeeded", datetime.now(UTC), {runs.GATES_PASSED: 0}, cfg)
    with pytest.raises(RetentionRepairRefused, match=r"without the data-quality gates \(--skip-gates is for audits"):
        run_repair(cfg, store, "plan-1", "repair-2", execute=True)
    assert not store.exists("retention_actions")
    assert zk.exists("/managed-ledgers/t/ns/persistent/orders/idle-sub")
    # Read, shown and audited: a dry run still judges it.
    assert _outcomes(run_repair(cfg, store, "plan-1", "repair-3").rows)[("orders", "idle-sub")][0] == WOULD_DELETE


def test_todays_rules_refuse_what_a_plan_names(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    _seed_topic(zk, "t/ns/persistent/orders", {
        "geo": {REPLICATED_SUBSCRIPTION_PROPERTY: 1}, "__pending_ack_state": {}, "audit-7": {}, "idle-sub": {}})
    _seed_topic(zk, "t/ns/persistent/moved", {"idle-sub": {}}, mark=(3, 9))
    _seed_topic(zk, f"t/ns/persistent/{encode_local_name('x-sub__transaction_pending_ack')}", {})
    _seed_topic(zk, "t/denied/persistent/d", {"idle-sub": {}})
    cfg, store = _repair_setup(zk_target, spark, tmp_path, deny="t/denied", protected_subscriptions="audit-*")
    rows = [_plan_row("plan-1", "t/ns/persistent/orders", sub) for sub in ("geo", "__pending_ack_state", "audit-7",
                                                                            "idle-sub")]
    rows += [_plan_row("plan-1", "t/ns/persistent/moved", "idle-sub", mark=(3, 7)),
             _plan_row("plan-1", f"t/ns/persistent/{encode_local_name('x-sub__transaction_pending_ack')}"),
             _plan_row("plan-1", "t/denied/persistent/d", "idle-sub"),
             _plan_row("plan-1", "t/ns/persistent/orders", "forged", topic_name="persistent://t/ns/other")]
    plan = _write_plan(store, cfg, rows)

    got = _outcomes(run_repair(cfg, store, plan, "repair-1").rows)

    def rule(key: tuple[str, str | None]) -> str:
        outcome, detail = got[key]
        assert outcome == SKIPPED, (key, outcome, detail)
        return detail.split(" (", 1)[0].split(",", 1)[0]

    assert rule(("orders", "geo")) == "protected: replicated_subscription subscription 'geo'"
    assert rule(("orders", "__pending_ack_state")).startswith("protected: transaction_pending_ack_cursor")
    assert rule(("orders", "audit-7")).startswith("protected: operator_protected_subscription")
    assert rule(("x-sub__transaction_pending_ack", None)).startswith("protected: transaction_pending_ack_store")
    assert got[("moved", "idle-sub")][1] == "cursor_moved: mark-delete 3:9, planned at 3:7"
    assert rule(("d", "idle-sub")).startswith("out_of_scope: t/denied")
    assert rule(("other", "forged")).startswith("plan_mismatch")
    assert got[("orders", "idle-sub")][0] == WOULD_DELETE


def test_the_brokers_isreplicated_vetoes_a_delete(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, servers: list[AdminServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWEEPER_TEST_TOKEN", TOKEN)
    broker = _serve(servers, _broker_answers({"idle-sub": {"consumers": [], "isReplicated": True}}))
    _seed_topic(zk, "t/ns/persistent/orders", {"idle-sub": {}})  # the property not (yet) in ZooKeeper
    cfg, store = _repair_setup(zk_target, spark, tmp_path, broker.url)
    plan = _write_plan(store, cfg, [_plan_row("plan-1", "t/ns/persistent/orders", "idle-sub")])

    got = _outcomes(run_repair(cfg, store, plan, "repair-1", execute=True).rows)

    assert got[("orders", "idle-sub")][0] == SKIPPED
    assert got[("orders", "idle-sub")][1].startswith("protected: replicated_subscription")
    assert [m for m, _, _ in broker.requests] == ["GET"]


class _Killed(BaseException):
    """The process dying mid-repair: nothing after it runs (not even `except Exception`)."""


def test_every_action_is_on_disk_before_the_next_call_to_the_broker(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, servers: list[AdminServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWEEPER_TEST_TOKEN", TOKEN)
    broker = _serve(servers, _broker_answers())
    for topic in ("a", "b", "c"):
        _seed_topic(zk, f"t/ns/persistent/{topic}", {"idle-sub": {}})
    cfg, store = _repair_setup(zk_target, spark, tmp_path, broker.url)
    plan = _write_plan(store, cfg, [_plan_row("plan-1", f"t/ns/persistent/{t}", "idle-sub", size=s)
                                    for t, s in (("a", 300), ("b", 200), ("c", 100))])
    on_disk_at_call: list[int] = []

    class DyingAdmin(AdminClient):
        """The real client; the process is killed at its third mutating call."""

        def _call(self, method: str, url: str, body: bytes | None = None, hops: int = 3) -> tuple[int, bytes]:
            if method in ("DELETE", "POST"):
                done = store.read("retention_actions").count() if store.exists("retention_actions") else 0
                on_disk_at_call.append(done)
                if len(on_disk_at_call) == 3:
                    raise _Killed()
            return super()._call(method, url, body, hops)

    with pytest.raises(_Killed):
        run_repair(cfg, store, plan, "repair-1", execute=True, admin=DyingAdmin(cfg.system_topic))

    # Delete a's subscription, trim a, then b's delete: before each call, every earlier action has its row.
    assert on_disk_at_call == [0, 1, 2]
    rows = sorted((r["topic_name"], r["action"], r["outcome"]) for r in store.read("retention_actions").collect())
    assert rows[:2] == [("persistent://t/ns/a", DELETE_SUBSCRIPTION, DELETED), ("persistent://t/ns/a", LOAD_TOPIC,
                                                                                  TRIMMED)]


class _Killed(BaseException):
    """Stands for a SIGKILL: nothing in the run catches it, so its journal stays unclosed."""


def test_a_trim_owed_by_a_killed_run_whose_trim_call_cannot_be_told_is_made_by_the_next_run(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, servers: list[AdminServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CI caught this race: a run killed right after the broker answered a subscription delete had already committed
    the intent of the topic's trim, and the fold left that trim (`unknown`: a trim of a loaded topic that dropped
    nothing leaves no trace) out of the next run's plan, so nobody trimmed the topic."""
    monkeypatch.setenv("SWEEPER_TEST_TOKEN", TOKEN)
    broker = _serve(servers, pulsar_like_answers(zk))
    _seed_topic(zk, "t/ns/persistent/a", {"idle-sub": {}})
    cfg, store = _repair_setup(zk_target, spark, tmp_path, broker.url)
    plan = _write_plan(store, cfg, [_plan_row("plan-1", "t/ns/persistent/a", "idle-sub")])
    real_call = AdminClient._call

    def killed_before_the_trim(self: AdminClient, method: str, url: str, body: bytes | None = None,
                               hops: int = 3) -> tuple[int, bytes]:
        if method == "POST" and "/trim" in url:
            raise _Killed  # its intent is on disk; the call is never sent
        return real_call(self, method, url, body, hops)

    monkeypatch.setattr(AdminClient, "_call", killed_before_the_trim)
    with pytest.raises(_Killed):
        run_repair(cfg, store, plan, "repair-1", execute=True)
    monkeypatch.setattr(AdminClient, "_call", real_call)
    assert [m for m, _, _ in broker.requests] == ["GET", "DELETE"]

    again = run_repair(cfg, store, plan, "repair-2", execute=True)
    rows = {(r["run_id"], r["action"]): r for r in store.read_arrow("retention_actions").to_pylist()}
    assert rows[("repair-1", DELETE_SUBSCRIPTION)]["outcome"] == DELETED
    assert rows[("repair-1", LOAD_TOPIC)]["outcome"] == UNKNOWN  # the killed run's, whatever the next one does
    assert rows[("repair-2", LOAD_TOPIC)]["outcome"] == TRIMMED
    assert ("repair-2", DELETE_SUBSCRIPTION) not in rows
    assert [m for m, _, _ in broker.requests] == ["GET", "DELETE", "POST"]
    assert (again.counts.interrupted_runs, again.counts.done_by_interrupted_runs, again.counts.trimmed) == (1, 1, 1)


def test_topic_policy_lookups_follow_redirects_to_this_clusters_brokers_only(
        zk: KazooClient, zk_target: ZkTarget, servers: list[AdminServer]) -> None:
    owner = _serve(servers, lambda method, path: (200, {}, b'{"retentionTimeInMinutes": 60}'))
    peer = _serve(servers, lambda method, path: (200, {}, b"{}"))
    ours = _serve(servers, lambda method, path: (307, {"Location": (peer.url if "/far" in path else owner.url) + path},
                                                 b""))
    _register_broker(zk, ours.url)
    _register_broker(zk, owner.url)
    cfg = BASE_CONFIG.replace(bookkeeper={"zookeeper": zk_target.hosts}, system_topic={"admin_url": ours.url})
    lookup = TopicPolicyLookup(Connections.from_config(cfg).cluster_admin(), 1000.0)

    far = lookup("persistent://t/global/far")
    near = lookup("persistent://t/ns/near")

    assert far[0] == UNREAD and far[1].startswith("redirect_outside_cluster:") and peer.requests == []
    assert near[0] == SET and len(owner.requests) == 1  # asked, after the refused redirect of another topic


# ---- issue 34: an intent before each admin call; a stopped repair's calls are its own ----------------------


def test_a_stopped_calls_outcome_is_settled_from_the_metadata_alone() -> None:
    cursor = Intent(DELETE_CALL, "/ml/t/ns/persistent/a/sub", 0, 1000)
    assert settle(Intent(STATS_CALL, None, None, None), NodeNow(False))[0] == INTERRUPTED  # the delete never asked
    assert settle(cursor, NodeNow(False))[0] == DELETED
    assert settle(cursor, NodeNow(True, 0, 2000))[0] == DELETED  # deleted, then subscribed to anew
    assert settle(cursor, NodeNow(True, 0, 1000))[0] == INTERRUPTED
    assert settle(cursor, NodeNow(False, problem="ConnectionLoss"))[0] == UNKNOWN

    unloaded = Intent(TRIM_CALL, "/ml/t/ns/persistent/b", 4, 1, True, (3, 5), (3,))
    assert settle(unloaded, NodeNow(True, 6, 1, frozenset({5, 9})))[0] == TRIMMED  # the plan's ledger 3 is gone
    assert settle(unloaded, NodeNow(True, 5, 1, frozenset({3, 5, 9})))[0] == LOADED
    assert settle(unloaded, NodeNow(True, 4, 1, frozenset({3, 5})))[0] == INTERRUPTED  # a load would have written
    assert settle(unloaded, NodeNow(True, 4, 1, frozenset({3, 5}), terminated=True))[0] == UNKNOWN
    assert settle(unloaded, NodeNow(False))[0] == UNKNOWN
    # Loaded by this run's own subscription delete: a trim that dropped nothing leaves no trace.
    loaded = Intent(TRIM_CALL, "/ml/t/ns/persistent/b", 4, 1, False, (3, 5), (3,))
    assert settle(loaded, NodeNow(True, 4, 1, frozenset({3, 5})))[0] == UNKNOWN
    assert settle(loaded, NodeNow(True, 5, 1, frozenset({3, 5, 9})))[0] == UNKNOWN
    assert settle(loaded, NodeNow(True, 5, 1, frozenset({5})))[0] == TRIMMED


def test_a_repair_interrupted_after_the_broker_answered_records_that_call_as_its_own(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, servers: list[AdminServer],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWEEPER_TEST_TOKEN", TOKEN)
    broker = _serve(servers, pulsar_like_answers(zk))
    for topic in ("a", "b"):
        _seed_topic(zk, f"t/ns/persistent/{topic}", {"idle-sub": {}})
    cfg, store = _repair_setup(zk_target, spark, tmp_path, broker.url)
    plan = _write_plan(store, cfg, [_plan_row("plan-1", f"t/ns/persistent/{t}", "idle-sub", size=s)
                                    for t, s in (("a", 300), ("b", 200))])

    real_call = AdminClient._call
    mutating: list[str] = []

    def interrupted_call(self: AdminClient, method: str, url: str, body: bytes | None = None,
                         hops: int = 3) -> tuple[int, bytes]:
        """The real call; Ctrl-C lands right after the broker answered the second delete or trim."""
        answer = real_call(self, method, url, body, hops)
        if method in ("DELETE", "POST"):
            mutating.append(url)
            if len(mutating) == 2:
                raise KeyboardInterrupt
        return answer

    monkeypatch.setattr(AdminClient, "_call", interrupted_call)
    with pytest.raises(KeyboardInterrupt):
        repair_stage(cfg, store, plan, "repair-1", execute=True)

    # a's subscription deleted (recorded as it happened), a trimmed (its answer lost to the interrupt): both the
    # run's own, the second from its intent and the managed ledger's list; the run `interrupted`, its journal closed.
    got = {(r["action"], r["topic_name"]): r for r in store.read_arrow("retention_actions").to_pylist()}
    assert got[(DELETE_SUBSCRIPTION, "persistent://t/ns/a")]["outcome"] == DELETED
    trim_a = got[(LOAD_TOPIC, "persistent://t/ns/a")]
    assert trim_a["outcome"] == TRIMMED and trim_a["run_id"] == "repair-1"
    assert trim_a["detail"].startswith("run repair-1 stopped before recording its trim call")
    (row,) = store.read_arrow("runs", where={"run_id": "repair-1"}).to_pylist()
    assert row["status"] == "interrupted"
    assert not zk.exists("/ledger-sweeper/locks/retention_repair")  # released on the way out
    monkeypatch.setattr(AdminClient, "_call", real_call)

    # The next run finds nothing unclosed and does only b, as its own.
    again = run_repair(cfg, store, plan, "repair-2", execute=True)
    outcomes = {(r["action"], r["topic_name"]): r["outcome"] for r in again.rows}
    assert outcomes == {(DELETE_SUBSCRIPTION, "persistent://t/ns/a"): SKIPPED_GONE,
                        (LOAD_TOPIC, "persistent://t/ns/a"): NOT_NEEDED,
                        (DELETE_SUBSCRIPTION, "persistent://t/ns/b"): DELETED,
                        (LOAD_TOPIC, "persistent://t/ns/b"): TRIMMED}
    assert again.counts.interrupted_runs == 0
    journal = store.read_arrow("repair_journal").to_pylist()
    assert {r["run_id"] for r in journal if r["phase"] == "closed"} == {"repair-1", "repair-2"}
    intents = [(r["run_id"], r["call"], r["topic_name"]) for r in sorted(journal, key=lambda r: r["at"])
               if r["phase"] == "intent"]
    assert intents == [("repair-1", c, "persistent://t/ns/a") for c in ("stats", "delete_subscription", "trim")] + [
        ("repair-2", c, "persistent://t/ns/b") for c in ("stats", "delete_subscription", "trim")]
    assert len(broker.requests) == 6
