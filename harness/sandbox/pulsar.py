"""The sandbox's Pulsar: the local endpoint in its own process, with the admin REST sliver."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import python_env
from harness.lifecycle import pid_alive, stop_process


class PulsarSandboxError(RuntimeError):
    pass


@dataclass(frozen=True)
class PulsarSandboxInfo:
    service_url: str
    admin_url: str
    pid: int


def _answering(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def start_pulsar(home: str | Path, port: int, admin_port: int, timeout: float = 30.0,
                 persist_latency_ms: float = 0.0, register_zookeeper: str = "") -> PulsarSandboxInfo:
    """Start the endpoint; with `register_zookeeper` it registers as a live broker there (the liveness gate)."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "endpoint.log", "ab")  # noqa: SIM115 - handed to the child process
    register = ["--register-zookeeper", register_zookeeper] if register_zookeeper else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.sandbox.pulsar_endpoint", "--data-dir", str(home / "data"), "--port", str(port),
         "--admin-port", str(admin_port), "--persist-latency-ms", str(persist_latency_ms), *register],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=python_env())
    log.close()
    info = PulsarSandboxInfo(f"pulsar://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", proc.pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PulsarSandboxError(f"the Pulsar endpoint exited with {proc.returncode}; see {home}/endpoint.log")
        if _answering(port) and _answering(admin_port):
            (home / "server.json").write_text(json.dumps(info.__dict__))
            return info
        time.sleep(0.05)
    stop_pulsar(info)
    raise PulsarSandboxError(f"the Pulsar endpoint on port {port} is not answering after {timeout:.0f}s")


def running_pulsar(home: str | Path) -> PulsarSandboxInfo | None:
    marker = Path(home) / "server.json"
    if not marker.exists():
        return None
    info = PulsarSandboxInfo(**json.loads(marker.read_text()))
    return info if pid_alive(info.pid) else None


def stop_pulsar(info: PulsarSandboxInfo, home: str | Path | None = None) -> None:
    stop_process(info.pid)
    if home is not None:
        (Path(home) / "server.json").unlink(missing_ok=True)
