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
from sweeper.console import run_summaries
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
    from sweeper.delete.lock import RunLockHeld

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
