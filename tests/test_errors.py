"""One exception hierarchy (issue 36 item 5, issue 46): every error of the package is a `sweeper.errors.SweeperError`
whose class says its exit code, mapped in one place; the internal ones (`InternalError`) are named here with why, and
each package keeps its errors in its own `errors` module."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import sweeper
from sweeper import errors
from sweeper.errors import (
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_USAGE,
    ConfigError,
    ConfigurationError,
    InternalError,
    Refused,
    SweeperError,
    UsageError,
    exit_code,
    terminal_line,
)

# The `InternalError`s: each is caught where it is raised and becomes one of the hierarchy's operator-facing errors
# (or a recorded outcome); reaching the CLI it is exit 1 with its trace in the log file. By class name, and why.
INTERNAL = {
    "TableNotFoundError": "a missing table is read as empty or refused by the caller",
    "TableSchemaError": "a programming error in a stage's rows: a bug, exit 1 with its trace",
    "NotNullViolation": "raised inside a table write: a bug, exit 1",
    "InvalidPendingDelete": "a malformed record is quarantined as `invalid`, never raised",
    "MetadataDecodeError": "a corrupt znode is quarantined, never raised to the CLI",
    "ZooKeeperWireError": "the wire reader's failure, turned into ZooKeeperUnavailableError",
    "HandshakeRefused": "one host refused our TLS session or login: collected into ZooKeeperSecurityError",
    "MetricsError": "a metrics outage is a warning line, never a failed sweep",
    "EmitFailed": "escalated by the pipeline to a refusal naming what was acknowledged",
    "SnapshotIncomplete": "a scan that lost part of its input: a failure (exit 1), recorded",
    "BookieAnswerError": "a bookie's answer we cannot read: the bookie is not_measured",
    "BookieUnreachable": "a bookie that does not answer: not_measured",
    "ObjectStoreError": "a store call that failed: a quarantined listing slice or a failed delete result",
}


def _exception_classes(private: bool = False) -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(sweeper.__path__, "sweeper."):
        if "_proto" in info.name or info.name.startswith("sweeper.jobs"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name
                    and (private or not name.startswith("_"))):
                found[f"{info.name}.{name}"] = value
    return found


def test_every_error_of_the_package_is_in_the_hierarchy() -> None:
    classes = _exception_classes(private=True)
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, SweeperError))
    assert outside == [], "put these under sweeper.errors (UsageError, ConfigurationError, Refused, InternalError)"


def test_every_error_is_defined_in_its_package_errors_module() -> None:
    """One place per package (issue 46): `sweeper/<package>/errors.py`, or sweeper/errors.py for the root modules'."""
    elsewhere = sorted(name for name, cls in _exception_classes(private=True).items()
                       if cls.__module__.rpartition(".")[2] != "errors")
    assert elsewhere == [], "move these into their package's errors module (it imports only sweeper.errors)"


def test_each_errors_module_imports_nothing_of_the_sweeper_but_sweeper_errors() -> None:
    import ast
    from pathlib import Path

    for path in Path(sweeper.__file__).parent.rglob("errors.py"):
        imported = {node.module for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {alias.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Import)
                     for alias in node.names}
        ours = {name for name in imported if name == "sweeper" or name.startswith("sweeper.")}
        allowed = set() if path.parent == Path(sweeper.__file__).parent else {"sweeper.errors"}
        assert ours <= allowed, f"{path} imports {sorted(ours - allowed)}"


def test_every_internal_error_says_why_it_never_reaches_the_operator() -> None:
    internal = {cls.__name__ for cls in _exception_classes(private=True).values()
                if issubclass(cls, InternalError) and cls is not InternalError}
    assert sorted(internal - set(INTERNAL)) == [], "name these in INTERNAL with why they never reach the operator"
    assert sorted(set(INTERNAL) - internal) == []
    assert all(not issubclass(cls, UsageError | Refused) for cls in _exception_classes(private=True).values()
               if issubclass(cls, InternalError))


def test_an_internal_error_reaching_the_cli_is_exit_1_with_its_trace_in_the_log(
        capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from sweeper import cli
    from sweeper.codecs.errors import MetadataDecodeError

    assert exit_code(InternalError("x")) == 1 and exit_code(MetadataDecodeError("x", kind="truncated")) == 1

    def fails(_args: argparse.Namespace) -> int:
        raise MetadataDecodeError("cut short", kind="truncated")

    with pytest.raises(MetadataDecodeError):  # as any unforeseen error: main lets it out, its trace to the log file
        cli._run(argparse.Namespace(command="init-config", func=fails))
    assert capsys.readouterr().err == ""


def test_config_and_setup_errors_are_usage_errors_and_refusals_are_refusals() -> None:
    from sweeper.metastore.errors import StoreUrlError
    from sweeper.retention.errors import RepairLockHeld
    from sweeper.rules.errors import SafetyConfigError
    from sweeper.tables.errors import DeltaSparkUnavailableError, TableStorageUnavailableError
    from sweeper.zk.errors import ZooKeeperUnavailableError

    for cls in (ConfigError, DeltaSparkUnavailableError, TableStorageUnavailableError, StoreUrlError,
                SafetyConfigError):
        exc = cls("x")
        assert isinstance(exc, ConfigurationError) and isinstance(exc, UsageError)
        assert exit_code(exc) == EXIT_USAGE and terminal_line(exc) == "configuration error: x"
    for cls in (RepairLockHeld, ZooKeeperUnavailableError, errors.StageRefused):
        assert exit_code(cls("y")) == EXIT_REFUSED and terminal_line(cls("y")) == "refused: y"
    assert exit_code(UsageError("z")) == EXIT_USAGE and terminal_line(UsageError("z")) == "usage error: z"
    assert issubclass(Refused, RuntimeError) and issubclass(ConfigError, ValueError)  # what callers caught before


def test_interrupts_and_the_unforeseen() -> None:
    assert exit_code(KeyboardInterrupt()) == EXIT_INTERRUPTED
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("SPARK_JOB_CANCELLED") from None
    except RuntimeError as cancelled:
        assert exit_code(cancelled) == EXIT_INTERRUPTED  # the job PySpark cancelled for the interrupt
    assert exit_code(ValueError("a bug")) == 1


@pytest.mark.parametrize("argv", [["show", "r", "orphans", "--tables", "/nonexistent-tables-dir"]])
def test_the_cli_maps_through_the_hierarchy(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from sweeper.cli import main

    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("usage error: no tables at /nonexistent-tables-dir")
