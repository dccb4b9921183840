"""Local server processes (the sandbox, testbed and test servers): alive, stop, ports free.

One place for what five modules did by hand. Every server here is started in its own session
(`start_new_session=True`), so its process group holds it and whatever it spawned (a JVM's children, moto's
threads' subprocesses), and a stop signals the group.

A process killed with SIGKILL stays a zombie until its parent reaps it, and `kill(pid, 0)` succeeds on a
zombie: a server started by this very process (the CLI in a test, a notebook) and then killed would look alive
forever, and `up` would keep a dead endpoint instead of starting a new one (issue 27). A server started by
another process (`sandbox up` in one shell, `sandbox down` in the next) is not our child, so `waitpid` cannot
wait for it: stopping polls until it is gone, or `down` would return while it still holds its ports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterable


def pid_alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie; a zombie child of this process is reaped on the way."""
    if pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]  # the name in parentheses may hold spaces
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc here: existence is all we can tell
    return state != "Z"


def group_alive(pgid: int) -> bool:
    """True while any process of process group `pgid` exists (zombies included: a group ends when they are reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _signal(pid: int, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def terminate(pid: int, group: bool = True) -> None:
    """SIGTERM without waiting (to stop several servers at once, then `wait_gone` each)."""
    _signal(pid, signal.SIGTERM, group)


def wait_gone(pid: int, timeout: float) -> bool:
    """Poll until `pid` has exited (reaping it when it is our child); False when it still runs at `timeout`."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def stop_process(pid: int, timeout: float = 10.0, group: bool = True) -> None:
    """SIGTERM (the process group when `group`), wait up to `timeout`, then SIGKILL and wait until it is gone."""
    _signal(pid, signal.SIGTERM, group)
    if wait_gone(pid, timeout):
        return
    _signal(pid, signal.SIGKILL, group)
    wait_gone(pid, 10.0)


def kill_process(pid: int, group: bool = True) -> None:
    """SIGKILL, no clean shutdown (a crash, for tests and `testbed crash`), and wait until it is gone."""
    _signal(pid, signal.SIGKILL, group)
    wait_gone(pid, 10.0)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind `port` now (as the servers bind: TIME_WAIT connections do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_ports_free(ports: Iterable[int], timeout: float) -> list[int]:
    """Wait up to `timeout` for every port to come free; the ports still taken then (empty when all are free)."""
    pending = sorted(set(ports))
    deadline = time.monotonic() + timeout
    while True:
        pending = [port for port in pending if not port_free(port)]
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.2)
