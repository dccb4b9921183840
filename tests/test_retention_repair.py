"""The retention repair's plan, re-checks, cap and dry run, on the sandbox (no broker needed: a dry run
never calls one). What the broker does with `--execute` is tested on the real Pulsar testbed
(tests/real_pulsar/test_retention.py): the sandbox's endpoint has no trim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from sweeper.config import ConfigError
from sweeper.names import encode_local_name
from sweeper.retention_debt import RetentionSettings, run_retention_debt
from sweeper.retention_repair import (
    DEFERRED,
    DELETE_SUBSCRIPTION,
    LOAD_TOPIC,
    SKIPPED_ACTIVE,
    SKIPPED_GONE,
    WOULD_DELETE,
    WOULD_LOAD,
    BrokerAdmin,
    RetentionRepairRefused,
    _Pacer,
    plan_actions,
    run_repair,
    subscription_activity,
)
from sweeper.sandbox.model import SandboxSpec, build_cluster
from sweeper.sandbox.seed import seed_zookeeper
from sweeper.snapshot import run_snapshot
from sweeper.system_topic import RedirectRefused, broker_web_origins, redirect_target
from sweeper.tables import open_table_store
from sweeper.zkserver import ServerClock
from tests.conftest import BASE_CONFIG, ZkTarget


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
    admin = BrokerAdmin(BASE_CONFIG.system_topic.__class__(admin_url="http://broker:8080"))
    assert admin.topic_url("persistent://t/ns/odd:name with space%x", "/trim") == (
        "http://broker:8080/admin/v2/persistent/t/ns/odd%3Aname%20with%20space%25x/trim")
    assert admin.topic_url("persistent://t/c/ns/old") == "http://broker:8080/admin/persistent/t/c/ns/old"


def test_calls_are_paced() -> None:
    slept: list[float] = []
    pacer = _Pacer(4.0, sleep=slept.append)
    for _ in range(3):
        pacer.wait()
    # No time passes between calls here (the sleep is recorded, not slept): the calls are 0.25 s apart.
    assert len(slept) == 2 and 0.2 < slept[0] <= 0.25 and 0.45 < slept[1] <= 0.5


def test_a_dry_run_rechecks_each_znode_and_respects_the_cap(
        zk: KazooClient, zk_target: ZkTarget, zk_clock: ServerClock, spark: SparkSession, tmp_path: Path) -> None:
    cluster = build_cluster(SandboxSpec(seed=4, topics=20))
    seed_zookeeper(zk, cluster)
    cfg = BASE_CONFIG.replace(bookkeeper={"zookeeper": zk_target.hosts}, offload={"enabled": False},
                              tables={"root": str(tmp_path / "tables"), "engine": "delta-rs"},
                              retention={"cursor_idle_days": 30.0})
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    run_id = run_snapshot(spark, cfg, store).run_id
    run_retention_debt(spark, store, run_id, RetentionSettings.from_config(cfg.retention, cfg.safety))
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
