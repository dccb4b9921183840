"""A throwaway three-node ZooKeeper ensemble on loopback, for the fault tests and benchmarks (issue 45).

Production metadata stores are ensembles: a leader, followers, a quorum, and elections when the leader goes.
`harness.zkserver` runs one standalone server, which never elects anything; here each member is Debian's real
`QuorumPeerMain` with its own data dir, `myid`, client port and the `server.N=127.0.0.1:<quorum>:<election>` lines
of every member, so quorum and leader election are ZooKeeper's own. Each member is its own process (and process
group), killed, stopped, restarted or frozen by pid.

Short ticks (`tickTime` 200 ms, `initLimit` 20, `syncLimit` 10: a follower gives up on a silent leader after 2 s)
make an election take a second or two, as a production ensemble's takes several (a killed leader is noticed at
once: its followers see the connection close). Not shorter: on two cores shared with Spark JVMs a member can stall
for a second, and a `syncLimit` of 1 s then elected new leaders nobody asked for; `maxSessionTimeout` is raised so
a client's session timeout (the sweeper's default is 15 s) is not cut to 20 ticks. The four-letter words `srvr`,
`mntr`, `ruok` and `stat` find the leader (`Mode: leader`) and count requests; the AdminServer stays off (Jetty
adds seconds to every start).

All members share one wall clock (a `harness.zkserver.ServerClock` file, under libfaketime): the leader stamps
a znode's ctime, and whichever member leads when the seeder sets the clock back must stamp the past.

Never used against production: there the operator gives a connect string.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.lifecycle import kill_process, pid_alive, stop_process, wait_ports_free
from harness.zkserver import (
    FAKETIME_LIB,
    JAVA_LIB,
    LOG_BINDING,
    ZOOKEEPER_JAR,
    ServerClock,
    ZooKeeperServerError,
    _clocks,
    _java,
    free_port_block,
)

QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
TICK_MS = 200
INIT_LIMIT = 20  # ticks a follower may take to connect and sync to a new leader
SYNC_LIMIT = 10  # ticks of silence after which a follower drops its leader (and the leader a follower)
# Three JVMs share two cores with the tests: C1 only, the serial collector, a small heap (the testbed's lean JVMs).
LEAN_JVM = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xss512k")


class EnsembleError(ZooKeeperServerError):
    pass


@dataclass
class Member:
    """One server of the ensemble. `pid` changes with each restart; ports and data stay."""

    myid: int
    host: str
    client_port: int
    quorum_port: int
    election_port: int
    root: str  # zoo.cfg, data/ (with myid), zookeeper.log
    pid: int = 0
    frozen: bool = False  # SIGSTOPped and not yet thawed

    @property
    def address(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def data_dir(self) -> str:
        return str(Path(self.root) / "data")

    @property
    def log_path(self) -> Path:
        return Path(self.root) / "zookeeper.log"

    @property
    def running(self) -> bool:
        return pid_alive(self.pid)

    def __str__(self) -> str:
        return f"server.{self.myid} ({self.address}, pid {self.pid})"


@dataclass
class EnsembleInfo:
    root: str
    members: list[Member]
    clock_file: str = ""
    started_at: float = field(default_factory=time.time)

    @property
    def connect_string(self) -> str:
        """Every member, as an operator's connect string lists its ensemble."""
        return ",".join(m.address for m in self.members)

    def hosts(self, chroot: str = "") -> str:
        """The connect string with a chroot (`/pulsar` -> `127.0.0.1:a,127.0.0.1:b,127.0.0.1:c/pulsar`)."""
        return self.connect_string + (("/" + chroot.strip("/")) if chroot.strip("/") else "")

    @property
    def ports(self) -> list[int]:
        return [p for m in self.members for p in (m.client_port, m.quorum_port, m.election_port)]

    @property
    def pids(self) -> dict[int, int]:
        return {m.myid: m.pid for m in self.members}

    @property
    def data_dirs(self) -> dict[int, str]:
        return {m.myid: m.data_dir for m in self.members}

    @property
    def clock(self) -> ServerClock | None:
        return ServerClock(Path(self.clock_file)) if self.clock_file else None

    def member(self, myid: int) -> Member:
        for m in self.members:
            if m.myid == myid:
                return m
        raise EnsembleError(f"no server.{myid} in this ensemble")

    def save(self) -> None:
        (Path(self.root) / "ensemble.json").write_text(json.dumps(asdict(self), indent=1))


# ---- four-letter words ---------------------------------------------------------------------------------------

def four_letter(member: Member, word: str, timeout: float = 1.0) -> str:
    """A member's answer to a four-letter word ("" when it does not answer within `timeout`: down or frozen)."""
    try:
        with socket.create_connection((member.host, member.client_port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def mode(member: Member, timeout: float = 1.0) -> str:
    """`leader`, `follower`, or "" (down, frozen, or not serving: looking for a leader)."""
    for line in four_letter(member, "srvr", timeout).splitlines():
        if line.startswith("Mode: "):
            return line.split(":", 1)[1].strip()
    return ""


def metrics(member: Member, timeout: float = 1.0) -> dict[str, str]:
    """`mntr`'s key/value lines (empty when the member does not serve)."""
    out = {}
    for line in four_letter(member, "mntr", timeout).splitlines():
        key, _, value = line.partition("\t")
        if value:
            out[key] = value
    return out


def packets_received(info: EnsembleInfo) -> int:
    """Requests the serving members have received from their clients, summed (pings included)."""
    total = 0
    for m in info.members:
        if m.running and not m.frozen:
            with contextlib.suppress(ValueError):
                total += int(metrics(m).get("zk_packets_received", 0))
    return total


class RequestCounter:
    """Requests the serving members received since it was made, less the four-letter words it sent to count them
    (each `mntr` is one packet to its member): how far a client's work has gone, seen from the ensemble."""

    def __init__(self, info: EnsembleInfo) -> None:
        self.info = info
        self._probes = 0
        self._base = self._total()
        self._base_probes = self._probes

    def _total(self) -> int:
        self._probes += sum(1 for m in self.info.members if m.running and not m.frozen)
        return packets_received(self.info)

    def __call__(self) -> int:
        total = self._total()
        return total - self._base - (self._probes - self._base_probes)


def leader(info: EnsembleInfo, timeout: float = 30.0) -> Member:
    """The member that leads now; waits up to `timeout` for one to be elected."""
    deadline = time.monotonic() + timeout
    while True:
        for m in info.members:
            if m.running and not m.frozen and mode(m) == "leader":
                return m
        if time.monotonic() >= deadline:
            raise EnsembleError(f"no leader within {timeout:.0f}s: {describe(info)}")
        time.sleep(0.1)


def describe(info: EnsembleInfo) -> str:
    """Each member's state in a few words, for failure messages."""
    parts = []
    for m in info.members:
        state = "frozen" if m.frozen else ("down" if not m.running else (mode(m) or "not serving"))
        parts.append(f"server.{m.myid} :{m.client_port} {state}")
    return "; ".join(parts)


def wait_for_quorum(info: EnsembleInfo, timeout: float = 60.0) -> Member:
    """Every running, unfrozen member serves (one leads, the others follow); returns the leader."""
    deadline = time.monotonic() + timeout
    while True:
        live = [m for m in info.members if m.running and not m.frozen]
        modes = {m.myid: mode(m) for m in live}
        leaders = [m for m in live if modes[m.myid] == "leader"]
        if len(leaders) == 1 and all(v in ("leader", "follower") for v in modes.values()) \
                and 2 * len(live) > len(info.members):
            return leaders[0]
        for m in info.members:
            if not m.frozen and m.pid and not m.running and m.log_path.exists() and _exited_on_its_own(m):
                raise EnsembleError(f"{m} exited; log {m.log_path}:\n" + m.log_path.read_text(errors="replace")[-2000:])
        if time.monotonic() >= deadline:
            raise EnsembleError(f"no quorum within {timeout:.0f}s: {describe(info)}")
        time.sleep(0.1)


_killed: set[int] = set()  # pids this process stopped or killed on purpose


def _exited_on_its_own(m: Member) -> bool:
    return m.pid not in _killed


# ---- start, stop, faults -----------------------------------------------------------------------------------

def _config(info: EnsembleInfo, m: Member) -> str:
    servers = [f"server.{o.myid}={o.host}:{o.quorum_port}:{o.election_port}" for o in info.members]
    return "\n".join([
        f"dataDir={m.data_dir}",
        f"clientPort={m.client_port}",
        f"clientPortAddress={m.host}",
        f"tickTime={TICK_MS}",
        f"initLimit={INIT_LIMIT}",
        f"syncLimit={SYNC_LIMIT}",
        # Sessions as long as a client asks for (up to a minute): the default cap is 20 ticks, 4 s here.
        f"minSessionTimeout={2 * TICK_MS}",
        "maxSessionTimeout=60000",
        "maxClientCnxns=0",
        "admin.enableServer=false",
        "4lw.commands.whitelist=srvr,mntr,ruok,stat",
        # A member that lost its leader answers nothing (not read-only reads of a stale copy).
        "readonlymode.enabled=false",
        "standaloneEnabled=false",
        "reconfigEnabled=false",
        "snapCount=500000",
        "autopurge.snapRetainCount=3",
        "autopurge.purgeInterval=1",
        "globalOutstandingLimit=20000",
        # Bind the election port with SO_REUSEADDR retries on a restart (a killed member's port in TIME_WAIT).
        "electionPortBindRetry=10",
        *servers,
        "",
    ])


def _spawn(info: EnsembleInfo, m: Member) -> None:
    cfg = Path(m.root) / "zoo.cfg"
    cfg.write_text(_config(info, m))
    classpath = [str(ZOOKEEPER_JAR), "/etc/zookeeper/conf"]
    jvm = [*LEAN_JVM, "-Djute.maxbuffer=16777216"]
    if (JAVA_LIB / LOG_BINDING).exists():
        classpath.append(str(JAVA_LIB / LOG_BINDING))
        # Elections and lost followers are what a fault test wants to read afterwards: INFO, not WARN.
        jvm += ["-Dorg.slf4j.simpleLogger.defaultLogLevel=info", "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS"]
    env = dict(os.environ)
    if info.clock_file:
        # Wall clock only, as harness.zkserver does: sessions and election timeouts run on monotonic time.
        env.update({"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME_TIMESTAMP_FILE": info.clock_file,
                    "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                    "FAKETIME_FORCE_MONOTONIC_FIX": "0"})
    with open(m.log_path, "ab") as log:
        proc = subprocess.Popen([_java(), *jvm, "-cp", ":".join(classpath), QUORUM_MAIN, str(cfg)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    m.pid, m.frozen = proc.pid, False
    info.save()


def start_ensemble(root: str | os.PathLike[str], size: int = 3, host: str = "127.0.0.1",
                   timeout: float = 90.0, fake_clock: bool = True) -> EnsembleInfo:
    """Start `size` members under `root` (one directory each) and return once they have a quorum and a leader.

    Ports: `size` client ports, then `size` quorum ports, then `size` election ports, one block from the
    harness's range (each xdist worker has its own). With `fake_clock` (and libfaketime) every member follows
    one ServerClock file, which `seed_zookeeper` finds by any member's client port."""
    if not ZOOKEEPER_JAR.exists():
        raise EnsembleError(f"{ZOOKEEPER_JAR} not found: install Debian's zookeeper package")
    if size < 1:
        raise EnsembleError("an ensemble needs at least one member")
    base = free_port_block(3 * size, host)
    top = Path(root)
    top.mkdir(parents=True, exist_ok=True)
    clock_file = ""
    if fake_clock and FAKETIME_LIB.exists():
        clock_file = str(top / "clock")
        ServerClock(Path(clock_file)).set_offset_days(0)
    members = []
    for i in range(size):
        member_root = top / f"server{i + 1}"
        (member_root / "data").mkdir(parents=True, exist_ok=True)
        (member_root / "data" / "myid").write_text(f"{i + 1}\n")
        members.append(Member(myid=i + 1, host=host, client_port=base + i, quorum_port=base + size + i,
                              election_port=base + 2 * size + i, root=str(member_root)))
    info = EnsembleInfo(root=str(top), members=members, clock_file=clock_file)
    try:
        for m in members:
            _spawn(info, m)
        wait_for_quorum(info, timeout)
    except BaseException:
        stop_ensemble(info)
        raise
    if info.clock is not None:
        for m in members:
            _clocks[m.client_port] = info.clock
    return info


def kill(info: EnsembleInfo, member: Member, sig: int = signal.SIGKILL) -> None:
    """Kill `member` with `sig` (SIGKILL: a crash, no goodbye to its peers) and wait until it is gone."""
    _killed.add(member.pid)
    if member.frozen:
        member.frozen = False  # a SIGKILL ends a stopped process too
    if sig == signal.SIGKILL:
        kill_process(member.pid)
    else:
        stop_process(member.pid, timeout=15.0)
    info.save()


def stop(info: EnsembleInfo, member: Member) -> None:
    """A clean stop (SIGTERM, then SIGKILL after 15 s)."""
    if member.frozen:
        thaw(info, member)
    kill(info, member, signal.SIGTERM)


def restart(info: EnsembleInfo, member: Member, timeout: float = 60.0) -> None:
    """Start a stopped or killed member again on its ports and data, and wait until it serves in the quorum."""
    if member.running:
        raise EnsembleError(f"{member} still runs: kill or stop it first")
    left = wait_ports_free([member.client_port, member.quorum_port, member.election_port], 30.0)
    if left:
        raise EnsembleError(f"ports {left} of {member} are still taken")
    _spawn(info, member)
    deadline = time.monotonic() + timeout
    while mode(member) not in ("leader", "follower"):
        if not member.running:
            raise EnsembleError(f"{member} exited on restart; log {member.log_path}:\n"
                                + member.log_path.read_text(errors="replace")[-2000:])
        if time.monotonic() >= deadline:
            raise EnsembleError(f"{member} not serving {timeout:.0f}s after its restart: {describe(info)}")
        time.sleep(0.1)


def freeze(info: EnsembleInfo, member: Member) -> None:
    """SIGSTOP: the member holds its sockets and answers nothing, as in a long GC pause or a hung disk."""
    os.kill(member.pid, signal.SIGSTOP)
    member.frozen = True
    info.save()


def thaw(info: EnsembleInfo, member: Member) -> None:
    """SIGCONT after `freeze`."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(member.pid, signal.SIGCONT)
    member.frozen = False
    info.save()


def heal(info: EnsembleInfo, timeout: float = 60.0) -> Member:
    """Thaw the frozen members, restart the dead ones, wait for the whole quorum; the leader."""
    for m in info.members:
        if m.frozen:
            thaw(info, m)
    for m in info.members:
        if not m.running:
            restart(info, m, timeout)
    return wait_for_quorum(info, timeout)


def stop_ensemble(info: EnsembleInfo) -> None:
    """Stop every member (thawed first: a stopped JVM cannot act on SIGTERM) and free the clock's ports."""
    for m in info.members:
        _clocks.pop(m.client_port, None)
        if m.frozen:
            thaw(info, m)
    for m in info.members:
        if m.pid:
            _killed.add(m.pid)
            stop_process(m.pid, timeout=10.0)
    info.save()
