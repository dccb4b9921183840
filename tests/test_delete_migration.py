"""PIP-454 during a delete (issue 34, 6), on a real ZooKeeper and a local Spark session: a migration that starts while
`delete --execute` runs stops it within a chunk, with the rest untouched and on record; and the operator's
acknowledgement of a completed migration holds only while the source store's flag reads COMPLETED.

Upstream (apache/pulsar, PIP-454): `MigrationCoordinator.startMigration` writes PREPARATION, then COPYING while
`copyPersistentData` walks the source, then COMPLETED, or FAILED on any error; `DualMetadataStore` refuses the
brokers' writes in PREPARATION and COPYING and routes everything back to the source after FAILED.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxSpec
from sweeper.codecs.layout import ledger_path
from sweeper.delete.inputs import retry_states
from sweeper.delete.run_result import DeleteCounts, DeleteRunResult
from sweeper.delete.settings import DeleteSettings
from sweeper.delete.stage import _refuse_if_migrating, run_delete
from sweeper.errors import Refused
from sweeper.metastore.errors import MigrationRefused
from sweeper.metastore.migration import MIGRATION_FLAG_PATH, MIGRATION_NOT_ATTEMPTED
from sweeper.pipeline import delete_stage
from sweeper.zk import client as zkutil
from tests.support.broker import Broker
from tests.support.config import ZkTarget
from tests.support.seeded import orphans_past_grace, planned_delete, sandbox_config


def set_flag(zk: KazooClient, phase: str, target_url: str, path: str = MIGRATION_FLAG_PATH) -> None:
    """The record as the coordinator's Jackson mapper writes it (MigrationState: phase, targetUrl)."""
    data = json.dumps({"phase": phase, "targetUrl": target_url}, separators=(",", ":")).encode()
    if zk.exists(path):
        zk.set(path, data)
    else:
        zk.create(path, data, makepath=True)


def test_a_migration_starting_mid_delete_stops_it_within_a_chunk_with_the_rest_on_record(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    spec = SandboxSpec(seed=8, topics=12)
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec)
    orphans = orphans_past_grace(cluster)
    chunk = 4  # records a chunk at 4 deletes a second: about seven chunks of one second each for these orphans
    assert len(orphans) >= 5 * chunk
    cfg = cfg.replace(delete={"deletes_per_second": float(chunk), "tasks": 1, "retry_after_s": 0})
    paths = {i: ledger_path(spec.ledgers_root, i, spec.layout) for i in orphans}

    # The coordinator writes PREPARATION as soon as the first chunk's deletes have landed.
    started = threading.Event()
    watcher = zkutil.connect(zk_target.hosts)

    def start_migration() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(watcher.exists(p) is None for p in paths.values()):
                set_flag(watcher, "PREPARATION", "oxia://oxia1:6648/default")
                started.set()
                return
            time.sleep(0.02)

    thread = threading.Thread(target=start_migration, daemon=True)
    thread.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(Refused, match="in phase PREPARATION") as refused:  # Refused: the CLI's exit 3
            delete_stage(spark, cfg, store, run_id, execute=True)
    finally:
        thread.join(timeout=5)
        zkutil.close(watcher)
    took = time.monotonic() - t0
    assert started.is_set()
    assert "stopped mid-run" in str(refused.value)

    rows = [r for r in store.read_arrow("delete_results").to_pylist() if r["run_id"] == run_id and not r["dry_run"]]
    deleted = {r["ledger_id"] for r in rows if r["outcome"] == "deleted"}
    left = {r["ledger_id"]: r for r in rows if r["detail"] == MIGRATION_NOT_ATTEMPTED}
    # Stopped within a chunk of the flag: the chunk that was running when it was written, at most one more.
    assert 1 <= len(deleted) <= 2 * chunk, (len(deleted), took)
    assert set(left) == orphans - deleted and {r["outcome"] for r in left.values()} == {"failed"}
    assert all("in phase PREPARATION" in r["error"] for r in left.values())
    # Untouched: every ledger not deleted is still there, with nothing else written to it.
    assert not [i for i in orphans - deleted if zk.exists(paths[i]) is None]
    assert not [i for i in deleted if zk.exists(paths[i]) is not None]
    # On record: each waits in the retry queue with the refusal, and the run says refused, naming the phase.
    queue = retry_states(store)
    waiting = {row["ledger_id"] for row in queue.values() if row["state"] == "queued"}
    assert waiting == set(left)
    assert all("PREPARATION" in (row["last_error"] or "") for row in queue.values())
    run = [r for r in store.read_arrow("runs").to_pylist() if r["run_id"] == run_id and r["stage"] == "delete"][-1]
    assert run["status"] == "refused" and "PREPARATION" in run["message"]

    # The migration FAILED (the source is authoritative again): the next run deletes the rest, and only that.
    set_flag(zk, "FAILED", "oxia://oxia1:6648/default")
    again = run_delete(spark, cfg, store, run_id, execute=True)
    assert {r.ledger_id for r in again.results if r.outcome == "deleted"} == orphans - deleted
    assert not [i for i in orphans if zk.exists(paths[i]) is not None]


def test_the_driver_reads_the_flag_again_once_the_tasks_end(zk: KazooClient, zk_target: ZkTarget,
                                                            tmp_path: Path) -> None:
    """A migration that began while the last chunk ran: its deletes are on record (committed before), the run is
    refused. No Spark here: `_refuse_if_migrating` is what `run` calls after the commit."""
    cfg = sandbox_config(zk_target.hosts, tmp_path / "tables")
    settings = DeleteSettings.from_config(cfg, execute=True)
    nothing = DeleteRunResult("r", True, DeleteCounts(), 0.0)
    _refuse_if_migrating(nothing, settings, ran=True)  # no flag: nothing to say
    set_flag(zk, "COPYING", "oxia://oxia1:6648/default")
    with pytest.raises(MigrationRefused, match=r"in phase COPYING.*as the delete's tasks ended"):
        _refuse_if_migrating(nothing, settings, ran=True)
    _refuse_if_migrating(nothing, DeleteSettings.from_config(cfg, execute=False), ran=True)  # a dry run deletes none


def test_the_completion_acknowledgement_holds_only_while_the_source_reads_completed(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    spec = SandboxSpec(seed=8, topics=12)
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec)
    orphans = orphans_past_grace(cluster)
    paths = [ledger_path(spec.ledgers_root, i, spec.layout) for i in orphans]
    this_url = f"zk:{zk_target.hosts}"
    # This store is the migration's target: it holds the copy of the flag the migration made while COPYING.
    set_flag(zk, "COPYING", this_url)
    with pytest.raises(MigrationRefused, match="acknowledge_migration_completed"):
        run_delete(spark, cfg, store, run_id, execute=True)  # not acknowledged: the copy of the flag refuses

    source_chroot = f"{zk_target.chroot}-source"
    source_hosts = f"{zk_target.server.connect_string}{source_chroot}"
    acknowledged = cfg.replace(safety={"acknowledge_migration_completed": True,
                                       "migration_source_store": f"zk:{source_hosts}"})
    admin = zkutil.connect(zk_target.server.connect_string)
    try:
        for phase, target, why in (
                ("FAILED", this_url, "partial copy"),  # the brokers went back to the source
                ("COPYING", this_url, "not complete"),
                ("NOT_STARTED", "", "shows no migration"),  # an operator cleared a failed one's flag
                ("COMPLETED", "oxia://other:6648/default", "not to")):
            set_flag(admin, phase, target, f"{source_chroot}{MIGRATION_FLAG_PATH}")
            with pytest.raises(MigrationRefused, match=re.escape(f"source store {source_hosts}")) as refused:
                run_delete(spark, acknowledged, store, run_id, execute=True)
            assert why in str(refused.value), (phase, str(refused.value))
            assert all(zk.exists(p) for p in paths)
        set_flag(admin, "COMPLETED", this_url, f"{source_chroot}{MIGRATION_FLAG_PATH}")
    finally:
        zkutil.close(admin)
    done = run_delete(spark, acknowledged, store, run_id, execute=True)
    assert {r.ledger_id for r in done.results if r.outcome == "deleted"} == orphans
    assert not [p for p in paths if zk.exists(p)]
