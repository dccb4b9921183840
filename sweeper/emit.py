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
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from sweeper import pending_delete, runs
from sweeper.config import SweeperConfig, SystemTopicConfig
from sweeper.errors import Refused
from sweeper.spark import task_error
from sweeper.system_topic import (
    BrokerSettings,
    SystemTopicError,
    describe_client_error,
    ensure_topic,
    open_client,
    partition_for,
    partition_topic,
)
from sweeper.table_schemas import EMITTED
from sweeper.tables import TableStore
from sweeper.vocabulary import CANDIDATE

log = logging.getLogger(__name__)

PUBLISHED = "published"
ALREADY_PUBLISHED = "already_published"
REFUSED_OVERSIZE = "refused_oversize"

# (partition, sequence id, message id, producer name, payload, status) per message a task handled.
SlotRow = tuple[int, int, str | None, str, bytes, str]


class EmitRefused(Refused):
    """Nothing was emitted on purpose: the run is not reconciled, or the topic is not as configured."""


class EmitFailed(RuntimeError):
    """Sending failed; nothing is recorded in `emitted`, and a rerun resends only what the broker lacks."""


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


@dataclass
class EmitResult:
    run_id: str
    counts: dict[str, int]
    duration_s: float

    @property
    def records_per_second(self) -> float:
        return self.counts.get("published", 0) / self.duration_s if self.duration_s else 0.0


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
              producer: ProducerSettings) -> list[SlotRow]:
    """One producer sends one slot's messages.

    Returns a SlotRow per message (message id None when the broker already held it or the record is
    over `max_record_bytes`, which is never sent: a broker would refuse it on every retry, and the
    rest of the run must not wait on it). Raises EmitFailed unless every message sent was acknowledged.
    """
    import pulsar

    if not messages:
        return []
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
        for message in messages:
            if message.sequence_id <= last_persisted or message.sequence_id in oversize:
                continue
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
                   "s3_key", "offload_uuid"]
_RECORDS_DDL = ("record_key string, ledger_id long, ledger_type string, component string, topic_name string, "
                "topic_partition int, record string, refused string")


def _offload_targets(store: TableStore, run_id: str) -> dict[str, tuple[str, str]]:
    """bucket -> (region, endpoint) of the run's offload contexts (a handful of buckets)."""
    targets: dict[str, tuple[str, str]] = {}
    if store.exists("ml_ledgers"):
        for r in (store.read("ml_ledgers").where((F.col("run_id") == run_id) & F.col("offload_bucket").isNotNull())
                  .select("offload_bucket", "offload_region", "offload_endpoint").distinct().collect()):
            targets[r["offload_bucket"]] = (r["offload_region"] or "", r["offload_endpoint"] or "")
    return targets


def _candidates(store: TableStore, run_id: str) -> DataFrame:
    return store.read("orphans").where((F.col("run_id") == run_id) & (F.col("status") == CANDIDATE)) \
        .select(*_ORPHAN_COLUMNS)


def candidate_records(spark: SparkSession, store: TableStore, run_id: str) -> list[dict[str, Any]]:
    """The run's records in this process (tests and small tools; run_emit builds them in Spark tasks)."""
    rows = _candidates(store, run_id).toArrow().to_pylist()
    return pending_delete.records_for_orphans(rows, _offload_targets(store, run_id))


def record_rows(spark: SparkSession, store: TableStore, run_id: str, partitions: int) -> DataFrame:
    """The run's candidates as records, computed by the executors: one row per record with its record key and
    topic partition, the record as JSON, and `refused` (why our delete stage would refuse it) or null."""
    targets = _offload_targets(store, run_id)
    parallelism = max(1, spark.sparkContext.defaultParallelism)

    def to_records(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # All of a ledger's rows are in this task (partitioned by ledger id): an offloaded copy's data
        # and index keys become one record.
        rows = [row for batch in batches for row in batch.to_pylist()]
        out = []
        for record in pending_delete.records_for_orphans(rows, targets):
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
                        "record": json.dumps(record, sort_keys=True), "refused": refused})
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=_RECORDS_ARROW)

    return _candidates(store, run_id).repartition(parallelism, "ledger_id").mapInArrow(to_records, _RECORDS_DDL)


def planned_records(records: DataFrame, records_per_producer: int) -> DataFrame:
    """The valid records of `record_rows` with their sequence id (rank by key within the topic partition) and
    producer slot."""
    rank = F.row_number().over(Window.partitionBy("topic_partition").orderBy("record_key")) - 1
    return (records.where(F.col("refused").isNull()).drop("refused")
            .withColumn("sequence_id", rank.cast("long"))
            .withColumn("producer_slot", F.floor(F.col("sequence_id") / records_per_producer).cast("int")))


_RECORDS_ARROW = pa.schema([("record_key", pa.string()), ("ledger_id", pa.int64()), ("ledger_type", pa.string()),
                            ("component", pa.string()), ("topic_name", pa.string()), ("topic_partition", pa.int32()),
                            ("record", pa.string()), ("refused", pa.string())])


def check_reconciled(store: TableStore, run_id: str) -> None:
    runs.require(store, run_id, "reconcile", EmitRefused, f"run {run_id} has no successful reconcile: nothing to emit")


def already_emitted(store: TableStore, run_id: str) -> set[str]:
    if not store.exists("emitted"):
        return set()
    return {r["record_key"] for r in store.read("emitted").where(F.col("run_id") == run_id)
            .select("record_key").distinct().collect()}


def run_emit(spark: SparkSession, config: SweeperConfig, store: TableStore, run_id: str) -> EmitResult:
    t0 = time.monotonic()
    cfg = config.system_topic
    check_reconciled(store, run_id)
    try:
        broker = BrokerSettings.from_config(cfg)
        if not store.exists("orphans"):
            return EmitResult(run_id, {"records": 0, "ledger_records": 0, "offload_records": 0, "published": 0,
                                       "already_published": 0}, time.monotonic() - t0)
        # The topic's partition count decides the plan; an empty run asks nothing of the broker.
        if _candidates(store, run_id).limit(1).count() == 0:
            return EmitResult(run_id, {"records": 0, "ledger_records": 0, "offload_records": 0, "published": 0,
                                       "already_published": 0}, time.monotonic() - t0)
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
                                   partitions, t0)
        finally:
            planned.unpersist()
    finally:
        rows.unpersist()
    result.counts["refused_invalid"] = refused_count
    return result


def _emit_planned(spark: SparkSession, store: TableStore, run_id: str, planned: DataFrame, broker: BrokerSettings,
                  producer: ProducerSettings, partitions: int, t0: float) -> EmitResult:
    totals = planned.agg(F.count(F.lit(1)).alias("records"),
                         F.sum(F.when(F.col("ledger_type") == "LEDGER", 1).otherwise(0)).alias("ledger_records")).head()
    records = int(totals["records"] or 0)
    counts: dict[str, int] = {"records": records, "ledger_records": int(totals["ledger_records"] or 0)}
    counts["offload_records"] = records - counts["ledger_records"]
    todo = planned
    if store.exists("emitted"):
        done = store.read("emitted").where(F.col("run_id") == run_id).select("record_key").distinct()
        todo = planned.join(done, "record_key", "left_anti")
    # One Spark partition per producer slot (partition, slot): each task is exactly one producer.
    slots = sorted((r["topic_partition"], r["producer_slot"]) for r in
                   todo.select("topic_partition", "producer_slot").distinct().collect())
    counts["previously_emitted"] = records - (todo.count() if slots else 0)
    counts["partitions"] = partitions
    if not slots:
        return EmitResult(run_id, {**counts, "published": 0, "already_published": 0}, time.monotonic() - t0)
    slot_index = {slot: i for i, slot in enumerate(slots)}
    emitted_at = datetime.now(UTC)

    def send_partition(items: Iterator[tuple[int, Any]]) -> Iterator[tuple]:
        rows = [row for _, row in items]
        if not rows:
            return
        messages = [PlannedMessage(
            record_key=r["record_key"], ledger_id=r["ledger_id"], ledger_type=r["ledger_type"],
            component=r["component"], topic_name=r["topic_name"], topic_partition=r["topic_partition"],
            producer_slot=r["producer_slot"], sequence_id=r["sequence_id"], record=json.loads(r["record"]))
            for r in rows]
        by_seq = {m.sequence_id: m for m in messages}
        for partition, seq, message_id, name, payload, status in send_slot(messages, broker, producer):
            m = by_seq[seq]
            yield (run_id, emitted_at, m.record_key, m.ledger_id, m.ledger_type, m.component, m.topic_name, partition,
                   name, seq, message_id, status, payload)

    by_slot = (todo.select("record_key", "ledger_id", "ledger_type", "component", "topic_name", "topic_partition",
                           "producer_slot", "sequence_id", "record").rdd
               .map(lambda r: (slot_index[(r["topic_partition"], r["producer_slot"])], r))
               .partitionBy(len(slots), lambda index: index))
    sending = time.monotonic()
    try:
        # One job: the producer tasks write what they sent to `emitted` themselves (one Delta commit).
        store.append("emitted", spark.createDataFrame(by_slot.mapPartitions(send_partition), EMITTED), EMITTED,
                     commit_metadata={"run_id": run_id, "stage": "emit"})
    except Exception as exc:
        raise EmitFailed(_task_error(exc)) from exc
    counts["send_ms"] = int((time.monotonic() - sending) * 1000)
    sent = (store.read("emitted").where((F.col("run_id") == run_id) & (F.col("emitted_at") == F.lit(emitted_at)))
            .groupBy("status").agg(F.count(F.lit(1)).alias("n")).collect())
    by_status = {r["status"]: int(r["n"]) for r in sent}
    counts["published"] = by_status.get(PUBLISHED, 0)
    counts["already_published"] = by_status.get(ALREADY_PUBLISHED, 0)
    counts["refused_oversize"] = by_status.get(REFUSED_OVERSIZE, 0)
    counts["producers"] = len(slots)
    return EmitResult(run_id, counts, time.monotonic() - t0)


def _task_error(exc: Exception) -> str:
    return task_error(exc, ("EmitFailed", "SystemTopicError"))
