"""Shared fixtures: one real ZooKeeper server per test session, one chroot per test; one Spark session; the
sandbox's Pulsar endpoint, moto's S3 and a secured ZooKeeper for the tests that ask; a seeded snapshot.

Each test gets its own chroot (`/t-<n>`) on the shared server, so tests stay isolated without
paying a server start each. Helpers that are not fixtures live in tests/support/, which also says how to run
the unit tests alone (`-m "not integration"`): `pytest_collection_modifyitems` below marks the others.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.zkserver import (
    FAKETIME_LIB,
    PORT_RANGE_ENV,
    ServerClock,
    ZooKeeperServerInfo,
    start_zookeeper,
    stop_zookeeper,
)
from sweeper.zk import client as zkutil
from tests.support.config import ZkTarget

# Imported inside the fixtures that use them, as `spark` and `secure_zk` do: conftest, which every unit test loads,
# stays clear of the stages, the Pulsar endpoint and moto.
if TYPE_CHECKING:
    from harness.s3server import S3ServerInfo
    from harness.sandbox.model import SandboxCluster, SandboxSpec
    from tests.support.broker import Broker
    from tests.support.seeded import SeededSnapshot, SeededSnapshotMaker

REPO = Path(__file__).resolve().parents[1]

# pytest-xdist's workers run with a `__main__` that has neither a spec nor a file, which pyspark's Spark Connect
# import (pulled in by great_expectations) takes for a doctest run and answers with sys.exit(0)
# (pyspark.sql.connect.utils.check_dependencies). Name the worker's main module so it does not.
_main_module = sys.modules["__main__"]
if getattr(_main_module, "__spec__", None) is None and not hasattr(_main_module, "__file__"):
    _main_module.__file__ = "<pytest worker>"
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"

_chroots = itertools.count(1)


def _take_a_port_range(worker: str | None, workers: int) -> None:
    """Each of `workers` xdist workers picks server ports from its own slice of the harness's range, the controller
    (which serves the real-Pulsar testbed) from the first slice; a serial session keeps the whole range."""
    if workers <= 0:
        return
    low, high = 20000, 32000
    index = int(worker.removeprefix("gw")) + 1 if worker else 0
    size = (high - low) // (workers + 1)
    os.environ[PORT_RANGE_ENV] = f"{low + index * size}-{low + (index + 1) * size}"


_take_a_port_range(os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")))

# A test that uses one of these, itself or through another fixture, talks to a server or a JVM: an integration
# test. The last three are module-local fixtures: the sandbox's Pulsar endpoint (test_pulsar_endpoint*.py,
# test_pulsar_security.py), a Spark standalone cluster (test_cluster.py), an HTTP sink (test_metrics.py).
SERVER_FIXTURES = frozenset({"zk_server", "secure_zk", "spark", "s3_server", "broker", "testbed_world",
                             "endpoint", "spark_cluster", "pushgateway", "oxia_server", "zk_ensemble",
                             "azurite_server", "gcs_server"})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `integration` every test that starts or reaches a server, a JVM or another process: through a fixture
    above, by being `slow` (the end-to-end cases), or against the real Pulsar testbed. The tests that start one
    in their own body say so with `@pytest.mark.integration` themselves."""
    for item in items:
        if (SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
                or item.get_closest_marker("slow") or item.get_closest_marker("real_pulsar")):
            item.add_marker(pytest.mark.integration)
    if "PYTEST_XDIST_WORKER" in os.environ:
        # Workers take tests in collection order as they free up: the longest first, the unit tests last as the
        # filler that evens out the workers' ends (tests/real_pulsar/conftest.py then puts its group last).
        items.sort(key=lambda i: (not i.get_closest_marker("slow"), not i.get_closest_marker("integration")))


def ensemble_module_of_test(nodeid: str) -> str | None:
    """The module of a test on a ZooKeeper ensemble (tests/ensemble/), whose tests share one worker under xdist."""
    return nodeid.split("::", 1)[0] if nodeid.startswith("tests/ensemble/") else None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each test is its own unit of work but for the real-Pulsar tests: those of one testbed run in one worker, in
    order (tests/support/testbed_session.py); and the tests of one module of tests/ensemble/, which share that
    module's three-node ZooKeeper ensemble (started once a module). Not through `xdist_group` marks: xdist 3.8 writes
    the group into `item._nodeid`, which pytest 9.2 no longer reads (node ids live in `item._id`), so the marks group
    nothing; the ensemble modules carry one naming their unit all the same, for a reader and for a pytest that
    reads it again."""
    from xdist.scheduler import LoadScopeScheduling

    from tests.support.testbed_session import testbed_of_test

    # Units in collection order (tests/real_pulsar/conftest.py puts the testbeds' last, when they are ready), not
    # the largest first, which xdist does by default and which would hand out the testbeds' groups at the start.
    config.option.loadscopereorder = False

    class OneWorkerPerTestbed(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return testbed_of_test(nodeid) or ensemble_module_of_test(nodeid) or nodeid

    return OneWorkerPerTestbed(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """An xdist controller (`-n N`, not a worker) serves the one real-Pulsar testbed its workers share."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        from tests.support.testbed_session import ControllerPlugin

        _take_a_port_range(None, int(config.option.numprocesses))
        config.pluginmanager.register(ControllerPlugin(), "real-pulsar-testbed-controller")


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServerInfo]:
    info = start_zookeeper(tmp_path_factory.mktemp("zookeeper"))
    yield info
    stop_zookeeper(info)


@pytest.fixture
def zk_target(zk_server: ZooKeeperServerInfo) -> Iterator[ZkTarget]:
    chroot = f"/t-{next(_chroots)}"
    admin = zkutil.connect(zk_server.connect_string)
    admin.ensure_path(chroot)
    zkutil.close(admin)
    yield ZkTarget(zk_server, chroot)


@pytest.fixture
def zk_clock(zk_server: ZooKeeperServerInfo) -> ServerClock:
    """The test server's wall clock: `with zk_clock.at(ms):` makes znodes created inside look that old."""
    if zk_server.clock is None:
        pytest.fail(f"the test ZooKeeper runs without a ServerClock: install libfaketime ({FAKETIME_LIB})")
    return zk_server.clock


@pytest.fixture
def zk(zk_target: ZkTarget) -> Iterator[KazooClient]:
    client = zkutil.connect(zk_target.hosts)
    yield client
    zkutil.close(client)


@pytest.fixture
def live_broker(zk: KazooClient) -> str:
    """A broker registered as Pulsar's do (an ephemeral znode under /loadbalance/brokers), for the liveness gate."""
    path = "/loadbalance/brokers/127.0.0.1:8080"
    zk.create(path, b'{"pulsarServiceUrl": "pulsar://127.0.0.1:6650"}', ephemeral=True, makepath=True)
    return path


@pytest.fixture
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"shared fixtures not found at {SHARED_FIXTURES} (a clone without ../shared)")
    return SHARED_FIXTURES


# ---- spark: one local SparkSession for the whole test session (sweeper.spark) ----------------
# Session-scoped because starting the JVM costs seconds; tests isolate through tmp_path tables.


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from sweeper.spark import get_spark

    session = get_spark(
        "ledger-sweeper-tests",
        master="local[2]",
        # Two partitions, one wave on local[2]: still more than one task per stage, for half the task overhead.
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.driver.memory": "2g"},
    )
    yield session
    session.stop()


# ---- end spark -------------------------------------------------------------------------------


@pytest.fixture
def seeded_snapshot(zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> SeededSnapshotMaker:
    """`seeded_snapshot(spec_or_cluster, reseed=True, **config_sections)`: the sandbox seeded into this test's
    chroot and snapshotted into tmp_path/tables (tests/support/seeded.py); (cluster, cfg, store, run_id)."""
    from tests.support.seeded import seed_and_snapshot

    def make(sandbox: SandboxSpec | SandboxCluster, *, reseed: bool = True,
             **sections: dict[str, Any]) -> SeededSnapshot:
        return seed_and_snapshot(zk, zk_target.hosts, spark, tmp_path / "tables", sandbox, reseed=reseed,
                                 **sections)

    return make


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """The sandbox's Pulsar endpoint and admin API on this test's data directory (tests/support/broker.py)."""
    from tests.support.broker import Broker

    b = Broker(tmp_path / "pulsar").start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3ServerInfo]:
    """moto's S3 server: one per test module that asks for it (each module makes its own buckets)."""
    from harness.s3server import start_s3, stop_s3

    info = start_s3(tmp_path_factory.mktemp("moto"))
    yield info
    stop_s3(info)


@pytest.fixture(scope="module")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Azurite's blob service (Azure Blob's API): one per test module that asks for it. Skips, naming what is
    missing, where scripts/setup.sh has not installed it."""
    from harness.objectservers import azurite_binary, missing_reason, start_azurite, stop_server

    if azurite_binary() is None:
        pytest.skip(missing_reason("azurite"))
    info = start_azurite(tmp_path_factory.mktemp("azurite"))
    yield info
    stop_server(info)


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """fake-gcs-server (the GCS JSON API): one per test module that asks for it; skips as `azurite_server` does."""
    from harness.objectservers import fake_gcs_binary, missing_reason, start_fake_gcs, stop_server

    if fake_gcs_binary() is None:
        pytest.skip(missing_reason("fake-gcs-server"))
    info = start_fake_gcs(tmp_path_factory.mktemp("fake-gcs"))
    yield info
    stop_server(info)


# ---- a secured ZooKeeper (TLS, SASL DIGEST-MD5, ACLs): one per session, chroots per test --------


@pytest.fixture
def oxia_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh single-node Oxia store for one test (it starts in well under a second); `@pytest.mark.parametrize`
    with `indirect=True` asks for N shards. Skips, naming what is missing, where there is no server binary."""
    from harness.oxiaserver import missing_binary_reason, oxia_binary, start_oxia, stop_oxia

    if oxia_binary() is None:
        pytest.skip(missing_binary_reason())
    info = start_oxia(tmp_path / "oxia", shards=getattr(request, "param", 1))
    yield info
    stop_oxia(info)


@pytest.fixture(scope="session")
def secure_zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.support.secure_zk import start_secure_zookeeper

    yield from start_secure_zookeeper(tmp_path_factory.mktemp("secure-zk"))

