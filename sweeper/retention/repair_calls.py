"""One planned action of the retention repair (sweeper.retention.repair): re-checked against today's metadata
(read-only ZooKeeper reads, each namespace's replication clusters) and the broker's live stats, then, with
--execute, its admin calls, each after its intent is on disk; its outcome recorded as a `retention_actions` row."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kazoo.exceptions import NoNodeError

from sweeper import names
from sweeper.broker.system_topic import AdminClient
from sweeper.codecs import pulsar as codec
from sweeper.codecs.errors import MetadataDecodeError
from sweeper.ratelimit import TokenBucket
from sweeper.retention.journal import (
    DELETE_CALL,
    DELETE_SUBSCRIPTION,
    DELETED,
    LOAD_CALL,
    LOADED,
    STATS_CALL,
    TRIM_CALL,
    TRIMMED,
    RepairJournal,
    RepairLock,
)
from sweeper.retention.repair_plan import (
    FAILED,
    NOT_NEEDED,
    SKIPPED,
    SKIPPED_ACTIVE,
    SKIPPED_GONE,
    WOULD_DELETE,
    WOULD_LOAD,
    PlannedAction,
    RepairResult,
    TodaysRules,
    cursor_refusal,
    plan_refusal,
    replication_refusal,
    stats_refusal,
    subscription_activity,
)
from sweeper.zk import client as zkutil


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
