"""The delete action (PIP-186 phase 2): a run's pending deletes, re-verified and deleted by Spark tasks.

Input is what the run emitted plus whatever the retry queue says is due. Records are spread over
tasks by ledger id; each task opens its own ZooKeeper (and S3) clients and runs the executors of
`sweeper.delete`, which re-read the ledger and its referrers and delete with compare-and-set.
The driver then commits one `delete_results` row per record, queues what still fails in
`retry_queue` (with back-off), and moves what exhausted its attempts to `dead_letter`.

Dry run unless `execute`; with `execute`, a ZooKeeper run lock keeps a second delete run out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import ClientError
from kazoo.exceptions import NoAuthError
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sweeper import runs
from sweeper.broker.liveness import clock_problem, live_brokers
from sweeper.codecs import pending_delete
from sweeper.codecs.bookkeeper import decode_ledger_metadata
from sweeper.codecs.layout import LedgerLayout, ledger_path
from sweeper.config import (
    BookKeeperConfig,
    DeleteConfig,
    GatesConfig,
    OffloadConfig,
    PulsarMetadataConfig,
    RetentionConfig,
    SafetyConfig,
    ScanConfig,
    SweeperConfig,
    SystemTopicConfig,
)
from sweeper.connections import Connections, MetadataEndpoint, OxiaEndpoint
from sweeper.delete import permissions
from sweeper.delete.decide import LiveObject, object_mismatch
from sweeper.delete.drain import TopicDrain
from sweeper.delete.journal import Journal, open_journal, relabel_lost_answers, resolve_interrupted
from sweeper.delete.lock import DeleteRunLock
from sweeper.delete.records import SOURCE_EMITTED, SOURCE_JSON, SOURCE_RETRY, PendingRecord
from sweeper.delete.results import DELETED, FAILED, INVALID, DeleteResult, result_for
from sweeper.delete.retry import RetryPolicy, run_with_retries
from sweeper.delete.s3_executor import ObjectDeleter
from sweeper.delete.zk_executor import LOCK_LOST, LedgerDeleter, OffloadCheck
from sweeper.errors import Refused
from sweeper.metastore.migration import (
    MIGRATION_NOT_ATTEMPTED,
    MigrationGuard,
    MigrationRefused,
    check_stores,
)
from sweeper.metastore.urls import StoreUrl
from sweeper.names import managed_ledger_for_topic, topic_for_managed_ledger
from sweeper.offload import S3Target, object_metadata, s3_client
from sweeper.ratelimit import TokenBucket
from sweeper.rules.classify import Sharing
from sweeper.rules.owner import ActingRules
from sweeper.rules.protection import Protection
from sweeper.rules.safety import GracePeriod, Scope
from sweeper.run_lock import Fence, LockLost, LockWatch
from sweeper.scan.bookkeeper import read_layout, split_custom_metadata
from sweeper.table_schemas import DEAD_LETTER, DELETE_RESULTS, RETRY_QUEUE
from sweeper.tables import TableStore
from sweeper.vocabulary import HOUR_MS
from sweeper.zk import client as zkutil
from sweeper.zk.errors import ZooKeeperPermissionError

QUEUED, RESOLVED, DEAD_LETTERED = "queued", "resolved", "dead_lettered"


class DeleteRefused(Refused):
    """The delete stage will not start: nothing emitted, another run holds the lock, or an unsafe setup."""


@dataclass(frozen=True)
class DeleteTarget:
    """What a delete task needs: small and picklable."""

    bookkeeper: MetadataEndpoint  # [bookkeeper]'s store, with its TLS / SASL / digest settings
    ledgers_root: str
    layout: str
    ml_root: str
    schemas_root: str
    min_age_ms: int
    now_ms: int | None
    execute: bool
    batch_size: int
    deletes_per_second: float
    op_timeout_s: float
    multi_read: int  # reads per ZooKeeper request when verifying (1: ZooKeeper < 3.6)
    policy: RetryPolicy
    endpoint_override: str
    buckets: tuple[tuple[str, str, str], ...]  # (bucket, region, endpoint) this run may delete from
    shadows: tuple[tuple[str, tuple[str, ...]], ...] = ()  # source managed ledger -> its shadow topics' ones
    local_cluster: str = ""  # [pulsar] cluster_name: an object must carry it to be deleted
    rules: ActingRules = field(default_factory=ActingRules)  # today's rules, re-applied to every record
    peers: tuple[MetadataEndpoint, ...] = ()  # [safety] peer_metadata: re-read before each ledger delete
    # Pulsar's store when it is not BookKeeper's: an Oxia namespace of its own (on ZooKeeper the delete refuses)
    pulsar: MetadataEndpoint | None = None
    offload_enabled: bool = False  # [offload] enabled: offloaded copies can be checked before a BookKeeper delete
    journal: Journal | None = None  # with execute: intents and outcomes, committed by the tasks chunk by chunk
    never_seen: frozenset[int] = frozenset()  # operator-listed ids no snapshot lists: `not_found` when gone
    # With execute: PIP-454's flag, re-read by each task before every executor call (sweeper.metastore.migration)
    migration: MigrationGuard | None = None
    # With execute: the run lock's fence (sweeper.run_lock), checked in every delete multi and read before every
    # executor call, so a run that lost its lock (an expired session) stops wherever its tasks run
    fence: Fence | None = None


@dataclass(frozen=True)
class DeleteSettings:
    """What the delete reads of the config, narrowed once (issue 22's stage shape), with the run's own choices:
    whether to delete (`execute`) and where its input comes from (the run's marks, an operator's JSON list, or
    the system topic)."""

    bookkeeper: BookKeeperConfig
    pulsar: PulsarMetadataConfig
    delete: DeleteConfig
    safety: SafetyConfig
    gates: GatesConfig
    offload: OffloadConfig
    scan: ScanConfig
    retention: RetentionConfig
    system_topic: SystemTopicConfig
    connections: Connections
    config_hash: str
    pulsar_store: StoreUrl
    execute: bool = False
    from_json: str | Path | None = None
    from_topic: bool = False
    now_ms: int | None = None  # the decision clock; tests move it
    # Where the stage says what it waits for (a killed run's lock expiring); the CLI's terminal by default.
    log: Callable[[str], None] = field(default=print, compare=False, repr=False)
    # Run under the stage wrapper, which writes the attempt's `runs` row once it returns: its journal says so when it
    # closes, so that a kill between the two is found and recorded by the next attempt (journal.settle_unrecorded).
    recorded_in_runs: bool = False

    @classmethod
    def from_config(cls, config: SweeperConfig, *, execute: bool = False, from_json: str | Path | None = None,
                    from_topic: bool = False, now_ms: int | None = None,
                    recorded_in_runs: bool = False) -> DeleteSettings:
        return cls(config.bookkeeper, config.pulsar, config.delete, config.safety, config.gates, config.offload,
                   config.scan, config.retention, config.system_topic, Connections.from_config(config),
                   config.hash(), config.pulsar_store(), execute, from_json, from_topic, now_ms,
                   recorded_in_runs=recorded_in_runs)

    def hash(self) -> str:
        return self.config_hash


@dataclass(frozen=True)
class DeleteCounts(runs.StageCounts):
    """Where the records came from, what was resolved from an interrupted attempt, and each record's outcome."""

    # Inputs: the run's emitted records (or a drained topic, or an operator's list) and the due retries.
    emitted: int = 0
    already_final: int = 0
    not_due: int = 0
    due_retries: int = 0
    from_topic: int = 0
    from_json: int = 0
    records: int = 0
    deferred_by_cap: int = 0
    shadow_topics: int = 0
    missing_permissions: int = 0
    # An earlier attempt of the run that stopped: its deletes are on record as its own (sweeper.delete.journal).
    interrupted_attempts: int = 0
    interrupted_deleted: int = 0
    interrupted_recovered: int = 0
    interrupted_still_present: int = 0
    # The `interrupted` row of a stopped attempt itself (sweeper.delete.journal.resolve_interrupted).
    recovered_from_journal: int = 0  # deleted by it, known only from its intents
    attempted_still_present: int = 0
    # Outcomes (sweeper.delete.results), one per record.
    deleted: int = 0
    would_delete: int = 0
    already_gone: int = 0
    not_found: int = 0
    in_use: int = 0
    mismatch: int = 0
    invalid: int = 0
    refused: int = 0
    failed: int = 0
    queued_for_retry: int = 0
    dead_lettered: int = 0
    acknowledged: int = 0  # messages acknowledged on the drained topic
    # The run's settings, recorded with its counts.
    execute: int = 0
    deletes_per_second_per_task: int = 0


@dataclass
class DeleteRunResult:
    run_id: str
    execute: bool
    counts: DeleteCounts
    duration_s: float
    results: list[DeleteResult] = field(default_factory=list)
    guards: dict[str, Any] = field(default_factory=dict)

    @property
    def queued(self) -> int:
        return self.counts.queued_for_retry


# ---- inputs ------------------------------------------------------------------------------------

def _latest_by_key(rows: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    latest: dict[str, Mapping[str, Any]] = {}
    for row in sorted(rows, key=lambda r: r["recorded_at"]):
        latest[row["record_key"]] = row
    return latest


def retry_states(store: TableStore) -> dict[str, Mapping[str, Any]]:
    if not store.exists("retry_queue"):
        return {}
    return _latest_by_key(store.read("retry_queue").toArrow().to_pylist())


def load_inputs(store: TableStore, run_id: str, now: datetime,
                limit: int | None = None) -> tuple[list[PendingRecord], dict[str, int]]:
    """The run's emitted records without a final result yet, and every queued record that is due,
    by record key; at most `limit` of them (`counts["selected"]` says how many there were).

    The run's emitted records are filtered, counted and cut to the first `limit` in Spark: only
    what this run will process reaches the driver, not every record the run ever emitted. The
    retry queue (failed deletes only) is read on the driver as before.
    """
    counts = {"emitted": 0, "already_final": 0, "not_due": 0, "due_retries": 0}
    queue = retry_states(store)
    picked: list[PendingRecord] = []
    pending = 0
    if store.exists("emitted"):
        emitted = (store.read("emitted", where={"run_id": run_id}).select("record_key", "payload")
                   .dropDuplicates(["record_key"]))
        counts["emitted"] = emitted.count()
        todo = emitted
        if store.exists("delete_results"):
            final = store.read("delete_results", where={"run_id": run_id}).where(
                (F.col("outcome") != FAILED) & ~F.col("dry_run")).select("record_key")
            counts["already_final"] = emitted.join(final, "record_key", "left_semi").count()
            todo = todo.join(final, "record_key", "left_anti")
        if queue:  # the queue governs records that failed before
            spark = emitted.sparkSession
            todo = todo.join(spark.createDataFrame([(k,) for k in queue], "record_key string"), "record_key",
                             "left_anti")
        pending = todo.count()
        head = todo.orderBy("record_key")
        if limit is not None:
            head = head.limit(limit)
        picked = [PendingRecord(row["record_key"], SOURCE_EMITTED, run_id, 0, row["payload"])
                  for row in head.toArrow().to_pylist()]
    retries: list[PendingRecord] = []
    for key, row in queue.items():
        if row["state"] != QUEUED:
            continue
        due = row["next_attempt_at"]
        if due is not None and due.replace(tzinfo=due.tzinfo or UTC) > now:
            counts["not_due"] += 1
            continue
        counts["due_retries"] += 1
        retries.append(PendingRecord(key, SOURCE_RETRY, row["run_id"], int(row["attempts"]), row["payload"]))
    selected = sorted(picked + retries, key=lambda p: p.record_key)
    counts["selected"] = pending + len(retries)
    return (selected if limit is None else selected[:limit]), counts


def read_operator_list(path: str | Path) -> list[Mapping[str, Any]]:
    """The entries of an operator's ledger list, each an object (a bare ledger id N becomes `{"ledgerId": N}`);
    DeleteRefused naming the file and the fault when it cannot be read or is not such a list."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DeleteRefused(f"cannot read the ledger list {path}: {exc}") from exc
    if isinstance(entries, Mapping):
        entries = entries.get("ledgers")
    if not isinstance(entries, list):
        raise DeleteRefused(f"{path} must hold a JSON list of ledgers (or {{\"ledgers\": [...]}})")
    out: list[Mapping[str, Any]] = []
    for n, entry in enumerate(entries):
        if isinstance(entry, int) and not isinstance(entry, bool):
            entry = {"ledgerId": entry}
        if not isinstance(entry, Mapping):
            raise DeleteRefused(f"{path} entry {n} is not an object or a ledger id: {entry!r}")
        out.append(entry)
    return out


def records_from_json(entries: list[Mapping[str, Any]], client: Any, ledgers_root: str,
                      layout: LedgerLayout) -> list[PendingRecord]:
    """An operator's list (read_operator_list): full PendingDeleteLedgerInfo objects, or `{"ledgerId": N}`
    completed from the ledger's own metadata (its ownership then only decides the referrer to check; every
    other rule holds)."""
    out: list[PendingRecord] = []
    for n, entry in enumerate(entries):
        record = dict(entry) if "ledgerType" in entry else _record_from_metadata(entry, client, ledgers_root, layout)
        unencodable = ""
        try:
            payload = pending_delete.encode({**_RECORD_DEFAULTS, **record})
        except Exception as exc:  # the delete path reports it as invalid, with the reason
            payload = json.dumps(record, default=str).encode()
            try:
                pending_delete.validate({**_RECORD_DEFAULTS, **record})
                unencodable = f"entry {n} is not a PendingDeleteLedgerInfo: {exc}"
            except pending_delete.InvalidPendingDelete as invalid:
                unencodable = f"entry {n}: {invalid}"
        out.append(PendingRecord(f"json/{n}/{record.get('ledgerType')}/{record.get('ledgerId')}", SOURCE_JSON, None,
                                 0, payload, unencodable))
    return out


_RECORD_DEFAULTS: dict[str, Any] = {"topicName": None, "cursorName": None, "schemaId": None, "offloadContext": None,
                                    "properties": {}, "reason": "operator_list", "runId": None}


def _record_from_metadata(entry: Mapping[str, Any], client: Any, ledgers_root: str,
                          layout: LedgerLayout) -> dict[str, Any]:
    ledger_id = entry.get("ledgerId", entry.get("ledger_id"))
    base = {**_RECORD_DEFAULTS, "ledgerType": "LEDGER", "ledgerId": ledger_id, "ledgerComponent": "MANAGED_LEDGER"}
    if not isinstance(ledger_id, int) or isinstance(ledger_id, bool) or ledger_id < 0:
        return base  # refused as invalid by the executor, with the reason
    try:
        data, _ = client.get(ledger_path(ledgers_root, ledger_id, layout))
        custom, _ = split_custom_metadata(decode_ledger_metadata(data).custom_metadata)
    except Exception:  # missing or unreadable: the executor reports already_gone / invalid
        return base
    component = pending_delete.COMPONENTS.get(custom.get("component") or "", "MANAGED_LEDGER")
    if component == "MANAGED_LEDGER" and custom.get("pulsar/cursor"):
        component = "MANAGED_CURSOR"
    ml = custom.get("pulsar/managed-ledger")
    topic = custom.get("pulsar/compactedTopic") or custom.get("pulsar/delayedIndexTopic")
    if ml:
        # None for a name Pulsar cannot have written: the executor then refuses the record as invalid.
        topic = topic_for_managed_ledger(ml)
    properties = {"bucket_key": custom["pulsar/delayedIndexBucketKey"]} if custom.get(
        "pulsar/delayedIndexBucketKey") else {}
    return {**base, "ledgerComponent": component, "topicName": topic, "cursorName": custom.get("pulsar/cursor"),
            "schemaId": custom.get("pulsar/schemaId"), "properties": properties}


# ---- tasks -------------------------------------------------------------------------------------

def _decode(item: PendingRecord) -> tuple[dict[str, Any] | None, str | None]:
    """Well-formed Avro only: the executors validate the fields themselves, after "gone" and "not Pulsar's"."""
    if item.unencodable:
        return None, f"malformed: {item.unencodable}"
    try:
        return pending_delete.decode(item.payload, check=False), None
    except pending_delete.InvalidPendingDelete as exc:
        return None, f"{exc.kind}: {exc}"


def _paced(items: list[Any], per_second: float) -> Iterator[list[Any]]:
    """Chunks of work; after each, the task pays for its records on the token bucket every stage shares, so it
    stays under `per_second` records a second.

    A chunk is paid for after its work, so the bucket banks up to a chunk: the time the work took counts toward
    its budget. With the default one-slice burst it would bank none of it and sleep a whole chunk's worth on top,
    halving the rate whenever ZooKeeper is as slow as the pace (66fcce4)."""
    chunk = max(1, min(int(per_second), 2000))
    bucket = TokenBucket(per_second, burst=chunk, start_full=False)
    for start in range(0, len(items), chunk):
        part = items[start:start + chunk]
        yield part
        if start + chunk < len(items):
            bucket.acquire(len(part))


class Watch(Protocol):
    """A condition re-read before each executor call that may delete; once it says stop, the task stops for good
    (sweeper.metastore.migration.MigrationWatch, sweeper.run_lock.LockWatch)."""

    detail: str | None
    error: str | None

    def stop(self) -> bool: ...


def _stopped(watches: Sequence[Watch]) -> Watch | None:
    return next((w for w in watches if w.stop()), None)


def _run_records(fn: Any, pairs: list[tuple[PendingRecord, dict[str, Any]]], target: DeleteTarget,
                 rng: random.Random, watches: Sequence[Watch] = ()) -> list[tuple[PendingRecord, DeleteResult]]:
    out: list[tuple[PendingRecord, DeleteResult]] = []
    lock = next((w for w in watches if isinstance(w, LockWatch)), None)
    if watches:
        fn = _unless_stopped(fn, watches, lock)
    started = 0
    stopped: Watch | None = None
    for part in _paced(pairs, target.deletes_per_second):
        stopped = _stopped(watches)
        if stopped is not None:
            break  # a migration began, or the lock was lost: what is left is on record below, never journalled
        started += len(part)
        if target.journal is not None:
            target.journal.intents(part)  # on record before any of them can be deleted
        results = run_with_retries(fn, [r for _, r in part], target.policy, rng=rng)
        done = []
        for (item, _), result in zip(part, results, strict=True):
            result.attempt += item.attempts_before
            done.append((item, result))
        if target.journal is not None:
            _failpoint_before_outcomes()
            target.journal.outcomes(done)
        out += done
    if stopped is not None:
        for item, record in pairs[started:]:
            result = _left_alone(record, stopped)
            result.attempt += item.attempts_before
            out.append((item, result))
    return out


def _left_alone(record: Mapping[str, Any], watch: Watch) -> DeleteResult:
    return result_for(record, FAILED, watch.detail or "", error=watch.error)


def _unless_stopped(fn: Any, watches: Sequence[Watch], lock: LockWatch | None) -> Any:
    """`fn`, called only while every watch allows deleting: read again before each call, so an in-task retry round
    after a back-off deletes nothing once a migration began or the lock was lost. A multi that met the lost lock
    tells the lock's watch, so the task's next call is not even tried."""
    def call(records: list[Mapping[str, Any]]) -> list[DeleteResult]:
        stopped = _stopped(watches)
        if stopped is not None:
            return [_left_alone(record, stopped) for record in records]
        results = fn(records)
        if lock is not None:
            lost = next((r for r in results if r.detail == LOCK_LOST), None)
            if lost is not None:
                lock.lost(lost.error or "")
        return results

    return call


# A test failpoint: seconds to wait between a chunk's deletes and the commit of their outcomes, so a kill test
# lands in that window (the case the journal's intents exist for) more often than by chance. Unset: no wait.
FAILPOINT_BEFORE_OUTCOMES_ENV = "SWEEPER_FAILPOINT_BEFORE_OUTCOMES_S"


def _failpoint_before_outcomes() -> None:
    import os

    wait = float(os.environ.get(FAILPOINT_BEFORE_OUTCOMES_ENV) or 0)
    if wait > 0:
        time.sleep(wait)


TaskRow = tuple[str, str, str | None, bytes | None, DeleteResult]


def _store_for_the_task(target: DeleteTarget) -> Any:
    """BookKeeper's store, or on Oxia with Pulsar in a namespace of its own, both behind one client that sends
    each path to its store (the delete's referrers are Pulsar's records, its ledgers BookKeeper's)."""
    client = target.bookkeeper.connect()
    if target.pulsar is None:
        return client
    from sweeper.metastore.oxia_split import SplitStore

    fence_paths = [path for path, _ in target.fence.checks()] if target.fence is not None else []
    return SplitStore(client, target.pulsar.connect(), target.ledgers_root, bookkeeper_paths=fence_paths)


def _reader_for_the_task(target: DeleteTarget) -> Any:
    """The bulk reader that reads each path where `_store_for_the_task` would: ledgers in BookKeeper's store,
    referrers in Pulsar's."""
    reader = target.bookkeeper.wire_reader(target.multi_read)
    if target.pulsar is None:
        return reader
    from sweeper.metastore.oxia_split import SplitReader

    return SplitReader(reader, target.pulsar.wire_reader(target.multi_read), target.ledgers_root)


def delete_partition(items: Iterator[list[PendingRecord]], target: DeleteTarget) -> Iterator[TaskRow]:
    items = [item for group in items for item in group]
    if not items:
        return
    decoded: list[tuple[PendingRecord, dict[str, Any]]] = []
    finished: list[tuple[PendingRecord, DeleteResult]] = []
    for item in items:
        record, problem = _decode(item)
        if record is None:
            finished.append((item, result_for({}, INVALID, f"record refused: {problem}")))
        else:
            decoded.append((item, record))
    rng = random.Random(hash(items[0].record_key))
    client = _store_for_the_task(target)
    # Pulsar's store is `client` itself, or behind it (SplitStore sends the flag's path to Pulsar's namespace).
    watches: list[Watch] = []
    if target.fence is not None:
        # First: a run that lost its lock acts on nothing, whatever the migration flag says.
        watches.append(LockWatch(client, target.fence, target.op_timeout_s))
    if target.migration is not None:
        watches.append(target.migration.watch(client))
    reader: Any = None
    peer_clients: list[Any] = []
    try:
        ledgers = [(i, r) for i, r in decoded if r["ledgerType"] == "LEDGER"]
        if ledgers:
            # Bulk verification reads on a second session; a missing one only makes verification slower.
            with contextlib.suppress(Exception):
                reader = _reader_for_the_task(target)
        objects = [(i, r) for i, r in decoded if r["ledgerType"] != "LEDGER"]
        if ledgers:
            rules, peers = target.rules, []
            try:
                for peer in target.peers:
                    peer_client = peer.connect()
                    peer_clients.append(peer_client)
                    peers.append((peer.hosts, LedgerDeleter(
                        peer_client, ledgers_root=target.ledgers_root, layout=LedgerLayout(target.layout),
                        managed_ledgers_root=target.ml_root, schemas_root=target.schemas_root,
                        min_age_ms=target.min_age_ms, now_ms=target.now_ms, op_timeout_s=target.op_timeout_s)))
            except Exception:  # a peer we cannot read now: nothing it may reference is deleted
                rules = dataclasses.replace(rules, sharing=Sharing.UNVERIFIED)
            deleter = LedgerDeleter(
                client, ledgers_root=target.ledgers_root, layout=LedgerLayout(target.layout),
                managed_ledgers_root=target.ml_root, schemas_root=target.schemas_root, min_age_ms=target.min_age_ms,
                now_ms=target.now_ms, execute=target.execute, batch_size=target.batch_size,
                op_timeout_s=target.op_timeout_s, reader=reader, shadows=dict(target.shadows), rules=rules,
                peers=peers, offload_check=offload_checker(target), never_seen=target.never_seen, fence=target.fence)
            finished += _run_records(deleter.process, ledgers, target, rng, watches)
        by_bucket: dict[str, list[tuple[PendingRecord, dict[str, Any]]]] = {}
        for item, record in objects:
            by_bucket.setdefault((record.get("offloadContext") or {}).get("bucket") or "", []).append((item, record))
        allowed = {b for b, _, _ in target.buckets}
        regions = {b: (region, endpoint) for b, region, endpoint in target.buckets}
        for bucket, pairs in sorted(by_bucket.items()):
            region, endpoint = regions.get(bucket, ("", ""))
            s3 = s3_client(S3Target(bucket or "-", region, endpoint), target.endpoint_override)
            objects_deleter = ObjectDeleter(s3, client, managed_ledgers_root=target.ml_root, allowed_buckets=allowed,
                                            execute=target.execute, op_timeout_s=target.op_timeout_s,
                                            shadows=dict(target.shadows), local_cluster=target.local_cluster,
                                            min_age_ms=target.min_age_ms, now_ms=target.now_ms, rules=target.rules)
            # An object store has no multi to carry the fence: the watch reads it before each DeleteObjects call
            # (sweeper.run_lock: the window left is that read and the call).
            finished += _run_records(objects_deleter.process, pairs, target, rng, watches)
    finally:
        if reader is not None:
            reader.close()
        for peer_client in peer_clients:
            zkutil.close(peer_client)
        zkutil.close(client)
    for item, result in finished:
        # The payload travels back only where the retry queue will need it.
        yield (item.record_key, item.source, item.origin_run_id,
               item.payload if result.outcome == FAILED else None, result)


# ---- the stage ---------------------------------------------------------------------------------

def _check_emitted(store: TableStore, run_id: str) -> None:
    runs.require(store, run_id, "emit", DeleteRefused,
                 f"run {run_id} has no successful emit: nothing was marked for deletion")
    # Emit refuses an ungated run too; the delete asks again, whoever recorded that emit (DESIGN invariant 19).
    runs.require_gated(store, run_id, DeleteRefused)


def _buckets(store: TableStore, settings: DeleteSettings, run_id: str | None) -> tuple[tuple[str, str, str], ...]:
    """Buckets named by the offload contexts of the run's snapshot (or the latest), plus the configured extras."""
    found: dict[str, tuple[str, str, str]] = {}
    if store.exists("ml_ledgers"):
        frame = store.read("ml_ledgers", where=None if run_id is None else {"run_id": run_id}).where(
            F.col("offload_bucket").isNotNull())
        for r in frame.select("offload_bucket", "offload_region", "offload_endpoint").distinct().collect():
            found[r["offload_bucket"]] = (r["offload_bucket"], r["offload_region"] or "", r["offload_endpoint"] or "")
    for bucket in (b.strip() for b in settings.offload.extra_buckets.split(",")):
        if bucket and bucket not in found:
            found[bucket] = (bucket, settings.offload.region, "")
    return tuple(found[b] for b in sorted(found))


def listed_ledger_ids(entries: list[Mapping[str, Any]]) -> set[int]:
    """The BookKeeper ledger ids an operator's list names (offloaded copies are checked by their objects)."""
    ids = set()
    for entry in entries:
        ledger_id = entry.get("ledgerId", entry.get("ledger_id"))
        if entry.get("ledgerType", "LEDGER") == "LEDGER" and isinstance(ledger_id, int) \
                and not isinstance(ledger_id, bool):
            ids.add(ledger_id)
    return ids


def _never_seen(store: TableStore, ids: set[int]) -> frozenset[int]:
    """Those of `ids` that no snapshot of the tables lists (all of them with no snapshot at all)."""
    if not ids or not store.exists("bk_ledgers"):
        return frozenset(ids)
    seen = store.read_arrow("bk_ledgers", where={"ledger_id": frozenset(ids)}, columns=["ledger_id"])
    return frozenset(ids - set(seen.column("ledger_id").to_pylist()))


def _shadows(store: TableStore) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    """Shadow topics (PIP-180) seen by any snapshot, by source managed ledger; None with no snapshot at all.

    A shadow topic's managed ledger lists its source's ledgers, so each is a referrer the delete must
    re-read. A shadow created after the snapshot copies its source's list as it is then, which no
    longer holds a ledger the source had dropped, so a snapshot's view is enough.
    """
    if not store.exists("managed_ledgers"):
        return None
    by_source: dict[str, set[str]] = {}
    rows = (store.read("managed_ledgers").where(F.col("shadow_source").isNotNull())
            .select("shadow_source", "managed_ledger").distinct().collect())
    for row in rows:
        source = managed_ledger_for_topic(row["shadow_source"])
        if source is not None:
            by_source.setdefault(source, set()).add(row["managed_ledger"])
    return tuple((source, tuple(sorted(names))) for source, names in sorted(by_source.items()))


def _partitions(spark: SparkSession, settings: DeleteSettings, records: int) -> int:
    wanted = settings.delete.tasks or 2 * spark.sparkContext.defaultParallelism
    return max(1, min(wanted, (records + 999) // 1000))


def run_delete(spark: SparkSession, config: SweeperConfig, store: TableStore, run_id: str, *, execute: bool = False,
               from_json: str | Path | None = None, from_topic: bool = False,
               now_ms: int | None = None, recorded_in_runs: bool = False) -> DeleteRunResult:
    return run(spark, store, run_id, DeleteSettings.from_config(config, execute=execute, from_json=from_json,
                                                               from_topic=from_topic, now_ms=now_ms,
                                                               recorded_in_runs=recorded_in_runs))


def run(spark: SparkSession, store: TableStore, run_id: str, settings: DeleteSettings) -> DeleteRunResult:
    """One delete run. Input: the run's emitted records and due retries; or an operator's JSON list; or
    (`from_topic`) up to `max_deletes_per_run` messages drained from the system topic's Shared
    subscription, acknowledged only once their outcomes are committed (never in a dry run)."""
    execute, from_json, from_topic, now_ms = settings.execute, settings.from_json, settings.from_topic, settings.now_ms
    t0 = time.monotonic()
    now = datetime.now(UTC) if now_ms is None else datetime.fromtimestamp(now_ms / 1000, UTC)
    d = settings.delete
    connections = settings.connections
    split = connections.pulsar.hosts != connections.bookkeeper.hosts
    if split and execute and not isinstance(connections.pulsar, OxiaEndpoint):
        # The compare-and-set multi must cover the ledger znode and its referrers in one ensemble.
        raise DeleteRefused("Pulsar and BookKeeper metadata are in different ZooKeeper ensembles; deleting "
                            "needs one multi-operation across both, so only dry runs are possible")
    if split and execute and isinstance(connections.pulsar, OxiaEndpoint) != isinstance(connections.bookkeeper,
                                                                                         OxiaEndpoint):
        raise DeleteRefused("Pulsar's metadata and BookKeeper's are in different kinds of store (one ZooKeeper, "
                            "one Oxia): a cluster midway through a migration; only dry runs are possible")
    client = connections.bookkeeper.connect()
    lock: DeleteRunLock | None = None
    drain: TopicDrain | None = None
    journal: Journal | None = None
    never_seen: frozenset[int] = frozenset()  # snapshots and the system topic name only ids Pulsar had
    try:
        # PIP-454: no delete while a migration copies the store, none on a store migrated away from (issue 24);
        # checked before anything else is read.
        check_stores(connections.pulsar, settings.pulsar_store, deleting=execute,
                     acknowledged_completed=settings.safety.acknowledge_migration_completed,
                     source=connections.migration_source)
        layout = read_layout(client, settings.bookkeeper.ledgers_root, settings.bookkeeper.writes_layout_record)
        if from_topic:
            drain = TopicDrain(settings.system_topic, connections.broker(), d.subscription, d.max_deletes_per_run)
            inputs = drain.receive()
            counts = {"from_topic": len(drain.messages)}
            buckets = _buckets(store, settings, None)
        elif from_json is not None:
            listed = read_operator_list(from_json)
            inputs = records_from_json(listed, client, settings.bookkeeper.ledgers_root, layout)
            counts = {"from_json": len(inputs)}
            never_seen = _never_seen(store, listed_ledger_ids(listed))
            buckets = _buckets(store, settings, None)
        else:
            _check_emitted(store, run_id)
            inputs, counts = load_inputs(store, run_id, now, limit=d.max_deletes_per_run)
            buckets = _buckets(store, settings, run_id)
        cap = d.max_deletes_per_run
        counts["deferred_by_cap"] = max(0, counts.pop("selected", len(inputs)) - cap)
        inputs = inputs[:cap]
        counts["records"] = len(inputs)
        guards = {"execute": execute, "max_deletes_per_run": cap, "deletes_per_second_per_task": d.deletes_per_second,
                  "min_age_hours": settings.safety.min_age_hours, "lock": d.lock_path if execute else None}
        shadows = _shadows(store)
        if shadows is None and execute and inputs:
            raise DeleteRefused("no snapshot in the tables: run `sweeper snapshot` first, so that shadow topics "
                                "(which list their source topics' ledgers) are known and re-checked")
        counts["shadow_topics"] = sum(len(names) for _, names in shadows or ())
        if inputs and isinstance(connections.bookkeeper, OxiaEndpoint):
            guards["permission_check"] = "not applicable: Oxia has no per-record ACLs"
        elif inputs:
            allowed = permissions.check(
                connections.bookkeeper, [item.payload for item in inputs],
                ledgers_root=settings.bookkeeper.ledgers_root, layout=layout,
                ml_root=settings.pulsar.managed_ledgers_root, schemas_root=settings.pulsar.schemas_root,
                shadows=dict(shadows or ()), reads_per_second=settings.scan.reads_per_second,
                multi_read=settings.scan.multi_read, max_sessions=settings.scan.max_sessions)
            guards["permission_check"] = allowed.status
            counts["missing_permissions"] = len(allowed.missing)
            if allowed.missing:
                guards["permission_check"] = allowed.refusal()
                if execute:
                    raise DeleteRefused(allowed.refusal())
        if execute:
            lock = DeleteRunLock(client, d.lock_path, run_id=run_id,
                                 wait_for_dead_local_holder_s=settings.bookkeeper.session_timeout_s + 2.0,
                                 log=settings.log)
            try:
                lock.acquire()
            except NoAuthError as exc:
                lock = None
                raise DeleteRefused(str(ZooKeeperPermissionError(
                    d.lock_path.rsplit("/", 1)[0] or "/", "CREATE",
                    f"the run lock {d.lock_path} (create its parent writable by the sweeper, or set [delete] "
                    "lock_path)"))) from exc
            # Under the lock, an attempt the journal shows unclosed has stopped: its deletes go on record (with its
            # run id) before this attempt could take them for its own `already_gone`.
            journal = open_journal(store, run_id, settings.bookkeeper.ledgers_root, layout,
                                   runs_row_follows=settings.recorded_in_runs)
            resolution = resolve_interrupted(store, lambda path: client.exists(path) is not None, journal.attempt_id)
            if resolution.attempts or resolution.unrecorded:
                counts.update(resolution.counts())
                guards["interrupted_attempts"] = resolution.attempts + resolution.unrecorded
                inputs = [item for item in inputs if item.record_key not in resolution.settled]
                counts["records"] = len(inputs)
            skew = clock_problem(lock.clock_skew_ms, settings.safety.max_clock_skew_seconds)
            guards["clock_skew_ms"] = lock.clock_skew_ms
            if skew:
                # Every grace-period decision compares this host's clock with ledger times: refuse.
                raise DeleteRefused(skew)
            if settings.gates.require_live_brokers:
                # The liveness gate reconcile's snapshot passed, again now: a record from a stale copy of the
                # metadata (a cluster moved elsewhere) would be checked against references nobody updates.
                pulsar = client if connections.pulsar.hosts == connections.bookkeeper.hosts else None
                brokers = _live_brokers(settings, pulsar)
                guards["live_brokers"] = brokers
                if not brokers:
                    raise DeleteRefused(f"no live broker registered under {settings.pulsar.brokers_path}: this "
                                        "metadata may be a stale copy; pass --allow-no-brokers for a cleanup with the "
                                        "brokers stopped")
        grace = GracePeriod.of(int(settings.safety.min_age_hours * HOUR_MS), force=settings.safety.force_min_age)
        target = DeleteTarget(
            bookkeeper=connections.bookkeeper, pulsar=connections.pulsar if split else None,
            ledgers_root=settings.bookkeeper.ledgers_root, layout=layout.value,
            ml_root=settings.pulsar.managed_ledgers_root, schemas_root=settings.pulsar.schemas_root,
            min_age_ms=grace.min_age_ms, now_ms=now_ms, execute=execute,
            batch_size=d.batch_size, deletes_per_second=d.deletes_per_second, op_timeout_s=d.op_timeout_s,
            multi_read=settings.scan.multi_read,
            policy=RetryPolicy(max_attempts=d.max_attempts, in_task_attempts=d.in_task_attempts,
                               retry_after_s=d.retry_after_s),
            endpoint_override=settings.offload.endpoint_override, buckets=buckets, shadows=shadows or (),
            local_cluster=settings.pulsar.cluster_name, rules=acting_rules(settings),
            peers=connections.peers,
            offload_enabled=settings.offload.enabled, journal=journal,
            never_seen=never_seen,
            migration=MigrationGuard(settings.pulsar_store, settings.safety.acknowledge_migration_completed,
                                     d.op_timeout_s) if execute else None,
            fence=lock.fence if lock is not None else None)
        rows: list[TaskRow] = []
        if inputs:
            parts = _partitions(spark, settings, len(inputs))
            # Grouped by ledger id on the driver, one group per Spark partition: no shuffle of the payloads.
            groups: list[list[PendingRecord]] = [[] for _ in range(parts)]
            for item in inputs:
                groups[max(_ledger_of(item), 0) % parts].append(item)
            rows = (spark.sparkContext.parallelize(groups, parts)
                    .mapPartitions(lambda it: delete_partition(it, target)).collect())
        if lock is not None:
            _stop_if_lock_lost(lock, rows, journal)
        result = _commit(store, run_id, rows, target, execute, now, counts)
        if journal is not None:
            if lock is not None:
                # Paused between the check above and here, the run may have lost its lock meanwhile, and its next
                # holder folded this attempt in: it must not also close it and record a status of its own.
                lock.check()
            journal.close()
        refused = [r.error for r in result.results if r.error and "(ZooKeeper NoAuth)" in r.error]
        if refused:
            # Committed first, so every outcome is on record; then the run stops as refused (exit 3).
            raise DeleteRefused(f"{refused[0]}; {len(refused)} record(s) not done wait in the retry queue: grant the "
                                "permission and run again")
        _refuse_if_migrating(result, settings, bool(rows))
        if drain is not None and execute:
            # Committed: every record has its final result or sits in the retry queue.
            result.counts = result.counts.with_counts(acknowledged=drain.acknowledge())
    finally:
        if drain is not None:
            drain.close()
        if lock is not None:
            lock.release()
        zkutil.close(client)
    result.guards = guards
    result.duration_s = time.monotonic() - t0
    return result


def _stop_if_lock_lost(lock: DeleteRunLock, rows: list[TaskRow], journal: Journal | None) -> None:
    """Before anything is committed: when a task met the lost lock, or the driver cannot show it still holds it,
    the run stops here (LockLost, exit 3). It commits nothing and leaves its journal open: what its tasks did is
    there, and the run that takes the lock next folds it in as it folds in a killed run, so every deletion has one
    `deleted` row and the run one status (`interrupted`). DESIGN.md invariant 22."""
    met = next((row[4] for row in rows if row[4].detail == LOCK_LOST), None)
    why = met.error if met is not None else (lock.fence.verify(lock.client) if lock.fence is not None else None)
    if why is None:
        return
    deleted = sum(1 for row in rows if row[4].outcome == DELETED)
    where = f"delete_journal (attempt {journal.attempt_id})" if journal is not None else "delete_journal"
    raise LockLost(f"the delete run {lock.run_id} stopped acting: {why}. It deleted {deleted:,} ledger(s) or "
                   f"object(s) before it stopped; each is on record in {where}, and the next `delete --execute` "
                   "files them under this run and re-verifies the rest")


def _refuse_if_migrating(result: DeleteRunResult, settings: DeleteSettings, ran: bool) -> None:
    """After the commit, so that every outcome is on record: MigrationRefused (exit 3) naming the phase when a
    task met a PIP-454 migration, or when one began while the last chunks ran (read once more here)."""
    stopped = [r.error for r in result.results if r.detail == MIGRATION_NOT_ATTEMPTED]
    if stopped:
        raise MigrationRefused(f"{stopped[0]}. The delete stopped mid-run: {len(stopped)} record(s) not attempted "
                               "wait in the retry queue")
    if ran and settings.execute:
        try:
            check_stores(settings.connections.pulsar, settings.pulsar_store, deleting=True,
                         acknowledged_completed=settings.safety.acknowledge_migration_completed,
                         source=settings.connections.migration_source)
        except MigrationRefused as exc:
            raise MigrationRefused(f"{exc} (read as the delete's tasks ended: every outcome of this run is on "
                                   "record)") from exc


def offload_checker(target: DeleteTarget) -> OffloadCheck | None:
    """Whether a ledger's offloaded copy is whole in its bucket (both objects, non-empty, this cluster's and the
    listing managed ledger's by their own metadata), asked right before its BookKeeper copy is deleted."""
    if not target.offload_enabled:
        return None
    clients: dict[tuple[str, str, str], Any] = {}

    def check(bucket: str, region: str, endpoint: str, keys: tuple[str, ...], ml_name: str) -> str | None:
        if not bucket:
            return "the offload context names no bucket"
        where = (bucket, region, endpoint)
        if where not in clients:
            clients[where] = s3_client(S3Target(bucket, region, endpoint), target.endpoint_override)
        live = []
        for key in keys:
            try:
                head = clients[where].head_object(Bucket=bucket, Key=key)
            except ClientError as exc:
                return f"s3://{bucket}/{key}: {exc.response.get('Error', {}).get('Code', exc)}"
            if not head.get("ContentLength"):
                return f"s3://{bucket}/{key} is empty"
            live.append(LiveObject(key, 0, object_metadata(head)))
        # The rule an offload record's objects must pass (this cluster's, this managed ledger's); age is not asked.
        wrong = object_mismatch({"topicName": topic_for_managed_ledger(ml_name)}, live, target.local_cluster, 0, 0)
        return f"s3://{bucket}/{wrong.detail}" if wrong is not None else None

    return check


def acting_rules(settings: DeleteSettings) -> ActingRules:
    """The rules of today's settings, as reconcile applies them (sweeper.reconcile.stage.SafetySettings.from_config)."""
    sharing = (Sharing.DEDICATED if settings.safety.bookkeeper_dedicated
               else Sharing.PEERS_READ if settings.safety.peer_metadata else Sharing.UNVERIFIED)
    return ActingRules(Scope.of(settings.safety.allow, settings.safety.deny),
                       Protection.of(settings.retention.protected_subscriptions, settings.retention.protected_topics),
                       sharing)


def _live_brokers(settings: DeleteSettings, client: Any) -> int:
    own = client is None
    if own:
        client = settings.connections.pulsar.connect()
    try:
        return len(live_brokers(client, settings.pulsar.brokers_path))
    finally:
        if own:
            zkutil.close(client)


def _ledger_of(item: PendingRecord) -> int:
    parts = item.record_key.split("/")
    try:
        if item.source == SOURCE_JSON:
            return int(parts[-1])
        return int(parts[1]) if parts[0] in ("LEDGER", "OFFLOAD_LEDGER") else -1
    except (ValueError, IndexError):
        return -1


def _commit(store: TableStore, run_id: str, rows: list[TaskRow], target: DeleteTarget, execute: bool,
            now: datetime, counts: dict[str, int]) -> DeleteRunResult:
    # Rows are ordered by when they were written; `now` (the decision clock) only sets next_attempt_at.
    written = datetime.now(UTC)
    if execute and target.journal is not None:
        # A target found gone that a delete of ours may have removed (its answer lost, its task run again) is ours
        # (DESIGN.md invariant 18), before anything is counted or committed.
        relabel_lost_answers(store, target.journal.attempt_id, [(row[0], row[4]) for row in rows])
    columns: dict[str, list[Any]] = {name: [] for name in DELETE_RESULTS.fieldNames()}
    queue_rows, dead_rows = [], []
    results: list[DeleteResult] = []
    for record_key, source, origin_run_id, payload, result in rows:
        results.append(result)
        counts[result.outcome] = counts.get(result.outcome, 0) + 1
        for name, value in (
                ("run_id", run_id), ("origin_run_id", origin_run_id), ("finished_at", written),
                ("record_key", record_key), ("ledger_id", result.ledger_id), ("ledger_type", result.ledger_type),
                ("component", result.component), ("topic_name", result.topic_name), ("outcome", result.outcome),
                ("detail", result.detail[:2000]), ("error", (result.error or "")[:2000] or None),
                ("attempt", result.attempt), ("duration_ms", result.duration_ms), ("zk_path", result.zk_path),
                ("zk_version", result.zk_version), ("s3_bucket", result.s3_bucket), ("s3_keys", result.s3_keys),
                ("dry_run", not execute), ("source", source)):
            columns[name].append(value)
        if not execute:
            continue
        base = {"run_id": run_id, "recorded_at": written, "record_key": record_key,
                "ledger_id": result.ledger_id, "attempts": result.attempt}
        if result.outcome == FAILED:
            step, due_ms = target.policy.next_step(result.attempt, int(now.timestamp() * 1000))
            if step == "retry":
                queue_rows.append({**base, "payload": payload, "state": QUEUED, "last_error": result.error,
                                   "next_attempt_at": datetime.fromtimestamp((due_ms or 0) / 1000, UTC)})
            else:
                queue_rows.append({**base, "payload": payload, "state": DEAD_LETTERED, "last_error": result.error})
                dead_rows.append({**base, "payload": payload, "state": "dead", "last_error": result.error})
        elif source == SOURCE_RETRY:
            queue_rows.append({**base, "payload": b"", "state": RESOLVED, "last_error": None})
    metadata = {"run_id": run_id, "stage": "delete"}
    if rows:
        store.append_columns("delete_results", columns, DELETE_RESULTS, commit_metadata=metadata)
    if queue_rows:
        store.append_rows("retry_queue", queue_rows, RETRY_QUEUE, commit_metadata=metadata)
    if dead_rows:
        store.append_rows("dead_letter", dead_rows, DEAD_LETTER, commit_metadata=metadata)
    counts["queued_for_retry"] = sum(1 for r in queue_rows if r["state"] == QUEUED)
    counts["dead_lettered"] = len(dead_rows)
    counts["execute"] = int(execute)
    counts["deletes_per_second_per_task"] = int(target.deletes_per_second)
    return DeleteRunResult(run_id, execute, DeleteCounts.from_row(counts), 0.0, results)


# ---- dead letters --------------------------------------------------------------------------------

def dead_letters(store: TableStore) -> list[Mapping[str, Any]]:
    """Records whose latest dead-letter row is `dead` (not yet re-driven)."""
    if not store.exists("dead_letter"):
        return []
    return [r for r in _latest_by_key(store.read_arrow("dead_letter").to_pylist()).values() if r["state"] == "dead"]


def redrive(store: TableStore, record_keys: Sequence[str] | None = None) -> int:
    """Queue dead letters again with a fresh attempt budget; all of them when `record_keys` is None."""
    now = datetime.now(UTC)
    chosen = [r for r in dead_letters(store) if record_keys is None or r["record_key"] in record_keys]
    if not chosen:
        return 0
    store.append_rows("retry_queue", [{
        "run_id": r["run_id"], "recorded_at": now, "record_key": r["record_key"], "ledger_id": r["ledger_id"],
        "state": QUEUED, "attempts": 0, "next_attempt_at": now, "last_error": r["last_error"], "payload": r["payload"],
    } for r in chosen], RETRY_QUEUE, commit_metadata={"stage": "dlq_redrive"})
    store.append_rows("dead_letter", [{**r, "recorded_at": now, "state": "redriven"} for r in chosen], DEAD_LETTER,
                      commit_metadata={"stage": "dlq_redrive"})
    return len(chosen)


def describe(result: DeleteResult) -> str:
    """One line per record, for `sweeper delete --from-json` and the logs."""
    where = result.zk_path or (f"s3://{result.s3_bucket}/{','.join(result.s3_keys)}" if result.s3_bucket else "")
    error = f" error={result.error}" if result.error else ""
    return (f"{result.outcome:<13} ledger={result.ledger_id} type={result.ledger_type} "
            f"component={result.component} {where} attempt={result.attempt} {result.detail}{error}")

