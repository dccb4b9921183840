"""Repairing retention debt through the broker's admin REST API only, two-phase like deletes.

Phase 1 is the `retention_debt` plan (sweeper.retention.debt); this is phase 2. Dry run by default
(`sweeper retention`: what would be done, after the same re-checks); `--execute` on the command line
(never a config switch) acts:
- an idle subscription (`candidate` cursor rows: idle past `[retention] cursor_idle_days`, in scope,
  no system cursor) is deleted with `DELETE .../subscription/{sub}` (no `force`: the broker itself
  refuses while consumers are connected);
- a topic holding expired ledgers nobody trims (`candidate` topic rows), or one whose idle
  subscription was just deleted, is trimmed with `POST .../trim` (Pulsar 2.11+; the lookup behind it
  loads the topic, and the broker applies its own retention rules, `ManagedLedgerImpl.internalTrimLedgers`);
  a broker without that endpoint gets `GET .../internalStats`, which loads the topic so that its next
  retention check (`BrokerService.checkConsumedLedgers`) trims it.
Metadata is never written (the one znode the repair creates is its run lock, beside the delete's). Before
each action the planned znode is read again (read-only): a managed ledger or cursor written since the plan (a
load, a rollover, an acknowledgement) became active and is skipped; a subscription is also checked against the
broker's live stats (connected consumers, recent acknowledgements or reads) right before it is deleted. Calls
are paced (`actions_per_second`), capped per run (`max_actions_per_run`), and every outcome lands in
`retention_actions` as it happens.

With `--execute` an intent is committed to `repair_journal` before every admin call (sweeper.retention.journal), under
a run lock, and the run first folds in every repair a kill left unclosed: what the broker did for it is recorded
as that run's, never this one's (DESIGN.md invariants 17, 18).

A plan is a request, not a verdict (DESIGN.md invariants 14-17): `--execute` refuses a plan older than
`[retention] plan_max_age_hours`, and each action is judged again under today's config and metadata (scope,
the namespace's replication clusters, protection, the cursor's mark-delete position) before anything is
called. Admin calls, and the redirects they receive, stay with this cluster's registered brokers
(sweeper.broker.system_topic.redirect_target).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kazoo.exceptions import NoNodeError
from pyspark.sql import functions as F

from sweeper import names, runs
from sweeper.broker.liveness import registered_web_origins
from sweeper.broker.system_topic import AdminClient, RedirectRefused, SystemTopicError
from sweeper.codecs import pulsar as codec
from sweeper.codecs.errors import MetadataDecodeError
from sweeper.config import SweeperConfig
from sweeper.connections import Connections
from sweeper.errors import Refused
from sweeper.ratelimit import TokenBucket
from sweeper.retention.journal import (
    DELETE_CALL,
    DELETE_SUBSCRIPTION,
    DELETED,
    LOAD_CALL,
    LOAD_TOPIC,
    LOADED,
    STATS_CALL,
    TRIM_CALL,
    TRIMMED,
    RepairJournal,
    RepairLock,
    RepairLockHeld,
    Resolution,
    resolve_interrupted,
)
from sweeper.rules.protection import Protection, cursor_protection, describe, managed_ledger_protection
from sweeper.rules.safety import Scope, retention_scope
from sweeper.table_schemas import RETENTION_ACTIONS
from sweeper.tables import TableStore
from sweeper.vocabulary import DAY_MS
from sweeper.zk import client as zkutil
from sweeper.zk.errors import is_connection_error

WOULD_LOAD, WOULD_DELETE = "would_load", "would_delete"
SKIPPED_ACTIVE, SKIPPED_GONE, DEFERRED, FAILED = "skipped_active", "skipped_gone", "deferred", "failed"
NOT_NEEDED = "not_needed"
# A rule of today's config or metadata says no; the detail starts with the rule's name (out_of_scope,
# not_replicated_here, protected, plan_mismatch, cursor_moved, redirect_outside_cluster).
SKIPPED = "skipped"
# Rows are written in batches this size at most; with --execute also after every action that called the
# broker, so a killed repair leaves a row for every call it made (and an intent, in repair_journal, before it).
FLUSH_ROWS = 500
# Beside [delete] lock_path (whose parent the sweeper may already write): one repair with --execute at a time, so
# that a run the journal shows unclosed is one that stopped.
LOCK_NAME = "retention_repair"


class RetentionRepairRefused(Refused):
    """The repair will not start (no plan, no broker to talk to) or had to stop (the broker refused us)."""


@dataclass
class PlannedAction:
    action: str
    tenant: str | None
    namespace: str | None
    topic_name: str
    managed_ledger: str
    cursor: str | None = None
    planned_bytes: int = 0
    zk_version: int | None = None  # of the managed-ledger (load) or cursor (delete) znode when planned
    check_version: bool = True  # false for the trim right after deleting a subscription (we loaded the topic)
    mark_delete: tuple[int, int] | None = None  # the cursor's mark-delete position when planned
    trimmable: tuple[int, ...] = ()  # the ledgers the plan expects the broker to trim (or a cursor to free)

    def journal_fields(self) -> dict[str, Any]:
        return {"action": self.action, "tenant": self.tenant, "namespace": self.namespace,
                "topic_name": self.topic_name, "managed_ledger": self.managed_ledger, "cursor": self.cursor,
                "planned_bytes": self.planned_bytes}


@dataclass(frozen=True)
class RepairCounts(runs.StageCounts):
    """The planned actions by outcome (one row each in `retention_actions`)."""

    would_load: int = 0
    would_delete: int = 0
    trimmed: int = 0
    loaded: int = 0
    deleted: int = 0
    not_needed: int = 0
    skipped: int = 0
    skipped_active: int = 0
    skipped_gone: int = 0
    deferred: int = 0
    failed: int = 0
    unknown: int = 0  # a killed run's call whose effect the metadata cannot show (recorded by the fold-in)
    interrupted: int = 0  # a killed run's call that did not take effect
    execute: int = 0
    recovered_from_journal: int = 0  # a killed run's rows the fold-in made from its intents
    interrupted_runs: int = 0  # killed runs this run folded in
    done_by_interrupted_runs: int = 0  # plan actions this run left out: a killed run did them (or may have)


@dataclass
class RepairResult:
    run_id: str
    plan_run_id: str
    execute: bool
    rows: list[dict[str, Any]] = field(default_factory=list)
    counts: RepairCounts = field(default_factory=RepairCounts)
    duration_s: float = 0.0
    stopped: str | None = None  # why the run stopped early (the broker unreachable or refusing us)
    pending: list[dict[str, Any]] = field(default_factory=list)  # rows not yet written to retention_actions


def _mark_delete(row: dict[str, Any]) -> tuple[int, int] | None:
    ledger, entry = row.get("mark_delete_ledger_id"), row.get("mark_delete_entry_id")
    return None if ledger is None or entry is None else (int(ledger), int(entry))


def _ledger_ids(*rows: dict[str, Any]) -> tuple[int, ...]:
    return tuple(sorted({int(x) for r in rows for x in (r.get("ledger_ids") or ())}))


def plan_actions(rows: Iterable[dict[str, Any]]) -> list[PlannedAction]:
    """Per topic: its candidate subscriptions first, then one trim (for a candidate topic, or to free what the
    deleted subscriptions pinned). Largest planned bytes first, so a cap keeps the most valuable work."""
    topics: dict[str, dict[str, Any]] = {}
    subs: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["status"] != "candidate":
            continue
        if r["kind"] == "topic":
            topics[r["managed_ledger"]] = r
        elif r["kind"] == "cursor":
            subs.setdefault(r["managed_ledger"], []).append(r)
    plans: list[tuple[int, list[PlannedAction]]] = []
    for ml in sorted(set(topics) | set(subs)):
        actions = []
        for c in sorted(subs.get(ml, []), key=lambda r: r["cursor"]):
            actions.append(PlannedAction(DELETE_SUBSCRIPTION, c["tenant"], c["namespace"], c["topic_name"], ml,
                                         c["cursor"], c["reclaimable_bytes"] or 0, c["zk_version"],
                                         mark_delete=_mark_delete(c), trimmable=_ledger_ids(c)))
        topic = topics.get(ml)
        if topic is not None:
            actions.append(PlannedAction(LOAD_TOPIC, topic["tenant"], topic["namespace"], topic["topic_name"], ml,
                                         None, topic["reclaimable_bytes"] or 0, topic["zk_version"],
                                         check_version=not actions,
                                         trimmable=_ledger_ids(topic, *subs.get(ml, []))))
        elif actions:
            first = actions[0]
            actions.append(PlannedAction(LOAD_TOPIC, first.tenant, first.namespace, first.topic_name, ml, None,
                                         sum(a.planned_bytes for a in actions), None, check_version=False,
                                         trimmable=_ledger_ids(*subs[ml])))
        plans.append((sum(a.planned_bytes for a in actions), actions))
    plans.sort(key=lambda p: -p[0])
    return [a for _, group in plans for a in group]


def subscription_activity(stats: dict[str, Any], subscription: str, since_ms: int) -> str | None:
    """Why the broker's live stats say a subscription is in use, or None when they show it idle.

    Timestamps are the broker's in-memory ones (0 after the topic loaded: no activity since), so they can
    only show activity, never prove idleness: the idleness itself comes from ZooKeeper.
    """
    sub = (stats.get("subscriptions") or {}).get(subscription)
    if sub is None:
        return "gone"
    consumers = sub.get("consumers") or []
    if consumers:
        return f"{len(consumers)} consumer(s) connected"
    for key in ("lastAckedTimestamp", "lastConsumedTimestamp", "lastConsumedFlowTimestamp",
                "lastMarkDeleteAdvancedTimestamp"):
        value = sub.get(key) or 0
        if isinstance(value, int | float) and value > since_ms:
            return f"{key} {int(value)} is after {since_ms}"
    return None


# ---- the rules a planned action must pass again under today's config: pure, over plain values ----------


@dataclass(frozen=True)
class TodaysRules:
    """What the repair re-applies to every action, from the config it runs with (not the plan's)."""

    scope: Scope
    protection: Protection
    cluster_name: str

    @classmethod
    def from_config(cls, config: SweeperConfig) -> TodaysRules:
        # The plan's own scope function, so the repair cannot drift from what retention_debt would decide today.
        scope = retention_scope(config.retention.allow, config.retention.deny, config.safety.allow,
                                config.safety.deny)
        return cls(scope, Protection.of(config.retention.protected_subscriptions, config.retention.protected_topics),
                   config.pulsar.cluster_name.strip())


@dataclass(frozen=True)
class RepairSettings:
    """What the repair reads of the config, narrowed once (as every stage's `XSettings.from_config`)."""

    plan_run_id: str
    execute: bool
    tables_root: str
    connections: Connections
    policies_root: str
    managed_ledgers_root: str
    brokers_path: str
    plan_max_age_hours: float
    actions_per_second: float
    cursor_idle_days: float
    max_actions_per_run: int
    delete_lock_path: str
    rules: TodaysRules
    config_hash: str
    session_timeout_s: float = 15.0  # a killed repair's lock is waited for this long (its session expiring)
    recorded_in_runs: bool = False  # under the stage wrapper: its journal says a `runs` row follows its close

    def hash(self) -> str:
        return self.config_hash

    @classmethod
    def from_config(cls, config: SweeperConfig, plan_run_id: str, execute: bool = False,
                    recorded_in_runs: bool = False) -> RepairSettings:
        r = config.retention
        return cls(plan_run_id, execute, config.tables.root, Connections.from_config(config),
                   config.pulsar.policies_root, config.pulsar.managed_ledgers_root, config.pulsar.brokers_path,
                   r.plan_max_age_hours, r.actions_per_second, r.cursor_idle_days, r.max_actions_per_run,
                   config.delete.lock_path, TodaysRules.from_config(config), config.hash(),
                   config.bookkeeper.session_timeout_s, recorded_in_runs)


def plan_age_refusal(plan_run_id: str, planned_at_s: float | None, now_s: float, max_age_hours: float) -> str | None:
    """Why a plan is too old to act on, or None. Its facts (idle, unloaded, in scope) were true when read; the
    older they are the less they say, and the operator's config may have changed since."""
    if planned_at_s is None:
        return (f"plan {plan_run_id}: neither a runs row nor retention_debt rows say when it was made, so its age "
                "cannot be checked: plan again (`sweeper sweep`)")
    age_h = (now_s - planned_at_s) / 3600
    if age_h > max_age_hours:
        return (f"plan {plan_run_id} is {age_h:.1f} h old, above [retention] plan_max_age_hours = {max_age_hours:g}: "
                "its facts are stale; plan again (`sweeper sweep`) and repair from the new plan")
    return None


def _protected(reason: Any, what: str) -> str:
    return f"protected: {reason.value} {what}, {describe(reason)}"


def plan_refusal(action: PlannedAction, rules: TodaysRules) -> str | None:
    """What today's rules say of an action from its names alone, or None when they let it through.

    The call goes to the plan's topic name and the re-checks read its managed ledger: both must name the same
    topic, or a plan (from anywhere) could have one checked and the other acted on."""
    parts = names.parse_managed_ledger(action.managed_ledger)
    if parts is None or parts.topic_name != action.topic_name:
        return (f"plan_mismatch: the plan's topic {action.topic_name!r} is not its managed ledger "
                f"{action.managed_ledger!r}")
    if not rules.scope.permits(parts.tenant, parts.namespace):
        return (f"out_of_scope: {parts.tenant}/{parts.namespace} is outside today's [retention] / [safety] "
                "allow and deny")
    # By name only here: the cursor's properties are read (cursor_refusal) and the broker asked (stats_refusal)
    # further on, with the same rule functions.
    reason = managed_ledger_protection(action.managed_ledger, action.cursor, None, rules.protection)
    if reason is not None:
        what = f"subscription {action.cursor!r} of {action.topic_name}" if action.cursor else action.topic_name
        return _protected(reason, what)
    return None


def replication_refusal(namespace: str, clusters: list[str] | None, cluster_name: str, problem: str = "") -> str | None:
    """Whether this cluster serves a namespace, from its policies' `replication_clusters`
    (org.apache.pulsar.common.policies.data.Policies; empty: local to the cluster that holds it). A namespace
    replicated only elsewhere belongs to its clusters' brokers, and its admin calls would be redirected there."""
    if clusters is None:
        return f"not_replicated_here: {namespace}: {problem or 'no namespace policies'}; cannot tell that it is ours"
    if not clusters:
        return None
    if not cluster_name:
        return (f"not_replicated_here: {namespace} is replicated to {sorted(clusters)} and [pulsar] cluster_name is "
                "not set: cannot tell whether this cluster is one of them")
    if cluster_name in clusters:
        return None
    return (f"not_replicated_here: {namespace}'s replication_clusters {sorted(clusters)} leave out this cluster "
            f"({cluster_name!r})")


def cursor_refusal(action: PlannedAction, long_properties: dict[str, int], mark_delete: tuple[int, int],
                   rules: TodaysRules) -> str | None:
    """Today's cursor znode against the plan: protected (a replicated subscription shows only in its properties),
    or no longer at the mark-delete position the plan judged idle."""
    reason = cursor_protection(action.cursor, long_properties, rules.protection)
    if reason is not None:
        return _protected(reason, f"subscription {action.cursor!r}")
    if action.mark_delete is None:
        return "cursor_moved: the plan records no mark-delete position, so the cursor cannot be shown unmoved"
    if mark_delete != action.mark_delete:
        return (f"cursor_moved: mark-delete {mark_delete[0]}:{mark_delete[1]}, planned at "
                f"{action.mark_delete[0]}:{action.mark_delete[1]}")
    return None


def stats_refusal(stats: dict[str, Any], subscription: str, rules: TodaysRules) -> str | None:
    """The broker's own word right before a delete: `isReplicated` in its subscription stats
    (`SubscriptionStatsImpl.isReplicated`, from `PersistentSubscription.isReplicated()`)."""
    sub = (stats.get("subscriptions") or {}).get(subscription) or {}
    reason = cursor_protection(subscription, None, rules.protection, replicated=bool(sub.get("isReplicated")))
    return _protected(reason, f"subscription {subscription!r} (broker stats)") if reason is not None else None


# ---- I/O: ZooKeeper reads, the table, the loop ----------------------------------------------------------


class NamespacePolicies:
    """Each namespace's `replication_clusters`, read once per run from the configuration store's
    <policies_root>/<tenant>/<namespace> (the Policies JSON Pulsar keeps there)."""

    def __init__(self, client: Any, root: str) -> None:
        self.client, self.root = client, root
        self.cache: dict[str, tuple[list[str] | None, str]] = {}

    def replication_clusters(self, namespace: str) -> tuple[list[str] | None, str]:
        if namespace not in self.cache:
            path = zkutil.join(self.root, namespace)
            found = _read(self.client, path)
            if found is None:
                self.cache[namespace] = None, f"no namespace policies at {path}"
            else:
                try:
                    clusters = json.loads(found[0] or b"{}").get("replication_clusters") or []
                    if not isinstance(clusters, list) or not all(isinstance(c, str) for c in clusters):
                        raise ValueError(f"replication_clusters is {clusters!r}")
                    self.cache[namespace] = clusters, ""
                except (ValueError, AttributeError) as exc:
                    self.cache[namespace] = None, f"its policies at {path} cannot be read ({exc})"
        return self.cache[namespace]

    def refusal(self, action: PlannedAction, cluster_name: str) -> str | None:
        parts = names.parse_managed_ledger(action.managed_ledger)
        if parts is None:
            return None  # plan_refusal has already said why
        namespace = f"{parts.tenant}/{parts.namespace}"
        clusters, problem = self.replication_clusters(namespace)
        return replication_refusal(namespace, clusters, cluster_name, problem)


def _planned_at(store: TableStore, plan_run_id: str) -> float | None:
    """When the plan's facts were read (epoch seconds): the earliest of its runs rows' start (the snapshot the
    plan came from) and its retention_debt rows' captured_at. Cast in Spark, so no time zone is involved."""
    found = []
    started = runs.started_at(store, plan_run_id)
    if started is not None:
        found.append(started.timestamp() if started.tzinfo else started.replace(tzinfo=UTC).timestamp())
    if store.exists("retention_debt"):
        value = (store.read("retention_debt", where={"run_id": plan_run_id})
                 .agg(F.min(F.col("captured_at").cast("double")).alias("t")).collect()[0]["t"])
        if value is not None:
            found.append(float(value))
    return min(found) if found else None


def _flush(store: TableStore, result: RepairResult) -> None:
    if result.pending:
        store.append_rows("retention_actions", result.pending, RETENTION_ACTIONS,
                          commit_metadata={"run_id": result.run_id, "stage": "retention_repair"})
        result.pending = []


def run_repair(config: SweeperConfig, store: TableStore, plan_run_id: str, run_id: str, execute: bool = False,
               admin: AdminClient | None = None, zk_client: Any = None) -> RepairResult:
    """The repair of one plan from a whole config (the CLI, notebooks, tests): `run` with its settings."""
    return run(None, store, run_id, RepairSettings.from_config(config, plan_run_id, execute), admin=admin,
               zk_client=zk_client)


def run(spark: Any, store: TableStore, run_id: str, settings: RepairSettings, admin: AdminClient | None = None,
        zk_client: Any = None) -> RepairResult:
    """The retention repair of `settings.plan_run_id` under `run_id` (no Spark of its own: `spark` is unused, the
    plan is read through the store). `admin` and `zk_client` replace the clients the settings would open."""
    plan_run_id, execute = settings.plan_run_id, settings.execute
    started = time.monotonic()
    result = RepairResult(run_id, plan_run_id, execute)
    journal: RepairJournal | None = None
    lock: RepairLock | None = None
    own_client = zk_client is None
    client: Any = None
    lock_client: Any = None
    store_client: Any = None
    try:
        if not store.exists("retention_debt"):
            raise RetentionRepairRefused(f"no retention_debt table in {settings.tables_root}: run `sweeper sweep` "
                                         "first")
        if execute:
            # DESIGN.md invariant 19: a plan made from a snapshot the gates never passed (`reconcile --skip-gates`,
            # or a refused or missing reconcile) is for reading only, as for emit and delete.
            runs.require_gated(store, plan_run_id, RetentionRepairRefused)
            refusal = plan_age_refusal(plan_run_id, _planned_at(store, plan_run_id), time.time(),
                                       settings.plan_max_age_hours)
            if refusal:
                raise RetentionRepairRefused(refusal)
        rows = [r.asDict() for r in store.read("retention_debt", where={"run_id": plan_run_id}).collect()]
        plan = plan_actions(rows)
        connections = settings.connections
        if execute and admin is None:
            if not connections.system_topic.admin_url:
                raise RetentionRepairRefused("[system_topic] admin_url is not set: the repair acts only through the "
                                             "broker's admin REST API")
            admin = connections.admin()
        rules = settings.rules
        client = zk_client or connections.pulsar.connect()
        store_client = (connections.configuration_store.connect()
                        if connections.configuration_store is not None and plan else client)
        policies = NamespacePolicies(store_client, settings.policies_root)
        pacer = TokenBucket(settings.actions_per_second)
        idle_cutoff_ms = int(time.time() * 1000) - int(settings.cursor_idle_days * DAY_MS)
        deleted_on: set[str] = set()
        if execute:
            # The lock lives with the delete's, in the BookKeeper store the sweeper already writes to.
            same = connections.bookkeeper.hosts == connections.pulsar.hosts
            lock_client = client if same else connections.bookkeeper.connect()
            lock = _acquire_lock(lock_client, settings.delete_lock_path, run_id, settings.session_timeout_s + 2.0)
            # Under the lock, a run the journal shows unclosed has stopped: what the broker did for it is recorded
            # as its own before this run could take those actions for its own.
            found = resolve_interrupted(store, lambda path: _read(client, path), run_id, RepairCounts.from_row)
            before = len(plan)
            plan = [a for a in plan if (a.action, a.managed_ledger, a.cursor) not in found.done]
            deleted_on |= found.trim_owed
            result.counts = _folded_counts(found, before - len(plan))
            journal = RepairJournal(store, run_id, plan_run_id, settings.recorded_in_runs)
        if admin is not None:
            # Once per run: the brokers registered now are the hosts a redirect may lead to.
            admin.allow_brokers(registered_web_origins(client, settings.brokers_path))
        for index, action in enumerate(plan):
            if result.stopped or index >= settings.max_actions_per_run:
                cap = settings.max_actions_per_run
                why = result.stopped or f"beyond [retention] max_actions_per_run = {cap}: next run"
                _record(result, action, DEFERRED, why)
            else:
                intend = _Intents(journal, index, action, lock)
                try:
                    _act(action, result, client, admin, pacer, settings.managed_ledgers_root, idle_cutoff_ms,
                         deleted_on, rules, policies, intend)
                except RedirectRefused as exc:
                    _record(result, action, SKIPPED, str(exc))
                except SystemTopicError as exc:
                    result.stopped = f"stopped: {exc}"
                    _record(result, action, FAILED, str(exc))
                if execute:
                    # Before the next call to the broker: this action's row, whatever it did, is on disk.
                    _flush(store, result)
            if len(result.pending) >= FLUSH_ROWS:
                _flush(store, result)
        _flush(store, result)
        if journal is not None:
            if lock is not None:
                lock.check()  # a repair that lost its lock leaves its end to the next holder's fold: one status
            journal.close(result.stopped or "")
    except Exception as exc:
        if lock is not None and is_connection_error(exc):
            # A session that expired under the repair (a pause, a partition) took its lock with it: that, not the
            # read that met it, is why the run stops (LockLost, exit 3); else the error as it was.
            lock.check()
        raise
    except KeyboardInterrupt:
        if journal is not None:
            # Ctrl-C / SIGTERM: the call in flight settled from the metadata now, as the next run would after a kill,
            # and the journal closed; the stage wrapper then records the run `interrupted`.
            with contextlib.suppress(Exception):  # the interrupt is what the operator must see
                _flush(store, result)
                _fold_own(store, result, journal, client)
        raise
    finally:
        if lock is not None:
            lock.release()
        if lock_client is not None and lock_client is not client:
            zkutil.close(lock_client)
        if store_client is not None and store_client is not client:
            zkutil.close(store_client)
        if own_client and client is not None:
            zkutil.close(client)
        _flush(store, result)
    outcomes = Counter(row["outcome"] for row in result.rows)
    result.counts = RepairCounts.from_row({**result.counts.as_row(), **outcomes, "execute": int(execute)})
    result.duration_s = time.monotonic() - started
    return result


def _acquire_lock(client: Any, delete_lock_path: str, run_id: str, wait_for_dead_holder_s: float) -> RepairLock:
    lock = RepairLock(client, f"{delete_lock_path.rsplit('/', 1)[0]}/{LOCK_NAME}", run_id, wait_for_dead_holder_s)
    try:
        lock.acquire()
    except RepairLockHeld as exc:
        raise RetentionRepairRefused(str(exc)) from None
    return lock


def _folded_counts(found: Resolution, left_out: int) -> RepairCounts:
    return RepairCounts(interrupted_runs=len(found.run_ids), done_by_interrupted_runs=left_out)


def _fold_own(store: TableStore, result: RepairResult, journal: RepairJournal, client: Any) -> None:
    if journal.written and client is not None:
        resolve_interrupted(store, lambda path: _read(client, path), result.run_id, RepairCounts.from_row,
                            only=[result.run_id], record_runs=False)
    else:
        journal.close("interrupted before any admin call")


class _Intents:
    """The intents of one action: `intend(call, **facts)` commits one before each admin call (no-op on a dry run,
    which calls nothing), then shows that the run still holds its lock (DESIGN.md invariant 22): a repair whose
    session expired, or whose lock another repair took, makes no more calls (LockLost, exit 3). The window left is
    that read's round trip and the call itself (sweeper.run_lock)."""

    def __init__(self, journal: RepairJournal | None, seq: int, action: PlannedAction,
                 lock: RepairLock | None = None) -> None:
        self.journal, self.seq, self.action, self.lock = journal, seq, action, lock

    def __call__(self, call: str, **facts: Any) -> None:
        if self.journal is not None:
            self.journal.intent(self.seq, call, self.action.journal_fields(), **facts)
        if self.lock is not None:
            self.lock.check()


def _record(result: RepairResult, action: PlannedAction, outcome: str, detail: str, http_status: int | None = None,
            before: int | None = None, after: int | None = None) -> None:
    row = {
        "run_id": result.run_id, "plan_run_id": result.plan_run_id, "finished_at": datetime.now(UTC),
        "action": action.action, "tenant": action.tenant, "namespace": action.namespace,
        "topic_name": action.topic_name, "managed_ledger": action.managed_ledger, "cursor": action.cursor,
        "outcome": outcome, "detail": detail[:2000], "http_status": http_status, "planned_bytes": action.planned_bytes,
        "bytes_before": before, "bytes_after": after, "dry_run": not result.execute,
    }
    result.rows.append(row)
    result.pending.append(row)


def _read(client: Any, path: str) -> tuple[bytes, Any] | None:
    try:
        return client.get(path)
    except NoNodeError:
        return None


def _listed_bytes(data: bytes) -> int | None:
    try:
        return sum(x.size for x in codec.decode_managed_ledger_info(data).ledgerInfo)
    except MetadataDecodeError:
        return None


def _listed_ids(data: bytes) -> list[int]:
    try:
        return [x.ledgerId for x in codec.decode_managed_ledger_info(data).ledgerInfo]
    except MetadataDecodeError:
        return []


def _reason(body: bytes) -> str:
    """Pulsar's error body is {"reason": ...}; a missing endpoint answers with something else."""
    try:
        reason = json.loads(body or b"{}").get("reason")
    except (ValueError, AttributeError):
        return ""
    return reason if isinstance(reason, str) else ""


def _act(action: PlannedAction, result: RepairResult, client: Any, admin: AdminClient | None, pacer: TokenBucket,
         managed_ledgers_root: str, idle_cutoff_ms: int, deleted_on: set[str], rules: TodaysRules,
         policies: NamespacePolicies, intend: Callable[..., None] = lambda call, **facts: None) -> None:
    """One planned action: re-checked, then (with --execute) its admin calls, each after its intent is on disk."""
    refusal = plan_refusal(action, rules) or policies.refusal(action, rules.cluster_name)
    if refusal:
        _record(result, action, SKIPPED, refusal)
        return
    ml_path = zkutil.join(managed_ledgers_root, action.managed_ledger)
    if action.action == DELETE_SUBSCRIPTION:
        assert action.cursor is not None
        cursor_path = zkutil.join(ml_path, names.encode_local_name(action.cursor))
        found = _read(client, cursor_path)
        if found is None:
            _record(result, action, SKIPPED_GONE, "the cursor's znode is gone")
            return
        try:
            info = codec.decode_managed_cursor_info(found[0])
        except MetadataDecodeError as exc:
            _record(result, action, SKIPPED, f"unreadable: the cursor's znode cannot be decoded ({exc})")
            return
        refusal = cursor_refusal(action, {p.name: p.value for p in info.properties},
                                 (info.markDeleteLedgerId, info.markDeleteEntryId), rules)
        if refusal:
            _record(result, action, SKIPPED, refusal)
            return
        if found[1].version != action.zk_version:
            _record(result, action, SKIPPED_ACTIVE, f"the cursor's znode was written since the plan (version "
                                                    f"{action.zk_version} -> {found[1].version}): it became active")
            return
        if not result.execute:
            _record(result, action, WOULD_DELETE, "idle and unchanged since the plan; --execute deletes it")
            return
        assert admin is not None
        pacer.acquire(1)
        intend(STATS_CALL)
        status, body = admin.stats(action.topic_name)
        if status != 200:
            _record(result, action, FAILED, f"reading the topic's stats answered HTTP {status}: {body[:200]!r}", status)
            return
        stats = json.loads(body or b"{}")
        refusal = stats_refusal(stats, action.cursor, rules)
        if refusal:
            _record(result, action, SKIPPED, refusal, status)
            return
        activity = subscription_activity(stats, action.cursor, idle_cutoff_ms)
        if activity == "gone":
            _record(result, action, SKIPPED_GONE, "the broker has no such subscription", status)
            return
        if activity is not None:
            _record(result, action, SKIPPED_ACTIVE, f"the broker shows it in use: {activity}", status)
            return
        pacer.acquire(1)
        intend(DELETE_CALL, zk_path=cursor_path, zk_version=found[1].version, zk_ctime_ms=found[1].ctime)
        status, body = admin.delete_subscription(action.topic_name, action.cursor)
        if status in (200, 204):
            deleted_on.add(action.managed_ledger)
            _record(result, action, DELETED, "subscription deleted through the admin API", status)
        elif status == 404:
            _record(result, action, SKIPPED_GONE, "the broker has no such subscription", status)
        elif status == 412:
            _record(result, action, SKIPPED_ACTIVE, f"the broker refused: {body[:200]!r}", status)
        else:
            _record(result, action, FAILED, f"HTTP {status}: {body[:200]!r}", status)
        return
    found = _read(client, ml_path)
    if found is None:
        _record(result, action, SKIPPED_GONE, "the managed ledger is gone")
        return
    before = _listed_bytes(found[0])
    if action.check_version and found[1].version != action.zk_version:
        _record(result, action, SKIPPED_ACTIVE, f"its managed ledger was written since the plan (version "
                                                f"{action.zk_version} -> {found[1].version}): a broker has it", None,
                before)
        return
    if not action.check_version and action.managed_ledger not in deleted_on and result.execute:
        _record(result, action, NOT_NEEDED, "no subscription was deleted: nothing new to trim", None, before)
        return
    if not result.execute:
        _record(result, action, WOULD_LOAD, "unchanged since the plan; --execute loads and trims it", None, before)
        return
    assert admin is not None
    # What shows, after a kill, whether the call took effect (sweeper.retention.journal.settle): a load writes the
    # managed ledger, a trim drops ledgers from its list.
    facts = {"zk_path": ml_path, "zk_version": found[1].version, "zk_ctime_ms": found[1].ctime,
             "topic_unloaded": action.check_version, "listed_ledger_ids": _listed_ids(found[0]),
             "trimmable_ledger_ids": list(action.trimmable), "bytes_before": before}
    pacer.acquire(1)
    intend(TRIM_CALL, **facts)
    status, body = admin.trim(action.topic_name)
    outcome, detail = TRIMMED, "trimmed by the broker under its own retention rules"
    reason = _reason(body)
    if status == 404 and "not found" in reason.lower() and "topic" in reason.lower():
        _record(result, action, SKIPPED_GONE, f"the broker: {reason}", status, before)
        return
    if status in (404, 405):
        pacer.acquire(1)
        intend(LOAD_CALL, **facts)
        status, body = admin.internal_stats(action.topic_name)  # no trim endpoint (Pulsar < 2.11): load it
        outcome, detail = LOADED, "loaded: its broker's next retention check trims it"
    if status not in (200, 204):
        _record(result, action, FAILED, f"HTTP {status}: {body[:200]!r}", status, before)
        return
    after = _read(client, ml_path)
    _record(result, action, outcome, detail, status, before, _listed_bytes(after[0]) if after else None)
