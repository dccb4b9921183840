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
import time
from collections import Counter
from datetime import UTC
from typing import Any

from pyspark.sql import functions as F

from sweeper import runs
from sweeper.broker.errors import RedirectRefused, SystemTopicError
from sweeper.broker.liveness import registered_web_origins
from sweeper.broker.system_topic import AdminClient
from sweeper.config import SweeperConfig
from sweeper.ratelimit import TokenBucket
from sweeper.retention.errors import RepairLockHeld, RetentionRepairRefused
from sweeper.retention.journal import RepairJournal, RepairLock, Resolution, resolve_interrupted
from sweeper.retention.repair_calls import NamespacePolicies, _act, _Intents, _read, _record
from sweeper.retention.repair_plan import (
    DEFERRED,
    FAILED,
    SKIPPED,
    RepairCounts,
    RepairResult,
    RepairSettings,
    plan_actions,
    plan_age_refusal,
)
from sweeper.table_schemas import RETENTION_ACTIONS
from sweeper.tables import TableStore
from sweeper.vocabulary import DAY_MS
from sweeper.zk import client as zkutil
from sweeper.zk.errors import is_connection_error

# Rows are written in batches this size at most; with --execute also after every action that called the
# broker, so a killed repair leaves a row for every call it made (and an intent, in repair_journal, before it).
FLUSH_ROWS = 500
# Beside [delete] lock_path (whose parent the sweeper may already write): one repair with --execute at a time, so
# that a run the journal shows unclosed is one that stopped.
LOCK_NAME = "retention_repair"


# ---- I/O: ZooKeeper reads, the table, the loop ----------------------------------------------------------


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
