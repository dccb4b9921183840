"""Issue 45: a delete whose ZooKeeper session expires mid-run stops acting, and the run that takes the lock settles
what it left (DESIGN.md invariant 22).

The issue's reproduction, with real processes: `sweeper delete --from-json --execute` (run `frozen`) deletes at a
slow pace; once it has deleted a few ledgers its whole process group (driver, JVM, Python workers) is frozen with
SIGSTOP past its session timeout, so the ensemble expires its sessions and its lock goes. A second delete (run
`taker`) takes the lock, folds the frozen attempt in and deletes the rest. Then the frozen run is resumed with
SIGCONT: it must notice, before its next multi, that its lock is gone, delete nothing more, write no status of its
own and exit 3 naming the fault. A third run of the list finds nothing left.

Checked at the end: nothing in use deleted; every ledger gone has exactly one `deleted` row, of the run whose
attempt deleted it; none is `already_gone`; `frozen` has one status (`interrupted`, recorded by `taker`), `taker`
and the finisher `succeeded`. Without the fence (the lock's checks in each multi) the resumed run goes on after
losing its lock, files the taker's deletions as its own `already_gone` and records a second status for itself:
this test fails.

`ZOOKEEPER` is the standalone test server here; tests/ensemble/ runs the same scenario on three nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.lifecycle import group_alive
from harness.sandbox.model import SandboxSpec
from sweeper.codecs.layout import ledger_path
from sweeper.config import SweeperConfig, to_toml
from tests.support.broker import Broker
from tests.support.config import SHORT_LIVED_SPARK_ENV, ZkTarget
from tests.support.seeded import planned_delete

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _journal(root: Path) -> list[dict[str, Any]]:
    path = root / "delete_journal"
    if not (path / "_delta_log").exists():
        return []
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def _cli(config: Path, run_id: str, listed: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sweeper.cli", "delete", "--from-json", str(listed), "--execute", "--config",
         str(config), "--run-id", run_id],
        cwd=REPO, stdout=open(log.with_suffix(".out"), "ab"), stderr=open(log, "ab"),
        start_new_session=True, env={**os.environ, **SHORT_LIVED_SPARK_ENV, **env})


def _wait_group_gone(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)


def frozen_past_its_session(zk: KazooClient, hosts: str, spark: SparkSession, tmp_path: Path,
                            broker: Broker) -> None:
    """The scenario on the ZooKeeper `hosts` names (a chroot of a standalone server or of an ensemble)."""
    spec = SandboxSpec(seed=45, topics=60)
    cluster, cfg, store, run_id = planned_delete(zk, hosts, spark, tmp_path, broker, spec, emit=False)
    candidates = sorted({r["ledger_id"] for r in store.read_arrow("orphans", where={"run_id": run_id}).to_pylist()
                         if r["status"] == "candidate" and r["object_type"] == "ledger"})
    assert len(candidates) >= 24, len(candidates)
    listed = tmp_path / "orphans.json"
    listed.write_text(json.dumps(candidates))
    layout = cluster.spec.layout
    in_use = [i for i, x in cluster.ledgers.items() if x.status.value == "in_use"]
    slow: SweeperConfig = cfg.replace(delete={"deletes_per_second": 3.0, "tasks": 1, "batch_size": 1},
                                      bookkeeper={"session_timeout_s": 4.0})
    config = tmp_path / "frozen.toml"
    config.write_text(to_toml(slow))
    capped = tmp_path / "taker.toml"
    capped.write_text(to_toml(slow.replace(delete={"deletes_per_second": 1000.0})))
    finisher = tmp_path / "finisher.toml"
    finisher.write_text(to_toml(slow.replace(delete={"deletes_per_second": 1000.0})))
    root = Path(cfg.tables.root)
    logs = {name: tmp_path / f"{name}.log" for name in ("frozen", "taker", "finisher")}

    frozen = _cli(config, "frozen", listed, logs["frozen"], SWEEPER_LOG_FILE=str(tmp_path / "frozen-sweeper.log"))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc_alive(frozen) and sum(
            1 for r in _journal(root) if r["phase"] == "outcome" and r["outcome"] == "deleted") < 3:
        time.sleep(0.1)
    assert proc_alive(frozen), logs["frozen"].read_text()[-3000:]
    os.killpg(frozen.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        # The ensemble expires the frozen run's sessions: its lock, an ephemeral znode, goes.
        while zk.exists(cfg.delete.lock_path) is not None and time.monotonic() - stopped_at < 60:
            time.sleep(0.2)
        assert zk.exists(cfg.delete.lock_path) is None, "the frozen run's lock outlived its session"
        taker = _cli(capped, "taker", listed, logs["taker"], SWEEPER_LOG_FILE=str(tmp_path / "taker-sweeper.log"))
        assert taker.wait(timeout=240) == 0, logs["taker"].read_text()[-3000:]
        _wait_group_gone(taker)
    finally:
        os.killpg(frozen.pid, signal.SIGCONT)
    frozen_for = time.monotonic() - stopped_at
    code = frozen.wait(timeout=240)
    _wait_group_gone(frozen)
    terminal = logs["frozen"].read_text()
    print(f"frozen for {frozen_for:.1f}s; the resumed run exited {code}: {terminal.strip().splitlines()[-1:]}")
    assert code == 3, terminal[-3000:]
    last = terminal.strip().splitlines()[-1]
    assert last.startswith("refused: the delete run frozen stopped acting") and "lock" in last, last
    assert "Traceback" not in terminal, terminal[-3000:]

    fin = _cli(finisher, "finisher", listed, logs["finisher"],
               SWEEPER_LOG_FILE=str(tmp_path / "finisher-sweeper.log"))
    assert fin.wait(timeout=240) == 0, logs["finisher"].read_text()[-3000:]
    _wait_group_gone(fin)

    results = [r for r in store.read_arrow("delete_results", where={"dry_run": False}).to_pylist()
               if r["ledger_type"] == "LEDGER" and r["run_id"] in ("frozen", "taker", "finisher")]
    deleted = [(r["run_id"], r["ledger_id"]) for r in results if r["outcome"] == "deleted"]
    by_ledger: dict[int, list[str]] = {}
    for run, ledger in deleted:
        by_ledger.setdefault(ledger, []).append(run)
    gone = {ledger for ledger in candidates if zk.exists(ledger_path(cfg.bookkeeper.ledgers_root, ledger, layout))
            is None}
    assert gone == set(candidates), sorted(set(candidates) - gone)
    assert {k: v for k, v in by_ledger.items() if len(v) != 1} == {}, "a ledger with more than one `deleted` row"
    assert set(by_ledger) == gone, ("gone without a `deleted` row", sorted(gone - set(by_ledger)))
    # The taker settled the frozen run's deletions from its journal, never as somebody else's; the finisher re-runs
    # the whole list, so the ledgers the two others deleted are rightly `already_gone` to it (and only those).
    gone_to = {(r["run_id"], r["ledger_id"]) for r in results if r["outcome"] == "already_gone"}
    assert not {ledger for run, ledger in gone_to if run != "finisher"}, gone_to
    assert {ledger for _, ledger in gone_to} <= {ledger for ledger, runs in by_ledger.items()
                                                 if runs[0] in ("frozen", "taker")}, gone_to
    assert all(zk.exists(ledger_path(cfg.bookkeeper.ledgers_root, i, layout)) for i in in_use)
    mine = {run: [x for _, x in deleted if _ == run] for run in ("frozen", "taker", "finisher")}
    print({run: len(ids) for run, ids in mine.items()})
    # The taker finished the list; the finisher, a re-run, found nothing left to delete.
    assert len(mine["frozen"]) >= 3 and len(mine["taker"]) >= 1 and mine["finisher"] == [], mine
    statuses = {run: [r["status"] for r in store.read_arrow("runs", where={"run_id": run, "stage": "delete"})
                      .to_pylist()] for run in ("frozen", "taker", "finisher")}
    assert statuses == {"frozen": ["interrupted"], "taker": ["succeeded"], "finisher": ["succeeded"]}, statuses
    # What the frozen run deleted after it woke up (nothing) would show as journal outcomes after its fold-in.
    folded_at = next(r["at"] for r in _journal(root) if r["run_id"] == "frozen" and r["phase"] == "closed")
    late = [r for r in _journal(root) if r["run_id"] == "frozen" and r["phase"] == "outcome" and r["at"] > folded_at
            and r["outcome"] == "deleted"]
    assert late == [], late


def proc_alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def test_a_delete_frozen_past_its_session_stops_and_the_next_holder_settles_it(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    frozen_past_its_session(zk, zk_target.hosts, spark, tmp_path, broker)


def _journal_rows(root: Path, table: str) -> list[dict[str, Any]]:
    path = root / table
    if not (path / "_delta_log").exists():
        return []
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def _emit_cli(config: Path, run_id: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sweeper.cli", "emit", "--config", str(config), "--run-id", run_id],
        cwd=REPO, stdout=open(log.with_suffix(".out"), "ab"), stderr=open(log, "ab"),
        start_new_session=True, env={**os.environ, **SHORT_LIVED_SPARK_ENV, **env})


def test_an_emit_frozen_past_its_session_publishes_nothing_more_and_is_recorded_once(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    """The emit's half of the issue: a second emitter takes the lock while the first is frozen; the first, resumed,
    sends and records nothing more (its producers read the fence before they start and before they record), exits 3,
    and every record is on the topic and in `emitted` once, each attempt with one status."""
    from sweeper.emit.stage import FAILPOINT_BEFORE_RECORDING_ENV

    spec = SandboxSpec(seed=46, topics=40)
    _, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec, emit=False)
    cfg = cfg.replace(bookkeeper={"session_timeout_s": 4.0}, system_topic={"records_per_producer": 2})
    config = tmp_path / "sweeper.toml"
    config.write_text(to_toml(cfg))
    root, lock = Path(cfg.tables.root), "/ledger-sweeper/locks/emit"
    log = tmp_path / "frozen-emit.log"
    first = _emit_cli(config, run_id, log, SWEEPER_LOG_FILE=str(tmp_path / "first.log"),
                      **{FAILPOINT_BEFORE_RECORDING_ENV: "1.0"})
    deadline = time.monotonic() + 240
    while proc_alive(first) and time.monotonic() < deadline and sum(
            1 for r in _journal_rows(root, "emit_journal") if r["phase"] == "intent") < 2:
        time.sleep(0.1)
    assert proc_alive(first), log.read_text()[-3000:]
    os.killpg(first.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        while zk.exists(lock) is not None and time.monotonic() - stopped_at < 60:
            time.sleep(0.2)
        assert zk.exists(lock) is None, "the frozen emit's lock outlived its session"
        second = _emit_cli(config, run_id, tmp_path / "second-emit.log", SWEEPER_LOG_FILE=str(tmp_path / "2.log"))
        assert second.wait(timeout=240) == 0, (tmp_path / "second-emit.log").read_text()[-3000:]
        _wait_group_gone(second)
        recorded_before_resume = len(_journal_rows(root, "emitted"))
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    code = first.wait(timeout=240)
    _wait_group_gone(first)
    terminal = log.read_text()
    last = terminal.strip().splitlines()[-1]
    print(f"the resumed emit exited {code}: {last[:300]}")
    assert code == 3 and last.startswith(f"refused: the emit of run {run_id} stopped publishing"), terminal[-3000:]
    assert "Traceback" not in terminal
    emitted = [r for r in _journal_rows(root, "emitted") if r["run_id"] == run_id]
    assert len(emitted) == recorded_before_resume, "the resumed emit recorded after losing its lock"
    keys = [r["record_key"] for r in emitted]
    assert len(keys) == len(set(keys)), "a record in `emitted` twice"
    on_topic = [(m.producer_name, m.sequence_id) for m in broker.messages()]
    assert len(on_topic) == len(set(on_topic)), "a record on the topic twice"
    assert set(on_topic) == {(r["producer_name"], r["sequence_id"]) for r in emitted}, "topic and emitted disagree"
    statuses = sorted(r["status"] for r in store.read_arrow("runs", where={"run_id": run_id, "stage": "emit"})
                      .to_pylist())
    assert statuses == ["interrupted", "succeeded"], statuses  # the frozen attempt once, by the second emit's fold


def test_a_retention_repair_frozen_past_its_session_makes_no_more_admin_calls(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    """The repair's half: frozen after its first calls, its lock taken by the next repair, which finishes the plan; the
    frozen one, resumed, checks its lock before its next admin call, makes none, and exits 3; its run has one status."""
    from datetime import UTC, datetime

    from sweeper.runs import record as record_run
    from sweeper.table_schemas import RETENTION_DEBT
    from sweeper.tables import open_table_store
    from tests.support.admin_server import AdminServer, pulsar_like_answers
    from tests.support.gates import record_gated_reconcile
    from tests.support.seeded import sandbox_config
    from tests.test_retention_repair_killed import LOCK, TOKEN, _plan_row, _seed

    for topic, cursor in (("a", "idle-sub"), ("b", None), ("c", "idle-sub"), ("d", None)):
        _seed(zk, topic, cursor)
    admin = AdminServer(pulsar_like_answers(zk))
    try:
        cfg = sandbox_config(zk_target.hosts, tmp_path / "tables", bookkeeper={"session_timeout_s": 4.0},
                             system_topic={"admin_url": admin.url, "auth_token_env": "SWEEPER_TEST_TOKEN"},
                             retention={"cursor_idle_days": 30.0, "actions_per_second": 1.0})
        root = Path(cfg.tables.root)
        store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
        store.append_rows("retention_debt", [_plan_row("a", "idle-sub", 400), _plan_row("b", None, 300),
                                             _plan_row("c", "idle-sub", 200), _plan_row("d", None, 100)],
                          RETENTION_DEBT)
        record_gated_reconcile(store, "plan-1", {}, cfg)
        record_run(store, "plan-1", "retention_debt", "succeeded", datetime.now(UTC), {}, cfg)
        config = tmp_path / "sweeper.toml"
        config.write_text(to_toml(cfg))

        def repair(log: Path) -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                [sys.executable, "-m", "sweeper.cli", "retention", "--execute", "--config", str(config),
                 "--run-id", "plan-1"], cwd=REPO, stdout=open(log.with_suffix(".out"), "ab"),
                stderr=open(log, "ab"), start_new_session=True,
                env={**os.environ, **SHORT_LIVED_SPARK_ENV, "SWEEPER_TEST_TOKEN": TOKEN,
                     "SWEEPER_LOG_FILE": str(tmp_path / f"{log.stem}-sweeper.log")})

        frozen_log = tmp_path / "frozen-repair.log"
        frozen = repair(frozen_log)
        deadline = time.monotonic() + 240
        while proc_alive(frozen) and len(admin.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc_alive(frozen), frozen_log.read_text()[-3000:]
        os.killpg(frozen.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            while zk.exists(LOCK) is not None and time.monotonic() - stopped_at < 60:
                time.sleep(0.2)
            assert zk.exists(LOCK) is None, "the frozen repair's lock outlived its session"
            taker = repair(tmp_path / "taker-repair.log")
            assert taker.wait(timeout=300) == 0, (tmp_path / "taker-repair.log").read_text()[-3000:]
            _wait_group_gone(taker)
            calls_before_resume = len(admin.requests)
        finally:
            os.killpg(frozen.pid, signal.SIGCONT)
        code = frozen.wait(timeout=240)
        _wait_group_gone(frozen)
        terminal = frozen_log.read_text()
        print(f"the resumed repair exited {code}: {terminal.strip().splitlines()[-1][:300]}")
        assert code == 3 and "stopped acting" in terminal and "Traceback" not in terminal, terminal[-3000:]
        assert len(admin.requests) == calls_before_resume, admin.requests[calls_before_resume:]
        runs = {}
        for r in _journal_rows(root, "runs"):
            if r["stage"] == "retention_repair":
                runs.setdefault(r["run_id"], []).append(r["status"])
        assert sorted(map(tuple, runs.values())) == [("interrupted",), ("succeeded",)], runs
    finally:
        admin.close()
