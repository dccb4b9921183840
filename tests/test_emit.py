"""Emit (PIP-186 phase 1) end to end: sandbox ZooKeeper, Spark, Delta, and the real pulsar-client
talking to the local endpoint over TCP."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro
import pytest
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxSpec
from harness.zkserver import free_port
from sweeper.broker.system_topic import BrokerSettings, partition_for, partition_topic
from sweeper.codecs import pending_delete
from sweeper.config import SweeperConfig
from sweeper.emit.errors import EmitRefused
from sweeper.emit.stage import (
    ALREADY_PUBLISHED,
    PUBLISHED,
    REFUSED_OVERSIZE,
    ProducerSettings,
    SlotRow,
    candidate_records,
    plan_messages,
    run_emit,
    send_slot,
)
from sweeper.reconcile.stage import CANDIDATE, SafetySettings, run_reconcile
from sweeper.rules.safety import CircuitBreaker
from sweeper.tables import TableStore, open_table_store
from tests.support.broker import TOPIC, Broker
from tests.support.config import BASE_CONFIG
from tests.support.gates import record_gated_reconcile
from tests.support.seeded import SeededSnapshotMaker
from tests.support.tls_certs import make_tls_files


def _reconciled(seeded_snapshot: SeededSnapshotMaker, broker: Broker, spark: SparkSession,
                topics: int = 40) -> tuple[SweeperConfig, TableStore, str]:
    _, cfg, store, run_id = seeded_snapshot(SandboxSpec(seed=3, topics=topics),
                                            system_topic=broker.config(read_in_snapshot=False))
    run_reconcile(spark, store, run_id, SafetySettings(breaker=CircuitBreaker(1.0), bookkeeper_dedicated=True))
    record_gated_reconcile(store, run_id, {}, cfg)
    return cfg, store, run_id


def _decode_all(broker: Broker) -> list[dict[str, Any]]:
    schema = broker.endpoint.schema(partition_topic(TOPIC, 0)) if broker.endpoint else None
    assert schema is not None, "the producer registered no schema"
    parsed = fastavro.parse_schema(json.loads(schema.schema_data))
    return [fastavro.schemaless_reader(io.BytesIO(m.payload), parsed) for m in broker.messages()]


def test_emitted_records_decode_and_match_candidates_one_to_one(
        seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, broker: Broker) -> None:
    cfg, store, run_id = _reconciled(seeded_snapshot, broker, spark)
    candidates = {r["ledger_id"] for r in store.read("orphans").where(
        f"run_id = '{run_id}' AND status = '{CANDIDATE}' AND object_type = 'ledger'").collect()}
    assert candidates

    result = run_emit(spark, cfg, store, run_id)

    assert result.counts.published == len(candidates) == result.counts.records
    decoded = _decode_all(broker)
    assert sorted(r["ledgerId"] for r in decoded) == sorted(candidates)  # one to one: no duplicates, none missing
    assert all(r["runId"] == run_id and r["ledgerType"] == "LEDGER" for r in decoded)
    for message in broker.messages():
        record = pending_delete.decode(message.payload)  # our validating decoder accepts every one
        assert message.key == str(record["ledgerId"])
        assert message.topic == partition_topic(TOPIC, partition_for(message.key or "", 4))
    emitted = store.read("emitted").where(f"run_id = '{run_id}'").collect()
    assert {r["ledger_id"] for r in emitted} == candidates
    assert all(r["status"] == PUBLISHED and r["message_id"] for r in emitted)
    # Each producer task commits its own rows once the broker acknowledged them (issue 22), after the empty commit
    # that creates the table: a kill leaves on record every producer that finished.
    assert len(store.history("emitted")) == 1 + result.counts.producers


def test_rerun_and_killed_task_publish_no_duplicates(
        seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, broker: Broker) -> None:
    cfg, store, run_id = _reconciled(seeded_snapshot, broker, spark)
    records = candidate_records(spark, store, run_id)
    planned = plan_messages(records, 4, cfg.system_topic.records_per_producer)
    # A task that died after sending part of its slot, before anything reached `emitted`.
    first_slot = [m for m in planned if (m.topic_partition, m.producer_slot) == (planned[0].topic_partition, 0)]
    half = first_slot[: max(1, len(first_slot) // 2)]
    send_slot(half, BrokerSettings.from_config(cfg.system_topic),
              ProducerSettings.from_config(cfg.system_topic, run_id))
    assert len(broker.messages()) == len(half)

    rerun = run_emit(spark, cfg, store, run_id)
    assert rerun.counts.already_published == len(half)
    assert rerun.counts.published == len(planned) - len(half)
    keys = [pending_delete.record_key(r) for r in _decode_all(broker)]
    assert sorted(keys) == sorted(m.record_key for m in planned)

    # A rerun after a committed stage sends nothing at all.
    again = run_emit(spark, cfg, store, run_id)
    assert again.counts.previously_emitted == len(planned) and again.counts.published == 0
    assert len(broker.messages()) == len(planned)
    statuses = [r["status"] for r in store.read("emitted").where(f"run_id = '{run_id}'").collect()]
    assert sorted(statuses) == sorted([ALREADY_PUBLISHED] * len(half) + [PUBLISHED] * (len(planned) - len(half)))


def _synthetic_records(n: int) -> list[dict[str, Any]]:
    return [{"topicName": "persistent://t/ns/topic", "ledgerComponent": "MANAGED_LEDGER", "ledgerType": "LEDGER",
             "ledgerId": 1_000_000 + i, "cursorName": None, "schemaId": None, "offloadContext": None,
             "properties": {}, "reason": "dropped_from_ledger_list", "runId": "r-restart"} for i in range(n)]


@pytest.mark.integration  # a broker of its own
def test_broker_restart_mid_emit_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "pulsar").start()
    planned = [m for m in plan_messages(_synthetic_records(20_000), 1, 100_000)]
    settings = BASE_CONFIG.replace(system_topic=broker.config(batch_max_messages=20, max_pending_messages=50,
                                                                  partitions=1)).system_topic
    broker.endpoint.create_partitioned_topic(TOPIC, 1)  # type: ignore[union-attr]
    rows: list[SlotRow] = []
    failure: list[BaseException] = []

    def emit() -> None:
        try:
            rows.extend(send_slot(planned, BrokerSettings.from_config(settings),
                                  ProducerSettings.from_config(settings, "r-restart")))
        except BaseException as exc:  # reported by the assertion below
            failure.append(exc)

    sender = threading.Thread(target=emit)
    sender.start()
    deadline = time.monotonic() + 20
    first_partition = partition_topic(TOPIC, 0)
    while len(broker.endpoint.store.entries(first_partition)) < 5 and time.monotonic() < deadline:  # type: ignore
        time.sleep(0.002)
    broker.stop()
    assert sender.is_alive(), "the emit finished before the restart: make it bigger"
    time.sleep(0.5)
    broker.start()
    sender.join(60)
    assert not failure, failure
    ids = [pending_delete.decode(m.payload)["ledgerId"] for m in broker.messages(1)]
    assert len(ids) == len(set(ids)) == len(planned)
    assert len(rows) == len(planned)
    broker.stop()


def test_unreachable_broker_refuses_and_marks_nothing(
        seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, broker: Broker) -> None:
    cfg, store, run_id = _reconciled(seeded_snapshot, broker, spark, topics=10)
    down = cfg.replace(system_topic={"service_url": f"pulsar://127.0.0.1:{free_port()}", "admin_url": ""})
    with pytest.raises(EmitRefused, match="unreachable"):
        run_emit(spark, down, store, run_id)
    assert not store.exists("emitted")


def test_partition_count_mismatch_missing_topic_and_auth_refusal(
        seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    cfg, store, run_id = _reconciled(seeded_snapshot, broker, spark, topics=10)
    no_create = cfg.replace(system_topic={"create_if_missing": False})
    with pytest.raises(EmitRefused, match="create-partitioned-topic"):
        run_emit(spark, no_create, store, run_id)
    broker.endpoint.create_partitioned_topic(TOPIC, 2)  # type: ignore[union-attr]
    with pytest.raises(EmitRefused, match="has 2 partitions"):
        run_emit(spark, cfg, store, run_id)
    assert not broker.messages(2)

    guarded = Broker(tmp_path / "guarded", token="s3cret").start()
    try:
        token_file = tmp_path / "token"
        token_file.write_text("wrong-token\n")
        bad = cfg.replace(system_topic=guarded.config(auth_token_file=str(token_file)))
        with pytest.raises(EmitRefused, match="refused our credentials") as info:
            run_emit(spark, bad, store, run_id)
        assert "wrong-token" not in str(info.value)
    finally:
        guarded.stop()
    assert not store.exists("emitted")


def test_emit_over_tls_with_a_token_publishes_everything_and_never_writes_the_token(
        seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, tmp_path: Path, broker: Broker,
        caplog: pytest.LogCaptureFixture) -> None:
    cfg, store, run_id = _reconciled(seeded_snapshot, broker, spark, topics=10)
    tls = make_tls_files(tmp_path / "tls")
    token = "tls-token-5e1d"
    secured = Broker(tmp_path / "secured", token=token, tls=(tls.cert, tls.key)).start()
    try:
        token_file = tmp_path / "token"
        token_file.write_text(token)
        over_tls = cfg.replace(system_topic=secured.config(auth_token_file=str(token_file),
                                                           tls_trust_certs_file=str(tls.ca)))
        assert over_tls.system_topic.service_url.startswith("pulsar+ssl://")
        assert over_tls.system_topic.admin_url.startswith("https://")
        result = run_emit(spark, over_tls, store, run_id)
        assert result.counts.published == result.counts.records > 0
        assert len(secured.messages()) == result.counts.published
    finally:
        secured.stop()
    assert token not in caplog.text and token not in repr(over_tls) and token not in str(result)
    assert not any(token in str(row) for row in store.read("emitted").collect())


def test_emit_refuses_a_run_that_was_not_reconciled(spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    cfg = BASE_CONFIG.replace(tables={"root": str(tmp_path / "tables"), "engine": "delta-rs"},
                                  system_topic=broker.config())
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    with pytest.raises(EmitRefused, match="no successful reconcile"):
        run_emit(spark, cfg, store, "r-never")


@pytest.mark.integration  # a broker of its own
def test_an_oversize_record_is_reported_and_never_holds_up_the_rest(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "pulsar").start()
    try:
        broker.endpoint.create_partitioned_topic(TOPIC, 1)  # type: ignore[union-attr]
        settings = BASE_CONFIG.replace(system_topic=broker.config(partitions=1)).system_topic
        records = _synthetic_records(3)
        records[1]["properties"] = {"note": "x" * (2 << 20)}  # a broker would refuse it on every retry
        rows = send_slot(plan_messages(records, 1, 100), BrokerSettings.from_config(settings),
                         ProducerSettings.from_config(settings, "r-big"))
        assert sorted(r[5] for r in rows) == [PUBLISHED, PUBLISHED, REFUSED_OVERSIZE]
        assert len(broker.messages(1)) == 2
    finally:
        broker.stop()


def test_a_candidate_no_record_can_be_made_for_is_reported_and_the_rest_is_sent(
        seeded_snapshot: SeededSnapshotMaker, spark: SparkSession, broker: Broker) -> None:
    # Issue 11 (9): an offloaded object with no owner metadata (no topic for its record) made emit raise for the
    # whole stage. Reconcile no longer makes such candidates; emit must not fall over one all the same.
    from sweeper.table_schemas import ORPHANS

    cfg, store, run_id = _reconciled(seeded_snapshot, broker, spark)
    candidates = store.read("orphans").where(f"run_id = '{run_id}' AND status = '{CANDIDATE}'").count()
    store.append_rows("orphans", [{
        "run_id": run_id, "captured_at": datetime.now(UTC), "object_type": "offload_object", "ledger_id": 7,
        "status": CANDIDATE, "verdict": "orphan", "reason": "offload_unreferenced", "managed_ledger": None,
        "s3_bucket": "b", "s3_key": "11111111-1111-4111-8111-111111111111-ledger-7",
        "offload_uuid": "11111111-1111-4111-8111-111111111111"}], ORPHANS)
    result = run_emit(spark, cfg, store, run_id)
    assert result.counts.refused_invalid == 1
    assert result.counts.published == candidates
    assert 7 not in {r["ledgerId"] for r in _decode_all(broker)}
