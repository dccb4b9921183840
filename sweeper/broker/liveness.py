"""Is this metadata live, and is this host's clock right? Probes at the edges, rules as pure functions.

A sweeper pointed at a stale copy of Pulsar's metadata (a restored backup, a store Pulsar has
moved away from, the wrong ensemble) sees every newer ledger as unreferenced. And ledger ages
come from two clocks (the broker's in the ledger metadata, ZooKeeper's in the znode), compared
with this host's: a host clock running ahead makes young ledgers look old. Both are refused.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError

from sweeper.broker.system_topic import Origin, broker_web_origins
from sweeper.zk import client as zkutil


@dataclass(frozen=True)
class ClockReading:
    skew_ms: int | None  # ZooKeeper's clock minus this host's (None: could not be read)
    detail: str


def probe_clock(client: KazooClient, path: str) -> ClockReading:
    """Create an ephemeral sequential znode under `path`: its ctime is ZooKeeper's clock at creation.

    Compared with the midpoint of this host's clock around the request, the error is at most half
    the round trip. Needs create permission on `path`; a read-only identity gets None (the delete
    stage, which must write, reads the clock from its run lock instead).
    """
    try:
        client.ensure_path(path)
        before = time.time() * 1000
        created, stat = client.create(zkutil.join(path, "probe-"), b"", ephemeral=True, sequence=True,
                                      include_data=True)
        after = time.time() * 1000
    except NoAuthError:
        return ClockReading(None, f"no permission to create a probe under {path}: clock checked at delete")
    with contextlib.suppress(NoNodeError):
        client.delete(created)
    return ClockReading(int(stat.ctime - (before + after) / 2), f"probe {created}, round trip {after - before:.0f} ms")


def clock_problem(skew_ms: int | None, max_skew_s: float) -> str | None:
    """Why the run must stop because of the clocks, or None."""
    if skew_ms is None:
        return None
    if abs(skew_ms) > max_skew_s * 1000:
        direction = "behind" if skew_ms > 0 else "ahead of"
        return (f"this host's clock is {abs(skew_ms) / 1000:.0f} s {direction} ZooKeeper's, above [safety] "
                f"max_clock_skew_seconds = {max_skew_s:.0f}: ledger ages would be wrong (fix NTP first)")
    return None


def live_brokers(client: KazooClient, path: str) -> list[str]:
    """Brokers registered under `path` with a live session (ephemeral znodes); [] when there is none.

    Every broker registers an ephemeral znode under /loadbalance/brokers, whichever load manager
    it runs (LoadManager.LOADBALANCE_BROKERS_ROOT; BrokerRegistryImpl for the extensible one).
    """
    try:
        children = client.get_children(path)
    except NoNodeError:
        return []
    live = []
    for child, read in zip(children, zkutil.get_many(client, (zkutil.join(path, c) for c in children)), strict=True):
        if read.error is None and read.stat is not None and read.stat.ephemeralOwner:
            live.append(child)
    return sorted(live)


def registered_web_origins(client: KazooClient, path: str) -> frozenset[Origin]:
    """The admin endpoints (`webServiceUrl` / `webServiceUrlTls`) of the brokers registered live under `path`:
    the only hosts an admin redirect may lead to (sweeper.broker.system_topic.redirect_target). A registration that
    cannot be read or decoded adds nobody."""
    try:
        children = client.get_children(path)
    except NoNodeError:
        return frozenset()
    found: set[Origin] = set()
    for read in zkutil.get_many(client, (zkutil.join(path, c) for c in children)):
        if read.error is None and read.stat is not None and read.stat.ephemeralOwner:
            found |= broker_web_origins(read.data or b"")
    return frozenset(found)


@dataclass(frozen=True)
class Liveness:
    """What the snapshot saw; the gate decides on it."""

    live_brokers: int
    newest_metadata_change_ms: int | None  # managed ledger, cursor or schema znode mtime
    newest_data_ledger_ms: int | None  # creation of the newest Pulsar data ledger (component managed-ledger)


def liveness_problems(seen: Liveness, brokers_path: str, max_lag_minutes: float, require_brokers: bool) -> list[str]:
    """Why the metadata does not look live, naming what was checked; [] when it does."""
    problems = []
    if require_brokers and seen.live_brokers == 0:
        problems.append(f"no live broker is registered under {brokers_path} (ephemeral znodes): is this the "
                        "store the brokers use? For a cleanup with brokers stopped, pass --allow-no-brokers")
    newest_ledger, newest_change = seen.newest_data_ledger_ms, seen.newest_metadata_change_ms
    if newest_ledger is not None:
        lag_ms = newest_ledger - (newest_change or 0)
        if lag_ms > max_lag_minutes * 60_000:
            problems.append(
                f"the newest Pulsar data ledger was created {lag_ms / 60_000:.0f} min after the newest managed-ledger, "
                f"cursor or schema change (above [gates] max_metadata_lag_minutes = {max_lag_minutes:.0f}): brokers "
                "create ledgers and record them in this metadata at once, so it looks stale or moved to another store")
    return problems
