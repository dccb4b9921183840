"""A real Apache Pulsar on loopback: the testbed for the real-cluster tests (never production).

`sweeper testbed up` starts Pulsar 4.0.8 from the distribution `jvm/pom.xml` fetches: three real
bookies, each a process of its own with its HTTP server (harness.testbed.storage), and Pulsar's
standalone broker striping every ledger over them, with ZooKeeper as the metadata store (so the
sweeper reads what a production ZooKeeper holds) or, with `--metadata oxia`, a real Oxia server,
plus moto's S3 server for tiered storage. The config is written here: small rollover limits,
compaction, the bucket delayed-delivery tracker (PIP-195), transactions, offload through the
jclouds `S3` driver and token authentication. harness.testbed.bookie is the tests' view of the
bookies: their disks, HTTP servers and processes (stop, kill, start by pid).
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
