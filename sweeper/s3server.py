"""A throwaway S3 endpoint on loopback (moto's server mode) for the sandbox and the tests.

Real HTTP, real boto3 on the client side; never used against production.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sweeper.zkserver import free_port


class S3ServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class S3ServerInfo:
    endpoint: str
    pid: int


def start_s3(log_dir: str | os.PathLike[str], port: int | None = None, timeout: float = 30.0) -> S3ServerInfo:
    port = port or free_port()
    moto = Path(sys.executable).with_name("moto_server")
    command = [str(moto)] if moto.exists() else [sys.executable, "-m", "moto.server"]
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    log = open(Path(log_dir) / "moto.log", "ab")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen([*command, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise S3ServerError(f"moto_server exited with {proc.returncode}; see {log_dir}/moto.log")
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1):
                return S3ServerInfo(endpoint, proc.pid)
        except OSError:
            time.sleep(0.1)
    stop_s3(S3ServerInfo(endpoint, proc.pid))
    raise S3ServerError(f"moto_server on {endpoint} not answering after {timeout:.0f}s")


def stop_s3(info: S3ServerInfo) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(info.pid, signal.SIGTERM)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(info.pid, 0)
