"""The package's shape (issues 22 and 36), read from the source: no import circle, no stage importing another stage,
and the test harness (sandbox, testbed, local servers), a package of its own beside `sweeper`, never imported by the
product: its commands reach the CLI as an entry-point plugin (harness.cli_plugin), and neither the wheel nor the
executors' zip carries it.

Every import statement counts, at module level or inside a function (a lazy import is still a dependency);
only `if TYPE_CHECKING:` blocks, which never run, are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_import_layers import circles as _cycles  # one Tarjan for both shape tests

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "sweeper"
HARNESS_PACKAGE = REPO / "harness"

# A stage module is one step of the run; the orchestrators (pipeline, cli, jobs/) call them, they never call
# each other. Shared rules and vocabulary (classify, retention, safety, protection, scan, vocabulary, runs) are
# libraries any stage may use.
STAGES = {
    "sweeper.snapshot": "snapshot",
    "sweeper.reconcile.gates": "gates",
    "sweeper.reconcile": "reconcile",  # the stage and its frames and report (gates: the longer entry above)
    "sweeper.retention.debt": "retention_debt",
    "sweeper.retention.debt_types": "retention_debt",  # the stage's own parts (issue 46)
    "sweeper.retention.debt_reads": "retention_debt",
    "sweeper.retention.debt_select": "retention_debt",
    "sweeper.retention.debt_rows": "retention_debt",
    "sweeper.emit": "emit",
    "sweeper.retention.repair": "retention_repair",
    "sweeper.retention.repair_plan": "retention_repair",  # the stage's own parts (issue 46)
    "sweeper.retention.repair_calls": "retention_repair",
}
HARNESS = ("harness",)
# Product modules allowed to import the harness: none (issue 36). `sweeper sandbox`, `testbed`, `audit` and
# `sweep --sandbox` come from harness.cli_plugin through the `ledger_sweeper.cli` entry point.
HARNESS_USERS: set[str] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for path in [*PACKAGE.rglob("*.py"), *HARNESS_PACKAGE.rglob("*.py")]:
        if "_proto" in path.parts or path.name.endswith("_pb2.py"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in modules:
                    out.add(sub)
                elif node.module in modules:
                    out.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _stage_of(module: str) -> str | None:
    if module.startswith("sweeper.delete"):
        return "delete"
    if module.startswith("sweeper.reclaim"):
        return "reclaim"  # the step after the delete (issue 35): it reads the delete's tables, never its code
    held = [prefix for prefix in STAGES if module == prefix or module.startswith(prefix + ".")]
    return STAGES[max(held, key=len)] if held else None


def test_no_import_circle_in_the_package() -> None:
    assert _cycles(_graph()) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_stage_imports_another_stage() -> None:
    crossing = sorted((module, target) for module, targets in _graph().items() for target in targets
                      if _stage_of(module) and _stage_of(target) and _stage_of(module) != _stage_of(target))
    assert crossing == []


def test_no_product_module_imports_the_harness() -> None:
    def harness(module: str) -> bool:
        return any(module == h or module.startswith(h + ".") for h in HARNESS)

    leaks = sorted((module, target) for module, targets in _graph().items() for target in targets
                   if harness(target) and not harness(module) and module not in HARNESS_USERS)
    assert leaks == []


def test_no_product_module_changes_the_import_path() -> None:
    """No path hacks: the product finds nothing by putting a directory on sys.path (the dev install's .pth does)."""
    changes = sorted(str(path.relative_to(REPO)) for path in PACKAGE.rglob("*.py")
                     if "sys.path.insert" in path.read_text() or "sys.path.append" in path.read_text())
    assert changes == []


def test_the_dev_install_registers_the_harness_plugin_and_the_cli_loads_it() -> None:
    from sweeper.cli import build_parser, plugin_entry_points

    assert [p.value for p in plugin_entry_points()] == ["harness.cli_plugin:register"], (
        "reinstall the checkout for development: pip install -e . (scripts/setup.sh)")
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert {"sandbox", "testbed", "audit"} <= set(commands)
    assert "--sandbox" in commands["sweep"].format_help()


def test_a_plugin_whose_module_is_missing_is_skipped_silently(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """What an installed wheel sees: the entry point is declared, its module (harness.cli_plugin) absent."""
    import importlib.metadata

    from sweeper import cli

    missing = importlib.metadata.EntryPoint("harness", "no_such_harness.cli_plugin:register", cli.PLUGIN_GROUP)
    monkeypatch.setattr(cli, "plugin_entry_points", lambda: [missing])
    commands = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    assert "sandbox" not in commands and "snapshot" in commands and "--sandbox" not in commands["sweep"].format_help()
    assert capsys.readouterr().err == ""
    # A plugin that is there but fails to load is named on stderr, and skipped: the product's commands still parse.
    broken = importlib.metadata.EntryPoint("broken", "json:no_such_register", cli.PLUGIN_GROUP)
    monkeypatch.setattr(cli, "plugin_entry_points", lambda: [broken])
    assert "init-config" in next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    assert "CLI plugin broken (json:no_such_register) not loaded" in capsys.readouterr().err


def test_the_harness_lives_outside_the_product_package() -> None:
    modules = _modules()
    assert {"harness.sandbox", "harness.testbed", "harness.zkserver"} <= set(modules)
    for name in ("sandbox", "testbed", "zkserver", "s3server", "spark_standalone", "lifecycle"):
        assert not any(m == f"sweeper.{name}" or m.startswith(f"sweeper.{name}.") for m in modules), name


def test_the_harness_check_finds_a_leak(tmp_path: Path) -> None:
    leaky = tmp_path / "leaky.py"
    leaky.write_text("def f():\n    from harness.sandbox import sandbox_up\n")
    assert _imports(leaky, {"harness.sandbox": leaky}) == {"harness.sandbox"}


@pytest.mark.integration  # pip builds the wheel
def test_neither_the_wheel_nor_the_executor_zip_carries_the_harness(tmp_path: Path) -> None:
    """The wheel built from pyproject.toml as it is (in a copy of the sources, so the checkout gets no build/
    directory), and the zip spark-submit ships: the `sweeper` package only (tests/test_wheel.py installs and runs
    the wheel)."""
    import sys
    import zipfile

    from tests.test_wheel import _build_wheel

    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert {"sweeper/cli.py", "sweeper/jobs/sweep.py", "sweeper/resources/pending_delete_ledger_info.avsc",
            "sweeper/resources/cluster.example.toml"} <= set(names)
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"sweeper"}
    assert not [n for n in names if n.startswith("harness/") or "/sandbox/" in n or "/testbed/" in n]

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from build_pyfiles import build
    finally:
        sys.path.remove(str(REPO / "scripts"))
    shipped = build(tmp_path / "pyfiles.zip")
    assert "sweeper/cli.py" in shipped and {n.split("/")[0] for n in shipped} == {"sweeper"}


@pytest.mark.integration  # the CLI as a process
def test_the_commands_that_start_the_harness_find_it_from_any_directory(tmp_path: Path) -> None:
    """The dev install reaches the harness plugin from any directory, with no PYTHONPATH."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "sweeper.cli", "sandbox", "status", "--home", str(tmp_path / "sb")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 3 and "not running" in done.stdout and "Traceback" not in done.stderr, done.stderr


def test_the_plugin_spells_the_sandbox_port_as_the_harness_does() -> None:
    from harness import cli_plugin
    from harness.sandbox import DEFAULT_PORT

    assert cli_plugin.DEFAULT_PORT == DEFAULT_PORT
