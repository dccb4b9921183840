"""Retention debt against a real Apache Pulsar (the testbed, tests/real_pulsar/conftest.py).

Two namespaces, each a single bundle, keep everything (retention -1) while the topics are written; then
the topics are unloaded one by one (PUT .../unload: the bundle stays owned) and only then do their
namespaces lower retention to none (0 minutes, 0 MB). A namespace policy change reaches loaded topics
only (PersistentTopic.onPoliciesUpdate), so the unloaded ones never apply it: their expired ledgers stay.
(Unloading the namespace instead does not leave topics unloaded on Pulsar 4.0.8: a system-topic reader
re-acquires the bundle within a second and PulsarService loads every topic of a newly owned bundle.)
- `expiring`: topic `expired` (no subscription, 45 messages: four full ledgers and a fifth) and `woken`;
- `subs`: topic `pinned` with an `idle` subscription (nothing acknowledged since the unload) next to an
  `active` one that acknowledged everything and reconnects before the plan; topic `vetoed` whose idle subscription
  gets a consumer between plan and act; topic `own-policy` with a topic-level retention of its own.
Once a topic stays untrimmed longer than two retention checks and a minute (the rule's slack), one
snapshot and the retention-debt step ([retention] topic_policies = "admin": the broker is asked about
topics in owned bundles), then `sweeper retention --execute`'s repair:
- `expired` is a candidate with exactly the ledgers the broker's rules allow now (ManagedLedgerImpl
  internalTrimLedgers: every ledger but the last listed one, which ManagedLedgerImpl.initialize re-opens
  with the load time as its timestamp) and their bytes as the broker's stats-internal reported them; the
  repair's trim (admin v2 `POST .../trim`, PersistentTopicsBase.internalTrimTopic ->
  ManagedLedgerImpl.trimConsumedLedgersInBackground) makes the broker delete them (with no retention at
  all it also takes the re-opened one: our count is a lower bound there);
- `woken` gets a producer between plan and act (it became active): skipped, untrimmed by us;
- `pinned/idle` is deleted (DELETE .../subscription/idle); `pinned/active`, which acknowledged everything
  and whose consumer is back, looks as idle in ZooKeeper but is left alone (the broker's stats show its
  consumer); the ledgers only `idle` pinned are trimmed;
- `vetoed/idle` is skipped: the broker's stats show its consumer;
- `own-policy` is `unknown` (topic_policy_set): never acted on.
- `protected` (issue 26): subscription `geo` made with replicated subscription state (the broker writes the
  cursor property `pulsar.replicated.subscription` = 1, PersistentSubscription.getBaseCursorProperties, which the
  unload's cursor close persists to ZooKeeper) and `txn-sub`, which acknowledged in a transaction left open
  (pulsar-perf consume -txn: the broker creates `protected-txn-sub__transaction_pending_ack` with its cursor
  `__pending_ack_state`). Every subscription is opted in (cursor_idle_days of 30 s), yet `geo` and the
  pending-ack store and its cursor are `protected` with their reasons, nothing is planned for them, and after
  the repair the broker's stats-internal (the topic's, and the store's through the transactions endpoint)
  still shows both cursors. `txn-sub` itself is an ordinary subscription (the broker would expire it too;
  unsubscribing it is the broker's way to drop its store): here the operator protects it
  ([retention] protected_subscriptions = "txn-*"), which is that rule's end-to-end check.

Cost: the set-up and its ~32 s of waiting (after the orphan sweep's plan: see `repaired`), one snapshot, the step
and the repair.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulsar
import pytest
from pyspark.sql import SparkSession

from harness.testbed.admin import Admin, AdminError, topic_path
from harness.testbed.orphans import ml_path
from harness.testbed.workload import TENANT, admin_for, client_for, produce, topic, transactional_acknowledge
from harness.testbed.world import World, zk_for
from sweeper import config as config_mod
from sweeper.codecs import pulsar as codec
from sweeper.config import SweeperConfig
from sweeper.pipeline import retention_stage, snapshot_stage
from sweeper.retention.journal import DELETED, TRIMMED
from sweeper.retention.repair import run_repair
from sweeper.retention.repair_plan import NOT_NEEDED, SKIPPED_ACTIVE
from sweeper.tables import open_table_store
from tests.support.gates import record_gated_reconcile
from tests.support.real_pulsar import COST, GRACE_S, AsBuilt, Reconciled

pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(900)]

EXPIRING, SUBS = f"{TENANT}/retention-expiring", f"{TENANT}/retention-subs"
EXPIRED, WOKEN = topic("expired", EXPIRING), topic("woken", EXPIRING)
PINNED, VETOED, OWN_POLICY = topic("pinned", SUBS), topic("vetoed", SUBS), topic("own-policy", SUBS)
PROTECTED = topic("protected", SUBS)
PENDING_ACK_STORE = f"{PROTECTED}-txn-sub__transaction_pending_ack"  # SystemTopicNames.PENDING_ACK_STORE_SUFFIX
# A loaded topic is trimmed every check interval: untrimmed for 2 x 5 s + the margin means nobody runs its
# retention. The margin is the config's smallest (the default's 60 s would be most of this module's time).
UNTRIMMED_MARGIN_S = 5
UNTRIMMED_S = 2 * 5 + UNTRIMMED_MARGIN_S
IDLE_S = 30.0  # [retention] cursor_idle_days, as a fraction of a day


@dataclass
class Repaired:
    debt: dict[tuple[str, str | None], dict[str, Any]]  # (topic, cursor) -> retention_debt row
    actions: dict[tuple[str, str | None], dict[str, Any]]  # (topic, cursor) -> retention_actions row
    stats_before: dict[str, dict[int, int]]  # topic -> ledger id -> size, the broker's stats-internal
    listed_at_plan: dict[str, dict[int, int]]  # topic -> ledger id -> size, as ZooKeeper listed them at the plan
    admin: Admin


def retention_config(world: World, tables: Path) -> SweeperConfig:
    return config_mod.load(world.info.sweeper_config).replace(
        tables={"root": str(tables), "engine": "delta-rs"},
        safety={"min_age_hours": GRACE_S / 3600, "force_min_age": True, "max_orphan_fraction": 1.0},
        retention={"topic_policies": "admin", "cursor_idle_days": IDLE_S / 86400, "force_cursor_idle": True,
                   "untrimmed_margin_seconds": UNTRIMMED_MARGIN_S,
                   "report_idle_days": IDLE_S / 86400, "protected_subscriptions": "txn-*",
                   "allow": f"{EXPIRING},{SUBS}", "actions_per_second": 50.0})


def _ledger_sizes(admin: Admin, name: str) -> dict[int, int]:
    return {int(x["ledgerId"]): int(x["size"]) for x in admin.internal_stats(name)["ledgers"]}


def _listed(world: World, name: str) -> dict[int, int]:
    """The managed ledger's list as ZooKeeper holds it (reading it loads nothing)."""
    zk = zk_for(world.info)
    try:
        return {x.ledgerId: x.size for x in codec.decode_managed_ledger_info(zk.get(ml_path(name))[0]).ledgerInfo}
    finally:
        zk.stop()


def _subscriptions(admin: Admin, name: str) -> set[str]:
    return set(admin.stats(name)["subscriptions"])


def _prepare(admin: Admin, client: pulsar.Client, world: World) -> tuple[dict[str, dict[int, int]], float]:
    keep = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    for namespace in (EXPIRING, SUBS):
        admin.call("PUT", f"/admin/v2/namespaces/{namespace}", {"bundles": {"numBundles": 1}}, ok=(200, 204, 409))
        admin.namespace_policy(namespace, "retention", keep)
    for name, subscriptions in ((PINNED, ("idle", "active")), (VETOED, ("idle",))):
        admin.create_topic(name)
        for sub in subscriptions:
            admin.create_subscription(name, sub)
    admin.create_topic(PROTECTED)
    client.subscribe(PROTECTED, "geo", replicate_subscription_state_enabled=True).close()
    for name, count in ((EXPIRED, 45), (WOKEN, 25), (PINNED, 35), (VETOED, 25), (OWN_POLICY, 25), (PROTECTED, 12)):
        produce(client, name, count)
    zk = zk_for(world.info)
    try:  # the broker created the store and its cursor (what the repair must then leave alone)
        for attempt in range(1, 4):
            perf = transactional_acknowledge(world.info, PROTECTED, "txn-sub", 6)  # a few seconds: one small JVM
            # pulsar-perf may receive its messages and stop before its transaction is open (CI once printed "0
            # transaction open successfully", AckRate 0): nothing was acknowledged, so the next consumer on the
            # subscription gets the same messages again.
            never_opened = "--- 0 transaction open successfully" in perf
            deadline = time.monotonic() + 60  # seconds on a quiet machine; a loaded one (CI saw 20 s) takes longer
            while not zk.exists(f"{ml_path(PENDING_ACK_STORE)}/__pending_ack_state"):
                if never_opened or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            else:
                break
            assert attempt < 3, f"no pending-ack store after pulsar-perf consume -txn, 3 times: {perf[-2000:]}"
    finally:
        zk.stop()
    # `active` acknowledges everything. The unload below closes the cursors, which writes their positions to
    # ZooKeeper (ManagedCursorImpl persistPositionWhenClosing): exact there, no cursor ledger left to lag behind.
    consumer = client.subscribe(PINNED, "active")
    for _ in range(35):
        consumer.acknowledge(consumer.receive(30_000))
    consumer.close()
    time.sleep(1.5)  # managedLedgerCursorPositionFlushSeconds = 1
    # A topic-level retention of its own (stored in subs' __change_events): the namespace's is not what applies.
    admin.call("POST", f"/admin/v2/{topic_path(OWN_POLICY)}/retention", keep)
    deadline = time.monotonic() + 30
    while admin.call("GET", f"/admin/v2/{topic_path(OWN_POLICY)}/retention") is None:
        assert time.monotonic() < deadline, "the topic-level retention never showed"
        time.sleep(0.5)
    stats = {name: _ledger_sizes(admin, name) for name in (EXPIRED, PINNED)}
    for name in (EXPIRED, WOKEN, PINNED, VETOED, PROTECTED):
        admin.unload(name)  # the ledger closes, cursors close (the pending-ack store's too): their znodes are written
    unloaded_at = time.time()
    for namespace in (EXPIRING, SUBS):
        admin.namespace_policy(namespace, "retention", {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
    return stats, unloaded_at


# Not run in the testbed's background thread: its topics' first schema registrations make Pulsar 4.0.8 leak
# schema ledgers (real orphans the world's manifest does not know). `reconciled`, the orphan sweep's plan, is
# therefore taken before they exist, and `as_built` before these topics change the broker's metadata.
@pytest.fixture(scope="module")
def repaired(testbed_world: World, reconciled: Reconciled, as_built: AsBuilt, spark: SparkSession,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repaired]:
    started = time.monotonic()
    world = testbed_world
    admin = admin_for(world.info)
    client = client_for(world.info)
    cfg = retention_config(world, tmp_path_factory.mktemp("retention-tables"))
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    holders: list[Any] = []  # consumers kept connected through the repair
    try:
        stats, unloaded_at = _prepare(admin, client, world)
        # Untrimmed for longer than a loaded topic could be, and `idle` idle past cursor_idle_days (nothing may
        # touch the topics meanwhile).
        time.sleep(max(0.0, unloaded_at + max(UNTRIMMED_S, IDLE_S) + 1.5 - time.time()))
        # `active` is back: its consumer loads `pinned` (a load writes no cursor znode) and stays connected.
        holders.append(client.subscribe(PINNED, "active"))
        COST["retention_setup_s"] = time.monotonic() - started
        step = time.monotonic()
        run_id = snapshot_stage(spark, cfg, store).run_id
        # The repair acts only on a run whose gates passed (DESIGN.md invariant 19); the gates themselves are the
        # subject of the sweep tests, the repair against a real broker this one's.
        record_gated_reconcile(store, run_id, {}, None)
        listed = {name: _listed(world, name) for name in (EXPIRED, PINNED)}
        retention_stage(spark, cfg, store, run_id)
        COST["retention_plan_s"] = time.monotonic() - step
        debt = {(r["topic_name"], r["cursor"]): r.asDict()
                for r in store.read("retention_debt").where(f"run_id = '{run_id}'").collect()}
        # Between plan and act: `woken` gets a producer (a broker loads it), `vetoed/idle` a consumer.
        produce(client, WOKEN, 1)
        holders.append(client.subscribe(VETOED, "idle"))
        step = time.monotonic()
        result = run_repair(cfg, store, run_id, f"retention-{run_id}", execute=True)
        COST["retention_repair_s"] = time.monotonic() - step
        actions = {(r["topic_name"], r["cursor"]): r for r in result.rows}
        yield Repaired(debt, actions, stats, listed, admin)
    finally:
        for consumer in holders:
            consumer.close()
        client.close()
        # The topics stay: deleting them through the broker makes Pulsar 4.0.8 leave their schema ledgers behind
        # (orphans the world's manifest does not know, which test_sweep would then find). Nothing here is an orphan.
        COST["retention_total_s"] = time.monotonic() - started


def test_an_unloaded_topic_past_retention_is_found_with_the_brokers_bytes(repaired: Repaired) -> None:
    row = repaired.debt[(EXPIRED, None)]
    assert (row["status"], row["reason"], row["unloaded_evidence"], row["bundle_owned"]) == (
        "candidate", "expired_not_trimmed", "not_trimmed_since", True), row["detail"]
    listed = sorted(repaired.listed_at_plan[EXPIRED])
    assert len(listed) >= 5 and row["ledger_ids"] == listed[:-1]  # all but the one a load re-opens
    sizes = repaired.stats_before[EXPIRED]
    assert row["reclaimable_bytes"] == sum(sizes[ledger] for ledger in listed[:-1]) > 0
    assert (row["retention_minutes"], row["retention_size_mb"]) == (0, 0)


def test_the_repair_makes_the_broker_trim_exactly_the_planned_ledgers(repaired: Repaired) -> None:
    row, action = repaired.debt[(EXPIRED, None)], repaired.actions[(EXPIRED, None)]
    assert action["outcome"] == TRIMMED, action["detail"]
    # At least what was planned: with no retention the broker also takes the ledger the load re-opened.
    assert action["bytes_before"] - action["bytes_after"] >= row["reclaimable_bytes"] > 0
    remaining = set(_ledger_sizes(repaired.admin, EXPIRED))
    assert not remaining & set(row["ledger_ids"])


def test_a_topic_that_became_active_between_plan_and_act_is_skipped(repaired: Repaired) -> None:
    assert repaired.debt[(WOKEN, None)]["status"] == "candidate"
    action = repaired.actions[(WOKEN, None)]
    assert action["outcome"] == SKIPPED_ACTIVE and action["http_status"] is None, action["detail"]


def test_an_idle_subscription_is_deleted_and_the_active_one_next_to_it_untouched(repaired: Repaired) -> None:
    idle = repaired.debt[(PINNED, "idle")]
    assert idle["status"] == "candidate" and idle["idle_ms"] >= IDLE_S * 1000, idle["detail"]
    assert not idle["position_may_lag"] and idle["cursor_ledger_id"] == -1
    assert repaired.debt[(PINNED, None)]["topic_policy"] == "not_set"  # the broker was asked: owned bundle
    assert repaired.actions[(PINNED, "idle")]["outcome"] == DELETED
    # ZooKeeper alone cannot tell `active` from `idle` (both unchanged since the unload): the broker's live
    # stats can, right before the delete.
    active = repaired.actions[(PINNED, "active")]
    assert active["outcome"] == SKIPPED_ACTIVE and "consumer" in active["detail"], active["detail"]
    assert _subscriptions(repaired.admin, PINNED) == {"active"}
    # What `idle` alone pinned is gone: the broker trimmed it once the subscription was.
    trim = repaired.actions[(PINNED, None)]
    assert trim["outcome"] == TRIMMED, trim["detail"]
    # Its bytes: the broker's stats-internal sizes for the ledgers closed then; the one that was current (size
    # 0 there) was closed by the unload and re-opened by the load, so with no retention it goes too.
    listed, stats = repaired.listed_at_plan[PINNED], repaired.stats_before[PINNED]
    assert idle["ledger_ids"] and idle["reclaimable_bytes"] == sum(listed[x] for x in idle["ledger_ids"])
    assert all(stats[x] == listed[x] for x in idle["ledger_ids"] if stats.get(x))
    assert not set(_ledger_sizes(repaired.admin, PINNED)) & set(idle["ledger_ids"])


def test_a_subscription_with_a_consumer_at_act_time_is_skipped(repaired: Repaired) -> None:
    assert repaired.debt[(VETOED, "idle")]["status"] == "candidate"
    action = repaired.actions[(VETOED, "idle")]
    assert action["outcome"] == SKIPPED_ACTIVE and "consumer" in action["detail"], action["detail"]
    assert repaired.actions[(VETOED, None)]["outcome"] == NOT_NEEDED
    assert _subscriptions(repaired.admin, VETOED) == {"idle"}


def test_a_topic_level_policy_makes_the_topic_unknown_never_acted_on(repaired: Repaired) -> None:
    row = repaired.debt[(OWN_POLICY, None)]
    assert (row["status"], row["reason"], row["topic_policy"]) == ("unknown", "topic_policy_set", "set"), row
    assert row["reclaimable_bytes"] == 0 and not row["ledger_ids"]
    assert not [key for key in repaired.actions if key[0] == OWN_POLICY]


def test_a_replicated_subscription_and_a_pending_ack_store_survive_the_repair(repaired: Repaired) -> None:
    """Issue 26, item 1, on the real broker: with every subscription opted in, what Pulsar protects is `protected`
    with its reason, nothing is planned for it, and the broker still has both cursors after the repair."""
    debt = repaired.debt
    geo = debt[(PROTECTED, "geo")]
    assert (geo["status"], geo["reason"]) == ("protected", "replicated_subscription"), geo["detail"]
    assert geo["idle_ms"] >= IDLE_S * 1000  # idle enough to be a candidate, were it not protected
    store, cursor = debt[(PENDING_ACK_STORE, None)], debt[(PENDING_ACK_STORE, "__pending_ack_state")]
    assert (store["status"], store["reason"], store["system_topic"]) == (
        "protected", "transaction_pending_ack_store", True), store["detail"]
    assert (cursor["status"], cursor["reason"]) == ("protected", "transaction_pending_ack_cursor"), cursor["detail"]
    txn_sub = debt[(PROTECTED, "txn-sub")]
    assert (txn_sub["status"], txn_sub["reason"]) == ("protected", "operator_protected_subscription")
    assert not [key for key in repaired.actions if key in (
        (PROTECTED, "geo"), (PROTECTED, "txn-sub")) or key[0] == PENDING_ACK_STORE]
    cursors = repaired.admin.internal_stats(PROTECTED)["cursors"]
    assert {"geo", "txn-sub"} <= set(cursors)
    assert cursors["geo"]["properties"].get("pulsar.replicated.subscription") == 1
    assert repaired.admin.stats(PROTECTED)["subscriptions"]["geo"]["isReplicated"] is True
    # Reading the stats loaded the topic; its subscription's pending-ack handle replays the store asynchronously
    # and the broker answers 503 until it has.
    deadline = time.monotonic() + 60
    while True:
        try:
            pending = repaired.admin.pending_ack_internal_stats(PROTECTED, "txn-sub")["pendingAckLogStats"]
            break
        except AdminError as exc:
            assert exc.status == 503 and time.monotonic() < deadline, exc
            time.sleep(1.0)
    assert "/" + pending["managedLedgerName"] == ml_path(PENDING_ACK_STORE).removeprefix("/managed-ledgers")
    assert "__pending_ack_state" in pending["managedLedgerInternalStats"]["cursors"]
