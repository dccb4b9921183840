"""Shared fixtures: one real ZooKeeper server per test session, one chroot per test.

Each test gets its own chroot (`/t-<n>`) on the shared server, so tests stay isolated without
paying a server start each.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.zkserver import FAKETIME_LIB, ServerClock, ZooKeeperServerInfo, start_zookeeper, stop_zookeeper
from sweeper.config import PulsarMetadataConfig, SafetyConfig, ScanConfig, SweeperConfig
from sweeper.zk import client as zkutil

REPO = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = REPO.parent / "shared" / "fixtures"

_chroots = itertools.count(1)

# Defaults plus the sandbox's cluster name ([pulsar] cluster_name is required while offload is on).
# One cluster on its own bookies, as the sandbox declares it; the shared-BookKeeper tests say otherwise.
# A Spark JVM a test starts lives a minute or two and spends much of its CPU in C2 compiles on two cores; C1 alone
# serves a test's few hundred rows (measured 11% faster on test_spark_submit). Not for the session's own JVM.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1"
# For a CLI process a test starts: pyspark passes these to the spark-submit that launches its JVM.
SHORT_LIVED_SPARK_ENV = {"PYSPARK_SUBMIT_ARGS": f"--driver-java-options={SHORT_LIVED_JVM} pyspark-shell"}

# Two scan sessions: one wave of tasks on local[2], still more than one session to merge (the default, 8, is four
# waves of Python tasks for the few hundred znodes a test seeds).
BASE_CONFIG = SweeperConfig(pulsar=PulsarMetadataConfig(cluster_name="sandbox"),
                            safety=SafetyConfig(bookkeeper_dedicated=True), scan=ScanConfig(max_sessions=2))


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServerInfo]:
    info = start_zookeeper(tmp_path_factory.mktemp("zookeeper"))
    yield info
    stop_zookeeper(info)


@dataclass(frozen=True)
class ZkTarget:
    server: ZooKeeperServerInfo
    chroot: str

    @property
    def hosts(self) -> str:
        """Connect string including the chroot, as an operator would give it."""
        return f"{self.server.connect_string}{self.chroot}"


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


# ---- a secured ZooKeeper (TLS, SASL DIGEST-MD5, ACLs): one per session, chroots per test --------


@pytest.fixture(scope="session")
def secure_zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.secure_zk import start_secure_zookeeper

    yield from start_secure_zookeeper(tmp_path_factory.mktemp("secure-zk"))
