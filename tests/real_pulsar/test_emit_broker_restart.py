"""Issue 45 on a real Pulsar: the broker killed (kill -9) and started again in the middle of an emit.

A plan of 2,400 candidate records (ledger ids no topic has: nothing acts on them, they only travel) is emitted to a
partitioned topic of its own while the broker is crashed (`testbed crash`) and brought back (`testbed up`: same ports,
same metadata store and bookies). The emit rides it out: producers that failed are opened again under the same names
and sequence ids, the new producer learns what the broker persisted and sends the rest, and the broker's
deduplication (which the emit turned on for the topic) drops what raced it. Then every record is on the topic once,
`emitted` holds each record once, and the two agree one to one; the run's emit `succeeded`.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pulsar
import pytest
from pyspark.sql import SparkSession

from harness.testbed.server import testbed_crash, testbed_up
from harness.testbed.world import World
from sweeper import runs
from sweeper.codecs import pending_delete
from sweeper.emit.stage import FAILPOINT_BEFORE_RECORDING_ENV
from sweeper.pipeline import emit_stage
from sweeper.table_schemas import ORPHANS
from sweeper.tables import open_table_store
from tests.support.gates import record_gated_reconcile
from tests.support.real_pulsar import COST, Swept, sweeper_config

pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(1200)]

RECORDS = 2400
RUN = "emit-broker-restart"


def _plan(store: Any, cfg: Any) -> None:
    now = datetime.now(UTC)
    store.append_rows("orphans", [
        {"run_id": RUN, "captured_at": now, "object_type": "ledger", "ledger_id": 9_000_000 + n,
         "status": "candidate", "verdict": "orphan", "reason": "topic_deleted", "component": "managed-ledger",
         "tenant": "public", "namespace": "default", "topic": "gone",
         "managed_ledger": "public/default/persistent/gone",
         "size_bytes": 1000, "created_ms": 0, "age_ms": 0, "zk_path": f"/ledgers/00/0900/L{n:04d}", "zk_version": 0}
        for n in range(RECORDS)], ORPHANS)
    record_gated_reconcile(store, RUN, {}, cfg)


def _on_topic(service_url: str, token: str, topic: str, partitions: int) -> list[str]:
    """The record key of every message on the topic (the Python client does not give a message's sequence id: the
    record itself says which it is)."""
    client = pulsar.Client(service_url, authentication=pulsar.AuthenticationToken(token))
    seen: list[str] = []
    try:
        for p in range(partitions):
            reader = client.create_reader(f"{topic}-partition-{p}", pulsar.MessageId.earliest)
            try:
                while True:
                    try:
                        message = reader.read_next(timeout_millis=3000)
                    except pulsar.Timeout:
                        break
                    seen.append(pending_delete.record_key(pending_delete.decode(message.data())))
            finally:
                reader.close()
    finally:
        client.close()
    return seen


def test_an_emit_rides_out_a_broker_crash_and_restart_with_every_record_once(
        testbed_world: World, swept: Swept, spark: SparkSession, tmp_path: Path) -> None:
    # `swept` first: the orphan sweep's plan is taken on the world as the workload left it. A broker restart makes
    # Pulsar leak schema ledgers and leaves a shadow topic's view of its source behind (see Reconciled).
    info = testbed_world.info
    topic = f"persistent://public/default/emit-restart-{int(time.time())}"
    cfg = sweeper_config(info, tmp_path / "tables", system_topic={"topic": topic, "partitions": 2,
                                                                  "records_per_producer": 200})
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    _plan(store, cfg)
    outcome: dict[str, Any] = {}

    def emit() -> None:
        try:
            outcome["result"] = emit_stage(spark, cfg, store, RUN)
        except BaseException as exc:  # the test reports it
            outcome["error"] = exc

    os.environ[FAILPOINT_BEFORE_RECORDING_ENV] = "0.5"  # each producer waits before its record: a slower emit
    try:
        started = time.monotonic()
        worker = threading.Thread(target=emit, daemon=True)
        worker.start()
        deadline = time.monotonic() + 240
        while not store.exists("emitted") and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert worker.is_alive(), f"the emit ended before the crash: {outcome}"
        testbed_crash(info.home)
        time.sleep(3.0)
        restarted = time.monotonic()
        testbed_up(info.home)
        COST["broker_restart_s"] = time.monotonic() - restarted
        worker.join(timeout=600)
        COST["emit_across_broker_restart_s"] = time.monotonic() - started
    finally:
        os.environ.pop(FAILPOINT_BEFORE_RECORDING_ENV, None)
    assert not worker.is_alive() and "error" not in outcome, outcome
    emitted = [r for r in store.read_arrow("emitted", where={"run_id": RUN}).to_pylist()]
    keys = [r["record_key"] for r in emitted]
    assert len(keys) == len(set(keys)) == RECORDS, (len(keys), len(set(keys)))
    on_topic = _on_topic(info.service_url, info.superuser_token(), topic, 2)
    print(f"records {RECORDS}; on the topic {len(on_topic)} ({len(set(on_topic))} distinct); emitted counts "
          f"{outcome['result'].counts}")
    assert len(on_topic) == len(set(on_topic)), "a record on the topic twice"
    assert set(on_topic) == set(keys), "topic and emitted disagree"
    assert [r["status"] for r in runs.rows(store, RUN, "emit")] == ["succeeded"]
