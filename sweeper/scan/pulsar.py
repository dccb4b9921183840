"""Scan Pulsar's metadata in ZooKeeper: managed ledgers, their cursors, and schema locators.

Managed ledgers live at `<root>/<tenant>/<namespace>/persistent/<encoded topic>` (old,
cluster-scoped names have one more level: `<tenant>/<cluster>/<namespace>/persistent/...`);
their children are cursors. Schema locators live at `<schemas root>/<tenant>/<ns>/<topic>`.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from sweeper import zk as zkutil
from sweeper.codecs import pulsar as codec
from sweeper.codecs.envelope import MAGIC
from sweeper.codecs.errors import MetadataDecodeError
from sweeper.scan import Row, quarantine_row

DOMAIN = "persistent"
BUCKET_PREFIX = "#pulsar.internal.delayed.bucket"
COMPACTION_CURSOR = "__compaction"
COMPACTED_TOPIC_LEDGER = "CompactedTopicLedger"
SHADOW_SOURCE = "PULSAR.SHADOW_SOURCE"
_OFFLOAD_KEYS = {"bucket": "offload_bucket", "region": "offload_region", "serviceEndpoint": "offload_endpoint"}
_COMPRESSION = {0: "NONE", 1: "LZ4", 2: "ZLIB", 3: "ZSTD", 4: "SNAPPY"}


@dataclass
class PulsarScanPlan:
    managed_ledgers: list[str]  # relative to the managed-ledgers root
    schemas: list[str]  # relative to the schemas root
    quarantine: list[Row] = field(default_factory=list)


def decode_name(encoded: str) -> str:
    """Pulsar's Codec.decode (java.net.URLDecoder): '+' is a space."""
    return urllib.parse.unquote_plus(encoded)


def _list_level(client: KazooClient, root: str, parents: list[str]) -> list[tuple[str, list[str]]]:
    out = []
    for parent, result in zip(
        parents, zkutil.children_many(client, (zkutil.join(root, p) if p else root for p in parents)), strict=True
    ):
        if result.error is not None:
            raise result.error
        out.append((parent, result.children or []))
    return out


def plan_managed_ledgers(client: KazooClient, root: str) -> list[str]:
    zkutil.require_node(client, root, "Pulsar managed-ledgers")
    tenants = sorted(client.get_children(root))
    second = _list_level(client, root, tenants)
    # <tenant>/<x>: x is a namespace when it holds `persistent`, else an old-style cluster.
    domains: list[str] = []
    maybe_clusters: list[str] = []
    for tenant, children in second:
        for child in children:
            maybe_clusters.append(f"{tenant}/{child}")
    third = _list_level(client, root, maybe_clusters)
    deeper: list[str] = []
    for rel, children in third:
        if DOMAIN in children:
            domains.append(f"{rel}/{DOMAIN}")
        deeper.extend(f"{rel}/{c}" for c in children if c not in (DOMAIN, "non-persistent"))
    for rel, children in _list_level(client, root, deeper):
        if DOMAIN in children:
            domains.append(f"{rel}/{DOMAIN}")
    topics: list[str] = []
    for rel, children in _list_level(client, root, sorted(set(domains))):
        topics.extend(f"{rel}/{t}" for t in children)
    return sorted(topics)


def plan_schemas(client: KazooClient, root: str) -> list[str]:
    if client.exists(root) is None:
        return []  # a cluster that never stored a schema has no schemas root
    tenants = sorted(client.get_children(root))
    namespaces = [f"{t}/{n}" for t, children in _list_level(client, root, tenants) for n in children]
    return sorted(f"{ns}/{t}" for ns, children in _list_level(client, root, namespaces) for t in children)


def plan_pulsar(client: KazooClient, ml_root: str, schemas_root: str) -> PulsarScanPlan:
    return PulsarScanPlan(plan_managed_ledgers(client, ml_root), plan_schemas(client, schemas_root))


def split_ml_name(name: str) -> tuple[str, str, str]:
    """(tenant, namespace, decoded topic) of `tenant/ns/persistent/topic` or `tenant/cluster/ns/persistent/topic`."""
    parts = name.split("/")
    if len(parts) == 5:
        return parts[0], f"{parts[1]}/{parts[2]}", decode_name(parts[4])
    return parts[0], parts[1], decode_name(parts[-1])


def _quarantine(source: str, path: str, owner: str | None, kind: str, error: str, raw: bytes | None,
                version: int | None) -> Row:
    return quarantine_row(source, path, kind, error, raw=raw, zk_version=version, owner=owner)


def _compression_of(data: bytes) -> str:
    if len(data) >= 10 and int.from_bytes(data[:2], "big") == MAGIC:
        # The header's first field is the compression type (tag 0x08 then a one-byte varint).
        if data[6] == 0x08 and data[7] in _COMPRESSION:
            return _COMPRESSION[data[7]]
        return "UNKNOWN"
    return "NONE"


def managed_ledger_rows(name: str, path: str, data: bytes, stat: Any, cursor_count: int) -> Iterator[Row]:
    info = codec.decode_managed_ledger_info(data)
    tenant, namespace, topic = split_ml_name(name)
    properties = {p.key: p.value for p in info.properties}
    topic_name = f"persistent://{tenant}/{namespace}/{topic}"
    yield {
        "record_type": "managed_ledgers",
        "managed_ledger": name,
        "tenant": tenant,
        "namespace": namespace,
        "topic": topic,
        "topic_name": topic_name,
        "path": path,
        "zk_version": stat.version,
        "zk_ctime_ms": stat.ctime,
        "zk_mtime_ms": stat.mtime,
        "compression": _compression_of(data),
        "ledger_count": len(info.ledgerInfo),
        "cursor_count": cursor_count,
        "properties": properties,
        "terminated": info.HasField("terminatedPosition"),
        "shadow_source": properties.get(SHADOW_SOURCE),
    }
    last = len(info.ledgerInfo) - 1
    for position, item in enumerate(info.ledgerInfo):
        row: Row = {
            "record_type": "ml_ledgers",
            "managed_ledger": name,
            "tenant": tenant,
            "namespace": namespace,
            "topic": topic,
            "ledger_id": item.ledgerId,
            "position": position,
            "is_current": position == last,
            "entries": item.entries,
            "size": item.size,
            "timestamp_ms": item.timestamp,
            "offloaded": item.HasField("offloadContext"),
        }
        if item.HasField("offloadContext"):
            ctx = item.offloadContext
            row.update(
                offload_complete=ctx.complete,
                offload_bookkeeper_deleted=ctx.bookkeeperDeleted,
                offload_uuid=codec.offload_uuid(ctx.uidMsb, ctx.uidLsb) if ctx.HasField("uidMsb") else None,
                offload_timestamp_ms=ctx.timestamp,
                offload_driver=ctx.driverMetadata.name or None,
            )
            # Only the location keys: driver properties may carry credentials.
            for prop in ctx.driverMetadata.properties:
                column = _OFFLOAD_KEYS.get(prop.key)
                if column is not None:
                    row[column] = prop.value
        yield row


def cursor_rows(ml_name: str, znode: str, path: str, data: bytes, stat: Any) -> Iterator[Row]:
    info = codec.decode_managed_cursor_info(data)
    tenant, namespace, topic = split_ml_name(ml_name)
    cursor = decode_name(znode)
    topic_name = f"persistent://{tenant}/{namespace}/{topic}"
    long_props = {p.name: p.value for p in info.properties}
    string_props = {p.name: p.value for p in info.cursorProperties}
    yield {
        "record_type": "ml_cursors",
        "managed_ledger": ml_name,
        "tenant": tenant,
        "namespace": namespace,
        "topic": topic,
        "cursor": cursor,
        "cursor_znode": znode,
        "path": path,
        "zk_version": stat.version,
        "zk_mtime_ms": stat.mtime,
        "cursors_ledger_id": info.cursorsLedgerId,
        "mark_delete_ledger_id": info.markDeleteLedgerId,
        "mark_delete_entry_id": info.markDeleteEntryId,
        "long_properties": long_props,
        "cursor_properties": string_props,
    }
    ref = {"record_type": "cursor_ledger_refs", "managed_ledger": ml_name, "topic_name": topic_name,
           "cursor": cursor}
    for key, value in string_props.items():
        if key.startswith(BUCKET_PREFIX):
            try:
                ledger_id = int(value)
            except ValueError as exc:
                raise MetadataDecodeError(
                    f"delayed-delivery bucket property {key!r} is not a ledger id: {value!r}", kind="invalid_reference"
                ) from exc
            yield {**ref, "kind": "delayed_bucket", "ref_key": key, "ledger_id": ledger_id}
    if cursor == COMPACTION_CURSOR:
        if COMPACTED_TOPIC_LEDGER in long_props:
            yield {**ref, "kind": "compacted_ledger", "ref_key": COMPACTED_TOPIC_LEDGER,
                   "ledger_id": long_props[COMPACTED_TOPIC_LEDGER]}
        elif info.cursorsLedgerId != -1:
            # The reference is in the cursor ledger's last entry, out of a ZooKeeper scan's reach.
            yield {**ref, "kind": "compacted_ledger_unreadable", "ref_key": COMPACTED_TOPIC_LEDGER, "ledger_id": None}


def scan_managed_ledgers(
    reader: zkutil.ZnodeReader, root: str, names: list[str], window: int = 1000
) -> Iterator[Row]:
    paths = [zkutil.join(root, name) for name in names]
    children = {r.path: r for r in reader.children_many(paths, window)}
    cursor_paths: list[tuple[str, str, str]] = []
    for name, read in zip(names, reader.get_many(paths, window), strict=True):
        if read.error is not None:
            yield _quarantine("managed_ledger", read.path, name, "read_error", repr(read.error), None, None)
            continue
        if read.data is None:
            continue  # topic deleted since planning
        listing = children[read.path]
        cursors = listing.children or []
        try:
            yield from managed_ledger_rows(name, read.path, read.data, read.stat, len(cursors))
        except MetadataDecodeError as exc:
            yield _quarantine("managed_ledger", read.path, name, exc.kind, str(exc), read.data, read.stat.version)
        cursor_paths.extend((name, c, zkutil.join(read.path, c)) for c in cursors)
    for (ml_name, znode, _), read in zip(
        cursor_paths, reader.get_many((p for _, _, p in cursor_paths), window), strict=True
    ):
        if read.error is not None:
            yield _quarantine("cursor", read.path, ml_name, "read_error", repr(read.error), None, None)
            continue
        if read.data is None:
            continue
        try:
            yield from list(cursor_rows(ml_name, znode, read.path, read.data, read.stat))
        except MetadataDecodeError as exc:
            yield _quarantine("cursor", read.path, ml_name, exc.kind, str(exc), read.data, read.stat.version)


def scan_schemas(
    reader: zkutil.ZnodeReader, root: str, schema_ids: list[str], window: int = 1000
) -> Iterator[Row]:
    paths = [zkutil.join(root, s) for s in schema_ids]
    for schema_id, read in zip(schema_ids, reader.get_many(paths, window), strict=True):
        if read.error is not None:
            yield _quarantine("schema", read.path, schema_id, "read_error", repr(read.error), None, None)
            continue
        if read.data is None:
            continue
        try:
            locator = codec.decode_schema_locator(read.data)
        except MetadataDecodeError as exc:
            yield _quarantine("schema", read.path, schema_id, exc.kind, str(exc), read.data, read.stat.version)
            continue
        latest = locator.info.version if locator.HasField("info") else None
        for entry in locator.index:
            yield {
                "record_type": "schema_ledgers",
                "schema_id": schema_id,
                "path": read.path,
                "zk_version": read.stat.version,
                "version": entry.version,
                "ledger_id": entry.position.ledgerId,
                "entry_id": entry.position.entryId,
                "is_latest": entry.version == latest,
            }
