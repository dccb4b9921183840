"""The retention-debt step's settings, the context its tasks judge topics in, its refusal, and its counts and
result (sweeper.retention.debt runs the step)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sweeper import runs
from sweeper.config import RetentionConfig, SafetyConfig, SweeperConfig
from sweeper.rules.protection import NONE, Protection
from sweeper.rules.retention import MINUTE_MS, BrokerRetention, DebtReason, Policy
from sweeper.rules.safety import Scope, retention_scope
from sweeper.vocabulary import DAY_MS

TOPIC, CURSOR = "topic", "cursor"
# `topic_policy` values (see table_schemas.RETENTION_DEBT); UNCHECKED only between the tasks and finalize.


@dataclass(frozen=True)
class RetentionSettings:
    broker: BrokerRetention = field(default_factory=BrokerRetention)
    report_idle_ms: int = 7 * DAY_MS
    delete_after_ms: int = 0  # [retention] cursor_idle_days; 0: subscriptions are never deleted
    scope: Scope = field(default_factory=Scope)
    topic_policies: str = "system_topic"
    # Skip, before any per-topic pass, the topics `may_owe` rules out. Off only to check that skipping changes
    # nothing, and in benchmarks.
    skip_topics_that_cannot_owe: bool = True
    # Judge the selected topics on the driver when their ledger-list entries and cursors are at most this many
    # (some hundreds of MB of Python objects at worst); more go through a Spark shuffle.
    driver_assess_max_rows: int = 500_000
    protection: Protection = NONE  # [retention] protected_subscriptions / protected_topics

    @classmethod
    def from_config(cls, config: SweeperConfig) -> RetentionSettings:
        return cls.from_sections(config.retention, config.safety)

    @classmethod
    def from_sections(cls, r: RetentionConfig, safety: SafetyConfig) -> RetentionSettings:
        """From the two sections it reads: [retention] and [safety]'s allow/deny scope."""
        broker = BrokerRetention(r.default_retention_minutes, r.default_retention_size_mb, r.default_ttl_seconds,
                                r.check_interval_seconds * 1000, r.expiry_check_minutes * MINUTE_MS,
                                r.cursor_rollover_seconds * 1000, r.untrimmed_margin_seconds * 1000)
        scope = retention_scope(r.allow, r.deny, safety.allow, safety.deny)
        return cls(broker, int(r.report_idle_days * DAY_MS), int(r.cursor_idle_days * DAY_MS), scope, r.topic_policies,
                   protection=Protection.of(r.protected_subscriptions, r.protected_topics))


@dataclass(frozen=True)
class _Context:
    """What every task needs: small and picklable."""

    run_id: str
    now_ms: int
    settings: RetentionSettings
    policies: dict[str, tuple[Policy | None, DebtReason | None, str]]
    owned: dict[str, tuple[tuple[int, int], ...]]
    ownership_readable: bool
    quarantined: frozenset[str]


@dataclass(frozen=True)
class RetentionDebtCounts(runs.StageCounts):
    """Topics and idle cursors by status, the bytes reclaimable by cause, and what the step had to read."""

    topics: Mapping[str, int] = runs.breakdown("topic.")  # candidate, unknown, awaiting_broker, protected, none...
    cursors: Mapping[str, int] = runs.breakdown("cursor.")  # candidate, idle, protected, out_of_scope, unknown
    orphan_bytes: int = runs.count("bytes.orphan")
    expired_unloaded_bytes: int = runs.count("bytes.expired_unloaded")
    idle_cursor_bytes: int = runs.count("bytes.idle_cursor")
    awaiting_broker_bytes: int = runs.count("bytes.awaiting_broker")
    topics_judged: int = 0
    ownership_readable: int = 0
    topic_policy_namespaces: int = 0
    topic_policy_calls: int = 0

    @property
    def idle_cursors(self) -> int:
        """The cursors found idle (a candidate, idle, or idle outside the repair's scope): not those the step could
        not judge (`unknown`) nor those Pulsar protects (compaction, replication: `protected`). The sweep's line
        and table agree."""
        return sum(n for status, n in self.cursors.items() if status not in ("unknown", "protected"))


@dataclass
class RetentionDebtResult:
    run_id: str
    counts: RetentionDebtCounts
    duration_s: float
    report: list[dict[str, Any]]  # reclaimable bytes by cause, per tenant/namespace, largest first
