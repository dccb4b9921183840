"""The real-Pulsar testbeds' life in a test session, serial or spread over pytest-xdist workers.

Two flavours: Pulsar on ZooKeeper (tests/real_pulsar/, the `testbed_world` fixture) and Pulsar on Oxia
(tests/real_pulsar/test_oxia_testbed.py, the `oxia_world` fixture); each is prepared once, only when collected
tests need it.

Starting the broker, driving the workload, making the orphans and waiting out the grace period take minutes,
nearly all of it waiting on the JVM and the clock; the testbed is prepared in a background thread while the rest
of the suite runs (the real-Pulsar tests come last).

Serial (`pytest`), the session's own process prepares it. Under xdist (`pytest -n 2`), the controller does: one
testbed however many workers, prepared from the moment a worker reports a collection that needs it, and stopped
after every worker has finished. The controller hands the prepared world to the worker that runs the real-Pulsar
tests (they form one `xdist_group`) as a pickle in a directory named by SHARE_ENV, which workers inherit.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # harness.testbed imports pulsar-client and boto3: only a session that needs it pays for that
    from harness.testbed.world import World

SHARE_ENV = "SWEEPER_TESTBED_SHARE"
WANTED, WORLD, FAILED, COSTS = "wanted", "world.pickle", "failed.txt", "costs.pickle"
WAIT_LIMIT_S = 1800.0
ZOOKEEPER, OXIA = "zookeeper", "oxia"  # as harness.testbed.server names the metadata stores
FLAVOUR_FIXTURES = {ZOOKEEPER: "testbed_world", OXIA: "oxia_world"}
OXIA_TESTS = "tests/real_pulsar/test_oxia_testbed.py"


def testbed_of_test(nodeid: str) -> str | None:
    """The testbed a test runs against, from its id: its tests share one worker under xdist."""
    if nodeid.startswith(OXIA_TESTS):
        return OXIA
    return ZOOKEEPER if nodeid.startswith("tests/real_pulsar/") else None


def testbeds_needed(item: pytest.Item) -> set[str]:
    names = getattr(item, "fixturenames", ())
    return {flavour for flavour, fixture in FLAVOUR_FIXTURES.items() if fixture in names}


def unavailable(flavour: str = ZOOKEEPER) -> str | None:
    from harness.testbed.server import default_pulsar_home

    if os.environ.get("SWEEPER_SKIP_REAL_PULSAR") == "1":
        return "SWEEPER_SKIP_REAL_PULSAR=1"
    if not (default_pulsar_home() / "bin" / "pulsar").exists():
        return (f"no Pulsar distribution at {default_pulsar_home()}: run `mvn -B -f jvm/pom.xml package` "
                "(scripts/setup.sh does)")
    if flavour == OXIA:
        from harness.oxiaserver import missing_binary_reason, oxia_binary

        if oxia_binary() is None:
            return missing_binary_reason()
    return None


def _file(share: Path, flavour: str, name: str) -> Path:
    return share / f"{flavour}-{name}"


class Testbed:
    """One testbed, prepared in a thread of this process; `wait` returns its world."""

    __test__ = False  # not a pytest test class

    def __init__(self, flavour: str = ZOOKEEPER, share: Path | None = None, after: Testbed | None = None) -> None:
        self.flavour = flavour
        # Prepared once `after` is (if it was started): two Pulsars, two workloads and the suite's first (slowest)
        # tests at once overloaded two cores (CI saw a test pass its timeout); one after the other, both are still
        # ready long before their tests are handed out, last.
        self.after = after
        self.cost_prefix = "" if flavour == ZOOKEEPER else f"{flavour}_"
        self.share = share  # set in a controller: the world is also written there for the workers
        self.home: Path | None = None
        self.info: Any = None
        self.world: World | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is not None:
            return
        self.home = Path(tempfile.mkdtemp(prefix=f"sweeper-testbed-{self.flavour}-"))
        self.thread = threading.Thread(target=self._prepare, name="real-pulsar-testbed", daemon=True)
        self.thread.start()

    def _prepare(self) -> None:
        from harness.testbed import server
        from harness.testbed.world import build_world
        from tests.support.real_pulsar import COST, GRACE_S

        try:
            if self.after is not None and self.after.thread is not None:
                self.after.thread.join()
            started = time.monotonic()
            assert self.home is not None
            self.info = server.testbed_up(self.home, metadata=self.flavour)
            COST[f"{self.cost_prefix}testbed_up_s"] = time.monotonic() - started
            world = build_world(self.info)
            COST[f"{self.cost_prefix}world_s"] = world.built_s
            # Orphans must be past the grace period before the sweeper looks.
            newest = max(o.made_at_ms for o in world.manifest.orphans) / 1000
            time.sleep(max(0.0, newest + GRACE_S + 2 - time.time()))
            self.world = world
            if self.share is not None:
                _write_atomically(_file(self.share, self.flavour, WORLD), pickle.dumps(world))
        except BaseException as exc:  # reported by the fixture, in the tests that need the testbed
            self.error = exc
            from harness.s3server import last_traceback

            report = f"{type(exc).__name__}: {exc}"
            moto = last_traceback(Path(self.home) / "logs") if self.home is not None else None
            if moto is not None:
                report += f"\nmoto's last traceback:\n{moto}"
                self.error = RuntimeError(report)
            if self.share is not None:
                _write_atomically(_file(self.share, self.flavour, FAILED), report.encode())

    def wait(self) -> World:
        self.start()
        assert self.thread is not None
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"the real Pulsar testbed ({self.flavour}) did not come up: {self.error}") \
                from self.error
        assert self.world is not None
        return self.world

    def stop(self) -> None:
        from harness.testbed import server
        from tests.support.real_pulsar import COST

        if self.thread is None or self.home is None:
            return
        self.thread.join(timeout=600)
        started = time.monotonic()
        server.testbed_down(self.home, self.world.info if self.world else self.info)
        COST[f"{self.cost_prefix}testbed_down_s"] = time.monotonic() - started
        shutil.rmtree(self.home, ignore_errors=True)


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)


def _share() -> Path | None:
    named = os.environ.get(SHARE_ENV)
    return Path(named) if named else None


def in_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def _testbeds(share: Path | None) -> dict[str, Testbed]:
    first = Testbed(ZOOKEEPER, share)
    return {ZOOKEEPER: first, OXIA: Testbed(OXIA, share, after=first)}


_LOCAL = _testbeds(None)


def request_testbed(flavour: str = ZOOKEEPER) -> None:
    """Collection found tests that need a testbed: start it here, or tell the controller that serves it."""
    share = _share()
    if in_worker() and share is not None:
        _file(share, flavour, WANTED).touch()
    else:
        _LOCAL[flavour].start()


def world(flavour: str = ZOOKEEPER) -> World:
    """The prepared world: this process's own testbed, or the controller's, once it has written it."""
    share = _share()
    if not (in_worker() and share is not None):
        return _LOCAL[flavour].wait()
    deadline = time.monotonic() + WAIT_LIMIT_S
    while time.monotonic() < deadline:
        if _file(share, flavour, WORLD).exists():
            # Written by this session's controller.
            return pickle.loads(_file(share, flavour, WORLD).read_bytes())
        if _file(share, flavour, FAILED).exists():
            raise RuntimeError(f"the real Pulsar testbed ({flavour}) did not come up: "
                               f"{_file(share, flavour, FAILED).read_text()}")
        time.sleep(0.5)
    raise RuntimeError(f"the real Pulsar testbed ({flavour}) was not ready within {WAIT_LIMIT_S:.0f} s")


def stop_local() -> None:
    """The end of a serial session, or of a worker's: a worker's costs go to the controller's summary."""
    from tests.support.real_pulsar import COST

    for testbed in _LOCAL.values():
        testbed.stop()
    share = _share()
    if in_worker() and share is not None and COST:
        _write_atomically(share / f"{os.environ['PYTEST_XDIST_WORKER']}-{COSTS}", pickle.dumps(dict(COST)))


class ControllerPlugin:
    """Registered in an xdist controller (tests/conftest.py): serves the one testbed to the workers."""

    def __init__(self) -> None:
        self.share = Path(tempfile.mkdtemp(prefix="sweeper-testbed-share-"))
        os.environ[SHARE_ENV] = str(self.share)  # before the workers start: they inherit it
        self.testbeds = _testbeds(self.share)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Any) -> None:
        for flavour, testbed in self.testbeds.items():
            if _file(self.share, flavour, WANTED).exists() and unavailable(flavour) is None:
                testbed.start()

    def pytest_sessionfinish(self) -> None:
        for testbed in self.testbeds.values():
            testbed.stop()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        from tests.support.real_pulsar import COST

        costs = dict(COST)
        for part in sorted(self.share.glob(f"*-{COSTS}")):
            costs.update(pickle.loads(part.read_bytes()))
        if costs:
            terminalreporter.write_line("real Pulsar testbed cost (s): "
                                        + ", ".join(f"{k}={v:.0f}" for k, v in costs.items()))
        shutil.rmtree(self.share, ignore_errors=True)
