"""The delete stage's settings (what it reads of the config, with the run's own choices), what each of its Spark
tasks receives (DeleteTarget), and its refusal."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sweeper.config import (
    BookKeeperConfig,
    DeleteConfig,
    GatesConfig,
    OffloadConfig,
    PulsarMetadataConfig,
    RetentionConfig,
    SafetyConfig,
    ScanConfig,
    SweeperConfig,
    SystemTopicConfig,
)
from sweeper.connections import Connections, MetadataEndpoint
from sweeper.delete.journal import Journal
from sweeper.delete.retry import RetryPolicy
from sweeper.metastore.migration import MigrationGuard
from sweeper.metastore.urls import StoreUrl
from sweeper.rules.owner import ActingRules
from sweeper.run_lock import Fence


@dataclass(frozen=True)
class DeleteTarget:
    """What a delete task needs: small and picklable."""

    bookkeeper: MetadataEndpoint  # [bookkeeper]'s store, with its TLS / SASL / digest settings
    ledgers_root: str
    layout: str
    ml_root: str
    schemas_root: str
    min_age_ms: int
    now_ms: int | None
    execute: bool
    batch_size: int
    deletes_per_second: float
    op_timeout_s: float
    multi_read: int  # reads per ZooKeeper request when verifying (1: ZooKeeper < 3.6)
    policy: RetryPolicy
    endpoint_override: str
    buckets: tuple[tuple[str, str, str], ...]  # (bucket, region, endpoint) this run may delete from
    # (bucket, driver) of the containers whose offload contexts name a store other than S3: their copies are refused
    # (decide.unsupported_store), never sent to the S3 deleter
    other_stores: tuple[tuple[str, str], ...] = ()
    shadows: tuple[tuple[str, tuple[str, ...]], ...] = ()  # source managed ledger -> its shadow topics' ones
    local_cluster: str = ""  # [pulsar] cluster_name: an object must carry it to be deleted
    rules: ActingRules = field(default_factory=ActingRules)  # today's rules, re-applied to every record
    peers: tuple[MetadataEndpoint, ...] = ()  # [safety] peer_metadata: re-read before each ledger delete
    # Pulsar's store when it is not BookKeeper's: an Oxia namespace of its own (on ZooKeeper the delete refuses)
    pulsar: MetadataEndpoint | None = None
    offload_enabled: bool = False  # [offload] enabled: offloaded copies can be checked before a BookKeeper delete
    journal: Journal | None = None  # with execute: intents and outcomes, committed by the tasks chunk by chunk
    never_seen: frozenset[int] = frozenset()  # operator-listed ids no snapshot lists: `not_found` when gone
    # With execute: PIP-454's flag, re-read by each task before every executor call (sweeper.metastore.migration)
    migration: MigrationGuard | None = None
    # With execute: the run lock's fence (sweeper.run_lock), checked in every delete multi and read before every
    # executor call, so a run that lost its lock (an expired session) stops wherever its tasks run
    fence: Fence | None = None


@dataclass(frozen=True)
class DeleteSettings:
    """What the delete reads of the config, narrowed once (issue 22's stage shape), with the run's own choices:
    whether to delete (`execute`) and where its input comes from (the run's marks, an operator's JSON list, or
    the system topic)."""

    bookkeeper: BookKeeperConfig
    pulsar: PulsarMetadataConfig
    delete: DeleteConfig
    safety: SafetyConfig
    gates: GatesConfig
    offload: OffloadConfig
    scan: ScanConfig
    retention: RetentionConfig
    system_topic: SystemTopicConfig
    connections: Connections
    config_hash: str
    pulsar_store: StoreUrl
    execute: bool = False
    from_json: str | Path | None = None
    from_topic: bool = False
    now_ms: int | None = None  # the decision clock; tests move it
    # Where the stage says what it waits for (a killed run's lock expiring); the CLI's terminal by default.
    log: Callable[[str], None] = field(default=print, compare=False, repr=False)
    # Run under the stage wrapper, which writes the attempt's `runs` row once it returns: its journal says so when it
    # closes, so that a kill between the two is found and recorded by the next attempt (journal.settle_unrecorded).
    recorded_in_runs: bool = False

    @classmethod
    def from_config(cls, config: SweeperConfig, *, execute: bool = False, from_json: str | Path | None = None,
                    from_topic: bool = False, now_ms: int | None = None,
                    recorded_in_runs: bool = False) -> DeleteSettings:
        return cls(config.bookkeeper, config.pulsar, config.delete, config.safety, config.gates, config.offload,
                   config.scan, config.retention, config.system_topic, Connections.from_config(config),
                   config.hash(), config.pulsar_store(), execute, from_json, from_topic, now_ms,
                   recorded_in_runs=recorded_in_runs)

    def hash(self) -> str:
        return self.config_hash
