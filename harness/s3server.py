"""A throwaway S3 endpoint on loopback (moto's server mode) for the sandbox and the tests.

Real HTTP, real boto3 on the client side; never used against production.

`python -m harness.s3server -H host -p port` runs moto's own server with one change that makes it
behave like S3 where our tables depend on it: a conditional write (`If-None-Match: *` or
`If-Match`, on PutObject and CompleteMultipartUpload) is checked and stored atomically. moto checks
first and stores later on one of its request threads (moto.s3.responses.S3Response.put_object), so
two writers racing for one Delta commit version could both win there; on S3 one gets 412.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import python_env
from harness.lifecycle import stop_process
from harness.zkserver import free_port


class S3ServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class S3ServerInfo:
    endpoint: str
    pid: int


def start_s3(log_dir: str | os.PathLike[str], port: int | None = None, timeout: float = 30.0) -> S3ServerInfo:
    port = port or free_port()
    env = python_env()
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    log = open(Path(log_dir) / "moto.log", "ab")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen([sys.executable, "-m", "harness.s3server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
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
    stop_process(info.pid)


def last_traceback(log_dir: str | os.PathLike[str], lines: int = 12) -> str | None:
    """The end of the newest Python traceback in moto's log: why it answered 500, for a failure report."""
    log = Path(log_dir) / "moto.log"
    if not log.exists():
        return None
    text = log.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(text) if line.startswith("Traceback")]
    if not starts:
        return None
    block = text[starts[-1]:]
    end = next((i for i, line in enumerate(block[1:], 1) if line and not line.startswith((" ", "Traceback"))), 0)
    return "\n".join(block[max(0, end - lines + 1):end + 1])


def _atomic_conditional_writes() -> None:
    from moto.s3.responses import S3Response

    lock = threading.Lock()

    def atomic(method: Callable[..., Any]) -> Callable[..., Any]:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.headers.get("If-None-Match") or self.headers.get("If-Match"):
                with lock:
                    return method(self, *args, **kwargs)
            return method(self, *args, **kwargs)

        return run

    # put_object: PutObject; _key_response_post: CompleteMultipartUpload (among other POSTs).
    for name in ("put_object", "_key_response_post"):
        setattr(S3Response, name, atomic(getattr(S3Response, name)))


def main(argv: list[str] | None = None) -> None:
    from moto import server

    _atomic_conditional_writes()
    server.main(argv)


if __name__ == "__main__":
    main()
