"""The reclaim step end to end against a real ZooKeeper (the bookie's registration), a loopback HTTP server standing
in for the bookie's HTTP service (tests/support/bookie_server.py) and real Delta tables (delta-rs, no Spark)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from harness.s3server import S3ServerInfo
from sweeper import runs
from sweeper._proto.bookkeeper_metadata_pb2 import BookieServiceInfoFormat
from sweeper.config import SweeperConfig
from sweeper.objectstore.s3 import S3Target, s3_client
from sweeper.pipeline import reclaim_stage, sample_bookies_before
from sweeper.reclaim.decide import FREED, NOT_MEASURED, PENDING_COMPACTION, PENDING_GC, RESTARTED
from sweeper.reclaim.discovery import FOUND_IN_REGISTRATION
from sweeper.reclaim.stage import latest_rows, run_reclaim, sample_before, summary_line
from sweeper.report.metrics import render
from sweeper.table_schemas import BK_LEDGERS, BOOKIE_SAMPLES, DELETE_RESULTS, OFFLOAD_OBJECTS
from sweeper.tables.delta_rs import DeltaRsTableStore
from tests.support.bookie_server import BookieHttpServer, BookieState
from tests.support.config import BASE_CONFIG, ZkTarget
from tests.test_metrics import samples

RUN = "20261127T120000Z-reclaim1"
BOOKIE = "bk0test"
MIB = 1 << 20


@pytest.fixture
def bookie() -> Iterator[BookieHttpServer]:
    with BookieHttpServer(BookieState(bookie_id=BOOKIE), gc_duration_s=0.1) as server:
        yield server


def register(zk: KazooClient, bookie_id: str, http_url: str | None, readonly: bool = False) -> None:
    info = BookieServiceInfoFormat()
    info.endpoints.add(id="bookie", host="127.0.0.1", port=3181, protocol="bookie-rpc")
    if http_url:
        host, port = http_url.removeprefix("http://").rsplit(":", 1)
        info.endpoints.add(id="httpserver", host=host, port=int(port), protocol="http")
    parent = "/ledgers/available/readonly" if readonly else "/ledgers/available"
    zk.create(f"{parent}/{bookie_id}", info.SerializeToString(), makepath=True)


def config_for(zk_target: ZkTarget, tables: Path, **reclaim: Any) -> SweeperConfig:
    return BASE_CONFIG.replace(bookkeeper={"zookeeper": zk_target.hosts, "ledgers_root": "/ledgers"},
                               tables={"root": str(tables), "engine": "delta-rs"},
                               offload={"enabled": False},
                               reclaim={"calls_per_second": 50.0, "gc_poll_s": 0.05, "gc_timeout_s": 5.0, **reclaim})


def seed_deleted(store: DeltaRsTableStore, lengths: dict[int, int], bookies: tuple[str, ...] = (BOOKIE,),
                 state: str = "CLOSED") -> None:
    """Closed ledgers of 1 KiB entries, each written to every bookie of one ensemble (write quorum = ensemble)."""
    now = datetime.now(UTC)
    store.append_rows("bk_ledgers", [
        {"run_id": RUN, "captured_at": now, "ledger_id": lid, "path": f"/ledgers/00/0000/L{lid:04d}",
         "ensemble_size": len(bookies), "write_quorum": len(bookies), "ack_quorum": 1, "length": length,
         "state": state, "last_entry_id": length // 1024 - 1, "bookies": sorted(bookies),
         "segment_first_entries": [0], "segment_ensembles": [list(bookies)]} for lid, length in lengths.items()],
        BK_LEDGERS)
    store.append_rows("delete_results", [
        {"run_id": RUN, "finished_at": now, "record_key": f"LEDGER:{lid}", "ledger_id": lid, "ledger_type": "LEDGER",
         "outcome": "deleted", "attempt": 1, "dry_run": False, "source": "emitted"} for lid in lengths],
        DELETE_RESULTS)


@pytest.fixture
def store(tmp_path: Path) -> DeltaRsTableStore:
    return DeltaRsTableStore(str(tmp_path / "tables"), None)  # type: ignore[arg-type] - driver commits need no Spark


def test_a_triggered_gc_frees_the_expected_bytes_once_per_run(zk: KazooClient, zk_target: ZkTarget, tmp_path: Path,
                                                              bookie: BookieHttpServer, store: DeltaRsTableStore,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    register(zk, BOOKIE, bookie.url)
    config = config_for(zk_target, tmp_path / "tables", trigger_gc=True)
    seed_deleted(store, {1: 8 * MIB, 2: 8 * MIB, 3: 4 * MIB})
    assert sample_before(config, store, RUN) == 1
    with bookie.lock:  # the delete happened: the next GC finds three ledgers gone, their logs whole
        bookie.state.pending_deleted_ledgers = 3
        bookie.state.pending_deletion_bytes = 20 * MIB
    result = reclaim_stage(config, store, RUN, trigger=True)
    [row] = result.rows
    assert (row["verdict"], row["expected_bytes"], row["freed_bytes"]) == (FREED, 20 * MIB, 20 * MIB)
    assert row["found_by"] == FOUND_IN_REGISTRATION and row["action"] == "gc (deletion + minor compaction)"
    [put] = bookie.gc_puts
    # Never `true`: an explicit flag overrides the bookie's own suspension; the omitted one follows it.
    assert put.json() == {"forceMajor": False}
    assert result.counts.gc_triggered == 1 and runs.rows(store, RUN, "reclaim")[-1]["status"] == runs.SUCCEEDED
    assert summary_line(result.rows) == "bookies gave back 20.0 MiB of 20.0 MiB expected"

    again = run_reclaim(config, store, RUN, trigger=True)  # a rerun measures, never triggers twice
    assert len(bookie.gc_puts) == 1 and again.rows[0]["verdict"] == FREED
    assert "already triggered" in again.rows[0]["why"]
    stronger = run_reclaim(config.replace(reclaim={"compaction": "major"}), store, RUN, trigger=True)
    assert len(bookie.gc_puts) == 2 and stronger.rows[0]["action"] == "gc (deletion + major compaction)"
    assert len(run_reclaim(config.replace(reclaim={"compaction": "major"}), store, RUN, trigger=True).rows) == 1
    assert len(bookie.gc_puts) == 2  # and that one once too
    journal = store.read_arrow("reclaim_journal", where={"run_id": RUN}).to_pylist()
    assert [j["phase"] for j in sorted(journal, key=lambda j: j["at"])] == ["intent", "done"] * 2

    from sweeper.cli import EXIT_OK, main

    capsys.readouterr()
    assert main(["show", RUN, "reclaim", "--tables", str(tmp_path / "tables"), "--format", "json"]) == EXIT_OK
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["target"], r["verdict"]) for r in shown] == [(BOOKIE, FREED)] * 4  # every measurement, oldest first


def test_without_a_trigger_the_deleted_data_waits_for_the_gc(zk: KazooClient, zk_target: ZkTarget, tmp_path: Path,
                                                             bookie: BookieHttpServer,
                                                             store: DeltaRsTableStore) -> None:
    register(zk, BOOKIE, bookie.url)
    config = config_for(zk_target, tmp_path / "tables")
    seed_deleted(store, {7: 5 * MIB})
    sample_before(config, store, RUN)
    row = run_reclaim(config, store, RUN, trigger=False).rows[0]
    assert (row["verdict"], row["pending_bytes"], row["action"]) == (PENDING_GC, 5 * MIB, "measured only")
    assert bookie.gc_puts == []
    # The collector then ran by itself (gcWaitTime) but the ledger shared its logs with live data: compaction's turn.
    with bookie.lock:
        bookie.state.pending_deleted_ledgers = 1
        bookie.state.pending_compaction_bytes = 5 * MIB
        bookie.state.pending_compaction_needs_major = True
    bookie.state.in_force_gc = False
    run_reclaim(config, store, RUN, trigger=True)  # compaction = minor: not enough for logs over 20 % live
    row = latest_rows(store, RUN)[0]
    assert (row["verdict"], row["pending_bytes"]) == (PENDING_COMPACTION, 5 * MIB)
    assert "compaction" in row["why"]
    major = config_for(zk_target, tmp_path / "tables", compaction="major")
    other_run = "20261127T120001Z-reclaim2"  # once per run: a new run may ask again
    seed_deleted_run(store, other_run, 7, 5 * MIB)
    store.append_rows("bookie_samples", [{**s, "run_id": other_run} for s in store.read_arrow(
        "bookie_samples", where={"run_id": RUN, "phase": "before"}).to_pylist()], BOOKIE_SAMPLES)
    row = run_reclaim(major, store, other_run, trigger=True).rows[0]
    # An empty body: forceGC(), a major compaction wherever each ledger dir's own flags allow one.
    assert row["verdict"] == FREED and bookie.gc_puts[-1].body == b""


def seed_deleted_run(store: DeltaRsTableStore, run_id: str, ledger_id: int, length: int) -> None:
    now = datetime.now(UTC)
    store.append_rows("delete_results", [
        {"run_id": run_id, "finished_at": now, "record_key": f"LEDGER:{ledger_id}", "ledger_id": ledger_id,
         "ledger_type": "LEDGER", "outcome": "deleted", "attempt": 1, "dry_run": False, "source": "emitted"}],
        DELETE_RESULTS)


def test_a_bookie_that_does_not_answer_is_not_measured_and_fails_nothing(zk: KazooClient, zk_target: ZkTarget,
                                                                         tmp_path: Path, bookie: BookieHttpServer,
                                                                         store: DeltaRsTableStore) -> None:
    register(zk, BOOKIE, bookie.url)
    register(zk, "bk-no-http", None)
    config = config_for(zk_target, tmp_path / "tables", trigger_gc=True, timeout_s=1.0)
    seed_deleted(store, {1: 2 * MIB}, bookies=(BOOKIE, "bk-no-http", "bk-gone"))
    sample_bookies_before(config, store, RUN)
    bookie.stopped = True
    result = reclaim_stage(config, store, RUN, trigger=True)
    verdicts = {r["target"]: (r["verdict"], r["why"]) for r in result.rows}
    assert {k: v[0] for k, v in verdicts.items()} == {BOOKIE: NOT_MEASURED, "bk-gone": NOT_MEASURED,
                                                        "bk-no-http": NOT_MEASURED}
    assert "httpServerEnabled" in verdicts["bk-no-http"][1] and "not registered" in verdicts["bk-gone"][1]
    assert "refused" in verdicts[BOOKIE][1].lower() or "connection" in verdicts[BOOKIE][1].lower()
    assert result.counts.not_measured == 3 and bookie.gc_puts == []
    assert "not measured on" in summary_line(result.rows)


def test_a_read_only_bookie_gets_a_deletion_only_gc_and_a_restart_is_said(zk: KazooClient, zk_target: ZkTarget,
                                                                         tmp_path: Path, bookie: BookieHttpServer,
                                                                         store: DeltaRsTableStore) -> None:
    register(zk, BOOKIE, bookie.url, readonly=True)
    config = config_for(zk_target, tmp_path / "tables", compaction="major")
    seed_deleted(store, {1: 3 * MIB})
    with bookie.lock:
        bookie.state.only.reclaimed_deletion_bytes = 40 * MIB  # what it had freed before this run
    sample_before(config, store, RUN)
    bookie.restart()
    with bookie.lock:
        bookie.state.pending_deleted_ledgers = 1
        bookie.state.pending_deletion_bytes = 3 * MIB
    row = run_reclaim(config, store, RUN, trigger=True).rows[0]
    assert bookie.gc_puts[-1].json() == {"forceMajor": False, "forceMinor": False}
    assert row["action"] == "gc (deletion only)" and "read-only" in row["why"]
    assert row["counter_reset"] and row["freed_bytes"] == 3 * MIB and "restarted" in row["why"]
    assert row["verdict"] == RESTARTED and row["freed_lower_bytes"] == 0  # a lower bound, never a false `freed`


def test_calls_are_paced_and_metrics_name_each_bookie(zk: KazooClient, zk_target: ZkTarget, tmp_path: Path,
                                                     bookie: BookieHttpServer, store: DeltaRsTableStore) -> None:
    register(zk, BOOKIE, bookie.url)
    config = config_for(zk_target, tmp_path / "tables", calls_per_second=10.0)
    seed_deleted(store, {1: MIB})
    sample_before(config, store, RUN)
    row = run_reclaim(config, store, RUN).rows[0]
    times = sorted(r.monotonic for r in bookie.requests)
    assert len(times) == 13  # seven reads before (the server config too), six after
    for phase in (times[:7], times[7:]):
        gaps = [b - a for a, b in itertools.pairwise(phase)]
        # 10 calls a second, never a burst: the span holds the pace; one gap may shrink by the arrival jitter of a
        # loaded machine (a call sent on time, the one before it received late), never to a burst's ~1 ms
        assert phase[-1] - phase[0] >= 0.095 * (len(phase) - 1)
        assert min(gaps) >= 0.04
    values = samples(render(RUN, {}, reclaim=[row]))
    assert values[f'ledger_sweeper_reclaim_expected_bytes{{kind="bookie",target="{BOOKIE}"}}'] == MIB
    assert values[f'ledger_sweeper_reclaim_verdict{{kind="bookie",target="{BOOKIE}",verdict="pending_gc"}}'] == 1


def test_offloaded_objects_count_as_freed_once_listed_gone(zk_target: ZkTarget, tmp_path: Path,
                                                          store: DeltaRsTableStore, s3_server: S3ServerInfo) -> None:
    bucket = "reclaim-offload"
    client = s3_client(S3Target(bucket), s3_server.endpoint)
    client.create_bucket(Bucket=bucket)
    config = config_for(zk_target, tmp_path / "tables").replace(offload={"endpoint_override": s3_server.endpoint})
    now = datetime.now(UTC)
    keys = {"u1-ledger-5": 3000, "u1-ledger-5-index": 100, "u2-ledger-6": 5000, "u2-ledger-6-index": 200}
    store.append_rows("offload_objects", [
        {"run_id": RUN, "captured_at": now, "bucket": bucket, "key": key, "uuid": key[:2], "ledger_id": 5, "size": size}
        for key, size in keys.items()], OFFLOAD_OBJECTS)
    store.append_rows("delete_results", [
        {"run_id": RUN, "finished_at": now, "record_key": f"OFFLOAD_LEDGER:{lid}", "ledger_id": lid,
         "ledger_type": "OFFLOAD_LEDGER", "outcome": "deleted", "attempt": 1, "dry_run": False, "source": "emitted",
         "s3_bucket": bucket, "s3_keys": [k for k in keys if k.startswith(uuid)]}
        for lid, uuid in ((5, "u1"), (6, "u2"))], DELETE_RESULTS)
    client.put_object(Bucket=bucket, Key="u2-ledger-6", Body=b"x")  # one delete that did not take
    [row] = run_reclaim(config, store, RUN).rows
    assert (row["target_kind"], row["verdict"], row["expected_bytes"], row["freed_bytes"]) == (
        "offload", PENDING_GC, 8300, 3300)
    assert "still listed" in row["why"]
    client.delete_object(Bucket=bucket, Key="u2-ledger-6")
    [row] = run_reclaim(config, store, RUN).rows
    assert (row["verdict"], row["freed_bytes"], row["pending_bytes"]) == (FREED, 8300, 0)
    assert summary_line([row]).endswith(f"8.1 KiB of offloaded objects gone from {bucket}")


def test_unreadable_registrations_are_the_reason_given(tmp_path: Path, store: DeltaRsTableStore,
                                                       bookie: BookieHttpServer) -> None:
    from harness.zkserver import free_port

    config = BASE_CONFIG.replace(bookkeeper={"zookeeper": f"127.0.0.1:{free_port()}", "ledgers_root": "/ledgers",
                                             "session_timeout_s": 1.0},
                                 tables={"root": str(tmp_path / "tables"), "engine": "delta-rs"},
                                 offload={"enabled": False},
                                 reclaim={"http_urls": [f"{BOOKIE}={bookie.url}"], "calls_per_second": 50.0})
    seed_deleted(store, {1: MIB}, bookies=(BOOKIE, "bk-elsewhere"))
    sample_before(config, store, RUN)  # the registrations cannot be read; the one the config names still answers
    rows = {r["target"]: r for r in run_reclaim(config, store, RUN).rows}
    assert rows[BOOKIE]["verdict"] == PENDING_GC and rows[BOOKIE]["found_by"] == "config"
    assert rows["bk-elsewhere"]["verdict"] == NOT_MEASURED
    assert rows["bk-elsewhere"]["why"].startswith("bookie registrations unreadable")


def test_a_snapshot_an_older_version_took_gives_estimated_shares(zk: KazooClient, zk_target: ZkTarget,
                                                                  tmp_path: Path, bookie: BookieHttpServer) -> None:
    """bk_ledgers written before it kept each segment's layout (an upgrade): read in today's schema, the layout is
    null, and each bookie's share is the even split of the ledger's bytes, said to be an estimate."""
    from pyspark.sql.types import StructType

    store = DeltaRsTableStore(str(tmp_path / "tables"), None)  # type: ignore[arg-type]
    older = StructType([f for f in BK_LEDGERS.fields if not f.name.startswith("segment_")])
    now = datetime.now(UTC)
    store.append_rows("bk_ledgers", [{"run_id": RUN, "captured_at": now, "ledger_id": 5, "path": "/ledgers/L5",
                                      "ensemble_size": 2, "write_quorum": 1, "ack_quorum": 1, "length": 4 * MIB,
                                      "state": "CLOSED", "last_entry_id": 4095, "bookies": [BOOKIE, "bk-other"]}],
                      older)
    seed_deleted_run(store, RUN, 5, 2 * MIB)
    register(zk, BOOKIE, bookie.url)
    config = config_for(zk_target, tmp_path / "tables")
    sample_before(config, store, RUN)
    rows = {r["target"]: r for r in run_reclaim(config, store, RUN).rows}
    assert rows[BOOKIE]["expected_bytes"] == 2 * MIB and "estimated" in rows[BOOKIE]["why"], rows[BOOKIE]


@pytest.mark.parametrize("protection", ["read_only", "minor_suspended", "major_suspended"])
@pytest.mark.parametrize("compaction", ["minor", "major"])
def test_a_bookie_that_protects_itself_since_the_delete_gets_a_put_that_cannot_compact(
        zk: KazooClient, zk_target: ZkTarget, tmp_path: Path, bookie: BookieHttpServer, store: DeltaRsTableStore,
        protection: str, compaction: str) -> None:
    """The state is read right before each PUT, not when the step (or the delete) began: a bookie that went read-only
    or suspended its compaction meanwhile (a disk almost full) gets both flags false, which compacts nothing."""
    register(zk, BOOKIE, bookie.url)
    config = config_for(zk_target, tmp_path / "tables", compaction=compaction)
    seed_deleted(store, {1: 3 * MIB})
    sample_before(config, store, RUN)
    with bookie.lock:
        setattr(bookie.state, protection, True)
        bookie.state.pending_deleted_ledgers = 1
        bookie.state.pending_deletion_bytes = 3 * MIB
    [row] = run_reclaim(config, store, RUN, trigger=True).rows
    [put] = bookie.gc_puts
    assert put.json() == {"forceMajor": False, "forceMinor": False}, put.body
    assert bookie.gc_runs == [(False, False)]  # what the bookie then ran: no compaction of either kind
    assert row["action"] == "gc (deletion only)" and row["verdict"] == FREED, row
