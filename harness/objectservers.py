"""Throwaway Azure Blob and GCS servers on loopback for the tests: Azurite (npm `azurite`, its blob service alone)
and fake-gcs-server (Go module github.com/fsouza/fake-gcs-server). Real HTTP, the vendors' own SDKs on the client
side; never used against production.

scripts/setup.sh installs both into the checkout's ignored `.tools/` (Azurite 3.35.0, the newest that runs on Node
20; fake-gcs-server built from the Go module proxy). `$SWEEPER_AZURITE_BLOB_BIN` and `$SWEEPER_FAKE_GCS_BIN` name
others. Where a binary is missing, `missing_reason` says which and how to get it (the tests skip with it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness import CHECKOUT
from harness.lifecycle import stop_process
from harness.zkserver import free_port

TOOLS = CHECKOUT / ".tools"
AZURITE_ENV, FAKE_GCS_ENV = "SWEEPER_AZURITE_BLOB_BIN", "SWEEPER_FAKE_GCS_BIN"
AZURITE_VERSION = "3.35.0"


class ObjectServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class ObjectServerInfo:
    endpoint: str  # Azurite: the development account's URL; fake-gcs-server: its API root
    pid: int


def _binary(env: str, default: Path) -> Path | None:
    named = os.environ.get(env)
    if named:
        return Path(named) if Path(named).is_file() else None
    if default.is_file():
        return default
    found = shutil.which(default.name)
    return Path(found) if found else None


def azurite_binary() -> Path | None:
    return _binary(AZURITE_ENV, TOOLS / "azurite" / "node_modules" / ".bin" / "azurite-blob")


def fake_gcs_binary() -> Path | None:
    return _binary(FAKE_GCS_ENV, TOOLS / "bin" / "fake-gcs-server")


def missing_reason(which: str) -> str:
    env = AZURITE_ENV if which == "azurite" else FAKE_GCS_ENV
    return f"no {which} binary: run scripts/setup.sh (it installs it into {TOOLS}) or name one in ${env}"


def _start(argv: list[str], home: Path, log_name: str, ready_url: str, timeout: float) -> int:
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / log_name, "ab")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=home)
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ObjectServerError(f"{argv[0]} exited with {proc.returncode}; see {home / log_name}")
        try:
            with urllib.request.urlopen(ready_url, timeout=1):
                return proc.pid
        except urllib.error.HTTPError:
            return proc.pid  # it answers: an error status is still an answer
        except OSError:
            time.sleep(0.1)
    stop_process(proc.pid)
    raise ObjectServerError(f"{argv[0]} not answering on {ready_url} after {timeout:.0f}s; see {home / log_name}")


def start_azurite(home: str | os.PathLike[str], port: int | None = None, timeout: float = 60.0) -> ObjectServerInfo:
    binary = azurite_binary()
    if binary is None:
        raise ObjectServerError(missing_reason("azurite"))
    port = port or free_port()
    home = Path(home)
    # --skipApiVersionCheck: the Python SDK may speak a newer service version than this Azurite knows.
    argv = [str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(home / "data"),
            "--silent", "--skipApiVersionCheck", "--disableProductStyleUrl"]
    endpoint = f"http://127.0.0.1:{port}/devstoreaccount1"
    return ObjectServerInfo(endpoint, _start(argv, home, "azurite.log", endpoint, timeout))


def start_fake_gcs(home: str | os.PathLike[str], port: int | None = None, timeout: float = 30.0) -> ObjectServerInfo:
    binary = fake_gcs_binary()
    if binary is None:
        raise ObjectServerError(missing_reason("fake-gcs-server"))
    port = port or free_port()
    home = Path(home)
    argv = [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
            "-public-host", f"127.0.0.1:{port}", "-backend", "memory", "-log-level", "warn"]
    endpoint = f"http://127.0.0.1:{port}"
    return ObjectServerInfo(endpoint, _start(argv, home, "fake-gcs.log", endpoint + "/storage/v1/b", timeout))


def stop_server(info: ObjectServerInfo) -> None:
    stop_process(info.pid)
