"""The testbed's bookie as the reclaim tests see it from outside: its HTTP server, its registration and its entry-log
files on disk (issue 35: space freed, verified).

The tests measure what the bookie gave back here, independently of the product: `entry_log_bytes` sums the sizes
of the entry-log files in the bookie's ledger directory, which only the test reads (the sweeper never looks at a
bookie's disk, only at its HTTP API).

What the real bookie (Pulsar 4.0.8's standalone, BookKeeper 4.17.2) showed, checked on both flavours
(harness.testbed.server.bookie_settings configures it):

- Registration, `/ledgers/available/<bookie id>`: BookKeeper's `BookieServiceInfoFormat` protobuf, endpoints only
  (field 6; no properties), the HTTP server's first:
    ZooKeeper flavour, bookie id `bk0test` (LocalBookkeeperEnsemble names it), 70 bytes:
      b'2\\x1f\\n\\nhttpserver\\x10\\xf8\\x9c\\x01\\x1a\\x070.0.0.0"\\x04http'
      b'2#\\n\\x06bookie\\x10\\xf4\\x9c\\x01\\x1a\\t127.0.0.1"\\nbookie-rpc'
      = [Endpoint(id="httpserver", host="0.0.0.0", port=<httpServerPort>, protocol="http"),
         Endpoint(id="bookie", host="127.0.0.1", port=<bk_port>, protocol="bookie-rpc")]
      httpServerHost is left unset there, so the HTTP endpoint registers as 0.0.0.0 (the server listens on all
      interfaces) and the sweeper must fall back to the bookie endpoint's host.
    Oxia flavour, bookie id `127.0.0.1:<bk_port>` (BKCluster sets none: host:port), 72 bytes, same shape with
      host "127.0.0.1" for the httpserver endpoint (httpServerHost=127.0.0.1), written by Pulsar's
      PulsarRegistrationManager (BookieServiceInfoSerde): the same bytes as ZooKeeper's.
    `/ledgers/available/readonly` has no children while the bookie is writable.
- The Oxia flavour's bookie does read standalone.conf: in Pulsar 4.0.8 PulsarStandalone.startBookieWithMetadataStore
  loads the config file into a ServerConfiguration (`loadConf(configFile)`) and passes it to
  `BKCluster.builder().baseServerConfiguration(...)`, which BKCluster uses instead of its own test defaults
  (gcWaitTime=1000, 4 MiB caches) when given (checked in the 4.0.8 jars' bytecode; Pulsar's master branch no
  longer has `baseServerConfiguration`). Its log prints httpServerEnabled, httpServerPort, gcWaitTime,
  logSizeLimit as set. (Had it not, BookKeeper's AbstractConfiguration reads -D system properties over
  everything else when the JVM runs with -Dorg.apache.bookkeeper.conf.readsystemproperties=true.)
- HTTP server: VertxHttpServer on httpServerPort (ZooKeeper flavour listens on 0.0.0.0, Oxia on 127.0.0.1);
  /metrics is served there (PrometheusMetricsProvider starts no server of its own). GET /api/v1/bookie/info
  -> {"freeSpace": n, "totalSpace": n}; GET /api/v1/bookie/gc_details -> a list with one object per ledger dir
  ({"forceCompacting", "majorCompacting", "minorCompacting", "lastMajorCompactionTime",
  "lastMinorCompactionTime", "lastEntryLocationCompactionTime", "majorCompactionCounter", "minorCompactionCounter",
  "entryLocationCompactionCounter"}); GET /api/v1/bookie/gc -> {"is_in_force_gc": "false"};
  GET /api/v1/bookie/gc/suspend_compaction -> {"isMinorGcSuspended": "false", "isMajorGcSuspended": "false"}.
- Metrics (DbLedgerStorage, one series per ledger dir, labels `indexDir` and `ledgerDir`, both the ledger dir's
  `current`; `# TYPE` lines, no `# HELP`): gauges bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES, bookie_ACTIVE_ENTRY_LOG_TOTAL;
  counters bookie_RECLAIMED_DELETION_SPACE_BYTES, bookie_RECLAIMED_COMPACTION_SPACE_BYTES,
  bookie_DELETED_LEDGER_TOTAL, bookie_MAJOR_COMPACTION_TOTAL, bookie_MINOR_COMPACTION_TOTAL,
  bookie_ENTRY_LOCATION_COMPACTION_TOTAL, bookie_RECLAIM_FAILED_TO_DELETE; and the summary bookie_flush_entrylog.
  No bookie_gc_* series (those are the other ledger storages'); `gc_` only matches the JVM's
  jvm_gc_collection_seconds. Sample: tests/data/bookie_metrics_4.17.2.txt.
- Entry logs: `<ledger dir>/current/<hex id>.log` (ZooKeeper flavour: `<home>/data/bookkeeper0/current`,
  LocalBookkeeperEnsemble appends the bookie's index to --bookkeeper-dir; Oxia flavour:
  `<home>/data/bookkeeper-oxia/current`). The journal (`*.txn`, preallocated 16 MiB) is in the same directory, and
  the RocksDB indexes in `current/ledgers` and `current/locations` (whose own WAL files are also `*.log`: only the
  top level's hex-named ones are entry logs).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from harness.testbed.server import TestbedInfo

ZOOKEEPER_BOOKIE_ID = "bk0test"  # Pulsar's LocalBookkeeperEnsemble sets it
_ENTRY_LOG = re.compile(r"^[0-9a-f]+\.log$")
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


class BookieError(RuntimeError):
    pass


def bookie_http_url(info: TestbedInfo) -> str:
    """The bookie's HTTP server (admin REST API and /metrics) as the test reaches it."""
    if not info.bookie_http_port:
        raise BookieError(f"the testbed under {info.home} runs its bookie without an HTTP server (an older state "
                          "file): restart it")
    return f"http://127.0.0.1:{info.bookie_http_port}"


def bookie_id(info: TestbedInfo) -> str:
    """The bookie's id as it registers (`/ledgers/available/<id>`)."""
    return f"127.0.0.1:{info.bk_port}" if info.on_oxia else ZOOKEEPER_BOOKIE_ID


def ledger_dir(info: TestbedInfo) -> Path:
    """The bookie's one ledger directory (`current`), where its entry logs, journal and indexes live."""
    data = Path(info.home) / "data"
    return (data / "bookkeeper-oxia" if info.on_oxia else data / "bookkeeper0") / "current"


def entry_log_files(info: TestbedInfo) -> list[Path]:
    """The bookie's entry-log files (`<hex id>.log`), oldest first."""
    directory = ledger_dir(info)
    if not directory.is_dir():
        return []
    logs = [p for p in directory.iterdir() if _ENTRY_LOG.match(p.name) and p.is_file()]
    return sorted(logs, key=lambda p: int(p.stem, 16))


def entry_log_bytes(info: TestbedInfo) -> int:
    """The sum of the bookie's entry-log file sizes on disk, as the test measures it (never the product)."""
    total = 0
    for path in entry_log_files(info):
        with contextlib.suppress(FileNotFoundError):  # removed by the garbage collector meanwhile
            total += path.stat().st_size
    return total


def http_get(info: TestbedInfo, path: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(bookie_http_url(info) + path, timeout=timeout) as response:
        return response.read()


def http_json(info: TestbedInfo, path: str, timeout: float = 10.0) -> Any:
    return json.loads(http_get(info, path, timeout))


def metrics(info: TestbedInfo, prefix: str = "bookie_") -> dict[str, float]:
    """The bookie's Prometheus samples whose names start with `prefix`, summed over their label sets (one per
    ledger dir for DbLedgerStorage)."""
    found: dict[str, float] = {}
    for line in http_get(info, "/metrics").decode().splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1).startswith(prefix):
            found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(3))
    return found


def in_force_gc(info: TestbedInfo) -> bool:
    return str(http_json(info, "/api/v1/bookie/gc").get("is_in_force_gc")).lower() == "true"


def compacting(info: TestbedInfo) -> bool:
    return any(d.get("forceCompacting") or d.get("majorCompacting") or d.get("minorCompacting")
               for d in http_json(info, "/api/v1/bookie/gc_details"))


def trigger_gc(info: TestbedInfo, force_major: bool = False, force_minor: bool = False,
               timeout: float = 120.0) -> float:
    """`PUT /api/v1/bookie/gc` (both flags sent: an omitted one defaults to true) and wait until the forced run is
    over. Returns the seconds it took."""
    started = time.monotonic()
    body = json.dumps({"forceMajor": force_major, "forceMinor": force_minor}).encode()
    request = urllib.request.Request(bookie_http_url(info) + "/api/v1/bookie/gc", data=body, method="PUT",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30.0) as response:
            response.read()
    except urllib.error.HTTPError as exc:
        raise BookieError(f"PUT /api/v1/bookie/gc: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
    time.sleep(0.2)
    while in_force_gc(info) or compacting(info):
        if time.monotonic() - started > timeout:
            raise BookieError(f"the bookie's forced GC did not finish within {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def registration(info: TestbedInfo, client: Any) -> bytes:
    """The raw bytes of the bookie's registration (`client`: kazoo or the kazoo-shaped OxiaStore)."""
    data, _ = client.get(f"/ledgers/available/{bookie_id(info)}")
    return bytes(data)
