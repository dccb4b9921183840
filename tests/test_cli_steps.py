"""Issue 46 item 1: one opening for the stage commands, and `STEPS` the only orchestration, reclaim included."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from sweeper import pipeline
from sweeper.cli import SWEEP_STAGES, build_parser
from sweeper.config import SweeperConfig
from sweeper.report.summaries import Summary

REPO = Path(__file__).resolve().parents[1]


def test_no_command_finds_its_run_on_its_own() -> None:
    """Every cmd_* reaches a run through runs.resolve_run (one refusal), never through runs.latest directly."""
    tree = ast.parse((REPO / "sweeper" / "cli.py").read_text())
    commands = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("cmd_")]
    assert len(commands) > 5
    calls = [(f.name, ast.unparse(node.func)) for f in commands for node in ast.walk(f)
             if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "latest"]
    assert calls == []


class _Result:
    def __init__(self, run_id: str) -> None:
        self.run_id, self.duration_s = run_id, 0.5
        self.counts = SweeperCountsStub()


class SweeperCountsStub:
    def as_row(self) -> dict[str, int]:
        return {"n": 1}


def _stubbed_steps(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    """Every step's stage replaced by one that records its call; the steps' own order, hooks and reports stay."""
    for name, step in pipeline.STEPS.items():
        def run(spark: Any, config: Any, store: Any, run_id: str | None, execute: bool, log: Any,
                name: str = name) -> _Result:
            calls.append(f"{name}(execute={execute})")
            return _Result(run_id or "r1")

        def before(config: Any, store: Any, run_id: str, execute: bool, log: Any, name: str = name) -> None:
            calls.append(f"{name}.before")

        stub = step.__class__(name, lambda config, sweep: "", run, lambda result, name=name: Summary(name, "ok"),
                              rides_along=step.rides_along, before=before if step.before else None)
        monkeypatch.setitem(pipeline.STEPS, name, stub)
    monkeypatch.setattr(pipeline, "export_metrics", lambda *a, **k: None)


@pytest.mark.parametrize(("until", "execute", "enabled", "expected"), [
    ("reclaim", True, True, ["delete.before is before delete", "reclaim(execute=True)"]),
    # Named, it runs and measures only; its hook is asked before the delete (and samples only when executing).
    ("reclaim", False, False, ["delete.before is before delete", "reclaim(execute=False)"]),
    ("delete", True, True, ["delete.before is before delete", "reclaim(execute=True)"]),  # as before issue 46
    ("delete", True, False, []),
    ("delete", False, True, []),
])
def test_sweep_until_reclaim_runs_reclaim_through_its_step(monkeypatch: pytest.MonkeyPatch, until: str,
                                                           execute: bool, enabled: bool, expected: list[str]) -> None:
    assert SWEEP_STAGES == pipeline.STAGES and SWEEP_STAGES[-2:] == ("delete", "reclaim")
    build_parser().parse_args(["sweep", "--until", "reclaim", "--execute"])  # accepted by the parser
    calls: list[str] = []
    _stubbed_steps(monkeypatch, calls)
    config = SweeperConfig().replace(reclaim={"enabled": enabled}, offload={"enabled": False})
    result = pipeline.sweep(None, config, None, until=until, execute=execute, log=lambda line: None)  # type: ignore[arg-type]
    said = []
    if "reclaim.before" in calls:
        assert calls.index("reclaim.before") == calls.index(f"delete(execute={execute})") - 1
        said.append("delete.before is before delete")
    said += [c for c in calls if c.startswith("reclaim(")]
    assert said == expected
    assert ("reclaim" in result.stages) == bool([c for c in calls if c.startswith("reclaim(")])
    assert calls[0] == f"snapshot(execute={execute})"


def test_execute_before_the_delete_is_still_refused() -> None:
    with pytest.raises(ValueError, match="stops before the delete"):
        pipeline.sweep(None, SweeperConfig(), None, until="emit", execute=True)  # type: ignore[arg-type]
