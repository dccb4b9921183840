"""Retention debt: what Pulsar's own rules would trim from a topic, and whether anything is trimming it.

The lifecycle blog's cases 2 and 3: a topic no broker loads never runs its retention, so expired
ledgers stay forever; and a cursor nobody acknowledges on pins every ledger after its mark-delete
position. Reconcile gathers each managed ledger's ledger list, cursors and policy; the functions
here decide, over plain records, as the broker would. Anything we cannot establish (an unreadable
or missing policy, a topic-level policy we cannot see, undecodable metadata) is `unknown`: never
"expired", never acted on.

Upstream behaviour these rules follow (Pulsar 4.0.8, checked in its jars):
- `ManagedLedgerImpl.internalTrimLedgers`: ledgers before the slowest durable cursor's mark-delete
  (the ledger after it when the mark-delete is that ledger's last entry) are walked in id order;
  the current ledger stops the walk; a ledger goes when its retention time has passed since its
  close timestamp (`hasLedgerRetentionExpired`: `now - timestamp > retentionTimeMs`, negative =
  infinite) or what would remain is still at least the size quota (`isLedgerRetentionOverSizeQuota`:
  `total - toDelete >= retentionSizeInMB * 1 MiB`, negative = infinite); the first ledger that is
  neither ends the walk. With no durable cursor every closed ledger is eligible.
- `ManagedLedgerImpl.initialize` opens the last listed ledger when a topic is loaded and records it
  with the load time as its timestamp, so the last listed ledger is never trimmable on loading.
- `BrokerService.checkConsumedLedgers` trims every *loaded* topic each `retentionCheckIntervalInSeconds`;
  an unloaded topic is trimmed by nobody.
- TTL (`PersistentTopic.checkMessageExpiry`, every `messageExpiryCheckIntervalInMinutes`, loaded topics
  only) moves every subscription's cursor but the compaction cursor's past whole ledgers whose close
  timestamp is older than the TTL (`PersistentMessageExpiryMonitor.checkExpiryByLedgerClosureTime`,
  stopping at the first ledger without a timestamp or not yet expired); unacknowledged data is kept
  otherwise.
- `ManagedCursorImpl.persistPositionMetaStore` writes a cursor's znode (mark-delete, `lastActive`) only
  when its cursor ledger is switched or the cursor closes (closing writes `cursorsLedgerId = -1`,
  `persistPositionWhenClosing`); in between, acknowledgements go to the cursor ledger, which is
  switched on the first write after `managedLedgerCursorRolloverTimeInSeconds`
  (`ManagedCursorImpl.shouldCloseLedger`). So with an active cursor ledger ZooKeeper's mark-delete is
  a lower bound (the cursor may be further and pin less), and its last acknowledgement may be up to
  one rollover period after the znode was written.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from sweeper.rules import protection
from sweeper.rules.protection import NONE, Protection
from sweeper.vocabulary import COMPACTION_CURSOR

MEGABYTE = 1024 * 1024
MINUTE_MS = 60_000


class TopicStatus(StrEnum):
    CANDIDATE = "candidate"  # expired ledgers on a topic that looks unloaded: load it (with --execute)
    AWAITING_BROKER = "awaiting_broker"  # expired, but the topic may be loaded: its next retention check trims
    NONE = "none"  # nothing past retention
    OUT_OF_SCOPE = "out_of_scope"  # debt, but outside the repair allow-list
    UNKNOWN = "unknown"  # the policy (or the metadata) cannot be established: never acted on
    PROTECTED = "protected"  # Pulsar's own topic or one the operator protects (`topic_protection`): never acted on


class CursorStatus(StrEnum):
    CANDIDATE = "candidate"  # idle past [retention] cursor_idle_days, in scope: delete the subscription
    IDLE = "idle"  # idle past report_idle_days: reported, not deleted (deletion off or under its threshold)
    PROTECTED = "protected"  # `cursor_protection` (or its topic's) names a reason: never deleted
    OUT_OF_SCOPE = "out_of_scope"
    UNKNOWN = "unknown"


class DebtReason(StrEnum):
    EXPIRED_UNLOADED = "expired_not_trimmed"
    EXPIRED_AWAITING_TRIM = "expired_awaiting_broker_trim"
    NO_DEBT = "no_debt"
    POLICY_UNREADABLE = "namespace_policy_unreadable"
    POLICY_MISSING = "namespace_policy_missing"
    NAMESPACE_DELETED = "namespace_marked_deleted"
    TOPIC_POLICY_MAY_EXIST = "topic_policy_may_exist"
    TOPIC_POLICY_SET = "topic_policy_set"
    METADATA_QUARANTINED = "metadata_quarantined"
    IDLE_CURSOR = "idle_cursor"
    # A `__` topic or a `pulsar/*` namespace's that `sweeper.rules.protection` does not name: Pulsar's all the same.
    # Protected rows otherwise carry a `sweeper.rules.protection.Protected` value as their reason.
    SYSTEM_TOPIC = "system_topic"


@dataclass(frozen=True, slots=True)
class Ledger:
    """One entry of a managed ledger's list (`ManagedLedgerInfo.LedgerInfo`)."""

    ledger_id: int
    entries: int
    size: int
    closed_ms: int  # `timestamp`: set when the ledger is closed; 0 while it is the current ledger
    offloaded: bool = False


@dataclass(frozen=True, slots=True, order=True)
class Position:
    ledger_id: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class Cursor:
    """A durable cursor as its znode shows it (`ManagedCursorInfo`)."""

    name: str
    mark_delete: Position
    cursor_ledger: int  # cursorsLedgerId; -1: the cursor closed (or persisted nothing since its topic loaded)
    zk_mtime_ms: int  # when the znode was last written
    last_active_ms: int = 0  # `lastActive` as of that write (0: not recorded)
    cursor_ledger_bytes: int | None = None  # the cursor ledger's length in BookKeeper, when known
    # `properties` holds `pulsar.replicated.subscription` = 1: a geo-replicated subscription (PersistentSubscription)
    replicated: bool = False


@dataclass(frozen=True, slots=True)
class Policy:
    """What the broker applies to a topic: retention (time, size) and TTL. Negative retention: infinite."""

    retention_minutes: int
    retention_size_mb: int
    ttl_seconds: int = 0
    source: str = "namespace"

    @property
    def retention_ms(self) -> int:
        return self.retention_minutes * MINUTE_MS if self.retention_minutes >= 0 else -1

    @property
    def never_trims(self) -> bool:
        return self.retention_minutes < 0 and self.retention_size_mb < 0


@dataclass(frozen=True, slots=True)
class BrokerRetention:
    """broker.conf values the rules need ([retention] in the config)."""

    retention_minutes: int = 0
    retention_size_mb: int = 0
    ttl_seconds: int = 0
    check_interval_ms: int = 120_000
    expiry_check_ms: int = 5 * MINUTE_MS
    cursor_rollover_ms: int = 14_400_000
    untrimmed_margin_ms: int = MINUTE_MS  # [retention] untrimmed_margin_seconds


# --- policies ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NamespacePolicy:
    """The fields of a namespace's `Policies` JSON (configuration store) that retention depends on.

    None means "not set": the broker's default applies. Only these fields are kept: the JSON also
    holds offload and auth settings, which may carry credentials and never reach a table.
    """

    readable: bool
    error: str | None = None
    retention_minutes: int | None = None
    retention_size_mb: int | None = None
    ttl_seconds: int | None = None
    deleted: bool = False


def _java_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} is {value!r}, not an integer")
    return value


def parse_namespace_policies(data: bytes | None) -> NamespacePolicy:
    """`/admin/policies/<tenant>/<namespace>` as Pulsar's Jackson mapper would read the fields we need.

    Fields: `retention_policies` {`retentionTimeInMinutes` int, `retentionSizeInMB` long} (absent or
    null: the broker default; an absent inner field is Java's 0), `message_ttl_in_seconds` (Integer,
    null: the broker default), `deleted` (the namespace is being deleted).
    """
    if data is None:
        return NamespacePolicy(False, "no policies znode")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return NamespacePolicy(False, f"not JSON: {str(exc)[:120]}")
    if not isinstance(doc, dict):
        return NamespacePolicy(False, f"not a JSON object but {type(doc).__name__}")
    try:
        retention = doc.get("retention_policies")
        minutes = size = None
        if retention is not None:
            if not isinstance(retention, dict):
                raise ValueError(f"retention_policies is {retention!r}")
            minutes = _java_int(retention.get("retentionTimeInMinutes", 0), "retentionTimeInMinutes")
            size = _java_int(retention.get("retentionSizeInMB", 0), "retentionSizeInMB")
        ttl = doc.get("message_ttl_in_seconds")
        ttl = None if ttl is None else _java_int(ttl, "message_ttl_in_seconds")
        deleted = doc.get("deleted", False)
        if not isinstance(deleted, bool):
            raise ValueError(f"deleted is {deleted!r}")
    except ValueError as exc:
        return NamespacePolicy(False, str(exc)[:200])
    return NamespacePolicy(True, None, minutes, size, ttl, deleted)


def effective_policy(ns: NamespacePolicy | None,
                     broker: BrokerRetention) -> tuple[Policy | None, DebtReason | None, str]:
    """The namespace's policy over the broker's defaults; (None, why, detail) when it cannot be established."""
    if ns is None:
        return None, DebtReason.POLICY_MISSING, "no namespace policies in the configuration store"
    if not ns.readable:
        return None, DebtReason.POLICY_UNREADABLE, f"namespace policies unreadable: {ns.error}"
    if ns.deleted:
        return None, DebtReason.NAMESPACE_DELETED, "the namespace is marked deleted"
    minutes = ns.retention_minutes if ns.retention_minutes is not None else broker.retention_minutes
    size = ns.retention_size_mb if ns.retention_size_mb is not None else broker.retention_size_mb
    ttl = ns.ttl_seconds if ns.ttl_seconds is not None else broker.ttl_seconds
    defaulted = [name for name, value in (("retention", ns.retention_minutes), ("ttl", ns.ttl_seconds))
                 if value is None]
    source = "namespace" + "".join(f"+broker_default_{name}" for name in defaulted)
    return Policy(minutes, size, max(ttl, 0), source), None, ""


def change_events_may_hold_policies(ledgers: Sequence[tuple[int, int, str | None, int | None]],
                                    has_compaction: bool) -> bool:
    """Whether a namespace's `__change_events` topic may hold topic-level policy events.

    `ledgers`: (entries in the ledger list, ledger id, BookKeeper state, BookKeeper last entry id) of
    each ledger of every `__change_events` partition. Only proof of emptiness rules events out: every
    listed ledger with 0 entries, the ones still listed as current closed in BookKeeper with no entry,
    and no compacted view (a `__compaction` cursor keeps policies past trimmed ledgers).
    """
    if has_compaction:
        return True
    for entries, _ledger_id, state, last_entry_id in ledgers:
        if entries > 0:
            return True
        if state != "CLOSED" or last_entry_id is None or last_entry_id >= 0:
            return True  # open (or unreadable) ledgers may have entries the list does not count yet
    return False


# --- Pulsar's trimming, as a pure function ---------------------------------------------------------


def ttl_position(ledgers: Sequence[Ledger], mark_delete: Position, ttl_seconds: int, now_ms: int) -> Position:
    """Where TTL expiry would move a cursor (`checkExpiryByLedgerClosureTime`): past every whole ledger,
    from the mark-delete's own, closed longer than the TTL ago; the last listed ledger never counts (its
    timestamp becomes the load time)."""
    if ttl_seconds <= 0 or not ledgers:
        return mark_delete
    ttl_ms = ttl_seconds * 1000
    found: Position | None = None
    for ledger in ledgers[:-1]:
        if ledger.ledger_id < mark_delete.ledger_id:
            continue
        if ledger.closed_ms <= 0 or now_ms <= ledger.closed_ms + ttl_ms:
            break
        found = Position(ledger.ledger_id, ledger.entries - 1)
    return max(mark_delete, found) if found is not None else mark_delete


def trim_bound(ledgers: Sequence[Ledger], positions: Iterable[Position]) -> int:
    """The first ledger id trimming must keep: the slowest mark-delete's ledger, or the one after it when
    the mark-delete is that (closed) ledger's last entry; with no durable cursor, past the current one."""
    current = ledgers[-1].ledger_id
    slowest = min(positions, default=None)
    if slowest is None:
        return current + 1
    for ledger in ledgers:
        if ledger.ledger_id == slowest.ledger_id:
            if ledger.ledger_id != current and ledger.entries == slowest.entry_id + 1:
                return slowest.ledger_id + 1
            break
    return slowest.ledger_id


@dataclass(frozen=True, slots=True)
class Trim:
    ledgers: tuple[Ledger, ...]  # what the broker would delete, oldest first
    over_quota: tuple[bool, ...]  # per ledger: the size rule alone would take it

    @property
    def bytes(self) -> int:
        return sum(ledger.size for ledger in self.ledgers)

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(ledger.ledger_id for ledger in self.ledgers)


def trimmable(ledgers: Sequence[Ledger], positions: Iterable[Position], policy: Policy, now_ms: int) -> Trim:
    """The ledgers `internalTrimLedgers` would delete now, given these cursor positions.

    The last listed ledger is never one of them: it is the current ledger of a loaded topic, and the
    one whose timestamp restarts at the load of an unloaded one. Its size is unknown (0) in the list,
    so totals may be low: this can only under-count what the size rule frees.
    """
    if not ledgers:
        return Trim((), ())
    ordered = sorted(ledgers, key=lambda x: x.ledger_id)
    bound = trim_bound(ordered, positions)
    current = ordered[-1].ledger_id
    total = sum(ledger.size for ledger in ordered)
    retention_ms = policy.retention_ms
    quota = policy.retention_size_mb * MEGABYTE
    out: list[Ledger] = []
    flags: list[bool] = []
    to_delete = 0
    for ledger in ordered:
        if ledger.ledger_id >= bound or ledger.ledger_id == current:
            break
        to_delete += ledger.size
        over_quota = policy.retention_size_mb >= 0 and total - to_delete >= quota
        expired = retention_ms >= 0 and now_ms - ledger.closed_ms > retention_ms
        if not (over_quota or expired):
            break
        out.append(ledger)
        flags.append(over_quota)
    return Trim(tuple(out), tuple(flags))


# --- idle cursors and unloaded topics ------------------------------------------------------------


def cursor_protection(cursor: Cursor, extra: Protection = NONE) -> str | None:
    """Why this cursor is never deleted (a `sweeper.rules.protection.Protected` value), or None:
    `sweeper.rules.protection`'s rule on the cursor's name and its replicated-subscription property."""
    found = protection.cursor_protection(cursor.name, None, extra, replicated=cursor.replicated)
    return found.value if found is not None else None


def topic_protection(namespace: str, local_name: str, extra: Protection = NONE) -> str | None:
    """Why nothing here acts on this topic (`namespace` is `tenant/namespace`), or None.

    `sweeper.rules.protection` names what Pulsar protects and what the operator adds; retention keeps off two wider
    families too (reason `system_topic`): any `__` topic (`SystemTopicNames` adds to them between releases) and
    every `pulsar/*` namespace (the broker's own: functions, the transaction coordinator, heartbeats).
    """
    tenant, _, ns = namespace.partition("/")
    found = protection.topic_protection(tenant, ns, local_name, extra)
    if found is not None:
        return found.value
    if local_name.startswith("__") or namespace.startswith("pulsar/"):
        return DebtReason.SYSTEM_TOPIC.value
    return None


def is_system_topic(namespace: str, local_name: str) -> bool:
    """Pulsar's own topic (`topic_protection` without the operator's globs): the `system_topic` column."""
    return topic_protection(namespace, local_name) is not None


@dataclass(frozen=True, slots=True)
class TopicSummary:
    """What `may_owe` needs of one managed ledger. Each field is an aggregate of one snapshot table (the ledger list,
    or the cursors), so the step can compute it for every topic without bringing a topic's rows together."""

    ledger_count: int
    first: Ledger | None  # the lowest-id ledger; None: not established (the list is not in id order, say)
    current_ledger_id: int  # the highest listed id
    total_size: int  # every listed ledger's size, a missing size counted 0 (as `trimmable` counts it)
    slowest: Position | None  # the lowest mark-delete of all durable cursors; None: no cursor
    slowest_compaction: Position | None  # the lowest of the `__compaction` cursors' (TTL never moves them)
    oldest_seen_ms: int | None  # the least recent max(znode mtime, lastActive) of the cursors


def summarize(ledgers: Sequence[Ledger], cursors: Sequence[Cursor]) -> TopicSummary:
    """`TopicSummary` of a topic's facts, as the step computes it from the tables."""
    first = min(ledgers, key=lambda x: x.ledger_id, default=None)
    compaction = [c.mark_delete for c in cursors if c.name == COMPACTION_CURSOR]
    return TopicSummary(len(ledgers), first, max((x.ledger_id for x in ledgers), default=-1),
                        sum(x.size for x in ledgers), min((c.mark_delete for c in cursors), default=None),
                        min(compaction, default=None),
                        min((max(c.zk_mtime_ms, c.last_active_ms) for c in cursors), default=None))


@dataclass(frozen=True)
class TopicSummaries:
    """`TopicSummary` of many topics as numpy columns of one length: the step's form, where no topic becomes an
    object. Absent values are 0; `first_known`, `has_cursor` and `has_compaction` say which are set."""

    ledger_count: np.ndarray
    first_known: np.ndarray
    first_ledger_id: np.ndarray
    first_entries: np.ndarray
    first_size: np.ndarray
    first_closed_ms: np.ndarray
    current_ledger_id: np.ndarray
    total_size: np.ndarray
    has_cursor: np.ndarray
    slowest_ledger_id: np.ndarray
    slowest_entry_id: np.ndarray
    has_compaction: np.ndarray
    compaction_ledger_id: np.ndarray
    compaction_entry_id: np.ndarray
    oldest_seen_ms: np.ndarray

    @classmethod
    def of(cls, summaries: Sequence[TopicSummary]) -> TopicSummaries:
        def column(values: Iterable[int | bool]) -> np.ndarray:
            return np.fromiter(values, dtype=np.int64, count=len(summaries))

        def flag(values: Iterable[bool]) -> np.ndarray:
            return np.fromiter(values, dtype=np.bool_, count=len(summaries))

        no_ledger, no_position = Ledger(0, 0, 0, 0), Position(0, 0)
        firsts = [s.first or no_ledger for s in summaries]
        slowest = [s.slowest or no_position for s in summaries]
        compaction = [s.slowest_compaction or no_position for s in summaries]
        return cls(column(s.ledger_count for s in summaries), flag(s.first is not None for s in summaries),
                   column(x.ledger_id for x in firsts), column(x.entries for x in firsts),
                   column(x.size for x in firsts), column(x.closed_ms for x in firsts),
                   column(s.current_ledger_id for s in summaries), column(s.total_size for s in summaries),
                   flag(s.slowest is not None for s in summaries), column(p.ledger_id for p in slowest),
                   column(p.entry_id for p in slowest), flag(s.slowest_compaction is not None for s in summaries),
                   column(p.ledger_id for p in compaction), column(p.entry_id for p in compaction),
                   column(s.oldest_seen_ms or 0 for s in summaries))


@dataclass(frozen=True)
class PolicyColumns:
    """Policies of many topics as numpy columns (`known` False: the policy cannot be established)."""

    known: np.ndarray
    retention_ms: np.ndarray  # negative: infinite
    retention_size_mb: np.ndarray  # negative: infinite
    ttl_seconds: np.ndarray

    @classmethod
    def of(cls, policies: Sequence[Policy | None]) -> PolicyColumns:
        def column(values: Iterable[int]) -> np.ndarray:
            return np.fromiter(values, dtype=np.int64, count=len(policies))

        return cls(np.fromiter((p is not None for p in policies), dtype=np.bool_, count=len(policies)),
                   column(p.retention_ms if p else 0 for p in policies),
                   column(p.retention_size_mb if p else 0 for p in policies),
                   column(p.ttl_seconds if p else 0 for p in policies))

    def take(self, indices: np.ndarray) -> PolicyColumns:
        return PolicyColumns(self.known[indices], self.retention_ms[indices], self.retention_size_mb[indices],
                             self.ttl_seconds[indices])


def idle_seen_cutoff_ms(now_ms: int, report_idle_ms: int) -> int:
    """No cursor whose znode write or `lastActive` is later than this can be idle in `assess_topic`: its last
    possible acknowledgement (`last_possible_ack_ms`) is at least both."""
    return now_ms - report_idle_ms


def may_owe_each(policies: PolicyColumns, quarantined: np.ndarray, s: TopicSummaries, now_ms: int,
                 report_idle_ms: int) -> np.ndarray:
    """For each topic, whether `assess_topic` may report anything: False only when it certainly finds nothing.

    Lets the step judge only the topics that may owe, whatever their namespaces' policies, from per-topic
    aggregates. A topic whose policy or metadata cannot be established is always reported (`unknown`), and so
    is one with a cursor old enough to be idle. Otherwise it owes only if `trimmable` is not empty, and
    `internalTrimLedgers` (Pulsar 4.0.8 `ManagedLedgerImpl`) walks the ledgers in id order and stops at the first
    one it keeps: so the lowest-id ledger decides. It goes only when it is before the slowest cursor's bound
    (`trim_bound`), is not the current ledger, and is past retention (`hasLedgerRetentionExpired`: time since
    its close timestamp; `isLedgerRetentionOverSizeQuota`: what remains without it is still at least the size
    quota; a negative limit never trims). TTL (`PersistentMessageExpiryMonitor`) may move every cursor but the
    compaction cursor forward, so under a TTL only those bound the walk here. `may_owe` is the same for one.
    """
    p = policies
    idle = s.has_cursor & (s.oldest_seen_ms <= idle_seen_cutoff_ms(now_ms, report_idle_ms))
    always = ~p.known | quarantined | idle
    may_trim = p.known & ((p.retention_ms >= 0) | (p.retention_size_mb >= 0)) & (s.ledger_count >= 2)
    first_unknown = may_trim & ~s.first_known  # a list not in id order: judged in full
    first_not_current = may_trim & s.first_known & (s.first_ledger_id < s.current_ledger_id)
    # The slowest position bounds the walk (`trim_bound`): the first ledger is before it when the slowest is on a
    # later ledger, or on this one's last entry. With no cursor nothing bounds it but the current ledger.
    before_slowest = (~s.has_cursor | (s.first_ledger_id < s.slowest_ledger_id)
                      | ((s.first_ledger_id == s.slowest_ledger_id) & (s.first_entries == s.slowest_entry_id + 1)))
    # Under a TTL a slowest cursor that is not the compaction cursor may have moved on: only the compaction
    # cursor bounds the walk then, at most one ledger past its own.
    slowest_is_compaction = (s.has_compaction & (s.slowest_ledger_id == s.compaction_ledger_id)
                             & (s.slowest_entry_id == s.compaction_entry_id))
    ttl_moves = (p.ttl_seconds > 0) & s.has_cursor & ~slowest_is_compaction
    before_compaction = ~s.has_compaction | (s.first_ledger_id <= s.compaction_ledger_id)
    before_bound = np.where(ttl_moves, before_compaction, before_slowest)
    over_quota = (p.retention_size_mb >= 0) & (s.total_size - s.first_size >= p.retention_size_mb * MEGABYTE)
    expired = (p.retention_ms >= 0) & (now_ms - s.first_closed_ms > p.retention_ms)
    return always | first_unknown | (first_not_current & before_bound & (over_quota | expired))


def may_owe(policy: Policy | None, quarantined: bool, summary: TopicSummary, now_ms: int, report_idle_ms: int) -> bool:
    """`may_owe_each` for one topic."""
    return bool(may_owe_each(PolicyColumns.of([policy]), np.array([quarantined]), TopicSummaries.of([summary]),
                             now_ms, report_idle_ms)[0])


def last_possible_ack_ms(cursor: Cursor, broker: BrokerRetention) -> int:
    """The latest time this cursor may have persisted an acknowledgement, from what ZooKeeper shows.

    With an active cursor ledger, acknowledgements after the znode's write go to that ledger, and the
    first one after a rollover period switches it (and writes the znode): so none was persisted later
    than one rollover period after the write. Without one, any persisted acknowledgement would have
    created a cursor ledger and written the znode.
    """
    seen = max(cursor.zk_mtime_ms, cursor.last_active_ms)
    return seen + broker.cursor_rollover_ms if cursor.cursor_ledger >= 0 else seen


@dataclass(frozen=True, slots=True)
class CursorDebt:
    name: str
    idle_ms: int  # at least this long without a persisted acknowledgement
    position_may_lag: bool  # ZooKeeper's mark-delete is a lower bound (active cursor ledger)
    protected: str | None  # `cursor_protection`'s reason; None: the cursor's own rules do not protect it
    pinned: Trim  # what it alone keeps from being trimmed (an upper bound when position_may_lag)
    cursor: Cursor


@dataclass(frozen=True, slots=True)
class TopicFacts:
    """One managed ledger as the snapshot shows it, with its policy."""

    ledgers: tuple[Ledger, ...]  # as listed (ledger-id order)
    cursors: tuple[Cursor, ...]
    zk_mtime_ms: int  # the managed-ledger znode's mtime: when its list last changed
    policy: Policy | None
    unknown_reason: DebtReason | None = None  # why the policy or metadata cannot be established
    unknown_detail: str = ""
    bundle_owned: bool | None = None  # the topic's bundle has a live owner; None: ownership not readable
    system_topic: bool = False
    protection: Protection = NONE  # the operator's globs, for `cursor_protection`


@dataclass(frozen=True, slots=True)
class TopicDebt:
    status: TopicStatus
    reason: DebtReason
    detail: str
    trim: Trim = field(default_factory=lambda: Trim((), ()))
    eligible_since_ms: int | None = None  # since when the oldest trimmable ledger has been trimmable
    unloaded_evidence: str | None = None  # bundle_not_owned | not_trimmed_since
    idle_pinned: Trim = field(default_factory=lambda: Trim((), ()))  # what the idle cursors together keep
    cursors: tuple[CursorDebt, ...] = ()  # the idle ones


def _positions(facts: TopicFacts, policy: Policy, now_ms: int, skip: frozenset[str] = frozenset()) -> list[Position]:
    out = []
    for c in facts.cursors:
        if c.name in skip:
            continue
        if c.name == COMPACTION_CURSOR:  # TTL never moves the compaction cursor (PersistentTopic.checkMessageExpiry)
            out.append(c.mark_delete)
        else:
            out.append(ttl_position(facts.ledgers, c.mark_delete, policy.ttl_seconds, now_ms))
    return out


def eligible_since(facts: TopicFacts, trim: Trim, policy: Policy) -> int | None:
    """Since when the oldest trimmable ledger has been trimmable, at the latest.

    The list and the cursor positions ZooKeeper shows exist since their znodes' last writes (positions
    only move forward, so a lagging one was at least as far then); the time rule adds the ledger's
    expiry, and a cursor moved only by TTL the expiry of the ledgers it passes.
    """
    if not trim.ledgers:
        return None
    state_since = max([facts.zk_mtime_ms, *(c.zk_mtime_ms for c in facts.cursors)])
    stored = [c.mark_delete for c in facts.cursors]
    bound_as_stored = trim_bound(facts.ledgers, stored)
    first, over_quota = trim.ledgers[0], trim.over_quota[0]
    since = state_since
    if not over_quota:
        since = max(since, first.closed_ms + policy.retention_ms + 1)
    if first.ledger_id >= bound_as_stored and policy.ttl_seconds > 0:
        since = max(since, first.closed_ms + policy.ttl_seconds * 1000 + 1)
    return since


def unloaded_evidence(since_ms: int | None, now_ms: int, bundle_owned: bool | None, ttl_involved: bool,
                      broker: BrokerRetention) -> str | None:
    """Why a topic holding trimmable ledgers is not loaded anywhere, or None when it may be.

    A loaded topic is trimmed every check interval; ledgers trimmable for longer than two intervals
    (plus a TTL pass when TTL had to move a cursor, and a margin for the write) mean no broker ran its
    retention. A bundle nobody owns (modular load manager) has no topic loaded at all.
    """
    if bundle_owned is False:
        return "bundle_not_owned"
    if since_ms is None:
        return None
    slack = 2 * broker.check_interval_ms + broker.untrimmed_margin_ms + (broker.expiry_check_ms if ttl_involved else 0)
    return "not_trimmed_since" if now_ms - since_ms > slack else None


def assess_topic(facts: TopicFacts, broker: BrokerRetention, now_ms: int, report_idle_ms: int) -> TopicDebt:
    """Retention debt of one managed ledger: expired ledgers nobody trims, and what idle cursors pin."""
    idle = []
    for c in facts.cursors:
        idle_ms = now_ms - last_possible_ack_ms(c, broker)
        if idle_ms >= report_idle_ms:
            idle.append((c, idle_ms))
    policy = facts.policy
    if policy is None or facts.unknown_reason is not None:
        reason = facts.unknown_reason or DebtReason.POLICY_MISSING
        cursors = tuple(CursorDebt(c.name, idle_ms, c.cursor_ledger >= 0, cursor_protection(c, facts.protection),
                                   Trim((), ()), c) for c, idle_ms in idle)
        return TopicDebt(TopicStatus.UNKNOWN, reason, facts.unknown_detail or reason.value, cursors=cursors)
    if not facts.ledgers:
        return TopicDebt(TopicStatus.NONE, DebtReason.NO_DEBT, "no ledgers")
    positions = _positions(facts, policy, now_ms)
    trim = trimmable(facts.ledgers, positions, policy, now_ms)
    debts = []
    idle_names = frozenset(c.name for c, _ in idle)
    idle_pinned = Trim((), ())
    if idle:
        together = trimmable(facts.ledgers, _positions(facts, policy, now_ms, idle_names), policy, now_ms)
        idle_pinned = _minus(together, trim)
        for c, idle_ms in idle:
            alone = trimmable(facts.ledgers, _positions(facts, policy, now_ms, frozenset([c.name])), policy, now_ms)
            debts.append(CursorDebt(c.name, idle_ms, c.cursor_ledger >= 0, cursor_protection(c, facts.protection),
                                    _minus(alone, trim), c))
    if not trim.ledgers:
        return TopicDebt(TopicStatus.NONE, DebtReason.NO_DEBT, "nothing past retention", trim, None, None, idle_pinned,
                         tuple(debts))
    since = eligible_since(facts, trim, policy)
    ttl_involved = policy.ttl_seconds > 0 and trim.ledgers[0].ledger_id >= trim_bound(
        facts.ledgers, [c.mark_delete for c in facts.cursors])
    evidence = unloaded_evidence(since, now_ms, facts.bundle_owned, ttl_involved, broker)
    count, size = len(trim.ledgers), trim.bytes
    if evidence is None:
        detail = (f"{count} ledgers ({size:,} bytes) past retention; the topic may be loaded: its next retention "
                  "check should trim them")
        return TopicDebt(TopicStatus.AWAITING_BROKER, DebtReason.EXPIRED_AWAITING_TRIM, detail, trim, since, None,
                         idle_pinned, tuple(debts))
    why = ("its bundle has no live owner" if evidence == "bundle_not_owned"
           else f"trimmable since {since} ms and untouched for longer than the broker's retention check allows")
    detail = f"{count} ledgers ({size:,} bytes) past retention nobody trims: {why}"
    return TopicDebt(TopicStatus.CANDIDATE, DebtReason.EXPIRED_UNLOADED, detail, trim, since, evidence, idle_pinned,
                     tuple(debts))


def _minus(more: Trim, base: Trim) -> Trim:
    ids = base.ids
    pairs = [(ledger, flag) for ledger, flag in zip(more.ledgers, more.over_quota, strict=True)
             if ledger.ledger_id not in ids]
    return Trim(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))


# --- what may be acted on -----------------------------------------------------------------------


def topic_status(debt: TopicDebt, in_scope: bool, protected: str | None = None) -> TopicStatus:
    """Only `candidate` is ever loaded, and only with --execute. A protected topic (`topic_protection`'s reason)
    is `protected` whatever it owes: even a policy we cannot read does not make it one to look at again."""
    if protected is not None:
        return TopicStatus.PROTECTED
    if debt.status is TopicStatus.CANDIDATE and not in_scope:
        return TopicStatus.OUT_OF_SCOPE
    return debt.status


def cursor_status(cursor: CursorDebt, topic: TopicStatus, delete_after_ms: int, in_scope: bool,
                  topic_protected: str | None = None) -> CursorStatus:
    """Only `candidate` subscriptions are ever deleted: idle past [retention] cursor_idle_days (0: never),
    not protected (by its own rule or its topic's), in scope, and on a topic whose policy is known. Protection
    comes first: it does not depend on the policy, and an unknown topic's replicated subscription is still one."""
    if cursor.protected is not None or topic_protected is not None:
        return CursorStatus.PROTECTED
    if topic is TopicStatus.UNKNOWN:
        return CursorStatus.UNKNOWN
    if delete_after_ms <= 0 or cursor.idle_ms < delete_after_ms:
        return CursorStatus.IDLE
    if not in_scope:
        return CursorStatus.OUT_OF_SCOPE
    return CursorStatus.CANDIDATE


# --- bundle ownership ----------------------------------------------------------------------------


def topic_bundle_hash(topic_name: str) -> int:
    """The hash Pulsar places a topic in a namespace bundle by: CRC32 of `TopicName.toString()`, unsigned
    (ConsistentHashingTopicBundleAssigner, the default topicBundleAssignmentStrategy)."""
    return zlib.crc32(topic_name.encode("utf-8"))


def parse_bundle_range(name: str) -> tuple[int, int] | None:
    """`0x00000000_0x40000000` -> (lower, upper); None for anything else."""
    parts = name.split("_")
    if len(parts) != 2 or not all(p.startswith("0x") and len(p) == 10 for p in parts):
        return None
    try:
        lower, upper = int(parts[0], 16), int(parts[1], 16)
    except ValueError:
        return None
    return (lower, upper) if lower < upper else None


def bundle_owned(topic_name: str, owned: Sequence[tuple[int, int]]) -> bool:
    """Whether the bundle holding this topic is among the owned ranges ([lower, upper), the last bundle's
    upper bound 0xffffffff included, as NamespaceBundle.includes)."""
    h = topic_bundle_hash(topic_name)
    return any(lower <= h < upper or (h == upper == 0xFFFFFFFF) for lower, upper in owned)
