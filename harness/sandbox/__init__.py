"""The embedded sandbox: a local ZooKeeper seeded with a synthetic Pulsar cluster.

For local runs, demos, tests and benchmarks only; production points at real clusters.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.lifecycle import pid_alive, wait_ports_free
from harness.s3server import S3ServerInfo, start_s3, stop_s3
from harness.sandbox.model import SandboxCluster, SandboxSpec, build_cluster
from harness.sandbox.pulsar import running_pulsar, start_pulsar, stop_pulsar
from harness.sandbox.seed import SeedResult, seed_s3, seed_zookeeper, write_manifest
from harness.zkserver import ZooKeeperServerInfo, running_server, start_zookeeper, stop_zookeeper
from sweeper.config import SweeperConfig, to_toml
from sweeper.errors import Refused
from sweeper.objectstore.s3 import S3Target, s3_client
from sweeper.zk import client as zkutil

DEFAULT_HOME = Path("var/sandbox")
DEFAULT_PORT = 21810
PORT_SPAN = 4  # ZooKeeper on --port, S3 on +1, the Pulsar endpoint on +2 (binary) and +3 (admin REST)

__all__ = [
    "PORT_SPAN",
    "SandboxCluster",
    "SandboxDown",
    "SandboxSpec",
    "SeededSandbox",
    "build_cluster",
    "sandbox_down",
    "sandbox_up",
    "seed_sandbox",
    "write_sandbox_config",
]

CONFIG_FILE = "sweeper.toml"  # in the sandbox home: what every command finds (sweeper.config.find_config)


class SandboxError(Refused):
    """The sandbox cannot start as asked (a taken port, no running part): exit 3 with the fix named."""


@dataclass(frozen=True)
class SeededSandbox:
    cluster: SandboxCluster
    seed: SeedResult
    manifest_path: Path


def sandbox_up(home: str | Path = DEFAULT_HOME, port: int = DEFAULT_PORT,
               say: Callable[[str], None] = print) -> ZooKeeperServerInfo:
    """Start the sandbox ZooKeeper and S3 endpoint (idempotent: running ones are kept).

    S3 (moto's server) listens on `port + 1`; its state lives in memory, so `down` loses it.
    The Pulsar endpoint listens on `port + 2` (binary protocol) and `port + 3` (admin REST); its
    messages persist under `home/pulsar`.

    A seeded sandbox whose S3 endpoint stopped (`down`, a reboot, a kill) has lost its offloaded objects while
    ZooKeeper still describes them: never half a world, so it is wiped whole and the next seed makes it again
    from its seed (the same ground truth), and `say` tells the operator so in one line.
    """
    home = Path(home)
    # A part that ran here before and died may hold its port for a while after (connections the kernel is still
    # closing): then its port gets some time to come free, where a stranger's port is refused at once.
    ran_before = any((home / part / "server.json").exists() for part in ("zookeeper", "s3", "pulsar"))
    wait_s = 30.0 if ran_before else 0.0
    if s3_endpoint(home) is None and (home / "manifest.json").exists():
        sandbox_down(home, wipe=True)
        say("sandbox: its S3 endpoint had stopped and kept its objects in memory only, so the whole sandbox "
            "is seeded again from its seed")
    zk_home = Path(home) / "zookeeper"
    running = running_server(zk_home)
    base = running.port if running else port
    needs_s3, needs_pulsar = s3_endpoint(home) is None, running_pulsar(Path(home) / "pulsar") is None
    # Every port is checked before anything starts, so a taken one leaves nothing half up.
    if running is None:
        _require_free(base, "ZooKeeper", wait_s)
    if needs_s3:
        _require_free(base + 1, "S3", wait_s)
    if needs_pulsar:
        _require_free(base + 2, "Pulsar binary protocol", wait_s)
        _require_free(base + 3, "Pulsar admin REST", wait_s)
    info = running or start_zookeeper(zk_home, port=port)
    if needs_s3:
        s3 = start_s3(Path(home) / "s3", port=info.port + 1)
        (Path(home) / "s3" / "server.json").write_text(json.dumps({"endpoint": s3.endpoint, "pid": s3.pid}))
    if needs_pulsar:
        start_pulsar(Path(home) / "pulsar", info.port + 2, info.port + 3, register_zookeeper=info.connect_string)
    return info


def write_sandbox_config(home: str | Path, base: SweeperConfig) -> Path:
    """`base` pointed at the sandbox running in `home` (its ZooKeeper, S3 and Pulsar endpoint ports), written to
    `home/sweeper.toml`, so every command reaches a sandbox started with any `--port` without a hand-written
    config. Rewritten on every `up`: the ports are whatever runs now."""
    home = Path(home)
    zk = running_server(home / "zookeeper")
    if zk is None:
        raise SandboxError(f"no sandbox ZooKeeper runs in {home}: `sweeper sandbox up` first")
    sections: dict[str, dict[str, object]] = {
        "bookkeeper": {"zookeeper": zk.connect_string},
        "pulsar": {"zookeeper": "", "cluster_name": base.pulsar.cluster_name or "sandbox"},
        # The sandbox's bookies are names in ledger metadata, with no server to ask what it gave back: measuring
        # them would only report every one "not registered". The real testbed's bookies serve their HTTP API.
        "reclaim": {"enabled": False},
    }
    s3 = s3_endpoint(home)
    if s3:
        sections["offload"] = {"endpoint_override": s3}
    pulsar = running_pulsar(home / "pulsar")
    if pulsar is not None:
        sections["system_topic"] = {"service_url": pulsar.service_url, "admin_url": pulsar.admin_url}
    target = home / CONFIG_FILE
    target.write_text(to_toml(base.replace(**sections), header=(
        f"Written by `sweeper sandbox up` for the sandbox in {home} (ZooKeeper {zk.connect_string}); rewritten on\n"
        "every `up`. Commands find it after --config and $SWEEPER_CONFIG: edit the config it was made from instead.")))
    return target


def _require_free(port: int, what: str, wait_s: float = 0.0) -> None:
    if wait_ports_free([port], wait_s):
        raise SandboxError(f"the sandbox's {what} port {port} is taken; the sandbox uses --port and the three ports "
                           f"after it: pick another --port")


def s3_endpoint(home: str | Path = DEFAULT_HOME) -> str | None:
    marker = Path(home) / "s3" / "server.json"
    if not marker.exists():
        return None
    data = json.loads(marker.read_text())
    return str(data["endpoint"]) if pid_alive(data["pid"]) else None


@dataclass(frozen=True)
class SandboxStatus:
    home: str
    parts: dict[str, str | None]  # part -> where it serves (and its pid), or None when it does not run
    manifest_counts: dict[str, int] | None  # the seed's ground truth, when seeded

    @property
    def up(self) -> bool:
        return all(self.parts.values())

    def lines(self) -> list[str]:
        state = "up" if self.up else "partly up" if any(self.parts.values()) else "down"
        out = [f"sandbox in {self.home}: {state}"]
        out += [f"  {part:<10} {where or 'not running'}" for part, where in self.parts.items()]
        if self.manifest_counts is None:
            out.append("  not seeded (the README command seeds it)")
        else:
            shown = ", ".join(f"{k}={v:,}" for k, v in sorted(self.manifest_counts.items()))
            out.append(f"  seeded: {shown}")
        return out


def sandbox_status(home: str | Path = DEFAULT_HOME) -> SandboxStatus:
    home = Path(home)
    zk = running_server(home / "zookeeper")
    s3 = s3_endpoint(home)
    s3_pid = json.loads((home / "s3" / "server.json").read_text())["pid"] if s3 else None
    pulsar = running_pulsar(home / "pulsar")
    parts = {
        "zookeeper": f"{zk.connect_string} (pid {zk.pid}, data {zk.data_dir})" if zk else None,
        "s3": f"{s3} (pid {s3_pid})" if s3 else None,
        "pulsar": f"{pulsar.service_url}, admin {pulsar.admin_url} (pid {pulsar.pid})" if pulsar else None,
    }
    counts = None
    manifest = home / "manifest.json"
    if manifest.exists():
        try:
            counts = {k: int(v) for k, v in (json.loads(manifest.read_text()).get("counts") or {}).items()}
        except (ValueError, TypeError, AttributeError):
            counts = {}
    return SandboxStatus(str(home.resolve()), parts, counts)


@dataclass(frozen=True)
class SandboxDown:
    stopped: list[str]  # the parts that ran and were stopped
    ports: list[int]  # the ports they served on
    still_taken: list[int]  # those of them still taken when `down` gave up waiting (empty normally)


def sandbox_down(home: str | Path = DEFAULT_HOME, wipe: bool = False, port_wait_s: float = 30.0) -> SandboxDown:
    """Stop every part that runs, wait until each process has exited and its ports are free, then wipe if asked.

    Returns only then, so `down` followed by `up` (or another program taking the ports) never races the old
    servers; parts that do not run are skipped, so `down` twice is harmless.
    """
    home = Path(home)
    stopped: list[str] = []
    ports: list[int] = []
    zk = running_server(home / "zookeeper")
    if zk is not None:
        stop_zookeeper(zk)
        stopped.append("zookeeper")
        ports += [zk.port] + ([zk.secure_port] if zk.secure_port is not None else [])
    marker = home / "s3" / "server.json"
    if marker.exists():
        data = json.loads(marker.read_text())
        if pid_alive(data["pid"]):
            stop_s3(S3ServerInfo(data["endpoint"], data["pid"]))
            stopped.append("s3")
            ports.append(int(str(data["endpoint"]).rsplit(":", 1)[1].rstrip("/")))
        marker.unlink()
    pulsar = running_pulsar(home / "pulsar")
    if pulsar is not None:
        stop_pulsar(pulsar, home / "pulsar")
        stopped.append("pulsar")
        ports += [int(url.rsplit(":", 1)[1]) for url in (pulsar.service_url, pulsar.admin_url)]
    still_taken = wait_ports_free(ports, port_wait_s) if ports else []
    if wipe and home.exists():
        shutil.rmtree(home)
    return SandboxDown(stopped, sorted(ports), still_taken)


def seed_sandbox(hosts: str, spec: SandboxSpec, manifest_path: str | Path, s3: str | None = None) -> SeededSandbox:
    """Seed `spec` into the ZooKeeper at `hosts` (and S3 at `s3`); refuses to seed over existing metadata."""
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
    if s3:
        seed_s3(s3_client(S3Target(spec.offload_bucket), s3), cluster)
    path = write_manifest(cluster, manifest_path)
    return SeededSandbox(cluster, result, path)
