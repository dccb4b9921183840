"""The sandbox model's records and the custom metadata Pulsar writes on ledgers: what `model` builds the
cluster from and `retention_scenarios` adds its scenarios with (apart, so neither imports the other)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from sweeper.codecs.layout import LedgerLayout
from sweeper.names import encode_local_name
from sweeper.vocabulary import DAY_MS

GRACE_MS = 7 * DAY_MS  # the default grace period: what "young" means in the ground truth
HOUR_MS = 3_600_000



def _now_ms() -> int:
    # Ages are relative to seeding time, so grace periods mean the same thing in a snapshot.
    return int(time.time() * 1000)


class Status(StrEnum):
    IN_USE = "in_use"
    ORPHAN = "orphan"
    YOUNG_ORPHAN = "young_orphan"  # unreferenced, but inside the grace period: never a candidate
    UNKNOWN = "unknown"  # Pulsar's, but ownership cannot be established
    NON_PULSAR = "non_pulsar"
    # Unreferenced and past grace, yet kept by rule: a cursor ledger of a cursor Pulsar protects (`__compaction`,
    # `pulsar.*`) on a live topic. DESIGN invariant 15 and the safety-rules table (docs/architecture.md, row 21)
    # make every cursor ledger of such a cursor `protected`, never a candidate. Upstream would delete a replaced
    # one itself (ManagedCursorImpl.switchToNewLedger deletes the old cursor ledger once the znode names the new
    # one, whatever the cursor's name), so this is the sweeper being stricter than Pulsar, not data in use.
    PROTECTED = "protected"


class OrphanKind(StrEnum):
    TOPIC_DELETED = "topic_deleted"
    DROPPED_FROM_LIST = "dropped_from_list"
    CURSOR_LEDGER_REPLACED = "cursor_ledger_replaced"
    CURSOR_DELETED = "cursor_deleted"
    SCHEMA_VERSION_DELETED = "schema_version_deleted"
    SCHEMA_DELETED = "schema_deleted"
    BUCKET_SNAPSHOT_LEAKED = "bucket_snapshot_leaked"
    COMPACTED_LEDGER_LEAKED = "compacted_ledger_leaked"
    BOOKKEEPER_DELETED_BUT_PRESENT = "bookkeeper_deleted_but_present"


@dataclass(frozen=True)
class SandboxSpec:
    seed: int = 7
    topics: int = 40
    tenants: int = 2
    namespaces_per_tenant: int = 2
    layout: LedgerLayout = LedgerLayout.HIERARCHICAL
    long_id_fraction: float = 0.05  # share of topics whose ledgers come from above 2^31
    orphan_fraction: float = 0.25  # share of topics that get one injected orphan
    deleted_topics: int = 3  # topics whose managed ledger is gone but whose ledgers remain
    non_pulsar_ledgers: int = 5
    unknown_ledgers: int = 3
    missing_ledgers: int = 2  # referenced by a managed ledger, absent from BookKeeper
    young_orphans: int = 2
    max_rollovers: int = 6  # ledgers per managed ledger: 1..max_rollovers
    now_ms: int = field(default_factory=_now_ms)
    ledgers_root: str = "/ledgers"
    managed_ledgers_root: str = "/managed-ledgers"
    schemas_root: str = "/schemas"
    offload_bucket: str = "pulsar-offload"
    offload_region: str = "us-east-1"
    offload_endpoint: str = ""
    # The offload contexts' driver (issue 48): aws-s3, google-cloud-storage, azureblob, aliyun-oss.
    offload_driver: str = "aws-s3"
    cluster_name: str = "sandbox"  # the brokers' clusterName: offloaded objects carry it as pulsarClusterName
    # Retention (minutes, MiB) of the regular namespaces; None: not set, the broker's default applies. Keeping
    # everything (-1, -1), none of their topics owes anything, so the retention ground truth is the scenarios'.
    regular_retention: tuple[int, int] | None = (-1, -1)

    def __post_init__(self) -> None:
        if self.topics < 1:
            raise ValueError("a sandbox needs at least one topic")


@dataclass
class BkLedger:
    ledger_id: int
    custom: dict[str, bytes]
    ctime_ms: int | None  # metadata ctime; None = absent (age then comes from the znode)
    state: str
    last_entry_id: int
    length: int
    ensemble: tuple[str, ...]
    format_version: int
    status: Status
    orphan_kind: OrphanKind | None = None
    referrers: list[str] = field(default_factory=list)


@dataclass
class Offload:
    uuid_msb: int
    uuid_lsb: int
    complete: bool
    bookkeeper_deleted: bool
    timestamp_ms: int
    bucket: str
    region: str
    endpoint: str
    driver: str = "aws-s3"


@dataclass
class MlLedger:
    ledger_id: int
    entries: int
    size: int
    timestamp_ms: int
    offload: Offload | None = None


@dataclass
class Cursor:
    name: str  # decoded
    cursors_ledger_id: int
    mark_delete: tuple[int, int]
    long_properties: dict[str, int] = field(default_factory=dict)
    string_properties: dict[str, str] = field(default_factory=dict)
    zk_mtime_ms: int | None = None  # when its znode was last written (None: at seeding)
    last_active_ms: int | None = None  # ManagedCursorInfo.lastActive (None: not recorded)

    @property
    def znode_name(self) -> str:
        return encode_name(self.name)


@dataclass
class ManagedLedger:
    tenant: str
    namespace: str
    topic: str  # decoded local name, e.g. "orders-partition-0"
    ledgers: list[MlLedger]
    cursors: list[Cursor]
    properties: dict[str, str]
    compression: str
    terminated: bool = False
    zk_mtime_ms: int | None = None  # when its znode was last written (None: at seeding): a topic unloaded since

    @property
    def name(self) -> str:
        """The managed-ledger name: the znode path below the root, topic part URL-encoded."""
        return f"{self.tenant}/{self.namespace}/persistent/{encode_name(self.topic)}"

    @property
    def topic_name(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/{self.topic}"


@dataclass
class SchemaEntry:
    version: int
    ledger_id: int
    entry_id: int
    hash: bytes


@dataclass
class SchemaLocatorModel:
    schema_id: str  # tenant/ns/base-topic
    entries: list[SchemaEntry]


@dataclass
class OffloadObject:
    bucket: str
    key: str
    uuid: str
    ledger_id: int
    managed_ledger: str | None
    # in_use | in_flight | orphan | other_cluster (offloaded by another cluster sharing the bucket) |
    # unknown (no owner metadata on the object)
    status: str
    kind: str | None = None  # topic_deleted | superseded_offload, for orphans
    cluster_name: str | None = None  # the object's pulsarClusterName user metadata (None: not set)


# A local name exercising Codec.encode: a space becomes '+', ':' and '%' and 'ü' are %-escaped.
SPECIAL_TOPIC = "events with spaces:ü%"


def encode_name(name: str) -> str:
    """Pulsar's Codec.encode (java.net.URLEncoder): one implementation for the sandbox and the sweeper."""
    return encode_local_name(name)


# Pulsar's names, spelled here on purpose rather than imported from sweeper.vocabulary: the sandbox models
# Pulsar independently, so a wrong constant in the product shows up as a failing test instead of agreeing.
BUCKET_PREFIX = "#pulsar.internal.delayed.bucket"
COMPACTION_CURSOR = "__compaction"
COMPACTED_TOPIC_LEDGER = "CompactedTopicLedger"
# Cursors Pulsar keeps whatever their activity: Compactor.COMPACTION_SUBSCRIPTION, and every `pulsar.` cursor
# (PersistentReplicator's `pulsar.repl.<cluster>`, MessageDeduplication's `pulsar.dedup`).
PULSAR_CURSOR_PREFIX = "pulsar."


def pulsar_protects_cursor(name: str) -> bool:
    """A cursor Pulsar itself never expires: its cursor ledgers are `protected`, never orphans (Status.PROTECTED)."""
    return name == COMPACTION_CURSOR or name.startswith(PULSAR_CURSOR_PREFIX)


def ml_custom(ml_name: str) -> dict[str, bytes]:
    return {
        "application": b"pulsar",
        "component": b"managed-ledger",
        "pulsar/managed-ledger": ml_name.encode(),
    }


def cursor_custom(ml_name: str, cursor_znode: str) -> dict[str, bytes]:
    return {**ml_custom(ml_name), "pulsar/cursor": cursor_znode.encode()}


def schema_custom(schema_id: str) -> dict[str, bytes]:
    return {"application": b"pulsar", "component": b"schema", "pulsar/schemaId": schema_id.encode()}


def bucket_custom(bucket_key: str, topic_name: str, cursor: str) -> dict[str, bytes]:
    return {
        "application": b"pulsar",
        "component": b"delayed-index-bucket",
        "pulsar/delayedIndexBucketKey": bucket_key.encode(),
        "pulsar/delayedIndexTopic": topic_name.encode(),
        "pulsar/delayedIndexCursor": cursor.encode(),
    }


def compacted_custom(topic_name: str, ledger_id: int) -> dict[str, bytes]:
    return {
        "application": b"pulsar",
        "component": b"compacted-ledger",
        "pulsar/compactedTopic": topic_name.encode(),
        # Binary on purpose: Pulsar stores a serialized position here, not text.
        "pulsar/compactedTo": ledger_id.to_bytes(8, "big") + b"\xff\xfe",
    }
