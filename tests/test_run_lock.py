"""Issue 45: only the lock holder acts (DESIGN.md invariant 22), on a real ZooKeeper.

The run lock is an ephemeral znode; taking it bumps an epoch znode beside it in the same multi, and every delete
multi checks both (sweeper.run_lock). These tests end a holder's session the way an expiry does (the ensemble
deletes its ephemeral nodes), let another run take the lock, and show that the first run's fence then refuses its
multis and its reads, that a deleter carrying that fence deletes nothing, and that a lock whose holder is a dead
process of this host is waited for instead of refused.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from harness.zkserver import ServerClock
from sweeper.codecs.layout import LedgerLayout, ledger_path
from sweeper.delete.lock import DeleteRunLock
from sweeper.delete.results import DELETED, FAILED
from sweeper.delete.zk_executor import LOCK_LOST, LedgerDeleter
from sweeper.errors import LockLost, RunLockHeld
from sweeper.run_lock import LockWatch
from sweeper.zk import client as zkutil
from tests.support.config import ZkTarget
from tests.support.ledgers import ledger_bytes

LOCK = "/ledger-sweeper/locks/delete"
ROOT = "/ledgers"
DAY_MS = 24 * 3600 * 1000


def _orphans(zk: KazooClient, clock: ServerClock, ids: list[int]) -> list[dict[str, Any]]:
    """Pulsar ledgers of a deleted topic, over a week old by both clocks: deletable orphans."""
    records = []
    custom = {"application": "pulsar", "component": "managed-ledger", "pulsar/managed-ledger": "t/ns/persistent/gone"}
    with clock.at(int(time.time() * 1000) - 8 * DAY_MS):
        for ledger in ids:
            zk.create(ledger_path(ROOT, ledger, LedgerLayout.HIERARCHICAL), ledger_bytes(custom), makepath=True)
            records.append({"ledgerId": ledger, "ledgerType": "LEDGER", "ledgerComponent": "MANAGED_LEDGER",
                            "topicName": "persistent://t/ns/gone"})
    return records


def _deleter(zk: KazooClient, fence: Any) -> LedgerDeleter:
    return LedgerDeleter(zk, ledgers_root=ROOT, layout=LedgerLayout.HIERARCHICAL, min_age_ms=DAY_MS, execute=True,
                         batch_size=2, fence=fence)


def test_taking_the_lock_moves_the_epoch_and_the_old_holders_fence_fails_in_a_multi(
        zk: KazooClient, zk_target: ZkTarget) -> None:
    first_client = zkutil.connect(zk_target.hosts)
    first = DeleteRunLock(first_client, LOCK, run_id="first")
    first.acquire()
    assert first.fence is not None
    old = first.fence
    assert old.verify(zk) is None
    # The session ends (an expiry deletes its ephemeral nodes as a close does); another run takes the lock.
    zkutil.close(first_client)
    assert "session expired" in (old.verify(zk) or "")
    with DeleteRunLock(zk, LOCK, run_id="second") as second:
        assert second.fence is not None and second.fence.epoch_version > old.epoch_version
        assert second.fence.lock_version == old.lock_version == 0  # why the lock's version alone cannot tell
        assert "another run took it" in (old.verify(zk) or "")
        tx = zk.transaction()
        for path, version in old.checks():
            tx.check(path, version)
        outcome = tx.commit()
        assert isinstance(outcome[1], BadVersionError), outcome
        assert second.fence.verify(zk) is None


def test_a_deleter_whose_run_lost_its_lock_deletes_nothing(zk: KazooClient, zk_target: ZkTarget,
                                                            zk_clock: ServerClock) -> None:
    records = _orphans(zk, zk_clock, [101, 102, 103, 104])
    first_client = zkutil.connect(zk_target.hosts)
    first = DeleteRunLock(first_client, LOCK, run_id="first")
    first.acquire()
    fence = first.fence
    # While it holds the lock, its deletes go through with the fence in the multi.
    results = _deleter(zk, fence).process(records[:2])
    assert [r.outcome for r in results] == [DELETED, DELETED]
    zkutil.close(first_client)  # its session ends
    with DeleteRunLock(zk, LOCK, run_id="second"):
        deleter = _deleter(zk, fence)
        results = deleter.process(records[2:])
        assert [(r.outcome, r.detail) for r in results] == [(FAILED, LOCK_LOST)] * 2, results
        assert "another run" in (deleter.lock_lost or "")
        for record in records[2:]:
            assert zk.exists(ledger_path(ROOT, record["ledgerId"], LedgerLayout.HIERARCHICAL)) is not None
    # No holder at all: the lock node is gone, which the multi's first check finds.
    deleter = _deleter(zk, fence)
    assert [r.detail for r in deleter.process(records[2:])] == [LOCK_LOST] * 2
    assert "session expired" in (deleter.lock_lost or "")


def test_the_lock_watch_stops_for_good_and_run_lock_check_raises(zk: KazooClient, zk_target: ZkTarget) -> None:
    client = zkutil.connect(zk_target.hosts)
    lock = DeleteRunLock(client, LOCK, run_id="watched")
    lock.acquire()
    assert lock.fence is not None
    watch = LockWatch(zk, lock.fence, timeout_s=2.0)
    assert not watch.stop()
    lock.check()
    zkutil.close(client)
    assert watch.stop() and watch.detail == LOCK_LOST and "session expired" in (watch.error or "")
    with DeleteRunLock(zk, LOCK, run_id="next"):
        assert watch.stop()  # lost for good, even once the lock exists again
    lock.client = zk  # the holder's own view, through a live session: its lock is not there
    with pytest.raises(LockLost, match="stopped acting"):
        lock.check()


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def _hold_as(zk_target: ZkTarget, host: str, pid: int) -> KazooClient:
    """Another session holding the lock, its body naming `host` and `pid` (as a killed run's lock does)."""
    client = zkutil.connect(zk_target.hosts)
    client.ensure_path(LOCK.rsplit("/", 1)[0])
    client.create(LOCK, json.dumps({"run_id": "killed", "host": host, "pid": pid, "started_ms": 0}).encode(),
                  ephemeral=True)
    return client


def test_a_lock_held_by_a_dead_process_of_this_host_is_waited_for(zk: KazooClient, zk_target: ZkTarget) -> None:
    holder = _hold_as(zk_target, socket.gethostname(), _dead_pid())
    said: list[str] = []
    # The killed run's session expires 1.5 s from now (closed here: what the ensemble does at its timeout).
    threading.Timer(1.5, zkutil.close, args=(holder,)).start()
    started = time.monotonic()
    with DeleteRunLock(zk, LOCK, run_id="next", wait_for_dead_local_holder_s=20.0, log=said.append) as lock:
        assert lock.holder()["run_id"] == "next"  # type: ignore[index]
    assert 1.0 < time.monotonic() - started < 15.0
    assert len(said) == 1 and "is gone: waiting up to 20s" in said[0], said


@pytest.mark.parametrize("whose", ["another host", "a live process"])
def test_a_lock_held_elsewhere_or_by_a_live_process_is_refused_at_once(zk: KazooClient, zk_target: ZkTarget,
                                                                       whose: str) -> None:
    host, pid = ("elsewhere.example", _dead_pid()) if whose == "another host" else (socket.gethostname(), os.getpid())
    holder = _hold_as(zk_target, host, pid)
    try:
        started = time.monotonic()
        with pytest.raises(RunLockHeld, match="killed"):
            DeleteRunLock(zk, LOCK, run_id="next", wait_for_dead_local_holder_s=20.0).acquire()
        assert time.monotonic() - started < 5.0
    finally:
        zkutil.close(holder)


def test_release_leaves_another_sessions_lock_alone(zk: KazooClient, zk_target: ZkTarget) -> None:
    client = zkutil.connect(zk_target.hosts)
    first = DeleteRunLock(client, LOCK, run_id="first")
    first.acquire()
    zkutil.close(client)
    with DeleteRunLock(zk, LOCK, run_id="second"):
        first.client = zk
        first.release()  # its session is gone and the lock is another's: nothing deleted
        assert zk.get(LOCK)[0] and json.loads(zk.get(LOCK)[0])["run_id"] == "second"
    with pytest.raises(NoNodeError):
        zk.get(LOCK)
