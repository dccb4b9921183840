"""The three-node ZooKeeper ensemble (harness.zkensemble) as the fault tests use it: one per test module, one chroot
per test, every member healed (thawed, restarted) between tests; and the moments a fault test waits for.

The fixtures themselves are in tests/ensemble/conftest.py; what is here is plain helpers, so a benchmark can use them
too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from harness import zkensemble as ens
from harness.lifecycle import group_alive
from harness.zkensemble import EnsembleInfo, Member, RequestCounter
from tests.support.config import SHORT_LIVED_SPARK_ENV
from tests.support.zk_faults import ZkFaultProxy

REPO = Path(__file__).resolve().parents[2]
__all__ = ["AimedElection", "CliRun", "Election", "EnsembleTarget", "RequestCounter", "assert_finished_or_refused",
           "kill_leader", "new_chroot", "run_cli", "running_ensemble", "wait_until"]

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


class AimedElection:
    """The leader killed at the instant one chosen request of the sweeper's was answered, and that answer lost.

    A leader's death drops every client connection of the ensemble (followers close them as they look for the next
    leader), so whatever a client had in flight then may have been applied with its answer lost: ZooKeeper's
    documented ConnectionLoss, which DESIGN.md invariant 18 says to settle by re-reading. Killing the leader at a
    random moment lands there only by luck; here one TCP proxy per member (tests.support.zk_faults), listed in the
    connect string in the members' place, forwards everything and watches the requests: the first one `aim` picks
    has its answer held when it comes, the leader is SIGKILLed, then the connection carrying it is dropped. Every
    other fault (the election, the reconnect, the ConnectionLoss of every other request in flight) is the
    ensemble's own.
    """

    def __init__(self, info: EnsembleInfo, aim: Callable[[int, bytes], bool]) -> None:
        self.info = info
        self.aim = aim
        self.killed: Member | None = None  # set the moment the aimed answer came and the leader was killed
        self.election: Election | None = None  # set once the others elected a new leader
        self._lock = threading.Lock()
        self._fired = False
        self._watch: threading.Thread | None = None
        self.proxies = [ZkFaultProxy((m.host, m.client_port), doom=self._doom, on_drop=self._kill)
                        for m in info.members]

    def hosts(self, chroot: str = "") -> str:
        """The connect string through the proxies, one per member, with `chroot`."""
        chroot = ("/" + chroot.strip("/")) if chroot.strip("/") else ""
        return ",".join(f"127.0.0.1:{p.port}" for p in self.proxies) + chroot

    @property
    def lost(self) -> list[list[str]]:
        """The paths of the request whose answer was lost (the deletes of a multi, the path of a read)."""
        return [paths for p in self.proxies for paths in p.dropped]

    def _doom(self, op: int, body: bytes) -> bool:
        with self._lock:
            if self._fired or not self.aim(op, body):
                return False
            self._fired = True
            return True

    def _kill(self) -> None:
        leader = ens.leader(self.info, timeout=30)
        killed_at = time.monotonic()
        ens.kill(self.info, leader)
        self.killed = leader

        def watch() -> None:  # the election's length, timed apart from whatever the test does meanwhile
            new = ens.leader(self.info, timeout=60)
            self.election = Election(leader, new, killed_at, time.monotonic() - killed_at)

        self._watch = threading.Thread(target=watch, name="election-watch", daemon=True)
        self._watch.start()

    def wait_elected(self) -> Election:
        """Once the aimed kill has happened: the new leader and how long its election took."""
        assert self._watch is not None, "the aimed request never came"
        self._watch.join(timeout=70)
        assert self.election is not None, f"no new leader: {ens.describe(self.info)}"
        return self.election

    def __enter__(self) -> AimedElection:
        for proxy in self.proxies:
            proxy.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for proxy in self.proxies:
            proxy.stop()


@dataclass(frozen=True)
class CliRun:
    code: int
    out: str
    err: str
    log: Path  # SWEEPER_LOG_FILE: where a trace would go

    @property
    def terminal(self) -> str:
        return f"exit {self.code}\n--- stdout ---\n{self.out[-3000:]}\n--- stderr ---\n{self.err[-3000:]}"


def run_cli(args: list[str], tmp_path: Path, name: str,
            during: Callable[[subprocess.Popen[bytes]], None] | None = None, timeout: float = 300.0,
            env: dict[str, str] | None = None) -> CliRun:
    """`sweeper <args>` as an operator runs it (its own process group, a Spark JVM of its own); `during(proc)` runs
    while it does (where a test strikes). Returns once every process of its group has exited."""
    out, err, log = tmp_path / f"{name}.out", tmp_path / f"{name}.err", tmp_path / f"{name}.log"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sweeper.cli", *args], cwd=REPO, stdout=stdout, stderr=stderr,
            start_new_session=True,
            env={**os.environ, **SHORT_LIVED_SPARK_ENV, "SWEEPER_LOG_FILE": str(log), **(env or {})})
    try:
        if during is not None:
            during(proc)
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    return CliRun(code, out.read_text(errors="replace"), err.read_text(errors="replace"), log)


def assert_finished_or_refused(run: CliRun) -> str | None:
    """The run either finished (exit 0) or stopped on purpose with exit 3 and one line naming the fault; never a
    traceback, never exit 1 (an error nobody classified). Returns that one line when it stopped."""
    assert "Traceback" not in run.out + run.err, run.terminal
    assert run.code in (0, 3), run.terminal
    if run.code == 0:
        return None
    lines = [line for line in run.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("refused: ") and "ZooKeeper" in lines[0], run.terminal
    return lines[0]
