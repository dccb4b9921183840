"""Issue 44 on a real Pulsar (three bookies, striped ledgers): a bookie's counters are the bookie's, not the run's.

- shared: our orphan's bytes share entry logs with live data (a third live: minor compaction leaves them), and Pulsar
  deletes a topic of its own of the same size (with the two pads fencing it, in logs of their own) between our delete
  and the GC: the bookies' counters then move by about what we expected, but every `reclaim` row says
  `shared_window`, never `freed`; its bounds contain what of our bytes really left each bookie's disk (nothing), and
  its pending bytes are within 25 % of what of our share is still there. (Without Pulsar's deletion, and with our
  orphan in logs of its own, the same sweep says `freed`: test_reclaim.py's freed case.)
- restart: a bookie restarted between the sample before the delete and the one after (its counters start again from
  zero) is `restarted`, with a lower bound only, never `freed` and never a negative; the other bookies are measured as
  ever (issue 45).

The disk is measured by the test itself on each bookie (`entry_log_bytes_by_bookie`), never through the product, and
who holds which bytes comes from the ledgers' own metadata (`striped_bytes`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from harness.testbed import bookie, bulk
from harness.testbed.bulk import RESTART, SHARED, ReclaimLayout
from harness.testbed.orphans import ledger_znode
from harness.testbed.server import TestbedInfo
from harness.testbed.workload import admin_for, client_for
from harness.testbed.world import World, metadata_for
from sweeper.cli import main
from sweeper.config import SweeperConfig, to_toml
from sweeper.pipeline import sweep
from sweeper.tables import open_table_store
from tests.real_pulsar.test_reclaim import settle
from tests.support.real_pulsar import COST, GRACE_S, Swept, sweeper_config

pytestmark = [pytest.mark.real_pulsar, pytest.mark.slow, pytest.mark.timeout(1200)]

TENANT = "reclaim-windows"


@pytest.fixture(scope="module")
def windows(testbed_world: World, swept: Swept) -> ReclaimLayout:
    """Made after the session's sweep (its plan must not see these orphans), in a tenant of their own."""
    info = testbed_world.info
    started = time.monotonic()
    client = client_for(info)
    metadata = metadata_for(info)
    try:
        layout = bulk.build_reclaim_layout(info, admin_for(info), metadata, client, cases=(SHARED, RESTART),
                                           tenant=TENANT, seed=44)
    finally:
        metadata.stop()
        client.close()
    time.sleep(max(0.0, layout.made_at + GRACE_S + 2 - time.time()))
    COST["reclaim_windows_layout_s"] = time.monotonic() - started
    return layout


def _config(info: TestbedInfo, tables: Path, layout: ReclaimLayout, case: str, **reclaim: Any) -> SweeperConfig:
    cfg = sweeper_config(info, tables, reclaim=reclaim)
    return cfg.replace(safety={"allow": layout.namespace(case)},
                       system_topic={"topic": f"persistent://{layout.tenant}/{case}/ledger-deletion"})


def _latest(rows: list[dict[str, Any]], target: str) -> dict[str, Any]:
    mine = [r for r in rows if r["target_kind"] == "bookie" and r["target"] == target]
    assert mine, rows
    return max(mine, key=lambda r: r["measured_at"])


@pytest.fixture
def config_path(tmp_path: Path) -> Iterator[Any]:
    def write(cfg: SweeperConfig) -> str:
        path = tmp_path / "sweeper.toml"
        path.write_text(to_toml(cfg))
        return str(path)

    yield write


def _managed_ledger_of(topic: str) -> str:
    tenant, namespace, local = topic.removeprefix("persistent://").split("/", 2)
    return f"{tenant}/{namespace}/persistent/{local}"


def test_pulsar_deleting_beside_us_makes_what_came_back_a_bound_never_freed(
        windows: ReclaimLayout, testbed_world: World, spark: SparkSession, tmp_path: Path, config_path: Any) -> None:
    info = testbed_world.info
    cfg = _config(info, tmp_path / "tables", windows, SHARED, compaction="minor")
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    metadata = metadata_for(info)
    try:
        described = bulk.ledgers_of_namespace(metadata, windows.namespace(SHARED))
    finally:
        metadata.stop()
    theirs_names = {_managed_ledger_of(t).encode() for t in windows.pulsar_deletes[SHARED]}
    theirs = {ledger: meta for ledger, meta in described.items()
              if meta.custom_metadata.get("pulsar/managed-ledger") in theirs_names}
    assert theirs, "Pulsar's own topic and its pads have ledgers"
    settle(info)  # what earlier tests' deletes left is collected before the baseline
    disk_before = bookie.entry_log_bytes_by_bookie(info)

    result = sweep(spark, cfg, store, until="delete", execute=True)  # measured only: no GC asked yet
    orphans = windows.orphans[SHARED]
    deleted = {r["ledger_id"] for r in store.read_arrow(
        "delete_results", where={"run_id": result.run_id, "outcome": "deleted"}, columns=["ledger_id"]).to_pylist()}
    assert set(orphans.ledgers) <= deleted
    # Between our delete and the GC, Pulsar deletes a topic of its own (and the pads around it): a proper delete.
    admin = admin_for(info)
    for topic in windows.pulsar_deletes[SHARED]:
        admin.delete_topic(topic)
    metadata = metadata_for(info)
    try:
        deadline = time.monotonic() + 60
        while any(metadata.exists(ledger_znode(ledger)) for ledger in theirs) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(metadata.exists(ledger_znode(ledger)) for ledger in theirs), "Pulsar did not delete them"
    finally:
        metadata.stop()
    bulk.wait_flushed()
    assert main(["reclaim", "--run-id", result.run_id, "--execute", "--config", config_path(cfg)]) == 0
    disk_after = bookie.entry_log_bytes_by_bookie(info)
    rows = store.read_arrow("reclaim", where={"run_id": result.run_id}).to_pylist()

    theirs_share = bookie.striped_bytes(theirs.values())
    for each in bookie.bookies(info):
        b = each.bookie_id
        row = _latest(rows, b)
        ours, shrink = orphans.bookie_bytes(b), disk_before[b] - disk_after[b]
        ours_freed = max(0, shrink - theirs_share.get(b, 0))  # what of our bytes left this disk (the truth)
        remaining = ours - min(ours_freed, ours)
        print(f"[shared] {b}: ours {ours:,}, theirs {theirs_share.get(b, 0):,}, disk shrink {shrink:,} -> ours freed "
              f"{ours_freed:,}; row: {row['verdict']}, freed {row['freed_bytes']}, bounds "
              f"[{row['freed_lower_bytes']}, {row['freed_upper_bytes']}], pending {row['pending_bytes']}, others "
              f"{row['others_collected']}, why {row['why']!r}")
        assert row["verdict"] == "shared_window", row
        assert row["others_collected"] and row["others_collected"] >= 1, row
        slack = 0.1 * ours
        assert row["freed_lower_bytes"] - slack <= ours_freed <= row["freed_upper_bytes"] + slack, (row, ours_freed)
        assert abs(row["pending_bytes"] - remaining) <= 0.25 * ours, (row, remaining)
        assert row["freed_bytes"] >= 0.5 * theirs_share.get(b, 0), row  # the bookie did give back Pulsar's bytes
    line = next(r for r in store.read_arrow("runs", where={"run_id": result.run_id, "stage": "reclaim"}).to_pylist()
                if "others' deletions" in (r["message"] or ""))
    assert "between" in line["message"], line["message"]


def test_a_bookie_restarted_between_the_samples_gives_a_lower_bound_never_freed(
        windows: ReclaimLayout, testbed_world: World, spark: SparkSession, tmp_path: Path, config_path: Any) -> None:
    info = testbed_world.info
    cfg = _config(info, tmp_path / "tables", windows, RESTART)
    store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
    settle(info)
    result = sweep(spark, cfg, store, until="delete", execute=True)  # samples before, deletes, measures
    assert set(windows.orphans[RESTART].ledgers) <= {r["ledger_id"] for r in store.read_arrow(
        "delete_results", where={"run_id": result.run_id, "outcome": "deleted"}).to_pylist()}
    restarted = bookie.bookies(info)[1].bookie_id
    started = time.monotonic()
    bookie.restart_bookie(info, 1)
    COST["bookie_restart_s"] = time.monotonic() - started
    assert main(["reclaim", "--run-id", result.run_id, "--execute", "--config", config_path(cfg)]) == 0
    rows = store.read_arrow("reclaim", where={"run_id": result.run_id}).to_pylist()
    for each in bookie.bookies(info):
        row = _latest(rows, each.bookie_id)
        print(f"[restart] {each.bookie_id}: {row['verdict']}, freed {row['freed_bytes']}, bounds "
              f"[{row['freed_lower_bytes']}, {row['freed_upper_bytes']}], reset {row['counter_reset']}, "
              f"why {row['why']!r}")
        assert row["freed_bytes"] is None or row["freed_bytes"] >= 0, row
        if each.bookie_id == restarted:
            assert row["verdict"] == "restarted" and row["counter_reset"], row
            assert row["freed_lower_bytes"] == 0 and "restarted" in row["why"], row
        else:
            assert row["verdict"] != "restarted" and not row["counter_reset"], row
