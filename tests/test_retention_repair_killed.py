"""Issue 34, item 2: a retention repair SIGKILLed right after the broker answered one of its calls leaves a row for
every call the broker answered, and the next repair attributes what those calls did to the killed run.

`sweeper retention --execute` runs as a real CLI process (its own process group, real ZooKeeper, Spark, Delta) against
a stand-in for the broker's admin REST API that does to the metadata what Pulsar does (tests/support/admin_server.py:
a call loads the topic, a subscription delete removes its cursor's znode, a trim drops ledgers from the list). The
stand-in SIGKILLs the repair's process group right after it has sent the answer to the n-th call: first a
subscription delete, then, in the next run, a trim. A third run goes to the end. Then every answered call has its
intent on disk from the moment its run died; each delete and trim is recorded once, by the run that made the call;
the killed runs are `interrupted` in `runs` with their counts; and no run claims another's call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.lifecycle import group_alive
from sweeper.codecs import pulsar as codec
from sweeper.config import to_toml
from sweeper.names import encode_local_name
from sweeper.pipeline import COUNTS
from sweeper.runs import record as record_run
from sweeper.table_schemas import RETENTION_DEBT
from sweeper.tables import open_table_store
from tests.support.admin_server import AdminServer, pulsar_like_answers
from tests.support.config import SHORT_LIVED_SPARK_ENV, ZkTarget
from tests.support.gates import record_gated_reconcile
from tests.support.seeded import sandbox_config

REPO = Path(__file__).resolve().parents[1]
TOKEN = "secret-token-34"
LOCK = "/ledger-sweeper/locks/retention_repair"
DONE = {"deleted", "trimmed", "loaded"}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _seed(zk: KazooClient, topic: str, cursor: str | None) -> None:
    """A managed ledger holding one expired ledger (3), with an idle cursor at 3:7 or none, as Pulsar writes them."""
    info = codec.pb.ManagedLedgerInfo()
    ledger = info.ledgerInfo.add()
    ledger.ledgerId, ledger.entries, ledger.size, ledger.timestamp = 3, 10, 1000, 1
    zk.create(f"/managed-ledgers/t/ns/persistent/{topic}", codec.encode_managed_ledger_info(info), makepath=True)
    if cursor is not None:
        info = codec.pb.ManagedCursorInfo()
        info.cursorsLedgerId, info.markDeleteLedgerId, info.markDeleteEntryId = -1, 3, 7
        zk.create(f"/managed-ledgers/t/ns/persistent/{topic}/{encode_local_name(cursor)}",
                  codec.encode_managed_cursor_info(info))
    if not zk.exists("/admin/policies/t/ns"):
        zk.create("/admin/policies/t/ns", json.dumps({"replication_clusters": ["sandbox"]}).encode(), makepath=True)


def _plan_row(topic: str, cursor: str | None, size: int) -> dict[str, Any]:
    return {"run_id": "plan-1", "captured_at": datetime.now(UTC), "kind": "cursor" if cursor else "topic",
            "status": "candidate", "reason": "idle_cursor" if cursor else "expired_not_trimmed", "tenant": "t",
            "namespace": "ns", "topic": topic, "topic_name": f"persistent://t/ns/{topic}",
            "managed_ledger": f"t/ns/persistent/{topic}", "cursor": cursor, "reclaimable_bytes": size,
            "ledger_ids": [3], "mark_delete_ledger_id": 3, "mark_delete_entry_id": 7, "zk_version": 0}


def _rows(root: Path, table: str) -> list[dict[str, Any]]:
    if not (root / table / "_delta_log").exists():
        return []
    return DeltaTable(str(root / table)).to_pyarrow_table().to_pylist()


def _run(config_file: Path, tmp_path: Path, broker: AdminServer, zk: KazooClient, kill_after: int | None,
         log: Path) -> tuple[int, list[tuple[str, str]], float]:
    """One `sweeper retention --execute` in a process group of its own; with `kill_after`, the broker SIGKILLs the
    group right after answering that many calls. Returns once the group is gone and its run lock released."""
    begun = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweeper.cli", "retention", "--execute", "--config", str(config_file),
         "--run-id", "plan-1"],
        cwd=REPO, stdout=open(log.with_suffix(".out"), "ab"), stderr=open(log, "ab"),  # noqa: SIM115
        start_new_session=True,
        env={**os.environ, **SHORT_LIVED_SPARK_ENV, "SWEEPER_TEST_TOKEN": TOKEN,
             "SWEEPER_LOG_FILE": str(tmp_path / "sweeper.log")})
    broker.kill_after(kill_after or 10**6, proc.pid)
    code = proc.wait(timeout=300)
    deadline = time.monotonic() + 60
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
    # The killed run's lock is an ephemeral znode: it goes with its session ([bookkeeper] session_timeout_s).
    while zk.exists(LOCK) and time.monotonic() < deadline + 30:
        time.sleep(0.2)
    assert not zk.exists(LOCK), "the run lock outlived its session"
    return code, list(broker.answered), time.monotonic() - begun


def _call_name(method: str, path: str) -> tuple[str, str]:
    """An answered request as (journal call name, topic name)."""
    parts = path.split("?", 1)[0].split("/")
    topic = f"persistent://{parts[4]}/{parts[5]}/{parts[6]}"
    name = {"stats": "stats", "subscription": "delete_subscription", "trim": "trim",
            "internalStats": "internal_stats"}[parts[7]]
    return name, topic


def _action_of(call: str) -> str:
    return "load_topic" if call in ("trim", "internal_stats") else "delete_subscription"


def test_a_repair_killed_right_after_the_broker_answered_leaves_every_call_on_record_as_its_own(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    for topic, cursor in (("a", "idle-sub"), ("b", None), ("c", "idle-sub")):
        _seed(zk, topic, cursor)
    broker = AdminServer(pulsar_like_answers(zk))
    try:
        cfg = sandbox_config(zk_target.hosts, tmp_path / "tables",
                             bookkeeper={"session_timeout_s": 4.0},
                             system_topic={"admin_url": broker.url, "auth_token_env": "SWEEPER_TEST_TOKEN"},
                             retention={"cursor_idle_days": 30.0, "actions_per_second": 1000.0})
        root = Path(cfg.tables.root)
        store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
        # The plan, as `sweeper sweep` leaves it: a's and c's idle subscriptions (each then a trim), b's expired
        # ledger on an unloaded topic. Largest first: a (delete, trim), b (trim), c (delete, trim).
        store.append_rows("retention_debt", [_plan_row("a", "idle-sub", 300), _plan_row("b", None, 200),
                                             _plan_row("c", "idle-sub", 100)], RETENTION_DEBT)
        record_gated_reconcile(store, "plan-1", {}, cfg)
        record_run(store, "plan-1", "retention_debt", "succeeded", datetime.now(UTC), {}, cfg)
        config_file = tmp_path / "sweeper.toml"
        config_file.write_text(to_toml(cfg))
        log = tmp_path / "repairs.log"

        # 1: killed right after the broker answered a's subscription delete (its second call: stats, delete).
        code, answered_1, took_1 = _run(config_file, tmp_path, broker, zk, 2, log)
        print(f"repair 1: exit {code} after {took_1:.1f} s, answered {answered_1}", flush=True)
        assert code == -signal.SIGKILL and len(answered_1) == 2, log.read_text()[-3000:]
        journal = _rows(root, "repair_journal")
        assert len({r["run_id"] for r in journal}) == 1, f"no intent on disk for the calls answered: {answered_1}"
        (run_1,) = {r["run_id"] for r in journal}
        on_disk = {(r["call"], r["topic_name"]) for r in journal if r["phase"] == "intent"}
        assert {_call_name(m, p) for m, p in answered_1} <= on_disk, "an answered call with no row"

        # 2: folds 1 in (a's subscription: its cursor's znode is gone, deleted by run 1), then trims a (its
        # subscription was deleted, by run 1) and b, and is killed right after the broker answered b's trim.
        code, answered_2, took_2 = _run(config_file, tmp_path, broker, zk, 2, log)
        print(f"repair 2: exit {code} after {took_2:.1f} s, answered {answered_2}", flush=True)
        assert code == -signal.SIGKILL, log.read_text()[-3000:]
        assert [_call_name(m, p) for m, p in answered_2] == [("trim", "persistent://t/ns/a"),
                                                             ("trim", "persistent://t/ns/b")]
        journal = _rows(root, "repair_journal")
        (run_2,) = {r["run_id"] for r in journal} - {run_1}
        on_disk = {(r["call"], r["topic_name"]) for r in journal if r["phase"] == "intent" and r["run_id"] == run_2}
        assert {_call_name(m, p) for m, p in answered_2} <= on_disk, "an answered call with no row"

        # 3: folds 2 in (b's trim: ledger 3 is gone from its list, trimmed by run 2) and does c, to the end.
        code, answered_3, took_3 = _run(config_file, tmp_path, broker, zk, None, log)
        print(f"repair 3: exit {code} after {took_3:.1f} s, answered {answered_3}", flush=True)
        assert code == 0, log.read_text()[-3000:]
        journal = _rows(root, "repair_journal")
        (run_3,) = {r["run_id"] for r in journal} - {run_1, run_2}
        assert {r["run_id"] for r in journal if r["phase"] == "closed"} == {run_1, run_2, run_3}

        # Each delete and trim the broker answered is done once, by the run that made the call, and no other.
        actions = [r for r in _rows(root, "retention_actions") if not r["dry_run"]]
        done = sorted((r["run_id"], r["action"], r["topic_name"]) for r in actions if r["outcome"] in DONE)
        made = sorted((run, _action_of(call), topic)
                      for run, answered in ((run_1, answered_1), (run_2, answered_2), (run_3, answered_3))
                      for call, topic in (_call_name(m, p) for m, p in answered) if call != "stats")
        assert done == made, (done, made)
        # The last call of each killed run: its row is the fold's ("stopped before recording"), unless the run wrote
        # it itself in the instant between the broker's answer and the kill (seen on a loaded machine). Either way
        # it is the killed run's, as `done == made` says. In that instant the run may also have committed the next
        # call's intent and never sent it (CI saw it): that row is the killed run's too, and says it was not done.
        may_recover = {(run_1, "delete_subscription", "persistent://t/ns/a"): "deleted",
                       (run_1, "load_topic", "persistent://t/ns/a"): "unknown",
                       (run_2, "load_topic", "persistent://t/ns/b"): "trimmed",
                       (run_2, "delete_subscription", "persistent://t/ns/c"): "interrupted"}
        recovered = {(r["run_id"], r["action"], r["topic_name"]): r for r in actions
                     if "stopped before recording" in r["detail"]}
        assert recovered.keys() <= may_recover.keys(), recovered.keys()
        assert all(row["outcome"] == may_recover[key] for key, row in recovered.items())
        # The re-runs claim nothing of a's and b's: at most a's subscription, found gone by run 3.
        assert {(r["action"], r["topic_name"], r["outcome"]) for r in actions
                if r["run_id"] == run_3 and r["topic_name"] != "persistent://t/ns/c"} <= {
            ("delete_subscription", "persistent://t/ns/a", "skipped_gone")}

        runs = {r["run_id"]: r for r in _rows(root, "runs") if r["stage"] == "retention_repair"}
        assert [runs[r]["status"] for r in (run_1, run_2, run_3)] == ["interrupted", "interrupted", "succeeded"]
        counts = {r: COUNTS["retention_repair"].from_row(dict(runs[r]["counts"])) for r in (run_1, run_2, run_3)}
        assert all(c.extra == {} for c in counts.values()), counts
        assert (counts[run_1].deleted, counts[run_1].recovered_from_journal) == (
            1, sum(key[0] == run_1 for key in recovered))
        assert (counts[run_2].trimmed, counts[run_2].recovered_from_journal) == (
            2, sum(key[0] == run_2 for key in recovered))
        assert (counts[run_3].deleted, counts[run_3].trimmed, counts[run_3].interrupted_runs) == (1, 1, 1)
        assert counts[run_3].done_by_interrupted_runs == 2  # a's and b's trims, done by run 2
        assert all(len(runs[r]["message"]) < 500 for r in (run_1, run_2))
        terminal = log.read_text()
        assert "Traceback" not in terminal, terminal[-3000:]
    finally:
        broker.close()
