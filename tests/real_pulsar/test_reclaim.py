"""Issue 35 on a real Pulsar: what each bookie gives back after the sweeper deletes orphans, measured on its disk.

The testbed runs three bookies and the broker stripes every ledger over them (ensemble 3, write quorum 2): each
bookie stores about two thirds of an orphan's bytes, and `harness.testbed.bookie.striped_bytes` says exactly how much
from the ledgers' metadata. Each bookie runs its HTTP server and Prometheus metrics (harness.testbed.storage, with
what the real bookies showed in harness.testbed.bookie), rotates its entry logs every 4 MiB and collects garbage
only when told. harness.testbed.bulk lays megabytes of orphans out in their logs, fenced from live data by pads on
every bookie, and the test measures each bookie's entry-log files on disk itself (`entry_log_bytes_by_bookie`),
never through the product. Every case holds on every bookie, each judged by its own `reclaim` row:

- freed: 24 MiB of orphans in logs of their own; the sweep with `--execute` and `[reclaim] trigger_gc = true` deletes
  them and has every bookie collect: each bookie's disk shrinks by most of its share, its `reclaim` row expects
  that share and says what its disk says within 10 %, `freed`, and names the path that found the bookie's HTTP
  server (the registrations say 0.0.0.0 on ZooKeeper);
- interleaved: orphans sharing every log with live data (a third live): a minor compaction leaves them, every row
  says `pending_compaction`; `sweeper reclaim --run-id RUN --execute` with `compaction = "major"` frees them, and
  every live message reads back byte for byte;
- down: a bookie whose HTTP server does not answer is `not_measured` with why, the other bookies are measured as
  ever, and the sweep and `sweeper reclaim` exit 0.

Each case writes everything (orphans, pads, live topics) in a namespace of its own in the tenant `reclaim`, and its
sweep is scoped to it (`[safety] allow`) and emits to a deletion topic of its own: no other test's orphans or marks are
touched, and what Pulsar leaks there by itself (schema ledgers) goes with the case's orphans. They are made after the
session's own sweep (`swept`), whose plan must not see them.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from harness.testbed import bookie, bulk
from harness.testbed.bulk import DOWN, FREED, INTERLEAVED, Orphans, ReclaimLayout
from harness.testbed.orphans import ledger_znode
from harness.testbed.server import TestbedInfo
from harness.testbed.storage import WRITE_QUORUM
from harness.testbed.workload import admin_for, client_for, read_all
from harness.testbed.world import World, metadata_for
from sweeper.cli import main
from sweeper.codecs.bookkeeper import LedgerMetadata
from sweeper.config import SweeperConfig, to_toml
from sweeper.pipeline import sweep
from sweeper.tables import TableStore, open_table_store
from tests.support.real_pulsar import COST, GRACE_S, Swept, sweeper_config

pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(1200)]

# How the sweeper finds the testbed bookies' HTTP servers: on ZooKeeper they register as 0.0.0.0 (httpServerHost
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
    """One case's sweep: each bookie's disk before and after, the run, its `reclaim` rows and what it deleted."""

    case: str
    orphan_bytes: int  # the orphan ledgers' lengths (BookKeeper's metadata), once each
    disk_before: dict[str, int]  # bookie id -> its entry-log bytes
    disk_after: dict[str, int] = field(default_factory=dict)
    run_id: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)
    deleted: set[int] = field(default_factory=set)
    seconds: float = 0.0
    config: SweeperConfig | None = None
    store: TableStore | None = None
    # The case namespace's ledgers before the sweep (bulk.ledgers_of_namespace): where the bytes of whatever it
    # deleted were, Pulsar's own leaks there included.
    described: dict[int, LedgerMetadata] = field(default_factory=dict)

    def never_held(self, bookie_id: str) -> list[int]:
        """Ledgers the run deleted that have data and name `bookie_id` in their ensemble, though it never stored an
        entry of them (too few entries to reach every member: harness.testbed.bookie.ledger_holders)."""
        return sorted(ledger for ledger in self.deleted if ledger in self.described
                      and self.described[ledger].length > 0
                      and any(bookie_id in segment.ensemble for segment in self.described[ledger].segments)
                      and bookie_id not in bookie.ledger_holders(self.described[ledger]))

    def shrink(self, bookie_id: str) -> int:
        """What bookie `bookie_id`'s entry logs lost on disk between the two measurements."""
        return self.disk_before[bookie_id] - self.disk_after[bookie_id]

    def row(self, target: str) -> dict[str, Any]:
        rows = [r for r in self.rows if r["target_kind"] == "bookie" and r["target"] == target]
        assert rows, self.rows
        return max(rows, key=lambda r: r["measured_at"])  # the latest measurement of the run

    def measure_after(self, info: TestbedInfo) -> None:
        self.disk_after = bookie.entry_log_bytes_by_bookie(info)


def reclaim_rows(store: TableStore, run_id: str) -> list[dict[str, Any]]:
    return store.read_arrow("reclaim", where={"run_id": run_id}).to_pylist()


def deleted_ledgers(store: TableStore, run_id: str) -> set[int]:
    rows = store.read_arrow("delete_results", where={"run_id": run_id, "outcome": "deleted"},
                            columns=["ledger_id"]).to_pylist()
    return {r["ledger_id"] for r in rows}


def settle(info: TestbedInfo, rounds: int = 6) -> None:
    """GCs with minor compaction on every bookie before the baseline, until a round collects nothing more: whatever
    earlier tests or the broker deleted (ledgers a topic delete removes one by one after it answered) is collected
    now, not counted in this case's window, where each bookie would rightly call it others' (issue 44)."""
    def collected() -> dict[str, float]:
        return {b: m.get("bookie_DELETED_LEDGER_TOTAL", 0.0) for b, m in bookie.metrics_by_bookie(info).items()}

    seen = collected()
    for _ in range(rounds):
        bookie.trigger_gc_all(info, force_minor=True)
        now = collected()
        if now == seen:
            return
        seen = now
        time.sleep(2.0)


def delete_pads(info: TestbedInfo, layout: ReclaimLayout, case: str) -> None:
    """A proper delete of the case's pads: the broker deletes their ledgers itself, after it answers; waited for until
    their metadata is gone, so that their collection is not in the case's window."""
    admin = admin_for(info)
    metadata = metadata_for(info)
    try:
        pads = {f"{layout.namespace(case)}/persistent/{name.rsplit('/', 1)[1]}".encode()
                for name in layout.pads.get(case, [])}
        ledgers = [ledger for ledger, m in bulk.ledgers_of_namespace(metadata, layout.namespace(case)).items()
                   if m.custom_metadata.get("pulsar/managed-ledger") in pads]
        for name in layout.pads.get(case, []):
            admin.delete_topic(name)
        deadline = time.monotonic() + 60
        while any(metadata.exists(ledger_znode(ledger)) for ledger in ledgers) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        metadata.stop()


def sweep_case(spark: SparkSession, info: TestbedInfo, tables: Path, layout: ReclaimLayout, case: str,
               **reclaim: Any) -> Measured:
    """Settle, measure every bookie's disk, sweep the case with `--execute`, measure again."""
    cfg = case_config(info, tables, layout, case, **reclaim)
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    metadata = metadata_for(info)
    try:
        described = bulk.ledgers_of_namespace(metadata, layout.namespace(case))
    finally:
        metadata.stop()
    settle(info)
    measured = Measured(case, layout.orphans[case].ledger_bytes, bookie.entry_log_bytes_by_bookie(info), config=cfg,
                        store=store, described=described)
    metadata = metadata_for(info)
    try:
        before = bulk.all_ledgers(metadata)
        started = time.monotonic()
        result = sweep(spark, cfg, store, until="delete", execute=True)
        measured.seconds = time.monotonic() - started
        after = bulk.all_ledgers(metadata)
    finally:
        metadata.stop()
    # What the broker deleted by itself during the window (not the run's): each bookie counts those too.
    ours = deleted_ledgers(store, result.run_id)
    theirs = {ledger: m for ledger, m in before.items() if ledger not in after and ledger not in ours}
    print(f"[{case}] Pulsar deleted {len(theirs)} ledger(s) of its own during the sweep: "
          + ", ".join(f"{ledger} ({(m.custom_metadata.get('pulsar/managed-ledger') or b'?').decode()}"
                      f" {(m.custom_metadata.get('pulsar/cursor') or b'').decode()} {m.length} B)"
                      for ledger, m in sorted(theirs.items())))
    measured.measure_after(info)
    measured.run_id = result.run_id
    measured.rows = reclaim_rows(store, result.run_id)
    measured.deleted = deleted_ledgers(store, result.run_id)
    return measured


def report(measured: Measured, bookie_id: str, share: int, row: dict[str, Any]) -> None:
    print(f"[{measured.case}] {bookie_id}: its share of the orphans {share:,} B (of {measured.orphan_bytes:,}); disk "
          f"{measured.disk_before[bookie_id]:,} -> {measured.disk_after[bookie_id]:,} B (shrink "
          f"{measured.shrink(bookie_id):,}); row: verdict {row['verdict']}, expected {row['expected_bytes']:,}, freed "
          f"{row['freed_bytes']} (deletion {row['freed_deletion_bytes']}, compaction {row['freed_compaction_bytes']}), "
          f"pending {row['pending_bytes']}, found_by {row['found_by']!r}, url {row['url']}, action {row['action']!r}, "
          f"why {row['why']!r}; sweep {measured.seconds:.1f}s")


def assert_striped(orphans: Orphans, info: TestbedInfo) -> None:
    """The orphans are on every bookie, each entry on two of them (ensemble 3, write quorum 2)."""
    assert set(orphans.striped) == set(bookie.bookie_ids(info)), orphans.striped
    assert abs(sum(orphans.striped.values()) - WRITE_QUORUM * orphans.ledger_bytes) <= len(orphans.ledgers) * 3


def assert_freed(measured: Measured, layout: ReclaimLayout, info: TestbedInfo) -> dict[str, dict[str, Any]]:
    """The orphans were deleted and, on every bookie, the disk shrank by most of that bookie's share of them, and its
    row expects that share and agrees with its disk. Returns the rows by bookie id."""
    orphans = layout.orphans[measured.case]
    assert set(orphans.ledgers) <= measured.deleted, sorted(set(orphans.ledgers) - measured.deleted)
    assert measured.orphan_bytes >= 0.95 * orphans.produced_bytes
    assert_striped(orphans, info)
    rows = {}
    for each in bookie.bookies(info):
        share = orphans.bookie_bytes(each.bookie_id)
        row = rows[each.bookie_id] = measured.row(each.bookie_id)
        report(measured, each.bookie_id, share, row)
        assert row["found_by"] == FOUND_BY[info.on_oxia], row
        assert row["url"].rstrip("/") == each.http_url, row
        # The product spreads a ledger evenly over its ensemble (length x 2/3 each); the bookie holds its round-robin
        # stripes (6 or 7 of every 10 entries).
        assert abs(row["expected_bytes"] - share) <= 0.1 * share, (row, share)
        shrink = measured.shrink(each.bookie_id)
        assert shrink >= 0.6 * share, (each.bookie_id, shrink, share)
        assert abs(row["freed_bytes"] - shrink) <= 0.1 * shrink, (row, shrink)
        assert row["verdict"] == "freed", row
    return rows


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


def test_orphans_in_logs_of_their_own_are_freed_and_each_row_agrees_with_its_disk(
        freed: Measured, layout: ReclaimLayout, testbed_world: World) -> None:
    for row in assert_freed(freed, layout, testbed_world.info).values():
        assert row["action"] == "gc (deletion + minor compaction)", row


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    directory = tmp_path_factory.mktemp("reclaim-config")

    def write(cfg: SweeperConfig, name: str) -> str:
        path = directory / f"{name}.toml"
        path.write_text(to_toml(cfg))
        return str(path)

    yield write


@pytest.fixture(scope="module")
def interleaved(freed: Measured, layout: ReclaimLayout, testbed_world: World, spark: SparkSession,
                tmp_path_factory: pytest.TempPathFactory) -> Measured:
    """Case `interleaved`, swept with minor compaction (the default), which leaves logs a third live. After `freed`
    (see there)."""
    measured = sweep_case(spark, testbed_world.info, tmp_path_factory.mktemp("reclaim-interleaved"), layout,
                          INTERLEAVED, trigger_gc=True)
    COST["reclaim_interleaved_sweep_s"] = measured.seconds
    return measured


def test_interleaved_orphans_wait_for_compaction(interleaved: Measured, layout: ReclaimLayout,
                                                 testbed_world: World) -> None:
    """Every bookie's row says what waits for a compaction, and its disk kept most of its share."""
    info = testbed_world.info
    orphans = layout.orphans[INTERLEAVED]
    assert set(orphans.ledgers) <= interleaved.deleted
    assert_striped(orphans, info)
    for each in bookie.bookies(info):
        share = orphans.bookie_bytes(each.bookie_id)
        row = interleaved.row(each.bookie_id)
        report(interleaved, each.bookie_id, share, row)
        assert row["action"] == "gc (deletion + minor compaction)", row
        assert interleaved.shrink(each.bookie_id) <= 0.25 * share, (each.bookie_id, interleaved.shrink(each.bookie_id))
        # A one-entry ledger (a schema ledger Pulsar leaked in the namespace) is on two bookies of three: the third
        # never indexed it, and its expected count says so (sweeper.reclaim.decide places entries as BookKeeper does).
        assert row["verdict"] == "pending_compaction", (row, interleaved.never_held(each.bookie_id))
        assert abs(row["pending_bytes"] - share) <= 0.25 * share, (row, share)


def test_a_major_compaction_then_frees_interleaved_orphans(interleaved: Measured, layout: ReclaimLayout,
                                                          testbed_world: World, config_file: Any) -> None:
    """`sweeper reclaim --run-id RUN --execute` with `compaction = "major"`, after the pads go (a proper delete), so
    every log the orphans share is under major compaction's threshold: every bookie frees its share, and every
    live message reads back byte for byte.

    The pads are deleted by Pulsar inside the run's window (after the sample before its delete), so each bookie's
    collector counts their ledgers with ours: the row says `shared_window`, never `freed` (issue 44), its bookie-wide
    bytes still agree with the disk, and its bounds hold what of our share left the disk."""
    info = testbed_world.info
    orphans = layout.orphans[INTERLEAVED]
    delete_pads(info, layout, INTERLEAVED)
    assert interleaved.config is not None and interleaved.store is not None
    major = interleaved.config.replace(reclaim={"compaction": "major"})
    started = time.monotonic()
    code = main(["reclaim", "--run-id", interleaved.run_id, "--execute", "--config", config_file(major, "major")])
    COST["reclaim_cli_major_s"] = time.monotonic() - started
    assert code == 0
    measured = replace(interleaved, disk_after=bookie.entry_log_bytes_by_bookie(info),
                       rows=reclaim_rows(interleaved.store, interleaved.run_id))
    for each in bookie.bookies(info):
        share = orphans.bookie_bytes(each.bookie_id)
        second = measured.row(each.bookie_id)
        report(measured, each.bookie_id, share, second)
        assert second["action"] == "gc (deletion + major compaction)", second
        assert second["verdict"] == "shared_window", second
        shrink = measured.shrink(each.bookie_id)
        assert shrink >= 0.6 * share, (each.bookie_id, shrink, share)
        assert abs(second["freed_bytes"] - shrink) <= 0.1 * shrink, (second, shrink)
        pads = bookie.striped_bytes(m for ledger, m in measured.described.items()
                                    if (m.custom_metadata.get("pulsar/managed-ledger") or b"").decode().split("/")[-1]
                                    .startswith("pad-"))
        # What of our share left this disk: at most our share (the rest of the shrink is dead bytes of earlier
        # deletions that shared the compacted logs).
        ours_freed = min(share, max(0, shrink - pads.get(each.bookie_id, 0)))
        assert second["freed_lower_bytes"] <= ours_freed + 0.1 * share, (second, ours_freed)
        assert ours_freed <= second["freed_upper_bytes"] + 0.1 * share, (second, ours_freed)

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
    """Its HTTP server off or the bookie down look the same from here: nothing answers on the port. Bookie 1 is
    named at a closed port ([reclaim] http_urls); the two others are found by their registrations as ever."""
    info = testbed_world.info
    with socket.socket() as held:  # bound and never listening: refused, and no other process can take it meanwhile
        held.bind(("127.0.0.1", 0))
        _down_case(info, layout, spark, tmp_path_factory, config_file, bookie.bookie_id(info, 1), held.getsockname()[1])


def _down_case(info: TestbedInfo, layout: ReclaimLayout, spark: SparkSession,
               tmp_path_factory: pytest.TempPathFactory, config_file: Any, down: str, closed: int) -> None:
    cfg = case_config(info, tmp_path_factory.mktemp("reclaim-down"), layout, DOWN, trigger_gc=True,
                      http_urls=[f"{down}=http://127.0.0.1:{closed}"], timeout_s=2.0)
    path = config_file(cfg, "down")
    run_id = f"reclaim-down-{int(time.time())}"
    started = time.monotonic()
    assert main(["sweep", "--execute", "--config", path, "--run-id", run_id]) == 0
    assert main(["reclaim", "--run-id", run_id, "--execute", "--config", path]) == 0
    COST["reclaim_down_s"] = time.monotonic() - started
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    orphans = layout.orphans[DOWN]
    assert set(orphans.ledgers) <= deleted_ledgers(store, run_id)
    rows = [r for r in reclaim_rows(store, run_id) if r["target_kind"] == "bookie"]
    assert {r["target"] for r in rows} == set(orphans.striped), rows  # every bookie holding them has rows
    for row in rows:  # the sweep's and the CLI's
        print(f"[down] {row['target']}: verdict {row['verdict']}, found_by {row['found_by']!r}, url {row['url']}, "
              f"why {row['why']!r}")
        if row["target"] == down:
            assert row["verdict"] == "not_measured", row
            assert row["why"], row
            assert row["found_by"] == "config" and row["url"].rstrip("/") == f"http://127.0.0.1:{closed}", row
        else:  # one bookie's failure is its own row (DESIGN.md invariant 21)
            assert row["verdict"] != "not_measured", row
            assert row["found_by"] == FOUND_BY[info.on_oxia], row
