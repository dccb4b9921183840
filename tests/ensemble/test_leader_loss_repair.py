"""Issue 45: the ZooKeeper ensemble loses its leader during the retention repair (`sweeper retention --execute`).

The repair acts only through the broker's admin REST API (a stand-in here, tests/support/admin_server.py, that does
to the metadata what Pulsar does: a call loads the topic, a subscription delete removes its cursor's znode, a trim
drops ledgers from the list), and reads ZooKeeper before and after each call: the planned cursor or managed ledger
before, the managed ledger again after a trim, to measure what it freed. It runs as a CLI process connected to all
three members with the chroot; the plan holds eight topics with an idle subscription each (a delete, then a trim),
one whose subscription became active since the plan (its cursor was written: skipped, kept) and a topic outside
the plan.

The leader is killed at the instant the repair's read after a trim is answered, and that answer is lost
(tests.support.zk_ensemble.AimedElection): the read fails with kazoo's ConnectionLoss while the ensemble elects a
new leader. A read can be sent again; the repair's kazoo client does so once its session is back
(sweeper.zk.client.ReadRetryingClient). The run must finish correctly or stop with exit 3 and one line, never a
traceback: each subscription delete and trim the broker answered is recorded once, as done by the run that made the
call; the active subscription and the unplanned topic's are still there; a stopped run is not `succeeded`; the
re-run leaves nothing undone and claims nothing of the first run's. Without the read retry the run dies with exit 1
and a ConnectionLoss traceback (its `runs` row `failed`), and this test fails.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from deltalake import DeltaTable
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.zkensemble import EnsembleInfo
from sweeper.codecs import pulsar as codec
from sweeper.config import to_toml
from sweeper.names import encode_local_name
from sweeper.pipeline import repair_stage
from sweeper.runs import new_run_id
from sweeper.runs import record as record_run
from sweeper.table_schemas import RETENTION_DEBT
from sweeper.tables import open_table_store
from tests.support.admin_server import AdminServer, pulsar_like_answers
from tests.support.gates import record_gated_reconcile
from tests.support.seeded import sandbox_config
from tests.support.zk_ensemble import (
    AimedElection,
    EnsembleTarget,
    assert_finished_or_refused,
    run_cli,
    wait_until,
)
from tests.support.zk_faults import GET_DATA, read_path

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("zk-ensemble-repair"), pytest.mark.timeout(600)]

TOKEN = "secret-token-45"
PLANNED = [f"topic-{i:02d}" for i in range(8)]
AIMED = "topic-03"  # its managed ledger's second read (after its trim) loses its answer with the leader
DONE = {"deleted", "trimmed", "loaded"}
ML = "/managed-ledgers/t/ns/persistent"


def _seed(zk: KazooClient, topic: str, cursor: str) -> None:
    """A managed ledger holding three ledgers (the first two expired) and an idle cursor at 1:7, as Pulsar writes."""
    info = codec.pb.ManagedLedgerInfo()
    for ledger_id in (1, 2, 3):
        ledger = info.ledgerInfo.add()
        ledger.ledgerId, ledger.entries, ledger.size, ledger.timestamp = ledger_id, 10, 1000, 1
    zk.create(f"{ML}/{topic}", codec.encode_managed_ledger_info(info), makepath=True)
    cursor_info = codec.pb.ManagedCursorInfo()
    cursor_info.cursorsLedgerId, cursor_info.markDeleteLedgerId, cursor_info.markDeleteEntryId = -1, 1, 7
    zk.create(f"{ML}/{topic}/{encode_local_name(cursor)}", codec.encode_managed_cursor_info(cursor_info))


def _plan_row(topic: str, cursor: str) -> dict[str, Any]:
    return {"run_id": "plan-1", "captured_at": datetime.now(UTC), "kind": "cursor", "status": "candidate",
            "reason": "idle_cursor", "tenant": "t", "namespace": "ns", "topic": topic,
            "topic_name": f"persistent://t/ns/{topic}", "managed_ledger": f"t/ns/persistent/{topic}",
            "cursor": cursor, "reclaimable_bytes": 2000, "ledger_ids": [1, 2], "mark_delete_ledger_id": 1,
            "mark_delete_entry_id": 7, "zk_version": 0}


def _rows(root: Path, table: str) -> list[dict[str, Any]]:
    if not (root / table / "_delta_log").exists():
        return []
    return DeltaTable(str(root / table)).to_pyarrow_table().to_pylist()


def _made(answered: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (action, topic) each answered subscription delete or trim stands for, as retention_actions names them."""
    made = []
    for method, path in answered:
        parts = path.split("?", 1)[0].split("/")
        topic, what = f"persistent://{parts[4]}/{parts[5]}/{unquote(parts[6])}", parts[7]
        if (method, what) == ("DELETE", "subscription"):
            made.append(("delete_subscription", topic))
        elif (method, what) == ("POST", "trim"):
            made.append(("load_topic", topic))
    return made


def test_the_repair_rides_out_the_leader_killed_while_its_read_is_answered(
        zk_ensemble: EnsembleInfo, ensemble_target: EnsembleTarget, ensemble_zk: KazooClient, spark: SparkSession,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    zk = ensemble_zk
    for topic in PLANNED:
        _seed(zk, topic, "idle-sub")
    _seed(zk, "busy", "busy-sub")  # planned, then acknowledged: its cursor's znode moved on
    _seed(zk, "other", "other-sub")  # never planned
    zk.set(f"{ML}/busy/{encode_local_name('busy-sub')}", zk.get(f"{ML}/busy/{encode_local_name('busy-sub')}")[0])
    zk.create("/admin/policies/t/ns", json.dumps({"replication_clusters": ["sandbox"]}).encode(), makepath=True)

    reads = {"count": 0}
    aimed_path = f"{ensemble_target.chroot}{ML}/{AIMED}"

    def aim(op: int, body: bytes) -> bool:
        if op == GET_DATA and read_path(body) == aimed_path:
            reads["count"] += 1
            return reads["count"] == 2  # the first is the re-check before the trim, the second the one after it
        return False

    # The stand-in broker writes the metadata through this test's own client, straight to the members.
    broker = AdminServer(pulsar_like_answers(zk))
    try:
        with AimedElection(zk_ensemble, aim) as aimed:
            cfg = sandbox_config(aimed.hosts(ensemble_target.chroot), tmp_path / "tables",
                                 system_topic={"admin_url": broker.url, "auth_token_env": "SWEEPER_TEST_TOKEN"},
                                 retention={"cursor_idle_days": 30.0, "actions_per_second": 4.0})
            root = Path(cfg.tables.root)
            store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
            store.append_rows("retention_debt", [*(_plan_row(t, "idle-sub") for t in PLANNED),
                                                 _plan_row("busy", "busy-sub")], RETENTION_DEBT)
            record_gated_reconcile(store, "plan-1", {}, cfg)
            record_run(store, "plan-1", "retention_debt", "succeeded", datetime.now(UTC), {}, cfg)
            config_file = tmp_path / "sweeper.toml"
            config_file.write_text(to_toml(cfg))
            command = ["retention", "--execute", "--config", str(config_file), "--run-id", "plan-1"]

            def strike(proc: Any) -> None:
                wait_until("the read after the trim", lambda: aimed.killed is not None, proc)

            first = run_cli(command, tmp_path, "repair-1", env={"SWEEPER_TEST_TOKEN": TOKEN}, during=strike)
            election = aimed.wait_elected()
            answered_1 = list(broker.answered)
            print(f"\nkilled {election.killed} as it answered the read of {aimed.lost}; new leader in "
                  f"{election.elected_s:.2f} s; repair 1: exit {first.code}")
            assert aimed.lost == [[aimed_path]]
            stopped = assert_finished_or_refused(first)
        # The re-run (in this process: its exit code is not the question), straight to the members.
        monkeypatch.setenv("SWEEPER_TEST_TOKEN", TOKEN)
        again = repair_stage(cfg.replace(bookkeeper={"zookeeper": ensemble_target.hosts}), store, "plan-1",
                             f"retention-{new_run_id()}", execute=True)
        answered_2 = list(broker.answered)[len(answered_1):]
        print(f"repair 2: {again.counts.as_row()}")
        assert not again.stopped and not again.counts.failed, again.counts
    finally:
        broker.close()

    runs = sorted((r for r in _rows(root, "runs") if r["stage"] == "retention_repair"), key=lambda r: r["started_at"])
    assert len(runs) == 2, runs
    run_1, run_2 = runs[0]["run_id"], runs[1]["run_id"]
    if stopped is not None:
        assert runs[0]["status"] != "succeeded", runs[0]
    assert runs[1]["status"] == "succeeded", runs[1]
    assert stopped is None, f"the repair did not ride out the election: {stopped}"

    # Each delete and trim the broker answered is done once, by the run that made the call, and by no other.
    actions = [r for r in _rows(root, "retention_actions") if not r["dry_run"]]
    done = sorted((r["run_id"], r["action"], r["topic_name"]) for r in actions if r["outcome"] in DONE)
    made = sorted([(run_1, *m) for m in _made(answered_1)] + [(run_2, *m) for m in _made(answered_2)])
    assert done == made, (done, made)
    assert {(a, t) for _, a, t in done} == {(a, f"persistent://t/ns/{t}") for t in PLANNED
                                            for a in ("delete_subscription", "load_topic")}
    # Nothing the plan did not name, nothing that became active, was touched; every planned topic was trimmed.
    assert zk.exists(f"{ML}/busy/{encode_local_name('busy-sub')}")
    assert zk.exists(f"{ML}/other/{encode_local_name('other-sub')}")
    assert {(r["action"], r["outcome"]) for r in actions if r["topic_name"] == "persistent://t/ns/busy"} == {
        ("delete_subscription", "skipped_active"), ("load_topic", "not_needed")}
    for topic in PLANNED:
        assert not zk.exists(f"{ML}/{topic}/{encode_local_name('idle-sub')}"), topic
        listed = [x.ledgerId for x in codec.decode_managed_ledger_info(zk.get(f"{ML}/{topic}")[0]).ledgerInfo]
        assert 1 not in listed and 2 not in listed, (topic, listed)
