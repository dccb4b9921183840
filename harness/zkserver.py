"""A throwaway standalone ZooKeeper server for the sandbox and the tests.

It runs Debian's `zookeeper` package (a real server, not a fake) on a free loopback port and
is stopped by PID. Never used against production: there the operator gives a connect string.

With `ServerSecurity` it also serves a TLS client port (Netty, client certificates required)
and SASL DIGEST-MD5 logins from a JAAS file, as a secured production ensemble would.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.lifecycle import pid_alive, stop_process

ZOOKEEPER_JAR = Path(os.environ.get("SWEEPER_ZOOKEEPER_JAR", "/usr/share/java/zookeeper.jar"))
SERVER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
JAVA_LIB = ZOOKEEPER_JAR.parent
# Debian's zookeeper.jar manifest lists netty's buffer/common/handler/transport but not the codec
# and resolver jars that NettyServerCnxnFactory (the TLS port) also loads.
NETTY_EXTRA = ("netty-codec.jar", "netty-resolver.jar", "netty-transport-native-unix-common.jar")
# Without a binding SLF4J drops every log line; a warning (a refused handshake or login) is worth keeping.
LOG_BINDING = "slf4j-simple.jar"
# Debian's libfaketime: lets the sandbox server stamp znodes with past creation times (see ServerClock).
FAKETIME_LIB = Path(os.environ.get("SWEEPER_FAKETIME_LIB", "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"))


class ZooKeeperServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class ServerSecurity:
    """A secured server: TLS on a second client port and SASL DIGEST-MD5 users.

    `keystore` is a PEM file holding the server's private key and certificate, `truststore` a PEM
    file of the CA(s) whose client certificates are accepted (ZooKeeper's X509Util reads PEM
    stores since 3.6). `sasl_users` become the JAAS `Server` section's DigestLoginModule users;
    `super_password` sets the `super` digest user (DigestAuthenticationProvider.superDigest).
    """

    keystore: str
    truststore: str
    client_auth: str = "need"  # need | want | none (ssl.clientAuth)
    sasl_users: tuple[tuple[str, str], ...] = ()
    super_password: str = ""
    require_sasl: bool = False  # sessionRequireClientSASLAuth (3.6+): unauthenticated sessions are closed
    secure_port: int | None = None


@dataclass(frozen=True)
class ZooKeeperServerInfo:
    host: str
    port: int
    pid: int
    data_dir: str
    secure_port: int | None = None  # the TLS client port, when started with ServerSecurity
    clock_file: str = ""  # set when the server runs under a ServerClock

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def secure_connect_string(self) -> str:
        if self.secure_port is None:
            raise ZooKeeperServerError("this server has no TLS client port")
        return f"{self.host}:{self.secure_port}"


    @property
    def clock(self) -> ServerClock | None:
        return ServerClock(Path(self.clock_file)) if self.clock_file else None


class ServerClock:
    """The wall clock of a sandbox ZooKeeper server, which can be set back while znodes are created.

    ZooKeeper stamps a znode's ctime with its own clock, so a seeded ledger znode would look
    created "now" whatever its metadata says; the sweeper takes a ledger's age from the later of
    the two clocks. Real ledgers' znodes are created with the ledger: to seed a faithful past, the
    server runs under libfaketime reading its offset from a file, and the seeder sets the clock
    back while it creates ledger znodes, then forward again (monotonic time, used for sessions
    and timeouts, is never faked).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def set_offset_days(self, days: float) -> None:
        spec = f"{-days:+.6f}d" if days else "+0"
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(spec + "\n")
        tmp.replace(self.path)
        # libfaketime re-reads the file on each clock call (no cache): wait for a stamp to show it.
        time.sleep(0.01)

    @contextlib.contextmanager
    def back_in_time(self, days: float) -> Iterator[None]:
        self.set_offset_days(days)
        try:
            yield
        finally:
            self.set_offset_days(0)

    def at(self, epoch_ms: int) -> contextlib.AbstractContextManager[None]:
        """The server's clock reads about `epoch_ms` (and runs on) inside the block."""
        return self.back_in_time((time.time() * 1000 - epoch_ms) / 86_400_000)


# Servers this process started, by port: seeders find the clock of the server they write to.
_clocks: dict[int, ServerClock] = {}


def clock_for(hosts: list[tuple[str, int]]) -> ServerClock | None:
    """The ServerClock of the server at `hosts` (a kazoo client's `hosts`), if it runs under one."""
    for _, port in hosts:
        if port in _clocks:
            return _clocks[port]
    return None


def super_digest(password: str, user: str = "super") -> str:
    """`user:base64(sha1(user:password))`, the form of DigestAuthenticationProvider's ids."""
    digest = hashlib.sha1(f"{user}:{password}".encode()).digest()  # ZooKeeper's digest scheme
    return f"{user}:{base64.b64encode(digest).decode()}"


def _security_settings(root: Path, host: str, security: ServerSecurity) -> tuple[int, list[str], list[str]]:
    """(secure port, zoo.cfg lines, JVM options) for a secured server."""
    secure_port = security.secure_port or free_port(host)
    lines = [
        f"secureClientPort={secure_port}",
        f"secureClientPortAddress={host}",
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
        # Unknown zoo.cfg keys become `zookeeper.<key>` system properties (QuorumPeerConfig).
        "ssl.keyStore.type=PEM",
        f"ssl.keyStore.location={security.keystore}",
        "ssl.trustStore.type=PEM",
        f"ssl.trustStore.location={security.truststore}",
        f"ssl.clientAuth={security.client_auth}",
        "ssl.hostnameVerification=false",  # the server does not check its clients' host names
    ]
    jvm: list[str] = []
    if security.sasl_users:
        jaas = root / "jaas.conf"
        users = "\n".join(f'    user_{name}="{password}"' for name, password in security.sasl_users)
        jaas.write_text(f"Server {{\n    org.apache.zookeeper.server.auth.DigestLoginModule required\n{users};\n}};\n")
        jaas.chmod(0o600)
        lines.append("authProvider.1=org.apache.zookeeper.server.auth.SASLAuthenticationProvider")
        jvm.append(f"-Djava.security.auth.login.config={jaas}")
        if security.require_sasl:
            lines.append("sessionRequireClientSASLAuth=true")
    if security.super_password:
        jvm.append(f"-Dzookeeper.DigestAuthenticationProvider.superDigest={super_digest(security.super_password)}")
    return secure_port, lines, jvm


_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, for a server started a moment later.

    Taken below the ephemeral range, as `free_port_block` is: a port the kernel handed out with bind(0)
    can be handed again to the next outgoing connection before our server binds it (CI saw the
    sandbox admin server fail with EADDRINUSE that way)."""
    return free_port_block(1, host)


PORT_RANGE_ENV = "SWEEPER_PORT_RANGE"  # "low-high": processes picking ports at once each take their own range


def port_range() -> tuple[int, int]:
    named = os.environ.get(PORT_RANGE_ENV)
    if named:
        low, high = (int(part) for part in named.split("-"))
        return low, high
    return 20000, 32000


def free_port_block(count: int, host: str = "127.0.0.1", low: int | None = None, high: int | None = None) -> int:
    """The first of `count` consecutive ports that are all free, for servers that take `port + k`.

    Chosen below Linux's ephemeral range (32768+), where the kernel never places outgoing connections:
    on a busy machine one can hold `free_port() + 1`. Two test processes (pytest-xdist workers) each pick from
    their own part of that range ($SWEEPER_PORT_RANGE): a port one has picked but not yet bound looks free
    to the other."""
    default_low, default_high = port_range()
    low, high = low if low is not None else default_low, high if high is not None else default_high
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(low, high - count)
        if _HANDED_OUT.intersection(range(base, base + count)):
            continue  # free now, but promised to a server of ours that has not bound it yet
        with contextlib.ExitStack() as stack:
            try:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind((host, port))
            except OSError:
                continue
        _HANDED_OUT.update(range(base, base + count))
        return base
    raise ZooKeeperServerError(f"no {count} consecutive free ports between {low} and {high}")


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperServerError("java not found: install a JRE (apt-get install default-jre-headless)")
    return java


def _wait_serving(host: str, port: int, proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> None:
    # `srvr` is whitelisted by default; a reply means the server accepts sessions.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ZooKeeperServerError(
                f"ZooKeeper exited with {proc.returncode} before serving; log: {log_path}\n"
                + log_path.read_text(errors="replace")[-2000:]
            )
        try:
            with socket.create_connection((host, port), timeout=0.5) as sock:
                sock.sendall(b"srvr")
                if b"Zookeeper version" in sock.recv(1024):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise ZooKeeperServerError(f"ZooKeeper on {host}:{port} not serving after {timeout:.0f}s; log: {log_path}")


def _wait_listening(host: str, port: int, proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> None:
    """The TLS port accepts connections (a handshake is the client's business)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ZooKeeperServerError(f"ZooKeeper exited with {proc.returncode}; log: {log_path}")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise ZooKeeperServerError(f"ZooKeeper TLS port {host}:{port} not listening after {timeout:.0f}s; log: {log_path}")


def start_zookeeper(
    data_dir: str | os.PathLike[str],
    port: int | None = None,
    host: str = "127.0.0.1",
    heap: str = "1g",
    timeout: float = 30.0,
    security: ServerSecurity | None = None,
    fake_clock: bool = True,
) -> ZooKeeperServerInfo:
    """Start a standalone server whose state lives in `data_dir` (kept across restarts).

    The plain `port` always serves (readiness checks, and tests of what an unauthenticated client
    sees); with `security` the TLS port serves too. With `fake_clock` (and Debian's libfaketime
    installed) the server's wall clock follows a ServerClock file, at offset zero unless a seeder
    sets it back.
    """
    if not ZOOKEEPER_JAR.exists():
        raise ZooKeeperServerError(
            f"{ZOOKEEPER_JAR} not found: install Debian's zookeeper package (apt-get install zookeeper)"
        )
    root = Path(data_dir)
    (root / "data").mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    secure_port, secure_lines, jvm_options = (
        _security_settings(root, host, security) if security else (None, [], []))
    cfg = root / "zoo.cfg"
    cfg.write_text(
        "\n".join(
            [*secure_lines,
                f"dataDir={root / 'data'}",
                f"clientPort={port}",
                f"clientPortAddress={host}",
                "tickTime=2000",
                "maxClientCnxns=0",
                "admin.enableServer=false",
                "4lw.commands.whitelist=srvr,ruok,mntr",
                # The sandbox writes up to millions of znodes: keep snapshots infrequent.
                "snapCount=500000",
                "autopurge.snapRetainCount=3",
                "autopurge.purgeInterval=1",
                # Pipelined writers exceed the default 1 MB outstanding-request limit otherwise.
                "globalOutstandingLimit=20000",
                "",
            ]
        )
    )
    log_path = root / "zookeeper.log"
    classpath = [str(ZOOKEEPER_JAR), "/etc/zookeeper/conf"]
    if security is not None:
        classpath += [str(JAVA_LIB / jar) for jar in NETTY_EXTRA if (JAVA_LIB / jar).exists()]
    if (JAVA_LIB / LOG_BINDING).exists():
        classpath.append(str(JAVA_LIB / LOG_BINDING))
        jvm_options = [*jvm_options, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn"]
    env = dict(os.environ)
    clock_file = ""
    if fake_clock and FAKETIME_LIB.exists():
        clock_path = root / "clock"
        ServerClock(clock_path).set_offset_days(0)
        clock_file = str(clock_path)
        # Wall clock only: monotonic time (sessions, timeouts) stays real. FORCE_MONOTONIC_FIX=0, or the
        # JVM's timed waits on monotonic condition variables spin (a quarter of a core for an idle server).
        env.update({"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME_TIMESTAMP_FILE": clock_file,
                    "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                    "FAKETIME_FORCE_MONOTONIC_FIX": "0"})
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen(
        [
            _java(),
            f"-Xmx{heap}",
            "-Djute.maxbuffer=16777216",
            *jvm_options,
            "-cp",
            ":".join(classpath),
            SERVER_MAIN,
            str(cfg),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    log.close()
    try:
        _wait_serving(host, port, proc, log_path, timeout)
        if secure_port is not None:
            _wait_listening(host, secure_port, proc, log_path, timeout)
    except BaseException:
        _kill(proc.pid)
        raise
    info = ZooKeeperServerInfo(host=host, port=port, pid=proc.pid, data_dir=str(root), secure_port=secure_port,
                               clock_file=clock_file)
    if info.clock is not None:
        _clocks[port] = info.clock
        if secure_port is not None:  # a seeder may reach the server through either port
            _clocks[secure_port] = info.clock
    (root / "server.json").write_text(json.dumps(asdict(info)))
    return info


def _kill(pid: int, timeout: float = 10.0) -> None:
    stop_process(pid, timeout)


def stop_zookeeper(info: ZooKeeperServerInfo) -> None:
    _clocks.pop(info.port, None)
    if info.secure_port is not None:
        _clocks.pop(info.secure_port, None)
    _kill(info.pid)
    with contextlib.suppress(FileNotFoundError):
        (Path(info.data_dir) / "server.json").unlink()


def running_server(data_dir: str | os.PathLike[str]) -> ZooKeeperServerInfo | None:
    """The server recorded in `data_dir`, if its process is still alive."""
    marker = Path(data_dir) / "server.json"
    if not marker.exists():
        return None
    info = ZooKeeperServerInfo(**json.loads(marker.read_text()))
    if not pid_alive(info.pid):
        return None
    if info.clock is not None:
        _clocks[info.port] = info.clock
        if info.secure_port is not None:
            _clocks[info.secure_port] = info.clock
    return info
