"""The retention repair's plan and outcomes (sweeper.retention.repair runs it): the actions planned from a
`retention_debt` run, the outcome words, the counts and result, the settings, and the rules every planned action
must pass again under today's config (pure, over plain values)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sweeper import names, runs
from sweeper.config import SweeperConfig
from sweeper.connections import Connections
from sweeper.retention.journal import DELETE_SUBSCRIPTION, LOAD_TOPIC
from sweeper.rules.protection import Protection, cursor_protection, describe, managed_ledger_protection
from sweeper.rules.safety import Scope, retention_scope

WOULD_LOAD, WOULD_DELETE = "would_load", "would_delete"
SKIPPED_ACTIVE, SKIPPED_GONE, DEFERRED, FAILED = "skipped_active", "skipped_gone", "deferred", "failed"
NOT_NEEDED = "not_needed"
# A rule of today's config or metadata says no; the detail starts with the rule's name (out_of_scope,
# not_replicated_here, protected, plan_mismatch, cursor_moved, redirect_outside_cluster).
SKIPPED = "skipped"


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
