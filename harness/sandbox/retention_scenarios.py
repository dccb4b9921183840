"""Retention debt in the sandbox: namespaces with retention and TTL policies, topics nobody loads, idle
cursors, a bad policy, a missing one, a namespace whose topic-level policies cannot be ruled out.

Every scenario's answer is known by construction (which ledgers Pulsar would trim, which cursors are
idle and what each pins), written down when the scenario is built, so the sweeper's rules are
checked against it rather than against themselves. The regular namespaces keep data forever
(retention -1/-1) unless the spec says otherwise: then none of their topics owes anything. Built
after everything else from its own random stream, so the rest of the model's ground truth is
unchanged.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Protocol

from harness.sandbox.entities import (
    BkLedger,
    Cursor,
    ManagedLedger,
    MlLedger,
    OrphanKind,
    SandboxSpec,
    Status,
    cursor_custom,
    ml_custom,
)
from sweeper.vocabulary import DAY_MS


class LedgerBuilder(Protocol):
    """What the scenarios use of the model's builder (`model._Builder`), which calls them: they add to its ledgers
    and managed ledgers, never import it."""

    spec: SandboxSpec
    ledgers: dict[int, BkLedger]
    managed_ledgers: list[ManagedLedger]
    bookies: list[str]

    def new_id(self, long_ids: bool) -> int: ...

    def add_ledger(self, ledger_id: int, custom: dict[str, bytes], age_ms: int, status: Status,
                   orphan_kind: OrphanKind | None = None, open_ledger: bool = False,
                   referrer: str | None = None) -> BkLedger: ...


HOUR_MS = 3_600_000
MIB = 1024 * 1024

TIME_NS = "tenant-0/retention-time"  # retention 1 day, no size limit
SIZE_NS = "tenant-1/retention-size"  # no time limit, 1 MiB
TTL_NS = "tenant-1/retention-ttl"  # retention 0 (consumed data goes at once), TTL 2 days
BAD_NS = "tenant-1/retention-bad"  # a Policies JSON Pulsar could not read
MISSING_NS = "tenant-1/retention-nopolicy"  # topics, but no policies znode
TOPIC_POLICY_NS = "tenant-1/retention-topic-policies"  # its __change_events holds events
FOREVER_NS = "tenant-0/retention-forever"  # keeps everything (-1/-1), like the regular ones, with idle cursors
SCENARIO_NAMESPACES = (TIME_NS, SIZE_NS, TTL_NS, BAD_NS, MISSING_NS, TOPIC_POLICY_NS, FOREVER_NS)
KEEP_FOREVER = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}


@dataclass
class CursorExpectation:
    name: str
    min_idle_ms: int  # at least this idle (the sweeper's bound may be larger only by clock noise)
    pinned: list[int]  # ledgers it alone keeps from being trimmed
    pinned_bytes: int
    position_may_lag: bool
    system: bool = False


@dataclass
class RetentionExpectation:
    """What a correct sweeper reports for one managed ledger."""

    managed_ledger: str
    scenario: str
    status: str  # candidate | awaiting_broker | none | protected | unknown
    reason: str
    trimmable: list[int] = field(default_factory=list)
    trimmable_bytes: int = 0
    cursors: list[CursorExpectation] = field(default_factory=list)  # the idle ones


def policy_json(cluster_name: str, retention: dict[str, int] | None, ttl: int | None = None) -> bytes:
    doc: dict[str, object] = {"replication_clusters": [cluster_name], "deleted": False}
    if retention is not None:
        doc["retention_policies"] = retention
    if ttl is not None:
        doc["message_ttl_in_seconds"] = ttl
    return json.dumps(doc).encode()


def namespace_policies(cluster_name: str, regular: list[str],
                       regular_retention: tuple[int, int] | None = (-1, -1)) -> dict[str, bytes | None]:
    """Policies JSON per namespace (None: no znode). Regular namespaces get `regular_retention` (minutes, MiB):
    forever by default; None leaves it unset."""
    retention = None if regular_retention is None else {"retentionTimeInMinutes": regular_retention[0],
                                                        "retentionSizeInMB": regular_retention[1]}
    policies: dict[str, bytes | None] = {ns: policy_json(cluster_name, retention) for ns in regular}
    policies[TIME_NS] = policy_json(cluster_name, {"retentionTimeInMinutes": 24 * 60, "retentionSizeInMB": -1})
    policies[SIZE_NS] = policy_json(cluster_name, {"retentionTimeInMinutes": -1, "retentionSizeInMB": 1})
    policies[TTL_NS] = policy_json(cluster_name, {"retentionTimeInMinutes": 0, "retentionSizeInMB": -1},
                                   ttl=2 * 86_400)
    policies[BAD_NS] = b'{"retention_policies": {"retentionTimeInMinutes": "one day"}, "deleted": false}'
    policies[MISSING_NS] = None
    policies[TOPIC_POLICY_NS] = policy_json(cluster_name, {"retentionTimeInMinutes": 24 * 60,
                                                          "retentionSizeInMB": -1})
    policies[FOREVER_NS] = policy_json(cluster_name, KEEP_FOREVER)
    return policies


class _Scenarios:
    def __init__(self, builder: LedgerBuilder, rng: random.Random) -> None:
        self.b = builder
        self.rng = rng
        self.now = builder.spec.now_ms
        self.out: list[RetentionExpectation] = []

    def topic(self, namespace: str, local: str, closed_ms: list[int], sizes: list[int] | None = None,
              zk_mtime_ms: int | None = None) -> ManagedLedger:
        """A managed ledger with closed ledgers (closed at `closed_ms`) and an empty current ledger."""

        tenant, ns = namespace.split("/")
        ml = ManagedLedger(tenant, ns, local, [], [], {}, "NONE", zk_mtime_ms=zk_mtime_ms)
        for i, closed in enumerate(closed_ms):
            ledger_id = self.b.new_id(False)
            entries = self.rng.randrange(2, 400)
            size = sizes[i] if sizes else entries * self.rng.randrange(100, 2_000)
            ml.ledgers.append(MlLedger(ledger_id, entries, size, closed))
            bk = self.b.add_ledger(ledger_id, ml_custom(ml.name), self.now - closed + HOUR_MS, Status.IN_USE,
                                   referrer=f"ml:{ml.name}")
            bk.last_entry_id, bk.length = entries - 1, size
        current = self.b.new_id(False)
        opened = max([*closed_ms, self.now - 30 * DAY_MS])
        ml.ledgers.append(MlLedger(current, 0, 0, 0))
        self.b.add_ledger(current, ml_custom(ml.name), self.now - opened, Status.IN_USE, open_ledger=True,
                          referrer=f"ml:{ml.name}")
        self.b.managed_ledgers.append(ml)
        return ml

    def cursor(self, ml: ManagedLedger, name: str, at: tuple[int, int], zk_mtime_ms: int | None,
               active_ledger: bool = False, last_active_ms: int | None = None) -> None:

        cursor = Cursor(name, -1, at, zk_mtime_ms=zk_mtime_ms, last_active_ms=last_active_ms)
        if active_ledger:
            cursor.cursors_ledger_id = self.b.new_id(False)
            self.b.add_ledger(cursor.cursors_ledger_id, cursor_custom(ml.name, cursor.znode_name),
                              self.now - (zk_mtime_ms or self.now), Status.IN_USE, open_ledger=True,
                              referrer=f"cursor:{ml.name}/{cursor.znode_name}")
        ml.cursors.append(cursor)

    def expect(self, ml: ManagedLedger, scenario: str, status: str, reason: str, trimmed: int = 0,
               cursors: list[CursorExpectation] | None = None) -> None:
        closed = ml.ledgers[:trimmed]
        self.out.append(RetentionExpectation(ml.name, scenario, status, reason, [x.ledger_id for x in closed],
                                             sum(x.size for x in closed), cursors or []))

    def days_ago(self, low: float, high: float, n: int) -> list[int]:
        """n close times between `high` and `low` days ago, oldest first."""
        return sorted(int(self.now - self.rng.uniform(low, high) * DAY_MS) for _ in range(n))

    @staticmethod
    def end_of(ml: ManagedLedger, index: int) -> tuple[int, int]:
        ledger = ml.ledgers[index]
        return ledger.ledger_id, ledger.entries - 1

    # -- the scenarios ---------------------------------------------------------------------------------
    def build(self, rep: int) -> None:
        now, rng = self.now, self.rng
        unloaded_at = now - 4 * DAY_MS
        n = rng.randrange(2, 6)

        # Consumed, past the 1-day retention, unloaded four days ago: every closed ledger is owed.
        ml = self.topic(TIME_NS, f"expired-unloaded-{rep}", self.days_ago(5, 30, n), zk_mtime_ms=unloaded_at)
        self.cursor(ml, "consumer", self.end_of(ml, n - 1), unloaded_at, last_active_ms=unloaded_at)
        self.expect(ml, "expired_unloaded", "candidate", "expired_not_trimmed", trimmed=n)

        # The same, but its list changed just now (written at seeding: a loaded topic): the broker trims it.
        ml = self.topic(TIME_NS, f"expired-loaded-{rep}", self.days_ago(5, 30, n))
        self.cursor(ml, "consumer", self.end_of(ml, n - 1), None)
        self.expect(ml, "expired_loaded", "awaiting_broker", "expired_awaiting_broker_trim", trimmed=n)

        # Consumed up to the middle of its k-th ledger: only the ledgers before it are owed.
        k = rng.randrange(1, n)
        ml = self.topic(TIME_NS, f"partly-consumed-{rep}", self.days_ago(5, 30, n), zk_mtime_ms=unloaded_at)
        self.cursor(ml, "consumer", (ml.ledgers[k].ledger_id, 0), unloaded_at)
        self.expect(ml, "partly_consumed", "candidate", "expired_not_trimmed", trimmed=k)

        # Closed within the day: nothing is past retention yet (no row at all).
        ml = self.topic(TIME_NS, f"young-{rep}", self.days_ago(0.1, 0.8, n), zk_mtime_ms=now - HOUR_MS // 2)
        self.cursor(ml, "consumer", self.end_of(ml, n - 1), now - HOUR_MS // 2)

        # An idle subscription at the start (closed cursor, 60 days) next to a live one at the end: it alone
        # pins every closed ledger (all past retention). Loaded, so no topic debt of its own.
        idle_at = now - 60 * DAY_MS
        ml = self.topic(TIME_NS, f"idle-cursor-{rep}", self.days_ago(61, 90, n))
        self.cursor(ml, "stale-sub", (ml.ledgers[0].ledger_id, -1), idle_at, last_active_ms=idle_at)
        self.cursor(ml, "live-sub", self.end_of(ml, n - 1), None)
        pinned = ml.ledgers[:n]
        self.expect(ml, "idle_cursor", "none", "no_debt", cursors=[CursorExpectation(
            "stale-sub", 60 * DAY_MS - HOUR_MS, [x.ledger_id for x in pinned], sum(x.size for x in pinned), False)])

        # Idle with an active cursor ledger written 30 days ago: ZooKeeper's position may lag (it may pin less),
        # and its last acknowledgement may be one rollover period later than the write.
        lag_at = now - 30 * DAY_MS
        ml = self.topic(TIME_NS, f"idle-lagging-{rep}", self.days_ago(31, 60, n))
        self.cursor(ml, "lagging-sub", (ml.ledgers[0].ledger_id, -1), lag_at, active_ledger=True)
        self.cursor(ml, "live-sub", self.end_of(ml, n - 1), None)
        pinned = ml.ledgers[:n]
        self.expect(ml, "idle_lagging", "none", "no_debt", cursors=[CursorExpectation(
            "lagging-sub", 30 * DAY_MS - 5 * HOUR_MS, [x.ledger_id for x in pinned], sum(x.size for x in pinned),
            True)])

        # An idle compaction cursor: reported, never deleted.
        ml = self.topic(TIME_NS, f"idle-compaction-{rep}", self.days_ago(61, 90, n))
        self.cursor(ml, "__compaction", (ml.ledgers[0].ledger_id, -1), idle_at)
        self.cursor(ml, "live-sub", self.end_of(ml, n - 1), None)
        pinned = ml.ledgers[:n]
        self.expect(ml, "idle_compaction", "none", "no_debt", cursors=[CursorExpectation(
            "__compaction", 60 * DAY_MS - HOUR_MS, [x.ledger_id for x in pinned], sum(x.size for x in pinned), False,
            system=True)])

        # Size quota 1 MiB, five closed ledgers of 512 KiB, no subscription: trimming goes while what is left
        # is at least 1 MiB (2 MiB, 1.5, 1.0 left: three go; 0.5 would be under).
        ml = self.topic(SIZE_NS, f"over-quota-{rep}", self.days_ago(3, 5, 5), sizes=[MIB // 2] * 5,
                        zk_mtime_ms=now - 2 * DAY_MS)
        self.expect(ml, "over_quota", "candidate", "expired_not_trimmed", trimmed=3)

        # Retention 0 with a 2-day TTL: an unacknowledged (but recently active) subscription at the start is
        # moved by TTL past every closed ledger older than 2 days; unloaded, so nothing did.
        ml = self.topic(TTL_NS, f"ttl-expired-{rep}", self.days_ago(6, 10, n), zk_mtime_ms=unloaded_at)
        self.cursor(ml, "slow-sub", (ml.ledgers[0].ledger_id, -1), unloaded_at, last_active_ms=unloaded_at)
        self.expect(ml, "ttl_expired", "candidate", "expired_not_trimmed", trimmed=n)

        # Unknown: a policy Pulsar could not read, a namespace with no policies, topic policies not ruled out.
        for namespace, reason in ((BAD_NS, "namespace_policy_unreadable"), (MISSING_NS, "namespace_policy_missing"),
                                  (TOPIC_POLICY_NS, "topic_policy_may_exist")):
            ml = self.topic(namespace, f"unknown-{rep}", self.days_ago(100, 200, n), zk_mtime_ms=now - 90 * DAY_MS)
            self.cursor(ml, "old-sub", (ml.ledgers[0].ledger_id, -1), now - 90 * DAY_MS)
            self.expect(ml, f"unknown_{namespace.split('/')[1]}", "unknown", reason, cursors=[CursorExpectation(
                "old-sub", 90 * DAY_MS - HOUR_MS, [], 0, False)])

        # Kept forever: nothing is ever trimmed, so an idle subscription pins nothing retention would free, but
        # it is still reported (its own cursor ledger, and the data it holds once retention is lowered). The
        # topic beside it, whose cursors are recent, owes nothing and has no row.
        ml = self.topic(FOREVER_NS, f"idle-forever-{rep}", self.days_ago(61, 90, n))
        self.cursor(ml, "stale-sub", (ml.ledgers[0].ledger_id, -1), idle_at, last_active_ms=idle_at)
        self.cursor(ml, "live-sub", self.end_of(ml, n - 1), None)
        self.expect(ml, "idle_forever", "none", "no_debt", cursors=[CursorExpectation(
            "stale-sub", 60 * DAY_MS - HOUR_MS, [], 0, False)])
        ml = self.topic(FOREVER_NS, f"forever-{rep}", self.days_ago(61, 90, n), zk_mtime_ms=unloaded_at)
        self.cursor(ml, "recent-sub", (ml.ledgers[0].ledger_id, -1), now - DAY_MS, last_active_ms=now - DAY_MS)

    def change_events(self) -> None:
        """Topic-policy system topics: provably empty in the time namespace, holding events in another."""

        for namespace, events in ((TIME_NS, 0), (TOPIC_POLICY_NS, 3)):
            tenant, ns = namespace.split("/")
            ml = ManagedLedger(tenant, ns, "__change_events", [], [], {}, "NONE", zk_mtime_ms=self.now - 10 * DAY_MS)
            first, last = self.b.new_id(False), self.b.new_id(False)
            ml.ledgers = [MlLedger(first, events, events * 200, self.now - 20 * DAY_MS), MlLedger(last, 0, 0, 0)]
            for ledger_id, entries in ((first, events), (last, 0)):
                # Closed (the topic was unloaded): the current ledger's close wrote its real (empty) length.
                self.b.ledgers[ledger_id] = BkLedger(ledger_id, ml_custom(ml.name), self.now - 20 * DAY_MS, "CLOSED",
                                                     entries - 1, entries * 200, tuple(self.b.bookies[:3]), 3,
                                                     Status.IN_USE, referrers=[f"ml:{ml.name}"])
            self.b.managed_ledgers.append(ml)
            # Past its 1-day retention and unloaded, but Pulsar's own (SystemTopicNames): protected, reported with
            # what it owes, never repaired; and, never acted on, not made unknown by the events it holds.
            scenario = "change_events_with_events" if events else "change_events_empty"
            self.expect(ml, scenario, "protected", "topic_policy_events", trimmed=1)


def add_retention_scenarios(builder: LedgerBuilder) -> list[RetentionExpectation]:
    spec = builder.spec
    scenarios = _Scenarios(builder, random.Random(spec.seed * 7919 + 15))
    for rep in range(max(1, spec.topics // 100)):
        scenarios.build(rep)
    scenarios.change_events()
    return scenarios.out
