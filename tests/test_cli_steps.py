"""Issue 46 item 1: one opening for the stage commands, and `STEPS` the only orchestration, reclaim included."""

from __future__ import annotations

import ast
from pathlib import Path

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
        def run(call: pipeline.StageCall, name: str = name) -> _Result:
            calls.append(f"{name}(execute={call.execute})")
            return _Result(call.run_id or "r1")

        def before(call: pipeline.StageCall, name: str = name) -> None:
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


def test_every_stage_command_runs_its_stage_through_steps() -> None:
    """No cmd_* calls a stage function itself: the single-stage commands run `pipeline.STEPS[name]`, the sweep's
    own steps, so a stage's bookkeeping and its summary cannot differ between `sweep` and its command."""
    tree = ast.parse((REPO / "sweeper" / "cli.py").read_text())
    commands = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("cmd_")]
    direct = [(f.name, ast.unparse(node.func)) for f in commands for node in ast.walk(f)
              if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1].endswith("_stage")
              and ast.unparse(node.func) != "open_stage"]
    assert direct == []
    stages = {"cmd_snapshot": "snapshot", "cmd_reconcile": "reconcile", "cmd_retention_debt": "retention_debt",
              "cmd_emit": "emit", "cmd_reclaim": "reclaim", "cmd_retention": "retention_repair"}
    for f in commands:
        if f.name in stages:
            named = [ast.literal_eval(node.args[0]) for node in ast.walk(f)
                     if isinstance(node, ast.Call) and ast.unparse(node.func) == "_run_step"]
            assert named == [stages[f.name]], f.name
    assert set(stages.values()) <= set(pipeline.STEPS)


def test_a_command_hands_its_choices_to_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sweeper reclaim --execute` asks for a GC itself (`trigger`), whatever [reclaim] trigger_gc says; the sweep's
    reclaim asks only with --execute and trigger_gc."""
    seen: list[bool] = []
    monkeypatch.setattr(pipeline, "reclaim_stage",
                        lambda config, store, run_id, trigger=False, log=print: seen.append(trigger) or _Result(run_id))
    config = SweeperConfig().replace(reclaim={"trigger_gc": False}, offload={"enabled": False})
    step = pipeline.STEPS["reclaim"]
    step.run(pipeline.StageCall(None, config, None, "r1", True, print, {"trigger": True}))  # type: ignore[arg-type]
    step.run(pipeline.StageCall(None, config, None, "r1", True, print))  # type: ignore[arg-type]
    step.run(pipeline.StageCall(None, config.replace(reclaim={"trigger_gc": True}), None, "r1",  # type: ignore[arg-type]
                                False, print))
    assert seen == [True, False, False]
