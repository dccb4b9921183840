"""The testbed's bookies as the tests see them from outside: each one's HTTP server, registration and entry-log files
on disk (issue 35: space freed, verified), and its process, stopped, killed and started again by pid (issue 45).

The testbed runs three bookies, each a process of its own (harness.testbed.storage says why and how), and the
broker stripes every ledger over them: ensemble 3, write quorum 2, so each bookie holds about two thirds of a
ledger's bytes (`striped_bytes`). Every function here names the bookie it is about (`which`: its index, its id or
its BookieInfo); `bookies(info)` lists them. The tests measure what each bookie gave back here, independently of the
product: `entry_log_bytes` sums the sizes of the entry-log files in a bookie's ledger directory, which only the test
reads (the sweeper never looks at a bookie's disk, only at its HTTP API).

A TestbedInfo a test holds may be older than a restart: the functions that act on a bookie's process read its
current pid from the state file (`testbed.json`), and return the testbed as it is afterwards.

What the real bookies (Pulsar 4.0.8, BookKeeper 4.17.2) showed, checked on both flavours:

- Registration, `/ledgers/available/<bookie id>`: BookKeeper's `BookieServiceInfoFormat` protobuf, endpoints only
  (field 6; no properties), the HTTP server's first:
    ZooKeeper flavour, bookie ids `bk0test`, `bk1test`, `bk2test` (the testbed sets `bookieId` as standalone's
    LocalBookkeeperEnsemble named its bookies: not host:port), 70 bytes each:
      b'2\\x1f\\n\\nhttpserver\\x10\\xf8\\x9c\\x01\\x1a\\x070.0.0.0"\\x04http'
      b'2#\\n\\x06bookie\\x10\\xf4\\x9c\\x01\\x1a\\t127.0.0.1"\\nbookie-rpc'
      = [Endpoint(id="httpserver", host="0.0.0.0", port=<httpServerPort>, protocol="http"),
         Endpoint(id="bookie", host="127.0.0.1", port=<bookiePort>, protocol="bookie-rpc")]
      httpServerHost is left unset there, so the HTTP endpoint registers as 0.0.0.0 (the server listens on all
      interfaces) and the sweeper must fall back to the bookie endpoint's host.
    Oxia flavour, bookie ids `127.0.0.1:<bookiePort>` (no `bookieId`: BookKeeper's default, host:port), 72 bytes,
      same shape with host "127.0.0.1" for the httpserver endpoint (httpServerHost=127.0.0.1), written by Pulsar's
      PulsarRegistrationManager (BookieServiceInfoSerde): the same bytes as ZooKeeper's.
    `/ledgers/available/readonly` has no children while the bookies are writable. The same registrations were
    seen when one standalone JVM ran the one bookie (LocalBookkeeperEnsemble on ZooKeeper, BKCluster on Oxia).
- A ledger's metadata names the three bookies as its ensemble, in an order of the client's placement policy, with
  ensemble 3, write quorum 2, ack quorum 2 (read on both flavours: e.g. ('bk1test', 'bk0test', 'bk2test')).
- HTTP server: VertxHttpServer on httpServerPort (ZooKeeper flavour listens on 0.0.0.0, Oxia on 127.0.0.1);
  /metrics is served there (PrometheusMetricsProvider starts no server of its own). GET /api/v1/bookie/info
  -> {"freeSpace": n, "totalSpace": n}; GET /api/v1/bookie/state -> {"running": true, "readOnly": false,
  "shuttingDown": false, "availableForHighPriorityWrites": true}; GET /api/v1/bookie/gc_details -> a list with one
  object per ledger dir ({"forceCompacting", "majorCompacting", "minorCompacting", "lastMajorCompactionTime",
  "lastMinorCompactionTime", "lastEntryLocationCompactionTime", "majorCompactionCounter", "minorCompactionCounter",
  "entryLocationCompactionCounter"}); GET /api/v1/bookie/gc -> {"is_in_force_gc": "false"};
  GET /api/v1/bookie/gc/suspend_compaction -> {"isMinorGcSuspended": "false", "isMajorGcSuspended": "false"}.
- Metrics (DbLedgerStorage, one series per ledger dir, labels `indexDir` and `ledgerDir`, both the ledger dir's
  `current`; `# TYPE` lines, no `# HELP`): gauges bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES, bookie_ACTIVE_ENTRY_LOG_TOTAL;
  counters bookie_RECLAIMED_DELETION_SPACE_BYTES, bookie_RECLAIMED_COMPACTION_SPACE_BYTES,
  bookie_DELETED_LEDGER_TOTAL, bookie_MAJOR_COMPACTION_TOTAL, bookie_MINOR_COMPACTION_TOTAL,
  bookie_ENTRY_LOCATION_COMPACTION_TOTAL, bookie_RECLAIM_FAILED_TO_DELETE; and the summary bookie_flush_entrylog.
  No bookie_gc_* series (those are the other ledger storages'); `gc_` only matches the JVM's
  jvm_gc_collection_seconds. Sample: tests/data/bookie_metrics_4.17.2.txt. A restarted bookie starts its counters
  from 0.
- Entry logs: `<ledger dir>/current/<hex id>.log` (`<home>/data/bookkeeper<i>/current` on ZooKeeper,
  `<home>/data/bookkeeper-oxia<i>/current` on Oxia). The journal (`*.txn`, preallocated 16 MiB) is in the same
  directory, and the RocksDB indexes in `current/ledgers` and `current/locations` (whose own WAL files are also
  `*.log`: only the top level's hex-named ones are entry logs).
- Stopped (SIGTERM), a bookie unregisters and starts again in about 6 s. Killed (SIGKILL), its registration stays
  until its metadata session expires: on ZooKeeper the restarted bookie waits for that itself
  (ZKRegistrationManager.checkRegNodeAndWaitExpired, zkTimeout = 10 s); on Oxia Pulsar's PulsarRegistrationManager
  takes the registration as a lock and fails at once (`LockBusyException: ... is already locked`), and the JVM
  then hangs half shut down, its HTTP server answering `"shuttingDown": true`. `start_bookie` therefore waits for a
  dead bookie's registration to expire (about 8 s on Oxia) before it starts it again.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.testbed import storage
from harness.testbed.server import TestbedInfo, read_state, write_state
from harness.testbed.storage import BookieInfo
from sweeper.codecs.bookkeeper import LedgerMetadata

ZOOKEEPER_BOOKIE_ID = storage.zookeeper_bookie_id(0)  # bookie 0's on the ZooKeeper flavour
_ENTRY_LOG = re.compile(r"^[0-9a-f]+\.log$")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")

BookieRef = int | str | BookieInfo  # a bookie's index, its id, or the bookie itself


class BookieError(RuntimeError):
    pass


def bookies(info: TestbedInfo) -> tuple[BookieInfo, ...]:
    """The testbed's bookies, bookie 0 first. A state file of before the three bookies describes its one bookie in
    the testbed's own fields (it ran inside the standalone JVM: no pid of its own)."""
    if info.bookies:
        return info.bookies
    on_oxia = info.on_oxia
    data_dir = Path(info.home) / "data" / ("bookkeeper-oxia" if on_oxia else "bookkeeper0")
    return (BookieInfo(index=0, bookie_id=f"127.0.0.1:{info.bk_port}" if on_oxia else ZOOKEEPER_BOOKIE_ID,
                       port=info.bk_port, http_port=info.bookie_http_port, data_dir=str(data_dir), conf_file="",
                       log_file="", http_host="127.0.0.1" if on_oxia else ""),)


def find_bookie(info: TestbedInfo, which: BookieRef) -> BookieInfo:
    """The bookie `which` names (index, id, or a BookieInfo, looked up again by its index)."""
    for bookie in bookies(info):
        if (bookie.index == which if isinstance(which, int) else bookie.bookie_id == which if isinstance(which, str)
                else bookie.index == which.index):
            return bookie
    raise BookieError(f"no bookie {which!r} in the testbed under {info.home}: "
                      f"{[b.bookie_id for b in bookies(info)]}")


def bookie_id(info: TestbedInfo, which: BookieRef) -> str:
    """The bookie's id as it registers (`/ledgers/available/<id>`) and as ledger ensembles name it."""
    return find_bookie(info, which).bookie_id


def bookie_ids(info: TestbedInfo) -> list[str]:
    return [b.bookie_id for b in bookies(info)]


def bookie_http_url(info: TestbedInfo, which: BookieRef) -> str:
    """The bookie's HTTP server (admin REST API and /metrics) as the test reaches it."""
    bookie = find_bookie(info, which)
    if not bookie.http_port:
        raise BookieError(f"the testbed under {info.home} runs its bookie without an HTTP server (an older state "
                          "file): restart it")
    return bookie.http_url


def ledger_dir(info: TestbedInfo, which: BookieRef) -> Path:
    """The bookie's one ledger directory (`current`), where its entry logs, journal and indexes live."""
    return find_bookie(info, which).ledger_dir


def entry_log_files(info: TestbedInfo, which: BookieRef) -> list[Path]:
    """The bookie's entry-log files (`<hex id>.log`), oldest first."""
    directory = ledger_dir(info, which)
    if not directory.is_dir():
        return []
    logs = [p for p in directory.iterdir() if _ENTRY_LOG.match(p.name) and p.is_file()]
    return sorted(logs, key=lambda p: int(p.stem, 16))


def entry_log_bytes(info: TestbedInfo, which: BookieRef) -> int:
    """The sum of the bookie's entry-log file sizes on disk, as the test measures it (never the product)."""
    total = 0
    for path in entry_log_files(info, which):
        with contextlib.suppress(FileNotFoundError):  # removed by the garbage collector meanwhile
            total += path.stat().st_size
    return total


def entry_log_bytes_by_bookie(info: TestbedInfo) -> dict[str, int]:
    """Bookie id -> `entry_log_bytes`, for every bookie."""
    return {b.bookie_id: entry_log_bytes(info, b) for b in bookies(info)}


def _write_sets(ledger: LedgerMetadata) -> Iterable[tuple[int, str]]:
    """(entry id, bookie id) for every copy of every entry of `ledger`, as BookKeeper's
    RoundRobinDistributionSchedule places them: entry `e` of a segment goes to the write quorum starting at position
    `e mod ensemble size` of the segment's ensemble (`(e + i) mod E` for i < Q); a segment runs from its first
    entry id to the next segment's (the last one to `last_entry_id`)."""
    for number, segment in enumerate(ledger.segments):
        end = (ledger.segments[number + 1].first_entry_id if number + 1 < len(ledger.segments)
               else ledger.last_entry_id + 1)
        size = len(segment.ensemble)
        for entry in range(segment.first_entry_id, end):
            for copy in range(min(ledger.write_quorum_size, size)):
                yield entry, segment.ensemble[(entry + copy) % size]


def ledger_holders(ledger: LedgerMetadata) -> set[str]:
    """The bookies that store at least one entry of `ledger`. Fewer than its ensemble when it has few entries: with
    ensemble 3 and write quorum 2 a ledger of one entry (a schema version, a topic's one message) is on two bookies,
    and the third, named in its ensemble, never held any of it (nor indexed it: its garbage collector never counts
    it as a deleted ledger)."""
    return {member for _, member in _write_sets(ledger)}


def striped_bytes(ledgers: Iterable[LedgerMetadata]) -> dict[str, int]:
    """Bookie id -> the bytes of `ledgers` that bookie stores, from each ledger's metadata as BookKeeper stripes it
    (`_write_sets`). A ledger's metadata gives its total length, not each entry's: its bytes are spread evenly over
    its entries (the tests write equal messages). With ensemble 3 and write quorum 2 each bookie holds 6 or 7 of
    every 10 entries, two thirds over many ledgers, and the shares add up to twice the ledgers' length."""
    shares: dict[str, float] = {}
    for ledger in ledgers:
        entries = ledger.last_entry_id + 1
        if entries <= 0 or ledger.length <= 0:
            continue
        per_entry = ledger.length / entries
        for _, member in _write_sets(ledger):
            shares[member] = shares.get(member, 0.0) + per_entry
    return {member: round(share) for member, share in shares.items()}


def http_get(info: TestbedInfo, which: BookieRef, path: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(bookie_http_url(info, which) + path, timeout=timeout) as response:
        return bytes(response.read())


def http_json(info: TestbedInfo, which: BookieRef, path: str, timeout: float = 10.0) -> Any:
    return json.loads(http_get(info, which, path, timeout))


def metrics(info: TestbedInfo, which: BookieRef, prefix: str = "bookie_") -> dict[str, float]:
    """The bookie's Prometheus samples whose names start with `prefix`, summed over their label sets (one per
    ledger dir for DbLedgerStorage)."""
    found: dict[str, float] = {}
    for line in http_get(info, which, "/metrics").decode().splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1).startswith(prefix):
            found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(3))
    return found


def metrics_by_bookie(info: TestbedInfo, prefix: str = "bookie_") -> dict[str, dict[str, float]]:
    return {b.bookie_id: metrics(info, b, prefix) for b in bookies(info)}


def in_force_gc(info: TestbedInfo, which: BookieRef) -> bool:
    return str(http_json(info, which, "/api/v1/bookie/gc").get("is_in_force_gc")).lower() == "true"


def compacting(info: TestbedInfo, which: BookieRef) -> bool:
    return any(d.get("forceCompacting") or d.get("majorCompacting") or d.get("minorCompacting")
               for d in http_json(info, which, "/api/v1/bookie/gc_details"))


def trigger_gc(info: TestbedInfo, which: BookieRef, force_major: bool = False, force_minor: bool = False,
               timeout: float = 120.0) -> float:
    """`PUT /api/v1/bookie/gc` on one bookie (both flags sent: an omitted one defaults to true) and wait until the
    forced run is over. Returns the seconds it took."""
    started = time.monotonic()
    body = json.dumps({"forceMajor": force_major, "forceMinor": force_minor}).encode()
    request = urllib.request.Request(bookie_http_url(info, which) + "/api/v1/bookie/gc", data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30.0) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise BookieError(f"PUT /api/v1/bookie/gc: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
    time.sleep(0.2)
    while in_force_gc(info, which) or compacting(info, which):
        if time.monotonic() - started > timeout:
            raise BookieError(f"bookie {bookie_id(info, which)}'s forced GC did not finish within {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def trigger_gc_all(info: TestbedInfo, force_major: bool = False, force_minor: bool = False,
                   timeout: float = 120.0) -> dict[str, float]:
    """`trigger_gc` on every bookie, one after the other (as the sweeper asks them). Bookie id -> seconds."""
    return {b.bookie_id: trigger_gc(info, b, force_major, force_minor, timeout) for b in bookies(info)}


def registration(info: TestbedInfo, client: Any, which: BookieRef) -> bytes:
    """The raw bytes of the bookie's registration (`client`: kazoo or the kazoo-shaped OxiaStore)."""
    data, _ = client.get(f"/ledgers/available/{bookie_id(info, which)}")
    return bytes(data)


def _current(info: TestbedInfo) -> TestbedInfo:
    """The testbed as its state file records it now (pids after any restart), else `info`."""
    recorded = read_state(info.home)
    return recorded if recorded is not None and recorded.bookies else info


def _own_process(info: TestbedInfo, which: BookieRef) -> tuple[TestbedInfo, BookieInfo]:
    current = _current(info)
    bookie = find_bookie(current, which)
    if not bookie.conf_file:
        raise BookieError(f"the testbed under {info.home} runs its bookie inside the standalone JVM (an older "
                          "state file): it cannot be stopped or started alone; restart the testbed")
    return current, bookie


def stop_bookie(info: TestbedInfo, which: BookieRef, timeout: float = 30.0) -> TestbedInfo:
    """SIGTERM the bookie and wait until it is gone (SIGKILL after `timeout`): a clean shutdown, which unregisters
    it. Returns the testbed as it is now (the bookie's pid kept: `start_bookie` sees it is not running)."""
    current, bookie = _own_process(info, which)
    if bookie.alive:
        storage.stop_bookie_process(bookie, timeout)
    return current


def kill_bookie(info: TestbedInfo, which: BookieRef) -> TestbedInfo:
    """SIGKILL the bookie (a crash: no unregistering, no flush) and wait until the process is gone. Its
    registration stays until its metadata session expires."""
    current, bookie = _own_process(info, which)
    if bookie.alive:
        storage.kill_bookie_process(bookie)
    return current


def start_bookie(info: TestbedInfo, which: BookieRef, timeout: float = 120.0) -> TestbedInfo:
    """Start the bookie again on its own ports, data and id, and wait until it serves (registered writable, its HTTP
    server running); a bookie already running is left as it is. The new pid goes to the state file (so `testbed
    down` stops it); returns the testbed with it.

    After a kill it first waits for the dead process's registration to expire: on Oxia a bookie that finds its
    registration still held does not wait but fails (the module's docstring)."""
    current, bookie = _own_process(info, which)
    if bookie.alive:
        return current
    deadline = time.monotonic() + timeout
    storage.wait_unregistered(current, [bookie], deadline, timeout)
    process = storage.spawn_bookie(current, bookie)
    current = current.with_bookie(replace(bookie, pid=process.pid))
    write_state(current)
    try:
        storage.wait_bookies_serving(current, {bookie.index: process}, deadline, timeout)
    except BaseException:
        storage.kill_bookie_process(find_bookie(current, bookie.index))  # a bookie that failed may hang, half down
        raise
    return current


def restart_bookie(info: TestbedInfo, which: BookieRef, kill: bool = False, timeout: float = 120.0) -> TestbedInfo:
    """`stop_bookie` (or `kill_bookie` when `kill`), then `start_bookie`."""
    stopped = kill_bookie(info, which) if kill else stop_bookie(info, which)
    return start_bookie(stopped, which, timeout)
