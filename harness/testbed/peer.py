"""A second Pulsar cluster on the testbed's bookies: its own metadata in a chroot of the same ZooKeeper.

This is how upstream shares one BookKeeper between clusters: `pulsar initialize-cluster-metadata
--existing-bk-metadata-service-uri` (PulsarClusterMetadataSetup) registers a new cluster whose brokers
keep their managed ledgers, cursors and schemas in their own metadata store while creating ledgers through
`bookkeeperMetadataServiceUri`, the first cluster's `/ledgers`. Every ledger the peer writes is then in the
bookie's ledger list, and nothing in the testbed cluster's metadata refers to it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import requests
from kazoo.client import KazooClient

from harness.lifecycle import stop_process
from harness.testbed.processes import LEAN_JVM_ENV, TestbedError, check_starting, spawn_logged, write_conf
from harness.testbed.server import TestbedInfo
from harness.testbed.storage import ACK_QUORUM, ENSEMBLE_SIZE, WRITE_QUORUM
from harness.zkserver import free_port_block

PEER_CLUSTER = "peer"
PEER_CHROOT = "/peer-cluster"


@dataclass(frozen=True)
class PeerInfo:
    home: str
    cluster: str
    zookeeper: str  # the testbed's ensemble
    broker_port: int
    web_port: int
    pid: int

    @property
    def metadata(self) -> str:
        """The peer's metadata store as `[safety] peer_metadata` names it."""
        return f"{self.zookeeper}{PEER_CHROOT}"

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def log_file(self) -> Path:
        return Path(self.home) / "logs" / "peer-broker.log"


def peer_settings(info: TestbedInfo, broker_port: int, web_port: int) -> dict[str, str]:
    """broker.conf overrides: the peer's own metadata, the testbed's bookies, no auth, small ledgers."""
    store = f"zk:{info.zookeeper}{PEER_CHROOT}"
    return {
        "clusterName": PEER_CLUSTER,
        "metadataStoreUrl": store,
        "configurationMetadataStoreUrl": store,
        "bookkeeperMetadataServiceUri": f"zk+hierarchical://{info.zookeeper}/ledgers",
        "bindAddress": "127.0.0.1",
        "advertisedAddress": "127.0.0.1",
        "brokerServicePort": str(broker_port),
        "webServicePort": str(web_port),
        "webSocketServiceEnabled": "false",
        "functionsWorkerEnabled": "false",
        "brokerDeleteInactiveTopicsEnabled": "false",
        "defaultRetentionTimeInMinutes": "-1",
        "defaultRetentionSizeInMB": "-1",
        # Striped over the testbed's three bookies as its own cluster's ledgers are (server.broker_settings).
        "managedLedgerDefaultEnsembleSize": str(ENSEMBLE_SIZE),
        "managedLedgerDefaultWriteQuorum": str(WRITE_QUORUM),
        "managedLedgerDefaultAckQuorum": str(ACK_QUORUM),
        "managedLedgerMinLedgerRolloverTimeMinutes": "0",
        "managedLedgerMaxEntriesPerLedger": "10",
        "managedLedgerCursorMaxEntriesPerLedger": "5",
        "managedLedgerCursorPositionFlushSeconds": "1",
        "managedLedgerDefaultMarkDeleteRateLimit": "0",
        "numIOThreads": "2",
        "numHttpServerThreads": "4",
        "numOrderedExecutorThreads": "2",
        "managedLedgerNumSchedulerThreads": "2",
        "bookkeeperNumberOfChannelsPerBookie": "1",
    }


def _ready(peer: PeerInfo) -> bool:
    try:
        return requests.get(f"{peer.admin_url}/admin/v2/clusters", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def peer_up(info: TestbedInfo, heap: str = "-Xms256m -Xmx512m -XX:MaxDirectMemorySize=256m",
            timeout: float = 240.0) -> PeerInfo:
    """Initialise the peer's metadata and start its broker (one JVM); stop it with `peer_down`."""
    pulsar = Path(info.pulsar_home)
    home = Path(info.home) / "peer"
    for sub in ("conf", "logs"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    zk = KazooClient(hosts=info.zookeeper, timeout=15.0)
    zk.start(timeout=30)
    try:
        zk.ensure_path(PEER_CHROOT)  # a ZooKeeper chroot must exist before a client can use it
    finally:
        zk.stop()
    base = free_port_block(2)
    peer = PeerInfo(home=str(home), cluster=PEER_CLUSTER, zookeeper=info.zookeeper, broker_port=base,
                    web_port=base + 1, pid=0)
    store = f"zk:{info.zookeeper}{PEER_CHROOT}"
    env = {"PULSAR_LOG_DIR": str(home / "logs"), **LEAN_JVM_ENV, "PULSAR_MEM": heap}
    setup = subprocess.run(
        [str(pulsar / "bin" / "pulsar"), "initialize-cluster-metadata", "--cluster", PEER_CLUSTER,
         "--metadata-store", store, "--configuration-metadata-store", store,
         "--existing-bk-metadata-service-uri", f"zk+hierarchical://{info.zookeeper}/ledgers",
         "--web-service-url", peer.admin_url, "--broker-service-url", peer.service_url],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout, cwd=home)
    if setup.returncode != 0:
        raise TestbedError(f"initialize-cluster-metadata for the peer failed: {setup.stdout[-3000:]}"
                           f"{setup.stderr[-3000:]}")
    conf = home / "conf" / "broker.conf"
    write_conf(pulsar / "conf" / "broker.conf", conf, peer_settings(info, peer.broker_port, peer.web_port))
    broker = spawn_logged([str(pulsar / "bin" / "pulsar"), "broker"],
                    {**os.environ, **env, "PULSAR_BROKER_CONF": str(conf)}, peer.log_file, home)
    peer = PeerInfo(**{**asdict(peer), "pid": broker.pid})
    (home / "peer.json").write_text(json.dumps(asdict(peer), indent=2))
    deadline = time.monotonic() + timeout
    try:
        while not _ready(peer):
            check_starting(broker, peer.log_file, deadline, timeout, "the peer cluster's broker")
            time.sleep(1.0)
    except BaseException:
        peer_down(peer)
        raise
    return peer


def peer_down(peer: PeerInfo, timeout: float = 30.0) -> None:
    if peer.pid:
        stop_process(peer.pid, timeout)
