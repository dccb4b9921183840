"""Orphans made the way Pulsar leaves them, on the real testbed, with a ground-truth manifest.

Each orphan is the state a lost second step leaves: Pulsar (or an operator) changed the metadata,
and the BookKeeper or S3 deletion that should have followed never happened. The metadata edits
are made like the broker's own: the topic is unloaded (or the broker is down) and the record is
rewritten with compare-and-set on the version just read (ZooKeeper's version check, Oxia's
expected version id), through a kazoo client or the sweeper's kazoo-shaped `OxiaStore`.

Orphans Pulsar makes by itself are recorded too (today: schema ledgers written by concurrent
first-time schema registrations that lost the locator update, `BookkeeperSchemaStorage`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import pulsar
from kazoo.client import KazooClient
from pulsar.schema import AvroSchema

from harness.testbed.admin import Admin
from harness.testbed.server import TestbedInfo, testbed_crash, testbed_up
from harness.testbed.workload import (
    NAMESPACE,
    SCHEMA_VERSIONS,
    consume_ack,
    offload_closed_ledgers,
    produce,
    topic,
)
from sweeper.codecs import pulsar as codec
from sweeper.codecs.bookkeeper import decode_ledger_metadata, pulsar_custom_metadata

if TYPE_CHECKING:
    from sweeper.metastore.oxia import OxiaStore

# What the harness reads and edits the testbed's metadata with (harness.testbed.world.metadata_for): a kazoo
# client on ZooKeeper, an OxiaStore on Oxia; only the part of kazoo's client both implement is used.
Metadata: TypeAlias = "KazooClient | OxiaStore"

ML_ROOT = "/managed-ledgers"
SCHEMAS_ROOT = "/schemas"
LEDGERS_ROOT = "/ledgers"

DROP_ONE = topic("drop-one")
FORGOTTEN = topic("forgotten")
CURSOR_SWITCH = topic("cursor-switch")
SCHEMA_DROP = topic("schema-drop")
COMPACT_LEAK = topic("compact-leak")
OFFLOAD_LOST = topic("offload-lost")


def ml_path(name: str) -> str:
    """The managed-ledger znode of a persistent topic (local name URL-encoded like Pulsar's
    `TopicName.getPersistenceNamingEncoding`)."""
    from urllib.parse import quote_plus

    _, rest = name.split("://", 1)
    tenant, namespace, local = rest.split("/", 2)
    return f"{ML_ROOT}/{tenant}/{namespace}/persistent/{quote_plus(local, safe='')}"


def schema_path(name: str) -> str:
    _, rest = name.split("://", 1)
    return f"{SCHEMAS_ROOT}/{rest}"


@dataclass
class InducedOrphan:
    kind: str  # the reason a correct sweeper gives (sweeper.rules.classify.Reason / ObjectReason values)
    topic: str
    how: str
    ledgers: list[int] = field(default_factory=list)
    objects: list[str] = field(default_factory=list)  # S3 keys
    made_at_ms: int = 0


@dataclass
class Manifest:
    orphans: list[InducedOrphan] = field(default_factory=list)
    compacted_current: dict[str, int] = field(default_factory=dict)  # topic -> its live compacted ledger
    offload_bucket: str = ""

    def orphan_ledgers(self) -> dict[int, str]:
        return {ledger: o.kind for o in self.orphans for ledger in o.ledgers}

    def orphan_objects(self) -> dict[str, str]:
        return {key: o.kind for o in self.orphans for key in o.objects}

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"orphans": [asdict(o) for o in self.orphans],
                                    "compacted_current": self.compacted_current,
                                    "offload_bucket": self.offload_bucket,
                                    "orphan_ledgers": {str(k): v for k, v in self.orphan_ledgers().items()},
                                    "orphan_objects": self.orphan_objects()}, indent=1, sort_keys=True))
        return path

    @staticmethod
    def read(path: Path) -> Manifest:
        data = json.loads(path.read_text())
        return Manifest([InducedOrphan(**o) for o in data["orphans"]], data["compacted_current"],
                        data["offload_bucket"])


def _now_ms() -> int:
    return int(time.time() * 1000)


def _cas(zk: Metadata, path: str, mutate: Any, decode: Any, encode: Any) -> None:
    """Read, change, write back only if nobody wrote in between (the broker's own discipline)."""
    data, stat = zk.get(path)
    message = decode(data)
    mutate(message)
    zk.set(path, encode(message), version=stat.version)


def _ml_ledgers(zk: Metadata, name: str) -> list[Any]:
    return list(codec.decode_managed_ledger_info(zk.get(ml_path(name))[0]).ledgerInfo)


def drop_ledger_from_list(zk: Metadata, client: pulsar.Client, admin: Admin) -> InducedOrphan:
    """A consumed ledger leaves the managed ledger's list; its BookKeeper deletion is lost."""
    admin.create_subscription(DROP_ONE, "s1")
    produce(client, DROP_ONE, 30, prefix="drop")
    admin.skip_all(DROP_ONE, "s1")
    admin.unload(DROP_ONE)
    first = _ml_ledgers(zk, DROP_ONE)[0].ledgerId

    def drop(info: Any) -> None:
        kept = [ledger for ledger in info.ledgerInfo if ledger.ledgerId != first]
        del info.ledgerInfo[:]
        info.ledgerInfo.extend(kept)

    _cas(zk, ml_path(DROP_ONE), drop, codec.decode_managed_ledger_info, codec.encode_managed_ledger_info)
    return InducedOrphan("dropped_from_list", DROP_ONE, "unloaded, first ledger removed from the list by CAS",
                         [first], made_at_ms=_now_ms())


def forget_topic(zk: Metadata, client: pulsar.Client, admin: Admin) -> InducedOrphan:
    """The topic's metadata is deleted (managed ledger and cursors), its ledgers are not."""
    admin.create_subscription(FORGOTTEN, "s1")
    produce(client, FORGOTTEN, 25, prefix="gone")
    consume_ack(client, FORGOTTEN, "s1", 11)
    admin.unload(FORGOTTEN)  # the broker deletes the cursor ledger on a clean close; data ledgers remain
    path = ml_path(FORGOTTEN)
    ledgers = [ledger.ledgerId for ledger in _ml_ledgers(zk, FORGOTTEN)]
    transaction = zk.transaction()
    for cursor in zk.get_children(path):
        transaction.delete(f"{path}/{cursor}", version=zk.exists(f"{path}/{cursor}").version)
    transaction.delete(path, version=zk.exists(path).version)
    results = transaction.commit()
    if any(isinstance(r, Exception) for r in results):
        raise RuntimeError(f"deleting {path} failed: {results}")
    existing = [ledger for ledger in ledgers if zk.exists(ledger_znode(ledger))]
    return InducedOrphan("topic_deleted", FORGOTTEN, "unloaded, managed-ledger and cursor znodes deleted",
                         existing, made_at_ms=_now_ms())


def ledger_znode(ledger_id: int) -> str:
    # Pulsar's default HierarchicalLedgerManager layout: 2-4-4 digits.
    digits = f"{ledger_id:010d}"
    return f"{LEDGERS_ROOT}/{digits[:2]}/{digits[2:6]}/L{digits[6:]}"


def prepare_cursor_switch(client: pulsar.Client, admin: Admin) -> dict[str, Any]:
    """A subscription with an active cursor ledger, recorded before the crash."""
    admin.create_subscription(CURSOR_SWITCH, "s1")
    produce(client, CURSOR_SWITCH, 20, prefix="cs")
    consume_ack(client, CURSOR_SWITCH, "s1", 8)
    deadline = time.monotonic() + 30
    while True:
        cursor = admin.internal_stats(CURSOR_SWITCH)["cursors"]["s1"]
        if cursor["cursorLedger"] >= 0 and cursor["markDeletePosition"].startswith(tuple("0123456789")):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"no cursor ledger for {CURSOR_SWITCH}: {cursor}")
        time.sleep(0.5)
    ledger, entry = (int(x) for x in cursor["markDeletePosition"].split(":"))
    return {"cursor_ledger": cursor["cursorLedger"], "mark_delete": (ledger, entry)}


def switch_cursor_while_down(zk: Metadata, prepared: dict[str, Any]) -> InducedOrphan:
    """With the broker killed: the first step of a cursor-ledger switch (the znode now keeps the position
    and names no cursor ledger, as `ManagedCursorImpl` writes it when it moves the position to the
    metadata store), without the second (deleting the old cursor ledger)."""
    path = f"{ml_path(CURSOR_SWITCH)}/s1"
    old = prepared["cursor_ledger"]

    def switch(info: Any) -> None:
        if info.cursorsLedgerId != old:
            raise RuntimeError(f"{path} names cursor ledger {info.cursorsLedgerId}, expected {old}")
        info.cursorsLedgerId = -1
        info.markDeleteLedgerId, info.markDeleteEntryId = prepared["mark_delete"]
        info.lastActive = _now_ms()

    _cas(zk, path, switch, codec.decode_managed_cursor_info, codec.encode_managed_cursor_info)
    return InducedOrphan("cursor_ledger_replaced", CURSOR_SWITCH,
                         "broker killed (-9); cursor znode switched off its ledger by CAS; old ledger kept",
                         [old], made_at_ms=_now_ms())


def drop_schema_version(zk: Metadata, client: pulsar.Client, admin: Admin) -> InducedOrphan:
    """The oldest schema version leaves the locator's index; its schema ledger is not deleted."""
    for version, cls in enumerate(SCHEMA_VERSIONS):
        produce(client, SCHEMA_DROP, 3, schema=AvroSchema(cls), make=lambda i, cls=cls, v=version: cls(sensor=f"{v}"))
    admin.unload(SCHEMA_DROP)
    path = schema_path(SCHEMA_DROP)
    locator = codec.decode_schema_locator(zk.get(path)[0])
    oldest = min(locator.index, key=lambda entry: entry.version)

    def drop(message: Any) -> None:
        kept = [entry for entry in message.index if entry.version != oldest.version]
        del message.index[:]
        message.index.extend(kept)

    _cas(zk, path, drop, codec.decode_schema_locator, codec.encode_schema_locator)
    return InducedOrphan("schema_version_deleted", SCHEMA_DROP,
                         f"unloaded, schema version {oldest.version} removed from the locator by CAS",
                         [oldest.position.ledgerId], made_at_ms=_now_ms())


def leak_compacted_ledger(zk: Metadata, client: pulsar.Client, admin: Admin) -> tuple[InducedOrphan, int]:
    """The compaction pointer moves to a new compacted ledger; the old one's deletion is lost."""
    produce(client, COMPACT_LEAK, 20, prefix="leak", key_mod=4)
    admin.compact(COMPACT_LEAK)
    old = int(admin.internal_stats(COMPACT_LEAK)["compactedLedger"]["ledgerId"])
    admin.unload(COMPACT_LEAK)
    path = f"{ml_path(COMPACT_LEAK)}/__compaction"
    first = _ml_ledgers(zk, COMPACT_LEAK)[0].ledgerId

    def forget(info: Any) -> None:
        kept = [p for p in info.properties if p.name != "CompactedTopicLedger"]
        del info.properties[:]
        info.properties.extend(kept)
        info.markDeleteLedgerId, info.markDeleteEntryId = first, -1

    _cas(zk, path, forget, codec.decode_managed_cursor_info, codec.encode_managed_cursor_info)
    produce(client, COMPACT_LEAK, 6, prefix="leak2", key_mod=4)
    admin.compact(COMPACT_LEAK)
    current = int(admin.internal_stats(COMPACT_LEAK)["compactedLedger"]["ledgerId"])
    admin.unload(COMPACT_LEAK)  # the new pointer reaches ZooKeeper
    if current == old or not zk.exists(ledger_znode(old)):
        raise RuntimeError(f"compacted ledger {old} of {COMPACT_LEAK} not left behind (current {current})")
    return (InducedOrphan("compacted_ledger_leaked", COMPACT_LEAK,
                          "compacted, pointer cleared by CAS while unloaded, compacted again: old ledger kept",
                          [old], made_at_ms=_now_ms()), current)


def lose_offload_context(zk: Metadata, client: pulsar.Client, admin: Admin, bucket: str,
                         s3: Any) -> InducedOrphan:
    """An offloaded ledger leaves the managed ledger's list; its S3 objects stay."""
    produce(client, OFFLOAD_LOST, 30, prefix="ol")
    offloaded = offload_closed_ledgers(admin, OFFLOAD_LOST, lambda ledger: bool(zk.exists(ledger_znode(ledger))))
    admin.unload(OFFLOAD_LOST)
    first = next(ledger for ledger in _ml_ledgers(zk, OFFLOAD_LOST) if ledger.ledgerId == offloaded[0])
    uuid = codec.offload_uuid(first.offloadContext.uidMsb, first.offloadContext.uidLsb)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=uuid).get("Contents", []))
    if not keys:
        raise RuntimeError(f"no S3 object for ledger {first.ledgerId} of {OFFLOAD_LOST} (uuid {uuid})")

    def drop(info: Any) -> None:
        kept = [ledger for ledger in info.ledgerInfo if ledger.ledgerId != first.ledgerId]
        del info.ledgerInfo[:]
        info.ledgerInfo.extend(kept)

    _cas(zk, ml_path(OFFLOAD_LOST), drop, codec.decode_managed_ledger_info, codec.encode_managed_ledger_info)
    return InducedOrphan("offload_unreferenced", OFFLOAD_LOST,
                         f"offloaded ledger {first.ledgerId} removed from the list by CAS; objects kept",
                         objects=keys, made_at_ms=_now_ms())


def pulsar_made_schema_orphans(zk: Metadata) -> list[InducedOrphan]:
    """Schema ledgers no locator lists: left by Pulsar itself (concurrent first registrations race on
    the locator; the losers' ledgers are never deleted)."""
    listed: set[int] = set()
    stack = [SCHEMAS_ROOT]
    while stack:
        node = stack.pop()
        data, _ = zk.get(node)
        children = zk.get_children(node)
        if data and not children:
            locator = codec.decode_schema_locator(data)
            listed.update(entry.position.ledgerId for entry in locator.index)
            listed.add(locator.info.position.ledgerId)
        stack.extend(f"{node}/{child}" for child in children)
    found: dict[str, list[int]] = {}
    for ledger_id, custom in all_ledgers(zk).items():
        if custom.get("component") == "schema" and ledger_id not in listed:
            found.setdefault(custom.get("pulsar/schemaId", "?"), []).append(ledger_id)
    return [InducedOrphan("schema_version_deleted", f"schema {schema_id}",
                          "made by Pulsar: a schema ledger its locator never listed", sorted(ids),
                          made_at_ms=_now_ms())
            for schema_id, ids in sorted(found.items())]


def all_ledgers(zk: Metadata) -> dict[int, dict[str, str]]:
    """Every BookKeeper ledger with its custom metadata (hierarchical layout)."""
    out: dict[int, dict[str, str]] = {}
    for top in zk.get_children(LEDGERS_ROOT):
        if not (len(top) == 2 and top.isdigit()):
            continue
        for middle in zk.get_children(f"{LEDGERS_ROOT}/{top}"):
            for leaf in zk.get_children(f"{LEDGERS_ROOT}/{top}/{middle}"):
                if not leaf.startswith("L"):
                    continue
                data, _ = zk.get(f"{LEDGERS_ROOT}/{top}/{middle}/{leaf}")
                out[int(top + middle + leaf[1:])] = pulsar_custom_metadata(decode_ledger_metadata(data))
    return out


def induce_orphans(info: TestbedInfo, client_factory: Any, admin: Admin, zk_factory: Any,
                   s3: Any) -> tuple[Manifest, TestbedInfo]:
    """Make every orphan kind; the broker is killed and restarted once on the way (the cursor switch).

    `client_factory` and `zk_factory` build fresh clients (the crash drops the old connections)."""
    manifest = Manifest(offload_bucket=info.offload_bucket)
    client = client_factory(info)
    prepared = prepare_cursor_switch(client, admin)
    client.close()
    testbed_crash(info.home)
    zk = zk_factory(info)
    try:
        manifest.orphans.append(switch_cursor_while_down(zk, prepared))
    finally:
        zk.stop()
    info = testbed_up(info.home)
    admin = Admin(info.admin_url, info.superuser_token())
    client = client_factory(info)
    zk = zk_factory(info)
    try:
        manifest.orphans.append(drop_ledger_from_list(zk, client, admin))
        manifest.orphans.append(forget_topic(zk, client, admin))
        manifest.orphans.append(drop_schema_version(zk, client, admin))
        leaked, current = leak_compacted_ledger(zk, client, admin)
        manifest.orphans.append(leaked)
        manifest.compacted_current[COMPACT_LEAK] = current
        manifest.orphans.append(lose_offload_context(zk, client, admin, info.offload_bucket, s3))
        induced = set(manifest.orphan_ledgers())
        for natural in pulsar_made_schema_orphans(zk):
            natural.ledgers = [ledger for ledger in natural.ledgers if ledger not in induced]
            if natural.ledgers:
                manifest.orphans.append(natural)
    finally:
        zk.stop()
        client.close()
    return manifest, info


__all__ = ["NAMESPACE", "InducedOrphan", "Manifest", "Metadata", "induce_orphans", "ml_path"]
