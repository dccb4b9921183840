"""PIP-186 `PendingDeleteLedgerInfo` records: built from orphans, encoded with Avro, and checked.

The emit stage publishes these; the delete stage and the pending-deletes snapshot read them back
from a topic anyone with produce permission can write to, so decoding validates every record and
refuses what is malformed, never guessing at a missing field.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

import fastavro

from sweeper import names, resources
from sweeper.codecs.errors import InvalidPendingDelete

# Ledger custom-metadata component -> record component (cursor ledgers are managed-ledger ledgers
# that carry `pulsar/cursor`).
COMPONENTS = {
    "managed-ledger": "MANAGED_LEDGER",
    "schema": "SCHEMA_STORAGE",
    "compacted-ledger": "COMPACTED_LEDGER",
    "delayed-index-bucket": "DELAYED_INDEX_BUCKET",
}


@cache
def schema_json() -> str:
    """The Avro schema's JSON, as registered for the topic: shipped in the package (sweeper/resources), so it is read
    the same from a checkout, an installed wheel and the zip spark-submit ships to executors."""
    return resources.read_text(resources.PENDING_DELETE_SCHEMA)


@cache
def schema() -> Any:
    return fastavro.parse_schema(json.loads(schema_json()))


def _topic_of(managed_ledger: str | None) -> str | None:
    """The topic name (decoded, Pulsar's TopicName form) of a managed ledger; see sweeper.names."""
    return names.topic_for_managed_ledger(managed_ledger)


def _topic_from_scope(row: Mapping[str, Any]) -> str | None:
    """The owner topic from the orphan's tenant/namespace/topic (bucket and compacted ledgers of deleted topics)."""
    if row.get("tenant") and row.get("namespace") and row.get("topic"):
        return f"persistent://{row['tenant']}/{row['namespace']}/{row['topic']}"
    return None


def records_for_orphans(orphans: Iterable[Mapping[str, Any]], offload_targets: Mapping[str, tuple[str, str]]
                        | None = None) -> list[dict[str, Any]]:
    """One record per candidate ledger, one per offloaded copy (data and index keys together).

    A ledger that is on BookKeeper and in tiered storage yields two records, as PIP-186 asks.
    `offload_targets` maps bucket -> (region, endpoint) for the offload contexts.
    """
    out: list[dict[str, Any]] = []
    copies: dict[tuple[str, str, int], dict[str, Any]] = {}
    for row in orphans:
        if row.get("status") != "candidate":
            continue
        if row["object_type"] == "ledger":
            component = COMPONENTS.get(row.get("component") or "")
            if component is None:
                continue  # classify() never makes these candidates; refuse rather than guess
            if component == "MANAGED_LEDGER" and row.get("cursor"):
                component = "MANAGED_CURSOR"
            out.append({
                "topicName": _topic_of(row.get("managed_ledger")) or _topic_from_scope(row),
                "ledgerComponent": component,
                "ledgerType": "LEDGER",
                "ledgerId": int(row["ledger_id"]),
                "cursorName": row.get("cursor"),
                "schemaId": row.get("schema_id"),
                "offloadContext": None,
                "properties": {k: str(row[k]) for k in ("bucket_key", "zk_path", "zk_version") if row.get(k)},
                "reason": row.get("reason"),
                "runId": row.get("run_id"),
            })
        elif row["object_type"] == "offload_object":
            key = (row["s3_bucket"], row["offload_uuid"], int(row["ledger_id"]))
            record = copies.get(key)
            if record is None:
                region, endpoint = (offload_targets or {}).get(row["s3_bucket"], ("", ""))
                record = {
                    "topicName": _topic_of(row.get("managed_ledger")),
                    "ledgerComponent": "MANAGED_LEDGER",
                    "ledgerType": "OFFLOAD_LEDGER",
                    "ledgerId": int(row["ledger_id"]),
                    "cursorName": None,
                    "schemaId": None,
                    "offloadContext": {"uuid": row["offload_uuid"], "bucket": row["s3_bucket"],
                                       "region": region or None, "endpoint": endpoint or None, "keys": []},
                    "properties": {},
                    "reason": row.get("reason"),
                    "runId": row.get("run_id"),
                }
                copies[key] = record
                out.append(record)
            record["offloadContext"]["keys"].append(row["s3_key"])
    for record in copies.values():
        record["offloadContext"]["keys"].sort()
    return out


def encode(record: Mapping[str, Any]) -> bytes:
    """Schemaless Avro, as a Pulsar producer with an AVRO schema puts it on the wire."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema(), dict(record))
    return buffer.getvalue()


def decode(payload: bytes, check: bool = True) -> dict[str, Any]:
    """A validated record (or, with `check=False`, one that is only well-formed Avro), or InvalidPendingDelete.

    The delete executors decode unchecked and validate themselves, after the checks that need no
    complete record ("already gone", "not a Pulsar ledger"), so such records still get those outcomes.
    """
    buffer = io.BytesIO(payload)
    try:
        record = fastavro.schemaless_reader(buffer, schema(), None)
    except Exception as exc:  # fastavro raises several types for corrupt input
        raise InvalidPendingDelete(f"not a PendingDeleteLedgerInfo: {exc}", "malformed") from exc
    if buffer.tell() != len(payload):
        raise InvalidPendingDelete(f"{len(payload) - buffer.tell()} trailing bytes after the record", "malformed")
    if check:
        validate(record)
    return record


def validate(record: Mapping[str, Any]) -> None:
    ledger_id, component, kind = record.get("ledgerId"), record.get("ledgerComponent"), record.get("ledgerType")
    if not isinstance(ledger_id, int) or ledger_id < 0:
        raise InvalidPendingDelete(f"ledgerId must be a non-negative long, got {ledger_id!r}", "invalid_field")
    if component == "MANAGED_CURSOR" and not record.get("cursorName"):
        raise InvalidPendingDelete("a MANAGED_CURSOR record needs cursorName", "missing_field")
    if component == "SCHEMA_STORAGE" and not record.get("schemaId"):
        raise InvalidPendingDelete("a SCHEMA_STORAGE record needs schemaId", "missing_field")
    if component in ("MANAGED_LEDGER", "MANAGED_CURSOR", "COMPACTED_LEDGER", "DELAYED_INDEX_BUCKET") \
            and not record.get("topicName"):
        raise InvalidPendingDelete(f"a {component} record needs topicName", "missing_field")
    context = record.get("offloadContext")
    if kind == "OFFLOAD_LEDGER":
        if not context or not context.get("keys"):
            raise InvalidPendingDelete("an OFFLOAD_LEDGER record needs an offloadContext with keys", "missing_field")
        expected = {f"{context['uuid']}-ledger-{ledger_id}", f"{context['uuid']}-ledger-{ledger_id}-index"}
        stray = set(context["keys"]) - expected
        if stray:
            # Keys must be the ledger's own objects: a record naming others is forged or broken.
            raise InvalidPendingDelete(f"offload keys {sorted(stray)} are not ledger {ledger_id}'s", "mismatch")
    elif context is not None:
        raise InvalidPendingDelete("a LEDGER record carries no offloadContext", "invalid_field")


def record_key(record: Mapping[str, Any]) -> str:
    """What makes two records the same request: a ledger's BookKeeper copy, or one offloaded copy of it."""
    key = f"{record['ledgerType']}/{record['ledgerId']}"
    context = record.get("offloadContext")
    if context:
        key += f"/{context['bucket']}/{context['uuid']}"
    return key
