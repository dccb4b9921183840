"""A throwaway Oxia metadata store on loopback (`oxia standalone`), for the tests and the sandbox (issue 24).

The server binary is not fetched from a registry (the Go proxy does not serve Oxia's modules): it comes from
`../shared/tools/oxia/oxia-<version>-linux-amd64.xz` beside the checkout, unpacked once into `var/oxia`, or from
`$SWEEPER_OXIA_BIN`. Where neither exists, `oxia_binary()` says so and the Oxia tests skip naming it.
"""

from __future__ import annotations

import lzma
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harness.lifecycle import stop_process
from harness.zkserver import free_port

REPO = Path(__file__).resolve().parents[1]
BINARY_ENV = "SWEEPER_OXIA_BIN"
UNPACKED = REPO / "var" / "oxia"
PACKED_DIR = REPO.parent / "shared" / "tools" / "oxia"


class OxiaServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class OxiaServerInfo:
    address: str  # host:port of the public (client) service
    pid: int
    shards: int

    def url(self, namespace: str = "default") -> str:
        return f"oxia://{self.address}/{namespace}"


def oxia_binary() -> Path | None:
    """The server binary: $SWEEPER_OXIA_BIN, var/oxia, or unpacked there from ../shared/tools/oxia."""
    named = os.environ.get(BINARY_ENV)
    if named:
        return Path(named) if Path(named).is_file() else None
    if UNPACKED.is_file():
        return UNPACKED
    packed = sorted(PACKED_DIR.glob("oxia-*-linux-amd64.xz")) if PACKED_DIR.is_dir() else []
    if not packed:
        return None
    UNPACKED.parent.mkdir(parents=True, exist_ok=True)
    partial = UNPACKED.with_suffix(f".{os.getpid()}.partial")  # two test processes may unpack at once
    with lzma.open(packed[-1]) as source, open(partial, "wb") as target:
        shutil.copyfileobj(source, target)
    partial.chmod(0o755)
    partial.replace(UNPACKED)
    return UNPACKED


def missing_binary_reason() -> str:
    return (f"no Oxia server binary: put oxia-<version>-linux-amd64.xz in {PACKED_DIR} or name one in "
            f"${BINARY_ENV}")


def start_oxia(home: str | os.PathLike[str], shards: int = 1, port: int | None = None,
               timeout: float = 30.0) -> OxiaServerInfo:
    binary = oxia_binary()
    if binary is None:
        raise OxiaServerError(missing_binary_reason())
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    metrics = free_port()
    log = open(home / "oxia.log", "ab")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen(
        [str(binary), "standalone", "-p", f"127.0.0.1:{port}", "-m", f"127.0.0.1:{metrics}",
         "--data-dir", str(home / "db"), "--wal-dir", str(home / "wal"), "-s", str(shards), "-l", "warn",
         "--wal-sync-data=false"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise OxiaServerError(f"oxia standalone exited with {proc.returncode}; see {home / 'oxia.log'}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return OxiaServerInfo(f"127.0.0.1:{port}", proc.pid, shards)
        except OSError:
            time.sleep(0.1)
    stop_process(proc.pid)
    raise OxiaServerError(f"oxia standalone on port {port} not answering after {timeout:.0f}s")


def stop_oxia(info: OxiaServerInfo) -> None:
    stop_process(info.pid)
