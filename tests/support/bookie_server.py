"""A loopback HTTP server standing in for one bookie's HTTP service (BookKeeper 4.17.2), scripted by the test (the
harness, not product code).

What it imitates, as read in BookKeeper's release-4.17.2 tree (`HttpRouter`, `server/http/service/*Service.java`,
`GarbageCollectorThread`, `DbLedgerStorage`, `PrometheusTextFormat`, `VertxHttpServer`):

- GET `/metrics`: Prometheus text as `PrometheusMetricsProvider.writeAllMetrics` writes it: gauges first, then
  counters; one `# TYPE` line per name, the first time the name is written, so that with several ledger dirs the
  samples of one name are not adjacent; labels in `TreeMap` order (`indexDir`, then `ledgerDir`, both the ledger
  dir's `current` path unless an index dir is set); values are `Long.toString` (`12345`). Non-GET: 403.
  tests/data/bookie_metrics_4.17.2.txt (a real testbed bookie's excerpt) holds the shape; test_bookie_server checks
  every line of it has a line of the same shape here.
- GET `/api/v1/bookie/info` -> `{"freeSpace": n, "totalSpace": n}`; non-GET: 404.
- GET `/api/v1/bookie/gc_details` -> one `GarbageCollectionStatus` per ledger dir; non-GET: 404.
- PUT `/api/v1/bookie/gc`: a blank body is `forceGC()` (each compaction unless suspended); otherwise an omitted
  `forceMajor`/`forceMinor` defaults to "not suspended", a given one is `Boolean.parseBoolean(value.toString())`
  (so an explicit `true` forces a suspended compaction); a body that is not a JSON object: 400. A PUT while a forced
  GC is still running changes nothing (`forceGarbageCollection.compareAndSet(false, true)`) but still answers 200.
  GET -> `{"is_in_force_gc": "true"|"false"}`; POST/DELETE: 405.
- GET/PUT `/api/v1/bookie/gc/suspend_compaction` and `/api/v1/bookie/gc/resume_compaction`; other methods: 404.
- Routes take GET, PUT, POST and DELETE (anything else: 405); an unknown path: 404. JSON bodies are pretty-printed
  as Jackson's default printer does (`{\n  "freeSpace" : 1,\n ...}`); JSON answers carry no Content-Type.

A forced GC runs in a background thread: `in_force_gc` (and `forceCompacting`, and the compacting flag of the
compaction that will run) are true for `gc_duration_s`, then `on_gc(state, force_major, force_minor)` runs (the
effective flags, after the defaults above) and the flags drop. The default `on_gc` (`simulate_gc`) does what
`GarbageCollectorThread.runWithFlags` does with what the test left pending in each dir (see `LedgerDirState`).

- GET `/api/v1/bookie/state` (BookieStateService) -> `{"running", "readOnly", "shuttingDown",
  "availableForHighPriorityWrites"}`; GET `/api/v1/config/server_config` (ConfigurationService) -> the server's
  configuration as a map of strings, `gcWaitTime` among them.
- `/metrics` also carries `process_start_time_seconds{} 1.764...E9` (the Prometheus client's StandardExports, which
  PrometheusMetricsProvider registers by default, written with `{}` and Java's `Double.toString`).

Faults: `delay_s` (answer late), `status_for={path: code | (code, body)}`, `stopped = True` (the listening socket and
every open connection are closed: connection refused; `False` listens again on the same port), `restart()` (a
restarted bookie: a new process start time; counters, compaction times, suspensions and the force flag back to zero,
the active-entry-log gauge 0 until the next GC), `require_header=(name, value)` (401 without it; a real bookie has no
auth: a proxy's). Broken answers, per path: `raw_for={path: bytes}` writes those bytes as the whole response and
closes (a garbage status line, a body shorter than its Content-Length), `drip_for={path: seconds}` sends the answer
one byte every that many seconds, `metrics_padding` makes `/metrics` that many bytes longer (comment lines: still
valid text), `metrics_extra` adds lines (a `+Inf` sample). `tls=(certfile, keyfile)` serves HTTPS.
Every request is recorded in `.requests` (`BookieRequest`: method, path, body, headers, time, monotonic, status).
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The metric names the bookie serves (the `bookie` scope + BookKeeperServerStats' names), per LedgerDirState field.
# Gauges are listed in GAUGES; everything else is a counter.
METRIC_NAMES: dict[str, str] = {
    "active_entry_log_bytes": "bookie_ACTIVE_ENTRY_LOG_SPACE_BYTES",
    "reclaimed_deletion_bytes": "bookie_RECLAIMED_DELETION_SPACE_BYTES",
    "reclaimed_compaction_bytes": "bookie_RECLAIMED_COMPACTION_SPACE_BYTES",
    "deleted_ledgers": "bookie_DELETED_LEDGER_TOTAL",
    "major_compactions": "bookie_MAJOR_COMPACTION_TOTAL",
    "minor_compactions": "bookie_MINOR_COMPACTION_TOTAL",
}
GAUGES: frozenset[str] = frozenset({"active_entry_log_bytes"})
# Other per-dir series the real bookie serves next to them (constant here): a parser must skip what it does not ask for.
OTHER_DIR_METRICS: dict[str, tuple[str, int]] = {
    "bookie_ACTIVE_ENTRY_LOG_TOTAL": ("gauge", 3),
    "bookie_ACTIVE_LEDGER_TOTAL": ("gauge", 7),
    "bookie_ENTRY_LOCATION_COMPACTION_TOTAL": ("counter", 0),
    "bookie_RECLAIM_FAILED_TO_DELETE": ("counter", 0),
}
# Lines written before the bookie's own (what the Prometheus client's collectors add), unlabelled and labelled.
PREAMBLE = (
    '# TYPE jvm_memory_direct_bytes_used gauge\njvm_memory_direct_bytes_used 1.6777216E7\n'
    '# TYPE jvm_threads_state gauge\njvm_threads_state{state="RUNNABLE"} 42.0\n'
)
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

DEFAULT_LEDGER_DIR = "/data/bk0/current"

# Routes (HttpRouter's paths).
METRICS = "/metrics"
BOOKIE_INFO = "/api/v1/bookie/info"
GC_DETAILS = "/api/v1/bookie/gc_details"
GC = "/api/v1/bookie/gc"
SUSPEND = "/api/v1/bookie/gc/suspend_compaction"
RESUME = "/api/v1/bookie/gc/resume_compaction"
STATE = "/api/v1/bookie/state"
SERVER_CONFIG = "/api/v1/config/server_config"
ROUTED_METHODS = frozenset({"GET", "PUT", "POST", "DELETE"})  # VertxHttpServer binds these four on every route


@dataclass
class LedgerDirState:
    """One ledger dir's garbage collector: its metrics (what `/metrics` serves), its `gc_details`, and what the
    test has left for the next GC to find.

    - `pending_deletion_bytes`: entry logs whose ledgers are all deleted (a GC removes them: RECLAIMED_DELETION).
    - `pending_compaction_bytes`: deleted ledgers' bytes in entry logs still partly live; only a compaction frees
      them (RECLAIMED_COMPACTION), a minor one only if `pending_compaction_needs_major` is false (the logs' live
      fraction is between the minor and the major threshold).
    - `pending_deleted_ledgers`: ledgers whose metadata is gone (DELETED_LEDGER_TOTAL at the next GC).
    `active_entry_log_bytes` is the live bytes of the flushed entry logs (ACTIVE_ENTRY_LOG_SPACE_BYTES): as upstream,
    every GC drops both pending amounts from it (it sums the logs' remaining sizes, which lose deleted ledgers at
    once), compaction or not."""

    reclaimed_deletion_bytes: int = 0
    reclaimed_compaction_bytes: int = 0
    active_entry_log_bytes: int = 0
    deleted_ledgers: int = 0
    major_compactions: int = 0
    minor_compactions: int = 0
    entry_location_compactions: int = 0
    last_major_compaction_time: int = 0  # ms since the epoch, as gc_details serves it
    last_minor_compaction_time: int = 0
    last_entry_location_compaction_time: int = 0
    major_compacting: bool = False
    minor_compacting: bool = False
    pending_deletion_bytes: int = 0
    pending_compaction_bytes: int = 0
    pending_compaction_needs_major: bool = False
    pending_deleted_ledgers: int = 0
    # Of pending_compaction_bytes, how much a GC has already taken off active_entry_log_bytes.
    compaction_bytes_seen: int = 0
    # After a restart the gauge reads 0 until the first GC has scanned the entry logs again.
    gauge_stale: bool = False

    def reset_after_restart(self) -> None:
        for name in ("reclaimed_deletion_bytes", "reclaimed_compaction_bytes", "deleted_ledgers", "major_compactions",
                     "minor_compactions", "entry_location_compactions", "last_major_compaction_time",
                     "last_minor_compaction_time", "last_entry_location_compaction_time"):
            setattr(self, name, 0)
        self.major_compacting = self.minor_compacting = False
        self.gauge_stale = True


_PER_DIR = ("reclaimed_deletion_bytes", "reclaimed_compaction_bytes", "active_entry_log_bytes", "deleted_ledgers",
            "major_compactions", "minor_compactions", "pending_deletion_bytes", "pending_compaction_bytes",
            "pending_deleted_ledgers")


@dataclass
class BookieState:
    """The bookie as its HTTP service shows it. Per-dir state is in `dirs[ledger_dir]`; with one ledger dir (the
    default) the per-dir fields can also be read and set here (`state.pending_deletion_bytes = n`): reading sums over
    the dirs, setting needs exactly one dir. Change it while the server runs under `server.lock` if a GC may be
    running."""

    bookie_id: str = "bk0test"
    ledger_dirs: list[str] = field(default_factory=lambda: [DEFAULT_LEDGER_DIR])
    index_dir: str | None = None  # None: each ledger dir holds its own index (the `indexDir` label = `ledgerDir`)
    free_space: int = 50 * 2**30
    total_space: int = 100 * 2**30
    in_force_gc: bool = False
    major_suspended: bool = False
    minor_suspended: bool = False
    read_only: bool = False
    gc_wait_ms: int = 900_000  # Pulsar's bookkeeper.conf
    started_at_s: float = field(default_factory=time.time)  # the JVM's start (process_start_time_seconds)
    dirs: dict[str, LedgerDirState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dir_states()

    def dir_states(self) -> list[tuple[str, LedgerDirState]]:
        """(ledger dir, its state) in `ledger_dirs` order; a dir added to `ledger_dirs` later starts at zero."""
        return [(name, self.dirs.setdefault(name, LedgerDirState())) for name in self.ledger_dirs]

    @property
    def only(self) -> LedgerDirState:
        """The one ledger dir's state (ValueError with several)."""
        states = self.dir_states()
        if len(states) != 1:
            raise ValueError(f"{len(states)} ledger dirs: use state.dirs[<dir>]")
        return states[0][1]

    @property
    def major_compacting(self) -> bool:
        return any(d.major_compacting for _, d in self.dir_states())

    @property
    def minor_compacting(self) -> bool:
        return any(d.minor_compacting for _, d in self.dir_states())

    def total(self, name: str) -> int:
        return sum(getattr(d, name) for _, d in self.dir_states())


def _per_dir_property(name: str) -> property:
    def get(self: BookieState) -> int:
        return self.total(name)

    def set_(self: BookieState, value: int) -> None:
        setattr(self.only, name, value)

    return property(get, set_, doc=f"{name}: summed over the ledger dirs; set only with one ledger dir")


def _needs_major(self: BookieState) -> bool:
    return any(d.pending_compaction_needs_major for _, d in self.dir_states())


def _set_needs_major(self: BookieState, value: bool) -> None:
    self.only.pending_compaction_needs_major = value


for _name in _PER_DIR:
    setattr(BookieState, _name, _per_dir_property(_name))
# A flag: reading it means "in any dir".
BookieState.pending_compaction_needs_major = property(_needs_major, _set_needs_major)  # type: ignore[attr-defined]


def compaction_that_runs(force_major: bool, force_minor: bool) -> str | None:
    """`runWithFlags` on a forced GC: major if not suspended for this run, else minor likewise (both compactions
    enabled, as Pulsar's bookkeeper.conf has them)."""
    return "major" if force_major else "minor" if force_minor else None


def simulate_gc(state: BookieState, force_major: bool, force_minor: bool) -> None:
    """The default `on_gc`: one forced GC pass in every ledger dir (`GarbageCollectorThread.runWithFlags`)."""
    now_ms = int(time.time() * 1000)
    ran = compaction_that_runs(force_major, force_minor)
    for _, d in state.dir_states():
        # doGcLedgers, doGcEntryLogs: whole logs go, and the logs' remaining sizes lose every deleted ledger.
        d.deleted_ledgers += d.pending_deleted_ledgers
        d.pending_deleted_ledgers = 0
        d.reclaimed_deletion_bytes += d.pending_deletion_bytes
        state.free_space += d.pending_deletion_bytes
        unseen = d.pending_compaction_bytes - d.compaction_bytes_seen
        d.active_entry_log_bytes -= d.pending_deletion_bytes + unseen
        d.compaction_bytes_seen = d.pending_compaction_bytes
        d.pending_deletion_bytes = 0
        d.gauge_stale = False
        if ran is None:
            continue
        if ran == "major" or not d.pending_compaction_needs_major:
            d.reclaimed_compaction_bytes += d.pending_compaction_bytes
            state.free_space += d.pending_compaction_bytes
            d.pending_compaction_bytes = d.compaction_bytes_seen = 0
            d.pending_compaction_needs_major = False
        if ran == "major":
            d.major_compactions += 1
            d.last_major_compaction_time = d.last_minor_compaction_time = now_ms
        else:
            d.minor_compactions += 1
            d.last_minor_compaction_time = now_ms


OnGc = Callable[[BookieState, bool, bool], None]


@dataclass
class BookieRequest:
    method: str
    path: str  # as sent, with any query string
    body: bytes
    headers: dict[str, str]
    time: float  # time.time() at arrival
    monotonic: float  # time.monotonic() at arrival
    status: int | None = None  # what it was answered (None: not yet, or the connection was dropped)

    def json(self) -> Any:
        return json.loads(self.body) if self.body.strip() else None


def jackson_json(value: Any, level: int = 0) -> str:
    """JSON as BookKeeper's JsonUtil writes it (Jackson's DefaultPrettyPrinter)."""
    pad = "  "
    if isinstance(value, dict):
        if not value:
            return "{ }"
        items = [f"\n{pad * (level + 1)}{json.dumps(k)} : {jackson_json(v, level + 1)}" for k, v in value.items()]
        return "{" + ",".join(items) + f"\n{pad * level}" + "}"
    if isinstance(value, list):
        return "[ " + ", ".join(jackson_json(v, level) for v in value) + " ]" if value else "[ ]"
    return json.dumps(value)


def _java_bool(value: Any) -> bool:
    """Boolean.parseBoolean(value.toString())."""
    text = "true" if value is True else "false" if value is False else str(value)
    return text.lower() == "true"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a caller that gave up (timeout) or a connection cut by stop(): nothing to report


class BookieHttpServer:
    """A bookie's HTTP service on a free loopback port. `state` is a `BookieState` the test changes while it runs
    (under `lock` when a GC may run); see the module docstring for the endpoints and the fault knobs."""

    def __init__(self, state: BookieState | None = None, *, on_gc: OnGc | None = None, gc_duration_s: float = 0.2,
                 require_header: tuple[str, str] | None = None, delay_s: float = 0.0,
                 status_for: dict[str, int | tuple[int, str]] | None = None,
                 tls: tuple[str, str] | None = None) -> None:
        self.state = state or BookieState()
        self.on_gc: OnGc = on_gc or simulate_gc
        self.gc_duration_s = gc_duration_s
        self.require_header = require_header
        self.delay_s = delay_s
        self.status_for: dict[str, int | tuple[int, str]] = dict(status_for or {})
        self.raw_for: dict[str, bytes] = {}
        self.drip_for: dict[str, float] = {}
        self.metrics_padding = 0
        self.metrics_extra = ""
        self.tls = tls
        self.requests: list[BookieRequest] = []
        self.gc_runs: list[tuple[bool, bool]] = []  # (force_major, force_minor) of each GC that ran on_gc
        self.gc_errors: list[BaseException] = []
        self.lock = threading.RLock()
        self._generation = 0  # bumped by restart(): a GC started before it does not land after it
        self._gc_threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> BookieHttpServer:
        if self._server is not None:
            return self
        self._server = _Server(("127.0.0.1", self.port), self._handler_class())
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"bookie-http-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listening socket and every open connection: callers get connection refused (or a reset)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self.lock:
            conns, self._connections = set(self._connections), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    close = stop

    @property
    def stopped(self) -> bool:
        return self._server is None

    @stopped.setter
    def stopped(self, value: bool) -> None:
        if value:
            self.stop()
        else:
            self.start()  # the same port again

    def __enter__(self) -> BookieHttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.wait_gc_idle(timeout_s=5)

    def restart(self) -> None:
        """A restarted bookie (same port, same disks): counters, compaction times, suspensions and the force flag
        start from zero; the active-entry-log gauge reads 0 until its first GC; what is pending stays pending."""
        with self.lock:
            self._generation += 1
            self.state.started_at_s = time.time()
            self.state.in_force_gc = False
            self.state.major_suspended = self.state.minor_suspended = False
            for d in self.state.dirs.values():
                d.reset_after_restart()

    def wait_gc_idle(self, timeout_s: float = 10.0) -> bool:
        """Wait until no simulated GC is running; whether none is."""
        deadline = time.monotonic() + timeout_s
        for thread in list(self._gc_threads):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._gc_threads)

    # -- the request log ---------------------------------------------------------------------------------------

    def requests_for(self, method: str | None = None, path: str | None = None) -> list[BookieRequest]:
        """The recorded requests with this method and path (the path without its query string)."""
        return [r for r in list(self.requests)
                if (method is None or r.method == method) and (path is None or r.path.split("?", 1)[0] == path)]

    @property
    def gc_puts(self) -> list[BookieRequest]:
        return self.requests_for("PUT", GC)

    # -- the bookie --------------------------------------------------------------------------------------------

    def _trigger_gc(self, force_major: bool, force_minor: bool) -> None:
        with self.lock:
            if self.state.in_force_gc:  # enableForceGC's compareAndSet(false, true) fails: nothing happens
                return
            self.state.in_force_gc = True
            ran = compaction_that_runs(force_major, force_minor)
            for _, d in self.state.dir_states():
                d.major_compacting, d.minor_compacting = ran == "major", ran == "minor"
            generation = self._generation

        def run() -> None:
            time.sleep(self.gc_duration_s)
            with self.lock:
                if generation != self._generation:
                    return  # the bookie restarted meanwhile
                try:
                    self.gc_runs.append((force_major, force_minor))
                    self.on_gc(self.state, force_major, force_minor)
                except BaseException as e:  # recorded for the test; the bookie goes on
                    self.gc_errors.append(e)
                finally:
                    for d in self.state.dirs.values():
                        d.major_compacting = d.minor_compacting = False
                    self.state.in_force_gc = False

        thread = threading.Thread(target=run, name=f"bookie-gc-{self.port}", daemon=True)
        self._gc_threads = [t for t in self._gc_threads if t.is_alive()] + [thread]
        thread.start()

    def metrics_text(self) -> str:
        s = self.state
        out, typed = [PREAMBLE], set()

        def sample(name: str, kind: str, labels: str, value: int) -> None:
            if name not in typed:
                typed.add(name)
                out.append(f"# TYPE {name} {kind}\n")
            out.append(f"{name}{{{labels}}} {value}\n")

        def labels(ledger_dir: str) -> str:
            return f'indexDir="{s.index_dir or ledger_dir}",ledgerDir="{ledger_dir}"'

        # writeAllMetrics: every gauge, then every counter; per dir, so one name's samples are not adjacent.
        for kind in ("gauge", "counter"):
            for ledger_dir, d in s.dir_states():
                for attr, name in METRIC_NAMES.items():
                    if (attr in GAUGES) == (kind == "gauge"):
                        value = 0 if attr in GAUGES and d.gauge_stale else getattr(d, attr)
                        sample(name, kind, labels(ledger_dir), value)
                for name, (other_kind, value) in OTHER_DIR_METRICS.items():
                    if other_kind == kind:
                        sample(name, kind, labels(ledger_dir), value)
        # StandardExports' gauge as PrometheusTextFormat writes it: `{}` always, Java's Double.toString.
        out.append(f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds{{}} "
                   f"{s.started_at_s / 1e9:.12f}E9\n")
        out.append(self.metrics_extra)
        if self.metrics_padding:
            line = "# " + "x" * 1021 + "\n"
            out.append(line * (self.metrics_padding // len(line) + 1))
        return "".join(out)

    def gc_details(self) -> list[dict[str, Any]]:
        s = self.state
        return [{
            "forceCompacting": s.in_force_gc,
            "majorCompacting": d.major_compacting,
            "minorCompacting": d.minor_compacting,
            "lastMajorCompactionTime": d.last_major_compaction_time,
            "lastMinorCompactionTime": d.last_minor_compaction_time,
            "lastEntryLocationCompactionTime": d.last_entry_location_compaction_time,
            "majorCompactionCounter": d.major_compactions,
            "minorCompactionCounter": d.minor_compactions,
            "entryLocationCompactionCounter": d.entry_location_compactions,
        } for _, d in s.dir_states()]

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, str], str]:
        """The bookie's answer to one request (faults and auth aside)."""
        route = path.split("?", 1)[0]
        routes = {METRICS: self._metrics, BOOKIE_INFO: self._info, GC_DETAILS: self._gc_details, GC: self._gc,
                  SUSPEND: self._suspend, RESUME: self._resume, STATE: self._state, SERVER_CONFIG: self._config}
        if route not in routes:
            return 404, {"Content-Type": "text/html; charset=utf-8"}, \
                "<html><body><h1>Resource not found</h1></body></html>"
        if method not in ROUTED_METHODS:
            return 405, {}, "Method Not Allowed"
        with self.lock:
            return routes[route](method, body.decode("utf-8", "replace"))

    def _metrics(self, method: str, body: str) -> tuple[int, dict[str, str], str]:
        if method != "GET":
            return 403, {}, f"{method} is forbidden. Should be GET method"
        return 200, {"Content-Type": PROMETHEUS_CONTENT_TYPE}, self.metrics_text()

    def _state(self, method: str, body: str) -> tuple[int, dict[str, str], str]:
        if method != "GET":
            return 404, {}, "Not found method. Should be GET method"
        return 200, {}, jackson_json({"running": True, "readOnly": self.state.read_only, "shuttingDown": False,
                                      "availableForHighPriorityWrites": True})

    def _config(self, method: str, body: str) -> tuple[int, dict[str, str], str]:
        if method != "GET":
            return 405, {}, "Not allowed method"
        return 200, {}, jackson_json({"gcWaitTime": str(self.state.gc_wait_ms), "httpServerEnabled": "true"})

    def _info(self, method: str, body: str) -> tuple[int, dict[str, str], str]:
        if method != "GET":
            return 404, {}, "Only GET is supported."
        return 200, {}, jackson_json({"freeSpace": self.state.free_space, "totalSpace": self.state.total_space})

    def _gc_details(self, method: str, body: str) -> tuple[int, dict[str, str], str]:
        if method != "GET":
            return 404, {}, ("Only support GET method to retrieve GC details. If you want to trigger gc, send a POST"
                             " to gc endpoint.")
        return 200, {}, jackson_json(self.gc_details())

    def _gc(self, method: str, body: str) -> tuple[int, dict[str, str], str]:
        s = self.state
        if method == "PUT":
            if not body.strip():
                force_major, force_minor = not s.major_suspended, not s.minor_suspended  # forceGC()
            else:
                try:
                    config = json.loads(body)
                    if not isinstance(config, dict):
                        raise ValueError(f"not a JSON object: {body!r}")
                except ValueError as e:
                    return 400, {}, f"Failed to handle the request, exception: {e}"
                force_major = _java_bool(config.get("forceMajor", not s.major_suspended))
                force_minor = _java_bool(config.get("forceMinor", not s.minor_suspended))
            self._trigger_gc(force_major, force_minor)
            return 200, {}, jackson_json(f"Triggered GC on BookieServer: {s.bookie_id}")
        if method == "GET":
            return 200, {}, jackson_json({"is_in_force_gc": "true" if s.in_force_gc else "false"})
        return 405, {}, "Not allowed method. Should be PUT to trigger GC, Or GET to get Force GC state."

    def _suspend(self, method: str, body: str) -> tuple[int, dict[str, str], str]:
        s = self.state
        if method == "GET":
            return 200, {}, jackson_json({"isMajorGcSuspended": str(s.major_suspended).lower(),
                                          "isMinorGcSuspended": str(s.minor_suspended).lower()})
        if method != "PUT":
            return 404, {}, ("Not found method. Should be PUT to suspend major or minor compaction, Or GET to get "
                             "compaction state.")
        return self._suspend_or_resume(body, "suspend", True)

    def _resume(self, method: str, body: str) -> tuple[int, dict[str, str], str]:
        if method != "PUT":
            return 404, {}, ("Not found method. Should be PUT to resume major or minor compaction, Or GET to get "
                             "compaction state.")
        return self._suspend_or_resume(body, "resume", False)

    def _suspend_or_resume(self, body: str, verb: str, suspended: bool) -> tuple[int, dict[str, str], str]:
        if not body:
            return 400, {}, "Empty request body"
        try:
            config = json.loads(body)
        except ValueError as e:
            return 500, {}, f"Internal error: {e}"
        major, minor = config.get(f"{verb}Major"), config.get(f"{verb}Minor")
        if major is None and minor is None:
            return 400, {}, f"No {verb}Major or {verb}Minor params found"
        out = ""
        if major:
            self.state.major_suspended = suspended
            out = f"{verb.capitalize()} majorGC on BookieServer: {self.state.bookie_id}"
        if minor:
            self.state.minor_suspended = suspended
            out += f", {verb.capitalize()} minorGC on BookieServer: {self.state.bookie_id}"
        return 200, {}, jackson_json(out)

    # -- HTTP --------------------------------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as Vert.x

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with server_self.lock:
                    server_self._connections.add(self.connection)

            def finish(self) -> None:
                with server_self.lock:
                    server_self._connections.discard(self.connection)
                with contextlib.suppress(OSError):
                    super().finish()

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = BookieRequest(self.command, self.path, body, dict(self.headers.items()), time.time(),
                                        time.monotonic())
                server_self.requests.append(request)
                if server_self.delay_s:
                    time.sleep(server_self.delay_s)
                if server_self.stopped:  # stopped while this request waited: nobody answers
                    self.close_connection = True
                    return
                route = self.path.split("?", 1)[0]
                raw = server_self.raw_for.get(route)
                if raw is not None:  # a broken answer, exactly these bytes, then the connection closes
                    request.status = 0
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.wfile.write(raw)
                        self.wfile.flush()
                    return
                status, headers, text = server_self._answer_with_faults(request)
                payload = text.encode()
                request.status = status
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(payload))}.items():
                    self.send_header(key, value)
                self.end_headers()
                drip = server_self.drip_for.get(route)
                if drip is not None and self.command != "HEAD":
                    with contextlib.suppress(OSError):
                        for byte in payload:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(drip)
                            if server_self.stopped:
                                break
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(payload)
                self.wfile.flush()

            def __getattr__(self, name: str) -> Any:
                if name.startswith("do_"):
                    return self._handle  # every method, known to http.server or not
                raise AttributeError(name)

        return Handler

    def _answer_with_faults(self, request: BookieRequest) -> tuple[int, dict[str, str], str]:
        if self.require_header is not None:
            name, value = self.require_header
            if request.headers.get(name) != value and {k.lower(): v for k, v in request.headers.items()}.get(
                    name.lower()) != value:
                return 401, {"WWW-Authenticate": "Bearer"}, "Unauthorized"
        forced = self.status_for.get(request.path.split("?", 1)[0], self.status_for.get(request.path))
        if forced is not None:
            code, text = forced if isinstance(forced, tuple) else (forced, f"status {forced} scripted by the test")
            return code, {}, text
        return self.answer(request.method, request.path, request.body)


__all__ = [
    "GAUGES",
    "GC",
    "GC_DETAILS",
    "METRICS",
    "METRIC_NAMES",
    "BookieHttpServer",
    "BookieRequest",
    "BookieState",
    "LedgerDirState",
    "compaction_that_runs",
    "jackson_json",
    "simulate_gc",
]
