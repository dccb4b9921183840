"""The emit action (PIP-186 phase 1, "mark"): a run's candidate orphans onto the system topic.

Spark tasks turn candidates into `PendingDeleteLedgerInfo` records and give each a fixed place:
a partition (Java's string hash of the ledger id, as a keyed Java producer would route it), a
producer (one per `records_per_producer` records of a partition, named after the run) and a
sequence id (the record's rank by key within its partition). Spark tasks then each open one
producer and send their records in batches with a bounded number in flight, and write what they
sent to `emitted` in one Delta commit. Because names and sequence ids are the same on every
attempt, a retried task or a rerun stage resends nothing the broker already holds: the producer
learns the last sequence id the broker persisted for its name and skips up to it, and the broker's
deduplication drops any resend that races it. The driver only holds counts and the list of
producer slots: nothing in proportion to the candidates (`plan_messages` is the same plan for a
list in one process, used by the tests).

Durable as it goes (issue 22): each task commits its producer's `emitted` rows itself as soon as the broker
has acknowledged them, after an `intent` row in `emit_journal` naming the partition, producer and sequence ids
it is about to send. The driver opens the attempt (`started`) and closes it once every task has recorded. An
attempt stopped by SIGINT or SIGTERM is recorded `interrupted` on its way out; one killed outright is found
unclosed by the next emit of the run, which records it `interrupted` with what the journal and `emitted`
show, then re-sends only what `emitted` lacks (the broker deduplicates what it already holds, so the records
a killed task sent but never recorded are recorded then, as `already_published`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from kazoo.exceptions import NoAuthError
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from sweeper import journal, runs
from sweeper.broker.errors import SystemTopicError
from sweeper.broker.system_topic import (
    BrokerSettings,
    describe_client_error,
    ensure_topic,
    open_client,
    partition_for,
    partition_topic,
)
from sweeper.codecs import pending_delete
from sweeper.config import SweeperConfig, SystemTopicConfig
from sweeper.connections import Connections
from sweeper.emit.carry import CARRIED_NAMES, CarriedIndex, row_targets, uncarried_offload_targets
from sweeper.emit.errors import EmitFailed, EmitRefused
from sweeper.errors import LockLost, caused_by_interrupt
from sweeper.run_lock import LOCKS_DIR, RunLock
from sweeper.spark import task_error
from sweeper.table_schemas import CARRIED_COLUMNS, EMIT_JOURNAL, EMITTED
from sweeper.tables import TableStore, TaskAppender
from sweeper.vocabulary import CANDIDATE
from sweeper.zk import client as zkutil

log = logging.getLogger(__name__)

JOURNAL_TABLE = journal.EMIT.table
STARTED, INTENT, CLOSED = journal.STARTED, journal.INTENT, journal.CLOSED
# The emit's run lock, beside the delete's: one emit at a time, and a stopped emitter that wakes up publishes nothing
# more once another holds it (sweeper.run_lock).
LOCK_NAME = "emit"
# How many messages a producer sends between two looks at the run lock's fence.
FENCE_EVERY_MESSAGES = 1000
LOCK_LOST_WORDS = "the run lost its lock"
# Tests only: seconds a producer task waits between the broker's acknowledgements and its `emitted` commit, so a
# kill lands where records are on the topic but not yet on record (what the journal's intents are for).
FAILPOINT_BEFORE_RECORDING_ENV = "SWEEPER_FAILPOINT_EMIT_BEFORE_RECORDING_S"

PUBLISHED = "published"
ALREADY_PUBLISHED = "already_published"
REFUSED_OVERSIZE = "refused_oversize"

# (partition, sequence id, message id, producer name, payload, status) per message a task handled.
SlotRow = tuple[int, int, str | None, str, bytes, str]


@dataclass(frozen=True)
class PlannedMessage:
    record_key: str
    ledger_id: int
    ledger_type: str
    component: str
    topic_name: str | None
    topic_partition: int
    producer_slot: int
    sequence_id: int
    record: dict[str, Any]

    @property
    def payload(self) -> bytes:
        """Encoded where it is sent: Avro encoding is the costliest step of planning, so tasks share it."""
        return pending_delete.encode(self.record)


@dataclass(frozen=True)
class ProducerSettings:
    topic: str
    run_id: str
    batch_max_messages: int
    batch_max_bytes: int
    max_pending_messages: int
    send_timeout_ms: int
    max_record_bytes: int

    @classmethod
    def from_config(cls, cfg: SystemTopicConfig, run_id: str) -> ProducerSettings:
        return cls(cfg.topic, run_id, cfg.batch_max_messages, cfg.batch_max_bytes, cfg.max_pending_messages,
                   cfg.send_timeout_ms, cfg.max_record_bytes)

    def producer_name(self, partition: int, slot: int) -> str:
        return f"ledger-sweeper-{self.run_id}-p{partition}-s{slot}"


@dataclass(frozen=True)
class EmitCounts(runs.StageCounts):
    """The run's candidate records, what this attempt sent and how the broker answered."""

    records: int = 0
    ledger_records: int = 0
    offload_records: int = 0
    previously_emitted: int = 0  # recorded in `emitted` by an earlier attempt of the run: not sent again
    published: int = 0
    already_published: int = 0  # the broker deduplicated them: a killed attempt had sent them
    refused_oversize: int = 0
    refused_invalid: int = 0
    partitions: int = 0
    producers: int = 0
    send_ms: int = 0
    interrupted_attempts_folded: int = 0
    # The `interrupted` row of a stopped attempt itself (fold_interrupted).
    planned: int = 0
    recorded: int = 0
    producers_started: int = 0
    producers_unrecorded: int = 0
    may_be_on_topic_unrecorded: int = 0


@dataclass
class EmitResult:
    run_id: str
    counts: EmitCounts
    duration_s: float
    topic: str = ""  # where the records went, so the run's report names it from the result alone

    @property
    def records_per_second(self) -> float:
        return self.counts.published / self.duration_s if self.duration_s else 0.0


def plan_messages(records: Iterable[dict[str, Any]], partitions: int,
                  records_per_producer: int) -> list[PlannedMessage]:
    """Records in a fixed order with a partition, a producer slot and a sequence id each."""
    by_partition: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for record in records:
        # What our own delete stage would refuse must never reach the topic (run_emit filters these out).
        pending_delete.validate(record)
        key = pending_delete.record_key(record)
        partition = partition_for(str(record["ledgerId"]), partitions)
        by_partition.setdefault(partition, []).append((key, record))
    planned: list[PlannedMessage] = []
    for partition, items in sorted(by_partition.items()):
        items.sort(key=lambda kv: kv[0])
        for seq, (key, record) in enumerate(items):
            planned.append(PlannedMessage(
                record_key=key, ledger_id=int(record["ledgerId"]), ledger_type=record["ledgerType"],
                component=record["ledgerComponent"], topic_name=record.get("topicName"), topic_partition=partition,
                producer_slot=seq // records_per_producer, sequence_id=seq, record=record))
    return planned


def _preencoded_avro_schema() -> Any:
    """The topic's Avro schema for a producer whose payloads we encoded ourselves (and kept for `emitted`)."""
    import json

    from pulsar.schema import AvroSchema

    class Preencoded(AvroSchema):  # type: ignore[misc]
        def encode(self, obj: Any) -> bytes:
            return bytes(obj)

    return Preencoded(None, schema_definition=json.loads(pending_delete.schema_json()))


def send_slot(messages: list[PlannedMessage], broker: BrokerSettings,
              producer: ProducerSettings, still_holding: Callable[[], str | None] | None = None) -> list[SlotRow]:
    """One producer sends one slot's messages.

    Returns a SlotRow per message (message id None when the broker already held it or the record is
    over `max_record_bytes`, which is never sent: a broker would refuse it on every retry, and the
    rest of the run must not wait on it). Raises EmitFailed unless every message sent was acknowledged.
    `still_holding()` says why the run lost its lock (or None): asked before the producer starts and every
    FENCE_EVERY_MESSAGES sends, and a loss stops the sending (EmitFailed, after what was sent is answered).
    """
    import pulsar

    if not messages:
        return []
    lost = still_holding() if still_holding is not None else None
    if lost is not None:
        raise EmitFailed(f"not sent: {LOCK_LOST_WORDS}: {lost}")
    messages = sorted(messages, key=lambda m: m.sequence_id)
    partition, slot = messages[0].topic_partition, messages[0].producer_slot
    name = producer.producer_name(partition, slot)
    receipts: dict[int, str] = {}
    errors: list[str] = []
    done = threading.Condition()
    client = open_client(broker)
    try:
        try:
            sender = client.create_producer(
                partition_topic(producer.topic, partition), producer_name=name, schema=_preencoded_avro_schema(),
                batching_enabled=True, batching_max_messages=producer.batch_max_messages,
                batching_max_allowed_size_in_bytes=producer.batch_max_bytes,
                batching_max_publish_delay_ms=5, max_pending_messages=producer.max_pending_messages,
                block_if_queue_full=True, send_timeout_millis=producer.send_timeout_ms)
        except pulsar.PulsarException as exc:
            raise EmitFailed(describe_client_error(exc, broker)) from exc
        last_persisted = sender.last_sequence_id()
        pending = 0

        def on_receipt(seq: int) -> Any:
            def callback(result: Any, message_id: Any) -> None:
                nonlocal pending
                with done:
                    if result == pulsar.Result.Ok:
                        receipts[seq] = f"{message_id.ledger_id()}:{message_id.entry_id()}:{message_id.batch_index()}"
                    else:
                        errors.append(f"sequence {seq}: {result}")
                    pending -= 1
                    done.notify_all()
            return callback

        payloads = {m.sequence_id: m.payload for m in messages}
        oversize = {seq for seq, payload in payloads.items() if len(payload) > producer.max_record_bytes}
        sends = 0
        for message in messages:
            if message.sequence_id <= last_persisted or message.sequence_id in oversize:
                continue
            sends += 1
            if still_holding is not None and sends % FENCE_EVERY_MESSAGES == 0:
                lost = still_holding()
                if lost is not None:
                    errors.append(f"stopped sending: {LOCK_LOST_WORDS}: {lost}")
                    break
            with done:
                pending += 1
            sender.send_async(payloads[message.sequence_id], on_receipt(message.sequence_id),
                              partition_key=str(message.ledger_id), sequence_id=message.sequence_id)
        sender.flush()
        deadline = time.monotonic() + producer.send_timeout_ms / 1000 + 5
        with done:
            while pending and time.monotonic() < deadline:
                done.wait(0.1)
        if errors or pending:
            raise EmitFailed(f"producer {name}: {len(errors)} sends failed, {pending} unanswered; first: "
                             f"{errors[0] if errors else 'timeout'}")
        sender.close()
    finally:
        client.close()
    return [(m.topic_partition, m.sequence_id, receipts.get(m.sequence_id), name, payloads[m.sequence_id],
             REFUSED_OVERSIZE if m.sequence_id in oversize else
             PUBLISHED if m.sequence_id in receipts else ALREADY_PUBLISHED) for m in messages]


_ORPHAN_COLUMNS = ["run_id", "object_type", "ledger_id", "status", "reason", "component", "tenant", "namespace",
                   "topic", "managed_ledger", "cursor", "schema_id", "bucket_key", "zk_path", "zk_version", "s3_bucket",
                   "s3_key", "offload_uuid", *CARRIED_NAMES]
# A record, and what its orphan rows carry for `emitted` (sweeper.emit.carry).
_RECORDS = StructType([StructField("record_key", StringType()), StructField("ledger_id", LongType()),
                       StructField("ledger_type", StringType()), StructField("component", StringType()),
                       StructField("topic_name", StringType()), StructField("topic_partition", IntegerType()),
                       StructField("record", StringType()), StructField("refused", StringType()),
                       *(StructField(name, dtype) for name, dtype in CARRIED_COLUMNS)])


def _candidates(store: TableStore, run_id: str) -> DataFrame:
    return store.read("orphans", where={"run_id": run_id, "status": CANDIDATE}) \
        .select(*_ORPHAN_COLUMNS)


def candidate_records(spark: SparkSession, store: TableStore, run_id: str) -> list[dict[str, Any]]:
    """The run's records in this process (tests and small tools; run_emit builds them in Spark tasks)."""
    rows = _candidates(store, run_id).toArrow().to_pylist()
    targets = uncarried_offload_targets(store, run_id)
    return pending_delete.records_for_orphans(rows, row_targets(rows) if targets is None else targets)


def record_rows(spark: SparkSession, store: TableStore, run_id: str, partitions: int) -> DataFrame:
    """The run's candidates as records, computed by the executors: one row per record with its record key and
    topic partition, the record as JSON, `refused` (why our delete stage would refuse it) or null, and what its orphan
    rows carry for `emitted`."""
    # Null: the orphan rows carry their buckets' regions and endpoints, each task takes them from its own rows.
    uncarried = uncarried_offload_targets(store, run_id)
    parallelism = max(1, spark.sparkContext.defaultParallelism)

    def to_records(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # All of a ledger's rows are in this task (partitioned by ledger id): an offloaded copy's data
        # and index keys become one record.
        rows = [row for batch in batches for row in batch.to_pylist()]
        out = []
        carried = CarriedIndex(rows)
        for record in pending_delete.records_for_orphans(rows, row_targets(rows) if uncarried is None else uncarried):
            # What our own delete stage would refuse never reaches the topic; it is counted, not fatal.
            refused = None
            try:
                pending_delete.validate(record)
            except pending_delete.InvalidPendingDelete as exc:
                refused = f"{exc.kind}: {exc}"
            out.append({"record_key": pending_delete.record_key(record), "ledger_id": int(record["ledgerId"]),
                        "ledger_type": record["ledgerType"], "component": record["ledgerComponent"],
                        "topic_name": record.get("topicName"),
                        "topic_partition": partition_for(str(record["ledgerId"]), partitions),
                        "record": json.dumps(record, sort_keys=True), "refused": refused, **carried.of(record)})
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=records_arrow)

    from pyspark.sql.pandas.types import to_arrow_schema

    records_arrow = to_arrow_schema(_RECORDS)
    return _candidates(store, run_id).repartition(parallelism, "ledger_id").mapInArrow(to_records, _RECORDS)


def planned_records(records: DataFrame, records_per_producer: int) -> DataFrame:
    """The valid records of `record_rows` with their sequence id (rank by key within the topic partition) and
    producer slot."""
    rank = F.row_number().over(Window.partitionBy("topic_partition").orderBy("record_key")) - 1
    return (records.where(F.col("refused").isNull()).drop("refused")
            .withColumn("sequence_id", rank.cast("long"))
            .withColumn("producer_slot", F.floor(F.col("sequence_id") / records_per_producer).cast("int")))


def check_reconciled(store: TableStore, run_id: str) -> None:
    """The run was reconciled, and its gates passed: a run reconciled with --skip-gates is for audits only."""
    runs.require(store, run_id, "reconcile", EmitRefused, f"run {run_id} has no successful reconcile: nothing to emit")
    runs.require_gated(store, run_id, EmitRefused)


def already_emitted(store: TableStore, run_id: str) -> set[str]:
    if not store.exists("emitted"):
        return set()
    return {r["record_key"] for r in store.read("emitted", where={"run_id": run_id})
            .select("record_key").distinct().collect()}


@dataclass(frozen=True)
class EmitSettings:
    """What the emit reads of the config, narrowed once (issue 22's stage shape): the topic and its broker, and its
    run lock (beside [delete] lock_path, in BookKeeper's store, as the retention repair's)."""

    system_topic: SystemTopicConfig
    connections: Connections
    config_hash: str
    lock_path: str = f"{LOCKS_DIR}/{LOCK_NAME}"
    session_timeout_s: float = 15.0
    recorded_in_runs: bool = False  # under the stage wrapper: its journal says a `runs` row follows its close

    @classmethod
    def from_config(cls, config: SweeperConfig, recorded_in_runs: bool = False) -> EmitSettings:
        return cls(config.system_topic, Connections.from_config(config), config.hash(),
                   f"{config.delete.lock_path.rsplit('/', 1)[0]}/{LOCK_NAME}", config.bookkeeper.session_timeout_s,
                   recorded_in_runs)

    def hash(self) -> str:
        return self.config_hash


def run_emit(spark: SparkSession, config: SweeperConfig, store: TableStore, run_id: str) -> EmitResult:
    return run(spark, store, run_id, EmitSettings.from_config(config))


def run(spark: SparkSession, store: TableStore, run_id: str, settings: EmitSettings) -> EmitResult:
    """The run's candidates as records on the system topic; what the broker acknowledged is in `emitted`. An
    interrupt is recorded by the stage's wrapper through `record_interrupt` (pipeline.emit_stage)."""
    return _run_emit(spark, settings, store, run_id)


def interrupts(store: TableStore, run_id: str) -> journal.FoldedNow:
    """How an emit stopped by SIGINT or SIGTERM is recorded: from its journal and `emitted` once it had started
    sending (`fold_interrupted`), else a plain row (nothing was sent)."""
    return journal.FoldedNow(
        lambda started: fold_interrupted(store, run_id, by="its own interrupt handler (SIGINT or SIGTERM)"),
        "interrupted during emit before anything was sent; re-run emit")


class EmitRunLock(RunLock):
    what, command = "emit", "emit"


def _run_emit(spark: SparkSession, settings: EmitSettings, store: TableStore, run_id: str) -> EmitResult:
    check_reconciled(store, run_id)
    client = settings.connections.bookkeeper.connect()
    lock = EmitRunLock(client, settings.lock_path, run_id=run_id,
                       wait_for_dead_local_holder_s=settings.session_timeout_s + 2.0, log=print)
    try:
        try:
            lock.acquire()
        except NoAuthError as exc:
            raise EmitRefused(f"the sweeper may not create its emit lock {settings.lock_path} (ZooKeeper NoAuth): make "
                              "its parent writable by the sweeper, or set [delete] lock_path") from exc
        return _emit_holding(spark, settings, store, run_id, lock)
    finally:
        lock.release()
        zkutil.close(client)


def _emit_holding(spark: SparkSession, settings: EmitSettings, store: TableStore, run_id: str,
                  lock: EmitRunLock) -> EmitResult:
    t0 = time.monotonic()
    cfg = settings.system_topic
    # Under the lock, an attempt the journal shows unclosed has stopped (a kill, or a lost lock).
    folded = fold_interrupted(store, run_id, by=f"the emit started at {datetime.now(UTC).isoformat()}")
    try:
        broker = settings.connections.broker()
        if not store.exists("orphans"):
            return EmitResult(run_id, EmitCounts(), time.monotonic() - t0, cfg.topic)
        # The topic's partition count decides the plan; an empty run asks nothing of the broker.
        if _candidates(store, run_id).limit(1).count() == 0:
            return EmitResult(run_id, EmitCounts(), time.monotonic() - t0, cfg.topic)
        partitions = ensure_topic(cfg, broker)
    except SystemTopicError as exc:
        raise EmitRefused(str(exc)) from exc
    rows = record_rows(spark, store, run_id, partitions).persist()
    try:
        refused = rows.where(F.col("refused").isNotNull())
        refused_count = refused.count()
        for r in refused.select("ledger_id", "ledger_type", "refused").limit(20).collect():
            log.warning("emit: not sending ledger %s (%s): %s", r["ledger_id"], r["ledger_type"], r["refused"])
        planned = planned_records(rows, cfg.records_per_producer).persist()
        try:
            result = _emit_planned(spark, store, run_id, planned, broker, ProducerSettings.from_config(cfg, run_id),
                                   partitions, t0, lock, settings)
        finally:
            planned.unpersist()
    finally:
        rows.unpersist()
    result.counts = result.counts.with_counts(refused_invalid=refused_count, interrupted_attempts_folded=folded)
    return result


def _emit_planned(spark: SparkSession, store: TableStore, run_id: str, planned: DataFrame, broker: BrokerSettings,
                  producer: ProducerSettings, partitions: int, t0: float, lock: EmitRunLock,
                  settings: EmitSettings) -> EmitResult:
    totals = planned.agg(F.count(F.lit(1)).alias("records"),
                         F.sum(F.when(F.col("ledger_type") == "LEDGER", 1).otherwise(0)).alias("ledger_records")).head()
    records = int(totals["records"] or 0)
    counts: dict[str, int] = {"records": records, "ledger_records": int(totals["ledger_records"] or 0)}
    counts["offload_records"] = records - counts["ledger_records"]
    todo = planned
    if store.exists("emitted"):
        done = store.read("emitted", where={"run_id": run_id}).select("record_key").distinct()
        todo = planned.join(done, "record_key", "left_anti")
    # One Spark partition per producer slot (partition, slot): each task is exactly one producer.
    slots = sorted((r["topic_partition"], r["producer_slot"]) for r in
                   todo.select("topic_partition", "producer_slot").distinct().collect())
    counts["previously_emitted"] = records - (todo.count() if slots else 0)
    counts["partitions"] = partitions
    if not slots:
        return EmitResult(run_id, EmitCounts.from_row(counts), time.monotonic() - t0, settings.system_topic.topic)
    slot_index = {slot: i for i, slot in enumerate(slots)}
    emitted_at = datetime.now(UTC)
    emit_journal = EmitJournal(store.task_appender(JOURNAL_TABLE, EMIT_JOURNAL), run_id, emitted_at.isoformat(),
                               emitted_at, settings.recorded_in_runs)
    recorder = store.task_appender("emitted", EMITTED)
    columns = [name for name in EMITTED.fieldNames() if name not in CARRIED_NAMES]
    pause_s = float(os.environ.get(FAILPOINT_BEFORE_RECORDING_ENV) or 0)
    fence, metadata = lock.fence, settings.connections.bookkeeper

    def send_partition(items: Iterator[tuple[int, Any]]) -> Iterator[tuple[str, int]]:
        rows = [row for _, row in items]
        if not rows:
            return
        messages = [PlannedMessage(
            record_key=r["record_key"], ledger_id=r["ledger_id"], ledger_type=r["ledger_type"],
            component=r["component"], topic_name=r["topic_name"], topic_partition=r["topic_partition"],
            producer_slot=r["producer_slot"], sequence_id=r["sequence_id"], record=json.loads(r["record"]))
            for r in rows]
        by_seq = {m.sequence_id: m for m in messages}
        carried = {r["sequence_id"]: {name: _plain(r[name]) for name in CARRIED_NAMES} for r in rows}
        first = messages[0]
        sequence_ids = [m.sequence_id for m in messages]
        # On record before anything is sent: what this producer may put on the topic, should the task die.
        emit_journal.intent(first.topic_partition, producer.producer_name(first.topic_partition, first.producer_slot),
                       min(sequence_ids), max(sequence_ids), len(messages))
        with metadata.session() as zk:
            # The run lock's fence, read before the producer starts and every FENCE_EVERY_MESSAGES sends: a task of
            # an emit whose lock was lost (its driver's session expired, another emit took it) publishes no more.
            still_holding = (lambda: fence.verify(zk)) if fence is not None else None
            sent = _send_with_retries(messages, broker, producer, still_holding)
            if pause_s:
                time.sleep(pause_s)
            # And before its record: the next holder may have recorded these very records already (it re-sends
            # under the same producer names and sequence ids), and a record is written once.
            lost = still_holding() if still_holding is not None else None
            if lost is not None:
                raise EmitFailed(f"not recorded: {LOCK_LOST_WORDS}: {lost}")
        recorder.append([dict(zip(columns, (run_id, emitted_at, by_seq[seq].record_key, by_seq[seq].ledger_id,
                                            by_seq[seq].ledger_type, by_seq[seq].component, by_seq[seq].topic_name,
                                            partition, name, seq, message_id, status, payload), strict=True),
                               **carried[seq])
                         for partition, seq, message_id, name, payload, status in sent])
        for *_, status in sent:
            yield status, 1

    by_slot = (todo.select("record_key", "ledger_id", "ledger_type", "component", "topic_name", "topic_partition",
                           "producer_slot", "sequence_id", "record", *CARRIED_NAMES).rdd
               .map(lambda r: (slot_index[(r["topic_partition"], r["producer_slot"])], r))
               .partitionBy(len(slots), lambda index: index))
    sending = time.monotonic()
    emit_journal.started(counts["records"] - counts["previously_emitted"])
    try:
        # One job: each producer task records what it sent in `emitted` itself, once the broker acknowledged it.
        by_status: dict[str, int] = dict(by_slot.mapPartitions(send_partition).reduceByKey(lambda a, b: a + b)
                                         .collect())
    except Exception as exc:
        if caused_by_interrupt(exc):
            raise  # the wrapper records it from the journal (emit.interrupts)
        error = _task_error(exc)
        _stop_if_lock_lost(lock, emit_journal)
        with contextlib.suppress(Exception):  # `runs` says failed; the journal must not read as a kill
            emit_journal.closed(f"failed: {error}"[:2000])
        raise EmitFailed(error) from exc
    _stop_if_lock_lost(lock, emit_journal)
    emit_journal.closed(f"{sum(by_status.values()):,} records recorded")
    counts["send_ms"] = int((time.monotonic() - sending) * 1000)
    counts["published"] = by_status.get(PUBLISHED, 0)
    counts["already_published"] = by_status.get(ALREADY_PUBLISHED, 0)
    counts["refused_oversize"] = by_status.get(REFUSED_OVERSIZE, 0)
    counts["producers"] = len(slots)
    return EmitResult(run_id, EmitCounts.from_row(counts), time.monotonic() - t0, settings.system_topic.topic)


# A producer that failed (a broker restarted or lost mid-send) is opened again this many times, after these waits:
# the same producer name and sequence ids, so the new producer learns what the broker persisted and sends the rest,
# and the broker's deduplication drops what raced it (issue 45). About a broker restart's worth in all.
SEND_RETRY_WAITS_S = (2.0, 5.0, 10.0, 20.0, 30.0)


def _send_with_retries(messages: list[PlannedMessage], broker: BrokerSettings, producer: ProducerSettings,
                       still_holding: Callable[[], str | None] | None,
                       sleep: Callable[[float], None] = time.sleep) -> list[SlotRow]:
    for wait in (*SEND_RETRY_WAITS_S, None):
        try:
            return send_slot(messages, broker, producer, still_holding=still_holding)
        except EmitFailed as exc:
            if wait is None or LOCK_LOST_WORDS in str(exc):
                raise
            log.warning("emit: %s; opening the producer again in %.0fs", exc, wait)
            sleep(wait)
    raise AssertionError("unreachable")


def _stop_if_lock_lost(lock: EmitRunLock, journal: EmitJournal) -> None:
    """LockLost (exit 3) when the emit cannot show it still holds its lock, before it closes its journal: what its
    producers sent is in `emitted` and its intents, and the next emit of the run folds the attempt in (one status)."""
    if lock.fence is None:
        return
    why = lock.fence.verify(lock.client)
    if why is not None:
        raise LockLost(f"the emit of run {lock.run_id} stopped publishing: {why}. What it sent is in emitted (attempt "
                       f"{journal.attempt_id}); the next emit of the run records the attempt and sends only the rest")


@dataclass(frozen=True)
class EmitJournal:
    """One emit attempt's trace in `emit_journal` (picklable: the producer tasks write their intents)."""

    appender: TaskAppender
    run_id: str
    attempt_id: str
    started_at: datetime  # also the attempt's `emitted_at`, which ties its `emitted` rows to it
    runs_row_follows: bool = False  # closed by the stage wrapper, which records the attempt in `runs` next

    def _row(self, phase: str, **values: Any) -> dict[str, Any]:
        return {"run_id": self.run_id, "attempt_id": self.attempt_id, "phase": phase,
                "at": self.started_at if phase == STARTED else datetime.now(UTC), **values}

    def started(self, records: int) -> None:
        self.appender.append([self._row(STARTED, records=records)])

    def intent(self, partition: int, producer_name: str, first: int, last: int, records: int) -> None:
        self.appender.append([self._row(INTENT, topic_partition=partition, producer_name=producer_name,
                                        first_sequence_id=first, last_sequence_id=last, records=records)])

    def closed(self, detail: str) -> None:
        self.appender.append([self._row(CLOSED, detail=journal.closed_detail(detail, self.runs_row_follows))])


def fold_interrupted(store: TableStore, run_id: str, by: str) -> int:
    """Record every unclosed emit attempt of `run_id` as `interrupted` in `runs` (counts from the journal and
    `emitted`), then close it; the number folded. Only for attempts that stopped: one emit per run at a time."""
    if not store.exists(JOURNAL_TABLE):
        return 0
    rows = store.read_arrow(JOURNAL_TABLE, where={"run_id": run_id}).to_pylist()
    closed = {r["attempt_id"] for r in rows if r["phase"] == CLOSED}
    open_attempts = sorted({r["attempt_id"] for r in rows if r["phase"] == STARTED} - closed)
    # Closed under the stage wrapper, and killed before its `runs` row: recorded now as the attempt that stopped.
    ended = {r["attempt_id"]: r
             for r in journal.unrecorded(store, "emit", (r for r in rows if r["phase"] == CLOSED))}
    open_attempts += sorted(ended)
    if not open_attempts:
        return 0
    recorded: list[dict[str, Any]] = []
    if store.exists("emitted"):
        recorded = store.read_arrow("emitted", where={"run_id": run_id},
                                    columns=["emitted_at", "producer_name", "status"]).to_pylist()
    run_rows, closing = [], []
    for attempt in open_attempts:
        mine = [r for r in rows if r["attempt_id"] == attempt]
        started = next(r for r in mine if r["phase"] == STARTED)
        intents = [r for r in mine if r["phase"] == INTENT]
        done = [r for r in recorded if r["emitted_at"] == started["at"]]
        if attempt in ended:
            last = ended[attempt]["at"]
            run_rows.append(journal.interrupted_row(
                run_id, "emit", started["at"], last,
                {"planned": int(started["records"] or 0), "recorded": len(done),
                 "published": sum(1 for r in done if r["status"] == PUBLISHED)},
                f"emit attempt {attempt} finished ({len(done):,} records recorded in emitted) and stopped before "
                f"recording its end here (recorded by {by})", store.engine))
            continue
        slots_done = {r["producer_name"] for r in done}
        unrecorded = [r for r in intents if r["producer_name"] not in slots_done]
        may_be_sent = sum(int(r["records"] or 0) for r in unrecorded)
        last = max(r["at"] for r in mine)
        counts = {"planned": int(started["records"] or 0), "recorded": len(done),  # fields of EmitCounts
                  "published": sum(1 for r in done if r["status"] == PUBLISHED),
                  "producers_started": len(intents), "producers_unrecorded": len(unrecorded),
                  "may_be_on_topic_unrecorded": may_be_sent}
        run_rows.append(journal.interrupted_row(
            run_id, "emit", started["at"], last, counts,
            f"emit attempt {attempt} stopped before it finished: {len(done):,} of {counts['planned']:,} records "
            f"recorded in emitted; {len(unrecorded):,} producers ({may_be_sent:,} records) may have sent without a "
            f"record: the next emit of the run re-sends them under the same producer names and sequence ids, the "
            f"broker deduplicates, and they are recorded (resolved by {by})", store.engine))
        closing.append({"run_id": run_id, "attempt_id": attempt, "at": datetime.now(UTC), "phase": CLOSED,
                        "detail": f"interrupted; resolved by {by}"})
    journal.record_interrupted(store, "emit", run_rows, by)
    # Closed last: killed before this, the next emit folds them again (a second `interrupted` row, nothing lost).
    store.append_rows(JOURNAL_TABLE, closing, EMIT_JOURNAL, commit_metadata={"stage": "emit", "resolved_by": by})
    return len(open_attempts)


def _plain(value: Any) -> Any:
    """A Spark Row (a struct column, say `bk_layout`) as the dict an Arrow append takes."""
    return value.asDict(recursive=True) if hasattr(value, "asDict") else value


def _task_error(exc: Exception) -> str:
    return task_error(exc, ("EmitFailed", "SystemTopicError"))
