"""The testbed's storage: three bookies, each a process of its own, and on the ZooKeeper flavour the ZooKeeper
server they and the broker share (issues 44 and 45: striped ledgers, and a bookie stopped, killed and restarted
by pid while the rest of the cluster runs).

Why separate processes, not Pulsar standalone's `--num-bookies 3` (read in Pulsar 4.0.8's jars, `javap -c`, and
its source at apache/pulsar):
- On ZooKeeper, standalone's bookies are LocalBookkeeperEnsemble's (`runBookies`): each gets `bkBasePort + i`, the
  id `bk<i>test` and the data dir `<--bookkeeper-dir><i>` from a copy of one base ServerConfiguration (the loaded
  standalone.conf), and nothing else (the only setters it calls: setBookiePort, setBookieId, the
  `metadataServiceUri` property, setJournalDirName, setLedgerDirNames, setAllocatorPoolingPolicy,
  setAllowEphemeralPorts): `httpServerPort` stays the conf's for all three, so the second bookie's HTTP server
  cannot bind, and a per-bookie admin API and /metrics is exactly what the reclaim tests need.
- On Oxia, standalone's bookies are BKCluster's (`newServerConfiguration(int)`): the same, a port, journal and
  ledger dirs per bookie over one base configuration, and the same single `httpServerPort`.
- Both run every bookie inside the one standalone JVM: a bookie cannot be killed, stopped or restarted alone, nor
  by pid, which issue 45's "a bookie killed and restarted between the before and after samples" needs.
Tried on ZooKeeper (`standalone --no-broker --num-bookies 3`, the HTTP server on): bookies 1 and 2 log
"Failed to start org.apache.bookkeeper.http server ... BindException: Address already in use" and start anyway,
and all three register the same `httpserver` endpoint, the first bookie's port: the sweeper would read bookie 0's
counters for all three. That JVM was cheap (2.7 s of CPU, 198 MiB resident to three bookies), the separate
processes cost more (docs/development.md has the numbers).
So each bookie here is `bin/pulsar bookie` (BookKeeper's own `org.apache.bookkeeper.server.Main`, as Pulsar's
docs deploy one) with a bookkeeper.conf of its own, written from the distribution's conf/bookkeeper.conf: its
port, HTTP server port, journal and ledger dir, and `metadataServiceUri`. On ZooKeeper that is
`zk+hierarchical://127.0.0.1:<zk>/ledgers` and ZooKeeper is `bin/pulsar zookeeper` (QuorumPeerMain, as production
runs it; the standalone JVM is no longer needed once no bookie lives in it). On Oxia it is
`metadata-store:oxia://...`: bin/pulsar adds `-Dbookkeeper.metadata.bookie.drivers=...PulsarMetadataBookieDriver`
(and the client driver) unless `BK_METADATA_OPTIONS=none`, the same drivers BKCluster sets as system properties.
The metadata is initialised once, before the first bookie, with BookKeeper's `bin/bookkeeper shell
initnewcluster` (BookKeeperAdmin.initNewCluster -> the RegistrationManager's initNewCluster: /ledgers,
available, readonly and INSTANCEID; BKCluster calls PulsarRegistrationManager.initNewCluster itself).

What each bookie keeps from the standalone's bookie: DbLedgerStorage (bookkeeper.conf's ledgerStorageClass), the
HTTP server and Prometheus metrics on one port, 4 MiB entry logs, GC only when triggered (`bookie_settings`), the
journal and the ledger dir in one directory (`<data dir>/current`, as LocalBookkeeperEnsemble set both), and its id:
`bk<i>test` on ZooKeeper (`bookieId`, as LocalBookkeeperEnsemble names them: not host:port), host:port on Oxia (no
`bookieId`: BookKeeper's default, the advertised address and port). What it drops from Pulsar's bookkeeper.conf,
and why: autorecovery (its auditor would re-replicate a killed bookie's ledgers at once, `lostBookieRecoveryDelay=0`,
and every test's bytes per bookie would move), fsync per journal write (standalone.conf's `journalSyncData=false`),
and most threads and caches (three JVMs share two cores with the suite).

The broker (harness.testbed.server.broker_settings) stripes every ledger over the three: ensemble 3, write quorum
2, ack quorum 2. With one bookie down no new ledger can be created (an ensemble of 3 needs 3 writable bookies), and
reads go to the other replica: a test that stops one restarts it before it writes again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.lifecycle import kill_process, pid_alive, stop_process, terminate, wait_gone
from harness.testbed.processes import LEAN_JVM_ENV, TestbedError, check_starting, spawn_logged, write_conf


class TestbedInfo(Protocol):
    """What the storage processes need of the testbed's state (harness.testbed.server.TestbedInfo, which imports
    this module: named here by shape, so the two never import each other)."""

    __test__ = False  # not a pytest test class
    home: str
    pulsar_home: str
    zk_port: int
    oxia_address: str
    bookies: tuple[BookieInfo, ...]

    @property
    def on_oxia(self) -> bool: ...

    @property
    def zookeeper(self) -> str: ...

    @property
    def metadata_store_url(self) -> str: ...

    @property
    def bookkeeper_metadata_service_uri(self) -> str: ...

BOOKIE_COUNT = 3
# The broker's striping (broker.conf's managedLedgerDefault*): every ledger on all three bookies, each entry on two.
ENSEMBLE_SIZE, WRITE_QUORUM, ACK_QUORUM = 3, 2, 2
BOOKIE_MEM = "-Xms32m -Xmx160m -XX:MaxDirectMemorySize=160m"
ZOOKEEPER_MEM = "-Xms16m -Xmx96m -XX:MaxDirectMemorySize=32m"
# BookKeeper's own ServerConfiguration default (bookkeeper.conf says 30 s): a bookie killed with SIGKILL leaves its
# ephemeral registration until its session expires, and a restart waits that long for it
# (ZKRegistrationManager.checkRegNodeAndWaitExpired).
BOOKIE_SESSION_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class BookieInfo:
    """One bookie process: where it listens, where its data and config are, and its pid (0: not running, or a
    state file of before the three bookies, whose one bookie ran inside the standalone JVM)."""

    index: int
    bookie_id: str  # as it registers: /ledgers/available/<bookie_id>
    port: int  # bookiePort
    http_port: int  # httpServerPort: BookKeeper's admin REST API and Prometheus /metrics
    data_dir: str  # journal and ledger dir; BookKeeper keeps both in `<data_dir>/current`
    conf_file: str
    log_file: str
    http_host: str = ""  # httpServerHost; "" leaves it unset: listens on, and registers, 0.0.0.0
    pid: int = 0

    @property
    def ledger_dir(self) -> Path:
        """The ledger directory's `current`, where the entry logs, the journal and the RocksDB indexes live."""
        return Path(self.data_dir) / "current"

    @property
    def http_url(self) -> str:
        """Its HTTP server as a test on this host reaches it."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def alive(self) -> bool:
        return pid_alive(self.pid)


def zookeeper_bookie_id(index: int) -> str:
    """The ids LocalBookkeeperEnsemble gives standalone's bookies (`"bk" + i + "test"`), kept on the ZooKeeper
    flavour: an id that is not host:port, which the sweeper must resolve through the registration."""
    return f"bk{index}test"


def bookie_data_dir(home: Path, index: int, on_oxia: bool) -> Path:
    """`<home>/data/bookkeeper<i>` (LocalBookkeeperEnsemble's `--bookkeeper-dir` + i); the Oxia flavour's apart,
    since its cookies name another cluster instance."""
    return home / "data" / (f"bookkeeper-oxia{index}" if on_oxia else f"bookkeeper{index}")


def cookie_port(data_dir: Path) -> int | None:
    """The port in the bookie address its cookie (`current/VERSION`) was written for, when the id is host:port.

    A bookie refuses data whose cookie names another address (BookieImpl.checkEnvironment, InvalidCookieException),
    so a host:port bookie started again on data an earlier `up` left must take the port it had, as BKCluster does
    (`parseBookieAddressFromCookie`)."""
    try:
        text = (data_dir / "current" / "VERSION").read_text()
    except FileNotFoundError:
        return None
    match = re.search(r'bookieHost:\s*"[^"]*:(\d+)"', text)
    return int(match.group(1)) if match else None


def plan_bookies(home: Path, on_oxia: bool, ports: list[tuple[int, int]]) -> tuple[BookieInfo, ...]:
    """The bookies of a new testbed, none started: `ports` is (bookiePort, httpServerPort) per bookie."""
    bookies = []
    for index, (port, http_port) in enumerate(ports):
        data_dir = bookie_data_dir(home, index, on_oxia)
        if on_oxia:
            port = cookie_port(data_dir) or port
        bookies.append(BookieInfo(
            index=index, bookie_id=f"127.0.0.1:{port}" if on_oxia else zookeeper_bookie_id(index), port=port,
            http_port=http_port, data_dir=str(data_dir), conf_file=str(home / "conf" / f"bookie-{index}.conf"),
            log_file=str(home / "logs" / f"bookie-{index}.out"),
            # The ZooKeeper flavour leaves httpServerHost unset (0.0.0.0): the bookie registers its HTTP endpoint
            # with host 0.0.0.0, and the sweeper's "0.0.0.0 -> bookie host" fallback meets a real registration.
            http_host="127.0.0.1" if on_oxia else ""))
    return tuple(bookies)


def bookie_settings(info: TestbedInfo, bookie: BookieInfo) -> dict[str, str]:
    """What bookie `bookie` changes in Pulsar's conf/bookkeeper.conf (everything else: upstream's values)."""
    settings = {
        "bookiePort": str(bookie.port),
        "advertisedAddress": "127.0.0.1",
        "allowLoopback": "true",  # BookieImpl refuses a loopback address otherwise
        "metadataServiceUri": info.bookkeeper_metadata_service_uri,
        "zkTimeout": str(BOOKIE_SESSION_TIMEOUT_MS),
        # Journal and entry logs in one directory, as standalone's LocalBookkeeperEnsemble set them.
        "journalDirectory": bookie.data_dir,
        "ledgerDirectories": bookie.data_dir,
        **reclaim_settings(info, bookie),
        # A bookie per process on two shared cores: no autorecovery (its auditor re-replicates a stopped bookie's
        # ledgers at once with bookkeeper.conf's lostBookieRecoveryDelay=0), no fsync per journal write
        # (standalone.conf's journalSyncData), small caches and few threads.
        "autoRecoveryDaemonEnabled": "false",
        # BookKeeper's own resolver for the client inside the bookie (its HTTP service's BookKeeperAdmin). Pulsar's
        # ZkBookieRackAffinityMapping (bookkeeper.conf) fails to start there ("METADATA_STORE_INSTANCE failed to init
        # BookieId list") and falls back to the default resolver, as this one does ("No network topology"), but
        # leaves a Pulsar metadata store behind whose `metadata-store-*` thread ticks on: 0.54 of a bookie's
        # 0.65 s of CPU per idle minute on ZooKeeper, measured (0.15 s without). Racks mean nothing on one host.
        "reppDnsResolverClass": "org.apache.bookkeeper.net.ScriptBasedMapping",
        "journalSyncData": "false",
        "dbStorage_writeCacheMaxSizeMb": "16",
        "dbStorage_readAheadCacheMaxSizeMb": "16",
        "dbStorage_rocksDB_blockCacheSize": "16777216",
        "dbStorage_rocksDB_writeBufferSizeMB": "4",  # standalone.conf's RocksDB sizes
        "dbStorage_rocksDB_sstSizeInMB": "4",
        "dbStorage_rocksDB_blockSize": "4096",
        "serverNumIOThreads": "2",
        "numReadWorkerThreads": "2",
        "numHighPriorityWorkerThreads": "1",
        "numJournalCallbackThreads": "1",
        "allocatorPoolingConcurrency": "2",
    }
    if not info.on_oxia:
        settings["bookieId"] = bookie.bookie_id
    return settings


def reclaim_settings(info: TestbedInfo, bookie: BookieInfo) -> dict[str, str]:
    """The bookie's HTTP server, metrics, entry logs and garbage collection (issue 35: space freed, verified;
    harness.testbed.bookie has what the real bookie showed)."""
    settings = {
        # BookKeeper's admin REST API (/api/v1/bookie/...) and, with the Prometheus provider, /metrics on the same
        # port: PrometheusMetricsProvider starts a server of its own only when the bookie's HTTP server is off.
        "httpServerEnabled": "true",
        "httpServerClass": "org.apache.bookkeeper.http.vertx.VertxHttpServer",
        "httpServerPort": str(bookie.http_port),
        "statsProviderClass": "org.apache.bookkeeper.stats.prometheus.PrometheusMetricsProvider",
        # Small entry logs that rotate after 4 MiB and are flushed within a second, so a test's orphans fill logs
        # of their own that the garbage collector can drop whole.
        "logSizeLimit": "4194304",
        "flushInterval": "1000",
        # Pulsar's bookkeeper.conf values, said here because the tests rely on them.
        "majorCompactionThreshold": "0.5",
        "majorCompactionInterval": "86400",
        "minorCompactionThreshold": "0.2",
        "minorCompactionInterval": "3600",
        # Only a triggered GC (PUT /api/v1/bookie/gc) reclaims during a test: the tests measure what one run gave
        # back, and no test waits for the periodic collector.
        "gcWaitTime": "3600000",
    }
    if bookie.http_host:
        settings["httpServerHost"] = bookie.http_host
    return settings


def bookie_env(info: TestbedInfo, bookie: BookieInfo) -> dict[str, str]:
    # bin/pulsar sources conf/bkenv.sh for `bookie` (not pulsar_env.sh): BOOKIE_MEM, and BOOKIE_GC / BOOKIE_GC_LOG /
    # BOOKIE_EXTRA_OPTS fall back to the PULSAR_* ones LEAN_JVM_ENV sets.
    return {**os.environ, **LEAN_JVM_ENV, "PULSAR_BOOKKEEPER_CONF": bookie.conf_file, "BOOKIE_MEM": BOOKIE_MEM,
            "PULSAR_LOG_DIR": str(Path(info.home) / "logs"), "PULSAR_LOG_FILE": f"bookie-{bookie.index}.log"}


def spawn_bookie(info: TestbedInfo, bookie: BookieInfo) -> subprocess.Popen[bytes]:
    """Write bookie `bookie`'s config and start it (`bin/pulsar bookie`: the JVM is the process, its pid the pid)."""
    Path(bookie.data_dir).mkdir(parents=True, exist_ok=True)
    write_conf(Path(info.pulsar_home) / "conf" / "bookkeeper.conf", Path(bookie.conf_file),
               bookie_settings(info, bookie))
    return spawn_logged([str(Path(info.pulsar_home) / "bin" / "pulsar"), "bookie"], bookie_env(info, bookie),
                        Path(bookie.log_file), Path(info.home))


def bookie_state(bookie: BookieInfo, timeout: float = 2.0) -> dict[str, Any] | None:
    """`GET /api/v1/bookie/state` (BookKeeper's BookieStateService: running, readOnly, shuttingDown, ...), None when
    its HTTP server does not answer."""
    try:
        with urllib.request.urlopen(bookie.http_url + "/api/v1/bookie/state", timeout=timeout) as response:
            return dict(json.loads(response.read()))
    except (OSError, ValueError):
        return None


def metadata_client(info: TestbedInfo) -> Any:
    """A connected client of the testbed's metadata store (kazoo, or the sweeper's kazoo-shaped OxiaStore); the
    caller stops it (`stop_client`)."""
    if info.on_oxia:
        from sweeper.metastore.oxia import OxiaStore

        namespace = info.metadata_store_url.rsplit("/", 1)[1]  # oxia://host:port/<namespace>
        return OxiaStore(info.oxia_address, namespace, timeout_s=15.0)
    from kazoo.client import KazooClient

    client = KazooClient(hosts=info.zookeeper, timeout=15.0)
    client.start(timeout=30)
    return client


def stop_client(client: Any) -> None:
    client.stop()
    if hasattr(client, "close"):
        client.close()


def registered_writable(client: Any, bookie: BookieInfo) -> bool:
    return client.exists(f"/ledgers/available/{bookie.bookie_id}") is not None


def serving(client: Any, bookie: BookieInfo) -> bool:
    """Registered as a writable bookie and its HTTP server says it runs writable. The HTTP server is the last
    component BookKeeper's Main.buildBookieServer starts, after the bookie registered."""
    state = bookie_state(bookie)
    return (state is not None and bool(state.get("running")) and not state.get("readOnly")
            and not state.get("shuttingDown") and registered_writable(client, bookie))


def wait_unregistered(info: TestbedInfo, bookies: list[BookieInfo], deadline: float, timeout: float) -> None:
    """Wait until none of `bookies` (none running) is registered any more: a killed bookie's registration outlives
    it until its metadata session expires. On ZooKeeper a bookie started meanwhile would wait for that itself
    (ZKRegistrationManager.checkRegNodeAndWaitExpired); on Oxia Pulsar's PulsarRegistrationManager takes the
    registration as a lock, fails at once with LockBusyException, and leaves the JVM hanging half shut down."""
    if not bookies:
        return
    client = metadata_client(info)
    try:
        while any(registered_writable(client, b) for b in bookies):
            if time.monotonic() > deadline:
                raise TestbedError(f"the registration of a bookie that is down did not expire within {timeout:.0f} s: "
                                   f"{[b.bookie_id for b in bookies if registered_writable(client, b)]}")
            time.sleep(0.2)
    finally:
        stop_client(client)


def wait_bookies_serving(info: TestbedInfo, started: dict[int, subprocess.Popen[bytes] | None], deadline: float,
                         timeout: float) -> None:
    """Wait until every bookie in `started` (index -> the process this one started, or None) serves."""
    waiting = [b for b in info.bookies if b.index in started]
    client = metadata_client(info)
    try:
        while waiting:
            waiting = [b for b in waiting if not serving(client, b)]
            for bookie in waiting:
                check_starting(started[bookie.index], Path(bookie.log_file), deadline, timeout,
                               f"bookie {bookie.index} ({bookie.bookie_id})")
            if waiting:
                time.sleep(0.5)
    finally:
        stop_client(client)


def stop_bookies(bookies: tuple[BookieInfo, ...] | list[BookieInfo], timeout: float = 30.0) -> None:
    """SIGTERM every running bookie at once (each unregisters and closes its ledger storage), SIGKILL what still
    runs after `timeout`."""
    running = [b for b in bookies if b.alive]
    for bookie in running:
        terminate(bookie.pid)
    for bookie in running:
        if not wait_gone(bookie.pid, timeout):
            kill_process(bookie.pid)


def stop_bookie_process(bookie: BookieInfo, timeout: float = 30.0) -> None:
    stop_process(bookie.pid, timeout)


def kill_bookie_process(bookie: BookieInfo) -> None:
    kill_process(bookie.pid)


def zookeeper_settings(info: TestbedInfo) -> dict[str, str]:
    """What the testbed's ZooKeeper changes in Pulsar's conf/zookeeper.conf."""
    return {
        "clientPort": str(info.zk_port),
        "clientPortAddress": "127.0.0.1",
        "dataDir": str(Path(info.home) / "data" / "zookeeper"),  # where standalone's ZooKeeper kept its data
        # No AdminServer (Jetty, 9990) and no Prometheus endpoint (8000): fixed ports that a second testbed, or
        # anything else on the machine, would collide with; ZooKeeper's own default provider serves nothing.
        "admin.enableServer": "false",
        "metricsProvider.className": "org.apache.zookeeper.metrics.impl.DefaultMetricsProvider",
    }


def spawn_zookeeper(info: TestbedInfo) -> subprocess.Popen[bytes]:
    home = Path(info.home)
    conf = home / "conf" / "zookeeper.conf"
    write_conf(Path(info.pulsar_home) / "conf" / "zookeeper.conf", conf, zookeeper_settings(info))
    env = {**os.environ, **LEAN_JVM_ENV, "PULSAR_ZK_CONF": str(conf), "PULSAR_MEM": ZOOKEEPER_MEM,
           "PULSAR_LOG_DIR": str(home / "logs"), "PULSAR_LOG_FILE": "zookeeper.log"}
    return spawn_logged([str(Path(info.pulsar_home) / "bin" / "pulsar"), "zookeeper"], env,
                        zookeeper_log(info), home)


def zookeeper_log(info: TestbedInfo) -> Path:
    return Path(info.home) / "logs" / "zookeeper.out"


def zookeeper_answers(port: int) -> bool:
    """ZooKeeper's `ruok` four-letter word (bin/pulsar whitelists them all) answered `imok`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(b"ruok")
            return sock.recv(4) == b"imok"
    except OSError:
        return False


def wait_zookeeper(info: TestbedInfo, proc: subprocess.Popen[bytes] | None, deadline: float, timeout: float) -> None:
    while not zookeeper_answers(info.zk_port):
        check_starting(proc, zookeeper_log(info), deadline, timeout, "ZooKeeper")
        time.sleep(0.3)


def bookkeeper_shell(info: TestbedInfo, *args: str, timeout: float = 120.0) -> str:
    """`bin/bookkeeper shell ARGS` against the testbed's metadata (on Oxia too: bin/bookkeeper loads Pulsar's
    `metadata-store:` drivers, PulsarMetadataBookieDriver and PulsarMetadataClientDriver). Returns its output."""
    home = Path(info.home)
    conf = home.resolve() / "conf" / "bk-shell.conf"  # absolute: the shell resolves a relative one against conf/
    conf.write_text(f"metadataServiceUri={info.bookkeeper_metadata_service_uri}\n")
    env = {**os.environ, "BOOKIE_CONF": str(conf), "BOOKIE_LOG_DIR": str(home / "logs"),
           "BOOKIE_MEM": "-Xms64m -Xmx256m", "BOOKIE_GC": "-XX:+UseSerialGC", "BOOKIE_GC_LOG": "-Xlog:disable",
           "PULSAR_EXTRA_OPTS": LEAN_JVM_ENV["PULSAR_EXTRA_OPTS"]}
    done = subprocess.run([str(Path(info.pulsar_home) / "bin" / "bookkeeper"), "shell", *args],
                          capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if done.returncode != 0:
        raise TestbedError(f"bookkeeper shell {' '.join(args)} failed ({done.returncode}): {done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def initialize_cluster(info: TestbedInfo) -> bool:
    """BookKeeper's metadata for a new cluster (`bookkeeper shell initnewcluster`), unless the store has it: a
    ZooKeeper or Oxia that already holds `/ledgers` keeps it (and the bookies' data). True when initialised.

    A new cluster instance starts with empty bookies: data an earlier `up` left under the same home carries cookies
    of the old instance, which BookieImpl would refuse (InvalidCookieException)."""
    client = metadata_client(info)
    try:
        if client.exists("/ledgers") is not None:
            return False
    finally:
        stop_client(client)
    for bookie in info.bookies:
        shutil.rmtree(bookie.data_dir, ignore_errors=True)
    bookkeeper_shell(info, "initnewcluster")
    return True
