"""`sweeper runs` and `sweeper show` (issue 23): read back what the sweeper did, without Spark, from real Delta
tables written by delta-rs; the full pipeline's tables are read in tests/test_cli.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sweeper import runs
from sweeper.cli import EXIT_OK, EXIT_USAGE, main
from sweeper.config import SweeperConfig
from sweeper.report.console import run_summaries
from sweeper.table_schemas import DELETE_RESULTS
from sweeper.tables.delta_rs import DeltaRsTableStore

T0 = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def _tables(tmp_path: Path) -> Path:
    root = tmp_path / "tables"
    store, cfg = DeltaRsTableStore(str(root), None), SweeperConfig()  # type: ignore[arg-type]
    for stage, minutes, counts in (("snapshot", 0, {"bk_ledgers": 90}), ("reconcile", 2, {"candidate": 3}),
                                   ("emit", 3, {"published": 3}), ("delete", 4, {"deleted": 2, "execute": 1})):
        runs.record(store, "night-1", stage, runs.SUCCEEDED, T0 + timedelta(minutes=minutes), counts, cfg)
    runs.record(store, "night-2", "snapshot", runs.SUCCEEDED, T0 + timedelta(days=1), {}, cfg)
    runs.record(store, "night-2", "reconcile", runs.REFUSED, T0 + timedelta(days=1, minutes=1), {}, cfg,
                "data-quality gates failed for snapshot night-2:\n  - bk_ledgers empty")
    rows = [{"run_id": "night-1", "origin_run_id": "night-1", "finished_at": T0 + timedelta(minutes=5),
             "record_key": f"L{i}", "ledger_id": i, "ledger_type": "LEDGER", "component": "managed-ledger",
             "topic_name": "persistent://t/ns/a", "outcome": outcome, "detail": "", "error": None, "attempt": 1,
             "duration_ms": 3, "zk_path": f"/ledgers/00/0000/L{i:04d}", "zk_version": 0, "s3_bucket": None,
             "s3_keys": None, "dry_run": False, "source": "run"}
            for i, outcome in ((7, "deleted"), (8, "deleted"), (9, "in_use"))]
    store.append_rows("delete_results", rows, DELETE_RESULTS)
    return root


def test_a_run_is_one_line_with_its_worst_stage_and_what_it_did() -> None:
    def row(run: str, stage: str, status: str, minute: int, counts: dict[str, int] | None = None) -> dict:
        at = T0 + timedelta(minutes=minute)
        return {"run_id": run, "stage": stage, "status": status, "started_at": at, "finished_at": at,
                "counts": counts or {}, "message": "lock held" if status == runs.REFUSED else ""}

    got = run_summaries([row("a", "snapshot", "succeeded", 0), row("a", "reconcile", "succeeded", 1, {"candidate": 4}),
                         row("b", "snapshot", "succeeded", 10), row("b", "delete", "refused", 12),
                         row("a", "delete", "succeeded", 3, {"deleted": 0, "execute": 0})])
    assert [(r["run_id"], r["status"], r["mode"], r["duration_s"]) for r in got] == [
        ("b", "refused", "dry run", 120.0), ("a", "succeeded", "dry run", 180.0)]
    assert got[0]["message"] == "lock held" and got[1]["candidates"] == 4 and got[1]["deleted"] == 0
    assert [r["duration"] for r in got] == ["2m00s", "3m00s"]


def test_runs_and_show_read_the_tables_without_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tables = str(_tables(tmp_path))
    assert main(["runs", "--tables", tables]) == EXIT_OK
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["run_id", "started", "duration", "status"]
    assert lines[1].startswith("night-2") and " refused " in lines[1]  # newest first
    assert lines[2].startswith("night-1") and " executed " in lines[2] and "2026-11-20 03:00:00" in lines[2]
    assert "2 runs of 2" in lines[-1]

    assert main(["runs", "--tables", tables, "--format", "json", "--status", "succeeded"]) == EXIT_OK
    [night1] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert night1["run_id"] == "night-1" and night1["deleted"] == 2 and night1["published"] == 3

    # What did night-1 delete, and when?
    assert main(["show", "night-1", "deletes", "--tables", tables, "--status", "deleted", "--format", "csv"]) == EXIT_OK
    csv_lines = capsys.readouterr().out.splitlines()
    assert csv_lines[0].startswith("run_id,origin_run_id,finished_at") and len(csv_lines) == 3
    assert all(",deleted," in line and "2026-11-20 03:05:00" in line for line in csv_lines[1:])
    assert main(["show", "night-1", "deletes", "--tables", tables, "--limit", "1"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "1 deletes row of run night-1 (first 1: --limit 0 shows all)" in out
    assert main(["show", "night-1", "orphans", "--tables", tables]) == EXIT_OK  # a table not written yet: no rows
    assert "0 orphans rows of run night-1" in capsys.readouterr().out
    assert main(["dlq", "list", "--tables", tables]) == EXIT_OK
    assert "0 dead letter(s)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["runs", "--tables", "{missing}"], "no tables at"),
    (["show", "night-9", "deletes", "--tables", "{tables}"], "no run night-9"),
    (["show", "night-1", "dlq", "--tables", "{tables}", "--tenant", "t"], "has no --tenant filter"),
    (["dlq", "list", "--tables", "{missing}"], "no tables at"),  # was "0 dead letter(s)" for a mistyped root
])
def test_an_operators_mistake_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     argv: list[str], says: str) -> None:
    tables = _tables(tmp_path)
    argv = [a.format(missing=tmp_path / "nowhere", tables=tables) for a in argv]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_every_flag_of_every_command_has_help_and_the_version_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from sweeper.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = sorted((name, action.dest) for name, command in commands.items() for action in command._actions
                     if not action.help and action.dest != "help")
    assert missing == []
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0 and capsys.readouterr().out.startswith("sweeper ")


def test_the_lock_message_names_the_holder_an_iso_time_and_what_to_do() -> None:
    from sweeper.errors import RunLockHeld

    text = str(RunLockHeld("/ledger-sweeper/locks/delete",
                           {"run_id": "night-1", "host": "spark-7", "pid": 41, "started_ms": 1_764_100_000_000}))
    assert "run 'night-1' on 'spark-7' (pid 41, since 2025-11-25T19:46:40+00:00)" in text
    assert "Wait for it to end" in text and "session_timeout_s" in text and "\n" not in text


@pytest.mark.parametrize("content, says", [
    ("", "cannot read the ledger list"),
    ("{\"ledgerId\": 7}", "must hold a JSON list of ledgers"),
    ("[7, \"eight\"]", "entry 1 is not an object or a ledger id"),
    ("[]", "lists no ledgers: nothing to delete"),
])
def test_a_bad_or_empty_operator_list_is_exit_2_before_spark_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, says: str) -> None:
    listed = tmp_path / "ledgers.json"
    listed.write_text(content)
    assert main(["delete", "--from-json", str(listed), "--execute", "--tables", str(tmp_path / "t")]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _show(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict]:
    assert main([*argv, "--format", "json"]) == EXIT_OK
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _run(tables: str, run_id: str, capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    [run] = [r for r in _show(["runs", "--tables", tables, "--limit", "0", *flags], capsys) if r["run_id"] == run_id]
    return run


def test_a_killed_delete_is_shown_from_its_journal_until_folded_in_and_never_twice(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 34 item 7: a `delete --execute` killed outright (SIGKILL, a lost node) left only its journal; `runs` and
    `show RUN deletes` read it before the next delete folds it in, and after that fold-in (whole, or stopped before
    it closed the attempt) show nothing twice. Real Delta tables, written with the real `Journal`."""
    from deltalake import DeltaTable

    from sweeper.codecs.layout import LedgerLayout, ledger_path
    from sweeper.delete.journal import JOURNAL_TABLE, open_journal, resolve_interrupted
    from sweeper.delete.records import PendingRecord
    from sweeper.delete.results import DeleteResult

    tables = str(_tables(tmp_path))
    store = DeltaRsTableStore(tables, None)  # type: ignore[arg-type]
    cfg = SweeperConfig()
    for stage, minutes in (("snapshot", 0), ("reconcile", 2), ("emit", 3)):
        runs.record(store, "night-3", stage, runs.SUCCEEDED, T0 + timedelta(days=2, minutes=minutes), {}, cfg)
    layout = LedgerLayout.HIERARCHICAL
    path = {i: ledger_path("/ledgers", i, layout) for i in range(1, 6)}

    def item(ledger: int) -> tuple[PendingRecord, dict[str, object]]:
        return PendingRecord(f"LEDGER/{ledger}/k", "emitted", "night-3", 0, b""), {"ledgerId": ledger,
                                                                                   "ledgerType": "LEDGER"}

    def result(ledger: int, outcome: str, detail: str = "") -> tuple[PendingRecord, DeleteResult]:
        return item(ledger)[0], DeleteResult(ledger, "LEDGER", None, None, outcome, detail, zk_path=path[ledger])

    killed = open_journal(store, "night-3", "/ledgers", layout)
    killed.intents([item(i) for i in range(1, 6)])
    killed.outcomes([result(1, "deleted"), result(2, "deleted"), result(3, "in_use", "a cursor references it"),
                     result(4, "failed", "delete not confirmed: ConnectionLoss")])
    # Killed here: ledger 5's intent has no outcome.

    # `runs`: the attempt is interrupted, with the journal's deletions, before any other delete ran.
    run = _run(tables, "night-3", capsys)
    assert run["status"] == "interrupted" and run["deleted"] == 2 and run["mode"] == "executed"
    assert "delete:interrupted" in run["stages"].split()
    assert "not yet folded in: the next delete --execute records it" in run["message"]
    assert "2 deletions (1 failed, 1 in_use) and 1 intent without an outcome" in run["message"]
    assert _run(tables, "night-3", capsys, "--status", "interrupted")["run_id"] == "night-3"
    assert "night-3" not in {r["run_id"] for r in _show(["runs", "--tables", tables, "--status", "succeeded"], capsys)}
    assert main(["runs", "--tables", tables]) == EXIT_OK
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("night-3"))
    assert line.split()[4:6] == ["interrupted", "executed"]  # after the start's date and time, and the duration

    # `show RUN deletes`: each journalled outcome as it is, the intent without one as `intended`.
    shown = _show(["show", "night-3", "deletes", "--tables", tables, "--limit", "0"], capsys)
    by_ledger = {r["ledger_id"]: r for r in shown}
    assert len(shown) == len(by_ledger) == 5
    assert {i: r["outcome"] for i, r in by_ledger.items()} == {1: "deleted", 2: "deleted", 3: "in_use", 4: "failed",
                                                               5: "intended"}
    assert {r["recorded_in"] for r in shown} == {"delete_journal"}
    assert by_ledger[4]["detail"].endswith("delete not confirmed: ConnectionLoss")
    assert by_ledger[5]["detail"].startswith("in flight when the attempt stopped: unknown until the next delete")
    assert all(killed.attempt_id in r["detail"] and r["zk_path"] == path[r["ledger_id"]] for r in shown)
    assert [r["ledger_id"] for r in _show(["show", "night-3", "deletes", "--tables", tables, "--status", "deleted"],
                                          capsys)] == [1, 2]
    assert [r["ledger_id"] for r in _show(["show", "night-3", "deletes", "--tables", tables, "--reason", "intended"],
                                          capsys)] == [5]
    assert len(_show(["show", "night-3", "deletes", "--tables", tables, "--limit", "3"], capsys)) == 3
    assert main(["show", "night-3", "deletes", "--tables", tables, "--format", "csv", "--limit", "0"]) == EXIT_OK
    csv_lines = capsys.readouterr().out.splitlines()
    assert csv_lines[0].startswith("run_id,origin_run_id,finished_at") and csv_lines[0].endswith(",recorded_in")
    assert len(csv_lines) == 6 and sum(",intended," in line for line in csv_lines) == 1
    assert main(["show", "night-3", "deletes", "--tables", tables, "--limit", "0"]) == EXIT_OK
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[-1] == "recorded_in" and sum(" intended " in line for line in table) == 1
    assert "5 deletes rows of run night-3" in table[-1]
    # A run with no unfolded attempt keeps its rows and gains only where they are recorded.
    assert {r["recorded_in"] for r in _show(["show", "night-1", "deletes", "--tables", tables], capsys)} == \
        {"delete_results"}

    # The next delete folds it in (ledger 5's znode is gone: deleted by the killed attempt). Then each record once,
    # from delete_results, and one `interrupted` row.
    def folded_once() -> None:
        shown = _show(["show", "night-3", "deletes", "--tables", tables, "--limit", "0"], capsys)
        assert sorted(r["ledger_id"] for r in shown) == [1, 2, 3, 5], shown  # the failed one is for the retry
        assert {r["recorded_in"] for r in shown} == {"delete_results"}
        assert {r["ledger_id"] for r in shown if r["outcome"] == "deleted"} == {1, 2, 5}
        run = _run(tables, "night-3", capsys)
        assert run["stages"].split().count("delete:interrupted") == 1 and run["deleted"] == 3
        assert "not yet folded in" not in run["message"]

    resolve_interrupted(store, lambda p: p != path[5], "the next attempt")
    folded_once()
    # A fold-in stopped after writing its rows and before closing the attempt: still nothing twice.
    DeltaTable(store.path(JOURNAL_TABLE)).delete("phase = 'closed'")
    folded_once()
    # Stopped earlier, after its delete_results and before its `runs` row: the journal fills in only what the
    # results lack (the failed delete, which only a fold-in's re-read settles).
    DeltaTable(store.path("runs")).delete("run_id = 'night-3' AND stage = 'delete'")
    shown = _show(["show", "night-3", "deletes", "--tables", tables, "--limit", "0"], capsys)
    assert sorted((r["ledger_id"], r["recorded_in"]) for r in shown) == [
        (1, "delete_results"), (2, "delete_results"), (3, "delete_results"), (4, "delete_journal"),
        (5, "delete_results")]
    assert _run(tables, "night-3", capsys)["stages"].split().count("delete:interrupted") == 1


def test_a_killed_emit_is_shown_from_its_journal_until_the_next_emit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`sweeper runs` shows an emit killed outright as `interrupted` before the next emit records it, then once."""
    from sweeper.emit.stage import JOURNAL_TABLE, EmitJournal, fold_interrupted
    from sweeper.table_schemas import EMIT_JOURNAL, EMITTED

    tables = str(_tables(tmp_path))
    store = DeltaRsTableStore(tables, None)  # type: ignore[arg-type]
    for stage, minutes in (("snapshot", 0), ("reconcile", 2)):
        runs.record(store, "night-4", stage, runs.SUCCEEDED, T0 + timedelta(days=3, minutes=minutes), {},
                    SweeperConfig())
    at = T0 + timedelta(days=3, minutes=5)
    journal = EmitJournal(store.task_appender(JOURNAL_TABLE, EMIT_JOURNAL), "night-4", at.isoformat(), at)
    journal.started(6)
    journal.intent(0, "night-4-p0-0", 0, 2, 3)
    journal.intent(1, "night-4-p1-0", 0, 2, 3)
    store.append_rows("emitted", [
        {"run_id": "night-4", "emitted_at": at, "record_key": f"L{i}", "ledger_id": i, "ledger_type": "LEDGER",
         "component": "MANAGED_LEDGER", "topic_name": None, "topic_partition": 0, "producer_name": "night-4-p0-0",
         "sequence_id": i, "message_id": f"1:{i}:-1", "status": "published", "payload": b"x"} for i in range(3)],
        EMITTED)
    # Killed here: producer p1-0 may have sent 3 records that `emitted` does not hold.

    run = _run(tables, "night-4", capsys)
    assert run["status"] == "interrupted" and run["published"] == 3 and "emit:interrupted" in run["stages"].split()
    assert "not yet folded in: the next emit of the run records it" in run["message"]
    assert "3 of 6 records recorded in emitted; 1 producer (3 records) may have sent without a record" in \
        run["message"]

    assert fold_interrupted(store, "night-4", by="the next emit") == 1
    run = _run(tables, "night-4", capsys)
    assert run["stages"].split().count("emit:interrupted") == 1 and "not yet folded in" not in run["message"]


def test_runs_counts_every_attempts_deletions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run whose first delete attempt was stopped and folded in, then finished by the next: "what did the
    sweeper delete?" is both attempts' deletions, not the last row's."""
    tables = str(_tables(tmp_path))
    store = DeltaRsTableStore(tables, None)  # type: ignore[arg-type]
    cfg = SweeperConfig()
    for stage, minutes in (("snapshot", 0), ("reconcile", 2), ("emit", 3)):
        runs.record(store, "night-4", stage, runs.SUCCEEDED, T0 + timedelta(days=3, minutes=minutes), {}, cfg)
    runs.record(store, "night-4", "delete", runs.INTERRUPTED, T0 + timedelta(days=3, minutes=4),
                {"deleted": 3, "recovered_from_journal": 1, "execute": 1}, cfg)
    runs.record(store, "night-4", "delete", runs.SUCCEEDED, T0 + timedelta(days=3, minutes=9),
                {"deleted": 2, "interrupted_deleted": 3, "execute": 1}, cfg)
    assert _run(tables, "night-4", capsys)["deleted"] == 5


def test_a_killed_retention_repair_is_shown_from_its_journal_until_folded_in_and_never_twice(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A `retention --execute` killed outright left its `repair_journal` unclosed: `runs` shows it `interrupted` and
    `show RUN actions` lists each journalled call with no action row as `intended`, before the next repair folds it
    in; after that fold-in (whole, or stopped before it closed the run, or before its `runs` row) nothing shows
    twice. Real Delta tables, the real `RepairJournal` and `resolve_interrupted`."""
    from deltalake import DeltaTable

    from sweeper.retention.journal import JOURNAL_TABLE, RepairJournal, resolve_interrupted
    from sweeper.retention.repair_plan import RepairCounts
    from sweeper.table_schemas import RETENTION_ACTIONS

    tables = str(_tables(tmp_path))
    store = DeltaRsTableStore(tables, None)  # type: ignore[arg-type]
    run, cursor_path = "retention-5", "/managed-ledgers/t/ns/persistent/a/idle"

    def action(kind: str, topic: str, cursor: str | None) -> dict[str, object]:
        return {"action": kind, "tenant": "t", "namespace": "t/ns", "topic_name": f"persistent://t/ns/{topic}",
                "managed_ledger": f"t/ns/persistent/{topic}", "cursor": cursor, "planned_bytes": 4096}

    idle, load_b, idle_c = (action("delete_subscription", "a", "idle"), action("load_topic", "b", None),
                            action("delete_subscription", "c", "idle"))
    journal = RepairJournal(store, run, "night-1")
    journal.intent(0, "stats", idle)
    journal.intent(0, "delete_subscription", idle, zk_path=cursor_path, zk_version=0, zk_ctime_ms=11)
    store.append_rows("retention_actions", [{
        **idle, "run_id": run, "plan_run_id": "night-1", "finished_at": datetime.now(UTC), "outcome": "deleted",
        "detail": "deleted idle subscription", "http_status": 204, "bytes_before": 4096, "bytes_after": None,
        "dry_run": False}], RETENTION_ACTIONS)
    journal.intent(1, "trim", load_b, zk_path="/managed-ledgers/t/ns/persistent/b", zk_version=3,
                   topic_unloaded=True, listed_ledger_ids=[1, 2], trimmable_ledger_ids=[1])
    journal.intent(2, "stats", idle_c)
    # Killed here: the trim of b may have been answered, c's stats were read; neither has a row.

    # `runs`: the repair run is interrupted, with what its journal and its rows say, before any other repair ran.
    shown = _run(tables, run, capsys)
    assert shown["status"] == "interrupted" and shown["mode"] == "executed" and shown["deleted"] == 1
    assert shown["stages"] == "retention_repair:interrupted"
    assert "not yet folded in: the next retention --execute records it" in shown["message"]
    assert "1 row recorded in retention_actions (1 deleted) and 2 calls intended without a row" in shown["message"]
    assert _run(tables, run, capsys, "--status", "interrupted")["run_id"] == run
    assert run not in {r["run_id"] for r in _show(["runs", "--tables", tables, "--status", "succeeded"], capsys)}

    # `show RUN actions`: the recorded row as it is, each call without one as `intended`.
    rows = _show(["show", run, "actions", "--tables", tables, "--limit", "0"], capsys)
    assert sorted((r["topic_name"][-1], r["outcome"], r["recorded_in"]) for r in rows) == [
        ("a", "deleted", "retention_actions"), ("b", "intended", "repair_journal"),
        ("c", "intended", "repair_journal")]
    intended = {r["topic_name"][-1]: r for r in rows if r["outcome"] == "intended"}
    assert all(r["detail"].startswith("in flight when the repair stopped: unknown until the next retention "
                                      "--execute settles it from the metadata") for r in intended.values())
    assert "its trim call" in intended["b"]["detail"] and "its stats call" in intended["c"]["detail"]
    assert intended["b"]["plan_run_id"] == "night-1" and intended["b"]["dry_run"] is False
    assert [r["topic_name"][-1] for r in _show(["show", run, "actions", "--tables", tables, "--status", "intended",
                                                "--reason", "delete_subscription"], capsys)] == ["c"]
    assert len(_show(["show", run, "actions", "--tables", tables, "--limit", "2"], capsys)) == 2
    assert main(["show", run, "actions", "--tables", tables, "--format", "csv"]) == EXIT_OK
    csv_lines = capsys.readouterr().out.splitlines()
    assert csv_lines[0].startswith("run_id,plan_run_id,finished_at") and csv_lines[0].endswith(",recorded_in")
    assert len(csv_lines) == 4 and sum(",intended," in line for line in csv_lines) == 2
    assert main(["show", run, "actions", "--tables", tables]) == EXIT_OK
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[-1] == "recorded_in" and sum(" intended " in line for line in table) == 2
    assert "3 actions rows of run retention-5" in table[-1]

    # The next repair folds it in (the managed ledger of b is gone: unknown; c never got past its stats:
    # interrupted). Then each action once, from retention_actions, and one `interrupted` row.
    def folded_once() -> None:
        rows = _show(["show", run, "actions", "--tables", tables, "--limit", "0"], capsys)
        assert sorted((r["topic_name"][-1], r["outcome"]) for r in rows) == [
            ("a", "deleted"), ("b", "unknown"), ("c", "interrupted")], rows
        assert {r["recorded_in"] for r in rows} == {"retention_actions"}
        shown = _run(tables, run, capsys)
        assert shown["stages"] == "retention_repair:interrupted" and shown["deleted"] == 1
        assert "not yet folded in" not in shown["message"]

    resolve_interrupted(store, lambda path: None, "retention-6", RepairCounts.from_row)
    folded_once()
    # A fold-in stopped after writing its rows and before closing the run: still nothing twice.
    DeltaTable(store.path(JOURNAL_TABLE)).delete("phase = 'closed'")
    folded_once()
    # Stopped earlier, after its action rows and before its `runs` row: the run is shown from the journal, its
    # actions from retention_actions only.
    DeltaTable(store.path("runs")).delete(f"run_id = '{run}'")
    shown = _run(tables, run, capsys)
    assert shown["stages"] == "retention_repair:interrupted" and "3 rows recorded" in shown["message"]
    assert "0 calls intended" in shown["message"]
    assert {r["recorded_in"] for r in _show(["show", run, "actions", "--tables", tables], capsys)} == \
        {"retention_actions"}


def test_json_and_csv_give_every_row_unless_limited(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A script reads json or csv as the whole answer: no silent cut at the table's 20 rows (issue 36)."""
    tables = _tables(tmp_path)
    store = DeltaRsTableStore(str(tables), None)  # type: ignore[arg-type]
    base = store.read_arrow("delete_results").to_pylist()[0]
    store.append_rows("delete_results", [{**base, "record_key": f"M{i}", "ledger_id": 100 + i} for i in range(30)],
                      DELETE_RESULTS)
    for fmt, header in (("json", 0), ("csv", 1)):
        assert main(["show", "night-1", "deletes", "--tables", str(tables), "--format", fmt]) == EXIT_OK
        assert len(capsys.readouterr().out.splitlines()) == 33 + header
        assert main(["show", "night-1", "deletes", "--tables", str(tables), "--format", fmt, "--limit", "5"]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 5 + header
    assert main(["show", "night-1", "deletes", "--tables", str(tables)]) == EXIT_OK
    assert "20 deletes rows of run night-1 (first 20: --limit 0 shows all)" in capsys.readouterr().out
