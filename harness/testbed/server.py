"""Start, inspect and stop the real Pulsar testbed (standalone broker, three bookies, ZooKeeper or Oxia, moto S3).

Everything lives under one home directory (default `var/testbed/`): the configs this module
writes, the token secret and tokens, the metadata store's and the bookies' data, the logs, and
`testbed.json`, the state file with the ports (free loopback ports chosen at start) and PIDs.

Two flavours of metadata store (`testbed_up(metadata=...)`):
- `zookeeper` (the default): Pulsar's own ZooKeeper (`bin/pulsar zookeeper`), a process of its own;
- `oxia` (issue 24): a real `oxia standalone` server (harness.oxiaserver) with several shards, started here
  before the JVMs; broker and bookies keep all their metadata in its `default` namespace, BookKeeper through
  Pulsar's `metadata-store:` driver.
On both, three bookies, each a process of its own with its HTTP server, and the broker striping every ledger over
them (ensemble 3, write quorum 2, ack quorum 2): harness.testbed.storage says why and how. The broker is Pulsar's
standalone with `--only-broker`, so `crash` can `kill -9` it while the metadata store and the bookies live on.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from harness.lifecycle import kill_process, pid_alive, stop_process
from harness.oxiaserver import OxiaServerInfo, missing_binary_reason, oxia_binary, start_oxia, stop_oxia
from harness.s3server import S3ServerInfo, start_s3, stop_s3
from harness.testbed import storage
from harness.testbed.processes import LEAN_JVM_ENV, TestbedError, check_starting, spawn_logged, write_conf
from harness.testbed.storage import ACK_QUORUM, ENSEMBLE_SIZE, WRITE_QUORUM, BookieInfo
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

# Several shards, so the keys the broker and the bookies write spread over them and every read the sweeper makes
# proves it routes a key to the shard the server put it in (the PyPI client alone does not: sweeper.metastore.oxia).
OXIA_SHARDS = 3
OXIA_NAMESPACE = "default"  # `oxia standalone` serves this one namespace only

# One block of free loopback ports per testbed, each at a fixed offset. The first seven are where the testbed of
# one bookie had them (bookie 0 keeps offsets 1 and 5); on Oxia nothing listens on the ZooKeeper port, on
# ZooKeeper nothing on Oxia's.
ZK_OFFSET, BROKER_OFFSET, WEB_OFFSET, S3_OFFSET, OXIA_OFFSET = 0, 2, 3, 4, 6
BOOKIE_PORT_OFFSETS = ((1, 5), (7, 8), (9, 10))  # (bookiePort, httpServerPort) of bookie 0, 1, 2
PORT_BLOCK = 11


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
    # `pid` is the broker's. In a state file of before the three bookies: the standalone JVM that ran ZooKeeper and
    # the one bookie (the bookie alone on Oxia); 0 since.
    storage_pid: int = 0
    # With defaults, so a state file an older version wrote still loads (as the ZooKeeper flavour).
    metadata: str = ZOOKEEPER
    oxia_address: str = ""  # host:port of the Oxia server (flavour `oxia`)
    oxia_pid: int = 0
    # Bookie 0's HTTP server (BookKeeper's admin REST API and Prometheus /metrics, issue 35), as `bk_port` is its
    # bookie port; 0 in a state file an older version wrote (its bookie ran without one).
    bookie_http_port: int = 0
    # The bookies, each a process (harness.testbed.storage); empty in a state file of before them
    # (harness.testbed.bookie.bookies then describes the one bookie from the fields above).
    bookies: tuple[BookieInfo, ...] = ()
    zookeeper_pid: int = 0  # the ZooKeeper server (flavour `zookeeper`)

    def __post_init__(self) -> None:
        # A state file holds the bookies as JSON objects; `asdict` hands them over as dicts.
        object.__setattr__(self, "bookies", tuple(b if isinstance(b, BookieInfo) else BookieInfo(**b)
                                                  for b in self.bookies))

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
        """BookKeeper's `metadataServiceUri` for this testbed's bookies, as its clients spell it."""
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
    def oxia_home(self) -> Path:
        return Path(self.home) / "data" / "oxia"

    def superuser_token(self) -> str:
        return self.superuser_token_file.read_text().strip()

    def with_bookie(self, bookie: BookieInfo) -> TestbedInfo:
        """This testbed with `bookie` in place of the bookie of the same index (a new pid)."""
        return replace(self, bookies=tuple(bookie if b.index == bookie.index else b for b in self.bookies))


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
        # Every ledger striped over the three bookies (harness.testbed.storage), each entry on two of them, as a
        # production cluster writes (standalone.conf says 1/1/1: its one bookie).
        "managedLedgerDefaultEnsembleSize": str(ENSEMBLE_SIZE),
        "managedLedgerDefaultWriteQuorum": str(WRITE_QUORUM),
        "managedLedgerDefaultAckQuorum": str(ACK_QUORUM),
        "numIOThreads": "2",
        "numHttpServerThreads": "4",
        "numOrderedExecutorThreads": "2",
        "managedLedgerNumSchedulerThreads": "2",
        "bookkeeperNumberOfChannelsPerBookie": "1",
        **_metadata_settings(info),
    }


def _metadata_settings(info: TestbedInfo) -> dict[str, str]:
    if not info.on_oxia:
        return {}  # PulsarStandalone points the broker at its own ZooKeeper (PULSAR_STANDALONE_USE_ZOOKEEPER)
    return {
        # The broker started with --only-broker takes its store from here: PulsarStandalone applies
        # --metadata-url only where it starts the bookie (startBookieWithMetadataStore).
        "metadataStoreUrl": info.metadata_store_url,
        "configurationMetadataStoreUrl": info.metadata_store_url,
    }


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


def write_state(info: TestbedInfo) -> None:
    """Record `info` as the testbed's state (`testbed.json`): what `down`, `status` and the bookie helpers read."""
    _state_file(Path(info.home)).write_text(json.dumps(asdict(info), indent=2))


def read_state(home: str | Path) -> TestbedInfo | None:
    """The state recorded under `home` (pids as last written), whatever still runs."""
    return _previous_state(Path(home))


def testbed_up(
    home: str | Path = DEFAULT_HOME,
    pulsar_home: str | Path | None = None,
    offloaders_dir: str | Path | None = None,
    heap: str = "-Xms512m -Xmx1g -XX:MaxDirectMemorySize=512m",
    timeout: float = 240.0,
    metadata: str | None = None,
) -> TestbedInfo:
    """Start the testbed (idempotent: a running one is returned as it is).

    `metadata` is the metadata store, `zookeeper` or `oxia`; None keeps the one recorded under `home` (so a
    broker restarted after a crash comes back on the store it left), and is ZooKeeper for a new home. Where the
    metadata store and moto still run (after `crash`), only what is down is started again, on the same ports and
    data: the broker, and any bookie that was stopped or killed."""
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
    fresh = not (previous is not None and _restartable(previous, flavour))
    if not fresh:
        # A broker restart after a crash (kill -9): same ports and data; the metadata store and S3 kept running,
        # and the bookies that still run are kept.
        assert previous is not None
        info = replace(previous, pid=0, started_at=time.time())
    else:
        if previous is not None:
            testbed_down(home, previous)
        # Below the ephemeral range: the JVMs bind them seconds later, while the machine is busy connecting.
        base = free_port_block(PORT_BLOCK)
        s3 = start_s3(home / "logs", port=base + S3_OFFSET)
        bookies = storage.plan_bookies(home, flavour == OXIA,
                                       [(base + port, base + http) for port, http in BOOKIE_PORT_OFFSETS])
        info = TestbedInfo(
            home=str(home), pulsar_home=str(pulsar.resolve()), pulsar_version=version, cluster=CLUSTER_NAME,
            zk_port=0 if flavour == OXIA else base + ZK_OFFSET, bk_port=bookies[0].port,
            broker_port=base + BROKER_OFFSET, web_port=base + WEB_OFFSET, s3_endpoint=s3.endpoint, s3_pid=s3.pid,
            pid=0, offload_bucket=OFFLOAD_BUCKET, started_at=time.time(), metadata=flavour,
            oxia_address=f"127.0.0.1:{base + OXIA_OFFSET}" if flavour == OXIA else "",
            bookie_http_port=bookies[0].http_port, bookies=bookies)
    deadline = time.monotonic() + timeout
    try:
        if fresh:
            _create_bucket(info)
        info = _start_storage(info, deadline, timeout)
        conf = home / "conf" / "standalone.conf"
        write_conf(pulsar / "conf" / "standalone.conf", conf, broker_settings(info, secret_file, offloaders))
        env = {
            **os.environ,
            "PULSAR_STANDALONE_CONF": str(conf),
            **LEAN_JVM_ENV,
            "PULSAR_LOG_DIR": str(home / "logs"),
            # The jclouds `S3` driver reads ACCESS_KEY_ID / ACCESS_KEY_SECRET (JCloudBlobStoreProvider).
            "ACCESS_KEY_ID": S3_ACCESS_KEY,
            "ACCESS_KEY_SECRET": S3_SECRET_KEY,
            "PULSAR_MEM": heap,
        }
        if info.on_oxia:
            env.pop("PULSAR_STANDALONE_USE_ZOOKEEPER", None)  # it would win over --metadata-url
        else:
            # Upstream PulsarStandalone: this keeps the broker on ZooKeeper (the metadata store the standalone
            # started itself before) instead of the RocksDB one new standalones default to (PIP-117).
            env["PULSAR_STANDALONE_USE_ZOOKEEPER"] = "1"
        # The broker alone (`--only-broker`): the metadata store and the bookies are processes of their own, so a
        # broker can be killed while they live on, as in production.
        broker = spawn_logged([str(pulsar / "bin" / "pulsar"), "standalone", "--no-functions-worker",
                               "--no-stream-storage", *_store_arguments(info), "--only-broker"],
                              env, info.log_file, home)
        info = replace(info, pid=broker.pid)
        write_state(info)
        token = info.superuser_token()
        while not _ready(info, token):
            check_starting(broker, info.log_file, deadline, timeout, "the Pulsar broker")
            time.sleep(1.0)
    except BaseException:
        testbed_down(home, info)
        raise
    info.sweeper_config.write_text(sweeper_toml(info))
    return info


def _restartable(previous: TestbedInfo, flavour: str) -> bool:
    """Whether `previous` can be brought back up as it is: same flavour, the three-bookie layout, and its metadata
    store and moto still running."""
    store_alive = pid_alive(previous.oxia_pid) if previous.on_oxia else pid_alive(previous.zookeeper_pid)
    return (previous.metadata == flavour and bool(previous.bookies) and pid_alive(previous.s3_pid) and store_alive
            and not pid_alive(previous.storage_pid))


def _start_storage(info: TestbedInfo, deadline: float, timeout: float) -> TestbedInfo:
    """The metadata store (Oxia or ZooKeeper) and every bookie not running, each recorded in the state file as soon
    as it has a pid (so `down` stops it whatever happens next); BookKeeper's metadata initialised first if the store
    has none. Returns the testbed with the new pids once every bookie serves."""
    if info.on_oxia and not pid_alive(info.oxia_pid):
        oxia = start_oxia(info.oxia_home, shards=OXIA_SHARDS, port=int(info.oxia_address.rsplit(":", 1)[1]))
        info = replace(info, oxia_pid=oxia.pid)
        write_state(info)
    if not info.on_oxia and not pid_alive(info.zookeeper_pid):
        zookeeper = storage.spawn_zookeeper(info)
        info = replace(info, zookeeper_pid=zookeeper.pid)
        write_state(info)
        storage.wait_zookeeper(info, zookeeper, deadline, timeout)
    storage.initialize_cluster(info)
    down = [b for b in info.bookies if not b.alive]
    storage.wait_unregistered(info, down, deadline, timeout)  # a bookie killed before this `up` (crash, kill -9)
    started = {}
    for bookie in down:
        process = storage.spawn_bookie(info, bookie)
        started[bookie.index] = process
        info = info.with_bookie(replace(bookie, pid=process.pid))
        write_state(info)
    storage.wait_bookies_serving(info, started, deadline, timeout)
    return info


def _store_arguments(info: TestbedInfo) -> list[str]:
    """Where the standalone broker finds its metadata store."""
    home = Path(info.home)
    if not info.on_oxia:
        # PulsarStandalone (PULSAR_STANDALONE_USE_ZOOKEEPER) builds the broker's `zk:127.0.0.1:<port>` from these.
        return ["--zookeeper-port", str(info.zk_port), "--zookeeper-dir", str(home / "data" / "zookeeper")]
    # PulsarStandalone falls back to ZooKeeper, whatever --metadata-url says, when its --zookeeper-dir exists
    # ("Found existing ZooKeeper metadata"): name one that never does.
    return ["--metadata-url", info.metadata_store_url,
            "--zookeeper-dir", str(home / "data" / "oxia-flavour-has-no-zookeeper")]


def _create_bucket(info: TestbedInfo) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=info.s3_endpoint, region_name="us-east-1",
                          aws_access_key_id=S3_ACCESS_KEY, aws_secret_access_key=S3_SECRET_KEY)
    client.create_bucket(Bucket=info.offload_bucket)


def testbed_down(home: str | Path = DEFAULT_HOME, info: TestbedInfo | None = None, wipe: bool = False,
                 timeout: float = 30.0) -> bool:
    """Stop the broker, the bookies (all at once), ZooKeeper or Oxia, and moto: SIGTERM to each process group,
    SIGKILL after `timeout`. True if a JVM ran."""
    home = Path(home)
    state = _state_file(home)
    if state.exists():
        # The state file wins over a caller's copy: a broker or bookie restarted since has a new PID.
        info = TestbedInfo(**json.loads(state.read_text()))
    stopped = False
    if info is not None:
        if info.pid and pid_alive(info.pid):
            stop_process(info.pid, timeout)
            stopped = True
        # The bookies before their metadata store: one that loses its store while stopping waits on it.
        if any(b.alive for b in info.bookies):
            storage.stop_bookies(info.bookies, timeout)
            stopped = True
        for pid in (info.storage_pid, info.zookeeper_pid):
            if pid and pid_alive(pid):
                stop_process(pid, timeout)
                stopped = True
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
    bookies = [{**asdict(b), "running": b.alive, "http_url": b.http_url, "ledger_dir": str(b.ledger_dir)}
               for b in info.bookies]
    return {"running": True, "serving": _ready(info, token), **asdict(info), "bookies": bookies,
            "metadata_store_url": info.metadata_store_url, "service_url": info.service_url, "admin_url": info.admin_url,
            "sweeper_config": str(info.sweeper_config), "log": str(info.log_file)}


def testbed_crash(home: str | Path = DEFAULT_HOME) -> None:
    """kill -9 the broker (the metadata store and the bookies live on): a crash, no clean shutdown. `testbed_up`
    afterwards restarts it on the same ports and data."""
    info = running_testbed(home)
    if info is None:
        raise TestbedError(f"no testbed running under {home}")
    kill_process(info.pid)


def bookkeeper_ledgers(info: TestbedInfo, timeout: float = 120.0) -> set[int]:
    """Every ledger BookKeeper's own shell lists (`bookkeeper shell listledgers`, from the distribution)."""
    output = storage.bookkeeper_shell(info, "listledgers", timeout=timeout)
    return {int(m) for m in re.findall(r"ledgerID: (\d+)", output)}


# Their names start with "test": keep pytest from collecting (and running) them when a test imports them.
testbed_up.__test__ = False  # type: ignore[attr-defined]
testbed_down.__test__ = False  # type: ignore[attr-defined]
testbed_crash.__test__ = False  # type: ignore[attr-defined]
