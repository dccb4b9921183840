"""Start, inspect and stop the real Pulsar testbed (standalone broker + bookie + ZooKeeper or Oxia, moto S3).

Everything lives under one home directory (default `var/testbed/`): the config this module
writes, the token secret and tokens, the metadata store's and the bookie's data, the logs, and
`testbed.json`, the state file with the ports (free loopback ports chosen at start) and PIDs.

Two flavours of metadata store (`testbed_up(metadata=...)`):
- `zookeeper` (the default): Pulsar's standalone runs ZooKeeper itself, in the storage JVM;
- `oxia` (issue 24): a real `oxia standalone` server (harness.oxiaserver) with several shards, started here
  before the JVMs; broker and bookie keep all their metadata in its `default` namespace, BookKeeper through
  Pulsar's `metadata-store:` driver.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.lifecycle import kill_process, pid_alive, stop_process
from harness.oxiaserver import OxiaServerInfo, missing_binary_reason, oxia_binary, start_oxia, stop_oxia
from harness.s3server import S3ServerInfo, start_s3, stop_s3
from harness.zkserver import free_port_block

DEFAULT_HOME = Path("var/testbed")
PULSAR_VERSION = "4.0.8"
REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_NAME = "testbed"
OFFLOAD_BUCKET = "testbed-offload"
SUPERUSER = "admin"
SWEEPER_ROLE = "ledger-sweeper"
# moto accepts any credentials; jclouds reads them from the standard AWS environment variables.
S3_ACCESS_KEY = "testbed"
S3_SECRET_KEY = "testbed-secret"
ZOOKEEPER, OXIA = "zookeeper", "oxia"
METADATA_STORES = (ZOOKEEPER, OXIA)

# Every Pulsar JVM the testbed starts (broker, bookie, the peer, the CLI tools) shares two cores with the test
# suite for the suite's whole run: C1 alone and the serial collector roughly halve what they burn starting,
# building the world and idling (measured on one testbed: 31 s -> 18 s of CPU to a built world, 10.4 s -> 5.8 s
# per idle 90 s). pulsar_env.sh's own default extra options are kept; bkenv.sh passes them on to the bookie tools.
LEAN_JVM_ENV = {
    "PULSAR_GC": "-XX:+UseSerialGC",
    "PULSAR_GC_LOG": "-Xlog:disable",
    "PULSAR_EXTRA_OPTS": "-XX:TieredStopAtLevel=1 -Dpulsar.allocator.exit_on_oom=true "
                         "-Dio.netty.recycler.maxCapacityPerThread=4096",
}

# Several shards, so the keys the broker and the bookie write spread over them and every read the sweeper makes
# proves it routes a key to the shard the server put it in (the PyPI client alone does not: sweeper.metastore.oxia).
OXIA_SHARDS = 3
OXIA_NAMESPACE = "default"  # `oxia standalone` serves this one namespace only


class TestbedError(RuntimeError):
    pass


@dataclass(frozen=True)
class TestbedInfo:
    __test__ = False  # not a pytest test class
    home: str
    pulsar_home: str
    pulsar_version: str
    cluster: str
    zk_port: int
    bk_port: int
    broker_port: int
    web_port: int
    s3_endpoint: str
    s3_pid: int
    pid: int
    offload_bucket: str
    started_at: float = field(default=0.0)
    storage_pid: int = 0  # ZooKeeper + bookie JVM (the bookie alone on Oxia); `pid` is the broker's
    # With defaults, so a state file an older version wrote still loads (as the ZooKeeper flavour).
    metadata: str = ZOOKEEPER
    oxia_address: str = ""  # host:port of the Oxia server (flavour `oxia`)
    oxia_pid: int = 0
    # The bookie's HTTP server (BookKeeper's admin REST API and Prometheus /metrics, issue 35); 0 in a state file
    # an older version wrote (its bookie ran without one).
    bookie_http_port: int = 0

    @property
    def on_oxia(self) -> bool:
        return self.metadata == OXIA

    @property
    def zookeeper(self) -> str:
        if self.on_oxia:
            # A caller that would talk ZooKeeper to an Oxia testbed is a bug to be told, not a connection refused.
            raise TestbedError("this testbed keeps its metadata in Oxia, not ZooKeeper: use metadata_for(info)")
        return f"127.0.0.1:{self.zk_port}"

    @property
    def metadata_store_url(self) -> str:
        """The brokers' `metadataStoreUrl`, in Pulsar's spelling."""
        if self.on_oxia:
            return f"oxia://{self.oxia_address}/{OXIA_NAMESPACE}"
        return f"zk:127.0.0.1:{self.zk_port}"

    @property
    def bookkeeper_metadata_service_uri(self) -> str:
        """BookKeeper's `metadataServiceUri` for this testbed's bookie, as its clients spell it."""
        if self.on_oxia:
            return f"metadata-store:{self.metadata_store_url}"
        return f"zk+hierarchical://127.0.0.1:{self.zk_port}/ledgers"

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def superuser_token_file(self) -> Path:
        return Path(self.home) / "tokens" / f"{SUPERUSER}.jwt"

    @property
    def sweeper_token_file(self) -> Path:
        return Path(self.home) / "tokens" / f"{SWEEPER_ROLE}.jwt"

    @property
    def sweeper_config(self) -> Path:
        return Path(self.home) / "sweeper.toml"

    @property
    def log_file(self) -> Path:
        return Path(self.home) / "logs" / "broker.out"

    @property
    def storage_log_file(self) -> Path:
        return Path(self.home) / "logs" / ("bookie.out" if self.on_oxia else "zookeeper-bookie.out")

    @property
    def oxia_home(self) -> Path:
        return Path(self.home) / "data" / "oxia"

    def superuser_token(self) -> str:
        return self.superuser_token_file.read_text().strip()


def default_pulsar_home(version: str = PULSAR_VERSION) -> Path:
    return REPO_ROOT / "jvm" / "target" / "pulsar" / f"apache-pulsar-{version}"


def default_offloaders_dir(version: str = PULSAR_VERSION) -> Path:
    return REPO_ROOT / "jvm" / "target" / "pulsar-offloaders" / f"apache-pulsar-offloaders-{version}" / "offloaders"


def hs256_token(secret: bytes, subject: str) -> str:
    """A JWT as Pulsar's AuthenticationProviderToken accepts it (HS256, `sub` = role, no expiry)."""
    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signing_input = b64(b'{"alg":"HS256"}') + "." + b64(json.dumps({"sub": subject}).encode())
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + b64(signature)


def broker_settings(info: TestbedInfo, secret_file: Path, offloaders_dir: Path) -> dict[str, str]:
    """The settings the testbed overrides in Pulsar's own standalone.conf (everything else: upstream defaults)."""
    home = Path(info.home)
    return {
        "clusterName": info.cluster,
        "bindAddress": "127.0.0.1",
        "advertisedAddress": "127.0.0.1",
        "brokerServicePort": str(info.broker_port),
        "webServicePort": str(info.web_port),
        "webSocketServiceEnabled": "false",
        # Topics stay until the test deletes them, and keep all their data: the tests compare every
        # message a topic held before the sweep with what it serves after.
        "brokerDeleteInactiveTopicsEnabled": "false",
        "defaultRetentionTimeInMinutes": "-1",
        "defaultRetentionSizeInMB": "-1",
        "retentionCheckIntervalInSeconds": "5",
        # Roll data and cursor ledgers quickly so a small workload makes many ledgers.
        "managedLedgerMinLedgerRolloverTimeMinutes": "0",
        "managedLedgerMaxEntriesPerLedger": "10",
        "managedLedgerCursorMaxEntriesPerLedger": "5",
        "managedLedgerCursorPositionFlushSeconds": "1",
        "managedLedgerDefaultMarkDeleteRateLimit": "0",
        # Compaction is triggered by the workload (admin REST), never by size.
        "brokerServiceCompactionThresholdInBytes": "0",
        # PIP-195: the bucket tracker keeps delayed-message indexes in bucket-snapshot ledgers.
        "delayedDeliveryEnabled": "true",
        "delayedDeliveryTrackerFactoryClassName":
            "org.apache.pulsar.broker.delayed.BucketDelayedDeliveryTrackerFactory",
        "delayedDeliveryTickTimeMillis": "100",
        "delayedDeliveryMinIndexCountPerBucket": "5",
        "delayedDeliveryMaxIndexesPerBucketSnapshotSegment": "5",
        "delayedDeliveryMaxTimeStepPerBucketSnapshotSegmentSeconds": "1",
        "transactionCoordinatorEnabled": "true",
        "systemTopicEnabled": "true",
        "topicLevelPoliciesEnabled": "true",
        # Tiered storage: the jclouds offloader against moto on loopback; BookKeeper copies are
        # deleted as soon as the offload is done. Driver `S3` (jclouds' generic S3 API), not `aws-s3`:
        # jclouds' aws-s3 provider asks s3.amazonaws.com for the bucket's region (getBucketLocation)
        # whatever the endpoint, and with no route out each call waits out 100 retries (~50 s).
        "offloadersDirectory": str(offloaders_dir),
        "managedLedgerOffloadDriver": "S3",
        # The `S3` driver reads the generic keys (the s3ManagedLedgerOffload* ones are aws-s3's).
        "managedLedgerOffloadBucket": info.offload_bucket,
        "managedLedgerOffloadServiceEndpoint": info.s3_endpoint,
        "managedLedgerOffloadRegion": "us-east-1",
        "managedLedgerOffloadDeletionLagMs": "0",
        # Token authentication (HS256 secret key); the admin role is the superuser.
        "authenticationEnabled": "true",
        "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
        "authorizationEnabled": "true",
        "superUserRoles": SUPERUSER,
        "tokenSecretKey": f"file://{secret_file.resolve()}",
        "brokerClientAuthenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        "brokerClientAuthenticationParameters": f"file://{(home / 'tokens' / f'{SUPERUSER}.jwt').resolve()}",
        # The bookie (configured from this same file by Pulsar's LocalBookkeeperEnsemble): small caches.
        "dbStorage_writeCacheMaxSizeMb": "16",
        "dbStorage_readAheadCacheMaxSizeMb": "16",
        "dbStorage_rocksDB_blockCacheSize": "16777216",
        **bookie_settings(info),
        "numIOThreads": "2",
        "numHttpServerThreads": "4",
        "numOrderedExecutorThreads": "2",
        "managedLedgerNumSchedulerThreads": "2",
        "bookkeeperNumberOfChannelsPerBookie": "1",
        **_metadata_settings(info),
    }


def bookie_settings(info: TestbedInfo) -> dict[str, str]:
    """The bookie's HTTP server, metrics, entry logs and garbage collection (issue 35: space freed, verified).

    Both flavours' bookies read them from standalone.conf: LocalBookkeeperEnsemble on ZooKeeper, and on Oxia
    PulsarStandalone 4.0.8 hands the loaded file to BKCluster as its base configuration (harness.testbed.bookie has
    what the real bookie showed)."""
    settings = {
        # BookKeeper's admin REST API (/api/v1/bookie/...) and, with the Prometheus provider, /metrics on the same
        # port: PrometheusMetricsProvider starts a server of its own only when the bookie's HTTP server is off.
        "httpServerEnabled": "true",
        "httpServerClass": "org.apache.bookkeeper.http.vertx.VertxHttpServer",
        "httpServerPort": str(info.bookie_http_port),
        "statsProviderClass": "org.apache.bookkeeper.stats.prometheus.PrometheusMetricsProvider",
        # Small entry logs that rotate after 4 MiB and are flushed within a second, so a test's orphans fill logs
        # of their own that the garbage collector can drop whole.
        "logSizeLimit": "4194304",
        "flushInterval": "1000",
        # Pulsar's bookkeeper.conf values (ServerConfiguration's own major threshold is 0.8).
        "majorCompactionThreshold": "0.5",
        "majorCompactionInterval": "86400",
        "minorCompactionThreshold": "0.2",
        "minorCompactionInterval": "3600",
        # Only a triggered GC (PUT /api/v1/bookie/gc) reclaims during a test: the tests measure what one run gave
        # back, and no test waits for the periodic collector.
        "gcWaitTime": "3600000",
    }
    if info.on_oxia:
        settings["httpServerHost"] = "127.0.0.1"
    # The ZooKeeper flavour leaves httpServerHost unset (0.0.0.0): the bookie registers its HTTP endpoint with host
    # 0.0.0.0, and the sweeper's "0.0.0.0 -> bookie host" fallback meets a real registration.
    return settings


def _metadata_settings(info: TestbedInfo) -> dict[str, str]:
    if not info.on_oxia:
        return {}  # PulsarStandalone points the broker at its own ZooKeeper (PULSAR_STANDALONE_USE_ZOOKEEPER)
    return {
        # The broker started with --only-broker takes its store from here: PulsarStandalone applies
        # --metadata-url only where it starts the bookie (startBookieWithMetadataStore).
        "metadataStoreUrl": info.metadata_store_url,
        "configurationMetadataStoreUrl": info.metadata_store_url,
        # Off ZooKeeper, PulsarStandalone's bookie (BKCluster) takes the --bookkeeper-port only when ephemeral
        # ports are allowed; otherwise it binds a random free port. (On data a previous `up` left, it keeps the
        # port its cookie names, whatever this says.)
        "allowEphemeralPorts": "true",
    }


def write_broker_conf(template: Path, target: Path, settings: dict[str, str]) -> None:
    """Pulsar's standalone.conf with `settings` replacing (or appended after) its keys."""
    remaining = dict(settings)
    lines = []
    for line in template.read_text().splitlines():
        key = line.split("=", 1)[0].strip() if "=" in line and not line.lstrip().startswith("#") else None
        if key in remaining:
            lines.append(f"{key}={remaining.pop(key)}")
        else:
            lines.append(line)
    lines.append("")
    lines.append("# ledger-sweeper testbed")
    lines.extend(f"{key}={value}" for key, value in remaining.items())
    target.write_text("\n".join(lines) + "\n")


def _store_toml(info: TestbedInfo) -> tuple[str, str]:
    """The [bookkeeper] and [pulsar] keys naming the metadata store, spelled as the testbed's own config does."""
    if info.on_oxia:
        # As bookkeeper.conf and broker.conf spell them (docs/operations.md, "Pulsar on Oxia"): one namespace holds
        # both, as it does for a standalone that does not separate them.
        return (f'metadata_service_uri = "{info.bookkeeper_metadata_service_uri}"',
                f'metadata_store_url = "{info.metadata_store_url}"')
    return f'zookeeper = "{info.zookeeper}"\nledgers_root = "/ledgers"', 'zookeeper = ""'


def sweeper_toml(info: TestbedInfo) -> str:
    home = Path(info.home).resolve()
    bookkeeper, pulsar = _store_toml(info)
    return f"""# Written by `sweeper testbed up`: the sweeper pointed at the real Pulsar testbed.
[bookkeeper]
{bookkeeper}

[pulsar]
{pulsar}
managed_ledgers_root = "/managed-ledgers"
schemas_root = "/schemas"
cluster_name = "{info.cluster}"   # the brokers' clusterName: offloaded objects carry it as pulsarClusterName

[tables]
root = "{home / 'tables'}"
engine = "delta-rs"

[safety]
min_age_hours = 168.0
force_min_age = false
max_orphan_fraction = 0.5
bookkeeper_dedicated = true   # one cluster on its own bookie

[offload]
enabled = true
endpoint_override = "{info.s3_endpoint}"
head_metadata = true

[retention]
# The testbed broker's own settings (broker_settings): retention is kept forever unless a namespace says
# otherwise, and loaded topics are trimmed every 5 s.
default_retention_minutes = -1
default_retention_size_mb = -1
check_interval_seconds = 5

[system_topic]
service_url = "{info.service_url}"
admin_url = "{info.admin_url}"
topic = "persistent://pulsar/system/__ledger_deletion"
partitions = 4
create_if_missing = true
read_in_snapshot = true
auth_token_file = "{info.superuser_token_file.resolve()}"
"""


def _state_file(home: Path) -> Path:
    return home / "testbed.json"


def running_testbed(home: str | Path = DEFAULT_HOME) -> TestbedInfo | None:
    """The testbed recorded under `home`, if its broker process is still alive."""
    state = _state_file(Path(home))
    if not state.exists():
        return None
    info = TestbedInfo(**json.loads(state.read_text()))
    return info if pid_alive(info.pid) else None


def _admin_get(info: TestbedInfo, path: str, token: str) -> tuple[int, bytes]:
    request = urllib.request.Request(info.admin_url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def _previous_state(home: Path) -> TestbedInfo | None:
    state = _state_file(home)
    return TestbedInfo(**json.loads(state.read_text())) if state.exists() else None


def _ready(info: TestbedInfo, token: str) -> bool:
    # Standalone creates public/default and pulsar/system after the broker is up: wait for both,
    # and for the transaction coordinator's assignment topic.
    status, body = _admin_get(info, "/admin/v2/namespaces/pulsar", token)
    if status != 200 or "pulsar/system" not in json.loads(body or b"[]"):
        return False
    status, body = _admin_get(info, "/admin/v2/namespaces/public", token)
    return status == 200 and "public/default" in json.loads(body or b"[]")


def log_tail(info: TestbedInfo, chars: int = 4000) -> str:
    try:
        return info.log_file.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return "(no log)"


def testbed_up(
    home: str | Path = DEFAULT_HOME,
    pulsar_home: str | Path | None = None,
    offloaders_dir: str | Path | None = None,
    heap: str = "-Xms512m -Xmx1g -XX:MaxDirectMemorySize=512m",
    storage_heap: str = "-Xms128m -Xmx384m -XX:MaxDirectMemorySize=256m",
    timeout: float = 240.0,
    metadata: str | None = None,
) -> TestbedInfo:
    """Start the testbed (idempotent: a running one is returned as it is).

    `metadata` is the metadata store, `zookeeper` or `oxia`; None keeps the one recorded under `home` (so a
    broker restarted after a crash comes back on the store it left), and is ZooKeeper for a new home."""
    if metadata is not None and metadata not in METADATA_STORES:
        raise TestbedError(f"unknown metadata store {metadata!r}: one of {', '.join(METADATA_STORES)}")
    home = Path(home).resolve()
    existing = running_testbed(home)
    if existing is not None:
        if metadata is not None and existing.metadata != metadata:
            raise TestbedError(f"a testbed on {existing.metadata} runs under {home}: stop it first "
                               "(`sweeper testbed down`)")
        return existing
    pulsar = Path(pulsar_home) if pulsar_home else default_pulsar_home()
    offloaders = Path(offloaders_dir) if offloaders_dir else default_offloaders_dir()
    if not (pulsar / "bin" / "pulsar").exists():
        raise TestbedError(f"no Pulsar distribution at {pulsar}: run `mvn -B -f jvm/pom.xml package` "
                           "(scripts/setup.sh does) to fetch it from Maven Central")
    if not any(offloaders.glob("tiered-storage-jcloud-*.nar")):
        raise TestbedError(f"no jclouds offloader NAR under {offloaders}: run `mvn -B -f jvm/pom.xml package`")
    for sub in ("conf", "tokens", "logs", "data"):
        (home / sub).mkdir(parents=True, exist_ok=True)

    secret_file = home / "tokens" / "secret.key"
    if not secret_file.exists():
        secret_file.write_bytes(secrets.token_bytes(32))
        secret_file.chmod(0o600)
    secret = secret_file.read_bytes()
    for role in (SUPERUSER, SWEEPER_ROLE):
        token_file = home / "tokens" / f"{role}.jwt"
        token_file.write_text(hs256_token(secret, role) + "\n")
        token_file.chmod(0o600)

    previous = _previous_state(home)
    flavour = metadata or (previous.metadata if previous is not None else ZOOKEEPER)
    if flavour == OXIA and oxia_binary() is None:
        raise TestbedError(missing_binary_reason())
    version = pulsar.name.removeprefix("apache-pulsar-")
    if (previous is not None and previous.metadata == flavour and pid_alive(previous.s3_pid)
            and pid_alive(previous.storage_pid) and (not previous.on_oxia or pid_alive(previous.oxia_pid))):
        # A broker restart after a crash (kill -9): same ports and data; the metadata store, the bookie and
        # S3 kept running.
        info = TestbedInfo(**{**asdict(previous), "pid": 0, "started_at": time.time()})
    else:
        if previous is not None:
            testbed_down(home, previous)
        # Below the ephemeral range: the JVM binds them seconds later, while the machine is busy connecting.
        # The sixth port is the bookie's HTTP server, the seventh Oxia's; on Oxia nothing listens on the first
        # (no ZooKeeper).
        base = free_port_block(7 if flavour == OXIA else 6)
        s3 = start_s3(home / "logs", port=base + 4)
        info = TestbedInfo(
            home=str(home), pulsar_home=str(pulsar.resolve()), pulsar_version=version, cluster=CLUSTER_NAME,
            zk_port=0 if flavour == OXIA else base, bk_port=base + 1, broker_port=base + 2, web_port=base + 3,
            s3_endpoint=s3.endpoint, s3_pid=s3.pid, pid=0, offload_bucket=OFFLOAD_BUCKET, started_at=time.time(),
            metadata=flavour, oxia_address=f"127.0.0.1:{base + 6}" if flavour == OXIA else "",
            bookie_http_port=base + 5)
    try:
        if info.on_oxia and not info.oxia_pid:
            oxia = start_oxia(info.oxia_home, shards=OXIA_SHARDS, port=int(info.oxia_address.rsplit(":", 1)[1]))
            info = TestbedInfo(**{**asdict(info), "oxia_pid": oxia.pid})
            _state_file(home).write_text(json.dumps(asdict(info), indent=2))
        conf = home / "conf" / "standalone.conf"
        write_broker_conf(pulsar / "conf" / "standalone.conf", conf, broker_settings(info, secret_file, offloaders))
        env = {
            **os.environ,
            "PULSAR_STANDALONE_CONF": str(conf),
            **LEAN_JVM_ENV,
            "PULSAR_LOG_DIR": str(home / "logs"),
            # The jclouds `S3` driver reads ACCESS_KEY_ID / ACCESS_KEY_SECRET (JCloudBlobStoreProvider).
            "ACCESS_KEY_ID": S3_ACCESS_KEY,
            "ACCESS_KEY_SECRET": S3_SECRET_KEY,
        }
        if info.on_oxia:
            env.pop("PULSAR_STANDALONE_USE_ZOOKEEPER", None)  # it would win over --metadata-url
        else:
            # Upstream PulsarStandalone: this forces the ZooKeeper metadata store (LocalBookkeeperEnsemble)
            # instead of the RocksDB one new standalones default to (PIP-117).
            env["PULSAR_STANDALONE_USE_ZOOKEEPER"] = "1"
        standalone = [str(pulsar / "bin" / "pulsar"), "standalone", "--no-functions-worker", "--no-stream-storage",
                      "--bookkeeper-port", str(info.bk_port), *_store_arguments(info)]
        deadline = time.monotonic() + timeout
        if not info.storage_pid:
            # The bookie (and ZooKeeper) in one JVM (`--no-broker`), the broker in another (`--only-broker`):
            # a broker can then be killed while the metadata store and the bookie live on, as in production.
            storage = spawn_logged([*standalone, "--no-broker"], {**env, "PULSAR_MEM": storage_heap},
                             info.storage_log_file, home)
            info = TestbedInfo(**{**asdict(info), "storage_pid": storage.pid})
            _state_file(home).write_text(json.dumps(asdict(info), indent=2))
            _wait_for_storage(info, storage, deadline, timeout)
            _create_bucket(info)
        broker = spawn_logged([*standalone, "--only-broker"], {**env, "PULSAR_MEM": heap}, info.log_file, home)
        info = TestbedInfo(**{**asdict(info), "pid": broker.pid})
        _state_file(home).write_text(json.dumps(asdict(info), indent=2))
        token = info.superuser_token()
        while not _ready(info, token):
            check_starting(broker, info, info.log_file, deadline, timeout, "the Pulsar broker")
            time.sleep(1.0)
    except BaseException:
        testbed_down(home, info)
        raise
    info.sweeper_config.write_text(sweeper_toml(info))
    return info


def _store_arguments(info: TestbedInfo) -> list[str]:
    home = Path(info.home)
    if not info.on_oxia:
        return ["--zookeeper-port", str(info.zk_port), "--zookeeper-dir", str(home / "data" / "zookeeper"),
                "--bookkeeper-dir", str(home / "data" / "bookkeeper")]
    # PulsarStandalone falls back to ZooKeeper, whatever --metadata-url says, when its --zookeeper-dir exists
    # ("Found existing ZooKeeper metadata"): name one that never does. The bookie's data is kept apart from the
    # ZooKeeper flavour's, whose cookie names another cluster.
    return ["--metadata-url", info.metadata_store_url,
            "--zookeeper-dir", str(home / "data" / "oxia-flavour-has-no-zookeeper"),
            "--bookkeeper-dir", str(home / "data" / "bookkeeper-oxia")]


def spawn_logged(command: list[str], env: dict[str, str], log_file: Path, cwd: Path) -> subprocess.Popen[bytes]:
    log = open(log_file, "ab")  # noqa: SIM115 - handed to the child process
    try:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                env=env, start_new_session=True)
    finally:
        log.close()


def check_starting(proc: subprocess.Popen[bytes], info: TestbedInfo, log_file: Path, deadline: float, timeout: float,
           what: str) -> None:
    if proc.poll() is not None:
        raise TestbedError(f"{what} exited with {proc.returncode} before serving; log {log_file}:\n"
                           f"{_tail(log_file)}")
    if time.monotonic() > deadline:
        raise TestbedError(f"{what} not serving after {timeout:.0f}s; log {log_file}:\n{_tail(log_file)}")


def _tail(log_file: Path, chars: int = 4000) -> str:
    try:
        return log_file.read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return "(no log)"


def _wait_for_storage(info: TestbedInfo, storage: subprocess.Popen[bytes], deadline: float, timeout: float) -> None:
    what = "the bookie (on Oxia)" if info.on_oxia else "ZooKeeper and the bookie"
    if not info.on_oxia:
        while not _storage_ready(info):
            check_starting(storage, info, info.storage_log_file, deadline, timeout, what)
            time.sleep(0.5)
        return
    from sweeper.metastore.oxia import OxiaStore

    store = OxiaStore(info.oxia_address, OXIA_NAMESPACE)  # up before the JVM: one client for every poll
    try:
        while not _bookie_available(store):
            check_starting(storage, info, info.storage_log_file, deadline, timeout, what)
            time.sleep(0.5)
    finally:
        store.close()


def _bookie_available(client: Any) -> bool:
    """The bookie has registered itself as available (a kazoo client or an OxiaStore)."""
    from kazoo.exceptions import NoNodeError

    try:
        return any(c != "readonly" for c in client.get_children("/ledgers/available"))
    except NoNodeError:
        return False


def _storage_ready(info: TestbedInfo) -> bool:
    """ZooKeeper answers and the bookie has registered itself as available."""
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    try:
        with socket.create_connection(("127.0.0.1", info.zk_port), timeout=0.5):
            pass
    except OSError:
        return False
    zk = KazooClient(hosts=info.zookeeper, timeout=5.0)
    try:
        zk.start(timeout=5)
    except KazooTimeoutError:
        return False
    try:
        return _bookie_available(zk)
    finally:
        zk.stop()
        zk.close()


def _create_bucket(info: TestbedInfo) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=info.s3_endpoint, region_name="us-east-1",
                          aws_access_key_id=S3_ACCESS_KEY, aws_secret_access_key=S3_SECRET_KEY)
    client.create_bucket(Bucket=info.offload_bucket)


def testbed_down(home: str | Path = DEFAULT_HOME, info: TestbedInfo | None = None, wipe: bool = False,
                 timeout: float = 30.0) -> bool:
    """Stop the broker and the storage JVM (SIGTERM to each process group, SIGKILL after `timeout`), Oxia and moto.
    True if a JVM ran."""
    home = Path(home)
    state = _state_file(home)
    if state.exists():
        # The state file wins over a caller's copy: a broker restarted after a crash has a new PID.
        info = TestbedInfo(**json.loads(state.read_text()))
    stopped = False
    if info is not None:
        if info.pid and pid_alive(info.pid):
            stop_process(info.pid, timeout)
            stopped = True
        if info.storage_pid and pid_alive(info.storage_pid):
            stop_process(info.storage_pid, timeout)
            stopped = True
        # Oxia after the JVMs: a broker or bookie that loses its store while stopping waits on it.
        if info.oxia_pid and pid_alive(info.oxia_pid):
            stop_oxia(OxiaServerInfo(info.oxia_address, info.oxia_pid, OXIA_SHARDS))
        if info.s3_pid and pid_alive(info.s3_pid):
            stop_s3(S3ServerInfo(info.s3_endpoint, info.s3_pid))
    state.unlink(missing_ok=True)
    if wipe:
        import shutil

        shutil.rmtree(home, ignore_errors=True)
    return stopped


def status(home: str | Path = DEFAULT_HOME) -> dict[str, object]:
    info = running_testbed(home)
    if info is None:
        return {"running": False, "home": str(home)}
    token = info.superuser_token()
    return {"running": True, "serving": _ready(info, token), **asdict(info),
            "metadata_store_url": info.metadata_store_url, "service_url": info.service_url, "admin_url": info.admin_url,
            "sweeper_config": str(info.sweeper_config), "log": str(info.log_file)}


def testbed_crash(home: str | Path = DEFAULT_HOME) -> None:
    """kill -9 the broker (the metadata store and the bookie live on): a crash, no clean shutdown. `testbed_up`
    afterwards restarts it on the same ports and data."""
    info = running_testbed(home)
    if info is None:
        raise TestbedError(f"no testbed running under {home}")
    kill_process(info.pid)


def bookkeeper_ledgers(info: TestbedInfo, timeout: float = 120.0) -> set[int]:
    """Every ledger BookKeeper's own shell lists (`bookkeeper shell listledgers`, from the distribution).

    On Oxia too: Pulsar's `bin/bookkeeper` loads its `metadata-store:` drivers (PulsarMetadataClientDriver)."""
    home = Path(info.home)
    conf = home.resolve() / "conf" / "bk-shell.conf"  # absolute: the shell resolves a relative one against conf/
    conf.write_text(f"metadataServiceUri={info.bookkeeper_metadata_service_uri}\n")
    env = {**os.environ, "BOOKIE_CONF": str(conf), "BOOKIE_LOG_DIR": str(home / "logs"),
           "BOOKIE_MEM": "-Xms64m -Xmx256m", "BOOKIE_GC": "-XX:+UseSerialGC", "BOOKIE_GC_LOG": "-Xlog:disable",
           "PULSAR_EXTRA_OPTS": LEAN_JVM_ENV["PULSAR_EXTRA_OPTS"]}
    done = subprocess.run([str(Path(info.pulsar_home) / "bin" / "bookkeeper"), "shell", "listledgers"],
                          capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if done.returncode != 0:
        raise TestbedError(f"bookkeeper shell listledgers failed ({done.returncode}): {done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    return {int(m) for m in re.findall(r"ledgerID: (\d+)", done.stdout + done.stderr)}


# Their names start with "test": keep pytest from collecting (and running) them when a test imports them.
testbed_up.__test__ = False  # type: ignore[attr-defined]
testbed_down.__test__ = False  # type: ignore[attr-defined]
testbed_crash.__test__ = False  # type: ignore[attr-defined]
