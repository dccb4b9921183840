"""The real-cluster tests' testbed: one real Apache Pulsar per test session (harness.testbed).

Pulsar's standalone from the distribution jvm/pom.xml fetches (ZooKeeper metadata store, one bookie,
moto S3 for offload, token auth), a workload through the real `pulsar-client`, and orphans made the
way Pulsar leaves them, with a ground-truth manifest. `SWEEPER_SKIP_REAL_PULSAR=1` skips these tests.

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
import time
from datetime import UTC, datetime

import pytest
from pyspark.sql import SparkSession

from harness.testbed.orphans import ledger_znode, ml_path
from harness.testbed.server import bookkeeper_ledgers
from harness.testbed.workload import DELAYED, DELAYED_SUBSCRIPTION, admin_for
from harness.testbed.world import World, broker_references, zk_for
from sweeper.pipeline import delete_stage, emit_stage, reconcile_stage
from sweeper.snapshot import run_snapshot
from sweeper.tables import open_table_store
from tests.support import testbed_session
from tests.support.real_pulsar import COST, AsBuilt, Reconciled, Swept, real_ledgers, sweeper_config


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` deselected: a run that keeps none starts no testbed
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Real-Pulsar tests run last, and their testbed starts now, in the background."""
    # Stable: the order within each group is kept. Among the testbed's tests, test_fidelity.py and test_sweep.py
    # come first, then test_shared_bookkeeper.py, then test_retention.py: the order the suite is timed in. Nothing
    # relies on it: what must happen first is requested through the fixtures below.
    # The Oxia testbed's tests come after the ZooKeeper testbed's: under xdist each testbed's tests are one unit of
    # work, handed out last (both testbeds are prepared meanwhile), the longer first.
    items.sort(key=lambda i: (bool(testbed_session.testbeds_needed(i)), "test_oxia_testbed.py" in i.nodeid,
                              "test_retention.py" in i.nodeid, "test_shared_bookkeeper.py" in i.nodeid))
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
    """The orphan sweep's snapshot and plan, with the broker's view and BookKeeper's taken just before it.

    Taken on the world as the workload left it: retention's topics (whose first schema registrations make Pulsar
    4.0.8 leak schema ledgers) and the peer cluster's ledgers would be orphans its manifest does not know, so
    their fixtures request this one first. The first test to ask also pays for the testbed and the snapshot."""
    info = testbed_world.info
    cfg = sweeper_config(info, tmp_path_factory.mktemp("tables"))
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    bk = bookkeeper_ledgers(info)  # first: a ledger the broker creates after this is in neither view
    zk = zk_for(info)
    try:
        referenced = broker_references(admin_for(info), zk)
        # A ledger the broker deleted in between (an old compacted or cursor ledger) is in neither either.
        bk = {ledger for ledger in bk if zk.exists(ledger_znode(ledger))}
    finally:
        zk.stop()
    started = time.monotonic()
    snap = run_snapshot(spark, cfg, store)
    COST["snapshot_s"] = time.monotonic() - started
    started = time.monotonic()
    reconcile_stage(spark, cfg, store, snap.run_id)
    COST["reconcile_s"] = time.monotonic() - started
    rows = [r.asDict() for r in store.read("orphans").where(f"run_id = '{snap.run_id}'").collect()]
    return Reconciled(testbed_world, cfg, store, snap.run_id, rows, referenced, bk)


@pytest.fixture(scope="session")
def swept(reconciled: Reconciled, as_built: AsBuilt, spark: SparkSession) -> Swept:
    """Emit the plan to the real broker's partitioned __ledger_deletion topic, then drain it and delete.

    Before anything else drains that topic or deletes (the peer cluster's sweep requests this first), and after
    `as_built` was read."""
    cfg, store, run_id = reconciled.cfg, reconciled.store, reconciled.run_id
    started = time.monotonic()
    emitted = emit_stage(spark, cfg, store, run_id)
    COST["emit_s"] = time.monotonic() - started
    offloaded = {key.rsplit("-ledger-", 1)[1].removesuffix("-index") for key in reconciled.candidates("offload_object")}
    # One record per ledger, one per offloaded ledger (its data and index objects together).
    assert emitted.counts.get("published", 0) == len(reconciled.candidates("ledger")) + len(offloaded), emitted.counts
    admin = admin_for(reconciled.world.info)
    assert admin.partitions(cfg.system_topic.topic) == cfg.system_topic.partitions
    started = time.monotonic()
    result = delete_stage(spark, cfg, store, f"topic-{datetime.now(UTC):%Y%m%dT%H%M%SZ}", execute=True,
                          from_topic=True)
    COST["delete_s"] = time.monotonic() - started
    deleted = {r.ledger_id for r in result.results if r.outcome == "deleted" and r.ledger_type == "LEDGER"}
    return Swept(reconciled, deleted, list(result.results))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if COST and os.environ.get(testbed_session.SHARE_ENV) is None:  # under xdist, the controller reports
        terminalreporter.write_line("real Pulsar testbed cost (s): "
                                    + ", ".join(f"{k}={v:.0f}" for k, v in COST.items()))
