"""Scan Pulsar's metadata in ZooKeeper: managed ledgers, their cursors, and schema locators.

Managed ledgers live at `<root>/<tenant>/<namespace>/persistent/<encoded topic>` (old,
cluster-scoped names have one more level: `<tenant>/<cluster>/<namespace>/persistent/...`);
their children are cursors. Schema locators live at `<schemas root>/<tenant>/<ns>/<topic>`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from sweeper import names
from sweeper.codecs import pulsar as codec
from sweeper.codecs.envelope import MAGIC
from sweeper.codecs.errors import MetadataDecodeError
from sweeper.scan import Row, RowChunk, quarantine_row
from sweeper.vocabulary import BUCKET_PREFIX, COMPACTED_TOPIC_LEDGER, COMPACTION_CURSOR
from sweeper.zk import client as zkutil

DOMAIN = "persistent"
SHADOW_SOURCE = "PULSAR.SHADOW_SOURCE"
# The offload driver's location properties, in the order of their `ml_ledgers` columns (the last three).
_OFFLOAD_KEYS = {"bucket": "offload_bucket", "region": "offload_region", "serviceEndpoint": "offload_endpoint"}
# The `ml_ledgers` columns a scan fills, in the table's order (run_id and captured_at are the packer's): a managed
# ledger's ledgers are handed over as one chunk of tuples, not a dict each.
ML_LEDGER_COLUMNS = (
    "managed_ledger", "tenant", "namespace", "topic", "ledger_id", "position", "is_current", "entries", "size",
    "timestamp_ms", "offloaded", "offload_complete", "offload_bookkeeper_deleted", "offload_uuid",
    "offload_timestamp_ms", "offload_driver", *_OFFLOAD_KEYS.values(),
)
_NOT_OFFLOADED = (False, None, None, None, None, None, None, None, None)
_COMPRESSION = {0: "NONE", 1: "LZ4", 2: "ZLIB", 3: "ZSTD", 4: "SNAPPY"}


@dataclass
class PulsarScanPlan:
    managed_ledger_domains: list[tuple[str, int]]  # `<namespace>/persistent` under the root, and its topic count
    schema_namespaces: list[tuple[str, int]]  # tenant/namespace under the schemas root, and its schema count
    quarantine: list[Row] = field(default_factory=list)
    # tenant/namespace -> where this cluster's metadata shows it (managed_ledgers, policies)
    namespaces: dict[str, set[str]] = field(default_factory=dict)


def decode_name(encoded: str) -> str:
    """Pulsar's Codec.decode (java.net.URLDecoder): '+' is a space; a malformed name is kept as found."""
    decoded = names.decode_local_name(encoded)
    return encoded if decoded is None else decoded


def _list_level(client: KazooClient, root: str, parents: list[str]) -> list[tuple[str, list[str]]]:
    out = []
    for parent, result in zip(
        parents, zkutil.children_many(client, (zkutil.join(root, p) if p else root for p in parents)), strict=True
    ):
        if result.error is not None:
            raise result.error
        out.append((parent, result.children or []))
    return out


def plan_managed_ledger_domains(client: KazooClient, root: str,
                                namespaces: set[str] | None = None) -> list[tuple[str, int]]:
    """Every `<namespace>/persistent` directory under `root` with its number of topics; `namespaces` collects
    each tenant/namespace that has one.

    The topics themselves are listed by the scan tasks (`list_shard`): a driver holding every topic's name
    would grow with the cluster, and the plan needs only the directories and their sizes.
    """
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
    if namespaces is not None:
        namespaces.update(d[: -len(DOMAIN) - 1] for d in domains)
    return _sized(client, root, sorted(set(domains)))


def plan_managed_ledgers(client: KazooClient, root: str, namespaces: set[str] | None = None) -> list[str]:
    """Every managed ledger under `root` (relative names), listed in one place: for tests and small tools."""
    domains = [d for d, _ in plan_managed_ledger_domains(client, root, namespaces)]
    return sorted(f"{rel}/{t}" for rel, children in _list_level(client, root, domains) for t in children)


def _sized(client: KazooClient, root: str, parents: list[str]) -> list[tuple[str, int]]:
    """Each parent with its number of children (from its stat: the children are not fetched)."""
    out = []
    for parent, read in zip(parents, zkutil.get_many(client, (zkutil.join(root, p) for p in parents)), strict=True):
        if read.error is not None:
            raise read.error
        if read.stat is not None:  # vanished since it was listed: nothing to scan there
            out.append((parent, read.stat.numChildren))
    return out


def shards(parents: list[tuple[str, int]], chunk: int) -> list[tuple[str, int, int]]:
    """(parent, shard, shards): about `chunk` children per shard, so a large namespace spreads over many tasks."""
    return [(parent, k, n) for parent, size in parents for n in [max(1, -(-size // max(1, chunk)))]
            for k in range(n)]


def in_shard(child: str, shard: int, shards: int) -> bool:
    """Stable across processes (Python's str hash is not): every child lands in exactly one shard."""
    return zlib.crc32(child.encode()) % shards == shard


def list_shard(reader: zkutil.ZnodeReader, root: str, parent: str, shard: int, shards: int) -> list[str]:
    """The children of `parent` (relative to `root`) that fall in `shard`, as `parent/child` names, listed by the
    task that scans them. A parent gone since planning (its namespace deleted) has none."""
    [read] = list(reader.children_many([zkutil.join(root, parent)]))
    if read.error is not None:
        raise read.error
    return sorted(f"{parent}/{c}" for c in read.children or () if in_shard(c, shard, shards))


def plan_namespace_policies(client: KazooClient, root: str,
                            contents: dict[str, tuple[bytes, int]] | None = None) -> set[str]:
    """tenant/namespace (or tenant/cluster/namespace) of every namespace with policies in the configuration store.

    Pulsar keeps a namespace's policies at `/admin/policies/<tenant>/<namespace>` (JSON); a level
    without data is a parent (a tenant, or an old cluster-scoped namespace's cluster), not a namespace.
    `contents` collects each namespace's policies (data, znode version) for the retention rules.
    """
    if client.exists(root) is None:
        return set()
    found: set[str] = set()
    tenants = sorted(client.get_children(root))
    second = [f"{t}/{c}" for t, children in _list_level(client, root, tenants) for c in children]
    third: list[str] = []
    for rel, read in zip(second, zkutil.get_many(client, (zkutil.join(root, r) for r in second)), strict=True):
        if read.error is None and read.data:
            found.add(rel)
            if contents is not None:
                contents[rel] = (read.data, read.stat.version)
        elif read.error is None and read.data is not None:
            third.append(rel)
    deeper = [f"{rel}/{c}" for rel, children in _list_level(client, root, third) for c in children]
    for rel, read in zip(deeper, zkutil.get_many(client, (zkutil.join(root, r) for r in deeper)), strict=True):
        if read.error is None and read.data:
            found.add(rel)
            if contents is not None:
                contents[rel] = (read.data, read.stat.version)
    return found


def plan_schema_namespaces(client: KazooClient, root: str) -> list[tuple[str, int]]:
    """Every tenant/namespace under the schemas root with its number of schemas (listed by the scan tasks)."""
    if client.exists(root) is None:
        return []  # a cluster that never stored a schema has no schemas root
    tenants = sorted(client.get_children(root))
    namespaces = [f"{t}/{n}" for t, children in _list_level(client, root, tenants) for n in children]
    return _sized(client, root, namespaces)


def plan_pulsar(client: KazooClient, ml_root: str, schemas_root: str) -> PulsarScanPlan:
    namespaces: set[str] = set()
    plan = PulsarScanPlan(plan_managed_ledger_domains(client, ml_root, namespaces),
                          plan_schema_namespaces(client, schemas_root))
    for ns in namespaces:
        plan.namespaces.setdefault(ns, set()).add("managed_ledgers")
    return plan


def split_ml_name(name: str) -> tuple[str, str, str]:
    """(tenant, namespace, decoded topic) of a managed-ledger znode's name below the root.

    The planner only yields `tenant/ns/persistent/topic` and `tenant/cluster/ns/persistent/topic`;
    a topic part that does not decode is kept as found (the row still records the znode).
    """
    parts = name.split("/")
    if len(parts) == 5:
        return parts[0], f"{parts[1]}/{parts[2]}", decode_name(parts[4])
    return parts[0], "/".join(parts[1:-2]) or parts[0], decode_name(parts[-1])


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


def managed_ledger_rows(name: str, path: str, data: bytes, stat: Any, cursor_count: int
                        ) -> Iterator[Row | RowChunk]:
    """The `managed_ledgers` row, then its ledgers' `ml_ledgers` rows as one chunk."""
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
    ledgers: list[tuple[Any, ...]] = []
    for position, item in enumerate(info.ledgerInfo):
        if item.HasField("offloadContext"):
            ctx = item.offloadContext
            # Only the location keys: driver properties may carry credentials. A repeated key: its last value.
            location = {prop.key: prop.value for prop in ctx.driverMetadata.properties if prop.key in _OFFLOAD_KEYS}
            offload: tuple[Any, ...] = (
                True, ctx.complete, ctx.bookkeeperDeleted,
                codec.offload_uuid(ctx.uidMsb, ctx.uidLsb) if ctx.HasField("uidMsb") else None, ctx.timestamp,
                ctx.driverMetadata.name or None, *map(location.get, _OFFLOAD_KEYS))
        else:
            offload = _NOT_OFFLOADED
        ledgers.append((name, tenant, namespace, topic, item.ledgerId, position, position == last, item.entries,
                        item.size, item.timestamp, *offload))
    if ledgers:
        yield RowChunk("ml_ledgers", ML_LEDGER_COLUMNS, ledgers)


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
        "last_active_ms": info.lastActive if info.HasField("lastActive") else None,
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
        yield {**ref, **compaction_ref_row(long_props.get(COMPACTED_TOPIC_LEDGER), info.cursorsLedgerId != -1)}


# `cursor_ledger_refs.kind` for the `__compaction` cursor (sweeper.rules.classify.CompactionPointer says why):
COMPACTED = "compacted_ledger"  # ZooKeeper's pointer, authoritative: the cursor has no cursor ledger
COMPACTED_LAGGING = "compacted_ledger_lagging"  # ZooKeeper's pointer while a cursor ledger is active: may lag
COMPACTED_UNREADABLE = "compacted_ledger_unreadable"  # no pointer in ZooKeeper, a cursor ledger is active
COMPACTED_UNRECORDED = "compacted_ledger_unrecorded"  # no pointer anywhere ZooKeeper shows
COMPACTION_KINDS = (COMPACTED, COMPACTED_LAGGING, COMPACTED_UNREADABLE, COMPACTED_UNRECORDED)


def compaction_ref_row(zk_ledger: int | None, cursor_ledger_active: bool) -> Row:
    """The `cursor_ledger_refs` fields for a `__compaction` cursor as ZooKeeper shows it.

    Pulsar persists the cursor's properties to its znode only when the cursor ledger is switched
    or the cursor closes (ManagedCursorImpl.persistPositionMetaStore); each compaction's pointer
    goes to the cursor ledger. The pointer read here is still a reference (it may be current).
    """
    if zk_ledger is None:
        kind = COMPACTED_UNREADABLE if cursor_ledger_active else COMPACTED_UNRECORDED
    else:
        kind = COMPACTED_LAGGING if cursor_ledger_active else COMPACTED
    return {"kind": kind, "ref_key": COMPACTED_TOPIC_LEDGER, "ledger_id": zk_ledger}


def scan_managed_ledgers(
    reader: zkutil.ZnodeReader, root: str, names: list[str], window: int = 1000
) -> Iterator[Row | RowChunk]:
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
        if listing.error is not None:
            # Without its cursors we cannot know which cursor, bucket or compacted ledgers it holds: the
            # quarantine row makes every ledger it owns and no reference covers `unknown`.
            yield _quarantine("managed_ledger", read.path, name, "cursor_listing_error",
                              f"cannot list the cursors of {name}: {listing.error!r}", None, read.stat.version)
        cursors = listing.children or []
        if not read.data:
            # Pulsar writes an empty znode when it creates a managed ledger, then its first ledger list:
            # an empty one is a topic mid-creation (or one whose creation failed), never "lists nothing".
            yield _quarantine("managed_ledger", read.path, name, "empty_managed_ledger",
                              f"managed ledger {name} has an empty znode: its ledger list is not written yet",
                              read.data, read.stat.version)
            continue
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
        yield from schema_rows(schema_id, read.path, read.stat.version, locator)


def schema_references(locator: Any) -> list[tuple[int, int, int, bool]]:
    """(version, ledger id, entry id, is latest) of every ledger a SchemaLocator references.

    `index` lists every version; `info` (the latest) is counted too, even when `index` lacks it,
    as the delete stage counts it (BookkeeperSchemaStorage reads the latest through `info`).
    """
    latest = locator.info.version if locator.HasField("info") else None
    out = [(e.version, e.position.ledgerId, e.position.entryId, e.version == latest) for e in locator.index]
    if locator.HasField("info"):
        info = locator.info
        if (info.version, info.position.ledgerId) not in {(v, ledger) for v, ledger, _, _ in out}:
            out.append((info.version, info.position.ledgerId, info.position.entryId, True))
    return out


def schema_rows(schema_id: str, path: str, zk_version: int, locator: Any) -> Iterator[Row]:
    for version, ledger_id, entry_id, is_latest in schema_references(locator):
        yield {
            "record_type": "schema_ledgers",
            "schema_id": schema_id,
            "path": path,
            "zk_version": zk_version,
            "version": version,
            "ledger_id": ledger_id,
            "entry_id": entry_id,
            "is_latest": is_latest,
        }
