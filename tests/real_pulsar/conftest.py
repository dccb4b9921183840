"""The real-cluster tests' testbed: one real Apache Pulsar per test session (harness.testbed).

Pulsar's standalone from the distribution jvm/pom.xml fetches (ZooKeeper metadata store, one bookie,
moto S3 for offload, token auth), a workload through the real `pulsar-client`, and orphans made the
way Pulsar leaves them, with a ground-truth manifest. `SWEEPER_SKIP_REAL_PULSAR=1` skips these tests.

Grace period: the orphans are minutes old, so the sweeper runs with a forced short grace period
(`[safety] min_age_hours = GRACE_S / 3600, force_min_age = true`) on the real clock, not a "later"
clock: the broker, ZooKeeper and the sweeper then agree on what time it is.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from harness.testbed import server as testbed_server
from harness.testbed.server import default_pulsar_home
from harness.testbed.world import World, build_world

GRACE_S = 45.0
COST: dict[str, float] = {}  # seconds per step, printed at the end of the session


class _Testbed:
    """The session's testbed, started in a thread when collection finds real-Pulsar tests.

    Starting the broker, driving the workload, making the orphans and waiting out the grace period take
    about five minutes, nearly all of it waiting on the JVM and the clock; doing it while the rest of the
    suite runs (the real-Pulsar tests are ordered last) keeps the suite inside its time budget.
    """

    def __init__(self) -> None:
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
        try:
            started = time.monotonic()
            self.info = testbed_server.testbed_up(self.home)
            COST["testbed_up_s"] = time.monotonic() - started
            world = build_world(self.info)
            COST["world_s"] = world.built_s
            # Orphans must be past the grace period before the sweeper looks.
            newest = max(o.made_at_ms for o in world.manifest.orphans) / 1000
            time.sleep(max(0.0, newest + GRACE_S + 2 - time.time()))
            self.world = world
        except BaseException as exc:  # reported by the fixture, in the tests that need the testbed
            self.error = exc

    def wait(self) -> World:
        self.start()
        assert self.thread is not None
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"the real Pulsar testbed did not come up: {self.error}") from self.error
        assert self.world is not None
        return self.world

    def stop(self) -> None:
        if self.thread is None or self.home is None:
            return
        self.thread.join(timeout=600)
        started = time.monotonic()
        testbed_server.testbed_down(self.home, self.world.info if self.world else self.info)
        COST["testbed_down_s"] = time.monotonic() - started
        shutil.rmtree(self.home, ignore_errors=True)


_TESTBED = _Testbed()


def _testbed_unavailable() -> str | None:
    if os.environ.get("SWEEPER_SKIP_REAL_PULSAR") == "1":
        return "SWEEPER_SKIP_REAL_PULSAR=1"
    if not (default_pulsar_home() / "bin" / "pulsar").exists():
        return (f"no Pulsar distribution at {default_pulsar_home()}: run `mvn -B -f jvm/pom.xml package` "
                "(scripts/setup.sh does)")
    return None


def _needs_testbed(item: pytest.Item) -> bool:
    return "testbed_world" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Real-Pulsar tests run last, and their testbed starts now, in the background."""
    # Stable: the order within each group is kept. Retention's topics go after the orphan sweep: Pulsar 4.0.8
    # leaks schema ledgers on their first registrations, orphans the sweep's manifest does not know.
    # The peer cluster's tests go last of all: its ledgers on the shared bookie would be orphans to the others.
    items.sort(key=lambda i: (_needs_testbed(i), "test_retention.py" in i.nodeid,
                              "test_shared_bookkeeper.py" in i.nodeid))
    if (not config.option.collectonly and any(_needs_testbed(i) for i in items)
            and _testbed_unavailable() is None):
        _TESTBED.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _TESTBED.stop()


@pytest.fixture(scope="session")
def testbed_world() -> World:
    unavailable = _testbed_unavailable()
    if unavailable == "SWEEPER_SKIP_REAL_PULSAR=1":
        pytest.skip(unavailable)
    if unavailable:
        pytest.fail(unavailable)
    return _TESTBED.wait()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if COST:
        terminalreporter.write_line("real Pulsar testbed cost (s): "
                                    + ", ".join(f"{k}={v:.0f}" for k, v in COST.items()))
