"""Delete phase against a real ZooKeeper: what is deleted, what is kept, and that nothing else moves."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from harness.zkserver import ServerClock, start_zookeeper, stop_zookeeper
from sweeper.codecs import pulsar as codec
from sweeper.codecs.layout import LedgerLayout, layout_znode, ledger_path
from sweeper.delete import (
    ALREADY_GONE,
    DELETED,
    FAILED,
    IN_USE,
    INVALID,
    MISMATCH,
    WOULD_DELETE,
    DeleteRunLock,
    LedgerDeleter,
    RetryPolicy,
    run_with_retries,
)
from sweeper.errors import RunLockHeld
from sweeper.vocabulary import DAY_MS
from sweeper.zk import client as zkutil
from tests.support.ledgers import CREATED, ledger_bytes

ROOT = "/ledgers"
ML_ROOT = "/managed-ledgers"
SCHEMAS = "/schemas"
LAYOUT = LedgerLayout.HIERARCHICAL
NOW = CREATED + 10 * DAY_MS
MIN_AGE = 7 * DAY_MS
TOPIC = "persistent://t/ns/topic-a"
ML = "t/ns/persistent/topic-a"
SCHEMA_ID = "t/ns/topic-a"
BUCKET_KEY = "#pulsar.internal.delayed.bucket_1_5"
UUID_MSB, UUID_LSB = 0x123E4567E89B12D3, -0x5B9BD9EBBFFFFFFF

# In use: 10, 11 listed; 12 cursor ledger of sub1; 13 compacted; 14 bucket; 15, 17 schema; 16 listed but offloaded
# and released by BookKeeper (garbage by design). Orphans sit next to them (siblings) and in trees of their own.
ORPHAN_ML = 100_000_020  # 01/0000/L0020: alone in its parents
ORPHAN_CURSOR = 21  # sibling of the in-use ledgers under 00/0000
ORPHAN_SCHEMA = 2_000_000_030  # 20/0000/L0030
ORPHAN_COMPACTED = 23
ORPHAN_BUCKET = 2**40  # long tree, 000/0001/0995/1162/L7776


def ml_custom(cursor: str | None = None) -> dict[str, str]:
    custom = {"application": "pulsar", "component": "managed-ledger", "pulsar/managed-ledger": ML}
    if cursor:
        custom["pulsar/cursor"] = cursor
    return custom


SCHEMA_CUSTOM = {"application": "pulsar", "component": "schema", "pulsar/schemaId": SCHEMA_ID}
COMPACTED_CUSTOM = {"application": "pulsar", "component": "compacted-ledger", "pulsar/compactedTopic": TOPIC}
BUCKET_CUSTOM = {"application": "pulsar", "component": "delayed-index-bucket",
                 "pulsar/delayedIndexBucketKey": BUCKET_KEY, "pulsar/delayedIndexTopic": TOPIC,
                 "pulsar/delayedIndexCursor": "sub2"}


def put_ledger(zk: KazooClient, ledger_id: int, custom: Mapping[str, str], **kw: Any) -> str:
    path = ledger_path(ROOT, ledger_id, LAYOUT)
    zk.create(path, ledger_bytes(custom, **kw), makepath=True)
    return path


def ml_bytes(ledgers: list[int], released: tuple[int, ...] = ()) -> bytes:
    info = codec.pb.ManagedLedgerInfo()
    for ledger_id in ledgers:
        entry = info.ledgerInfo.add(ledgerId=ledger_id, entries=10, size=100, timestamp=CREATED)
        if ledger_id in released:
            ctx = entry.offloadContext
            ctx.uidMsb, ctx.uidLsb, ctx.complete, ctx.bookkeeperDeleted = UUID_MSB, UUID_LSB, True, True
    return codec.encode_managed_ledger_info(info)


def cursor_bytes(cursors_ledger: int = -1, longs: Mapping[str, int] | None = None,
                 strings: Mapping[str, str] | None = None) -> bytes:
    info = codec.pb.ManagedCursorInfo(cursorsLedgerId=cursors_ledger, markDeleteLedgerId=10, markDeleteEntryId=3)
    for name, value in (longs or {}).items():
        info.properties.add(name=name, value=value)
    for name, value in (strings or {}).items():
        info.cursorProperties.add(name=name, value=value)
    return codec.encode_managed_cursor_info(info)


def schema_bytes(ledgers: list[int], latest: int | None = None) -> bytes:
    locator = codec.pb.SchemaLocator()
    for version, ledger_id in enumerate(ledgers):
        locator.index.add(version=version, position=codec.pb.PositionInfo(ledgerId=ledger_id, entryId=0), hash=b"h")
    locator.info.CopyFrom(locator.index[-1])
    if latest is not None:  # the latest version, not (yet) in the index: its ledger is referenced all the same
        locator.info.position.ledgerId = latest
    return codec.encode_schema_locator(locator)


def seed(zk: KazooClient) -> None:
    zk.create(f"{ROOT}/LAYOUT", layout_znode(LAYOUT), makepath=True)
    for child in ("available/bookie-1:3181", "idgen/ID-0000000001", "INSTANCEID", "underreplication/ledgers"):
        zk.create(f"{ROOT}/{child}", b"", makepath=True)
    for ledger_id in (10, 11, 16):
        put_ledger(zk, ledger_id, ml_custom())
    put_ledger(zk, 12, ml_custom("sub1"))
    put_ledger(zk, 13, COMPACTED_CUSTOM)
    put_ledger(zk, 14, BUCKET_CUSTOM)
    put_ledger(zk, 15, SCHEMA_CUSTOM)
    put_ledger(zk, 17, SCHEMA_CUSTOM)
    put_ledger(zk, ORPHAN_ML, ml_custom())
    put_ledger(zk, ORPHAN_CURSOR, ml_custom("sub1"))
    put_ledger(zk, ORPHAN_SCHEMA, SCHEMA_CUSTOM)
    put_ledger(zk, ORPHAN_COMPACTED, COMPACTED_CUSTOM)
    put_ledger(zk, ORPHAN_BUCKET, BUCKET_CUSTOM)
    put_ledger(zk, 30, {"application": "bookkeeper-tools"})  # not Pulsar's
    ml = f"{ML_ROOT}/{ML}"
    zk.create(ml, ml_bytes([10, 11, 16], released=(16,)), makepath=True)
    zk.create(f"{ml}/sub1", cursor_bytes(12))
    zk.create(f"{ml}/sub2", cursor_bytes(-1, strings={BUCKET_KEY: "14", "other": "x"}))
    zk.create(f"{ml}/__compaction", cursor_bytes(-1, longs={"CompactedTopicLedger": 13}))
    zk.create(f"{SCHEMAS}/{SCHEMA_ID}", schema_bytes([15], latest=17), makepath=True)


def record(ledger_id: int, component: str = "MANAGED_LEDGER", topic: str | None = TOPIC, cursor: str | None = None,
           schema_id: str | None = None, **properties: str) -> dict[str, Any]:
    return {"topicName": topic, "ledgerComponent": component, "ledgerType": "LEDGER", "ledgerId": ledger_id,
            "cursorName": cursor, "schemaId": schema_id, "offloadContext": None, "properties": properties,
            "reason": "test", "runId": "run-1"}


def orphan_records() -> list[dict[str, Any]]:
    return [
        record(ORPHAN_ML),
        record(ORPHAN_CURSOR, "MANAGED_CURSOR", cursor="sub1"),
        record(ORPHAN_SCHEMA, "SCHEMA_STORAGE", topic=None, schema_id=SCHEMA_ID),
        record(ORPHAN_COMPACTED, "COMPACTED_LEDGER"),
        record(ORPHAN_BUCKET, "DELAYED_INDEX_BUCKET", bucket_key=BUCKET_KEY),
        record(16),  # listed, but its BookKeeper copy was released after offload
    ]


def dump(zk: KazooClient, path: str = "/") -> dict[str, tuple[bytes, int, int, int]]:
    """Every znode below `path` with its data, version, child version and modification zxid."""
    out: dict[str, tuple[bytes, int, int, int]] = {}
    stack = [path]
    while stack:
        node = stack.pop()
        data, stat = zk.get(node)
        out[node] = (data, stat.version, stat.cversion, stat.mzxid)
        stack.extend(zkutil.join(node, c) for c in zk.get_children(node))
    return out


def copy_present(bucket: str, region: str, endpoint: str, keys: tuple[str, ...], ml: str) -> str | None:
    """An offloaded copy found whole (the check itself runs against S3 in test_delete_s3)."""
    return None


def deleter(zk: KazooClient, execute: bool = True, **kw: Any) -> LedgerDeleter:
    kw.setdefault("now_ms", NOW)
    kw.setdefault("offload_check", copy_present)
    return LedgerDeleter(zk, ledgers_root=ROOT, layout=LAYOUT, managed_ledgers_root=ML_ROOT, schemas_root=SCHEMAS,
                         min_age_ms=MIN_AGE, execute=execute, **kw)


@pytest.fixture
def cluster(zk: KazooClient, zk_clock: ServerClock) -> KazooClient:
    # Ledger znodes are created with their ledgers: ZooKeeper's ctime must not be later than CREATED,
    # since a ledger's age comes from the later of the two clocks.
    with zk_clock.at(CREATED - DAY_MS):
        seed(zk)
    return zk


def outcomes(results: list[Any]) -> list[str]:
    return [r.outcome for r in results]


def test_orphans_of_every_component_deleted_with_empty_parents_and_nothing_else(cluster: KazooClient) -> None:
    before = dump(cluster)
    results = deleter(cluster).process(orphan_records())
    assert outcomes(results) == [DELETED] * 6, [(r.ledger_id, r.detail, r.error) for r in results]
    after = dump(cluster)
    deleted = {ledger_path(ROOT, r["ledgerId"], LAYOUT) for r in orphan_records()}
    emptied = {f"{ROOT}/01/0000", f"{ROOT}/01", f"{ROOT}/20/0000", f"{ROOT}/20",
               f"{ROOT}/000/0001/0995/1162", f"{ROOT}/000/0001/0995", f"{ROOT}/000/0001", f"{ROOT}/000"}
    assert set(before) - set(after) == deleted | emptied
    # Siblings, referrers, the root and BookKeeper's own znodes: byte for byte and version for version.
    untouched = {p: v for p, v in before.items() if p not in deleted | emptied}
    changed_parents = {p for p in untouched if any(d.rsplit("/", 1)[0] == p for d in deleted | emptied)}
    assert {p: v for p, v in after.items() if p not in changed_parents} == {
        p: v for p, v in untouched.items() if p not in changed_parents}
    assert {p: after[p][:2] for p in changed_parents} == {p: untouched[p][:2] for p in changed_parents}
    assert f"{ROOT}/00/0000" in after and ROOT in after
    assert {r.zk_path for r in results} == deleted


def test_dry_run_is_the_default_and_writes_nothing(cluster: KazooClient) -> None:
    before = dump(cluster)
    quiet = LedgerDeleter(cluster, ledgers_root=ROOT, layout=LAYOUT, managed_ledgers_root=ML_ROOT,
                          schemas_root=SCHEMAS, min_age_ms=MIN_AGE, now_ms=lambda: NOW, offload_check=copy_present)
    results = quiet.process(orphan_records())
    assert outcomes(results) == [WOULD_DELETE] * 6
    assert dump(cluster) == before


def test_ledgers_still_referenced_are_kept(cluster: KazooClient) -> None:
    before = dump(cluster)
    results = deleter(cluster).process([
        record(10), record(11),
        record(12, "MANAGED_CURSOR", cursor="sub1"),
        record(13, "COMPACTED_LEDGER"),
        record(14, "DELAYED_INDEX_BUCKET", bucket_key=BUCKET_KEY),
        record(15, "SCHEMA_STORAGE", topic=None, schema_id=SCHEMA_ID),
        record(17, "SCHEMA_STORAGE", topic=None, schema_id=SCHEMA_ID),
    ])
    assert outcomes(results) == [IN_USE] * 7
    assert "listed in managed ledger" in results[0].detail
    assert "cursor sub1" in results[2].detail and "CompactedTopicLedger" in results[3].detail
    assert BUCKET_KEY in results[4].detail and "schema" in results[5].detail
    assert dump(cluster) == before


def test_unverifiable_referrers_keep_the_ledger(cluster: KazooClient) -> None:
    ml = f"{ML_ROOT}/{ML}"
    # The compacted-topic pointer moved into the cursor ledger, out of ZooKeeper's sight.
    cluster.set(f"{ml}/__compaction", cursor_bytes(99))
    cluster.set(f"{ml}/sub2", cursor_bytes(-1, strings={BUCKET_KEY: "not-a-number"}))
    cluster.set(f"{SCHEMAS}/{SCHEMA_ID}", b"\x0a\xff\xff")
    before = dump(cluster)
    results = deleter(cluster).process([
        record(ORPHAN_COMPACTED, "COMPACTED_LEDGER"),
        record(ORPHAN_BUCKET, "DELAYED_INDEX_BUCKET", bucket_key=BUCKET_KEY),
        record(ORPHAN_SCHEMA, "SCHEMA_STORAGE", topic=None, schema_id=SCHEMA_ID),
    ])
    assert outcomes(results) == [IN_USE] * 3
    assert all("cannot be verified" in r.detail for r in results)
    cluster.set(ml, b"\x08\x01garbage")
    results = deleter(cluster).process([record(ORPHAN_ML)])
    assert outcomes(results) == [IN_USE] and "cannot be verified" in results[0].detail
    assert {p: v[0] for p, v in dump(cluster).items() if p.startswith(ROOT)} == {
        p: v[0] for p, v in before.items() if p.startswith(ROOT)}


SHADOW_ML = "t/ns/persistent/topic-a-shadow"


def test_a_shadow_topic_still_listing_the_ledger_keeps_it_and_is_checked_at_delete(cluster: KazooClient) -> None:
    # PIP-180: a shadow topic's managed ledger lists its source's ledgers. The source dropped
    # ORPHAN_ML; the shadow has not caught up yet, so the ledger is still read through it.
    shadow = f"{ML_ROOT}/{SHADOW_ML}"
    cluster.create(shadow, ml_bytes([10, 11, ORPHAN_ML]))
    shadows = {ML: [SHADOW_ML]}
    before = dump(cluster)
    kept = deleter(cluster, shadows=shadows).process([record(ORPHAN_ML)])
    assert outcomes(kept) == [IN_USE] and SHADOW_ML in kept[0].detail
    assert dump(cluster) == before
    # Without knowing its shadows the deleter would have taken it: the rule is what keeps it.
    assert outcomes(deleter(cluster, execute=False).process([record(ORPHAN_ML)])) == [WOULD_DELETE]

    # The shadow catches up between verification and delete; the multi checks its version too.
    cluster.set(shadow, ml_bytes([10, 11]))
    sweeper = deleter(cluster, shadows=shadows)
    verified, _ = sweeper.verify([record(ORPHAN_ML)])
    cluster.set(shadow, ml_bytes([10, 11, ORPHAN_ML]))  # e.g. re-created from an old list
    assert sweeper.delete(verified)[0].outcome == FAILED
    assert cluster.exists(ledger_path(ROOT, ORPHAN_ML, LAYOUT)) is not None
    cluster.set(shadow, b"\x08\x01garbage")
    assert "cannot be verified" in deleter(cluster, shadows=shadows).process([record(ORPHAN_ML)])[0].detail
    cluster.set(shadow, ml_bytes([10, 11]))
    assert outcomes(deleter(cluster, shadows=shadows).process([record(ORPHAN_ML)])) == [DELETED]
    # The same rule as for the source (and as reconcile): a copy listed offloaded and released by
    # BookKeeper is not a reference, in a shadow's list either.
    cluster.set(shadow, ml_bytes([10, 11, 16], released=(16,)))
    assert outcomes(deleter(cluster, shadows=shadows).process([record(16)])) == [DELETED]


def test_reference_regained_between_verify_and_delete_stops_the_delete(cluster: KazooClient) -> None:
    sweeper = deleter(cluster)
    verified, results = sweeper.verify([record(ORPHAN_ML), record(ORPHAN_CURSOR, "MANAGED_CURSOR", cursor="sub1")])
    assert results == [None, None] and len(verified) == 2
    # Pulsar writes between our read and our delete: the ML lists the ledger again, sub1 moves to its ledger.
    ml = f"{ML_ROOT}/{ML}"
    cluster.set(ml, ml_bytes([10, 11, 16, ORPHAN_ML], released=(16,)))
    cluster.set(f"{ml}/sub1", cursor_bytes(ORPHAN_CURSOR))
    outcome = sweeper.delete(verified)
    assert [outcome[0].outcome, outcome[1].outcome] == [FAILED, FAILED]
    assert "changed after verification" in outcome[0].detail and "BadVersion" in (outcome[0].error or "")
    assert cluster.exists(ledger_path(ROOT, ORPHAN_ML, LAYOUT)) is not None
    assert cluster.exists(ledger_path(ROOT, ORPHAN_CURSOR, LAYOUT)) is not None
    # The retry re-verifies and sees the reference.
    again = sweeper.process([record(ORPHAN_ML), record(ORPHAN_CURSOR, "MANAGED_CURSOR", cursor="sub1")])
    assert outcomes(again) == [IN_USE, IN_USE]


def test_forged_records_are_mismatch_and_nothing_is_deleted(cluster: KazooClient) -> None:
    before = dump(cluster)
    forged = [
        record(ORPHAN_ML, topic="persistent://t/ns/other-topic"),  # wrong topic
        record(ORPHAN_ML, "SCHEMA_STORAGE", topic=None, schema_id=SCHEMA_ID),  # wrong component
        record(ORPHAN_CURSOR),  # a cursor ledger claimed as a data ledger
        record(ORPHAN_CURSOR, "MANAGED_CURSOR", cursor="sub9"),  # wrong cursor
        record(ORPHAN_SCHEMA, "SCHEMA_STORAGE", topic=None, schema_id="t/ns/other"),  # wrong schema id
        record(ORPHAN_COMPACTED, "COMPACTED_LEDGER", topic="persistent://t/ns/b"),  # wrong compacted topic
        record(ORPHAN_BUCKET, "DELAYED_INDEX_BUCKET", bucket_key="#pulsar.internal.delayed.bucket_9_9"),
        record(30),  # not a Pulsar ledger
        record(ORPHAN_ML, zk_path=f"{ML_ROOT}/{ML}"),  # aimed at the managed-ledger znode
        record(ORPHAN_ML, zk_path=f"{ROOT}/LAYOUT"),
        record(7777, zk_path=ledger_path(ROOT, ORPHAN_ML, LAYOUT)),  # another ledger's znode
    ]
    results = deleter(cluster).process(forged)
    assert outcomes(results) == [MISMATCH] * len(forged), [(r.ledger_id, r.outcome, r.detail) for r in results]
    assert "application" in results[7].detail and "LAYOUT" in results[9].detail
    assert dump(cluster) == before


def test_never_existed_and_rerun_are_already_gone(cluster: KazooClient) -> None:
    sweeper = deleter(cluster)
    assert outcomes(sweeper.process([record(555), record(2**50)])) == [ALREADY_GONE, ALREADY_GONE]
    assert outcomes(sweeper.process(orphan_records())) == [DELETED] * 6
    before = dump(cluster)
    assert outcomes(sweeper.process(orphan_records())) == [ALREADY_GONE] * 6
    assert dump(cluster) == before


def test_version_changes_keep_the_ledger(cluster: KazooClient) -> None:
    path = ledger_path(ROOT, ORPHAN_ML, LAYOUT)
    cluster.set(path, ledger_bytes(ml_custom()))  # version 1 now: someone touched it after the plan
    results = deleter(cluster).process([record(ORPHAN_ML, zk_version="0")])
    assert outcomes(results) == [IN_USE] and "changed since the plan" in results[0].detail
    # Changed after our own verification: the compare-and-set delete refuses.
    sweeper = deleter(cluster)
    verified, _ = sweeper.verify([record(ORPHAN_ML, zk_version="1")])
    cluster.set(path, ledger_bytes(ml_custom()))
    assert sweeper.delete(verified)[0].outcome == IN_USE
    assert cluster.exists(path) is not None


def test_young_open_and_unreadable_ledgers_are_kept(cluster: KazooClient, zk_clock: ServerClock) -> None:
    with zk_clock.at(CREATED - DAY_MS):
        put_ledger(cluster, 40, ml_custom(), state="IN_RECOVERY")
        put_ledger(cluster, 41, ml_custom(), ctime=NOW - DAY_MS)
    put_ledger(cluster, 42, ml_custom(), ctime=None)  # falls back to the znode's ctime: just now
    cluster.create(ledger_path(ROOT, 43, LAYOUT), b"BookieMetadataFormatVersion\t9\n")
    results = deleter(cluster).process([record(40), record(41), record(42), record(43)])
    assert outcomes(results) == [IN_USE, IN_USE, IN_USE, INVALID]
    assert "IN_RECOVERY" in results[0].detail and "grace" in results[1].detail and "grace" in results[2].detail
    for ledger_id in (40, 41, 42, 43):
        assert cluster.exists(ledger_path(ROOT, ledger_id, LAYOUT)) is not None
    # The znode ctime fallback counts once the ledger is old enough.
    later = deleter(cluster, now_ms=lambda: int(time.time() * 1000) + 8 * DAY_MS)
    assert outcomes(later.process([record(42)])) == [DELETED]


def test_batch_with_bad_members_falls_back_to_singles(cluster: KazooClient) -> None:
    sweeper = deleter(cluster, batch_size=10)
    recs = [record(ORPHAN_ML), record(ORPHAN_CURSOR, "MANAGED_CURSOR", cursor="sub1"),
            record(ORPHAN_COMPACTED, "COMPACTED_LEDGER")]
    verified, _ = sweeper.verify(recs)
    cluster.delete(ledger_path(ROOT, ORPHAN_CURSOR, LAYOUT))  # gone behind our back
    cluster.set(ledger_path(ROOT, ORPHAN_COMPACTED, LAYOUT), ledger_bytes(COMPACTED_CUSTOM))  # changed
    results = sweeper.delete(verified)
    assert [results[i].outcome for i in range(3)] == [DELETED, ALREADY_GONE, IN_USE]
    assert cluster.exists(ledger_path(ROOT, ORPHAN_ML, LAYOUT)) is None
    assert cluster.exists(ledger_path(ROOT, ORPHAN_COMPACTED, LAYOUT)) is not None


def test_small_batches_and_parent_rules(cluster: KazooClient) -> None:
    sweeper = deleter(cluster, batch_size=2)
    assert outcomes(sweeper.process(orphan_records())) == [DELETED] * 6
    for path in (ROOT, f"{ROOT}/LAYOUT", f"{ROOT}/available", f"{ROOT}/idgen", f"{ROOT}/INSTANCEID",
                 f"{ROOT}/underreplication", f"{ROOT}/00/0000/L0010", "/managed-ledgers/t"):
        assert not sweeper._is_layout_dir(path), path
    for path in (f"{ROOT}/00", f"{ROOT}/00/0000", f"{ROOT}/000/0000/0000/0000"):
        assert sweeper._is_layout_dir(path), path
    cluster.create(f"{ROOT}/available/empty", b"")
    assert sweeper.remove_empty_parents([f"{ROOT}/available/empty/x", f"{ROOT}/idgen/ID-1"]) == []
    assert cluster.exists(f"{ROOT}/available/empty") is not None


def test_run_lock_refuses_a_second_holder_and_is_released(zk: KazooClient, zk_target: Any) -> None:
    other = zkutil.connect(zk_target.hosts)
    try:
        with DeleteRunLock(zk, run_id="run-1") as lock:
            assert lock.holder() is not None and lock.holder()["run_id"] == "run-1"  # type: ignore[index]
            with pytest.raises(RunLockHeld, match="run-1"), DeleteRunLock(other, run_id="run-2"):
                pass
        with DeleteRunLock(other, run_id="run-2"):
            assert DeleteRunLock(zk, run_id="x").holder()["run_id"] == "run-2"  # type: ignore[index]
        # A holder whose session ends (a crashed driver) leaves no lock behind.
        DeleteRunLock(other, run_id="run-3").acquire()
    finally:
        zkutil.close(other)
    with DeleteRunLock(zk, run_id="run-4"):
        pass


@pytest.fixture
def private_zk(tmp_path: Path) -> Iterator[tuple[Path, Any]]:
    info = start_zookeeper(tmp_path / "zk")
    holder = {"info": info}
    yield tmp_path / "zk", holder
    stop_zookeeper(holder["info"])


@pytest.mark.integration  # a ZooKeeper of its own (private_zk)
def test_zookeeper_restart_mid_run_ends_in_success(private_zk: tuple[Path, Any]) -> None:
    data_dir, holder = private_zk
    info = holder["info"]
    client = KazooClient(hosts=info.connect_string, timeout=10.0)
    client.start(timeout=15)
    try:
        assert info.clock is not None
        with info.clock.at(CREATED - DAY_MS):
            seed(client)
        stop_zookeeper(info)
        restarts: list[float] = []

        def sleep(seconds: float) -> None:
            restarts.append(seconds)
            if len(restarts) == 1:
                holder["info"] = start_zookeeper(data_dir, port=info.port)
                deadline = time.monotonic() + 15
                while not client.connected and time.monotonic() < deadline:
                    time.sleep(0.05)

        sweeper = deleter(client, op_timeout_s=1.0)
        results = run_with_retries(sweeper.process, orphan_records(), RetryPolicy(), sleep=sleep,
                                   rng=random.Random(1))
        assert outcomes(results) == [DELETED] * 6, [(r.outcome, r.error) for r in results]
        assert {r.attempt for r in results} == {2} and len(restarts) == 1
        assert all(client.exists(ledger_path(ROOT, r["ledgerId"], LAYOUT)) is None for r in orphan_records())
    finally:
        client.stop()
        client.close()


# ---- issue 11: rules a sandbox-only view got wrong ------------------------------------------------------------


def test_a_compacted_ledger_newer_than_a_lagging_pointer_is_never_deleted(cluster: KazooClient,
                                                                           zk_clock: ServerClock) -> None:
    # ZooKeeper holds CompactedTopicLedger=13 but the cursor has an active cursor ledger (99): Pulsar wrote the
    # newest compaction's pointer only there (ManagedCursorImpl.persistPositionMetaStore), so 23 may be current.
    # Without the rule, 23 "is not the pointer" and was deleted.
    ml = f"{ML_ROOT}/{ML}"
    cluster.set(f"{ml}/__compaction", cursor_bytes(99, longs={"CompactedTopicLedger": 13}))
    with zk_clock.at(CREATED - DAY_MS):
        put_ledger(cluster, 5, COMPACTED_CUSTOM)  # an older compaction, left behind: below the pointer
    results = deleter(cluster).process([record(ORPHAN_COMPACTED, "COMPACTED_LEDGER"), record(13, "COMPACTED_LEDGER"),
                                        record(5, "COMPACTED_LEDGER")])
    assert outcomes(results) == [IN_USE, IN_USE, DELETED], [r.detail for r in results]
    assert "compaction_pointer_may_lag" in results[0].detail
    assert cluster.exists(ledger_path(ROOT, ORPHAN_COMPACTED, LAYOUT)) is not None
    # With no pointer in ZooKeeper at all, nothing of the topic's compaction can be settled.
    cluster.set(f"{ml}/__compaction", cursor_bytes(-1))
    assert outcomes(deleter(cluster).process([record(ORPHAN_COMPACTED, "COMPACTED_LEDGER")])) == [IN_USE]


def test_bookkeeper_deleted_without_complete_still_needs_the_bookkeeper_copy(cluster: KazooClient) -> None:
    # Pulsar reads tiered storage only for a complete offload; until then the ledger is read from BookKeeper.
    info = codec.pb.ManagedLedgerInfo()
    for ledger_id in (10, 11, 16):
        entry = info.ledgerInfo.add(ledgerId=ledger_id, entries=10, size=100, timestamp=CREATED)
        if ledger_id == 16:
            ctx = entry.offloadContext
            ctx.uidMsb, ctx.uidLsb, ctx.complete, ctx.bookkeeperDeleted = UUID_MSB, UUID_LSB, False, True
    cluster.set(f"{ML_ROOT}/{ML}", codec.encode_managed_ledger_info(info))
    results = deleter(cluster).process([record(16)])
    assert outcomes(results) == [IN_USE] and "listed in managed ledger" in results[0].detail


def test_the_later_of_the_two_clocks_keeps_a_fresh_znode_whose_metadata_claims_old_age(cluster: KazooClient) -> None:
    # The metadata says CREATED (10 days before NOW), ZooKeeper says the znode is brand new (created at the
    # real time, long after NOW): a broker clock behind, or a forged ctime, never makes it old enough.
    put_ledger(cluster, 44, ml_custom(), ctime=CREATED)
    results = deleter(cluster).process([record(44)])
    assert outcomes(results) == [IN_USE] and "grace" in results[0].detail


SPECIAL_TOPIC = "persistent://t/ns/a b:c%d"  # a space, ':' and '%' in the local name
SPECIAL_ML = "t/ns/persistent/a+b%3Ac%25d"  # Codec.encode: java.net.URLEncoder


def test_topic_names_with_spaces_colons_and_percents_resolve_to_their_managed_ledger(
        cluster: KazooClient, zk_clock: ServerClock) -> None:
    compacted = {**COMPACTED_CUSTOM, "pulsar/compactedTopic": SPECIAL_TOPIC}
    bucket = {**BUCKET_CUSTOM, "pulsar/delayedIndexTopic": SPECIAL_TOPIC}
    with zk_clock.at(CREATED - DAY_MS):
        for ledger_id in (50, 51):
            put_ledger(cluster, ledger_id, {**ml_custom(), "pulsar/managed-ledger": SPECIAL_ML})
        put_ledger(cluster, 53, compacted)
        put_ledger(cluster, 54, compacted)
        put_ledger(cluster, 55, bucket)
        put_ledger(cluster, 56, bucket)
        ml = f"{ML_ROOT}/{SPECIAL_ML}"
        cluster.create(ml, ml_bytes([50]))
        cluster.create(f"{ml}/__compaction", cursor_bytes(-1, longs={"CompactedTopicLedger": 53}))
        cluster.create(f"{ml}/sub2", cursor_bytes(-1, strings={BUCKET_KEY: "55"}))
    results = deleter(cluster).process([
        record(50, topic=SPECIAL_TOPIC), record(53, "COMPACTED_LEDGER", topic=SPECIAL_TOPIC),
        record(55, "DELAYED_INDEX_BUCKET", topic=SPECIAL_TOPIC, bucket_key=BUCKET_KEY),
        record(51, topic=SPECIAL_TOPIC), record(54, "COMPACTED_LEDGER", topic=SPECIAL_TOPIC),
        record(56, "DELAYED_INDEX_BUCKET", topic=SPECIAL_TOPIC, bucket_key=BUCKET_KEY)])
    # Read at the wrong path, the live topic looked deleted: its compacted and bucket ledgers were deleted.
    assert outcomes(results) == [IN_USE] * 3 + [DELETED] * 3, [r.detail for r in results]
    assert all(cluster.exists(ledger_path(ROOT, i, LAYOUT)) is not None for i in (50, 53, 55))


def test_a_released_bookkeeper_copy_goes_only_once_its_offloaded_copy_is_seen(cluster: KazooClient) -> None:
    # Issue 26 (7): ledger 16 is listed offloaded, complete, bookkeeperDeleted; its BookKeeper copy is garbage only
    # if the offloaded objects really exist.
    unchecked = deleter(cluster, offload_check=None).process([record(16)])
    assert outcomes(unchecked) == [IN_USE] and "cannot check the offloaded copy" in unchecked[0].detail
    lost = deleter(cluster, offload_check=lambda *args: "s3://b/k: NoSuchKey").process([record(16)])
    assert outcomes(lost) == [IN_USE] and "NoSuchKey" in lost[0].detail
    assert cluster.exists(ledger_path(ROOT, 16, LAYOUT)) is not None
    asked: list[tuple[Any, ...]] = []
    done = deleter(cluster, offload_check=lambda *args: asked.append(args)).process([record(16)])
    assert outcomes(done) == [DELETED]
    uuid = codec.offload_uuid(UUID_MSB, UUID_LSB)
    assert asked and asked[0][3] == (f"{uuid}-ledger-16", f"{uuid}-ledger-16-index") and asked[0][4] == ML


def test_the_delete_refuses_a_replicated_subscriptions_cursor_ledger_and_a_protected_name(
        cluster: KazooClient) -> None:
    # Issue 26 (1, 4): the record's cursor, read right now, carries pulsar.replicated.subscription = 1.
    from sweeper.delete.results import REFUSED
    from sweeper.rules.classify import Sharing
    from sweeper.rules.owner import ActingRules

    rules = ActingRules(sharing=Sharing.DEDICATED)
    ml = f"{ML_ROOT}/{ML}"
    cluster.set(f"{ml}/sub1", cursor_bytes(12, longs={"pulsar.replicated.subscription": 1}))
    results = deleter(cluster, rules=rules).process([record(ORPHAN_CURSOR, "MANAGED_CURSOR", cursor="sub1")])
    assert outcomes(results) == [REFUSED] and "replicated_subscription" in results[0].detail
    put_ledger(cluster, 45, ml_custom("__pending_ack_state"), ctime=CREATED)
    cluster.create(f"{ml}/__pending_ack_state", cursor_bytes(-1))
    # (Its znode is new, so the grace period would keep it too: judged as if far later.)
    later = deleter(cluster, rules=rules, now_ms=int(time.time() * 1000) + 8 * DAY_MS)
    results = later.process([record(45, "MANAGED_CURSOR", cursor="__pending_ack_state")])
    assert outcomes(results) == [REFUSED] and "transaction_pending_ack_cursor" in results[0].detail
    assert cluster.exists(ledger_path(ROOT, ORPHAN_CURSOR, LAYOUT)) is not None
    assert cluster.exists(ledger_path(ROOT, 45, LAYOUT)) is not None
