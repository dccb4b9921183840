"""What Pulsar protects, and we never touch: one rule, used wherever the sweeper acts or plans to.

Reconcile (the cursor and topic ledgers it would call orphans), the retention-debt plan (idle cursors,
unloaded topics), the retention repair (right before each admin call, even when a plan names the
target) and the delete stage (re-checking every record, whatever its source) all ask these functions;
none keeps a copy of the names. Each built-in name cites the upstream class that defines it:

- Replicated subscriptions: `PersistentSubscription` stores the long cursor property
  `pulsar.replicated.subscription` = 1 (REPLICATED_SUBSCRIPTION_PROPERTY) for a consumer with
  `replicateSubscriptionState`; `PersistentTopic.checkInactiveSubscriptions` skips `sub.isReplicated()`,
  so the broker never expires one, and the peers' subscription snapshots rely on it. Topic stats show it
  as `isReplicated`.
- Transaction pending-ack stores: `<topic>-<sub>__transaction_pending_ack` with the cursor
  `__pending_ack_state` (`SystemTopicNames.PENDING_ACK_STORE_SUFFIX`, `PENDING_ACK_STORE_CURSOR_NAME`);
  before 2.8 `<topic>-<sub>-transaction-pendingack` with the cursor `pendingack` (`MLPendingAckStore`).
  Deleting that cursor loses the acknowledgements of open transactions.
- Transaction buffers and the coordinator: `__transaction_buffer_snapshot` (`SystemTopicNames`), its
  segmented form `__transaction_buffer_snapshot_segments` and `__transaction_buffer_snapshot_indexes`
  (`SystemTopicNames` in 3.x, PIP-196), `pulsar/system/transaction_coordinator_assign*` and
  `pulsar/system/__transaction_log_*` (`SystemTopicNames.isTransactionInternalName`).
- Topic policies: `__change_events` (`SystemTopicNames.NAMESPACE_EVENTS_LOCAL_NAME`).
- System cursors: `__compaction` (`Compactor.COMPACTION_SUBSCRIPTION`), replicators `pulsar.repl.<cluster>`
  (`PersistentReplicator`'s cursor, `replicatorPrefix` = "pulsar.repl"), deduplication `pulsar.dedup`
  (`MessageDeduplication`); every `pulsar.` cursor is Pulsar's own.
- What the operator adds: `[retention] protected_subscriptions` (globs on the subscription name) and
  `protected_topics` (globs on `tenant/namespace/topic` or the full `persistent://` name).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from sweeper import names
from sweeper.rules.safety import globs
from sweeper.vocabulary import CHANGE_EVENTS, COMPACTION_CURSOR

REPLICATED_SUBSCRIPTION_PROPERTY = "pulsar.replicated.subscription"
PENDING_ACK_SUFFIX = "__transaction_pending_ack"
PENDING_ACK_CURSOR = "__pending_ack_state"
LEGACY_PENDING_ACK_SUFFIX = "-transaction-pendingack"
LEGACY_PENDING_ACK_CURSOR = "pendingack"
TRANSACTION_BUFFER_SNAPSHOTS = ("__transaction_buffer_snapshot", "__transaction_buffer_snapshot_segments",
                                "__transaction_buffer_snapshot_indexes")
SYSTEM_NAMESPACE = "pulsar/system"
_PARTITION = re.compile(r"-partition-\d+$")


class Protected(StrEnum):
    """Why something is protected: the value lands in the tables' `reason` / `detail` columns."""

    REPLICATED_SUBSCRIPTION = "replicated_subscription"
    PENDING_ACK_STORE = "transaction_pending_ack_store"
    PENDING_ACK_CURSOR = "transaction_pending_ack_cursor"
    TRANSACTION_BUFFER = "transaction_buffer_snapshot"
    TRANSACTION_COORDINATOR = "transaction_coordinator"
    TOPIC_POLICIES = "topic_policy_events"
    COMPACTION_CURSOR = "compaction_cursor"
    PULSAR_CURSOR = "pulsar_system_cursor"  # replicators, deduplication, any other `pulsar.` cursor
    OPERATOR_TOPIC = "operator_protected_topic"
    OPERATOR_SUBSCRIPTION = "operator_protected_subscription"


@dataclass(frozen=True)
class Protection:
    """The operator's additions to what Pulsar protects ([retention] protected_subscriptions / protected_topics)."""

    subscriptions: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()

    @classmethod
    def of(cls, subscriptions: str = "", topics: str = "") -> Protection:
        return cls(globs(subscriptions), globs(topics))


NONE = Protection()


def _base_local(local: str) -> str:
    """A partition's local name without `-partition-N`: Pulsar names system topics per partitioned topic."""
    return _PARTITION.sub("", local)


def topic_protection(tenant: str | None, namespace: str | None, local: str | None,
                     extra: Protection = NONE) -> Protected | None:
    """Why a topic (decoded local name) is Pulsar's own, or the operator's protected one; None when neither."""
    if not local:
        return None
    base = _base_local(local)
    if local.endswith(PENDING_ACK_SUFFIX) or local.endswith(LEGACY_PENDING_ACK_SUFFIX):
        return Protected.PENDING_ACK_STORE
    if base in TRANSACTION_BUFFER_SNAPSHOTS:
        return Protected.TRANSACTION_BUFFER
    if base == CHANGE_EVENTS:
        return Protected.TOPIC_POLICIES
    if f"{tenant}/{namespace}" == SYSTEM_NAMESPACE and (
            base.startswith("transaction_coordinator_assign") or base.startswith("__transaction_log_")):
        return Protected.TRANSACTION_COORDINATOR
    if extra.topics and tenant and namespace:
        short = f"{tenant}/{namespace}/{local}"
        candidates = (short, f"{tenant}/{namespace}/{base}", f"{names.TOPIC_PREFIX}{short}",
                      f"{names.TOPIC_PREFIX}{tenant}/{namespace}/{base}")
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in extra.topics for name in candidates):
            return Protected.OPERATOR_TOPIC
    return None


def cursor_protection(cursor: str | None, long_properties: Mapping[str, int] | None = None,
                      extra: Protection = NONE, replicated: bool | None = None) -> Protected | None:
    """Why a cursor (decoded subscription name) must never be deleted, nor its cursor ledger; None when it may.

    `long_properties` are the cursor znode's (`ManagedCursorInfo.properties`); `replicated` is the broker's
    `isReplicated` from topic stats, when the caller has them. A deleted cursor's properties are gone: its
    name is then all there is to judge by.
    """
    if cursor is None:
        return None
    if replicated or (long_properties or {}).get(REPLICATED_SUBSCRIPTION_PROPERTY, 0) == 1:
        return Protected.REPLICATED_SUBSCRIPTION
    if cursor in (PENDING_ACK_CURSOR, LEGACY_PENDING_ACK_CURSOR):
        return Protected.PENDING_ACK_CURSOR
    if cursor == COMPACTION_CURSOR:
        return Protected.COMPACTION_CURSOR
    if cursor.startswith("pulsar."):
        return Protected.PULSAR_CURSOR
    if any(fnmatch.fnmatchcase(cursor, pattern) for pattern in extra.subscriptions):
        return Protected.OPERATOR_SUBSCRIPTION
    return None


def managed_ledger_protection(managed_ledger: str | None, cursor: str | None = None,
                              long_properties: Mapping[str, int] | None = None,
                              extra: Protection = NONE) -> Protected | None:
    """The topic rule, then the cursor rule, for a managed-ledger name (`tenant/ns/persistent/<encoded>`)."""
    parts = names.parse_managed_ledger(managed_ledger) if managed_ledger else None
    if parts is not None:
        found = topic_protection(parts.tenant, parts.namespace, parts.local, extra)
        if found is not None:
            return found
    return cursor_protection(cursor, long_properties, extra)


def describe(reason: Protected) -> str:
    return {
        Protected.REPLICATED_SUBSCRIPTION: "a geo-replicated subscription (pulsar.replicated.subscription): the "
                                           "broker never expires it and its peers rely on it",
        Protected.PENDING_ACK_STORE: "a transaction pending-ack store: its cursor holds open transactions' acks",
        Protected.PENDING_ACK_CURSOR: "a transaction pending-ack cursor: it holds open transactions' acks",
        Protected.TRANSACTION_BUFFER: "a transaction buffer snapshot topic",
        Protected.TRANSACTION_COORDINATOR: "a transaction coordinator topic",
        Protected.TOPIC_POLICIES: "the namespace's topic-policy system topic",
        Protected.COMPACTION_CURSOR: "the compaction cursor",
        Protected.PULSAR_CURSOR: "a cursor Pulsar itself owns (replicator, deduplication)",
        Protected.OPERATOR_TOPIC: "in [retention] protected_topics",
        Protected.OPERATOR_SUBSCRIPTION: "in [retention] protected_subscriptions",
    }[reason]
