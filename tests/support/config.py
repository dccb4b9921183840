"""The tests' shared configuration: the base sweeper config, the JVM options of short-lived Spark processes, and
where a test's ZooKeeper chroot is."""

from __future__ import annotations

from dataclasses import dataclass

from harness.zkserver import ZooKeeperServerInfo
from sweeper.config import PulsarMetadataConfig, SafetyConfig, ScanConfig, SweeperConfig

# A Spark JVM a test starts lives a minute or two and spends much of its CPU in C2 compiles on two cores; C1 alone
# serves a test's few hundred rows (measured 11% faster on test_spark_submit). Not for the session's own JVM.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1"
# For a CLI process a test starts: pyspark passes these to the spark-submit that launches its JVM.
SHORT_LIVED_SPARK_ENV = {"PYSPARK_SUBMIT_ARGS": f"--driver-java-options={SHORT_LIVED_JVM} pyspark-shell"}

# Defaults plus the sandbox's cluster name ([pulsar] cluster_name is required while offload is on).
# One cluster on its own bookies, as the sandbox declares it; the shared-BookKeeper tests say otherwise.
# Two scan sessions: one wave of tasks on local[2], still more than one session to merge (the default, 8, is four
# waves of Python tasks for the few hundred znodes a test seeds).
BASE_CONFIG = SweeperConfig(pulsar=PulsarMetadataConfig(cluster_name="sandbox"),
                            safety=SafetyConfig(bookkeeper_dedicated=True), scan=ScanConfig(max_sessions=2))


@dataclass(frozen=True)
class ZkTarget:
    server: ZooKeeperServerInfo
    chroot: str

    @property
    def hosts(self) -> str:
        """Connect string including the chroot, as an operator would give it."""
        return f"{self.server.connect_string}{self.chroot}"
