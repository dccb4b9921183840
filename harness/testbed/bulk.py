"""Bulk data for the reclaim tests (issue 35): megabytes of reproducible messages laid out in the bookies' entry logs
so that a test knows which logs hold only orphan data, which share orphan data with live data, and how much, on
every bookie.

Each bookie (harness.testbed.storage.reclaim_settings) rotates its entry log every 4 MiB (`logSizeLimit`) and
writes entries in the order they arrive, so what a test produces back to back lands in consecutive logs. The broker
stripes every ledger over the three bookies (ensemble 3, write quorum 2): each bookie stores about two thirds of
every topic's entries, in the order they were produced, so every bookie's logs follow the same layout, each at two
thirds of the produced size (`harness.testbed.bookie.striped_bytes` gives a bookie's exact share from the ledgers'
metadata). Sizes that must hold on every bookie (a pad of more than one log) are therefore produced for the least
share a bookie can get (`produced_for`). A log the garbage collector can drop whole must hold nothing live: a burst
of orphan data is fenced off from live data on both sides by a *pad*, an ordinary topic of more than one log's
worth on every bookie that the test deletes through the broker's admin API (a proper delete: Pulsar deletes its
ledgers itself) before the measured sweep. Live filler produced last makes every bookie rotate past everything
before it, so those logs are flushed and no longer the one being written (the collector skips that one).

Payloads are reproducible from (seed, topic, index): a live topic's messages can be compared byte for byte after
a compaction rewrote them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pulsar

from harness.testbed.admin import Admin
from harness.testbed.bookie import striped_bytes
from harness.testbed.orphans import Metadata, ledger_znode, ml_path
from harness.testbed.server import TestbedInfo
from sweeper.codecs import pulsar as codec
from sweeper.codecs.bookkeeper import LedgerMetadata, decode_ledger_metadata

KIB = 1024
MIB = 1024 * KIB
LOG_SIZE_LIMIT = 4 * MIB  # each testbed bookie's logSizeLimit
# The least share of a run of produced bytes one bookie stores: the broker rolls a data ledger every 10 entries
# (managedLedgerMaxEntriesPerLedger) and, with ensemble 3 and write quorum 2, each bookie of a ledger's ensemble
# stores 7, 7 or 6 of its 10 entries (striped_bytes); two thirds on average.
LEAST_SHARE = 0.6


def produced_for(per_bookie_bytes: int) -> int:
    """What to produce so that every bookie stores at least `per_bookie_bytes` of it."""
    return -(-per_bookie_bytes * 10 // int(LEAST_SHARE * 10))


# More than one entry log of data on every bookie: nothing produced before a pad shares a log with anything
# produced after it.
PAD_BYTES = produced_for(LOG_SIZE_LIMIT + 512 * KIB)


def payload(seed: int, topic: str, index: int, size: int) -> bytes:
    """The `index`-th message of `topic`: `size` bytes any run rebuilds from the same seed."""
    return random.Random(f"{seed}/{topic}/{index}").randbytes(size)


def payloads(seed: int, topic: str, count: int, size: int) -> Iterator[bytes]:
    return (payload(seed, topic, i, size) for i in range(count))


def ensure_namespaces(admin: Admin, cluster: str, namespaces: list[str]) -> None:
    for tenant in sorted({ns.split("/", 1)[0] for ns in namespaces}):
        admin.ensure_tenant(tenant, cluster)
    for namespace in namespaces:
        admin.ensure_namespace(namespace)


class Producers:
    """One unbatched producer per topic, kept open so interleaved sends go out in the order they are made."""

    def __init__(self, client: pulsar.Client) -> None:
        self.client = client
        self.open: dict[str, Any] = {}
        self.sent: dict[str, int] = {}  # topic -> messages sent
        self.bytes: dict[str, int] = {}  # topic -> payload bytes sent

    def send(self, topic: str, data: bytes) -> None:
        if topic not in self.open:
            self.open[topic] = self.client.create_producer(topic, batching_enabled=False, send_timeout_millis=60_000)
        self.open[topic].send(data)
        self.sent[topic] = self.sent.get(topic, 0) + 1
        self.bytes[topic] = self.bytes.get(topic, 0) + len(data)

    def burst(self, topic: str, total_bytes: int, size: int, seed: int) -> int:
        """At least `total_bytes` into `topic` in `size`-byte messages, back to back. Returns the bytes sent."""
        start = self.sent.get(topic, 0)
        count = -(-total_bytes // size)
        for i in range(start, start + count):
            self.send(topic, payload(seed, topic, i, size))
        return count * size

    def interleave(self, orphan: str, live: str, rounds: int, orphan_size: int, live_size: int, seed: int) -> None:
        """`rounds` times one message into `orphan`, then one into `live`: both topics' entries share every log."""
        for _ in range(rounds):
            self.send(orphan, payload(seed, orphan, self.sent.get(orphan, 0), orphan_size))
            self.send(live, payload(seed, live, self.sent.get(live, 0), live_size))

    def close(self) -> None:
        for producer in self.open.values():
            producer.close()
        self.open.clear()


def orphan_topic(metadata: Metadata, admin: Admin, topic: str) -> list[int]:
    """Make every ledger of `topic` an orphan as Pulsar leaves one (harness.testbed.orphans.forget_topic): the topic
    is unloaded, then its managed-ledger record and its cursors' are deleted, the ledgers are not. Returns them."""
    admin.unload(topic)
    path = ml_path(topic)
    ledgers = [info.ledgerId for info in codec.decode_managed_ledger_info(metadata.get(path)[0]).ledgerInfo]
    transaction = metadata.transaction()
    for cursor in metadata.get_children(path):
        transaction.delete(f"{path}/{cursor}", version=metadata.exists(f"{path}/{cursor}").version)
    transaction.delete(path, version=metadata.exists(path).version)
    results = transaction.commit()
    if any(isinstance(r, Exception) for r in results):
        raise RuntimeError(f"deleting {path} failed: {results}")
    return [ledger for ledger in ledgers if metadata.exists(ledger_znode(ledger))]


def ledger_metadata(metadata: Metadata, ledgers: list[int]) -> dict[int, LedgerMetadata]:
    """Each ledger's BookKeeper metadata (its length, ensemble and quorums)."""
    return {ledger: decode_ledger_metadata(metadata.get(ledger_znode(ledger))[0]) for ledger in ledgers}


def all_ledgers(metadata: Metadata) -> dict[int, LedgerMetadata]:
    """Every ledger in BookKeeper's metadata, Pulsar's or not: what a test compares before and after a window to
    know what the broker deleted by itself meanwhile (cursor ledgers it rolled, compacted ledgers it replaced)."""
    return ledgers_of_namespace(metadata, "")


def ledgers_of_namespace(metadata: Metadata, namespace: str) -> dict[int, LedgerMetadata]:
    """Every ledger in BookKeeper's metadata that Pulsar wrote for `namespace` (`tenant/ns`): its topics' data and
    cursor ledgers and its schema ledgers, by their custom metadata. A sweep scoped to a namespace may delete more
    than the orphans a test made there (what Pulsar leaked there itself): read this before it, to know where the
    bytes of whatever it deleted were."""
    from sweeper.codecs.layout import is_middle, is_tree_top, parse_ledger_relative_path

    root = "/ledgers"
    prefix = f"{namespace}/".encode() if namespace else b""
    found: dict[int, LedgerMetadata] = {}

    def walk(relative: str) -> None:
        for child in metadata.get_children(f"{root}/{relative}".rstrip("/")):
            below = f"{relative}/{child}".lstrip("/")
            parsed = parse_ledger_relative_path(below)
            if parsed is not None:
                described = decode_ledger_metadata(metadata.get(f"{root}/{below}")[0])
                owner = (described.custom_metadata.get("pulsar/managed-ledger")
                         or described.custom_metadata.get("pulsar/schemaId") or b"")
                if not prefix or owner.startswith(prefix):
                    found[parsed.ledger_id] = described
            elif is_tree_top(child) if not relative else is_middle(child):
                walk(below)

    walk("")
    return found


@dataclass
class Orphans:
    """A topic made an orphan: its ledgers, their lengths, the payload bytes produced into it, and what each bookie
    stores of them."""

    topic: str
    ledgers: list[int] = field(default_factory=list)
    lengths: dict[int, int] = field(default_factory=dict)
    produced_bytes: int = 0
    made_at: float = 0.0  # wall clock once orphaned: the sweep waits out its grace period from here
    striped: dict[str, int] = field(default_factory=dict)  # bookie id -> bytes of these ledgers it stores

    @property
    def ledger_bytes(self) -> int:
        return sum(self.lengths.values())

    def bookie_bytes(self, bookie_id: str) -> int:
        """The bytes of these ledgers bookie `bookie_id` stores (0 when it holds none)."""
        return self.striped.get(bookie_id, 0)


def make_orphans(metadata: Metadata, admin: Admin, topic: str, produced_bytes: int) -> Orphans:
    ledgers = orphan_topic(metadata, admin, topic)
    described = ledger_metadata(metadata, ledgers)
    return Orphans(topic, ledgers, {ledger: meta.length for ledger, meta in described.items()}, produced_bytes,
                   time.time(), striped_bytes(described.values()))


def wait_flushed(seconds: float = 3.0) -> None:
    """The bookies flush their write caches and rotated logs every `flushInterval` (1 s): give them a few."""
    time.sleep(seconds)



# The reclaim tests' cases (tests/real_pulsar/test_reclaim.py), each in its own namespace of the layout's tenant.
# Everything a case writes (orphans, pads, live topics) is in its namespace: a sweep scoped to it also takes what
# Pulsar leaks there by itself (schema ledgers of the namespace's first topics), and leaves nothing behind.
FREED, INTERLEAVED, DOWN = "freed", "interleaved", "down"
# Issue 44's windows (tests/real_pulsar/test_reclaim_windows.py): `shared`, our orphan interleaved with live data while
# Pulsar deletes a topic of its own (with the pads fencing it) between the delete and the GC; `restart`, a few KiB
# of orphans on bookies one of which restarts between the samples.
SHARED, RESTART = "shared", "restart"
ORPHAN_MESSAGE = 100 * KIB
LIVE_MESSAGE = 50 * KIB  # interleaved: two orphan bytes per live byte, each log about a third live
FILLER_BYTES = produced_for(LOG_SIZE_LIMIT + 2 * MIB)  # rotates every bookie past every log before it


@dataclass
class ReclaimLayout:
    """What `build_reclaim_layout` wrote, in each bookie's order (every bookie stores about two thirds of each part):

        down (a few KiB of orphans) | pad | interleaved (orphan, live, orphan, live, ...) | pad | pad | freed (a burst
        of orphans) | pad | filler (live)

    The `freed` burst's logs hold nothing but its orphans and its pads, which the test deletes before the sweep: every
    one of its logs, on every bookie, is dropped whole once the orphans are deleted. The interleaved logs stay about
    a third live (over minor compaction's 0.2, under major's 0.5) while their pads live; deleting the pads leaves
    the edge logs under a third live as well."""

    tenant: str
    seed: int
    orphans: dict[str, Orphans] = field(default_factory=dict)  # case -> its orphans
    pads: dict[str, list[str]] = field(default_factory=dict)  # case -> the pad topics fencing its logs
    live_topic: str = ""  # the interleaved case's live messages
    live_count: int = 0
    # case -> topics Pulsar itself deletes during that case's run (a topic of its own and the pads fencing it)
    pulsar_deletes: dict[str, list[str]] = field(default_factory=dict)
    filler_topic: str = ""
    produced_s: float = 0.0

    def namespace(self, case: str) -> str:
        return f"{self.tenant}/{case}"

    def topic(self, case: str, local: str) -> str:
        return f"persistent://{self.namespace(case)}/{local}"

    @property
    def made_at(self) -> float:
        return max(o.made_at for o in self.orphans.values())

    def live_payloads(self) -> list[bytes]:
        return list(payloads(self.seed, self.live_topic, self.live_count, LIVE_MESSAGE))


def build_reclaim_layout(info: TestbedInfo, admin: Admin, metadata: Metadata, client: pulsar.Client,
                         cases: tuple[str, ...] = (DOWN, INTERLEAVED, FREED), tenant: str = "reclaim", seed: int = 35,
                         freed_bytes: int = 24 * MIB, interleaved_rounds: int = 120) -> ReclaimLayout:
    """Produce the layout (see ReclaimLayout) for `cases`, then make each case's orphan topic an orphan."""
    layout = ReclaimLayout(tenant, seed)
    ensure_namespaces(admin, info.cluster, [layout.namespace(c) for c in cases])
    started = time.monotonic()
    producers = Producers(client)
    produced: dict[str, int] = {}

    def pad(case: str, n: int) -> None:
        name = layout.topic(case, f"pad-{n}")
        producers.burst(name, PAD_BYTES, ORPHAN_MESSAGE, seed)
        layout.pads.setdefault(case, []).append(name)

    try:
        if DOWN in cases:
            produced[DOWN] = producers.burst(layout.topic(DOWN, "orphan"), 20 * KIB, KIB, seed)
        if INTERLEAVED in cases:
            pad(INTERLEAVED, 1)
            layout.live_topic = layout.topic(INTERLEAVED, "live")
            orphan = layout.topic(INTERLEAVED, "orphan")
            producers.interleave(orphan, layout.live_topic, interleaved_rounds, ORPHAN_MESSAGE, LIVE_MESSAGE, seed)
            produced[INTERLEAVED] = producers.bytes[orphan]
            layout.live_count = producers.sent[layout.live_topic]
            pad(INTERLEAVED, 2)
        if SHARED in cases:
            # pad | orphan+live interleaved | pad (stays) | pad | own | pad: Pulsar deletes own and its two pads
            # itself, and their logs go whole; the orphan's logs stay a third live, over minor compaction's 0.2.
            pad(SHARED, 1)
            live, orphan = layout.topic(SHARED, "live"), layout.topic(SHARED, "orphan")
            producers.interleave(orphan, live, interleaved_rounds, ORPHAN_MESSAGE, LIVE_MESSAGE, seed)
            produced[SHARED] = producers.bytes[orphan]
            pad(SHARED, 2)
            own = [layout.topic(SHARED, "own-pad-1"), layout.topic(SHARED, "own"), layout.topic(SHARED, "own-pad-2")]
            producers.burst(own[0], PAD_BYTES, ORPHAN_MESSAGE, seed)
            producers.burst(own[1], produced[SHARED], ORPHAN_MESSAGE, seed)
            producers.burst(own[2], PAD_BYTES, ORPHAN_MESSAGE, seed)
            layout.pulsar_deletes[SHARED] = own
        if RESTART in cases:
            produced[RESTART] = producers.burst(layout.topic(RESTART, "orphan"), 64 * KIB, KIB, seed)
        if FREED in cases:
            pad(FREED, 1)
            produced[FREED] = producers.burst(layout.topic(FREED, "orphan"), freed_bytes, ORPHAN_MESSAGE, seed)
            pad(FREED, 2)
        layout.filler_topic = layout.topic(cases[-1], "filler")
        producers.burst(layout.filler_topic, FILLER_BYTES, ORPHAN_MESSAGE, seed)
    finally:
        producers.close()
    layout.produced_s = time.monotonic() - started
    for case in cases:
        layout.orphans[case] = make_orphans(metadata, admin, layout.topic(case, "orphan"), produced[case])
    wait_flushed()
    return layout
