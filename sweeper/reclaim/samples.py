"""One bookie's disk-reclaim counters at one instant, read from what its HTTP server answers (pure parsing).

The counters are BookKeeper's own (`GarbageCollectorStats`, names from `BookKeeperServerStats`, BookKeeper 4.17):
- `RECLAIMED_DELETION_SPACE_BYTES`: entry logs the garbage collector removed whole, because every ledger in them
  was deleted (`GarbageCollectorThread.doGcEntryLogs`);
- `RECLAIMED_COMPACTION_SPACE_BYTES`: dead bytes a compaction dropped while rewriting a log shared with live data;
- `ACTIVE_ENTRY_LOG_SPACE_BYTES`: a gauge, the bytes of the entry logs the collector tracks;
- `DELETED_LEDGER_TOTAL`, `MAJOR_COMPACTION_TOTAL`, `MINOR_COMPACTION_TOTAL`.
DbLedgerStorage exports one series per ledger directory (label `ledgerDir`) under the `bookie_` scope; the other
storages export them under `bookie_gc_`. Every series of a name is summed: the bookie is the unit we report on.

Also read: `process_start_time_seconds` (the JVM's start, which PrometheusMetricsProvider exports through the Prometheus
client's StandardExports by default): a restart between two samples is told by it even when the counters have
grown past their old values since. BookKeeper writes its counters as longs (`LongAdderCounter.get`), never Inf or
NaN: a counter that is not a finite number is an answer we cannot read, and the bookie is not measured.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from sweeper.reclaim.errors import BookieAnswerError

# Our field -> the metric's name after its `bookie_` (and `gc_`) scope.
COUNTERS = {
    "deletion_bytes": "RECLAIMED_DELETION_SPACE_BYTES",
    "compaction_bytes": "RECLAIMED_COMPACTION_SPACE_BYTES",
    "deleted_ledgers": "DELETED_LEDGER_TOTAL",
    "major_compactions": "MAJOR_COMPACTION_TOTAL",
    "minor_compactions": "MINOR_COMPACTION_TOTAL",
}
GAUGES = {"active_log_bytes": "ACTIVE_ENTRY_LOG_SPACE_BYTES"}
_SCOPES = ("bookie_gc_", "bookie_")
PROCESS_START = "process_start_time_seconds"


@dataclass(frozen=True)
class BookieSample:
    """What one bookie said at `sampled_at`; `error` set (and the numbers None) when it could not be measured."""

    bookie_id: str
    sampled_at: datetime
    url: str = ""
    found_by: str = ""
    readonly: bool = False
    error: str = ""
    deletion_bytes: int | None = None
    compaction_bytes: int | None = None
    active_log_bytes: int | None = None
    deleted_ledgers: int | None = None
    major_compactions: int | None = None
    minor_compactions: int | None = None
    ledger_dirs: int = 0  # how many ledger directories reported the counters
    free_bytes: int | None = None
    total_bytes: int | None = None
    in_force_gc: bool | None = None
    compacting: bool | None = None  # a major or minor compaction is running now
    major_suspended: bool | None = None
    minor_suspended: bool | None = None
    notes: tuple[str, ...] = field(default=())
    started_at_s: float | None = None  # process_start_time_seconds: when the bookie's JVM started
    gc_wait_ms: int | None = None  # the bookie's gcWaitTime (its server config): how often its collector runs

    @property
    def measured(self) -> bool:
        return not self.error and self.deletion_bytes is not None and self.compaction_bytes is not None

    def failed(self, error: str) -> BookieSample:
        return replace(self, error=error)

    def as_row(self, run_id: str, phase: str) -> dict[str, Any]:
        row = asdict(self)
        row["notes"] = list(self.notes)
        return {"run_id": run_id, "phase": phase, **row}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> BookieSample:
        fields = {k: v for k, v in row.items() if k in cls.__dataclass_fields__}
        fields["notes"] = tuple(row.get("notes") or ())
        fields["error"] = fields.get("error") or ""
        return cls(**fields)

    def restarted_since(self, earlier: BookieSample) -> bool | None:
        """Whether the bookie's process started again between `earlier` and this sample (None: cannot tell)."""
        if self.started_at_s is None or earlier.started_at_s is None:
            return None
        return abs(self.started_at_s - earlier.started_at_s) > 1.0


def _metric_key(name: str, wanted: dict[str, str]) -> str | None:
    for scope in _SCOPES:
        if name.startswith(scope):
            bare = name[len(scope):]
            for key, metric in wanted.items():
                if bare == metric:
                    return key
    return None


def parse_metrics(text: str) -> dict[str, Any]:
    """The reclaim counters in a bookie's /metrics text: {field: summed value}, plus `ledger_dirs`.

    Raises BookieAnswerError for text the Prometheus parser refuses; a counter the bookie does not export is left
    out (the caller says which are missing)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    dirs: set[str] = set()
    started: float | None = None
    wanted = {**COUNTERS, **GAUGES}
    try:
        for family in text_string_to_metric_families(text):
            if family.name == PROCESS_START:
                started = next((x.value for x in family.samples if math.isfinite(x.value) and x.value > 0), None)
                continue
            # The parser names a counter's samples `<family>_total` (and `_created`): match on the family's name.
            key = _metric_key(family.name, wanted)
            if key is None:
                continue
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                if not math.isfinite(sample.value) or (key in COUNTERS and sample.value < 0):
                    raise BookieAnswerError(f"/metrics gives {sample.name} = {sample.value}: BookKeeper writes its "
                                            "counters as non-negative whole numbers, its gauges as whole numbers")
                sums[key] = sums.get(key, 0.0) + sample.value
                if "ledgerDir" in sample.labels:
                    dirs.add(sample.labels["ledgerDir"])
    except ValueError as exc:  # the parser's refusal (BookieAnswerError is a ValueError too: kept as it is)
        if isinstance(exc, BookieAnswerError):
            raise
        raise BookieAnswerError(f"/metrics is not Prometheus text: {exc}") from exc
    out: dict[str, Any] = {key: round(value) for key, value in sums.items()}
    out["ledger_dirs"] = len(dirs) or (1 if sums else 0)
    if started is not None:
        out["started_at_s"] = started
    return out


def missing_counters(parsed: dict[str, Any]) -> list[str]:
    return [metric for key, metric in {**COUNTERS, **GAUGES}.items() if key not in parsed]


def parse_info(body: bytes) -> tuple[int, int]:
    """GET /api/v1/bookie/info (BookieInfoService): (freeSpace, totalSpace)."""
    data = _json(body, "/api/v1/bookie/info")
    try:
        return int(data["freeSpace"]), int(data["totalSpace"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BookieAnswerError(f"/api/v1/bookie/info answered {body[:200]!r}") from exc


def parse_gc_details(body: bytes) -> bool:
    """GET /api/v1/bookie/gc_details (GCDetailsService): whether any ledger dir's collector is compacting now."""
    data = _json(body, "/api/v1/bookie/gc_details")
    if not isinstance(data, list):
        raise BookieAnswerError(f"/api/v1/bookie/gc_details answered {body[:200]!r}, not a list")
    return any(bool(d.get(k)) for d in data if isinstance(d, dict)
               for k in ("forceCompacting", "majorCompacting", "minorCompacting"))


def parse_gc_state(body: bytes) -> bool:
    """GET /api/v1/bookie/gc (TriggerGCService): {"is_in_force_gc": "true"|"false"}."""
    data = _json(body, "/api/v1/bookie/gc")
    value = data.get("is_in_force_gc") if isinstance(data, dict) else None
    if str(value).lower() not in ("true", "false"):
        raise BookieAnswerError(f"/api/v1/bookie/gc answered {body[:200]!r}")
    return str(value).lower() == "true"


def parse_suspended(body: bytes) -> tuple[bool, bool]:
    """GET /api/v1/bookie/gc/suspend_compaction (SuspendCompactionService): (major suspended, minor suspended)."""
    data = _json(body, "/api/v1/bookie/gc/suspend_compaction")
    try:
        return (str(data["isMajorGcSuspended"]).lower() == "true", str(data["isMinorGcSuspended"]).lower() == "true")
    except (KeyError, TypeError) as exc:
        raise BookieAnswerError(f"/api/v1/bookie/gc/suspend_compaction answered {body[:200]!r}") from exc


def parse_state(body: bytes) -> bool:
    """GET /api/v1/bookie/state (BookieStateService): whether the bookie is read-only now (`readOnly`)."""
    data = _json(body, "/api/v1/bookie/state")
    value = data.get("readOnly") if isinstance(data, dict) else None
    if not isinstance(value, bool):
        raise BookieAnswerError(f"/api/v1/bookie/state answered {body[:200]!r}")
    return value


def parse_gc_wait_ms(body: bytes) -> int | None:
    """GET /api/v1/config/server_config (ConfigurationService): the bookie's `gcWaitTime` in ms, None when it does
    not say (its collector then runs at an unknown pace)."""
    data = _json(body, "/api/v1/config/server_config")
    try:
        value = int(str(data.get("gcWaitTime"))) if isinstance(data, dict) and "gcWaitTime" in data else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def _json(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BookieAnswerError(f"{what} answered {body[:200]!r}, not JSON") from exc
