"""The emit action (PIP-186 phase 1, "mark"): a run's candidate orphans onto the system topic.

The driver turns candidates into `PendingDeleteLedgerInfo` records and gives each a fixed place:
a partition (Java's string hash of the ledger id, as a keyed Java producer would route it), a
producer (one per `records_per_producer` records of a partition, named after the run) and a
sequence id. Spark tasks then each open one producer and send their records in batches with a
bounded number in flight. Because names and sequence ids are the same on every attempt, a retried
task or a rerun stage resends nothing the broker already holds: the producer learns the last
sequence id the broker persisted for its name and skips up to it, and the broker's deduplication
drops any resend that races it. What was acknowledged goes to `emitted` in one Delta commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sweeper import pending_delete
from sweeper.config import SweeperConfig, SystemTopicConfig
from sweeper.reconcile import CANDIDATE
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

log = logging.getLogger(__name__)

PUBLISHED = "published"
ALREADY_PUBLISHED = "already_published"
REFUSED_OVERSIZE = "refused_oversize"

# (partition, sequence id, message id, producer name, payload, status) per message a task handled.
SlotRow = tuple[int, int, str | None, str, bytes, str]


class EmitRefused(RuntimeError):
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


def candidate_records(spark: SparkSession, store: TableStore, run_id: str) -> list[dict[str, Any]]:
    orphans = store.read("orphans").where((F.col("run_id") == run_id) & (F.col("status") == CANDIDATE))
    targets: dict[str, tuple[str, str]] = {}
    if store.exists("ml_ledgers"):
        for r in (store.read("ml_ledgers").where((F.col("run_id") == run_id) & F.col("offload_bucket").isNotNull())
                  .select("offload_bucket", "offload_region", "offload_endpoint").distinct().collect()):
            targets[r["offload_bucket"]] = (r["offload_region"] or "", r["offload_endpoint"] or "")
    # Arrow, not Rows, and only the columns records use: a run can have a hundred thousand candidates.
    columns = ["run_id", "object_type", "ledger_id", "status", "reason", "component", "tenant", "namespace", "topic",
               "managed_ledger", "cursor", "schema_id", "bucket_key", "zk_path", "zk_version", "s3_bucket", "s3_key",
               "offload_uuid"]
    return pending_delete.records_for_orphans(orphans.select(*columns).toArrow().to_pylist(), targets)


def split_invalid(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """Records the delete stage would accept, and the others with why: one bad candidate never sinks the stage."""
    good, bad = [], []
    for record in records:
        try:
            pending_delete.validate(record)
        except pending_delete.InvalidPendingDelete as exc:
            bad.append((record, f"{exc.kind}: {exc}"))
        else:
            good.append(record)
    return good, bad


def check_reconciled(store: TableStore, run_id: str) -> None:
    if not store.exists("runs") or not store.read("runs").where(
            (F.col("run_id") == run_id) & (F.col("stage") == "reconcile") & (F.col("status") == "succeeded")
    ).limit(1).count():
        raise EmitRefused(f"run {run_id} has no successful reconcile: nothing to emit")


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
        records, refused = split_invalid(candidate_records(spark, store, run_id))
        counts: dict[str, int] = {"records": len(records), "ledger_records": 0, "offload_records": 0,
                                  "refused_invalid": len(refused)}
        for record, why in refused[:20]:
            log.warning("emit: not sending ledger %s (%s): %s", record.get("ledgerId"), record.get("ledgerType"), why)
        for r in records:
            counts["ledger_records" if r["ledgerType"] == "LEDGER" else "offload_records"] += 1
        if not records:
            return EmitResult(run_id, {**counts, "published": 0, "already_published": 0}, time.monotonic() - t0)
        partitions = ensure_topic(cfg, broker)
    except SystemTopicError as exc:
        raise EmitRefused(str(exc)) from exc
    planned = plan_messages(records, partitions, cfg.records_per_producer)
    done_keys = already_emitted(store, run_id)
    todo = [m for m in planned if m.record_key not in done_keys]
    counts["previously_emitted"] = len(planned) - len(todo)
    counts["partitions"] = partitions
    rows: list[dict[str, Any]] = []
    if todo:
        producer = ProducerSettings.from_config(cfg, run_id)
        emitted_at = datetime.now(UTC)
        by_slot: dict[tuple[int, int], list[PlannedMessage]] = {}
        for m in todo:
            by_slot.setdefault((m.topic_partition, m.producer_slot), []).append(m)
        # One element per Spark partition, so each task is exactly one producer and nothing is shuffled.
        slots = spark.sparkContext.parallelize(list(by_slot.values()), len(by_slot))

        def send_partition(items: Iterator[list[PlannedMessage]]) -> Iterator[SlotRow]:
            for messages in items:
                yield from send_slot(messages, broker, producer)

        sending = time.monotonic()
        try:
            acked = slots.mapPartitions(send_partition).collect()
        except Exception as exc:
            raise EmitFailed(_task_error(exc)) from exc
        counts["send_ms"] = int((time.monotonic() - sending) * 1000)
        outcome = {(row[0], row[1]): row[2:] for row in acked}
        rows = []
        for m in todo:
            message_id, name, payload, status = outcome[(m.topic_partition, m.sequence_id)]
            rows.append({
                "run_id": run_id, "emitted_at": emitted_at, "record_key": m.record_key, "ledger_id": m.ledger_id,
                "ledger_type": m.ledger_type, "component": m.component, "topic_name": m.topic_name,
                "topic_partition": m.topic_partition, "producer_name": name, "sequence_id": m.sequence_id,
                "message_id": message_id, "status": status,
                "payload": payload,
            })
        store.append_rows("emitted", rows, EMITTED, commit_metadata={"run_id": run_id, "stage": "emit"})
    counts["published"] = sum(1 for r in rows if r["status"] == PUBLISHED)
    counts["already_published"] = sum(1 for r in rows if r["status"] == ALREADY_PUBLISHED)
    counts["refused_oversize"] = sum(1 for r in rows if r["status"] == REFUSED_OVERSIZE)
    counts["producers"] = len({r["producer_name"] for r in rows})
    return EmitResult(run_id, counts, time.monotonic() - t0)


def _task_error(exc: Exception) -> str:
    return task_error(exc, ("EmitFailed", "SystemTopicError"))
