"""Issue 35 on a real Pulsar: what the bookie gives back after the sweeper deletes orphans, measured on its disk.

The testbed's bookie runs its HTTP server and Prometheus metrics (harness.testbed.server.bookie_settings, with what
the real bookie showed in harness.testbed.bookie), rotates its entry logs every 4 MiB and collects garbage only when
told. harness.testbed.bulk lays megabytes of orphans out in its logs, fenced from live data by pads, and the test
measures the entry-log files on disk itself (`entry_log_bytes`), never through the product:

- freed: 24 MiB of orphans in logs of their own; the sweep with `--execute` and `[reclaim] trigger_gc = true` deletes
  them and has the bookie collect: the disk shrinks by most of them, the `reclaim` row says the same within 10 %,
  `freed`, and names the path that found the bookie's HTTP server (its registration says 0.0.0.0 here);
- interleaved: orphans sharing every log with live data (a third live): a minor compaction leaves them, the row says
  `pending_compaction`; `sweeper reclaim --run-id RUN --execute` with `compaction = "major"` frees them, and every
  live message reads back byte for byte;
- down: a bookie whose HTTP server does not answer is `not_measured` with why, and the sweep and `sweeper reclaim`
  exit 0.

Each case writes everything (orphans, pads, live topics) in a namespace of its own in the tenant `reclaim`, and its
sweep is scoped to it (`[safety] allow`) and emits to a deletion topic of its own: no other test's orphans or marks are
touched, and what Pulsar leaks there by itself (schema ledgers) goes with the case's orphans. They are made after the
session's own sweep (`swept`), whose plan must not see them.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from harness.testbed import bookie, bulk
from harness.testbed.bulk import DOWN, FREED, INTERLEAVED, ReclaimLayout
from harness.testbed.server import TestbedInfo
from harness.testbed.workload import admin_for, client_for, read_all
from harness.testbed.world import World, metadata_for
from sweeper.cli import main
from sweeper.config import SweeperConfig, to_toml
from sweeper.pipeline import sweep
from sweeper.tables import TableStore, open_table_store
from tests.support.real_pulsar import COST, GRACE_S, Swept, sweeper_config

pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(1200)]

# How the sweeper finds the testbed bookie's HTTP server: on ZooKeeper it registers as 0.0.0.0 (httpServerHost
# unset), on Oxia as 127.0.0.1 (harness.testbed.bookie).
FOUND_BY = {False: "registration, 0.0.0.0 -> bookie host", True: "registration"}


def build_layout(info: TestbedInfo, cases: tuple[str, ...]) -> ReclaimLayout:
    """The cases' data, orphans made, and their grace period waited out."""
    started = time.monotonic()
    client = client_for(info)
    metadata = metadata_for(info)
    try:
        layout = bulk.build_reclaim_layout(info, admin_for(info), metadata, client, cases=cases)
    finally:
        metadata.stop()
        client.close()
    time.sleep(max(0.0, layout.made_at + GRACE_S + 2 - time.time()))
    COST[f"{'oxia_' if info.on_oxia else ''}reclaim_layout_s"] = time.monotonic() - started
    return layout


def case_config(info: TestbedInfo, tables: Path, layout: ReclaimLayout, case: str,
                **reclaim: Any) -> SweeperConfig:
    """The sweeper on this case's namespace only, with its own deletion topic."""
    cfg = sweeper_config(info, tables, reclaim=reclaim)
    return cfg.replace(safety={"allow": layout.namespace(case)},
                       system_topic={"topic": f"persistent://{layout.tenant}/{case}/ledger-deletion"})


@dataclass
class Measured:
    """One case's sweep: the disk before and after, the run, its `reclaim` rows and what it deleted."""

    case: str
    orphan_bytes: int  # the orphan ledgers' lengths (BookKeeper's metadata)
    disk_before: int
    disk_after: int = 0
    run_id: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)
    deleted: set[int] = field(default_factory=set)
    seconds: float = 0.0
    config: SweeperConfig | None = None
    store: TableStore | None = None

    @property
    def shrink(self) -> int:
        return self.disk_before - self.disk_after

    def row(self, target: str) -> dict[str, Any]:
        rows = [r for r in self.rows if r["target_kind"] == "bookie" and r["target"] == target]
        assert rows, self.rows
        return max(rows, key=lambda r: r["measured_at"])  # the latest measurement of the run


def reclaim_rows(store: TableStore, run_id: str) -> list[dict[str, Any]]:
    return store.read_arrow("reclaim", where={"run_id": run_id}).to_pylist()


def deleted_ledgers(store: TableStore, run_id: str) -> set[int]:
    rows = store.read_arrow("delete_results", where={"run_id": run_id, "outcome": "deleted"},
                            columns=["ledger_id"]).to_pylist()
    return {r["ledger_id"] for r in rows}


def settle(info: TestbedInfo) -> None:
    """A GC with minor compaction before the baseline: space earlier tests' deletes left (the session's sweep) is
    reclaimed now, not counted with this case's."""
    bookie.trigger_gc(info, force_minor=True)


def delete_pads(info: TestbedInfo, layout: ReclaimLayout, case: str) -> None:
    admin = admin_for(info)
    for name in layout.pads.get(case, []):
        admin.delete_topic(name)  # a proper delete: the broker deletes the pad's ledgers itself
    time.sleep(1.0)


def sweep_case(spark: SparkSession, info: TestbedInfo, tables: Path, layout: ReclaimLayout, case: str,
               **reclaim: Any) -> Measured:
    """Settle, measure the disk, sweep the case with `--execute`, measure again."""
    cfg = case_config(info, tables, layout, case, **reclaim)
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    settle(info)
    measured = Measured(case, layout.orphans[case].ledger_bytes, bookie.entry_log_bytes(info), config=cfg,
                        store=store)
    started = time.monotonic()
    result = sweep(spark, cfg, store, until="delete", execute=True)
    measured.seconds = time.monotonic() - started
    measured.disk_after = bookie.entry_log_bytes(info)
    measured.run_id = result.run_id
    measured.rows = reclaim_rows(store, result.run_id)
    measured.deleted = deleted_ledgers(store, result.run_id)
    return measured


def report(measured: Measured, row: dict[str, Any]) -> None:
    print(f"[{measured.case}] orphans {measured.orphan_bytes:,} B; disk {measured.disk_before:,} -> "
          f"{measured.disk_after:,} B (shrink {measured.shrink:,}); row: verdict {row['verdict']}, expected "
          f"{row['expected_bytes']:,}, freed {row['freed_bytes']} (deletion {row['freed_deletion_bytes']}, "
          f"compaction {row['freed_compaction_bytes']}), pending {row['pending_bytes']}, found_by {row['found_by']!r}, "
          f"url {row['url']}, action {row['action']!r}, why {row['why']!r}; sweep {measured.seconds:.1f}s")


def assert_freed(measured: Measured, layout: ReclaimLayout, info: TestbedInfo) -> dict[str, Any]:
    """The orphans were deleted, the disk shrank by most of them, and the row agrees with the disk."""
    orphans = layout.orphans[measured.case]
    assert set(orphans.ledgers) <= measured.deleted, sorted(set(orphans.ledgers) - measured.deleted)
    assert measured.orphan_bytes >= 0.95 * orphans.produced_bytes
    row = measured.row(bookie.bookie_id(info))
    report(measured, row)
    assert row["found_by"] == FOUND_BY[info.on_oxia], row
    assert row["url"].rstrip("/") == bookie.bookie_http_url(info), row
    assert abs(row["expected_bytes"] - measured.orphan_bytes) <= 0.02 * measured.orphan_bytes, row
    assert measured.shrink >= 0.6 * measured.orphan_bytes, (measured.shrink, measured.orphan_bytes)
    assert abs(row["freed_bytes"] - measured.shrink) <= 0.1 * measured.shrink, (row, measured.shrink)
    assert row["verdict"] == "freed", row
    return row


@pytest.fixture(scope="module")
def layout(testbed_world: World, swept: Swept) -> ReclaimLayout:
    """Made after the session's sweep: its plan (and its leak count) must not see these orphans."""
    return build_layout(testbed_world.info, (DOWN, INTERLEAVED, FREED))


@pytest.fixture(scope="module")
def freed(testbed_world: World, layout: ReclaimLayout, spark: SparkSession,
          tmp_path_factory: pytest.TempPathFactory) -> Measured:
    """Case `freed`, swept (also first for the interleaved case: its major compaction would otherwise rewrite the
    freed burst's edge logs, with live data, into a log of their own)."""
    info = testbed_world.info
    delete_pads(info, layout, FREED)
    measured = sweep_case(spark, info, tmp_path_factory.mktemp("reclaim-freed"), layout, FREED, trigger_gc=True)
    COST["reclaim_freed_sweep_s"] = measured.seconds
    return measured


def test_orphans_in_logs_of_their_own_are_freed_and_the_row_agrees_with_the_disk(
        freed: Measured, layout: ReclaimLayout, testbed_world: World) -> None:
    row = assert_freed(freed, layout, testbed_world.info)
    assert row["action"] == "gc (deletion + minor compaction)", row


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    directory = tmp_path_factory.mktemp("reclaim-config")

    def write(cfg: SweeperConfig, name: str) -> str:
        path = directory / f"{name}.toml"
        path.write_text(to_toml(cfg))
        return str(path)

    yield write


def test_interleaved_orphans_wait_for_compaction_and_a_major_one_frees_them(
        freed: Measured, layout: ReclaimLayout, testbed_world: World, spark: SparkSession,
        tmp_path_factory: pytest.TempPathFactory, config_file: Any) -> None:
    info = testbed_world.info
    tables = tmp_path_factory.mktemp("reclaim-interleaved")
    # Minor compaction (the default) leaves logs a third live: the row says what waits for a compaction.
    measured = sweep_case(spark, info, tables, layout, INTERLEAVED, trigger_gc=True)
    COST["reclaim_interleaved_sweep_s"] = measured.seconds
    orphans = layout.orphans[INTERLEAVED]
    assert set(orphans.ledgers) <= measured.deleted
    first = measured.row(bookie.bookie_id(info))
    report(measured, first)
    assert first["action"] == "gc (deletion + minor compaction)", first
    assert first["verdict"] == "pending_compaction", first
    assert abs(first["pending_bytes"] - measured.orphan_bytes) <= 0.25 * measured.orphan_bytes, first
    assert measured.shrink <= 0.25 * measured.orphan_bytes, measured.shrink

    # Then a major compaction through the CLI: the pads go first (a proper delete), so every log the orphans share
    # is under major compaction's threshold.
    delete_pads(info, layout, INTERLEAVED)
    assert measured.config is not None and measured.store is not None
    major = measured.config.replace(reclaim={"compaction": "major"})
    started = time.monotonic()
    code = main(["reclaim", "--run-id", measured.run_id, "--execute", "--config", config_file(major, "major")])
    COST["reclaim_cli_major_s"] = time.monotonic() - started
    assert code == 0
    measured.disk_after = bookie.entry_log_bytes(info)
    measured.rows = reclaim_rows(measured.store, measured.run_id)
    second = measured.row(bookie.bookie_id(info))
    report(measured, second)
    assert second["action"] == "gc (deletion + major compaction)", second
    assert second["verdict"] == "freed", second
    assert measured.shrink >= 0.6 * measured.orphan_bytes, (measured.shrink, measured.orphan_bytes)
    assert abs(second["freed_bytes"] - measured.shrink) <= 0.1 * measured.shrink, (second, measured.shrink)

    client = client_for(info)
    try:
        held = [data for _, data in read_all(client, layout.live_topic)]
    finally:
        client.close()
    assert len(held) == layout.live_count
    assert held == layout.live_payloads()  # byte for byte, after the compaction rewrote them


def test_a_bookie_that_does_not_answer_is_not_measured_and_the_run_exits_0(
        layout: ReclaimLayout, testbed_world: World, spark: SparkSession,
        tmp_path_factory: pytest.TempPathFactory, config_file: Any) -> None:
    """Its HTTP server off or the bookie down look the same from here: nothing answers on the port."""
    info = testbed_world.info
    with socket.socket() as held:  # bound and never listening: refused, and no other process can take it meanwhile
        held.bind(("127.0.0.1", 0))
        _down_case(info, layout, spark, tmp_path_factory, config_file, held.getsockname()[1])


def _down_case(info: TestbedInfo, layout: ReclaimLayout, spark: SparkSession,
               tmp_path_factory: pytest.TempPathFactory, config_file: Any, closed: int) -> None:
    cfg = case_config(info, tmp_path_factory.mktemp("reclaim-down"), layout, DOWN, trigger_gc=True,
                      http_urls=[f"{bookie.bookie_id(info)}=http://127.0.0.1:{closed}"], timeout_s=2.0)
    path = config_file(cfg, "down")
    run_id = f"reclaim-down-{int(time.time())}"
    started = time.monotonic()
    assert main(["sweep", "--execute", "--config", path, "--run-id", run_id]) == 0
    assert main(["reclaim", "--run-id", run_id, "--execute", "--config", path]) == 0
    COST["reclaim_down_s"] = time.monotonic() - started
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    assert set(layout.orphans[DOWN].ledgers) <= deleted_ledgers(store, run_id)
    rows = [r for r in reclaim_rows(store, run_id) if r["target_kind"] == "bookie"]
    assert rows and {r["target"] for r in rows} == {bookie.bookie_id(info)}, rows
    for row in rows:  # the sweep's and the CLI's
        print(f"[down] verdict {row['verdict']}, found_by {row['found_by']!r}, url {row['url']}, why {row['why']!r}")
        assert row["verdict"] == "not_measured", row
        assert row["why"], row
        assert row["found_by"] == "config" and row["url"].rstrip("/") == f"http://127.0.0.1:{closed}", row
