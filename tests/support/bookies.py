"""What the real-Pulsar tests check of the testbed's three bookies, on either testbed (ZooKeeper or Oxia): each
registers with its own HTTP server, the broker stripes every ledger over the three, and one bookie stopped or
killed comes back by pid on its ports and data while the rest of the cluster runs (issues 44 and 45)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from harness.lifecycle import pid_alive
from harness.testbed import bookie
from harness.testbed.orphans import ledger_znode
from harness.testbed.server import TestbedInfo, read_state
from harness.testbed.storage import ACK_QUORUM, BOOKIE_COUNT, ENSEMBLE_SIZE, WRITE_QUORUM
from harness.testbed.workload import admin_for, client_for, produce, read_all
from harness.testbed.world import World, metadata_for
from sweeper.codecs.bookkeeper import decode_ledger_metadata
from sweeper.reclaim.discovery import decode_registration

# Where each bookie's HTTP endpoint registers: httpServerHost unset on ZooKeeper, loopback on Oxia.
HTTP_HOST = {False: "0.0.0.0", True: "127.0.0.1"}


def bookie_state(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url + "/api/v1/bookie/state", timeout=10) as response:
        return dict(json.loads(response.read()))


def assert_every_bookie_registers_its_http_server(info: TestbedInfo) -> None:
    """Three bookies registered writable, each registration naming its own HTTP server and bookie port, each
    HTTP server serving the admin API and Prometheus metrics."""
    metadata = metadata_for(info)
    try:
        registered = sorted(c for c in metadata.get_children("/ledgers/available") if c != "readonly")
        assert registered == sorted(bookie.bookie_ids(info)) and len(registered) == BOOKIE_COUNT, registered
        readonly = "/ledgers/available/readonly"
        assert metadata.exists(readonly) is None or metadata.get_children(readonly) == []
        for each in bookie.bookies(info):
            registration = decode_registration(each.bookie_id, bookie.registration(info, metadata, each), False)
            assert registration.endpoint("httpserver") == ("httpserver", HTTP_HOST[info.on_oxia], each.http_port,
                                                            "http"), registration
            assert registration.endpoint("bookie") == ("bookie", "127.0.0.1", each.port, "bookie-rpc"), registration
            assert bookie_state(each.http_url)["running"] is True
            assert "bookie_RECLAIMED_DELETION_SPACE_BYTES" in bookie.metrics(info, each)
    finally:
        metadata.stop()


def assert_ledgers_are_striped_over_the_three_bookies(world: World, topics: int = 4) -> None:
    """The data ledgers of the workload's busiest topics: ensemble 3, write quorum 2, ack quorum 2, the three bookies
    their ensemble; and every bookie's entry logs hold data."""
    info = world.info
    admin = admin_for(info)
    busiest = sorted(world.held, key=lambda name: -len(world.held[name]))[:topics]
    # An offloaded ledger's BookKeeper copy is deleted (managedLedgerOffloadDeletionLagMs=0): only those on the bookies.
    ledgers = [int(ledger["ledgerId"]) for name in busiest for ledger in admin.internal_stats(name)["ledgers"]
               if not ledger.get("offloaded")]
    assert len(ledgers) >= topics, busiest
    metadata = metadata_for(info)
    try:
        for ledger in ledgers:
            described = decode_ledger_metadata(bytes(metadata.get(ledger_znode(ledger))[0]))
            assert (described.ensemble_size, described.write_quorum_size, described.ack_quorum_size) == (
                ENSEMBLE_SIZE, WRITE_QUORUM, ACK_QUORUM), (ledger, described)
            for segment in described.segments:
                assert sorted(segment.ensemble) == sorted(bookie.bookie_ids(info)), (ledger, described)
    finally:
        metadata.stop()
    assert all(size > 0 for size in bookie.entry_log_bytes_by_bookie(info).values())


def _unregistered(info: TestbedInfo, bookie_id: str) -> bool:
    metadata = metadata_for(info)
    try:
        return metadata.exists(f"/ledgers/available/{bookie_id}") is None
    finally:
        metadata.stop()


def _assert_back(before: TestbedInfo, after: TestbedInfo, index: int, old_pid: int, logs: set[str]) -> None:
    """Bookie `index` runs again as a new process on its ports, id and data, recorded in the state file."""
    was, now = bookie.find_bookie(before, index), bookie.find_bookie(after, index)
    assert now.pid != old_pid and now.alive and not pid_alive(old_pid)
    assert (now.bookie_id, now.port, now.http_port, now.data_dir) == (was.bookie_id, was.port, was.http_port,
                                                                     was.data_dir)
    recorded = read_state(after.home)
    assert recorded is not None and bookie.find_bookie(recorded, index).pid == now.pid
    assert bookie_state(now.http_url)["running"] is True
    assert not _unregistered(after, now.bookie_id)
    kept = {p.name for p in bookie.entry_log_files(after, index)}
    assert logs <= kept, sorted(logs - kept)  # its data survived: the entry logs written before are still there


def assert_a_bookie_stopped_or_killed_comes_back_by_pid(world: World, topic: str) -> dict[str, float]:
    """Bookie 1 stopped (SIGTERM: it unregisters at once) and started again; bookie 2 killed (SIGKILL: its
    registration outlives it until its session expires) and started again; then the broker writes a new topic
    over all three and reads it back, and reads a topic of the workload whole. Returns the seconds each step took."""
    info = world.info
    seconds: dict[str, float] = {}
    current = read_state(info.home) or info

    stopped_pid = bookie.find_bookie(current, 1).pid
    logs = {p.name for p in bookie.entry_log_files(current, 1)}
    started = time.monotonic()
    current = bookie.stop_bookie(current, 1)
    seconds["stop"] = time.monotonic() - started
    assert not pid_alive(stopped_pid)
    assert _unregistered(current, bookie.bookie_id(current, 1))  # a clean shutdown unregisters
    with pytest.raises(OSError):
        bookie_state(bookie.bookie_http_url(current, 1))
    started = time.monotonic()
    restarted = bookie.start_bookie(current, 1)
    seconds["start_after_stop"] = time.monotonic() - started
    _assert_back(current, restarted, 1, stopped_pid, logs)

    killed_pid = bookie.find_bookie(restarted, 2).pid
    logs = {p.name for p in bookie.entry_log_files(restarted, 2)}
    current = bookie.kill_bookie(restarted, 2)
    assert not pid_alive(killed_pid)
    assert not _unregistered(current, bookie.bookie_id(current, 2))  # no shutdown: the session still holds it
    started = time.monotonic()
    restarted = bookie.start_bookie(current, 2)
    seconds["start_after_kill"] = time.monotonic() - started
    _assert_back(current, restarted, 2, killed_pid, logs)

    # A new ledger needs all three bookies writable (ensemble 3): the broker writes and reads one again.
    client = client_for(info)
    try:
        produce(client, topic, 25, prefix="after-restart")
        assert [data for _, data in read_all(client, topic)] == [f"after-restart-{i}".encode() for i in range(25)]
        busiest = max(world.held, key=lambda name: len(world.held[name]))
        held = [hexed for _, hexed in world.held[busiest]]
        assert [data.hex() for _, data in read_all(client, busiest)][:len(held)] == held
    finally:
        client.close()
    return seconds
