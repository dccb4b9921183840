"""The real-Pulsar testbed's life in a test session, serial or spread over pytest-xdist workers.

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


def unavailable() -> str | None:
    from harness.testbed.server import default_pulsar_home

    if os.environ.get("SWEEPER_SKIP_REAL_PULSAR") == "1":
        return "SWEEPER_SKIP_REAL_PULSAR=1"
    if not (default_pulsar_home() / "bin" / "pulsar").exists():
        return (f"no Pulsar distribution at {default_pulsar_home()}: run `mvn -B -f jvm/pom.xml package` "
                "(scripts/setup.sh does)")
    return None


class Testbed:
    """One testbed, prepared in a thread of this process; `wait` returns its world."""

    __test__ = False  # not a pytest test class

    def __init__(self, share: Path | None = None) -> None:
        self.share = share  # set in a controller: the world is also written there for the workers
        self.home: Path | None = None
        self.info: Any = None
        self.world: World | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is not None:
            return
        self.home = Path(tempfile.mkdtemp(prefix="sweeper-testbed-"))
        self.thread = threading.Thread(target=self._prepare, name="real-pulsar-testbed", daemon=True)
        self.thread.start()

    def _prepare(self) -> None:
        from harness.testbed import server
        from harness.testbed.world import build_world
        from tests.support.real_pulsar import COST, GRACE_S

        try:
            started = time.monotonic()
            assert self.home is not None
            self.info = server.testbed_up(self.home)
            COST["testbed_up_s"] = time.monotonic() - started
            world = build_world(self.info)
            COST["world_s"] = world.built_s
            # Orphans must be past the grace period before the sweeper looks.
            newest = max(o.made_at_ms for o in world.manifest.orphans) / 1000
            time.sleep(max(0.0, newest + GRACE_S + 2 - time.time()))
            self.world = world
            if self.share is not None:
                _write_atomically(self.share / WORLD, pickle.dumps(world))
        except BaseException as exc:  # reported by the fixture, in the tests that need the testbed
            self.error = exc
            if self.share is not None:
                _write_atomically(self.share / FAILED, f"{type(exc).__name__}: {exc}".encode())

    def wait(self) -> World:
        self.start()
        assert self.thread is not None
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"the real Pulsar testbed did not come up: {self.error}") from self.error
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
        COST["testbed_down_s"] = time.monotonic() - started
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


_LOCAL = Testbed()


def request_testbed() -> None:
    """Collection found tests that need the testbed: start it here, or tell the controller that serves it."""
    share = _share()
    if in_worker() and share is not None:
        (share / WANTED).touch()
    else:
        _LOCAL.start()


def world() -> World:
    """The prepared world: this process's own testbed, or the controller's, once it has written it."""
    share = _share()
    if not (in_worker() and share is not None):
        return _LOCAL.wait()
    deadline = time.monotonic() + WAIT_LIMIT_S
    while time.monotonic() < deadline:
        if (share / WORLD).exists():
            return pickle.loads((share / WORLD).read_bytes())
        if (share / FAILED).exists():
            raise RuntimeError(f"the real Pulsar testbed did not come up: {(share / FAILED).read_text()}")
        time.sleep(0.5)
    raise RuntimeError(f"the real Pulsar testbed was not ready within {WAIT_LIMIT_S:.0f} s")


def stop_local() -> None:
    """The end of a serial session, or of a worker's: a worker's costs go to the controller's summary."""
    from tests.support.real_pulsar import COST

    _LOCAL.stop()
    share = _share()
    if in_worker() and share is not None and COST:
        _write_atomically(share / f"{os.environ['PYTEST_XDIST_WORKER']}-{COSTS}", pickle.dumps(dict(COST)))


class ControllerPlugin:
    """Registered in an xdist controller (tests/conftest.py): serves the one testbed to the workers."""

    def __init__(self) -> None:
        self.share = Path(tempfile.mkdtemp(prefix="sweeper-testbed-share-"))
        os.environ[SHARE_ENV] = str(self.share)  # before the workers start: they inherit it
        self.testbed = Testbed(self.share)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Any) -> None:
        if (self.share / WANTED).exists() and unavailable() is None:
            self.testbed.start()

    def pytest_sessionfinish(self) -> None:
        self.testbed.stop()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        from tests.support.real_pulsar import COST

        costs = dict(COST)
        for part in sorted(self.share.glob(f"*-{COSTS}")):
            costs.update(pickle.loads(part.read_bytes()))
        if costs:
            terminalreporter.write_line("real Pulsar testbed cost (s): "
                                        + ", ".join(f"{k}={v:.0f}" for k, v in costs.items()))
        shutil.rmtree(self.share, ignore_errors=True)
