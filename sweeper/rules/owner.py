"""The rules every stage that plans or acts applies to a ledger's owner, as one function (DESIGN invariant 16).

Reconcile asks it while planning; the delete stage asks it again for every record, whatever planned it
(an emitted plan, `--from-json`, `--from-topic`, a retry, a re-driven dead letter), under the config of
the day it runs. A record is a request, never a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sweeper import names
from sweeper.rules.classify import Sharing
from sweeper.rules.protection import NONE, Protection, cursor_protection, describe, topic_protection
from sweeper.rules.safety import Scope

SHARED_UNVERIFIED = "shared_bookkeeper_unverified"
PROTECTED = "protected"
OUT_OF_SCOPE = "out_of_scope"
OTHER_CLUSTER = "other_cluster"


def owner_scope(managed_ledger: str | None, schema_id: str | None, topic: str | None) -> tuple[str | None, ...]:
    """(tenant, namespace, topic) of a ledger's owner, from whichever name it has; Nones when none parses."""
    if managed_ledger:
        parts = names.parse_managed_ledger(managed_ledger)
        if parts is not None:
            return parts.tenant, parts.namespace, parts.local
    if schema_id:
        pieces = schema_id.split("/")
        if len(pieces) in (3, 4) and all(pieces):
            return pieces[0], "/".join(pieces[1:-1]), pieces[-1]
    if topic:
        parsed = names.parse_topic(topic)
        if parsed is not None:
            return parsed.tenant, parsed.namespace, parsed.local
    return None, None, None


@dataclass(frozen=True)
class Owner:
    """Whose ledger it is, by Pulsar's names: (tenant, namespace, decoded local topic name, cursor)."""

    tenant: str | None
    namespace: str | None
    topic: str | None
    cursor: str | None = None

    @classmethod
    def of_record(cls, topic_name: str | None, schema_id: str | None, cursor: str | None) -> Owner:
        """A pending-delete record's owner: its topic, else its schema id (reconcile names them the same way)."""
        tenant, namespace, topic = owner_scope(None, schema_id, topic_name)
        return cls(tenant, namespace, topic, cursor)


@dataclass(frozen=True)
class ActingRules:
    """What may be acted on, from today's config ([safety] allow/deny, bookkeeper_dedicated, peer_metadata;
    [retention] protected_*)."""

    scope: Scope = field(default_factory=Scope)
    protection: Protection = NONE
    sharing: Sharing = Sharing.UNVERIFIED


def protection_of(owner: Owner, extra: Protection) -> str | None:
    """Why Pulsar (or the operator) protects this cursor ledger's cursor, as `protected: <reason>: <why>`; None
    when nothing does, and for ledgers that are no cursor's.

    Protection is about subscription state: a protected cursor (or any cursor of a protected topic, such as a
    pending-ack store's) keeps its cursor ledgers. A data ledger a topic dropped from its list is garbage
    whoever owns the topic: Pulsar trims system topics like any other. Only a cursor's name is known here; a
    live cursor's properties (replicated) are checked where the delete reads it."""
    if owner.cursor is None:
        return None
    found = topic_protection(owner.tenant, owner.namespace, owner.topic, extra) or cursor_protection(
        owner.cursor, None, extra)
    return f"{PROTECTED}: {found.value}: {describe(found)}" if found is not None else None


def refusal(owner: Owner, rules: ActingRules, owner_exists: bool = True,
            bookkeeper: bool = True) -> tuple[str, str] | None:
    """(rule, detail) when the owner's ledger (or offloaded copy) must not be touched; None when these rules allow
    it. `bookkeeper`: the target is a BookKeeper ledger, whose metadata names no cluster. `owner_exists`: the topic
    (or schema) is still in the metadata; protection keeps a live topic's state, and a deleted topic has none."""
    if bookkeeper and rules.sharing is Sharing.UNVERIFIED:
        return SHARED_UNVERIFIED, ("another Pulsar cluster may write to these bookies and was not read: set [safety] "
                                   "bookkeeper_dedicated = true, or list every other cluster in [safety] peer_metadata")
    protected = protection_of(owner, rules.protection) if owner_exists else None
    if protected is not None:
        return PROTECTED, protected
    if not rules.scope.permits(owner.tenant, owner.namespace):
        where = f"{owner.tenant}/{owner.namespace}" if owner.tenant else "an unknown namespace"
        return OUT_OF_SCOPE, f"{where} is outside [safety] allow / deny"
    return None
