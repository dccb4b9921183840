"""What the real-Pulsar tests (tests/real_pulsar/) share besides their fixtures: the grace period, the cost
record printed at the end of the session, the sweeper's configuration for the testbed, and the records the
session's fixtures hand to the tests (the orphan sweep's plan and its result, the broker's metadata as built)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from harness.testbed.server import TestbedInfo
from harness.testbed.world import World
from sweeper import config as config_mod
from sweeper.codecs.bookkeeper import decode_ledger_metadata
from sweeper.config import SweeperConfig
from sweeper.tables import TableStore

GRACE_S = 45.0
COST: dict[str, float] = {}  # seconds per step, printed at the end of the session

# Ledgers Pulsar itself leaves behind during the workload: a few at most (see Reconciled.pulsar_leaks).
MAX_PULSAR_LEAKS = 3


def sweeper_config(info: TestbedInfo, tables: Path, **sections: dict[str, Any]) -> SweeperConfig:
    return config_mod.load(info.sweeper_config).replace(
        tables={"root": str(tables), "engine": "delta-rs"},
        safety={"min_age_hours": GRACE_S / 3600, "force_min_age": True, "max_orphan_fraction": 1.0},
        delete={"deletes_per_second": 1000.0, "op_timeout_s": 10.0},
        **sections)


@dataclass
class Reconciled:
    world: World
    cfg: SweeperConfig
    store: TableStore
    run_id: str
    rows: list[dict[str, Any]]
    referenced_before: dict[int, str]
    bk_before: set[int]

    def pulsar_leaks(self) -> set[int]:
        """Ledgers Pulsar itself left behind during the workload, by the broker's own view (not the sweeper's):
        in BookKeeper, referenced by no topic stats-internal shows (system topics included), and not induced
        by the world. Pulsar 4.0.8 makes them now and then, e.g. a ledger created for a topic just before
        its broker is killed, never added to the topic's list. Real orphans, so the sweep must find them."""
        return self.bk_before - set(self.referenced_before) - set(self.world.manifest.orphan_ledgers())

    def expected_ledgers(self) -> set[int]:
        leaks = self.pulsar_leaks()
        # A few at most: more would mean the broker's view and the manifest disagree for another reason.
        assert len(leaks) <= MAX_PULSAR_LEAKS, {r["ledger_id"]: (r["reason"], r["managed_ledger"])
                                               for r in self.rows if r["ledger_id"] in leaks}
        return set(self.world.manifest.orphan_ledgers()) | leaks

    def candidates(self, object_type: str) -> dict[Any, str]:
        key = "ledger_id" if object_type == "ledger" else "s3_key"
        return {r[key]: r["reason"] for r in self.rows
                if r["status"] == "candidate" and r["object_type"] == object_type}


@dataclass
class Swept:
    reconciled: Reconciled
    deleted: set[int]
    results: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class AsBuilt:
    """What the broker wrote, read before any test changed it: every ledger's custom metadata, and the delayed
    subscription's cursor (its properties name the bucket snapshots)."""

    ledgers: dict[int, dict[str, bytes]]
    delayed_cursor: bytes


def real_ledgers(zk: KazooClient) -> dict[int, dict[str, bytes]]:
    """Every ledger under /ledgers (hierarchical layout) -> its custom metadata."""
    out: dict[int, dict[str, bytes]] = {}
    for top in zk.get_children("/ledgers"):
        if not (len(top) == 2 and top.isdigit()):
            continue
        for middle in zk.get_children(f"/ledgers/{top}"):
            for leaf in zk.get_children(f"/ledgers/{top}/{middle}"):
                data, _ = zk.get(f"/ledgers/{top}/{middle}/{leaf}")
                out[int(top + middle + leaf[1:])] = decode_ledger_metadata(data).custom_metadata
    return out
