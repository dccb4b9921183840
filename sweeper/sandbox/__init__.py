"""The embedded sandbox: a local ZooKeeper seeded with a synthetic Pulsar cluster.

For local runs, demos, tests and benchmarks only; production points at real clusters.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from sweeper import zk as zkutil
from sweeper.sandbox.model import SandboxCluster, SandboxSpec, build_cluster
from sweeper.sandbox.seed import SeedResult, seed_zookeeper, write_manifest
from sweeper.zkserver import ZooKeeperServerInfo, running_server, start_zookeeper, stop_zookeeper

DEFAULT_HOME = Path("var/sandbox")
DEFAULT_PORT = 21810

__all__ = [
    "SandboxCluster",
    "SandboxSpec",
    "SeededSandbox",
    "build_cluster",
    "sandbox_down",
    "sandbox_up",
    "seed_sandbox",
]


class SandboxError(RuntimeError):
    pass


@dataclass(frozen=True)
class SeededSandbox:
    cluster: SandboxCluster
    seed: SeedResult
    manifest_path: Path


def sandbox_up(home: str | Path = DEFAULT_HOME, port: int = DEFAULT_PORT) -> ZooKeeperServerInfo:
    """Start the sandbox ZooKeeper (idempotent: an already running one is returned)."""
    zk_home = Path(home) / "zookeeper"
    existing = running_server(zk_home)
    if existing is not None:
        return existing
    return start_zookeeper(zk_home, port=port)


def sandbox_down(home: str | Path = DEFAULT_HOME, wipe: bool = False) -> bool:
    zk_home = Path(home) / "zookeeper"
    existing = running_server(zk_home)
    if existing is not None:
        stop_zookeeper(existing)
    if wipe and Path(home).exists():
        shutil.rmtree(home)
    return existing is not None


def seed_sandbox(hosts: str, spec: SandboxSpec, manifest_path: str | Path) -> SeededSandbox:
    """Seed `spec` into the ZooKeeper at `hosts`; refuses to seed over existing metadata."""
    cluster = build_cluster(spec)
    client = zkutil.connect(hosts)
    try:
        for root in (spec.ledgers_root, spec.managed_ledgers_root, spec.schemas_root):
            if client.exists(root) is not None:
                raise SandboxError(
                    f"{root} already exists in {hosts}: the sandbox is already seeded "
                    "(`sweeper sandbox down --wipe` then `up` to start over)"
                )
        result = seed_zookeeper(client, cluster)
    finally:
        zkutil.close(client)
    path = write_manifest(cluster, manifest_path)
    return SeededSandbox(cluster, result, path)
