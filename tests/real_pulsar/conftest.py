"""The real-cluster tests' testbed: one real Apache Pulsar per test session (sweeper.testbed).

Pulsar's standalone from the distribution jvm/pom.xml fetches (ZooKeeper metadata store, one bookie,
moto S3 for offload, token auth), a workload through the real `pulsar-client`, and orphans made the
way Pulsar leaves them, with a ground-truth manifest. `SWEEPER_SKIP_REAL_PULSAR=1` skips these tests.

Grace period: the orphans are minutes old, so the sweeper runs with a forced short grace period
(`[safety] min_age_hours = GRACE_S / 3600, force_min_age = true`) on the real clock, not a "later"
clock: the broker, ZooKeeper and the sweeper then agree on what time it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from sweeper.testbed import server as testbed_server
from sweeper.testbed.server import default_pulsar_home
from sweeper.testbed.world import World, build_world

GRACE_S = 45.0
COST: dict[str, float] = {}  # seconds per step, printed at the end of the session


@pytest.fixture(scope="session")
def testbed_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if os.environ.get("SWEEPER_SKIP_REAL_PULSAR") == "1":
        pytest.skip("SWEEPER_SKIP_REAL_PULSAR=1")
    if not (default_pulsar_home() / "bin" / "pulsar").exists():
        pytest.fail(f"no Pulsar distribution at {default_pulsar_home()}: run `mvn -B -f jvm/pom.xml package` "
                    "(scripts/setup.sh does)")
    home = tmp_path_factory.mktemp("testbed")
    started = time.monotonic()
    info = testbed_server.testbed_up(home)
    COST["testbed_up_s"] = time.monotonic() - started
    try:
        world = build_world(info)
        COST["world_s"] = world.built_s
        # Orphans must be past the grace period before the sweeper looks.
        newest = max(o.made_at_ms for o in world.manifest.orphans) / 1000
        time.sleep(max(0.0, newest + GRACE_S + 2 - time.time()))
        yield world
    finally:
        started = time.monotonic()
        testbed_server.testbed_down(home, world.info if "world" in locals() else info)
        COST["testbed_down_s"] = time.monotonic() - started


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if COST:
        terminalreporter.write_line("real Pulsar testbed cost (s): "
                                    + ", ".join(f"{k}={v:.0f}" for k, v in COST.items()))
