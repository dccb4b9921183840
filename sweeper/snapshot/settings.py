"""The snapshot's settings, what its tasks need (ScanTarget), its counts, result and errors, and the record types of
the packed rows every producer emits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from sweeper import runs
from sweeper.config import (
    BookKeeperConfig,
    OffloadConfig,
    PulsarMetadataConfig,
    RetentionConfig,
    SafetyConfig,
    ScanConfig,
    SparkConfig,
    SweeperConfig,
    SystemTopicConfig,
)
from sweeper.connections import Connections, MetadataEndpoint
from sweeper.metastore.urls import StoreUrl
from sweeper.table_schemas import SNAPSHOT_TABLES

# What scan and listing tasks emit: each row carries a whole Arrow IPC batch of one table's rows.
# A task reads each znode once and produces rows for several tables; packing them per table keeps
# each batch narrow and leaves Spark (and its cache) a few large values instead of many wide rows.
PACKED_SCHEMA = StructType([
    StructField("record_type", StringType(), False),
    StructField("rows", LongType(), False),
    StructField("payload", BinaryType(), False),
])
TASK_BK, TASK_ML, TASK_SCHEMA = "bk", "ml", "schema"
BATCH_ROWS = 10_000
# Packed rows that are no table's: what each scan task read and how long its rate limit held it back.
STAT_READS, STAT_WAIT_MS = "zk_reads", "zk_wait_ms"
# Packed rows that are no table's either, and never counts: each distinct offload target (bucket, region,
# endpoint) a scan task met in the managed ledgers' offload contexts, its payload the target as JSON; and the
# listing slices that failed, which the listing tasks count as they write their quarantine rows.
OFFLOAD_TARGET, STAT_LISTING_FAILED = "offload_target", "offload_listing_failed"
# A data file a task wrote straight into a table (TableStore.task_writer): its payload the table and the file's
# record as JSON, its rows the rows the file holds as its writer counted them.
FILE_WRITTEN = "file_written"


@dataclass(frozen=True)
class SnapshotSettings:
    """What the snapshot reads of the config, narrowed once (issue 22's stage shape): the sections it uses, and
    the connections to every store, whose secrets are read here rather than halfway through a scan."""

    bookkeeper: BookKeeperConfig
    pulsar: PulsarMetadataConfig
    scan: ScanConfig
    offload: OffloadConfig
    safety: SafetyConfig
    retention: RetentionConfig
    system_topic: SystemTopicConfig
    spark: SparkConfig
    connections: Connections
    config_hash: str
    pulsar_store: StoreUrl

    @classmethod
    def from_config(cls, config: SweeperConfig) -> SnapshotSettings:
        return cls(config.bookkeeper, config.pulsar, config.scan, config.offload, config.safety, config.retention,
                   config.system_topic, config.spark, Connections.from_config(config), config.hash(),
                   config.pulsar_store())

    def hash(self) -> str:
        """The whole config's hash, which `runs` records."""
        return self.config_hash


@dataclass(frozen=True)
class ScanTarget:
    """What a scan task needs, small and picklable."""

    bookkeeper: MetadataEndpoint
    ledgers_root: str
    pulsar: MetadataEndpoint  # a peer's scan replaces it with the peer's store
    ml_root: str
    schemas_root: str
    window: int
    multi_read: int
    run_id: str
    captured_at: datetime
    reads_per_task: float = 0.0  # [scan] reads_per_second shared by the scan's sessions (0: unlimited)


@dataclass(frozen=True)
class SnapshotCounts(runs.StageCounts):
    """Rows per snapshot table, what the scan asked of ZooKeeper, and what the driver saw while planning."""

    bk_ledgers: int = 0
    managed_ledgers: int = 0
    ml_ledgers: int = 0
    ml_cursors: int = 0
    cursor_ledger_refs: int = 0
    schema_ledgers: int = 0
    offload_objects: int = 0
    pending_deletes: int = 0
    peer_references: int = 0
    quarantine: int = 0
    quarantine_by_source: Mapping[str, int] = runs.breakdown("quarantine.")  # offload_listing, pending_delete
    namespaces: int = 0
    namespace_policies: int = 0
    bundle_owners: int = 0
    bundle_owners_unreadable: int = 0
    live_brokers: int = 0
    clock_skew_ms: int = 0
    pending_delete_partitions: int = 0
    peers_read: int = 0
    peers_unread: int = 0
    scan_units: int = 0
    scan_sessions: int = 0
    zk_reads: int = 0
    zk_reads_per_second: int = 0
    zk_wait_ms: int = 0
    reads_per_second_limit: int = 0

    def tables(self) -> dict[str, int]:
        """Rows committed per snapshot table."""
        return {table: int(getattr(self, table)) for table in SNAPSHOT_TABLES}


@dataclass
class SnapshotResult:
    run_id: str
    counts: SnapshotCounts
    versions: dict[str, int]
    duration_s: float
    scan_s: float
    layout: str
    units: int
    quarantined: int = 0

    @property
    def ledgers_per_second(self) -> float:
        return self.counts.bk_ledgers / self.scan_s if self.scan_s else 0.0


def zk_load(counts: SnapshotCounts) -> str:
    """The snapshot's ZooKeeper reads against their limits, for the run's report lines."""
    limit = counts.reads_per_second_limit
    return (f"{counts.zk_reads:,} reads at {counts.zk_reads_per_second:,}/s over {counts.scan_sessions} session(s); "
            "limit " + (f"{limit:,} reads/s" if limit else "none") + f", {counts.zk_wait_ms / 1000:,.1f}s held back")

