"""A real Apache Pulsar on loopback: the testbed for the real-cluster tests (never production).

`sweeper testbed up` starts Pulsar's own standalone (broker + one real bookie) from the
distribution `jvm/pom.xml` fetches, with ZooKeeper as the metadata store (so the sweeper reads
what a production ZooKeeper holds) or, with `--metadata oxia`, a real Oxia server, plus moto's S3
server for tiered storage. The config is
written here: small rollover limits, compaction, the bucket delayed-delivery tracker (PIP-195),
transactions, offload through the jclouds `aws-s3` driver and token authentication.
"""

from __future__ import annotations

from harness.testbed.server import (
    DEFAULT_HOME,
    TestbedError,
    TestbedInfo,
    running_testbed,
    testbed_down,
    testbed_up,
)

__all__ = ["DEFAULT_HOME", "TestbedError", "TestbedInfo", "running_testbed", "testbed_down", "testbed_up"]
