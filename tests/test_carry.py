"""Issue 46, item 4: what emit, delete and reclaim need of a candidate travels in `orphans` -> `emitted` ->
`delete_results`, so they do not go back to the snapshot tables; rows an older version wrote without it still work,
through the snapshot reads that version made.

The unit cases run on delta-rs tables on the driver (no Spark, no server); the end-to-end case runs the sandbox
through snapshot, reconcile, emit, an executed delete and reclaim's input with `ml_ledgers` and `bk_ledgers` made
unreadable after reconcile.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from harness.s3server import S3ServerInfo
from harness.sandbox.model import SandboxSpec
from harness.zkserver import free_port
from sweeper.codecs import pending_delete
from sweeper.delete import inputs
from sweeper.delete.records import PendingRecord
from sweeper.delete.settings import DeleteSettings
from sweeper.delete.stage import run_delete
from sweeper.emit.carry import (
    CARRIED_NAMES,
    CarriedIndex,
    row_targets,
    snapshot_offload_targets,
    uncarried_offload_targets,
)
from sweeper.emit.stage import run_emit
from sweeper.reclaim.stage import deleted_ledgers
from sweeper.runs import record as record_run
from sweeper.table_schemas import BK_LEDGERS, DELETE_RESULTS, EMITTED, ORPHANS
from sweeper.tables import TableStore
from sweeper.tables.delta_rs import DeltaRsTableStore
from tests.support.broker import Broker
from tests.support.config import BASE_CONFIG, ZkTarget
from tests.support.seeded import LATER_MS, later, orphans_past_grace, planned_delete

RUN = "20261202T120000Z-carry"
SNAPSHOT_TABLES = ("ml_ledgers", "bk_ledgers")


def older(schema: StructType) -> StructType:
    """The schema as a version before issue 46 wrote the table: without the carried columns."""
    return StructType([f for f in schema.fields if f.name not in CARRIED_NAMES])


def layout(length: int, bookies: tuple[str, ...] = ("bk0:3181", "bk1:3181")) -> dict[str, Any]:
    return {"length": length, "ensemble_size": len(bookies), "write_quorum": len(bookies), "state": "CLOSED",
            "last_entry_id": length // 1024 - 1, "bookies": list(bookies), "segment_first_entries": [0],
            "segment_ensembles": [list(bookies)]}


@pytest.fixture
def store(tmp_path: Path) -> DeltaRsTableStore:
    return DeltaRsTableStore(str(tmp_path / "tables"), None)  # type: ignore[arg-type] - driver reads need no Spark


def deleted_row(ledger_id: int, **carried: Any) -> dict[str, Any]:
    return {"run_id": RUN, "finished_at": datetime.now(UTC), "record_key": f"LEDGER/{ledger_id}",
            "ledger_id": ledger_id, "ledger_type": "LEDGER", "outcome": "deleted", "attempt": 1, "dry_run": False,
            "source": "emitted", **carried}


def test_reclaim_takes_each_deleted_ledgers_layout_from_delete_results_without_bk_ledgers(
        store: DeltaRsTableStore) -> None:
    store.append_rows("delete_results", [deleted_row(7, carried=True, bk_layout=layout(8192)),
                                         deleted_row(9, carried=True, bk_layout=layout(4096, ("bk2:3181",)))],
                      DELETE_RESULTS)
    assert not store.exists("bk_ledgers")
    ledgers, objects = deleted_ledgers(store, RUN)
    assert objects == []
    assert [(d.ledger_id, d.length, d.bookies, d.closed, d.segments) for d in ledgers] == [
        (7, 8192, ("bk0:3181", "bk1:3181"), True, ((0, ("bk0:3181", "bk1:3181")),)),
        (9, 4096, ("bk2:3181",), True, ((0, ("bk2:3181",)),))]


def test_reclaim_reads_bk_ledgers_for_a_delete_results_table_written_without_the_carried_columns(
        store: DeltaRsTableStore) -> None:
    """An older version's delete_results (and a row of this version that carries nothing, an operator's list) fall
    back to the latest snapshot row of the ledger, as before."""
    store.append_rows("delete_results", [deleted_row(7)], older(DELETE_RESULTS))
    store.append_rows("delete_results", [deleted_row(8, source="from_json"), deleted_row(9, carried=True,
                                                                                          bk_layout=layout(1024))],
                      DELETE_RESULTS)
    now = datetime.now(UTC)
    store.append_rows("bk_ledgers", [
        {"run_id": "older", "captured_at": now, "ledger_id": lid, "path": f"/ledgers/L{lid}", **layout(length)}
        for lid, length in ((7, 2048), (8, 3072), (9, 999_999))], BK_LEDGERS)
    ledgers, _ = deleted_ledgers(store, RUN)
    # 7 and 8 from the snapshot; 9 from what its row carries, not the snapshot's (different) length.
    assert [(d.ledger_id, d.length) for d in ledgers] == [(7, 2048), (8, 3072), (9, 1024)]


def orphan_row(object_type: str, ledger_id: int, **values: Any) -> dict[str, Any]:
    return {"run_id": RUN, "captured_at": datetime.now(UTC), "object_type": object_type, "ledger_id": ledger_id,
            "status": "candidate", "verdict": "orphan", "reason": "r", **values}


def test_emit_takes_offload_targets_from_the_orphan_rows_and_falls_back_for_an_older_reconcile(
        store: DeltaRsTableStore, monkeypatch: pytest.MonkeyPatch) -> None:
    carried_obj = orphan_row("offload_object", 5, s3_bucket="b1", s3_key="u-ledger-5", offload_uuid="u",
                             carried=True, offload_bucket="b1", offload_region="eu-west-1", offload_endpoint="http://s3",
                             offload_driver="aws-s3")
    ledger = orphan_row("ledger", 6, carried=True, bk_layout=layout(4096), component="managed_ledger")
    # A run an older version reconciled first (its table without the columns), then one of this version.
    other = "20261202T130000Z-older"
    store.append_rows("orphans", [{**orphan_row("offload_object", 5, s3_bucket="b1", s3_key="k", offload_uuid="u"),
                                   "run_id": other}], older(ORPHANS))
    store.append_rows("orphans", [carried_obj, ledger], ORPHANS)
    snapshot_reads: list[str] = []
    monkeypatch.setattr("sweeper.emit.carry.snapshot_offload_targets",
                        lambda store, run_id: snapshot_reads.append(run_id) or {"b1": ("old", "")})
    assert uncarried_offload_targets(store, RUN) is None and not snapshot_reads
    assert row_targets([carried_obj, ledger]) == {"b1": ("eu-west-1", "http://s3")}
    index = CarriedIndex([carried_obj, ledger])
    record = {"ledgerId": 5, "offloadContext": {"bucket": "b1", "uuid": "u", "keys": ["u-ledger-5"]}}
    assert index.of(record) == {"carried": True, "bk_layout": None, "offload_bucket": "b1",
                                "offload_region": "eu-west-1", "offload_endpoint": "http://s3",
                                "offload_driver": "aws-s3"}
    assert index.of({"ledgerId": 6, "offloadContext": None})["bk_layout"] == layout(4096)

    # The older run: no carried values, so the snapshot's contexts, as that version read them.
    assert uncarried_offload_targets(store, other) == {"b1": ("old", "")} and snapshot_reads == [other]
    assert CarriedIndex([]).of({"ledgerId": 6, "offloadContext": None}) == dict.fromkeys(CARRIED_NAMES)


def emitted_row(key: str, ledger_type: str, **values: Any) -> dict[str, Any]:
    return {"run_id": RUN, "emitted_at": datetime.now(UTC), "record_key": key, "ledger_id": 1,
            "ledger_type": ledger_type, "component": "MANAGED_LEDGER", "topic_partition": 0, "producer_name": "p",
            "sequence_id": 0, "status": "published", "payload": b"", **values}


def test_delete_takes_its_buckets_from_emitted_and_reads_the_snapshot_only_when_it_must(
        store: DeltaRsTableStore, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = DeleteSettings.from_config(BASE_CONFIG.replace(offload={"extra_buckets": "extra"}))
    snapshot_reads: list[str | None] = []
    monkeypatch.setattr(inputs, "_buckets", lambda store, settings, run_id: snapshot_reads.append(run_id) or ())
    other = "20261202T130000Z-older"  # emitted by an older version, before this one's run
    store.append_rows("emitted", [{**emitted_row("LEDGER/1", "LEDGER"), "run_id": other}], older(EMITTED))
    store.append_rows("emitted", [
        emitted_row("LEDGER/1", "LEDGER", carried=True, bk_layout=layout(1024)),
        emitted_row("OFFLOAD_LEDGER/2/b1/u", "OFFLOAD_LEDGER", carried=True, offload_bucket="b1",
                    offload_region="eu-west-1"),
        emitted_row("OFFLOAD_LEDGER/3/extra/u", "OFFLOAD_LEDGER", carried=True)], EMITTED)
    own = [PendingRecord("OFFLOAD_LEDGER/2/b1/u", "emitted", RUN, 0, b""),
           PendingRecord("LEDGER/4", "retry_queue", "earlier", 1, b"")]
    found = inputs.run_buckets(store, settings, RUN, own)
    assert found == (("b1", "eu-west-1", ""), ("extra", settings.offload.region, "")) and not snapshot_reads

    # A due retry of an offloaded copy may name a bucket only the run's snapshot knows: read it, as before.
    inputs.run_buckets(store, settings, RUN, [PendingRecord("OFFLOAD_LEDGER/9/b9/u", "retry_queue", "e", 1, b"")])
    assert snapshot_reads == [RUN]
    # So it is for the run whose emitted rows an older version wrote.
    inputs.run_buckets(store, settings, other, [])
    assert snapshot_reads == [RUN, other]


class SnapshotReadRefused(AssertionError):
    pass


def refuse_snapshot_reads(store: TableStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any look at `ml_ledgers` or `bk_ledgers` through the store, even whether it exists, fails the test."""
    for method in ("exists", "read", "read_arrow", "aggregate_arrow"):
        real = getattr(store, method)

        def guarded(name: str, *args: Any, _real: Any = real, _method: str = method, **kwargs: Any) -> Any:
            if name in SNAPSHOT_TABLES:
                raise SnapshotReadRefused(f"{_method}({name!r}) after reconcile")
            return _real(name, *args, **kwargs)

        monkeypatch.setattr(store, method, guarded)


@pytest.fixture
def no_snapshot_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    yield lambda store: refuse_snapshot_reads(store, monkeypatch)


def test_emit_delete_and_reclaim_of_a_run_read_no_snapshot_table_after_reconcile(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker,
        s3_server: S3ServerInfo, no_snapshot_reads: Any) -> None:
    spec = SandboxSpec(seed=5, topics=30, offload_bucket=f"offload-{free_port()}")
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec, s3_server,
                                                 emit=False)
    # What the snapshot says, read before it is closed to the later stages: the records as an older version built
    # them (offload contexts from ml_ledgers), and each candidate ledger's latest bk_ledgers row.
    rows = store.read("orphans").where(f"run_id = '{run_id}' AND status = 'candidate'").toArrow().to_pylist()
    expected_records = pending_delete.records_for_orphans(rows, snapshot_offload_targets(store, run_id))
    candidate_ids = [r["ledger_id"] for r in rows if r["object_type"] == "ledger"]
    snapshot = {r["ledger_id"]: r for r in store.read_arrow("bk_ledgers", where={"ledger_id": candidate_ids})
                .to_pylist()}
    assert any(r.get("offloadContext") for r in expected_records), "the sandbox has no orphan offloaded copy"

    no_snapshot_reads(store)
    emitted = run_emit(spark, cfg, store, run_id)
    record_run(store, run_id, "emit", "succeeded", datetime.now(UTC), emitted.counts, cfg)
    sent = [pending_delete.decode(r["payload"]) for r in store.read_arrow("emitted", where={"run_id": run_id})
            .to_pylist()]
    assert sorted(sent, key=pending_delete.record_key) == sorted(expected_records, key=pending_delete.record_key)

    done = run_delete(spark, cfg, store, run_id, execute=True, now_ms=later())
    deleted = {r.ledger_id for r in done.results if r.outcome == "deleted" and r.ledger_type == "LEDGER"}
    assert deleted == orphans_past_grace(cluster, LATER_MS, offloads_listed=True)
    copies = [r for r in done.results if r.ledger_type == "OFFLOAD_LEDGER"]
    assert copies and all(r.outcome == "deleted" for r in copies), [(r.outcome, r.detail) for r in copies]

    ledgers, objects = deleted_ledgers(store, run_id)
    assert {d.ledger_id for d in ledgers} == deleted and len(objects) == len(copies)
    for d in ledgers:
        seen = snapshot[d.ledger_id]
        assert (d.length, d.bookies, d.ensemble_size, d.write_quorum) == (
            seen["length"], tuple(seen["bookies"]), seen["ensemble_size"], seen["write_quorum"])
        assert d.segments == tuple((f, tuple(e)) for f, e in zip(seen["segment_first_entries"],
                                                                  seen["segment_ensembles"], strict=True))
