"""Issue 22: a `delete --execute` killed at any instant leaves every deletion on record, with the run that made it;
an `emit` killed at any instant leaves the topic and `emitted` in agreement once the next emit has run.

The run's emit goes first, as its own CLI processes: stopped with SIGKILL and with SIGINT once producers have
begun (each producer task waits 0.5 s between the broker's acknowledgements and its `emitted` commit, so a stop
lands where records are on the topic but not on record), then run to the end. Every record on the topic is then
in `emitted` exactly once, nothing is on the topic twice, each stopped attempt is `interrupted` in `runs` and
closed in `emit_journal`. SWEEPER_EMIT_KILL_POINTS (default 1) sets how many stops of each kind.

`sweeper delete --execute` runs as a real CLI process at a slow pace against a seeded sandbox (real ZooKeeper,
Spark, Delta), and is stopped again and again at random points (seeded and printed): with SIGINT sent to its
process group, as Ctrl-C does, and with SIGKILL to the driver alone. Each next attempt resolves the stopped
one; a last attempt runs to the end. Then every ledger znode that is gone has exactly one `deleted` outcome
of the run, nothing an attempt deleted is filed `already_gone`, nothing in use is gone, each stopped attempt
is `interrupted` in `runs`, and the deleted set is the ground truth. SWEEPER_KILL_POINTS (default 1, to keep
the suite in its time budget; 5 is the acceptance run) sets how many stops of each kind. Between a chunk's
deletes and its outcome commit the tasks wait 0.4 s (a failpoint), so stops land there too: ledgers deleted
whose outcome was never recorded, which only the journal's intents tell.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
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
from sweeper.delete.tasks import FAILPOINT_BEFORE_OUTCOMES_ENV
from sweeper.emit.stage import FAILPOINT_BEFORE_RECORDING_ENV
from tests.support.broker import Broker
from tests.support.config import SHORT_LIVED_SPARK_ENV, ZkTarget
from tests.support.seeded import planned_delete

REPO = Path(__file__).resolve().parents[1]
KILL_POINTS = int(os.environ.get("SWEEPER_KILL_POINTS", "1"))
EMIT_KILL_POINTS = int(os.environ.get("SWEEPER_EMIT_KILL_POINTS", "1"))
SEED = int(os.environ.get("SWEEPER_KILL_SEED", "2211"))

# Minutes: CLI processes started, stopped and started again. A hang is stopped well before the suite's own guard,
# with every thread's stack; each attempt prints a line as it ends, so a failure shows how far the plan got.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _journal_rows(root: Path, attempt_prefix: str = "") -> list[dict[str, Any]]:
    path = root / "delete_journal"
    if not (path / "_delta_log").exists():
        return []
    rows = DeltaTable(str(path)).to_pyarrow_table(columns=["attempt_id", "phase"]).to_pylist()
    return [r for r in rows if r["attempt_id"].startswith(attempt_prefix)]


def _unfolded_on_view(root: Path, run_id: str) -> int:
    """Issue 34 item 7: before the next attempt folds a stopped one in, `sweeper show RUN deletes` lists what its
    journal holds (each deletion once, each intent without an outcome) and `sweeper runs` shows the run
    interrupted; read in this process, without Spark. The number of journalled deletions it lists."""
    from sweeper.cli import main

    journal = DeltaTable(str(root / "delete_journal")).to_pyarrow_table().to_pylist() \
        if (root / "delete_journal" / "_delta_log").exists() else []
    closed = {r["attempt_id"] for r in journal if r["phase"] == "closed"}
    # An attempt whose fold-in was stopped after its `runs` row is folded but for its closing row.
    folded = " ".join(r["message"] or "" for r in DeltaTable(str(root / "runs")).to_pyarrow_table(
        columns=["message"]).to_pylist())
    unclosed = [r for r in journal if r["attempt_id"] not in closed and r["attempt_id"] not in folded]
    if not unclosed:
        return 0  # stopped before its journal opened: nothing to fold in
    deleted = {r["record_key"] for r in unclosed if r["phase"] == "outcome" and r["outcome"] == "deleted"}
    in_flight = {r["record_key"] for r in unclosed if r["phase"] == "intent"} - {
        r["record_key"] for r in unclosed if r["phase"] == "outcome"}

    def read(*argv: str) -> list[dict[str, Any]]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main([*argv, "--tables", str(root), "--limit", "0", "--format", "json"]) == 0
        return [json.loads(line) for line in out.getvalue().splitlines()]

    shown = read("show", run_id, "deletes")
    listed = [r["record_key"] for r in shown if r["outcome"] == "deleted"]
    assert deleted <= set(listed) and len(listed) == len(set(listed)), (sorted(deleted - set(listed)), listed)
    assert in_flight <= {r["record_key"] for r in shown}, sorted(in_flight - {r["record_key"] for r in shown})
    [run] = [r for r in read("runs") if r["run_id"] == run_id]
    assert run["status"] == "interrupted", run
    return len(deleted)


def _wait_gone(proc: subprocess.Popen[bytes], zk: KazooClient, lock_path: str, timeout: float = 60.0) -> None:
    """Nothing of the attempt runs any more (its JVM and Python workers are in its process group) and its run
    lock, an ephemeral znode, is released or has expired with the killed driver's session."""
    deadline = time.monotonic() + timeout
    _wait_group_gone(proc, timeout)
    while zk.exists(lock_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not zk.exists(lock_path), "the run lock outlived its session"


def _wait_group_gone(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """The attempt's JVM and Python workers (its process group) have exited, killed if they outstay `timeout`."""
    deadline = time.monotonic() + timeout
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)


def test_delete_killed_at_random_points_leaves_every_deletion_on_record(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker) -> None:
    spec = SandboxSpec(seed=22, topics=30)
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec, emit=False)
    cfg = cfg.replace(delete={"deletes_per_second": 2.0, "tasks": 2},
                      bookkeeper={"session_timeout_s": 4.0}, system_topic={"records_per_producer": 3})
    config_file = tmp_path / "sweeper.toml"
    config_file.write_text(to_toml(cfg))
    _emit_stopped_then_finished(cfg, config_file, run_id, broker, tmp_path)
    emitted = {r["ledger_id"] for r in store.read_arrow("emitted", where={"run_id": run_id}).to_pylist()
               if r["ledger_type"] == "LEDGER"}
    assert len(emitted) >= 20, "enough records for many stops"
    layout = cluster.spec.layout
    path_of = {ledger: ledger_path(cfg.bookkeeper.ledgers_root, ledger, layout) for ledger in emitted}
    in_use = [i for i, x in cluster.ledgers.items() if x.status.value == "in_use"]
    rng = random.Random(SEED)
    stops = [signal.SIGINT, signal.SIGKILL] * KILL_POINTS
    rng.shuffle(stops)
    log = tmp_path / "attempts.log"
    plan = []
    for n, how in enumerate([*stops, None]):
        before = len(_journal_rows(Path(cfg.tables.root)))
        begun = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sweeper.cli", "delete", "--execute", "--config", str(config_file),
             "--run-id", run_id],
            cwd=REPO, stdout=open(log.with_suffix(".out"), "ab"), stderr=open(log, "ab"),  # noqa: SIM115
            start_new_session=True,
            env={**os.environ, **SHORT_LIVED_SPARK_ENV, "SWEEPER_LOG_FILE": str(tmp_path / "sweeper.log"),
                 FAILPOINT_BEFORE_OUTCOMES_ENV: "0.4"})
        if how is not None:
            # A random point: after a random number of journal commits of this attempt, plus a random delay; or
            # a random time, whichever comes first (an attempt with little left may finish before either).
            commits, delay, latest = rng.randint(0, 4), rng.uniform(0.0, 1.2), rng.uniform(8.0, 25.0)
            plan.append((n, how.name, commits, round(delay, 2), round(latest, 1)))
            if how is signal.SIGKILL:
                # A SIGKILL lands in the attempt's delete phase (its clock starts when its journal opens): on a
                # loaded machine Spark's start alone can outlast `latest`, and a kill before the journal opens
                # leaves nothing to resolve. SIGINT keeps its clock from the start, so it also stops start-ups.
                opened = time.monotonic()
                while proc.poll() is None and len(_journal_rows(Path(cfg.tables.root))) == before \
                        and time.monotonic() - opened < 180:
                    time.sleep(0.1)
            started = time.monotonic()
            while proc.poll() is None and time.monotonic() - started < latest:
                if len(_journal_rows(Path(cfg.tables.root))) - before >= commits * 2 + 1:
                    time.sleep(delay)
                    break
                time.sleep(0.1)
            if proc.poll() is None:
                if how is signal.SIGINT:
                    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
                else:
                    os.kill(proc.pid, signal.SIGKILL)
        # The driver's own exit, not the end of its output: a Python worker of the stopped attempt that outlives it
        # would hold a pipe open until the timeout (its process group is cleared below).
        proc.wait(timeout=240)
        print(f"delete attempt {n} ({how.name if how else 'to the end'}): exit {proc.returncode} after "
              f"{time.monotonic() - begun:.1f} s, journal rows {before} -> {len(_journal_rows(Path(cfg.tables.root)))}",
              flush=True)
        if how is signal.SIGINT and proc.returncode != 0:
            assert proc.returncode == 130, (n, proc.returncode, log.read_text()[-2000:])
            text = log.read_text().strip().splitlines()
            assert text and text[-1].startswith("interrupted"), text[-5:]
        _wait_gone(proc, zk, cfg.delete.lock_path)
        if how is not None:
            print(f"  before the next attempt, `show {run_id} deletes` lists "
                  f"{_unfolded_on_view(Path(cfg.tables.root), run_id)} deletions from the journal", flush=True)
    print(f"kill plan (seed {SEED}): {plan}")
    assert proc.returncode == 0, log.read_text()[-3000:]
    terminal = log.read_text()
    assert "Traceback" not in terminal and "py4j" not in terminal and "ERROR" not in terminal, terminal[-3000:]

    results = [r for r in store.read_arrow("delete_results", where={"run_id": run_id, "dry_run": False}).to_pylist()
               if r["ledger_type"] == "LEDGER"]
    deleted = [r["ledger_id"] for r in results if r["outcome"] == "deleted"]
    gone = {ledger for ledger, path in path_of.items() if zk.exists(path) is None}
    assert sorted(deleted) == sorted(set(deleted)), "exactly one `deleted` outcome per ledger"
    assert set(deleted) == gone == emitted, (sorted(emitted - gone), sorted(gone - set(deleted)))
    assert not [r for r in results if r["outcome"] == "already_gone"], "another attempt's deletion as its own"
    assert all(zk.exists(ledger_path(cfg.bookkeeper.ledgers_root, i, layout)) for i in in_use)
    runs = store.read_arrow("runs", where={"run_id": run_id, "stage": "delete"}).to_pylist()
    interrupted = [r for r in runs if r["status"] == "interrupted"]
    journal = _journal_rows(Path(cfg.tables.root))
    attempts = {r["attempt_id"] for r in journal}
    closed = {r["attempt_id"] for r in journal if r["phase"] == "closed"}
    assert attempts == closed, "every attempt closed: by itself or by the next one"
    # A stop that caught an attempt after it opened its journal and before it closed it is one `interrupted` row,
    # whose counts the next attempt took from the journal and ZooKeeper.
    assert 0 < len(interrupted) <= min(len(stops), len(attempts) - 1)
    assert sum(dict(r["counts"])["deleted"] for r in interrupted) <= len(emitted)
    recovered = [r for r in results if r["outcome"] == "deleted" and r["detail"].startswith("deleted by attempt ")]
    print(f"{len(interrupted)} attempts interrupted; {len(recovered)} deletions known only from their intents")
    assert all(r["message"].startswith("attempt ") and len(r["message"]) < 500 for r in interrupted)
    # Every count of every `runs` row, the interrupted attempts' own included, is a field of its stage's counts.
    from sweeper.pipeline import COUNTS

    for row in store.read_arrow("runs").to_pylist():
        assert COUNTS[row["stage"]].from_row(dict(row["counts"] or {})).extra == {}, row


def _emit_stopped_then_finished(cfg: SweeperConfig, config_file: Path, run_id: str, broker: Broker,
                                tmp_path: Path) -> None:
    root = Path(cfg.tables.root)

    def journal(phase: str) -> list[dict[str, Any]]:
        if not (root / "emit_journal" / "_delta_log").exists():
            return []
        return [r for r in DeltaTable(str(root / "emit_journal")).to_pyarrow_table().to_pylist() if r["phase"] == phase]

    rng = random.Random(SEED + 1)
    stops = [signal.SIGINT, signal.SIGKILL] * EMIT_KILL_POINTS
    rng.shuffle(stops)
    log, plan = tmp_path / "emit-attempts.log", []
    for n, how in enumerate([*stops, None]):
        before = len(journal("intent"))
        begun = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sweeper.cli", "emit", "--config", str(config_file), "--run-id", run_id],
            cwd=REPO, stdout=open(log.with_suffix(".out"), "ab"), stderr=open(log, "ab"),  # noqa: SIM115
            start_new_session=True,
            env={**os.environ, **SHORT_LIVED_SPARK_ENV, "SWEEPER_LOG_FILE": str(tmp_path / "emit.log"),
                 FAILPOINT_BEFORE_RECORDING_ENV: "0.5"})
        if how is not None:
            producers, delay = rng.randint(1, 3), rng.uniform(0.0, 0.6)
            plan.append((n, how.name, producers, round(delay, 2)))
            started = time.monotonic()
            while proc.poll() is None and time.monotonic() - started < 60:
                if len(journal("intent")) - before >= producers:
                    time.sleep(delay)
                    break
                time.sleep(0.05)
            if proc.poll() is None:
                if how is signal.SIGINT:
                    os.killpg(proc.pid, signal.SIGINT)
                else:
                    os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=240)
        print(f"emit attempt {n} ({how.name if how else 'to the end'}): exit {proc.returncode} after "
              f"{time.monotonic() - begun:.1f} s, intents {before} -> {len(journal('intent'))}", flush=True)
        if how is signal.SIGINT and proc.returncode != 0:
            assert proc.returncode == 130, (n, proc.returncode, log.read_text()[-2000:])
        _wait_group_gone(proc, 60.0)
    print(f"emit kill plan (seed {SEED + 1}): {plan}")
    assert proc.returncode == 0, log.read_text()[-3000:]

    emitted = DeltaTable(str(root / "emitted")).to_pyarrow_table(
        columns=["run_id", "record_key", "producer_name", "sequence_id"]).to_pylist()
    mine = [r for r in emitted if r["run_id"] == run_id]
    on_topic = [(m.producer_name, m.sequence_id) for m in broker.messages()]
    assert len(on_topic) == len(set(on_topic)), "a record on the topic twice"
    assert set(on_topic) == {(r["producer_name"], r["sequence_id"]) for r in mine}, "topic and emitted disagree"
    assert len({r["record_key"] for r in mine}) == len(on_topic)
    runs = DeltaTable(str(root / "runs")).to_pyarrow_table().to_pylist()
    rows = [r for r in sorted(runs, key=lambda r: r["started_at"]) if r["run_id"] == run_id and r["stage"] == "emit"]
    statuses = [r["status"] for r in rows]
    started = {r["attempt_id"] for r in journal("started")}
    assert started == {r["attempt_id"] for r in journal("closed")}, "every emit attempt closed"
    # Each stop that caught an attempt after its first send is one `interrupted` row, from its journal; a SIGINT
    # that caught one before (a loaded machine: Spark's start outlasted the wait) is a plain row of its own, and a
    # SIGKILL then leaves nothing to record. The last run succeeded.
    interrupted = [r for r in rows if r["status"] == "interrupted"]
    before_sending = [r for r in interrupted if "before anything was sent" in (r["message"] or "")]
    assert statuses[-1] == "succeeded", statuses
    assert len(interrupted) - len(before_sending) == len(started) - 1 <= len(stops), statuses
    assert len(interrupted) <= len(stops), statuses
