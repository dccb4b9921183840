"""Whether one pending-delete record may be executed: pure functions over plain values, no I/O.

The executors read ZooKeeper and S3 and hand what they saw to these functions, so every rule
that keeps a live ledger alive can be tested without a server and reads in one place.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from sweeper import names
from sweeper.codecs.bookkeeper import LedgerMetadata
from sweeper.codecs.errors import InvalidPendingDelete, MetadataDecodeError
from sweeper.codecs.pending_delete import COMPONENTS, validate
from sweeper.objectstore.base import store_kind
from sweeper.rules.safety import ledger_created_ms
from sweeper.scan.bookkeeper import split_custom_metadata

DELETE = "delete"
ALREADY_GONE = "already_gone"
# An operator-listed id with no znode that no snapshot of the tables ever saw: likely a typo, never "success".
NOT_FOUND = "not_found"
IN_USE = "in_use"
MISMATCH = "mismatch"
INVALID = "invalid"

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class Decision:
    outcome: str
    detail: str

    @property
    def delete(self) -> bool:
        return self.outcome == DELETE


@dataclass(frozen=True)
class LiveLedger:
    """A ledger's metadata znode as read just now."""

    path: str
    zk_version: int
    znode_ctime_ms: int
    metadata_ctime_ms: int | None
    state: str
    custom: dict[str, str]  # text custom metadata (binary values such as pulsar/compactedTo left out)

    @classmethod
    def of(cls, path: str, md: LedgerMetadata, zk_version: int, znode_ctime_ms: int) -> LiveLedger:
        """Raises MetadataDecodeError when an ownership value is not text: such a ledger cannot be verified."""
        text, _ = split_custom_metadata(md.custom_metadata)
        return cls(path, zk_version, znode_ctime_ms, md.ctime, md.state, text)

    @property
    def created_ms(self) -> int:
        # The later of the broker's clock (metadata ctime, often absent) and ZooKeeper's (znode ctime).
        return ledger_created_ms(self.metadata_ctime_ms, self.znode_ctime_ms) or 0


@dataclass(frozen=True)
class ReferrerState:
    """What the referrer znodes say about one ledger (or one offloaded copy), as read just now."""

    references: tuple[str, ...] = ()  # one human line per reference still held
    unverifiable: str | None = None  # why the referrer could not be read or understood
    versions: tuple[tuple[str, int], ...] = field(default=())  # (path, version) of every referrer znode read
    owner_exists: bool = True  # the managed ledger (or schema locator) is still there
    protected: str | None = None  # the record's own cursor, as read just now, is protected (replicated)
    # Offloaded copies the managed ledger says replace this BookKeeper ledger (bookkeeperDeleted, complete):
    # (bucket, region, endpoint, keys, managed ledger). They must exist before the BookKeeper copy goes.
    offloaded: tuple[tuple[str, str, str, tuple[str, ...], str], ...] = ()


def managed_ledger_name(topic_name: str | None) -> str | None:
    """`persistent://t/ns/my topic` -> `t/ns/persistent/my+topic`: the managed ledger Pulsar names after
    the topic (TopicName.getPersistenceNamingEncoding, the local name through Codec.encode)."""
    return names.managed_ledger_for_topic(topic_name)


def _expected_component(custom: Mapping[str, str]) -> str | None:
    component = COMPONENTS.get(custom.get("component") or "")
    if component == "MANAGED_LEDGER" and custom.get("pulsar/cursor"):
        return "MANAGED_CURSOR"
    return component


def _field(record: Mapping[str, Any], name: str) -> str | None:
    return record.get(name) or None


def ownership_mismatch(record: Mapping[str, Any], custom: Mapping[str, str]) -> str | None:
    """Why the record does not describe this ledger, or None. A record that fails here is forged or stale."""
    component = record.get("ledgerComponent")
    actual = _expected_component(custom)
    if actual != component:
        return f"record says {component}, ledger metadata says component={custom.get('component')!r}" + (
            f" with cursor {custom['pulsar/cursor']!r}" if custom.get("pulsar/cursor") else "")
    pairs: list[tuple[str, str | None, str | None]] = []
    if component in ("MANAGED_LEDGER", "MANAGED_CURSOR"):
        pairs.append(("pulsar/managed-ledger", managed_ledger_name(record.get("topicName")),
                      custom.get("pulsar/managed-ledger")))
        pairs.append(("pulsar/cursor", _field(record, "cursorName"), custom.get("pulsar/cursor")))
    elif component == "SCHEMA_STORAGE":
        pairs.append(("pulsar/schemaId", _field(record, "schemaId"), custom.get("pulsar/schemaId")))
    elif component == "COMPACTED_LEDGER":
        pairs.append(("pulsar/compactedTopic", _field(record, "topicName"), custom.get("pulsar/compactedTopic")))
    elif component == "DELAYED_INDEX_BUCKET":
        properties = record.get("properties") or {}
        pairs.append(("pulsar/delayedIndexBucketKey", properties.get("bucket_key") or None,
                      custom.get("pulsar/delayedIndexBucketKey")))
        pairs.append(("pulsar/delayedIndexTopic", _field(record, "topicName"), custom.get("pulsar/delayedIndexTopic")))
    for key, wanted, actual_value in pairs:
        if wanted != actual_value:
            return f"{key}: record has {wanted!r}, ledger has {actual_value!r}"
    return None


def _record_problem(record: Mapping[str, Any], ledger_type: str) -> str | None:
    try:
        validate(record)
    except InvalidPendingDelete as exc:
        return str(exc)
    if record.get("ledgerType") != ledger_type:
        return f"expected a {ledger_type} record, got ledgerType={record.get('ledgerType')!r}"
    if record.get("ledgerComponent") not in (*COMPONENTS.values(), "MANAGED_CURSOR"):
        return f"unknown ledgerComponent {record.get('ledgerComponent')!r}"
    if record.get("topicName") is not None and managed_ledger_name(record["topicName"]) is None:
        return f"topicName {record['topicName']!r} is not a persistent topic name"
    return None


def check_ledger(record: Mapping[str, Any], live: LiveLedger | None, now_ms: int, min_age_ms: int,
                 expected_path: str, ever_seen: bool = True) -> Decision | None:
    """Every rule that needs only the record and the ledger znode; None means "now ask the referrer".

    `ever_seen`: False for an operator-listed ledger id that no snapshot of the tables lists; its missing znode
    is then `not_found` (check the id), not `already_gone` (someone deleted it)."""
    ledger_id = record.get("ledgerId")
    if not isinstance(ledger_id, int) or isinstance(ledger_id, bool) or ledger_id < 0:
        return Decision(INVALID, f"ledgerId must be a non-negative long, got {ledger_id!r}")
    if record.get("ledgerType") != "LEDGER":
        return Decision(INVALID, f"expected a LEDGER record, got ledgerType={record.get('ledgerType')!r}")
    properties = record.get("properties") or {}
    claimed = properties.get("zk_path")
    if claimed and claimed != expected_path:
        # We never act on a path from the record, but one that disagrees says the record is not ours.
        return Decision(MISMATCH, f"record names znode {claimed!r}, ledger {ledger_id} lives at "
                                  f"{expected_path!r}")
    # Gone, or not Pulsar's: final whatever else the record says (so even an incomplete record gets its answer).
    # No znode means no ledger to BookKeeper (AbstractZkLedgerManager.readLedgerMetadata answers
    # NoSuchLedgerExistsOnMetadataServerException; removeLedgerMetadata deletes the znode). Whether that is
    # someone's delete or an id that never existed, only our snapshots can tell.
    if live is None and not ever_seen:
        return Decision(NOT_FOUND, f"no metadata znode at {expected_path} and no snapshot in these tables lists "
                                   f"ledger {ledger_id}: check the id")
    if live is None:
        return Decision(ALREADY_GONE, f"no metadata znode at {expected_path}")
    if live.path != expected_path:
        return Decision(MISMATCH, f"read {live.path!r}, expected {expected_path!r}")
    if live.custom.get("application") != "pulsar":
        return Decision(MISMATCH, f"not a Pulsar ledger (application={live.custom.get('application')!r})")
    problem = _record_problem(record, "LEDGER")
    if problem:
        return Decision(INVALID, problem)
    why = ownership_mismatch(record, live.custom)
    if why:
        return Decision(MISMATCH, why)
    planned = properties.get("zk_version")
    if planned not in (None, "") and str(live.zk_version) != str(planned):
        return Decision(IN_USE, f"metadata changed since the plan (version {planned} -> {live.zk_version})")
    age = now_ms - live.created_ms
    if live.created_ms <= 0 or age < min_age_ms:
        return Decision(IN_USE, f"younger than the grace period ({age} ms < {min_age_ms} ms)")
    if live.state == "IN_RECOVERY":
        # Someone is fencing and recovering it right now: a reader or writer is active.
        return Decision(IN_USE, "ledger is IN_RECOVERY")
    # OPEN is no reason to keep it: past the grace period and listed nowhere, it is the classic orphan of a
    # broker that created a ledger and died before adding it to the topic's list (a current ledger is listed).
    return None


def decide_referrer(referrer: ReferrerState) -> Decision:
    if referrer.unverifiable:
        # Not a retry: the referrer will read the same way next time. Keep the ledger, report why.
        return Decision(IN_USE, f"referrer cannot be verified: {referrer.unverifiable}")
    if referrer.references:
        return Decision(IN_USE, "still referenced: " + "; ".join(referrer.references))
    return Decision(DELETE, "no referrer holds it")


def decide_ledger(record: Mapping[str, Any], live: LiveLedger | None, referrer: ReferrerState, now_ms: int,
                  min_age_ms: int, expected_path: str) -> Decision:
    return check_ledger(record, live, now_ms, min_age_ms, expected_path) or decide_referrer(referrer)


@dataclass(frozen=True)
class LiveObject:
    """One offloaded object as a HeadObject just answered."""

    key: str
    last_modified_ms: int
    metadata: dict[str, str]  # user metadata, keys lower-cased


def object_mismatch(record: Mapping[str, Any], objects: Collection[LiveObject], local_cluster: str, now_ms: int,
                    min_age_ms: int) -> Decision | None:
    """Ties an offload record to the objects it would delete: each must say, in its own user metadata, that
    this cluster offloaded it for the record's managed ledger, and be past the grace period.

    Without this, a record naming a live (uuid, ledger) pair under a wrong or made-up topic would find
    no referrer and delete the objects (PIP-186's forged-record rule, applied to tiered storage).
    """
    wanted = managed_ledger_name(record.get("topicName"))
    for obj in objects:
        cluster = obj.metadata.get("pulsarclustername")
        owner = obj.metadata.get("managedledgername")
        if not local_cluster or cluster != local_cluster:
            return Decision(MISMATCH, f"{obj.key}: pulsarClusterName is {cluster!r}, this cluster is "
                                      f"{local_cluster!r}: never delete another cluster's object")
        if owner is None or owner != wanted:
            return Decision(MISMATCH, f"{obj.key}: ManagedLedgerName is {owner!r}, the record names {wanted!r}")
        age = now_ms - obj.last_modified_ms
        if age < min_age_ms:
            return Decision(IN_USE, f"{obj.key} is younger than the grace period ({age} ms < {min_age_ms} ms)")
    return None


def unsupported_store(bucket: str, drivers: Mapping[str, str]) -> str | None:
    """Why this version leaves the offloaded copies in `bucket` alone: its offload contexts name a store other than
    S3 (`drivers`: bucket -> driver, for such buckets only). The snapshot lists those stores and reconcile plans for
    them (issue 48); the object deleter speaks S3 only, and on another store's bucket name a HEAD would find
    nothing and report `already_gone` for what it never saw. None: an S3 bucket, deleted as before."""
    driver = drivers.get(bucket)
    if driver is None or store_kind(driver) == "s3":
        return None
    return (f"offload store {driver!r} ({bucket}): its objects are listed and reconciled, but this version deletes "
            "offloaded copies on S3 only")


def check_object(record: Mapping[str, Any], allowed_buckets: Collection[str]) -> Decision | None:
    """Rules on the record alone for an offloaded copy; None means "now look at the objects and the ML"."""
    problem = _record_problem(record, "OFFLOAD_LEDGER")
    if problem:
        return Decision(INVALID, problem)
    context = record["offloadContext"]
    if context.get("bucket") not in allowed_buckets:
        return Decision(INVALID, f"bucket {context.get('bucket')!r} is not one this run may delete from")
    uuid = context.get("uuid") or ""
    if not _UUID.match(uuid):
        return Decision(INVALID, f"offload uuid {uuid!r} is not a lower-case UUID")
    ledger_id = record["ledgerId"]
    allowed = {f"{uuid}-ledger-{ledger_id}", f"{uuid}-ledger-{ledger_id}-index"}
    keys = list(context.get("keys") or [])
    if not keys or len(set(keys)) != len(keys) or not set(keys) <= allowed:
        return Decision(INVALID, f"keys {keys} are not exactly ledger {ledger_id}'s objects of offload {uuid}")
    return None


def decide_object(record: Mapping[str, Any], live: Collection[LiveObject], referrer: ReferrerState,
                  allowed_buckets: Collection[str], local_cluster: str, now_ms: int, min_age_ms: int) -> Decision:
    early = check_object(record, allowed_buckets)
    if early:
        return early
    if not live:
        return Decision(ALREADY_GONE, "no object left")
    return object_mismatch(record, live, local_cluster, now_ms, min_age_ms) or decide_referrer(referrer)


def unreadable(what: str, exc: MetadataDecodeError) -> str:
    return f"{what}: {exc.kind}: {exc}"
