"""The real-cluster tests' testbed: one real Apache Pulsar per test session (harness.testbed).

Pulsar 4.0.8 from the distribution jvm/pom.xml fetches (its ZooKeeper, three bookies each in its own process,
the standalone broker, moto S3 for offload, token auth), a workload through the real `pulsar-client`, and orphans
made the way Pulsar leaves them, with a ground-truth manifest. `SWEEPER_SKIP_REAL_PULSAR=1` skips these tests.

Grace period: the orphans are minutes old, so the sweeper runs with a forced short grace period
(`[safety] min_age_hours = GRACE_S / 3600, force_min_age = true`) on the real clock, not a "later"
clock: the broker, ZooKeeper and the sweeper then agree on what time it is.

The tests share one testbed, and some change it (a sweep deletes, retention trims, a peer cluster writes to the
bookie, a consumer takes the delayed messages). What must happen before such a change is a session fixture here,
which the fixture or test making the change requests: `reconciled` (the orphan sweep's plan), `swept` (its
deletes) and `as_built` (the broker's metadata as the workload left it). No test relies on another having run.
"""

from __future__ import annotations

import os

import pytest
from pyspark.sql import SparkSession

from harness.testbed.orphans import ml_path
from harness.testbed.workload import DELAYED, DELAYED_SUBSCRIPTION
from harness.testbed.world import World, zk_for
from tests.support import testbed_session
from tests.support.real_pulsar import (
    COST,
    AsBuilt,
    Reconciled,
    Swept,
    real_ledgers,
    reconcile_the_world,
    sweep_the_plan,
)

RESTARTING = ("test_bookies.py", "test_reclaim_windows.py", "test_emit_broker_restart.py")


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` deselected: a run that keeps none starts no testbed
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Real-Pulsar tests run last, and their testbed starts now, in the background."""
    # Stable: the order within each group is kept. Among the testbed's tests, test_fidelity.py and test_sweep.py
    # come first, then test_shared_bookkeeper.py, then test_retention.py: the order the suite is timed in. Nothing
    # relies on it: what must happen first is requested through the fixtures below. The tests that restart a
    # bookie or the broker come last (test_bookies.py, test_reclaim_windows.py, test_emit_broker_restart.py): a
    # restart makes the broker close the ledgers it was writing and Pulsar leak schema ledgers, which no other test
    # needs to see.
    # The Oxia testbed's tests come after the ZooKeeper testbed's: under xdist each testbed's tests are one unit of
    # work, handed out last (both testbeds are prepared meanwhile), the longer first.
    items.sort(key=lambda i: (bool(testbed_session.testbeds_needed(i)), "test_oxia_testbed.py" in i.nodeid,
                              any(m in i.nodeid for m in RESTARTING), "test_retention.py" in i.nodeid,
                              "test_shared_bookkeeper.py" in i.nodeid))
    if config.option.collectonly:
        return
    for flavour in set().union(*(testbed_session.testbeds_needed(i) for i in items)):
        if testbed_session.unavailable(flavour) is None:
            testbed_session.request_testbed(flavour)


def pytest_sessionfinish(session: pytest.Session) -> None:
    testbed_session.stop_local()


@pytest.fixture(scope="session")
def testbed_world() -> World:
    unavailable = testbed_session.unavailable()
    if unavailable == "SWEEPER_SKIP_REAL_PULSAR=1":
        pytest.skip(unavailable)
    if unavailable:
        pytest.fail(unavailable)
    return testbed_session.world()


@pytest.fixture(scope="session")
def as_built(testbed_world: World) -> AsBuilt:
    """The broker's metadata as the workload left it, for test_fidelity.py. Requested by every fixture that
    changes the testbed (`swept`, retention's `repaired`), so it is read before any of them: the delayed-message
    test's consumer, after `swept`, makes the broker deliver its bucket snapshots and delete them."""
    zk = zk_for(testbed_world.info)
    try:
        return AsBuilt(real_ledgers(zk), zk.get(f"{ml_path(DELAYED)}/{DELAYED_SUBSCRIPTION}")[0])
    finally:
        zk.stop()


@pytest.fixture(scope="session")
def reconciled(testbed_world: World, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Reconciled:
    """The orphan sweep's snapshot and plan, between two views of the broker (`reconcile_the_world`).

    Taken on the world as the workload left it: retention's topics (whose first schema registrations make Pulsar
    4.0.8 leak schema ledgers) and the peer cluster's ledgers would be orphans its manifest does not know, so
    their fixtures request this one first. The first test to ask also pays for the snapshot."""
    return reconcile_the_world(testbed_world, spark, tmp_path_factory.mktemp("tables"))


@pytest.fixture(scope="session")
def swept(reconciled: Reconciled, as_built: AsBuilt, spark: SparkSession) -> Swept:
    """The plan emitted to the real broker's partitioned __ledger_deletion topic, drained and deleted.

    Before anything else drains that topic or deletes (the peer cluster's sweep requests this first), and after
    `as_built` was read."""
    return sweep_the_plan(reconciled, spark)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if COST and os.environ.get(testbed_session.SHARE_ENV) is None:  # under xdist, the controller reports
        terminalreporter.write_line("real Pulsar testbed cost (s): "
                                    + ", ".join(f"{k}={v:.0f}" for k, v in COST.items()))
