"""Configuration: typed, defaulted, loaded from TOML, with errors that name the bad option."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from sweeper.errors import ConfigError
from sweeper.metastore.errors import StoreUrlError
from sweeper.metastore.urls import ZOOKEEPER, StoreUrl, parse_bookkeeper_service_uri, parse_pulsar_store_url


@dataclass(frozen=True)
class ZooKeeperAccessConfig:
    """How to reach a secured ZooKeeper: TLS and authentication, per metadata store.

    Shared by [bookkeeper] and [pulsar]; secrets only by file or environment variable name
    (see sweeper.zk.security, which reads them when connecting).
    """

    tls: bool = False  # the connect string names TLS client ports (secureClientPort)
    tls_ca_file: str = ""  # PEM CA(s) to trust; empty: the system's CAs
    tls_cert_file: str = ""  # PEM client certificate (mutual TLS), with tls_key_file
    tls_key_file: str = ""
    tls_verify_hostname: bool = True  # the server certificate must name the host connected to
    sasl_mechanism: str = ""  # "" (none) | DIGEST-MD5 | GSSAPI
    sasl_username: str = ""  # DIGEST-MD5 user (JAAS DigestLoginModule user_<name>)
    sasl_password_file: str = ""  # DIGEST-MD5 password: a file holding it
    sasl_password_env: str = ""  # or the name of an environment variable holding it
    sasl_principal: str = ""  # GSSAPI: the client principal, e.g. ledger-sweeper@EXAMPLE.COM
    sasl_keytab: str = ""  # GSSAPI: its keytab (exported as KRB5_CLIENT_KTNAME)
    sasl_service: str = "zookeeper"  # GSSAPI: the servers' principal name (zookeeper/<host>@REALM)
    digest_auth_file: str = ""  # `digest` scheme credentials (addauth): a file holding "user:password"
    digest_auth_env: str = ""  # or the name of an environment variable holding them


@dataclass(frozen=True)
class BookKeeperConfig(ZooKeeperAccessConfig):
    zookeeper: str = "127.0.0.1:2181"  # may carry a chroot: host:port/chroot
    ledgers_root: str = "/ledgers"
    session_timeout_s: float = 15.0
    # bookkeeper.conf's metadataServiceUri, copied as is: zk+hierarchical://zk1:2181;zk2:2181/ledgers or
    # metadata-store:oxia://host:6648/namespace. Set, it stands for `zookeeper` and `ledgers_root`.
    metadata_service_uri: str = ""

    @property
    def writes_layout_record(self) -> bool:
        """Whether the bookies' metadata driver records the ledger layout in `<ledgers root>/LAYOUT`. BookKeeper's
        own ZooKeeper drivers do; Pulsar's `metadata-store:` driver never does, on any store: its
        `PulsarLedgerManagerFactory` neither formats nor stores a layout (`format` is empty), and its
        `PulsarLedgerManager` always keeps ledgers at the hybrid hierarchical paths."""
        return not self.metadata_service_uri.strip().startswith("metadata-store:")


@dataclass(frozen=True)
class PulsarMetadataConfig(ZooKeeperAccessConfig):
    # Access options here apply when `zookeeper` names another ensemble; else [bookkeeper]'s do.
    zookeeper: str = ""  # empty: same ensemble as BookKeeper
    managed_ledgers_root: str = "/managed-ledgers"
    schemas_root: str = "/schemas"
    # This cluster's name (the brokers' `clusterName`): offloaded objects carry it as `pulsarClusterName`,
    # and objects of any other cluster sharing the bucket are never candidates. Required with offload.
    cluster_name: str = ""
    configuration_store: str = ""  # connect string of the configuration store; empty: the metadata store
    # broker.conf's metadataStoreUrl / configurationMetadataStoreUrl, copied as is: zk:zk1:2181/chroot or
    # oxia://host:6648/namespace. Set, they stand for `zookeeper` / `configuration_store`.
    metadata_store_url: str = ""
    configuration_metadata_store_url: str = ""
    policies_root: str = "/admin/policies"  # namespace policies in the configuration store
    brokers_path: str = "/loadbalance/brokers"  # where live brokers register (ephemeral znodes)


@dataclass(frozen=True)
class TablesConfig:
    root: str = "var/tables"  # a path, or s3://bucket/prefix (s3a:// too); see sweeper.tables.storage
    engine: str = "auto"  # auto | delta-rs | delta-spark
    # For a root on S3: an S3-compatible endpoint for its bucket (empty: AWS) and the region.
    # Credentials never go here: each process takes them from the usual chain (environment,
    # profile, instance role; Hadoop's chain for s3a).
    s3_endpoint: str = ""
    s3_region: str = ""


@dataclass(frozen=True)
class SparkConfig:
    master: str = ""  # empty: local[*], or whatever spark-submit set
    scan_partitions: int = 0  # 0: one per 25,000 znodes planning saw, at most 4 x default parallelism
    app_name: str = "ledger-sweeper"


@dataclass(frozen=True)
class ScanConfig:
    window: int = 2000  # ZooKeeper reads in flight per task
    multi_read: int = 100  # reads per request (multiRead, ZooKeeper >= 3.6); 1 for older servers
    chunk: int = 2000  # managed ledgers / schemas per scan unit
    # Load on the ensemble (docs/benchmarks.md, "ZooKeeper impact"): reads per second for the whole
    # scan, shared by its tasks (0: unlimited), and at most this many scan sessions at once.
    reads_per_second: float = 20000.0
    max_sessions: int = 8


@dataclass(frozen=True)
class OffloadConfig:
    enabled: bool = True  # list the tiered-storage buckets named in the offload contexts
    endpoint_override: str = ""  # an S3-compatible endpoint for every bucket (empty: as recorded by Pulsar)
    extra_buckets: str = ""  # comma-separated buckets to list as well (e.g. from an older offloader config)
    region: str = ""  # for extra buckets
    head_metadata: bool = True  # read each object's user metadata (managedledgername) for reports


@dataclass(frozen=True)
class SafetyConfig:
    min_age_hours: float = 168.0  # grace period; under 24 h only with force_min_age
    force_min_age: bool = False
    max_orphan_fraction: float = 0.10  # circuit breaker over Pulsar ledgers
    allow: str = ""  # comma-separated tenant or tenant/namespace globs; empty: everything
    deny: str = ""  # comma-separated globs; deny wins over allow
    # BookKeeper ledger metadata names no cluster: unless no other Pulsar cluster uses these bookies,
    # ledgers of namespaces this cluster does not know are `unknown` (namespace_unknown), never orphans.
    bookkeeper_dedicated: bool = False
    # With bookkeeper_dedicated = false: the Pulsar metadata store of every other cluster writing to these bookies,
    # in [pulsar] zookeeper's spelling ("zk1:2181,zk2:2181/peer-chroot"), reached with the same TLS/SASL settings
    # as [pulsar]'s store. A ledger is an orphan only when no cluster references it; without this list (or with a
    # peer unreadable) no ledger is a candidate on a shared BookKeeper.
    peer_metadata: tuple[str, ...] = ()
    max_clock_skew_seconds: float = 300.0  # this host's clock against ZooKeeper's, checked at snapshot and delete
    clock_probe_path: str = "/ledger-sweeper/clock"  # an ephemeral znode is created here to read ZooKeeper's clock
    # A PIP-454 migration flag in its own target store saying PREPARATION or COPYING may be the copy the migration
    # made of it: true confirms that the source's flag says COMPLETED (sweeper.metastore.migration).
    acknowledge_migration_completed: bool = False
    # The store that migration copied from, in broker.conf's metadataStoreUrl spelling ("zk:zk1:2181/chroot"),
    # reached with [pulsar]'s access settings; required with acknowledge_migration_completed, which holds only
    # while this store's flag reads COMPLETED with a targetUrl naming [pulsar]'s store (a FAILED migration leaves
    # the target a partial copy).
    migration_source_store: str = ""


@dataclass(frozen=True)
class GatesConfig:
    max_drop_fraction: float = 0.5  # a table shrinking more than this against the last good run stops the run
    allow_empty: bool = False  # an empty ledger snapshot is suspicious unless said otherwise
    # Is this metadata live? Brokers registered, and managed ledgers changing as recently as ledgers are made.
    require_live_brokers: bool = True  # `--allow-no-brokers` lets a cleanup run proceed with brokers down
    max_metadata_lag_minutes: float = 60.0  # newest data-ledger creation vs newest managed-ledger change
    allow_offload_listing_errors: bool = False  # a bucket (or part of one) that could not be listed stops the run
    # Ledgers Pulsar references that the BookKeeper snapshot does not hold: a healthy cluster misses a handful (the
    # missing-ledger report); many mean a wrong ledgers_root or chroot, or another cluster's store given as ours.
    max_missing_reference_fraction: float = 0.02
    missing_reference_allowance: int = 10  # this many missing references never refuse a run, whatever the fraction
    # A snapshot of at most this many gated rows (ledgers, managed ledgers, cursors, schemas, quarantine) is
    # validated on the driver; a larger one with Spark jobs. The checks are the same either way. "auto": as many
    # as a quarter of the memory the driver's process can still get holds (sweeper.reconcile.gates.driver_row_limit).
    driver_rows: int | str = "auto"


@dataclass(frozen=True)
class SystemTopicConfig:
    """PIP-186's pending-delete topic and how to reach the broker; secrets only by file or env name."""

    service_url: str = ""  # pulsar:// or pulsar+ssl://; empty: no emit, no pending-delete snapshot
    admin_url: str = ""  # http(s):// admin REST endpoint, used to read and create the partitioned topic
    topic: str = "persistent://pulsar/system/__ledger_deletion"
    partitions: int = 4
    create_if_missing: bool = True
    read_in_snapshot: bool = True  # snapshot reads the topic into `pending_deletes` (a reader, never acks)
    auth_token_file: str = ""  # a file holding the token (the token itself never goes in the config)
    auth_token_env: str = ""  # or the name of an environment variable holding it
    tls_trust_certs_file: str = ""
    tls_allow_insecure: bool = False
    tls_validate_hostname: bool = True
    tls_cert_file: str = ""  # mTLS client certificate and key
    tls_key_file: str = ""
    operation_timeout_s: int = 30
    send_timeout_ms: int = 30000
    batch_max_messages: int = 1000
    batch_max_bytes: int = 128 * 1024
    max_pending_messages: int = 2000  # bounded in-flight sends per producer
    max_record_bytes: int = 1 << 20  # larger records are reported (emitted status refused_oversize), never sent
    records_per_producer: int = 50000  # one producer (and one Spark task) per this many records of a partition


@dataclass(frozen=True)
class DeleteConfig:
    """Phase 2. There is deliberately no `execute` option: deleting takes `--execute` on the command line."""

    max_deletes_per_run: int = 10000  # records beyond this wait for the next run (reported as deferred)
    deletes_per_second: float = 200.0  # per Spark task, so ZooKeeper and the bookies are not flooded
    batch_size: int = 100  # ledgers per ZooKeeper multi (compare-and-set deletes)
    tasks: int = 0  # Spark tasks (0: 2 x default parallelism, at most one per 1000 records)
    max_attempts: int = 10  # then the record goes to dead_letter
    in_task_attempts: int = 3  # retries with back-off inside a task before queueing for a later run
    retry_after_s: int = 300  # when a queued record is due again
    lock_path: str = "/ledger-sweeper/locks/delete"  # ephemeral znode: one delete run at a time
    subscription: str = "ledger-sweeper-delete"  # Shared subscription for `sweeper delete --from-topic`
    op_timeout_s: float = 10.0


@dataclass(frozen=True)
class RetentionConfig:
    """Retention debt (issue 15): inactive topics whose retention never runs, idle cursors pinning ledgers.

    The broker settings below must match broker.conf: they are what Pulsar applies when a namespace
    sets no policy of its own. Deleting subscriptions is off unless `cursor_idle_days` is set, and
    nothing is ever repaired without `--execute` on the command line (there is no `execute` option).
    """

    default_retention_minutes: int = 0  # broker.conf defaultRetentionTimeInMinutes (-1: infinite)
    default_retention_size_mb: int = 0  # broker.conf defaultRetentionSizeInMB (-1: infinite)
    default_ttl_seconds: int = 0  # broker.conf ttlDurationDefaultInSeconds (0: no TTL)
    check_interval_seconds: int = 120  # broker.conf retentionCheckIntervalInSeconds
    expiry_check_minutes: int = 5  # broker.conf messageExpiryCheckIntervalInMinutes (TTL runs this often)
    cursor_rollover_seconds: int = 14400  # broker.conf managedLedgerCursorRolloverTimeInSeconds
    # A topic counts as unloaded once its trimmable ledgers waited two retention checks plus this margin (the
    # broker's trim and its metadata write); larger is more cautious.
    untrimmed_margin_seconds: int = 60
    # Topic-level policies live in each namespace's __change_events system topic. "system_topic": ZooKeeper's
    # evidence of whether that topic holds any event; topics of a namespace whose events cannot be ruled out
    # are `unknown`. "admin": those topics' topic-level retention/TTL are asked of the broker
    # ([system_topic] admin_url), only for topics whose bundle a live broker owns (the lookup behind the call
    # then acquires nothing and loads no topic); the rest stay `unknown`. "none": the brokers run with
    # topicLevelPoliciesEnabled=false (or nobody sets topic-level retention or TTL).
    topic_policies: str = "system_topic"
    bundle_owners_root: str = "/namespace"  # modular load manager's bundle ownership (ephemeral znodes)
    report_idle_days: float = 7.0  # a cursor without acknowledgements this long is reported as idle
    cursor_idle_days: float = 0.0  # delete subscriptions idle longer than this; 0: never (the default)
    force_cursor_idle: bool = False  # allows cursor_idle_days under 1 (tests against a real broker)
    allow: str = ""  # tenant or tenant/namespace globs for repairs; empty: [safety] allow applies
    deny: str = ""  # added to [safety] deny
    actions_per_second: float = 2.0  # admin REST calls per second while repairing
    max_actions_per_run: int = 1000  # repairs beyond this wait for the next run (reported as deferred)
    plan_max_age_hours: float = 24.0  # `retention --execute` refuses a plan older than this
    # Added to what Pulsar itself protects (sweeper.rules.protection): never deleted, trimmed or loaded by a repair, and
    # their cursor ledgers never deleted. Globs on the subscription name, and on tenant/namespace/topic.
    protected_subscriptions: str = ""
    protected_topics: str = ""


@dataclass(frozen=True)
class MetricsConfig:
    textfile: str = ""  # e.g. /var/lib/node_exporter/textfile/ledger_sweeper.prom (written atomically)
    pushgateway_url: str = ""  # e.g. http://pushgateway:9091
    job: str = "ledger_sweeper"


@dataclass(frozen=True)
class ReclaimConfig:
    """What the bookies give back after a delete (issue 35): measured around every executed delete, a GC
    triggered only when asked. Deleting a ledger's metadata frees no disk by itself: each bookie's garbage
    collector drops an entry log once all its ledgers are gone, and a compaction rewrites logs shared with live
    data."""

    enabled: bool = True  # sample the bookies' counters before and after an executed delete (read-only)
    trigger_gc: bool = False  # with `sweep --execute`: PUT /api/v1/bookie/gc to the bookies that held deleted data
    compaction: str = "minor"  # what a triggered GC may run: none (deletion only) | minor | major
    # "<bookie id>=<base URL>" per bookie: overrides or completes the registration (legacy bookies without service
    # info, a proxy in front of the bookies); "*=<URL with {host}>" applies to every bookie without an entry.
    http_urls: tuple[str, ...] = ()
    http_port: int = 0  # a registration without an httpserver endpoint: the bookie id's host with this port
    # "https": reach the bookies over TLS (httpServerTlsEnable). Registrations always say "http" whatever the server
    # serves (BookKeeper's HttpService.publishInfo), so this applies to them and to http_port alike.
    http_scheme: str = "http"
    auth_token_file: str = ""  # a file holding a token sent as "<auth_header>: Bearer <token>" (a proxy's)
    auth_header: str = "Authorization"
    tls_ca_file: str = ""  # PEM CA(s) for https:// bookie URLs; empty: the system's
    tls_cert_file: str = ""  # mutual TLS, with tls_key_file
    tls_key_file: str = ""
    tls_verify_hostname: bool = True
    timeout_s: float = 10.0  # per HTTP call, the whole answer; a bookie that does not answer is not_measured
    max_body_bytes: int = 8 * 1024 * 1024  # a longer answer is refused (a bookie's /metrics is ~100 KB)
    deadline_s: float = 1800.0  # the whole reclaim step: bookies not reached by then are not_measured
    calls_per_second: float = 10.0  # HTTP calls per second over all bookies (a sample is five calls)
    gc_timeout_s: float = 600.0  # how long to wait for one bookie's triggered GC to finish
    gc_poll_s: float = 2.0
    freed_fraction: float = 0.9  # freed >= this share of the expected bytes: verdict "freed"


@dataclass(frozen=True)
class SweeperConfig:
    bookkeeper: BookKeeperConfig = field(default_factory=BookKeeperConfig)
    pulsar: PulsarMetadataConfig = field(default_factory=PulsarMetadataConfig)
    tables: TablesConfig = field(default_factory=TablesConfig)
    spark: SparkConfig = field(default_factory=SparkConfig)
    scan: ScanConfig = field(default_factory=ScanConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    gates: GatesConfig = field(default_factory=GatesConfig)
    system_topic: SystemTopicConfig = field(default_factory=SystemTopicConfig)
    delete: DeleteConfig = field(default_factory=DeleteConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    reclaim: ReclaimConfig = field(default_factory=ReclaimConfig)

    @property
    def pulsar_zookeeper(self) -> str:
        return self.pulsar.zookeeper or self.bookkeeper.zookeeper

    def zookeeper_access(self, store: str) -> tuple[str, ZooKeeperAccessConfig]:
        """The section whose TLS / SASL / digest settings reach `store` ("bookkeeper" or "pulsar"), with its name:
        [pulsar]'s own when [pulsar] zookeeper names an ensemble, else [bookkeeper]'s (the same ensemble, the same
        login; `validate_zookeeper_access` refuses [pulsar] access options without it)."""
        if store == "pulsar" and self.pulsar.zookeeper:
            return "pulsar", self.pulsar
        if store not in ("bookkeeper", "pulsar"):
            raise ValueError(f"no ZooKeeper access settings for store {store!r}")
        return "bookkeeper", self.bookkeeper

    def bookkeeper_store(self) -> StoreUrl:
        """Where BookKeeper's ledger metadata is: a ZooKeeper (with chroot) or an Oxia namespace."""
        if self.bookkeeper.metadata_service_uri:
            return parse_bookkeeper_service_uri(self.bookkeeper.metadata_service_uri)
        return StoreUrl(ZOOKEEPER, self.bookkeeper.zookeeper, ledgers_root=self.bookkeeper.ledgers_root)

    def pulsar_store(self) -> StoreUrl:
        """Where Pulsar's metadata is; unset, the same store as BookKeeper's (a broker that does not separate
        them keeps BookKeeper's metadata in its own store)."""
        if self.pulsar.metadata_store_url:
            return parse_pulsar_store_url(self.pulsar.metadata_store_url)
        if self.pulsar.zookeeper:
            return StoreUrl(ZOOKEEPER, self.pulsar.zookeeper)
        bookkeeper = self.bookkeeper_store()
        return StoreUrl(bookkeeper.kind, bookkeeper.hosts, bookkeeper.namespace)

    def configuration_store_url(self) -> StoreUrl | None:
        if self.pulsar.configuration_metadata_store_url:
            return parse_pulsar_store_url(self.pulsar.configuration_metadata_store_url)
        return StoreUrl(ZOOKEEPER, self.pulsar.configuration_store) if self.pulsar.configuration_store else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    def replace(self, **sections: dict[str, Any]) -> SweeperConfig:
        """A copy with some options changed: `cfg.replace(tables={"root": "/tmp/t"})`."""
        merged = self.to_dict()
        for section, values in sections.items():
            if section not in merged:
                raise ConfigError(f"unknown config section [{section}]")
            merged[section] = {**merged[section], **values}
        return from_dict(merged)


def _coerce(section: str, key: str, value: Any, expected: Any) -> Any:
    if expected == tuple[str, ...]:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"[{section}] {key} must be a list of strings, got {type(value).__name__} {value!r}")
        return tuple(value)
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(expected, True)
    if not ok:
        raise ConfigError(f"[{section}] {key} must be {expected.__name__}, got {type(value).__name__} {value!r}")
    return float(value) if expected is float else value


def from_dict(data: dict[str, Any]) -> SweeperConfig:
    sections: dict[str, Any] = {}
    hints = get_type_hints(SweeperConfig)
    for name, values in data.items():
        if name not in hints:
            raise ConfigError(f"unknown config section [{name}]; known: {', '.join(sorted(hints))}")
        if not isinstance(values, dict):
            raise ConfigError(f"[{name}] must be a table of options")
        cls = hints[name]
        field_types = get_type_hints(cls)
        kwargs = {}
        for key, value in values.items():
            if key == "execute":
                raise ConfigError(f"[{name}] execute: deleting is never switched on by a config file; pass "
                                  "--execute on the command line")
            if key in ("auth_token", "token", "password", "secret_key", "sasl_password", "digest_auth"):
                option = "auth_token" if key in ("auth_token", "token", "password", "secret_key") else key
                raise ConfigError(f"[{name}] {key}: secrets never go in the config file; name a file "
                                  f"({option}_file) or an environment variable ({option}_env) instead")
            if key not in field_types:
                raise ConfigError(f"unknown option [{name}] {key}; known: {', '.join(sorted(field_types))}")
            kwargs[key] = _coerce(name, key, value, field_types[key])
        sections[name] = cls(**kwargs)
    config = resolve_store_urls(SweeperConfig(**sections))
    validate(config)
    return config


_DEFAULT_ZOOKEEPER = BookKeeperConfig.zookeeper


def resolve_store_urls(config: SweeperConfig) -> SweeperConfig:
    """Pulsar's and BookKeeper's own address spellings, turned into the options the stages read: a ZooKeeper URL
    fills `zookeeper` (and the ledgers root), an Oxia one empties it, so nothing reaches a ZooKeeper by default.

    An address given both ways must agree; a config that says two different things is refused, not guessed.
    """
    bookkeeper, pulsar = config.bookkeeper, config.pulsar

    def parsed(key: str, parse: Callable[[str], StoreUrl], text: str) -> StoreUrl:
        try:
            return parse(text)
        except StoreUrlError as exc:
            raise ConfigError(f"{key}: {exc}") from None

    if bookkeeper.metadata_service_uri:
        url = parsed("[bookkeeper] metadata_service_uri", parse_bookkeeper_service_uri,
                     bookkeeper.metadata_service_uri)
        hosts = "" if url.is_oxia else url.hosts
        if bookkeeper.zookeeper not in ("", _DEFAULT_ZOOKEEPER, hosts):
            raise ConfigError("[bookkeeper] metadata_service_uri and zookeeper name different stores: keep one")
        if bookkeeper.ledgers_root not in (BookKeeperConfig.ledgers_root, url.ledgers_root):
            raise ConfigError(f"[bookkeeper] ledgers_root {bookkeeper.ledgers_root} disagrees with "
                              f"metadata_service_uri, whose ledgers root is {url.ledgers_root}: keep one")
        bookkeeper = dataclasses.replace(bookkeeper, zookeeper=hosts, ledgers_root=url.ledgers_root)
    if pulsar.metadata_store_url:
        url = parsed("[pulsar] metadata_store_url", parse_pulsar_store_url, pulsar.metadata_store_url)
        hosts = "" if url.is_oxia else url.hosts
        if pulsar.zookeeper not in ("", hosts):
            raise ConfigError("[pulsar] metadata_store_url and zookeeper name different stores: keep one")
        pulsar = dataclasses.replace(pulsar, zookeeper=hosts)
    if pulsar.configuration_metadata_store_url:
        url = parsed("[pulsar] configuration_metadata_store_url", parse_pulsar_store_url,
                     pulsar.configuration_metadata_store_url)
        hosts = "" if url.is_oxia else url.hosts
        if pulsar.configuration_store not in ("", hosts):
            raise ConfigError("[pulsar] configuration_metadata_store_url and configuration_store name different "
                              "stores: keep one")
        pulsar = dataclasses.replace(pulsar, configuration_store=hosts)
    for peer in config.safety.peer_metadata:
        parsed("[safety] peer_metadata", parse_pulsar_store_url, peer)  # checked here rather than at use
    if config.safety.migration_source_store:
        parsed("[safety] migration_source_store", parse_pulsar_store_url, config.safety.migration_source_store)
    elif config.safety.acknowledge_migration_completed:
        raise ConfigError("[safety] acknowledge_migration_completed = true needs [safety] migration_source_store: "
                          "the store the PIP-454 migration copied from (broker.conf's old metadataStoreUrl), whose "
                          "flag must read COMPLETED")
    return dataclasses.replace(config, bookkeeper=bookkeeper, pulsar=pulsar)


SASL_MECHANISMS = ("", "DIGEST-MD5", "GSSAPI")


def validate_zookeeper_access(config: SweeperConfig) -> None:
    """[bookkeeper] / [pulsar] TLS and authentication options: complete, and secrets never inline."""
    stores = [("bookkeeper", config.bookkeeper)]
    if config.pulsar.zookeeper:
        stores.append(("pulsar", config.pulsar))
    elif any(getattr(config.pulsar, f.name) != f.default for f in dataclasses.fields(ZooKeeperAccessConfig)):
        raise ConfigError("[pulsar] TLS / SASL / digest options need [pulsar] zookeeper set; with it empty the "
                          "Pulsar metadata is read with [bookkeeper]'s connection settings")
    for name, access in stores:
        if access.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"[{name}] sasl_mechanism must be one of DIGEST-MD5, GSSAPI (or empty), got "
                              f"{access.sasl_mechanism!r}")
        if bool(access.tls_cert_file) != bool(access.tls_key_file):
            raise ConfigError(f"[{name}] tls_cert_file and tls_key_file go together (mutual TLS)")
        if (access.tls_ca_file or access.tls_cert_file) and not access.tls:
            raise ConfigError(f"[{name}] tls_* files are set but tls = false: set tls = true (and use the "
                              "servers' secureClientPort in the connect string)")
        for secret in ("sasl_password", "digest_auth"):
            if getattr(access, f"{secret}_file") and getattr(access, f"{secret}_env"):
                raise ConfigError(f"[{name}] set {secret}_file or {secret}_env, not both")
        has_password = bool(access.sasl_password_file or access.sasl_password_env)
        if access.sasl_mechanism == "DIGEST-MD5" and not (access.sasl_username and has_password):
            raise ConfigError(f"[{name}] sasl_mechanism DIGEST-MD5 needs sasl_username and sasl_password_file or "
                              "sasl_password_env")
        if access.sasl_mechanism == "GSSAPI" and not access.sasl_principal:
            raise ConfigError(f"[{name}] sasl_mechanism GSSAPI needs sasl_principal (and usually sasl_keytab)")
        if not access.sasl_mechanism and (access.sasl_username or has_password or access.sasl_keytab):
            raise ConfigError(f"[{name}] sasl_* options are set but sasl_mechanism is empty")


def validate(config: SweeperConfig) -> None:
    validate_zookeeper_access(config)
    if config.tables.engine not in ("auto", "delta-rs", "delta-spark"):
        raise ConfigError(f"[tables] engine must be auto, delta-rs or delta-spark, got {config.tables.engine!r}")
    if config.tables.s3_endpoint and not config.tables.s3_endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"[tables] s3_endpoint must be an http(s) URL, got {config.tables.s3_endpoint!r}")
    for section, key, path in (
        ("bookkeeper", "ledgers_root", config.bookkeeper.ledgers_root),
        ("pulsar", "managed_ledgers_root", config.pulsar.managed_ledgers_root),
        ("pulsar", "schemas_root", config.pulsar.schemas_root),
        ("pulsar", "policies_root", config.pulsar.policies_root),
        ("pulsar", "brokers_path", config.pulsar.brokers_path),
        ("safety", "clock_probe_path", config.safety.clock_probe_path),
    ):
        if not path.startswith("/") or path == "/":
            raise ConfigError(f"[{section}] {key} must be an absolute znode path other than '/', got {path!r}")
    if config.scan.window < 1 or config.scan.chunk < 1 or config.scan.multi_read < 1:
        raise ConfigError("[scan] window, chunk and multi_read must be positive")
    if config.scan.reads_per_second < 0 or config.scan.max_sessions < 1:
        raise ConfigError("[scan] reads_per_second must be >= 0 (0: unlimited) and max_sessions positive")
    if not 0 < config.safety.max_orphan_fraction <= 1:
        raise ConfigError("[safety] max_orphan_fraction must be in (0, 1]")
    if config.safety.max_clock_skew_seconds <= 0:
        raise ConfigError("[safety] max_clock_skew_seconds must be positive")
    if config.gates.max_metadata_lag_minutes <= 0:
        raise ConfigError("[gates] max_metadata_lag_minutes must be positive")
    if config.safety.min_age_hours < 24 and not config.safety.force_min_age:
        raise ConfigError("[safety] min_age_hours under 24 needs force_min_age = true")
    if not 0 <= config.gates.max_drop_fraction <= 1:
        raise ConfigError("[gates] max_drop_fraction must be in [0, 1]")
    if not 0 <= config.gates.max_missing_reference_fraction <= 1 or config.gates.missing_reference_allowance < 0:
        raise ConfigError("[gates] max_missing_reference_fraction must be in [0, 1] and missing_reference_allowance "
                          ">= 0")
    rows = config.gates.driver_rows
    if rows != "auto" and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 0):
        raise ConfigError(f'[gates] driver_rows must be "auto" or a number >= 0 (0: always validate with Spark '
                          f"jobs), got {rows!r}")
    for peer in config.safety.peer_metadata:
        if not peer.strip() or peer.strip() in (config.pulsar_zookeeper, config.bookkeeper.zookeeper):
            raise ConfigError(f"[safety] peer_metadata entry {peer!r} is empty or names this cluster's own metadata "
                              "store: list only the other clusters' stores")
    if config.safety.peer_metadata and config.safety.bookkeeper_dedicated:
        raise ConfigError("[safety] peer_metadata lists other clusters on these bookies, but bookkeeper_dedicated = "
                          "true says there are none: set one or the other")
    topic = config.system_topic
    if topic.service_url and not topic.service_url.startswith(("pulsar://", "pulsar+ssl://")):
        raise ConfigError(f"[system_topic] service_url must start with pulsar:// or pulsar+ssl://, got "
                          f"{topic.service_url!r}")
    if topic.admin_url and not topic.admin_url.startswith(("http://", "https://")):
        raise ConfigError(f"[system_topic] admin_url must start with http:// or https://, got {topic.admin_url!r}")
    if not topic.topic.startswith("persistent://") or topic.topic.count("/") != 4:
        raise ConfigError(f"[system_topic] topic must be persistent://tenant/namespace/name, got {topic.topic!r}")
    if "-partition-" in topic.topic:
        raise ConfigError("[system_topic] topic must name the partitioned topic, not one of its partitions")
    for key in ("partitions", "batch_max_messages", "batch_max_bytes", "max_pending_messages", "records_per_producer",
                "max_record_bytes",
                "operation_timeout_s", "send_timeout_ms"):
        if getattr(topic, key) < 1:
            raise ConfigError(f"[system_topic] {key} must be positive")
    if topic.auth_token_file and topic.auth_token_env:
        raise ConfigError("[system_topic] set auth_token_file or auth_token_env, not both")
    if config.metrics.pushgateway_url and not config.metrics.pushgateway_url.startswith(("http://", "https://")):
        raise ConfigError(f"[metrics] pushgateway_url must be an http(s) URL, got {config.metrics.pushgateway_url!r}")
    if not config.metrics.job or "/" in config.metrics.job:
        raise ConfigError("[metrics] job must be a non-empty name without '/'")
    d = config.delete
    if d.max_deletes_per_run < 0 or d.deletes_per_second <= 0 or d.batch_size < 1 or d.tasks < 0:
        raise ConfigError("[delete] max_deletes_per_run must be >= 0; deletes_per_second and batch_size positive; "
                          "tasks >= 0")
    if d.max_attempts < 1 or not 1 <= d.in_task_attempts <= d.max_attempts or d.retry_after_s < 0:
        raise ConfigError("[delete] need 1 <= in_task_attempts <= max_attempts and retry_after_s >= 0")
    if not d.lock_path.startswith("/") or d.lock_path.rstrip("/") == "":
        raise ConfigError(f"[delete] lock_path must be an absolute znode path, got {d.lock_path!r}")
    _validate_retention(config.retention)
    _validate_reclaim(config.reclaim)
    if config.retention.topic_policies == "admin" and not config.system_topic.admin_url:
        raise ConfigError("[retention] topic_policies = \"admin\" needs [system_topic] admin_url")
    if config.spark.scan_partitions < 0:
        raise ConfigError("[spark] scan_partitions must be >= 0")
    if config.offload.enabled and not config.pulsar.cluster_name.strip():
        raise ConfigError(
            "[pulsar] cluster_name is required when [offload] enabled = true: geo-replicated clusters can offload "
            "into one bucket, and only objects whose pulsarClusterName metadata is this cluster's may be deleted. "
            "Set it to the brokers' clusterName (broker.conf), or set [offload] enabled = false")


def _validate_reclaim(r: ReclaimConfig) -> None:
    if r.compaction not in ("none", "minor", "major"):
        raise ConfigError(f"[reclaim] compaction must be none, minor or major, got {r.compaction!r}")
    for entry in r.http_urls:
        bookie, _, url = entry.partition("=")
        if not bookie.strip() or not url.strip().startswith(("http://", "https://")):
            raise ConfigError(f"[reclaim] http_urls entry {entry!r} must read \"<bookie id>=http(s)://host:port\" "
                              "(or \"*=http://{host}:8000\")")
    if r.http_scheme not in ("http", "https") or not 0 <= r.http_port < 65536:
        raise ConfigError("[reclaim] http_scheme must be http or https, and http_port a port (0: none)")
    if bool(r.tls_cert_file) != bool(r.tls_key_file):
        raise ConfigError("[reclaim] tls_cert_file and tls_key_file go together (mutual TLS)")
    if r.timeout_s <= 0 or r.calls_per_second <= 0 or r.gc_timeout_s <= 0 or r.gc_poll_s <= 0:
        raise ConfigError("[reclaim] timeout_s, calls_per_second, gc_timeout_s and gc_poll_s must be positive")
    if r.max_body_bytes < 64 * 1024 or r.deadline_s <= 0:
        raise ConfigError("[reclaim] max_body_bytes must be at least 65536 and deadline_s positive")
    if not 0 < r.freed_fraction <= 1:
        raise ConfigError("[reclaim] freed_fraction must be in (0, 1]")


def _validate_retention(r: RetentionConfig) -> None:
    for key in ("default_retention_minutes", "default_retention_size_mb"):
        if getattr(r, key) < -1:
            raise ConfigError(f"[retention] {key} must be -1 (infinite) or >= 0")
    if r.default_ttl_seconds < 0:
        raise ConfigError("[retention] default_ttl_seconds must be >= 0 (0: no TTL)")
    for key in ("check_interval_seconds", "expiry_check_minutes", "cursor_rollover_seconds"):
        if getattr(r, key) < 1:
            raise ConfigError(f"[retention] {key} must be positive (it is the broker's setting)")
    if r.untrimmed_margin_seconds < 5:
        raise ConfigError("[retention] untrimmed_margin_seconds must be at least 5: the broker's trim and its "
                          "metadata write take time")
    if r.topic_policies not in ("system_topic", "admin", "none"):
        raise ConfigError(f"[retention] topic_policies must be system_topic, admin or none, got {r.topic_policies!r}")
    if not r.bundle_owners_root.startswith("/") or r.bundle_owners_root == "/":
        raise ConfigError(f"[retention] bundle_owners_root must be an absolute znode path other than '/', got "
                          f"{r.bundle_owners_root!r}")
    if r.report_idle_days <= 0:
        raise ConfigError("[retention] report_idle_days must be positive")
    if r.cursor_idle_days < 0 or (0 < r.cursor_idle_days < 1 and not r.force_cursor_idle):
        raise ConfigError("[retention] cursor_idle_days must be 0 (never delete subscriptions) or at least 1 "
                          "(under 1 only with force_cursor_idle = true): a cursor idle for less than a day may only "
                          "be between consumers")
    if r.plan_max_age_hours <= 0:
        raise ConfigError("[retention] plan_max_age_hours must be positive")
    if r.actions_per_second <= 0 or r.max_actions_per_run < 0:
        raise ConfigError("[retention] actions_per_second must be positive and max_actions_per_run >= 0")


def load(path: str | Path | None) -> SweeperConfig:
    if path is None:
        return SweeperConfig()
    target = Path(path)
    try:
        data = tomllib.loads(target.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {target}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {target} is not valid TOML: {exc}") from exc
    return from_dict(data)


# Where a command finds its config when none is named (docs/operations.md, README): the operator's choice first,
# then the sandbox a `sweeper sandbox up` started (its ports may not be the defaults), then the checkout's.
CONFIG_ENV = "SWEEPER_CONFIG"
SANDBOX_CONFIG = Path("var/sandbox/sweeper.toml")
CHECKOUT_CONFIG = Path("conf/local.toml")


@dataclass(frozen=True)
class ConfigChoice:
    path: Path | None  # None: nothing found, only built-in defaults
    source: str  # how it was found, in words

    def describe(self) -> str:
        return f"config: {self.path} ({self.source})" if self.path else "config: none found (built-in defaults)"


def search_order(sandbox_config: Path = SANDBOX_CONFIG) -> str:
    return f"--config PATH, then ${CONFIG_ENV}, then {sandbox_config} (written by `sweeper sandbox up`), then " \
           f"{CHECKOUT_CONFIG}"


def find_config(explicit: str | Path | None, environ: dict[str, str] | None = None,
                sandbox_config: Path = SANDBOX_CONFIG) -> ConfigChoice:
    """The config a command uses, by the documented search order. A named file that does not exist is not
    skipped: `load` refuses it, so a typo never falls through to another cluster's config."""
    import os

    env = os.environ if environ is None else environ
    if explicit:
        return ConfigChoice(Path(explicit), "from --config")
    if env.get(CONFIG_ENV):
        return ConfigChoice(Path(env[CONFIG_ENV]), f"from ${CONFIG_ENV}")
    if sandbox_config.exists():
        return ConfigChoice(sandbox_config, "the running sandbox's, written by `sweeper sandbox up`")
    if CHECKOUT_CONFIG.exists():
        return ConfigChoice(CHECKOUT_CONFIG, "the checkout's")
    return ConfigChoice(None, "")


def to_toml(config: SweeperConfig, header: str = "") -> str:
    """The whole config as TOML that `load` reads back to an equal config (every value is a str, number, bool or
    list of str; JSON's string escapes are a subset of TOML's basic strings')."""
    lines = [f"# {line}" for line in header.splitlines()]
    for section, values in config.to_dict().items():
        lines.append(f"\n[{section}]")
        for key, value in values.items():
            if value is None:
                continue
            lines.append(f"{key} = {json.dumps(list(value) if isinstance(value, tuple) else value)}")
    return "\n".join(lines).lstrip("\n") + "\n"
