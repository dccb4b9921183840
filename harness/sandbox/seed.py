"""Write a `SandboxCluster` into ZooKeeper as BookKeeper and Pulsar would have left it."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from harness.sandbox.model import (
    BkLedger,
    Cursor,
    ManagedLedger,
    OffloadObject,
    SandboxCluster,
    SchemaLocatorModel,
)
from harness.zkserver import ServerClock, clock_for
from sweeper.codecs import pulsar as pulsar_codec
from sweeper.codecs.bookkeeper import LedgerMetadata, Segment, encode_ledger_metadata
from sweeper.codecs.layout import LedgerLayout, layout_znode, ledger_path

WINDOW = 2000


@dataclass(frozen=True)
class SeedResult:
    znodes: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.znodes / self.seconds if self.seconds else 0.0


def ledger_metadata(ledger: BkLedger) -> LedgerMetadata:
    return LedgerMetadata(
        format_version=ledger.format_version,
        ensemble_size=len(ledger.ensemble),
        write_quorum_size=2,
        ack_quorum_size=2,
        state=ledger.state,
        last_entry_id=ledger.last_entry_id,
        length=ledger.length,
        segments=(Segment(0, ledger.ensemble),),
        digest_type="CRC32C",
        password=b"",
        ctime=ledger.ctime_ms,
        ctoken=0,
        custom_metadata=dict(ledger.custom),
    )


def ledger_znode_data(ledger: BkLedger) -> bytes:
    return encode_ledger_metadata(ledger_metadata(ledger), format_version=ledger.format_version)


def managed_ledger_info_bytes(ml: ManagedLedger) -> bytes:
    info = pulsar_codec.pb.ManagedLedgerInfo()
    for entry in ml.ledgers:
        item = info.ledgerInfo.add()
        item.ledgerId = entry.ledger_id
        item.entries = entry.entries
        item.size = entry.size
        item.timestamp = entry.timestamp_ms
        if entry.offload is not None:
            ctx = item.offloadContext
            ctx.uidMsb = entry.offload.uuid_msb
            ctx.uidLsb = entry.offload.uuid_lsb
            ctx.complete = entry.offload.complete
            ctx.bookkeeperDeleted = entry.offload.bookkeeper_deleted
            ctx.timestamp = entry.offload.timestamp_ms
            # As Pulsar 4.0's jclouds offloader records it (tests/test_testbed_fidelity.py checks).
            ctx.driverMetadata.name = entry.offload.driver
            for key, value in (
                ("managedLedgerOffloadDriver", entry.offload.driver),
                ("bucket", entry.offload.bucket),
                ("region", entry.offload.region),
                ("serviceEndpoint", entry.offload.endpoint),
            ):
                prop = ctx.driverMetadata.properties.add()
                prop.key, prop.value = key, value
    for key, value in ml.properties.items():
        prop = info.properties.add()
        prop.key, prop.value = key, value
    if ml.terminated and ml.ledgers:
        info.terminatedPosition.ledgerId = ml.ledgers[-1].ledger_id
        info.terminatedPosition.entryId = max(ml.ledgers[-1].entries - 1, -1)
    return pulsar_codec.encode_managed_ledger_info(info, compression=ml.compression)


def cursor_info_bytes(cursor: Cursor, compression: str) -> bytes:
    info = pulsar_codec.pb.ManagedCursorInfo()
    info.cursorsLedgerId = cursor.cursors_ledger_id
    info.markDeleteLedgerId, info.markDeleteEntryId = cursor.mark_delete
    if cursor.last_active_ms is not None:
        info.lastActive = cursor.last_active_ms
    for name, value in cursor.long_properties.items():
        prop = info.properties.add()
        prop.name, prop.value = name, value
    for name, text in cursor.string_properties.items():
        sprop = info.cursorProperties.add()
        sprop.name, sprop.value = name, text
    return pulsar_codec.encode_managed_cursor_info(info, compression=compression)


def schema_locator_bytes(locator: SchemaLocatorModel) -> bytes:
    message = pulsar_codec.pb.SchemaLocator()
    for entry in locator.entries:
        item = message.index.add()
        item.version = entry.version
        item.position.ledgerId = entry.ledger_id
        item.position.entryId = entry.entry_id
        item.hash = entry.hash
    latest = locator.entries[-1]
    message.info.version = latest.version
    message.info.position.ledgerId = latest.ledger_id
    message.info.position.entryId = latest.entry_id
    message.info.hash = latest.hash
    return pulsar_codec.encode_schema_locator(message)


def cluster_znodes(cluster: SandboxCluster) -> Iterable[tuple[str, bytes]]:
    """Every znode of the cluster with its data, leaves only (parents are implied)."""
    spec = cluster.spec
    root = spec.ledgers_root.rstrip("/")
    yield f"{root}/LAYOUT", layout_znode(spec.layout)
    yield f"{root}/INSTANCEID", b"5f1c6f6e-sandbox"
    yield f"{root}/available/readonly", b""
    yield f"{root}/cookies/bookie-0.bookkeeper.pulsar.svc:3181", b"cookie"
    yield f"{root}/underreplication/ledgers", b""
    yield f"{root}/idgen/ID-0000000001", b""
    for ledger in cluster.ledgers.values():
        yield ledger_path(root, ledger.ledger_id, spec.layout), ledger_znode_data(ledger)
    ml_root = spec.managed_ledgers_root.rstrip("/")
    for ml in cluster.managed_ledgers:
        path = f"{ml_root}/{ml.name}"
        yield path, managed_ledger_info_bytes(ml)
        for cursor in ml.cursors:
            yield f"{path}/{cursor.znode_name}", cursor_info_bytes(cursor, ml.compression)
    schema_root = spec.schemas_root.rstrip("/")
    for locator in cluster.schemas:
        yield f"{schema_root}/{locator.schema_id}", schema_locator_bytes(locator)
    # The configuration store (same ensemble, as in most deployments): TenantInfo at
    # /admin/policies/<tenant>, a namespace's Policies at /admin/policies/<tenant>/<namespace>.
    tenants = sorted({ns.split("/")[0] for ns in cluster.namespaces})
    for tenant in tenants:
        yield f"/admin/policies/{tenant}", json.dumps(
            {"adminRoles": [], "allowedClusters": [spec.cluster_name]}).encode()
    for namespace in cluster.namespaces:
        policies = cluster.namespace_policies.get(namespace, json.dumps(
            {"replication_clusters": [spec.cluster_name], "deleted": False}).encode())
        if policies is not None:  # None: a namespace whose policies are missing (its topics are `unknown`)
            yield f"/admin/policies/{namespace}", policies


def backdated_znodes(cluster: SandboxCluster) -> list[tuple[int, str, bytes]]:
    """(mtime, path, data) of the managed-ledger and cursor znodes last written in the past (topics unloaded
    since, cursors idle since): written again with the server's clock set to that time."""
    ml_root = cluster.spec.managed_ledgers_root.rstrip("/")
    out = []
    for ml in cluster.managed_ledgers:
        path = f"{ml_root}/{ml.name}"
        if ml.zk_mtime_ms is not None:
            out.append((ml.zk_mtime_ms, path, managed_ledger_info_bytes(ml)))
        for cursor in ml.cursors:
            if cursor.zk_mtime_ms is not None:
                data = cursor_info_bytes(cursor, ml.compression)
                out.append((cursor.zk_mtime_ms, f"{path}/{cursor.znode_name}", data))
    return sorted(out)


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def create_many(client: KazooClient, items: Iterable[tuple[str, bytes]], window: int = WINDOW,
                batch: int = 200) -> int:
    """Pipelined creates, `batch` to a ZooKeeper multi-op; re-runnable over existing znodes.

    kazoo spends more CPU per request than the server does, so one multi of 200 creates
    costs about what one create does. A multi that fails (a znode exists already) is redone
    one znode at a time, overwriting.
    """
    in_flight: deque[tuple[list[tuple[str, bytes]], object]] = deque()
    created = 0

    def one_by_one(ops: list[tuple[str, bytes]]) -> None:
        for path, data in ops:
            try:
                client.create(path, data)
            except NodeExistsError:
                client.set(path, data)

    def settle() -> None:
        nonlocal created
        ops, pending = in_flight.popleft()
        results = pending.get()  # type: ignore[attr-defined]
        if any(isinstance(r, Exception) for r in results):
            one_by_one(ops)
        created += len(ops)

    def submit(ops: list[tuple[str, bytes]]) -> None:
        transaction = client.transaction()
        for path, data in ops:
            transaction.create(path, data)
        in_flight.append((ops, transaction.commit_async()))
        if len(in_flight) >= max(1, window // batch):
            settle()

    ops: list[tuple[str, bytes]] = []
    for item in items:
        ops.append(item)
        if len(ops) >= batch:
            submit(ops)
            ops = []
    if ops:
        submit(ops)
    while in_flight:
        settle()
    return created


# How far back the server's clock goes while ledger znodes are created: older than any sandbox ledger.
LEDGER_EPOCH_DAYS = 500


def seed_zookeeper(client: KazooClient, cluster: SandboxCluster, window: int = WINDOW,
                   clock: ServerClock | None = None) -> SeedResult:
    """Write the cluster; ledger znodes first, with the server's clock set back when it has a ServerClock.

    A real ledger's znode is created with the ledger, so its ctime is never later than the
    ledger's own: with the clock set back, the metadata's ctime (the model's age) is the later of
    the two clocks, as in production. Pulsar's metadata is written after, at the real time (its
    mtimes are what the liveness gate compares with the newest ledger).
    """
    clock = clock or clock_for(client.hosts)
    started = time.monotonic()
    ledger_root = cluster.spec.ledgers_root.rstrip("/") + "/"
    every = list(cluster_znodes(cluster))
    ledgers = [item for item in every if item[0].startswith(ledger_root)]
    pulsar = [item for item in every if not item[0].startswith(ledger_root)]
    if clock is None:
        total = _seed_leaves(client, ledgers, window) + _seed_leaves(client, pulsar, window)
    else:
        with clock.back_in_time(LEDGER_EPOCH_DAYS):
            total = _seed_leaves(client, ledgers, window)
        total += _seed_leaves(client, pulsar, window)
        # Topics unloaded days ago, cursors idle for weeks: their znodes' mtimes are when that happened.
        for mtime, group in itertools.groupby(backdated_znodes(cluster), key=lambda item: item[0]):
            with clock.at(mtime):
                for _, path, data in group:
                    client.set(path, data)
    return SeedResult(total, time.monotonic() - started)


def _seed_leaves(client: KazooClient, leaves: list[tuple[str, bytes]], window: int) -> int:
    """Create `leaves` and every missing parent, parents first."""
    leaf_paths = {path for path, _ in leaves}
    parents: set[str] = set()
    for path, _ in leaves:
        parents.update(_parents(path))
    parents -= leaf_paths  # a managed ledger is both a leaf with data and a parent of cursors
    # Parents before children: create level by level, each level pipelined.
    by_depth = sorted(parents, key=lambda p: (p.count("/"), p))
    total = 0
    depth_batch: list[str] = []
    depth = 0
    for path in by_depth:
        if path.count("/") != depth and depth_batch:
            total += create_many(client, ((p, b"") for p in depth_batch), window)
            depth_batch = []
        depth = path.count("/")
        depth_batch.append(path)
    if depth_batch:
        total += create_many(client, ((p, b"") for p in depth_batch), window)
    # Managed-ledger znodes must exist before their cursor children.
    leaves.sort(key=lambda item: item[0].count("/"))
    total += create_many(client, leaves, window)
    return total


def manifest(cluster: SandboxCluster) -> dict[str, object]:
    """Ground truth for checks: counts, and every ledger a sweeper must not see as in use."""
    spec = cluster.spec
    noteworthy = {
        str(ledger.ledger_id): {
            "status": ledger.status.value,
            "kind": ledger.orphan_kind.value if ledger.orphan_kind else None,
            "ctime_ms": ledger.ctime_ms,
            "custom": {k: v.decode("utf-8", "replace") for k, v in ledger.custom.items()},
        }
        for ledger in cluster.ledgers.values()
        if ledger.status.value != "in_use"
    }
    return {
        "spec": {k: (v.value if isinstance(v, LedgerLayout) else v) for k, v in spec.__dict__.items()},
        "counts": cluster.counts(),
        "not_in_use": noteworthy,
        "missing_ledgers": cluster.missing_ledgers,
        "stale_pointers": cluster.stale_pointers,
        "retention": [dataclasses.asdict(expected) for expected in cluster.retention],
    }


def write_manifest(cluster: SandboxCluster, path: str | Path) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(manifest(cluster), indent=1, sort_keys=True))
    return target


OFFLOADER_VERSION = "4.0.8"


def offload_object_metadata(obj: OffloadObject) -> dict[str, str]:
    """The user metadata Pulsar's jclouds offloader (BlobStoreManagedLedgerOffloader) puts on each object:
    the broker's offloader metadata (pulsarClusterName, the offloader's version keys), the role and
    ManagedLedgerName. An object modeled without an owner or cluster (injected cases) lacks that key."""
    metadata = {
        "role": "index" if obj.key.endswith("-index") else "data",
        "s3ManagedLedgerOffloaderSoftwareVersion": OFFLOADER_VERSION,
        "s3ManagedLedgerOffloaderSoftwareGitSha": "0" * 40,
        "s3ManagedLedgerOffloaderFormatVersion": "1",
    }
    if obj.managed_ledger is not None:
        metadata["ManagedLedgerName"] = obj.managed_ledger
    if obj.cluster_name is not None:
        metadata["pulsarClusterName"] = obj.cluster_name
    return metadata


def seed_s3(client: Any, cluster: SandboxCluster, stray_keys: int = 1) -> int:
    """Upload the cluster's offloaded objects (tiny bodies) and a stray non-offload key."""
    buckets = {obj.bucket for obj in cluster.offload_objects} | {cluster.spec.offload_bucket}
    for bucket in sorted(buckets):
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)
    for obj in cluster.offload_objects:
        client.put_object(Bucket=obj.bucket, Key=obj.key, Body=b"x" * 64, Metadata=offload_object_metadata(obj))
    for i in range(stray_keys):
        client.put_object(Bucket=cluster.spec.offload_bucket, Key=f"notes/readme-{i}.txt", Body=b"not an offload")
    return len(cluster.offload_objects) + stray_keys


def seed_offload_store(put: Callable[[str, str, bytes, dict[str, str]], None], cluster: SandboxCluster,
                       stray_keys: int = 1) -> int:
    """`seed_s3` for any store: `put(container, name, body, user_metadata)` through the store's own SDK (the
    containers made beforehand)."""
    for obj in cluster.offload_objects:
        put(obj.bucket, obj.key, b"x" * 64, offload_object_metadata(obj))
    for i in range(stray_keys):
        put(cluster.spec.offload_bucket, f"notes/readme-{i}.txt", b"not an offload", {})
    return len(cluster.offload_objects) + stray_keys


def seed_oxia(store: Any, cluster: SandboxCluster, threads: int = 16) -> SeedResult:
    """Write the cluster into an Oxia namespace (`sweeper.metastore.oxia.OxiaStore`), parents first as empty
    records, as Pulsar's `OxiaMetadataStore.createParents` leaves them (issue 24), and without BookKeeper's LAYOUT
    record, which Pulsar's driver never writes there.

    Oxia stamps every record's creation time itself, so nothing here can be backdated: every ledger is as new as
    the seeding, and a test looks past the grace period with a later clock. Puts go on `threads` at once (one
    put is a round trip, ~1,000/s on one thread here)."""
    from concurrent.futures import ThreadPoolExecutor

    started = time.monotonic()
    leaves = list(cluster_znodes(cluster))
    if cluster.spec.layout is LedgerLayout.HIERARCHICAL:
        # As a real Pulsar on Oxia leaves it: its metadata-store driver writes no LAYOUT record (always hybrid
        # hierarchical paths). Other layouts keep theirs, which only a store written by hand would have.
        layout_record = f"{cluster.spec.ledgers_root.rstrip('/')}/LAYOUT"
        leaves = [(path, data) for path, data in leaves if path != layout_record]
    leaf_paths = {path for path, _ in leaves}
    parents: set[str] = set()
    for path, _ in leaves:
        parents.update(_parents(path))
    parents -= leaf_paths
    levels: dict[int, list[tuple[str, bytes]]] = {}
    for path in parents:
        levels.setdefault(path.count("/"), []).append((path, b""))
    for path, data in leaves:
        levels.setdefault(path.count("/"), []).append((path, data))

    def put(item: tuple[str, bytes]) -> None:
        store.create(item[0], item[1])

    with ThreadPoolExecutor(threads) as pool:
        for depth in sorted(levels):  # a level's parents exist before its children are written
            list(pool.map(put, levels[depth]))
    return SeedResult(sum(len(v) for v in levels.values()), time.monotonic() - started)
