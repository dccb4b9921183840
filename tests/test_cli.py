"""The README's first command, in process: sandbox up, seed, snapshot, gates, reconcile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.lifecycle import port_free
from harness.sandbox import PORT_SPAN, sandbox_down
from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import seed_zookeeper
from harness.zkserver import free_port, free_port_block
from sweeper.cli import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, main
from tests.support.config import SHORT_LIVED_SPARK_ENV, ZkTarget

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # four sweeps of a sandbox of its own, CLI processes killed and restarted
def test_sweep_on_the_sandbox_end_to_end(spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    home, tables, port = tmp_path / "sandbox", tmp_path / "tables", free_port_block(PORT_SPAN)
    args = ["--config", str(REPO / "conf" / "local.toml"), "--home", str(home), "--port", str(port),
            "--tables", str(tables), "--topics", "40", "--json"]
    try:
        assert main(["sweep", "--sandbox", *args]) == EXIT_OK
        out = capsys.readouterr().out
        summary = json.loads(out.strip().splitlines()[-1])
        manifest = json.loads((home / "manifest.json").read_text())
        assert summary["stages"]["snapshot"]["bk_ledgers"] == manifest["counts"]["bk_ledgers"]
        orphans = sum(1 for v in manifest["not_in_use"].values() if v["status"] == "orphan")
        assert summary["stages"]["reconcile"]["candidate.ledger"] == orphans
        assert "nothing was published" in out and "nothing was deleted" in out
        # Retention debt is part of the sweep's report; `sweeper retention` is a dry run unless --execute.
        unloaded = sum(1 for e in manifest["retention"] if e["status"] == "candidate")
        assert summary["stages"]["retention_debt"]["topic.candidate"] == unloaded
        assert "reclaimable by cause:" in out and "idle cursors" in out
        assert main(["retention", "--tables", str(tables), "--config", str(REPO / "conf" / "local.toml"),
                     "--zookeeper", f"127.0.0.1:{port}"]) == EXIT_OK
        out = capsys.readouterr().out
        assert out.count("load_topic           would_load") == unloaded and "dry run: pass --execute" in out

        # A second sweep over the same sandbox is a new run; reconcile alone picks the latest snapshot
        # and refuses to reconcile it twice.
        assert main(["sweep", "--sandbox", *args, "--until", "snapshot"]) == EXIT_OK
        assert main(["reconcile", "--tables", str(tables), "--config", str(REPO / "conf" / "local.toml")]) == EXIT_OK
        assert main(["reconcile", "--tables", str(tables), "--config", str(REPO / "conf" / "local.toml")]) \
            == EXIT_REFUSED

        # The whole pipeline with --execute: marks go to the sandbox's Pulsar endpoint, orphans are deleted,
        # and the next sweep finds nothing left to delete.
        capsys.readouterr()
        assert main(["sweep", "--sandbox", *args, "--execute"]) == EXIT_OK
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["stages"]["emit"]["published"] == summary["stages"]["reconcile"]["candidate"]
        assert summary["stages"]["delete"]["deleted"] == summary["stages"]["reconcile"]["candidate"]
        assert summary["stages"]["reconcile"]["candidate.ledger"] == orphans
        # What did that run delete, and when? Read back from the tables without Spark (issue 23).
        executed = summary["run_id"]
        assert main(["show", executed, "deletes", "--tables", str(tables), "--status", "deleted", "--limit", "0",
                     "--format", "json"]) == EXIT_OK
        deleted = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert len(deleted) == summary["stages"]["delete"]["deleted"] and all(not d["dry_run"] for d in deleted)
        assert main(["runs", "--tables", str(tables), "--format", "json"]) == EXIT_OK
        listed = {r["run_id"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
        assert listed[executed]["deleted"] == len(deleted) and listed[executed]["mode"] == "executed"
        _every_count_is_typed(tables)
        assert main(["sweep", "--sandbox", *args, "--execute"]) == EXIT_OK
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["stages"]["reconcile"].get("candidate", 0) == 0
        # The marks of the first run are on the topic; this run's snapshot read them back as done.
        assert summary["stages"]["reconcile"]["pending_delete.done"] == orphans
        # `sweeper audit --run-id` renders that existing run, nothing left to reclaim, without a new snapshot.
        def run_count() -> int:
            assert main(["runs", "--tables", str(tables), "--format", "json", "--limit", "0"]) == EXIT_OK
            return len(capsys.readouterr().out.splitlines())

        before, report = run_count(), tmp_path / "audit.ipynb"
        for key, value in SHORT_LIVED_SPARK_ENV.items():  # the notebook kernel's Spark is a JVM of its own
            monkeypatch.setenv(key, value)
        assert main(["audit", "--run-id", summary["run_id"], "--tables", str(tables), "--config",
                     str(REPO / "conf" / "local.toml"), "--out", str(report)]) == EXIT_OK
        assert f"[audit] running notebooks/audit.ipynb on run {summary['run_id']}" in capsys.readouterr().out
        rendered = report.read_text()
        assert "nothing to reclaim: this run has no candidates" in rendered and '"output_type": "error"' not in rendered
        assert run_count() == before
        assert main(["audit", "--run-id", "no-such-run", "--tables", str(tables)]) == EXIT_USAGE
        assert "no-such-run has no successful reconcile" in capsys.readouterr().err

        # Issue 27, safe to repeat. `down` without --wipe, then the README command: S3 kept its objects in memory,
        # so the sandbox is seeded again whole (one line says so) and the run finds the manifest's candidates.
        def again() -> str:
            capsys.readouterr()
            assert main(["sweep", "--sandbox", *args]) == EXIT_OK
            out = capsys.readouterr().out
            assert json.loads(out.strip().splitlines()[-1])["stages"]["reconcile"]["candidate.ledger"] == orphans
            return out

        # `down` returns once its processes have exited and their ports are free; a second `down` finds nothing.
        down = sandbox_down(home)
        assert down.stopped == ["zookeeper", "s3", "pulsar"] and not down.still_taken
        assert all(port_free(p) for p in range(port, port + PORT_SPAN))
        assert main(["sandbox", "down", "--home", str(home)]) == EXIT_OK
        assert "no sandbox was running" in capsys.readouterr().out
        # The README command on a terminal (issue 23): Spark, the JVM and log4j stay in the log file, a line comes at
        # least every 10 s, and the summary's numbers are the tables'.
        assert "seeded again from its seed" in _sweep_on_a_terminal(args, tables, orphans, tmp_path / "tty.log")
        # The endpoint killed alone (its broker registration outlives it in ZooKeeper), then a sweep that restarts it
        # is killed with SIGKILL mid-run, after the snapshot's first table commit: the next README command is a new
        # run that ends as always, and a scheduler retrying the killed run's id is refused, never given duplicates.
        _kill(home / "pulsar" / "server.json")
        _sweep_killed_mid_run(args, tables, run_id="killed-mid-run", log=tmp_path / "killed.log")
        assert "seeded again" not in again()
        assert main(["sweep", "--sandbox", *args, "--run-id", "killed-mid-run"]) == EXIT_USAGE
        assert "run id killed-mid-run is taken" in capsys.readouterr().err
        # `up` twice over a running sandbox keeps it as it is.
        for _ in range(2):
            assert main(["sandbox", "up", "--home", str(home), "--port", str(port)]) == EXIT_OK
        # A reboot: every sandbox process killed, the data directories kept.
        for part in ("pulsar", "s3", "zookeeper"):
            _kill(home / part / "server.json")
        assert "seeded again from its seed" in again()
        # `sandbox status`: what runs and the seed's counts, exit 0 up; after `down`, exit 3 and nothing runs.
        assert main(["sandbox", "status", "--home", str(home)]) == EXIT_OK
        out = capsys.readouterr().out
        assert ": up" in out and f"127.0.0.1:{port}" in out and "seeded: " in out
        sandbox_down(home)
        assert main(["sandbox", "status", "--home", str(home)]) == EXIT_REFUSED
        assert out.count("not running") == 0 and capsys.readouterr().out.count("not running") == 3
    finally:
        sandbox_down(home, wipe=True)


def _every_count_is_typed(tables: Path) -> None:
    """Every count a stage wrote to `runs` is a field of its typed counts: none only a dict knows about."""
    from sweeper.pipeline import COUNTS
    from sweeper.runs import rows
    from sweeper.tables.delta_rs import DeltaRsTableStore

    store = DeltaRsTableStore(str(tables), None)  # type: ignore[arg-type]  # reads need no Spark
    finished = [r for r in rows(store) if r["status"] == "succeeded"]
    assert {r["stage"] for r in finished} == set(COUNTS)
    for row in finished:
        assert COUNTS[row["stage"]].from_row(row["counts"]).extra == {}, (row["stage"], row["counts"])


def _sweep_killed_mid_run(args: list[str], tables: Path, run_id: str, log: Path) -> None:
    """`sweeper sweep --sandbox` as its own process, SIGKILLed once its snapshot has committed to a table."""
    import os
    import signal
    import subprocess
    import sys
    import time

    commits = tables / "bk_ledgers" / "_delta_log"
    before = len(list(commits.glob("*.json")))
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "sweep", "--sandbox", *args, "--run-id", run_id],
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                env={**os.environ, **SHORT_LIVED_SPARK_ENV,
                                     "SWEEPER_LOG_FILE": str(log.with_suffix(".jvm.log"))})
    deadline = time.monotonic() + 120
    while proc.poll() is None and len(list(commits.glob("*.json"))) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the sweep ended before it could be killed mid-run: {log.read_text()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # Its JVM and Python workers notice the driver is gone and exit; wait so the next run does not compete with them.
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)


_CHATTER = ("WARNING: Using incubator", "log4j", " WARN ", "NativeCodeLoader", "SparkStringUtils",
            "Setting default log", "Traceback", "py4j", "sc.setLogLevel")


def _sweep_on_a_terminal(args: list[str], tables: Path, orphans: int, log: Path) -> str:
    """`sweeper sweep --sandbox` with a pseudo-terminal for its stdout and stderr; its output, checked."""
    import itertools
    import os
    import pty
    import select
    import subprocess
    import sys
    import time

    from deltalake import DeltaTable

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "sweeper.cli", "sweep", "--sandbox", *args], cwd=REPO,
                            stdin=follower, stdout=follower, stderr=follower, close_fds=True,
                            env={**os.environ, **SHORT_LIVED_SPARK_ENV, "SWEEPER_LOG_FILE": str(log)})
    os.close(follower)
    arrivals: list[tuple[float, str]] = []
    pending = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            arrivals += [(time.monotonic(), line.decode(errors="replace").rstrip("\r")) for line in lines]
        elif proc.poll() is not None:
            break
    os.close(leader)
    assert proc.wait(timeout=60) == 0, "\n".join(line for _, line in arrivals)[-3000:]
    text = "\n".join(line for _, line in arrivals)
    assert not [line for _, line in arrivals if any(c in line for c in _CHATTER)], text
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(arrivals)]
    assert max(gaps) <= 10.5, f"{max(gaps):.1f}s without a line:\n{text}"
    summary = json.loads(arrivals[-1][1])
    run = summary["run_id"]
    candidates = DeltaTable(str(tables / "orphans")).to_pandas(filters=[("run_id", "=", run)])
    ledgers = DeltaTable(str(tables / "bk_ledgers")).to_pandas(columns=["run_id"], filters=[("run_id", "=", run)])
    expected = (f"candidate={int((candidates.status == 'candidate').sum()):,}",
                f"bk_ledgers={len(ledgers):,}")
    table = [line for _, line in arrivals if line.startswith(("snapshot ", "reconcile "))]
    assert all(any(e in line for line in table) for e in expected), (expected, table)
    assert summary["stages"]["reconcile"]["candidate.ledger"] == orphans
    return text


def _kill(marker: Path) -> None:
    import os
    import signal
    import time

    from harness.lifecycle import pid_alive

    pid = json.loads(marker.read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        if not pid_alive(pid):  # reaps it: this test process started it
            return
        time.sleep(0.1)


@pytest.mark.parametrize("until", ["snapshot", "reconcile", "emit"])
def test_execute_with_an_earlier_until_is_refused_before_anything_runs(
        until: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--execute` deletes; `--until` before delete names less. Issue 22: this once ran every stage and deleted."""
    home, tables = tmp_path / "sandbox", tmp_path / "tables"
    code = main(["sweep", "--sandbox", "--home", str(home), "--port", str(free_port_block(PORT_SPAN)),
                 "--tables", str(tables), "--config", str(REPO / "conf" / "local.toml"), "--until", until, "--execute"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert len(err.strip().splitlines()) == 1 and f"--until {until}" in err and "drop --execute" in err
    assert not home.exists() and not tables.exists(), "nothing may start"


def test_sweep_refuses_execute_with_an_earlier_until_in_the_api_too() -> None:
    from sweeper.pipeline import sweep

    with pytest.raises(ValueError, match="stops before the delete"):
        sweep(None, None, None, until="emit", execute=True)  # type: ignore[arg-type]


@pytest.mark.integration  # its snapshot command starts Spark
def test_bad_config_and_unreachable_server_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[safety]\nmax_orphan_fraction = 5\n")
    assert main(["snapshot", "--config", str(bad)]) == EXIT_USAGE
    assert "max_orphan_fraction" in capsys.readouterr().err
    cfg = tmp_path / "down.toml"
    cfg.write_text(f'[bookkeeper]\nzookeeper = "127.0.0.1:{free_port()}"\nsession_timeout_s = 2\n'
                   f'[tables]\nroot = "{tmp_path / "t"}"\n[offload]\nenabled = false\n')
    assert main(["snapshot", "--config", str(cfg)]) == EXIT_REFUSED
    assert "cannot connect to ZooKeeper" in capsys.readouterr().err


def test_no_live_broker_refuses_the_run_unless_the_operator_says_brokers_are_down(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 11 (12): exit 3 naming what was checked; --allow-no-brokers lets a cleanup run go on, and says so.
    seed_zookeeper(zk, build_cluster(SandboxSpec(seed=4, topics=10)))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[bookkeeper]\nzookeeper = "{zk_target.hosts}"\n[tables]\nroot = "{tmp_path / "t"}"\n'
                   '[offload]\nenabled = false\n[safety]\nmax_orphan_fraction = 1.0\n')
    assert main(["sweep", "--config", str(cfg)]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert "no live broker is registered under /loadbalance/brokers" in err
    assert main(["sweep", "--config", str(cfg), "--allow-no-brokers"]) == EXIT_OK
    assert "--allow-no-brokers" in capsys.readouterr().err


def test_a_run_id_used_twice_is_refused_before_anything_is_written(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 27: a scheduler retrying a job with the same id once appended a second copy of the snapshot.
    from sweeper.table_schemas import SNAPSHOT_TABLES
    from sweeper.tables import open_table_store

    seed_zookeeper(zk, build_cluster(SandboxSpec(seed=4, topics=10)))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[bookkeeper]\nzookeeper = "{zk_target.hosts}"\n[tables]\nroot = "{tmp_path / "t"}"\n'
                   '[offload]\nenabled = false\n[safety]\nmax_orphan_fraction = 1.0\n'
                   '[gates]\nrequire_live_brokers = false\n')
    assert main(["sweep", "--config", str(cfg), "--run-id", "nightly-1"]) == EXIT_OK
    store = open_table_store(str(tmp_path / "t"), spark, engine="delta-rs")

    def rows_of_the_run() -> dict[str, int]:
        return {t: store.read_arrow(t, where={"run_id": "nightly-1"}).num_rows
                for t in (*SNAPSHOT_TABLES, "runs", "orphans") if store.exists(t)}

    before = rows_of_the_run()
    capsys.readouterr()
    for command in (["sweep"], ["snapshot"], ["sweep", "--until", "snapshot"]):
        assert main([*command, "--config", str(cfg), "--run-id", "nightly-1"]) == EXIT_USAGE
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "run id nightly-1 is taken" in err and "--run-id" in err, err
    assert rows_of_the_run() == before

    # A snapshot killed before its runs row: its rows alone hold the id.
    assert main(["snapshot", "--config", str(cfg), "--run-id", "nightly-2"]) == EXIT_OK
    capsys.readouterr()
    from deltalake import DeltaTable

    DeltaTable(store.path("runs")).delete("run_id = 'nightly-2'")
    assert main(["snapshot", "--config", str(cfg), "--run-id", "nightly-2"]) == EXIT_USAGE
    assert "did not finish" in capsys.readouterr().err


def test_retention_debt_is_a_stage_of_its_own(zk: KazooClient, zk_target: ZkTarget, spark: SparkSession,
                                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 22: `--until` names it, `sweeper retention-debt` (and jobs/retention_debt.py) runs it alone."""
    from sweeper import runs
    from sweeper.cli import SWEEP_STAGES
    from sweeper.pipeline import STAGES
    from sweeper.tables import open_table_store

    assert SWEEP_STAGES == STAGES
    seed_zookeeper(zk, build_cluster(SandboxSpec(seed=4, topics=10)))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[bookkeeper]\nzookeeper = "{zk_target.hosts}"\n[tables]\nroot = "{tmp_path / "t"}"\n'
                   '[offload]\nenabled = false\n[safety]\nmax_orphan_fraction = 1.0\n'
                   '[gates]\nrequire_live_brokers = false\n')
    assert main(["sweep", "--config", str(cfg), "--until", "reconcile", "--run-id", "r1"]) == EXIT_OK
    store = open_table_store(str(tmp_path / "t"), spark, engine="delta-rs")
    assert [r["stage"] for r in runs.rows(store, run_id="r1")] == ["snapshot", "reconcile"]
    capsys.readouterr()
    assert main(["retention-debt", "--config", str(cfg), "--json"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "[retention] started on run r1" in out and json.loads(out.splitlines()[-1])["run_id"] == "r1"
    assert runs.succeeded(store, "r1", "retention_debt") is not None
    assert main(["retention-debt", "--config", str(cfg), "--run-id", "r1"]) == EXIT_REFUSED
    assert "already has its retention debt" in capsys.readouterr().err
