"""The package's shape (issue 22), read from the source: no import circle, no stage importing another stage, and
the test harness (sandbox, testbed, local servers), a package of its own beside `sweeper`, reached only by the
commands that start it and shipped neither in the wheel nor in the executors' zip.

Every import statement counts, at module level or inside a function (a lazy import is still a dependency);
only `if TYPE_CHECKING:` blocks, which never run, are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "sweeper"
HARNESS_PACKAGE = REPO / "harness"

# A stage module is one step of the run; the orchestrators (pipeline, cli, jobs/) call them, they never call
# each other. Shared rules and vocabulary (classify, retention, safety, protection, scan, vocabulary, runs) are
# libraries any stage may use.
STAGES = {
    "sweeper.snapshot": "snapshot",
    "sweeper.gates": "gates",
    "sweeper.reconcile": "reconcile",
    "sweeper.retention_debt": "retention_debt",
    "sweeper.emit": "emit",
    "sweeper.retention_repair": "retention_repair",
}
HARNESS = ("harness",)
# The commands that start the harness (`sweeper sandbox`, `sweeper testbed`, `sweep --sandbox`); no other product
# module may import it.
HARNESS_USERS = {"sweeper.cli"}


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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _stage_of(module: str) -> str | None:
    if module.startswith("sweeper.delete"):
        return "delete"
    if module.startswith("sweeper.reclaim"):
        return "reclaim"  # the step after the delete (issue 35): it reads the delete's tables, never its code
    return STAGES.get(module)


def test_no_import_circle_in_the_package() -> None:
    assert _cycles(_graph()) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_stage_imports_another_stage() -> None:
    crossing = sorted((module, target) for module, targets in _graph().items() for target in targets
                      if _stage_of(module) and _stage_of(target) and _stage_of(module) != _stage_of(target))
    assert crossing == []


def test_only_the_commands_that_start_the_harness_import_it() -> None:
    def harness(module: str) -> bool:
        return any(module == h or module.startswith(h + ".") for h in HARNESS)

    leaks = sorted((module, target) for module, targets in _graph().items() for target in targets
                   if harness(target) and not harness(module) and module not in HARNESS_USERS)
    assert leaks == []


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
    directory), and the zip spark-submit ships: the product's packages only."""
    import shutil
    import subprocess
    import sys
    import zipfile

    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for top in ("sweeper", "jobs", "harness", "schemas"):
        shutil.copytree(REPO / top, source / top, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("ledger_sweeper-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("sweeper/cli.py") for n in names) and any(n.startswith("jobs/") for n in names)
    assert not [n for n in names if n.startswith("harness/") or "/sandbox/" in n or "/testbed/" in n]

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from build_pyfiles import build
    finally:
        sys.path.remove(str(REPO / "scripts"))
    shipped = build(tmp_path / "pyfiles.zip")
    assert "sweeper/cli.py" in shipped and not [n for n in shipped if n.startswith("harness/")]


@pytest.mark.integration  # the CLI as a process
def test_the_commands_that_start_the_harness_find_it_from_any_directory(tmp_path: Path) -> None:
    """The harness is not installed: `sweeper sandbox` run elsewhere than the checkout still reaches it."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "sweeper.cli", "sandbox", "status", "--home", str(tmp_path / "sb")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 3 and "not running" in done.stdout and "Traceback" not in done.stderr, done.stderr
