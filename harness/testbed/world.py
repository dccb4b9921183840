"""The whole testbed world: workload, orphans, and what every topic held, written under the testbed home.

`build_world` is what `sweeper testbed seed` and the real-cluster tests run once per testbed. The metadata is read
and edited through `metadata_for`: a kazoo client on ZooKeeper, the sweeper's kazoo-shaped `OxiaStore` on Oxia, so
the orphans are made the same way on both.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import boto3
import pulsar
from kazoo.client import KazooClient

from harness.testbed.admin import Admin
from harness.testbed.orphans import (
    COMPACT_LEAK,
    DROP_ONE,
    OFFLOAD_LOST,
    SCHEMA_DROP,
    Manifest,
    Metadata,
    induce_orphans,
    ledger_znode,
)
from harness.testbed.server import OXIA_NAMESPACE, S3_ACCESS_KEY, S3_SECRET_KEY, TestbedInfo
from harness.testbed.workload import (
    COMPACT_STALE,
    COMPACT_TWICE,
    WorkloadResult,
    admin_for,
    client_for,
    compact_behind_a_stale_pointer,
    compact_twice,
    read_all,
    run_workload,
)


@dataclass
class World:
    info: TestbedInfo
    workload: WorkloadResult
    manifest: Manifest
    held: dict[str, list[tuple[str, str]]]  # topic -> (message id, payload hex) a reader from earliest got
    compacted: dict[str, list[tuple[str, str]]]  # compacted reads
    manifest_path: Path
    built_s: float


def s3_client_for(info: TestbedInfo) -> Any:
    return boto3.client("s3", endpoint_url=info.s3_endpoint, region_name="us-east-1",
                        aws_access_key_id=S3_ACCESS_KEY, aws_secret_access_key=S3_SECRET_KEY)


def zk_for(info: TestbedInfo) -> KazooClient:
    zk = KazooClient(hosts=info.zookeeper, timeout=15.0)
    zk.start(timeout=30)
    return zk


def metadata_for(info: TestbedInfo) -> Metadata:
    """A connected client of the testbed's metadata store; `stop()` ends it (and its session) on both."""
    if not info.on_oxia:
        return zk_for(info)
    from sweeper.metastore.oxia import OxiaStore

    return OxiaStore(info.oxia_address, OXIA_NAMESPACE, timeout_s=15.0)


def snapshot_messages(client: pulsar.Client, topics: list[str],
                      compacted: bool = False) -> dict[str, list[tuple[str, str]]]:
    return {name: [(mid, data.hex()) for mid, data in read_all(client, name, compacted=compacted)] for name in topics}


def build_world(info: TestbedInfo, manifest_path: Path | None = None) -> World:
    started = time.monotonic()
    admin: Admin = admin_for(info)
    client = client_for(info)
    zk = metadata_for(info)
    try:
        workload = run_workload(info, client, admin, lambda ledger: bool(zk.exists(ledger_znode(ledger))))
    finally:
        client.close()
        zk.stop()
    manifest, info = induce_orphans(info, client_for, admin, metadata_for, s3_client_for(info))
    admin = admin_for(info)
    client = client_for(info)
    try:
        compact_twice(client, admin)
        compact_behind_a_stale_pointer(client, admin)
        for name in (COMPACT_TWICE, COMPACT_STALE):
            current = admin.internal_stats(name)["compactedLedger"]["ledgerId"]
            manifest.compacted_current[name] = int(current)
        check_stale_pointer(info, manifest.compacted_current[COMPACT_STALE])
        workload.compacted_topics = [COMPACT_TWICE, COMPACT_STALE, COMPACT_LEAK]
        topics = [*workload.topics, COMPACT_TWICE, COMPACT_STALE]
        topics += [DROP_ONE, SCHEMA_DROP, COMPACT_LEAK, OFFLOAD_LOST]
        held = snapshot_messages(client, topics)
        compacted = snapshot_messages(client, workload.compacted_topics, compacted=True)
    finally:
        client.close()
    path = manifest_path or Path(info.home) / "manifest.json"
    manifest.write(path)
    (path.parent / "held.json").write_text(json.dumps({"held": held, "compacted": compacted,
                                                       "workload": asdict(workload)}))
    return World(info, workload, manifest, held, compacted, path, time.monotonic() - started)


def check_stale_pointer(info: TestbedInfo, live: int) -> None:
    """The premise of the stale-pointer topic: the metadata store names an older compacted ledger and an active
    cursor ledger; the live compacted ledger is newer and named only in that cursor ledger."""
    from harness.testbed.orphans import ml_path
    from sweeper.codecs import pulsar as codec

    zk = metadata_for(info)
    try:
        cursor = codec.decode_managed_cursor_info(zk.get(f"{ml_path(COMPACT_STALE)}/__compaction")[0])
    finally:
        zk.stop()
    pointer = {p.name: p.value for p in cursor.properties}.get("CompactedTopicLedger")
    if pointer is None or pointer >= live or cursor.cursorsLedgerId < 0:
        raise RuntimeError(f"{COMPACT_STALE}: expected a stale CompactedTopicLedger below {live} and an active "
                           f"cursor ledger in the metadata store, found pointer {pointer}, "
                           f"cursor ledger {cursor.cursorsLedgerId}")


def managed_ledger_topics(zk: Metadata) -> list[str]:
    """Every persistent topic that has a managed ledger in the metadata store (system topics included)."""
    from urllib.parse import unquote_plus

    topics = []
    for tenant in zk.get_children("/managed-ledgers"):
        for namespace in zk.get_children(f"/managed-ledgers/{tenant}"):
            base = f"/managed-ledgers/{tenant}/{namespace}/persistent"
            if zk.exists(base):
                topics.extend(f"persistent://{tenant}/{namespace}/{unquote_plus(local)}"
                              for local in zk.get_children(base))
    return sorted(topics)


def broker_references(admin: Admin, zk: Metadata) -> dict[int, str]:
    """The broker's own view of the ledgers in use: `stats-internal` of every topic (data ledgers, cursor
    ledgers, the compacted ledger, schema ledgers), plus the bucket-snapshot ledgers the cursors name in
    their properties (stats-internal does not show those). Ledger id -> who references it."""
    from harness.testbed.admin import AdminError
    from harness.testbed.orphans import ml_path
    from sweeper.codecs import pulsar as codec

    refs: dict[int, str] = {}
    for name in managed_ledger_topics(zk):
        try:
            stats = admin.internal_stats(name)
        except AdminError as exc:
            if exc.status not in (404, 409):
                raise
            # The broker refuses stats-internal of some system topics (the transaction coordinator's
            # __transaction_log_N: 409 "Can not create transaction system topic"): read what it wrote.
            stats = _stats_from_metadata(zk, ml_path(name))
        for ledger in stats.get("ledgers", []):
            refs[int(ledger["ledgerId"])] = f"{name} data"
        for cursor_name, cursor in stats.get("cursors", {}).items():
            if int(cursor.get("cursorLedger", -1)) >= 0:
                refs[int(cursor["cursorLedger"])] = f"{name} cursor {cursor_name}"
        compacted = int(stats.get("compactedLedger", {}).get("ledgerId", -1))
        if compacted >= 0:
            refs[compacted] = f"{name} compacted"
        for ledger in stats.get("schemaLedgers", []):
            refs[int(ledger["ledgerId"])] = f"{name} schema"
        path = ml_path(name)
        for cursor_name in zk.get_children(path) if zk.exists(path) else []:
            info = codec.decode_managed_cursor_info(zk.get(f"{path}/{cursor_name}")[0])
            for prop in info.cursorProperties:
                if prop.name.startswith("#pulsar.internal.delayed.bucket"):
                    refs[int(prop.value)] = f"{name} bucket {prop.name}"
    return refs


def _stats_from_metadata(zk: Metadata, path: str) -> dict[str, Any]:
    from sweeper.codecs import pulsar as codec

    if not zk.exists(path):
        return {}
    info = codec.decode_managed_ledger_info(zk.get(path)[0])
    cursors = {}
    for name in zk.get_children(path):
        cursor = codec.decode_managed_cursor_info(zk.get(f"{path}/{name}")[0])
        cursors[name] = {"cursorLedger": cursor.cursorsLedgerId}
    return {"ledgers": [{"ledgerId": x.ledgerId} for x in info.ledgerInfo], "cursors": cursors}
