"""The layers of the code (issue 36 item 4), read from the source: every module of `sweeper/` and `harness/` sits in
a named layer, imports only from its own layer or lower ones, and no import circle exists.

Every import statement counts: at module level, inside a function (a lazy import is still a dependency) and under
`if TYPE_CHECKING:` (a type named from a higher layer is still a loop between layers, only hidden from the
interpreter). Relative imports are resolved; generated modules (`*_pb2`) are modules like any other.

A new module takes the layer of the longest entry below that names it or a package holding it; one that no entry
names fails `test_every_module_has_a_layer`: say where it belongs here, rather than letting it import anything.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("sweeper", "harness")

# Lowest first. Each entry: the layer's name, what it is, and the modules (or packages, with every module under
# them) in it. A module may import from its own layer (test_layering and the circle check keep that in order) or
# any lower one, never from a higher one.
LAYERS: list[tuple[str, str, tuple[str, ...]]] = [
    # Each package's `errors` module imports sweeper.errors only: it sits here, below every module that raises them.
    ("foundation", "words, records and errors every layer shares; no sweeper import but each other", (
        "sweeper",  # the package itself: its version
        "sweeper._proto", "sweeper.errors", "sweeper.vocabulary", "sweeper.names", "sweeper.records",
        "sweeper.resources", "sweeper.table_schemas", "sweeper.ratelimit", "sweeper.report.progress",
        "sweeper.report.chatter", "sweeper.codecs.errors", "sweeper.tables.errors", "sweeper.zk.errors",
        "sweeper.metastore.errors", "sweeper.broker.errors", "sweeper.rules.errors", "sweeper.report.errors",
        "sweeper.snapshot.errors", "sweeper.reconcile.errors", "sweeper.retention.errors", "sweeper.emit.errors",
        "sweeper.delete.errors", "sweeper.reclaim.errors", "sweeper.objectstore.errors",
    )),
    ("settings and formats", "the config (store addresses resolved as it loads), the metadata codecs, layouts", (
        "sweeper.config", "sweeper.metastore.urls", "sweeper.codecs", "sweeper.codecs.layout",
        "sweeper.codecs.pending_delete", "sweeper.spark",
    )),
    ("rules", "pure decisions over records and rows: what is an orphan, what is protected, what retention owes", (
        "sweeper.rules", "sweeper.report.plots",
    )),
    ("stores", "one module per store or service: ZooKeeper, Oxia, the tables, the broker, S3, the runs ledger", (
        "sweeper.zk", "sweeper.metastore", "sweeper.tables", "sweeper.broker.system_topic", "sweeper.objectstore",
        "sweeper.run_lock", "sweeper.runs", "sweeper.journal", "sweeper.report.metrics",
        "sweeper.scan",  # scan: the package's row helpers
    )),
    ("connections and readers", "a run's endpoints, the liveness probes, the scanners, the repair's journal", (
        "sweeper.connections", "sweeper.broker.liveness", "sweeper.retention.policies", "sweeper.scan.bookkeeper",
        "sweeper.scan.pulsar",
        "sweeper.scan.ownership", "sweeper.scan.pending_deletes", "sweeper.retention.journal",
    )),
    ("stages", "one step of a run each (test_layering: no stage imports another), and the run's report", (
        "sweeper.snapshot", "sweeper.reconcile", "sweeper.retention.debt", "sweeper.emit", "sweeper.retention.repair",
        # retention.debt's and retention.repair's parts (issue 46): a stage's own modules, in its layer
        "sweeper.retention.debt_types", "sweeper.retention.debt_reads", "sweeper.retention.debt_select",
        "sweeper.retention.debt_rows", "sweeper.retention.repair_plan", "sweeper.retention.repair_calls",
        "sweeper.delete", "sweeper.reclaim", "sweeper.stages", "sweeper.report.console",
        "sweeper.report.summaries",  # each result's one summary: reads every stage's result, above them all
    )),
    ("pipeline", "the stages in order, each wrapped once", (
        "sweeper.pipeline",
    )),
    ("commands", "the product's command line and Spark entry points", (
        "sweeper.cli", "sweeper.jobs",
    )),
    # The development harness sits above the whole product: it may use any of it, the product never imports it.
    ("harness basics", "the harness's shared pieces: process lifecycle, the sandbox's entities, the admin client", (
        "harness", "harness.lifecycle", "harness.sandbox.entities", "harness.testbed.admin",
    )),
    ("local servers", "ZooKeeper, Oxia, S3, Spark, a Pulsar endpoint and a testbed started on this host", (
        "harness.zkserver", "harness.oxiaserver", "harness.s3server", "harness.objectservers",
        "harness.spark_standalone",
        "harness.sandbox.pulsar", "harness.sandbox.pulsar_endpoint", "harness.testbed",
        "harness.zkensemble",
    )),
    ("worlds", "the clusters the harness builds and writes into those servers, with their ground truth", (
        "harness.sandbox", "harness.testbed.workload", "harness.testbed.orphans", "harness.testbed.bulk",
        "harness.testbed.world",
    )),
    ("harness commands", "the development commands the harness adds to the CLI", (
        "harness.cli_plugin",
    )),
]


def layer_of(module: str, layers: list[tuple[str, str, tuple[str, ...]]] = LAYERS) -> int | None:
    """The index of the layer of the longest entry that is `module` or a package holding it."""
    best: tuple[int, int] | None = None
    for index, (_, _, entries) in enumerate(layers):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return None if best is None else best[1]


# ---- the import graph ------------------------------------------------------------------------------------------


def modules(root: Path = REPO, packages: Iterable[str] = ROOTS) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _known(name: str, known: dict[str, Path]) -> str | None:
    """`name`, or the nearest package holding it, among our modules (None: a third-party or stdlib module)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, source: str, known: dict[str, Path], is_package: bool = False) -> set[str]:
    """Every module of ours `source` imports, wherever the statement is (TYPE_CHECKING blocks and functions too)."""
    package = module if is_package else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(filter(None, (_known(alias.name, known) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            for alias in node.names:
                target = f"{origin}.{alias.name}"  # `from package import submodule` imports the submodule
                out.update(filter(None, [target if target in known else _known(origin, known)]))
    out.discard(module)
    return out


def graph(root: Path = REPO, packages: Iterable[str] = ROOTS) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imports_of(name, path.read_text(), known, path.name == "__init__.py")
            for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(edges[root])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
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
    return sorted(found)


def between_packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph with every module folded into its top-level module or package (`sweeper.zk.wire` into `sweeper.zk`,
    `sweeper.config` stays): a loop across packages (config -> metastore -> zk -> config, issue 36) shows here even
    where no two modules import each other."""

    def fold(module: str) -> str:
        return ".".join(module.split(".")[:2])

    folded: dict[str, set[str]] = {}
    for module, targets in edges.items():
        folded.setdefault(fold(module), set()).update(fold(t) for t in targets if fold(t) != fold(module))
    return folded


def upward(edges: dict[str, set[str]], layers: list[tuple[str, str, tuple[str, ...]]] = LAYERS) -> list[str]:
    """Every import of a module from a higher layer than its own, in words."""
    found = []
    for module, targets in sorted(edges.items()):
        own = layer_of(module, layers)
        for target in sorted(targets):
            theirs = layer_of(target, layers)
            if own is not None and theirs is not None and theirs > own:
                found.append(f"{module} ({layers[own][0]}) imports {target} ({layers[theirs][0]})")
    return found


# ---- the tests -------------------------------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    assert [module for module in sorted(modules()) if layer_of(module) is None] == []


def test_no_module_imports_a_higher_layer() -> None:
    assert upward(graph()) == []


def test_no_import_circle_counting_type_checking_imports() -> None:
    assert circles(graph()) == []


def test_no_import_circle_between_packages() -> None:
    assert circles(between_packages(graph())) == []


def test_the_product_sits_below_the_harness() -> None:
    """Every layer of `sweeper` is below every layer of `harness`, so the upward check also forbids the product to
    import the harness."""
    owners = [{entry.partition(".")[0] for entry in entries} for _, _, entries in LAYERS]
    assert all(len(owner) == 1 for owner in owners)
    roots = [owner.pop() for owner in owners]
    assert roots == sorted(roots, key=ROOTS.index)


def test_the_checks_find_planted_violations(tmp_path: Path) -> None:
    """A tree with an upward import hidden under TYPE_CHECKING, a lazy one inside a function, and a circle closed by a
    relative import: each is found."""
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import Thing\n")
    (package / "low" / "other.py").write_text("def later():\n    import pkg.high.run\n")
    (package / "high.py").write_text("from .low import base\nclass Thing: ...\n")
    layers = [("low", "", ("pkg", "pkg.low")), ("high", "", ("pkg.high",))]
    edges = graph(tmp_path, ["pkg"])
    assert edges["pkg.high"] == {"pkg.low.base"} and edges["pkg.low.other"] == {"pkg.high"}
    assert upward(edges, layers) == ["pkg.low.base (low) imports pkg.high (high)",
                                     "pkg.low.other (low) imports pkg.high (high)"]
    assert circles(edges) == [["pkg.high", "pkg.low.base"]]
    assert circles(between_packages(edges)) == [["pkg.high", "pkg.low"]]
    assert circles(between_packages({"a.x.one": {"a.y.two"}, "a.y.two": {"a.y.three"}, "a.y.three": {"a.x.four"},
                                     "a.x.four": set()})) == [["a.x", "a.y"]]
    assert layer_of("pkg.low.deeper.module", layers) == 0 and layer_of("elsewhere", layers) is None
