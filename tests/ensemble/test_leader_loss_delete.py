"""Issue 45: the ZooKeeper ensemble loses its leader while `sweeper delete --execute` sends its compare-and-set multis.

A synthetic Pulsar cluster with a known set of orphans (harness.sandbox, one injected orphan per topic) is seeded into
a chroot of the three-node ensemble, snapshotted, reconciled and emitted (in this process). Then `delete --execute`
runs as an operator runs it: a CLI process with its own Spark JVM, two tasks, paced ([delete] deletes_per_second), two
ledgers to a multi, connected to all three members with the chroot.

The leader is killed at the instant the sixth deleting multi has been applied and answered, and that answer is lost
(tests.support.zk_ensemble.AimedElection: a leader's death drops every client of the ensemble; the proxy makes the
unlucky timing certain). Every multi then in flight fails with ConnectionLoss, applied or not, while the other two
members elect a new leader; kazoo reconnects the tasks' and the driver's sessions (the driver's run lock, an
ephemeral znode, survives with its session). The run must finish correctly or stop with exit 3 and one line, never a
traceback: nothing in use deleted (the seed's ground truth), every deleted ledger exactly one `deleted` row of this
run and none `already_gone` (the lost answer's ledgers are this run's deletions, DESIGN.md invariant 18), a stopped
run not `succeeded`, and a re-run that finishes everything, with nothing left and nothing recorded twice.

Able to fail: without the in-task lost-answer handling (sweeper.delete.zk_executor: a ledger whose delete's answer
was lost, found gone, is `deleted` by this run) the lost multi's ledgers are filed `already_gone`; without kazoo's
reconnect the tasks lose their sessions and the run ends with a traceback.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxSpec, Status
from harness.zkensemble import EnsembleInfo
from sweeper.codecs.layout import ledger_path
from sweeper.config import to_toml
from sweeper.delete.stage import run_delete
from tests.support.broker import Broker
from tests.support.seeded import orphans_past_grace, planned_delete
from tests.support.zk_ensemble import (
    AimedElection,
    EnsembleTarget,
    assert_finished_or_refused,
    run_cli,
    wait_until,
)
from tests.support.zk_faults import MULTI, multi_deletes

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("zk-ensemble-delete"), pytest.mark.timeout(900)]

AIMED_MULTI = 6  # the deleting multi whose answer the leader's death takes: past the first chunks, well before the end
LOST = "the answer to its delete was lost"


def test_the_delete_rides_out_the_leader_killed_as_a_multi_is_answered(
        zk_ensemble: EnsembleInfo, ensemble_target: EnsembleTarget, ensemble_zk: KazooClient, spark: SparkSession,
        tmp_path: Path, broker: Broker) -> None:
    begun = time.monotonic()
    spec = SandboxSpec(seed=5, topics=50, orphan_fraction=1.0)
    cluster, cfg, store, run_id = planned_delete(ensemble_zk, ensemble_target.hosts, spark, tmp_path, broker, spec)
    orphans = orphans_past_grace(cluster)
    in_use = [i for i, x in cluster.ledgers.items() if x.status is Status.IN_USE]
    assert len(orphans) >= 50
    by_path = {ensemble_target.chroot + ledger_path(spec.ledgers_root, i, spec.layout): i for i in cluster.ledgers}
    started = time.monotonic()

    multis = {"count": 0}

    def aim(op: int, body: bytes) -> bool:
        if op == MULTI and multi_deletes(body):
            multis["count"] += 1
            return multis["count"] == AIMED_MULTI
        return False

    with AimedElection(zk_ensemble, aim) as aimed:
        # ~3 s of deletes on two tasks: two ledgers a multi, a chunk of ten records a second each.
        cfg = cfg.replace(bookkeeper={"zookeeper": aimed.hosts(ensemble_target.chroot)},
                          delete={"deletes_per_second": 10.0, "batch_size": 2, "tasks": 2, "in_task_attempts": 3,
                                  "op_timeout_s": 10.0})
        config_file = tmp_path / "sweeper.toml"
        config_file.write_text(to_toml(cfg))
        command = ["delete", "--execute", "--config", str(config_file), "--run-id", run_id]

        def strike(proc: Any) -> None:
            wait_until(f"deleting multi {AIMED_MULTI}", lambda: aimed.killed is not None, proc)

        first = run_cli(command, tmp_path, "delete-1", during=strike)
        election = aimed.wait_elected()
        lost = {by_path[p] for paths in aimed.lost for p in paths}
        print(f"\nplanned in {started - begun:.0f} s, delete 1 took {time.monotonic() - started:.0f} s")
        print(f"killed {election.killed} as it answered deleting multi {AIMED_MULTI} ({sorted(lost)}); new leader "
              f"in {election.elected_s:.2f} s; delete 1: exit {first.code}")
        stopped = assert_finished_or_refused(first)
        attempts = 1
        if first.code != 0:
            assert _delete_runs(store, run_id)[-1]["status"] != "succeeded"
    # The re-run (in this process: its exit code is not the question), straight to the members: it finishes
    # whatever is left, and records nothing twice.
    again = run_delete(spark, cfg.replace(bookkeeper={"zookeeper": ensemble_target.hosts}), store, run_id,
                       execute=True)
    attempts += 1
    assert again.counts.failed == 0 and again.counts.already_gone == 0, again.counts

    # The whole multi (two ledgers, one when it ends a chunk), all of them orphans.
    assert 1 <= len(lost) <= 2 and lost <= orphans, (lost, aimed.lost)
    rows = [r for r in store.read_arrow("delete_results", where={"run_id": run_id, "dry_run": False}).to_pylist()
            if r["ledger_type"] == "LEDGER"]
    deleted = Counter(r["ledger_id"] for r in rows if r["outcome"] == "deleted")
    gone_twice = [(r["ledger_id"], r["detail"]) for r in rows if r["outcome"] == "already_gone"]
    assert not gone_twice, f"a deletion of this run filed as someone else's: {gone_twice}"
    assert max(deleted.values()) == 1, [i for i, n in deleted.items() if n > 1]
    assert set(deleted) == orphans, (sorted(orphans - set(deleted)), sorted(set(deleted) - orphans))
    details = {r["ledger_id"]: r["detail"] for r in rows if r["outcome"] == "deleted"}
    assert all(LOST in details[i] for i in lost), {i: details[i] for i in lost}
    # What ZooKeeper holds: every orphan gone, every ledger in use still there.
    for ledger in orphans:
        assert not ensemble_zk.exists(ledger_path(spec.ledgers_root, ledger, spec.layout)), ledger
    missing = [i for i in in_use if not ensemble_zk.exists(ledger_path(spec.ledgers_root, i, spec.layout))]
    assert not missing, f"ledgers in use deleted: {missing}"
    runs = _delete_runs(store, run_id)
    assert runs[-1]["status"] == "succeeded"
    assert stopped is None or runs[0]["status"] != "succeeded"
    finished = re.search(r": (\d+) deleted, (\d+) already gone", first.out)
    print(f"delete 1: {finished.group(0) if finished else first.err.strip()}; {attempts} runs; "
          f"{sum(LOST in d for d in details.values())} deletions whose answer was lost")


def _delete_runs(store: Any, run_id: str) -> list[dict[str, Any]]:
    rows = store.read_arrow("runs", where={"run_id": run_id, "stage": "delete"}).to_pylist()
    return sorted(rows, key=lambda r: r["started_at"])


def test_the_run_lock_taken_as_the_leader_dies_is_this_runs(
        zk_ensemble: EnsembleInfo, ensemble_target: EnsembleTarget, ensemble_zk: KazooClient) -> None:
    """The leader killed at the instant the lock's create is applied and answered, the answer lost: the run must
    find the lock its own (an ephemeral znode of its session) and go on, or refuse with one line; never a kazoo
    error, never "another delete run holds" about itself."""
    from sweeper.delete.lock import DeleteRunLock
    from sweeper.zk import client as zkutil
    from tests.support.zk_faults import MULTI, multi_creates

    lock_path = "/ledger-sweeper/locks/delete"
    ensemble_zk.ensure_path(lock_path.rsplit("/", 1)[0])
    aimed_path = ensemble_target.chroot + lock_path

    def aim(op: int, body: bytes) -> bool:  # the multi that creates the lock and bumps its epoch (sweeper.run_lock)
        return op == MULTI and aimed_path in multi_creates(body)

    with AimedElection(zk_ensemble, aim) as aimed:
        client = zkutil.connect(aimed.hosts(ensemble_target.chroot))
        try:
            lock = DeleteRunLock(client, lock_path, run_id="run-45")
            lock.acquire()
            assert aimed.lost == [[aimed_path]]
            _, stat = ensemble_zk.get(lock_path)
            assert stat.ephemeralOwner == client.client_id[0], "the lock is not this run's session's"
            lock.release()
            assert not ensemble_zk.exists(lock_path)
        finally:
            zkutil.close(client)
