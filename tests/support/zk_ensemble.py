"""The three-node ZooKeeper ensemble (harness.zkensemble) as the fault tests use it: one per test module, one chroot
per test, every member healed (thawed, restarted) between tests; and the moments a fault test waits for.

The fixtures themselves are in tests/ensemble/conftest.py; what is here is plain helpers, so a benchmark can use them
too.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness import zkensemble as ens
from harness.zkensemble import EnsembleInfo, Member

_chroots = itertools.count(1)


@dataclass(frozen=True)
class EnsembleTarget:
    """A test's chroot on the ensemble: the sweeper connects to every member with it, as to a production ensemble."""

    info: EnsembleInfo
    chroot: str

    @property
    def hosts(self) -> str:
        """`127.0.0.1:a,127.0.0.1:b,127.0.0.1:c/e-<n>`: every member, then the chroot."""
        return self.info.hosts(self.chroot)


def new_chroot() -> str:
    return f"/e-{next(_chroots)}"


@contextlib.contextmanager
def running_ensemble(root: Path, size: int = 3) -> Iterator[EnsembleInfo]:
    """An ensemble for the block, always stopped after it (whatever the block did to its members)."""
    info = ens.start_ensemble(root, size=size)
    try:
        yield info
    finally:
        ens.stop_ensemble(info)


@dataclass(frozen=True)
class Election:
    """A leader killed, and how long the ensemble took to elect the next one."""

    killed: Member
    new_leader: Member
    killed_at: float  # time.monotonic() of the kill
    elected_s: float  # from the kill until a member answered `Mode: leader`


def kill_leader(info: EnsembleInfo, sig: int = signal.SIGKILL, timeout: float = 30.0) -> Election:
    """SIGKILL the member that leads now, and wait for the others to elect a new leader."""
    leader = ens.leader(info)
    killed_at = time.monotonic()
    ens.kill(info, leader, sig)
    new = ens.leader(info, timeout)
    return Election(leader, new, killed_at, time.monotonic() - killed_at)


def wait_until(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes] | None = None,
               timeout: float = 180.0, every: float = 0.05) -> float:
    """Poll `ready` until it holds; the seconds waited. Fails naming `what` on a timeout, or when `proc` (the run
    the fault is aimed at) ended first: a fault that missed its moment proves nothing."""
    started = time.monotonic()
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}")
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)
    return time.monotonic() - started
