"""The whole testbed world: workload, orphans, and what every topic held, written under the testbed home.

`build_world` is what `sweeper testbed seed` and the real-cluster tests run once per testbed.
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

from sweeper.testbed.admin import Admin
from sweeper.testbed.orphans import COMPACT_LEAK, DROP_ONE, OFFLOAD_LOST, SCHEMA_DROP, Manifest, induce_orphans
from sweeper.testbed.server import S3_ACCESS_KEY, S3_SECRET_KEY, TestbedInfo
from sweeper.testbed.workload import (
    COMPACT_TWICE,
    WorkloadResult,
    admin_for,
    client_for,
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


def snapshot_messages(client: pulsar.Client, topics: list[str],
                      compacted: bool = False) -> dict[str, list[tuple[str, str]]]:
    return {name: [(mid, data.hex()) for mid, data in read_all(client, name, compacted=compacted)] for name in topics}


def build_world(info: TestbedInfo, manifest_path: Path | None = None) -> World:
    started = time.monotonic()
    admin: Admin = admin_for(info)
    client = client_for(info)
    try:
        workload = run_workload(info, client, admin)
    finally:
        client.close()
    manifest, info = induce_orphans(info, client_for, admin, zk_for, s3_client_for(info))
    admin = admin_for(info)
    client = client_for(info)
    try:
        compact_twice(client, admin)
        current = admin.internal_stats(COMPACT_TWICE)["compactedLedger"]["ledgerId"]
        manifest.compacted_current[COMPACT_TWICE] = int(current)
        workload.compacted_topics = [COMPACT_TWICE, COMPACT_LEAK]
        topics = [*workload.topics, COMPACT_TWICE]
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
