"""Snapshot end to end: a seeded ZooKeeper, a real Spark session, real Delta tables."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxCluster, SandboxSpec, Status, build_cluster
from harness.sandbox.seed import ledger_metadata, seed_zookeeper
from harness.zkserver import free_port
from sweeper.codecs.bookkeeper import decode_ledger_metadata, encode_ledger_metadata
from sweeper.codecs.layout import LedgerLayout, ledger_path
from sweeper.config import BookKeeperConfig
from sweeper.pipeline import snapshot_stage
from sweeper.scan import as_rows
from sweeper.scan import bookkeeper as bk_scan
from sweeper.tables import DeltaRsTableStore, open_table_store
from sweeper.tables.files import TablesWriter, TablesWriting
from sweeper.zk.client import KazooReader
from sweeper.zk.errors import WrongRootError, ZooKeeperUnavailableError
from tests.support.config import ZkTarget
from tests.support.seeded import sandbox_config


def _rows(store: Any, table: str) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in store.read(table).collect()]


def _seeded(zk: KazooClient, layout: LedgerLayout, seed: int = 11, topics: int = 30) -> SandboxCluster:
    cluster = build_cluster(SandboxSpec(seed=seed, topics=topics, layout=layout))
    seed_zookeeper(zk, cluster)
    return cluster


def _expected_owner(custom: dict[str, bytes]) -> dict[str, str | None]:
    text = {k: v.decode() for k, v in custom.items() if k != "pulsar/compactedTo"}
    return {
        "component": text.get("component"),
        "managed_ledger": text.get("pulsar/managed-ledger"),
        "cursor": text.get("pulsar/cursor"),
        "schema_id": text.get("pulsar/schemaId"),
        "compacted_topic": text.get("pulsar/compactedTopic"),
        "bucket_key": text.get("pulsar/delayedIndexBucketKey"),
        "bucket_topic": text.get("pulsar/delayedIndexTopic"),
        "bucket_cursor": text.get("pulsar/delayedIndexCursor"),
    }


@pytest.mark.parametrize("layout", list(LedgerLayout))
def test_every_seeded_ledger_and_reference_lands_in_its_table(
    layout: LedgerLayout, zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path
) -> None:
    cluster = _seeded(zk, layout)
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    result = snapshot_stage(spark, sandbox_config(zk_target.hosts, tmp_path / "tables"), store)

    assert result.layout == layout.value
    assert result.counts.quarantine == 0, _rows(store, "quarantine")

    ledgers = {row["ledger_id"]: row for row in _rows(store, "bk_ledgers")}
    assert set(ledgers) == set(cluster.ledgers)
    if layout is not LedgerLayout.FLAT:
        assert any(ledger_id > 2**31 for ledger_id in ledgers), "the sandbox should exercise long ids"
    for ledger_id, model in cluster.ledgers.items():
        row = ledgers[ledger_id]
        assert row["run_id"] == result.run_id
        assert row["path"] == ledger_path("/ledgers", ledger_id, layout)
        assert row["is_pulsar"] == (model.custom.get("application") == b"pulsar")
        assert {k: row[k] for k in _expected_owner(model.custom)} == _expected_owner(model.custom)
        assert row["state"] == model.state and row["length"] == model.length
        assert row["format_version"] == model.format_version
        if model.ctime_ms is not None:
            assert (row["created_ms"], row["created_source"]) == (model.ctime_ms, "metadata")
        else:
            assert (row["created_ms"], row["created_source"]) == (row["zk_ctime_ms"], "znode")
        if "pulsar/compactedTo" in model.custom:
            assert row["custom_metadata_binary"]["pulsar/compactedTo"] == model.custom["pulsar/compactedTo"]

    mls = {row["managed_ledger"]: row for row in _rows(store, "managed_ledgers")}
    assert set(mls) == {ml.name for ml in cluster.managed_ledgers}
    for ml in cluster.managed_ledgers:
        assert mls[ml.name]["topic"] == ml.topic
        assert mls[ml.name]["compression"] == ml.compression
        assert mls[ml.name]["shadow_source"] == ml.properties.get("PULSAR.SHADOW_SOURCE")

    ml_ledgers = {(r["managed_ledger"], r["ledger_id"]): r for r in _rows(store, "ml_ledgers")}
    expected = {(ml.name, x.ledger_id): x for ml in cluster.managed_ledgers for x in ml.ledgers}
    assert set(ml_ledgers) == set(expected)
    for key, model_entry in expected.items():
        row = ml_ledgers[key]
        assert row["offloaded"] == (model_entry.offload is not None)
        if model_entry.offload is not None:
            assert row["offload_bookkeeper_deleted"] == model_entry.offload.bookkeeper_deleted
            assert row["offload_bucket"] == model_entry.offload.bucket
            assert row["offload_uuid"] is not None

    cursors = {(r["managed_ledger"], r["cursor"]): r["cursors_ledger_id"] for r in _rows(store, "ml_cursors")}
    assert cursors == {(ml.name, c.name): c.cursors_ledger_id for ml in cluster.managed_ledgers for c in ml.cursors}

    refs = {(r["managed_ledger"], r["kind"], r["ledger_id"]) for r in _rows(store, "cursor_ledger_refs")}
    expected_refs = set()
    for ml in cluster.managed_ledgers:
        for c in ml.cursors:
            expected_refs |= {(ml.name, "delayed_bucket", int(v)) for v in c.string_properties.values()}
            if c.name == "__compaction":
                # With a cursor ledger, ZooKeeper's pointer (if any) may lag it: a kind of its own.
                active = c.cursors_ledger_id != -1
                if "CompactedTopicLedger" in c.long_properties:
                    kind = "compacted_ledger_lagging" if active else "compacted_ledger"
                    expected_refs.add((ml.name, kind, c.long_properties["CompactedTopicLedger"]))
                else:
                    kind = "compacted_ledger_unreadable" if active else "compacted_ledger_unrecorded"
                    expected_refs.add((ml.name, kind, None))
    assert refs == expected_refs

    schema_refs = {(r["schema_id"], r["ledger_id"]) for r in _rows(store, "schema_ledgers")}
    assert schema_refs == {(s.schema_id, e.ledger_id) for s in cluster.schemas for e in s.entries}

    # One Delta commit per table for the run, and a runs row saying so.
    for table in ("bk_ledgers", "ml_ledgers", "ml_cursors", "schema_ledgers", "quarantine"):
        assert store.version(table) == 0
    runs = _rows(store, "runs")
    assert [(r["run_id"], r["stage"], r["status"]) for r in runs] == [(result.run_id, "snapshot", "succeeded")]
    assert runs[0]["counts"]["bk_ledgers"] == len(cluster.ledgers)


def test_the_model_covers_every_status(zk: KazooClient) -> None:
    covered = {ledger.status for seed in (11, 3) for ledger in build_cluster(SandboxSpec(seed=seed, topics=30))
               .ledgers.values()}  # seed 3: a protected leftover (a topic whose only cursor is `__compaction`)
    assert covered == set(Status)


def _put(zk: KazooClient, path: str, data: bytes) -> None:
    zk.ensure_path(path.rsplit("/", 1)[0])
    if zk.exists(path):
        zk.set(path, data)
    else:
        zk.create(path, data)


def test_bad_znodes_are_quarantined_and_the_rest_is_scanned(
    zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path
) -> None:
    cluster = _seeded(zk, LedgerLayout.HIERARCHICAL, seed=5, topics=12)
    base = max(i for i in cluster.ledgers if i < 2**31) + 100
    good = encode_ledger_metadata(ledger_metadata(next(iter(cluster.ledgers.values()))))
    non_utf8 = ledger_metadata(next(iter(cluster.ledgers.values())))
    non_utf8.custom_metadata["pulsar/managed-ledger"] = b"\xff\xfe\xfd"
    bad_ledgers = {
        base + 1: (b"\x00\x01garbage\xff", "bad_header"),
        base + 2: (b"BookieMetadataFormatVersion\t9\nwhatever", "unknown_format_version"),
        base + 3: (good[: len(good) - 7], "truncated"),
        base + 4: (encode_ledger_metadata(non_utf8), "invalid_utf8"),
    }
    for ledger_id, (data, _) in bad_ledgers.items():
        _put(zk, ledger_path("/ledgers", ledger_id, LedgerLayout.HIERARCHICAL), data)
    _put(zk, "/ledgers/00/0000/stray", b"not a ledger")  # met by a scan task
    _put(zk, "/ledgers/00/stray-dir", b"")  # met by the driver while planning
    ml = cluster.managed_ledgers[0]
    unknown_compression = b"\x47\x78" + (2).to_bytes(4, "big") + b"\x08\x07" + b"junk"
    _put(zk, f"/managed-ledgers/{ml.name}", unknown_compression)
    cursor_path = f"/managed-ledgers/{cluster.managed_ledgers[1].name}/broken-cursor"
    _put(zk, cursor_path, b"\x08")
    _put(zk, "/schemas/tenant-0/ns-0/broken", b"\xff\xff\xff")

    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    result = snapshot_stage(spark, sandbox_config(zk_target.hosts, tmp_path / "tables"), store)

    quarantine = {row["path"]: row for row in _rows(store, "quarantine")}
    for ledger_id, (data, kind) in bad_ledgers.items():
        row = quarantine[ledger_path("/ledgers", ledger_id, LedgerLayout.HIERARCHICAL)]
        assert (row["error_kind"], row["ledger_id"], row["raw"]) == (kind, ledger_id, data), row
        assert row["error"]
    assert quarantine["/ledgers/00/0000/stray"]["error_kind"] == "unexpected_znode"
    assert quarantine["/ledgers/00/stray-dir"]["source"] == "layout"
    assert quarantine[f"/managed-ledgers/{ml.name}"]["owner"] == ml.name
    assert quarantine[f"/managed-ledgers/{ml.name}"]["error_kind"] == "unknown_compression"
    assert quarantine[cursor_path]["source"] == "cursor"
    assert quarantine["/schemas/tenant-0/ns-0/broken"]["source"] == "schema"
    assert result.counts.quarantine == len(quarantine) == len(bad_ledgers) + 5

    # Everything else still arrived.
    scanned = {row["ledger_id"] for row in _rows(store, "bk_ledgers")}
    assert scanned == set(cluster.ledgers)
    assert result.counts.managed_ledgers == len(cluster.managed_ledgers) - 1


def test_znodes_vanishing_mid_scan_are_skipped_quietly(zk: KazooClient, zk_target: ZkTarget) -> None:
    cluster = _seeded(zk, LedgerLayout.HIERARCHICAL, seed=3, topics=8)
    plan = bk_scan.plan_ledger_units(zk, "/ledgers")
    gone = sorted(cluster.ledgers)[:5]
    for ledger_id in gone:  # deleted by Pulsar between listing and reading
        zk.delete(ledger_path("/ledgers", ledger_id, LedgerLayout.HIERARCHICAL))
    rows = list(as_rows(bk_scan.scan_ledger_units(KazooReader(zk), "/ledgers", plan.units)))
    assert [r for r in rows if r["record_type"] == "quarantine"] == []
    assert {r["ledger_id"] for r in rows} == set(cluster.ledgers) - set(gone)
    decoded = decode_ledger_metadata(zk.get(ledger_path("/ledgers", sorted(cluster.ledgers)[6],
                                                        LedgerLayout.HIERARCHICAL))[0])
    assert decoded.format_version in (2, 3)


def test_wrong_root_fails_the_run_naming_the_path(
    zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path
) -> None:
    _seeded(zk, LedgerLayout.HIERARCHICAL, seed=2, topics=3)
    cfg = sandbox_config(zk_target.hosts, tmp_path / "tables", bookkeeper={"ledgers_root": "/bookkeeper/ledgers"})
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    with pytest.raises(WrongRootError, match="/bookkeeper/ledgers"):
        snapshot_stage(spark, cfg, store)
    runs = _rows(store, "runs")
    # Refused, as the CLI's exit code 3 says (issue 23's rule: the `runs` status and the exit code agree).
    assert [r["status"] for r in runs] == ["refused"] and "/bookkeeper/ledgers" in runs[0]["message"]
    assert not store.exists("bk_ledgers")


class _CachedLosingStore(DeltaRsTableStore):
    """The path of an engine that writes through Spark only (delta-spark's): the scan cached, then appended with
    append_arrow_frames, which here drops a table's rows."""

    def task_writer(self, schemas: Any) -> None:
        return None

    def append_arrow_frames(self, source: Any, route: str, *args: Any, **kwargs: Any) -> Any:
        from pyspark.sql import functions as F

        return super().append_arrow_frames(source.where(F.col(route) != "ml_cursors"), route, *args, **kwargs)


class _CommitLosingStore(DeltaRsTableStore):
    """The tasks write every file, and the commit leaves one table's out."""

    def commit_written(self, writer: Any, records: Any, **kwargs: Any) -> Any:
        return super().commit_written(writer, {t: r for t, r in records.items() if t != "ml_cursors"}, **kwargs)


class _LosingWriting(TablesWriting):
    def write(self, table: str, batch: Any) -> None:
        super().write(table, batch.slice(1) if table == "ml_cursors" else batch)  # one row short a batch


@dataclasses.dataclass(frozen=True)
class _LosingWriter(TablesWriter):
    def open(self, task: int | None = None) -> TablesWriting:
        return _LosingWriting(self.specs, task or 0)


class _TaskLosingStore(DeltaRsTableStore):
    """The scan tasks' writer loses rows as it writes them (in the tasks themselves, not on the driver)."""

    def task_writer(self, schemas: Any) -> TablesWriter:
        writer = super().task_writer(schemas)
        return _LosingWriter(writer.specs, writer.tables)


@pytest.mark.parametrize("losing", [_CachedLosingStore, _CommitLosingStore, _TaskLosingStore],
                         ids=["cached-append", "commit", "task-writer"])
def test_a_table_committed_short_of_the_scan_fails_the_run(
    losing: type[DeltaRsTableStore], zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path
) -> None:
    """Rows lost between the scan and their table would make referenced ledgers look unreferenced: the run fails
    naming the table, and reconcile never sees it. Lost on each path: an engine that appends the cached scan
    (delta-spark's way), the commit of the files the tasks wrote, and the tasks' own writer (whose file records
    then agree with the files: only the scan's count, made apart from the writing, shows the loss)."""
    from sweeper.reconcile.errors import ReconcileRefused
    from sweeper.reconcile.stage import SafetySettings, run_reconcile
    from sweeper.rules.safety import CircuitBreaker
    from sweeper.snapshot import SnapshotIncomplete

    _seeded(zk, LedgerLayout.HIERARCHICAL, seed=2, topics=5)
    store = losing(str(tmp_path / "tables"), spark)
    with pytest.raises(SnapshotIncomplete, match="ml_cursors"):
        snapshot_stage(spark, sandbox_config(zk_target.hosts, tmp_path / "tables"), store)
    [run] = _rows(store, "runs")
    assert run["status"] == "failed" and "ml_cursors" in run["message"]
    with pytest.raises(ReconcileRefused):
        run_reconcile(spark, store, run["run_id"], SafetySettings(breaker=CircuitBreaker(1.0),
                   bookkeeper_dedicated=True))


def test_a_root_without_layout_is_refused(zk: KazooClient, zk_target: ZkTarget, spark: SparkSession,
                                          tmp_path: Path) -> None:
    zk.ensure_path("/ledgers/00/0000")
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    with pytest.raises(Exception, match=r"LAYOUT.*metadata-store:"):
        snapshot_stage(spark, sandbox_config(zk_target.hosts, tmp_path / "tables"), store)


def test_without_layout_under_pulsars_metadata_store_driver_the_zookeeper_root_is_hierarchical(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    """Bookies on Pulsar's `metadata-store:zk:` driver write no LAYOUT on ZooKeeper either (its
    `PulsarLedgerManagerFactory` stores none; the ledgers lie at the hybrid hierarchical paths): with that URI
    copied from bookkeeper.conf the snapshot reads the root as hierarchical and finds every ledger."""
    cluster = _seeded(zk, LedgerLayout.HIERARCHICAL, seed=4, topics=6)
    zk.delete("/ledgers/LAYOUT")
    driver = {"metadata_service_uri": f"metadata-store:zk:{zk_target.hosts}"}
    cfg = sandbox_config(zk_target.hosts, tmp_path / "tables", bookkeeper=driver)
    assert not cfg.bookkeeper.writes_layout_record
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    result = snapshot_stage(spark, cfg, store)
    assert result.layout == "hierarchical" and result.counts.bk_ledgers == len(cluster.ledgers)
    # BookKeeper's own spellings: the same root refused (test_a_root_without_layout_is_refused).
    assert sandbox_config(zk_target.hosts, tmp_path / "t").bookkeeper.writes_layout_record
    assert BookKeeperConfig(metadata_service_uri="zk+hierarchical://zk1:2181;zk2:2181/ledgers").writes_layout_record


def test_unreachable_zookeeper_is_a_clear_error(spark: SparkSession, tmp_path: Path) -> None:
    hosts = f"127.0.0.1:{free_port()}"
    cfg = sandbox_config(hosts, tmp_path / "tables", bookkeeper={"session_timeout_s": 2.0})
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    with pytest.raises(ZooKeeperUnavailableError, match=hosts):
        snapshot_stage(spark, cfg, store)


# ---- issue 11: what a scan must not drop or misread --------------------------------------------------------


class _ListingFails(KazooReader):
    """A real ZooKeeper reader whose directory listings of one znode fail (e.g. a connection lost mid-read)."""

    def __init__(self, client: KazooClient, failing: str) -> None:
        super().__init__(client)
        self.failing = failing

    def children_many(self, paths: Any, window: int = 1000) -> Any:
        from sweeper.records import ChildrenRead

        for read in super().children_many(paths, window):
            yield ChildrenRead(read.path, None, ConnectionError("lost")) if read.path == self.failing else read


def test_a_managed_ledger_whose_cursors_cannot_be_listed_is_quarantined(zk: KazooClient) -> None:
    from sweeper.scan import pulsar as pulsar_scan

    cluster = _seeded(zk, LedgerLayout.HIERARCHICAL, seed=5, topics=12)
    ml = next(m for m in cluster.managed_ledgers if m.cursors)
    names = pulsar_scan.plan_managed_ledgers(zk, "/managed-ledgers")
    rows = list(as_rows(pulsar_scan.scan_managed_ledgers(_ListingFails(zk, f"/managed-ledgers/{ml.name}"),
                                                         "/managed-ledgers", names)))
    quarantined = [r for r in rows if r["record_type"] == "quarantine"]
    # Before: the error was dropped and the managed ledger read as one without cursors.
    assert [(q["owner"], q["error_kind"]) for q in quarantined] == [(ml.name, "cursor_listing_error")]
    assert not [r for r in rows if r["record_type"] == "ml_cursors" and r["managed_ledger"] == ml.name]
    # Its ledger list was read: those references still hold.
    assert {r["ledger_id"] for r in rows if r["record_type"] == "ml_ledgers" and r["managed_ledger"] == ml.name} == {
        x.ledger_id for x in ml.ledgers}


def test_an_empty_managed_ledger_znode_is_quarantined_not_read_as_listing_nothing(zk: KazooClient) -> None:
    from sweeper.scan import pulsar as pulsar_scan

    cluster = _seeded(zk, LedgerLayout.HIERARCHICAL, seed=5, topics=12)
    ml = cluster.managed_ledgers[2]
    zk.set(f"/managed-ledgers/{ml.name}", b"")  # as Pulsar leaves it between creating the znode and the list
    names = pulsar_scan.plan_managed_ledgers(zk, "/managed-ledgers")
    rows = list(as_rows(pulsar_scan.scan_managed_ledgers(KazooReader(zk), "/managed-ledgers", names)))
    assert [(r["owner"], r["error_kind"]) for r in rows if r["record_type"] == "quarantine"] == [
        (ml.name, "empty_managed_ledger")]
    assert ml.name not in {r["managed_ledger"] for r in rows if r["record_type"] == "managed_ledgers"}


def test_the_schema_locators_latest_entry_is_a_reference_even_when_its_index_lacks_it(zk: KazooClient) -> None:
    from sweeper.codecs import pulsar as codec
    from sweeper.scan import pulsar as pulsar_scan

    locator = codec.pb.SchemaLocator()
    locator.index.add(version=0, position=codec.pb.PositionInfo(ledgerId=70, entryId=0), hash=b"h")
    locator.info.version, locator.info.hash = 1, b"h"
    locator.info.position.ledgerId, locator.info.position.entryId = 71, 0  # written, the index not yet updated
    zk.create("/schemas/t/ns/topic", codec.encode_schema_locator(locator), makepath=True)
    rows = list(pulsar_scan.scan_schemas(KazooReader(zk), "/schemas", ["t/ns/topic"]))
    assert {(r["version"], r["ledger_id"], r["is_latest"]) for r in rows} == {(0, 70, False), (1, 71, True)}


def test_snapshot_records_namespaces_brokers_and_the_clock(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path) -> None:
    cluster = _seeded(zk, LedgerLayout.HIERARCHICAL, seed=5, topics=12)
    zk.create("/admin/policies/tenant-9/ns-empty", b'{"deleted": false}', makepath=True)  # no topics yet
    zk.create("/loadbalance/brokers/10.0.0.1:8080", b"{}", ephemeral=True, makepath=True)
    zk.create("/loadbalance/brokers/10.0.0.2:8080", b"{}", makepath=True)  # left over: no live session
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    result = snapshot_stage(spark, sandbox_config(zk_target.hosts, tmp_path / "tables"), store)
    namespaces = {r["namespace"]: set(r["sources"]) for r in _rows(store, "namespaces")}
    assert set(namespaces) == set(cluster.namespaces) | {"tenant-9/ns-empty"}
    assert namespaces["tenant-9/ns-empty"] == {"policies"}
    assert result.counts.live_brokers == 1
    assert abs(result.counts.clock_skew_ms) < 5_000


def test_a_host_clock_far_from_zookeepers_refuses_the_snapshot(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, zk_clock: Any) -> None:
    from sweeper.snapshot import ClockSkewRefused

    _seeded(zk, LedgerLayout.HIERARCHICAL, seed=5, topics=4)
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    with zk_clock.back_in_time(1.0), pytest.raises(ClockSkewRefused, match="ahead of ZooKeeper"):
        # ZooKeeper a day behind this host: ledgers would look a day older than they are.
        snapshot_stage(spark, sandbox_config(zk_target.hosts, tmp_path / "tables"), store)
    assert [r["status"] for r in _rows(store, "runs")] == ["refused"]


def test_the_plan_holds_directories_and_the_tasks_list_their_shards(zk: KazooClient) -> None:
    # Issue 13: the driver's plan must not grow with the number of topics. It holds each namespace's
    # directory and size; the tasks list their shard of it, and the shards cover every topic exactly once.
    from sweeper.scan import pulsar as pulsar_scan

    _seeded(zk, LedgerLayout.HIERARCHICAL, seed=5, topics=40)
    every = pulsar_scan.plan_managed_ledgers(zk, "/managed-ledgers")
    domains = pulsar_scan.plan_managed_ledger_domains(zk, "/managed-ledgers")
    assert sum(size for _, size in domains) == len(every)
    planned = pulsar_scan.shards(domains, chunk=3)
    assert len(planned) > len(domains)  # a namespace larger than a chunk spreads over several tasks
    listed = [name for parent, k, n in planned
              for name in pulsar_scan.list_shard(KazooReader(zk), "/managed-ledgers", parent, k, n)]
    assert sorted(listed) == every  # every topic once, none twice
    assert pulsar_scan.list_shard(KazooReader(zk), "/managed-ledgers", "gone/ns/persistent", 0, 1) == []
