"""The reclaim step: sample the bookies before an executed delete, and after it measure what they gave back.

`sample_before` runs right before the delete stage deletes (the sweep with `--execute`, `sweeper delete
--execute`); `run_reclaim` right after it, and again whenever `sweeper reclaim --run-id RUN` asks. With `trigger`
(the sweep's `[reclaim] trigger_gc = true`, or `sweeper reclaim --execute`) it first asks each bookie that held
deleted data for one GC, one bookie at a time, at most once per bookie per run for each kind of GC (a stronger
compaction may follow a weaker one, nothing repeats), and waits for it.

A bookie that does not answer is `not_measured`: nothing here fails a run (DESIGN.md invariant 20). Every call is
paced (`[reclaim] calls_per_second`) and time-limited (`timeout_s`), and a GC is the only thing ever asked of a
bookie.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from sweeper import runs
from sweeper.config import ReclaimConfig, SweeperConfig
from sweeper.connections import Connections
from sweeper.reclaim.bookie_http import BookieHttp
from sweeper.reclaim.decide import (
    FREED,
    MAJOR,
    MINOR,
    NOT_MEASURED,
    PENDING_COMPACTION,
    PENDING_GC,
    RESTARTED,
    SHARED_WINDOW,
    UNKNOWN,
    DeletedLedger,
    Expected,
    collection_seen,
    expected_shares,
    gc_confirmed,
    gc_level,
    gc_plan,
    verdict,
)
from sweeper.reclaim.discovery import BookieTarget, Registration, locate, parse_overrides, read_registrations
from sweeper.reclaim.errors import BookieAnswerError, BookieUnreachable
from sweeper.reclaim.samples import BookieSample
from sweeper.table_schemas import BOOKIE_SAMPLES, RECLAIM, RECLAIM_JOURNAL
from sweeper.tables import TableStore

BEFORE, AFTER = "before", "after"
# reclaim_journal phases: the intent before each PUT, then how it ended.
INTENT, DONE, FAILED_PHASE, IGNORED = "intent", "done", "failed", "ignored"
LEDGER = "LEDGER"
OFFLOAD_LEDGER = "OFFLOAD_LEDGER"


@dataclass(frozen=True)
class ReclaimCounts(runs.StageCounts):
    bookies: int = 0  # bookies that held deleted data
    measured: int = 0
    freed: int = 0
    pending_compaction: int = 0
    pending_gc: int = 0
    shared_window: int = 0
    restarted: int = 0
    unknown: int = 0
    not_measured: int = 0
    gc_triggered: int = 0
    offload_buckets: int = 0
    expected_bytes: int = runs.count("bytes.expected")
    freed_bytes: int = runs.count("bytes.freed")  # provably this run's (lower bound)
    freed_upper_bytes: int = runs.count("bytes.freed_upper")  # at most this run's
    pending_bytes: int = runs.count("bytes.pending")
    offload_freed_bytes: int = runs.count("bytes.offload_freed")


@dataclass
class ReclaimResult:
    run_id: str
    counts: ReclaimCounts
    duration_s: float
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def line(self) -> str:
        """The run's summary line; a property so the report's renderers read it without importing reclaim (which
        imports the report package: a circle between the packages)."""
        return summary_line(self.rows)


@dataclass(frozen=True)
class ReclaimSettings:
    """What reclaim reads of the config, narrowed once (the stage contract of issue 46), with the run's own choice:
    whether to ask each bookie that held deleted data for a GC first (`trigger`)."""

    reclaim: ReclaimConfig
    connections: Connections
    ledgers_root: str
    config_hash: str
    trigger: bool = False
    log: Callable[[str], None] = field(default=print, compare=False, repr=False)

    @classmethod
    def from_config(cls, config: SweeperConfig, *, trigger: bool = False,
                    log: Callable[[str], None] = print) -> ReclaimSettings:
        return cls(config.reclaim, Connections.from_config(config), config.bookkeeper_store().ledgers_root,
                   config.hash(), trigger, log)

    def hash(self) -> str:
        return self.config_hash


def _targets(settings: ReclaimSettings, registrations: dict[str, Registration], bookie_ids: Iterable[str],
             problem: str = "") -> dict[str, BookieTarget]:
    """Each bookie's HTTP server; with the registrations unreadable (`problem`), that is why a bookie the config
    does not name has none (not "not registered")."""
    overrides = parse_overrides(settings.reclaim.http_urls)
    out = {b: locate(b, registrations.get(b), overrides, settings.reclaim.http_port, settings.reclaim.http_scheme)
           for b in sorted(set(bookie_ids))}
    if problem:
        out = {b: t if t.reachable else replace(t, why=problem) for b, t in out.items()}
    return out


def _registrations(settings: ReclaimSettings) -> tuple[dict[str, Registration], str]:
    """The bookies registered now; ("", why) when the metadata store cannot be read (the bookies are then only
    those the deleted ledgers name, and each may still be reached through [reclaim] http_urls)."""
    try:
        with settings.connections.bookkeeper.session() as client:
            return read_registrations(client, settings.ledgers_root), ""
    except Exception as exc:  # a metadata outage makes this step report, never fail
        return {}, f"bookie registrations unreadable: {exc}"


def sample_before(config: SweeperConfig, store: TableStore, run_id: str, log: Callable[[str], None] = print) -> int:
    """`baseline` from a whole config (tests and notebooks)."""
    return baseline(store, run_id, ReclaimSettings.from_config(config, log=log))


def baseline(store: TableStore, run_id: str, settings: ReclaimSettings) -> int:
    """Sample every registered bookie, and every bookie `[reclaim] http_urls` names, before the run deletes (the
    first such sample of a run is kept: it is the baseline). Returns how many bookies answered."""
    if not settings.reclaim.enabled:
        return 0
    if store.exists("bookie_samples") and store.read_arrow(
            "bookie_samples", where={"run_id": run_id, "phase": BEFORE}, columns=["bookie_id"]).num_rows:
        return 0
    registrations, problem = _registrations(settings)
    named = {b for b in parse_overrides(settings.reclaim.http_urls) if b != "*"}
    if problem:
        settings.log(f"[reclaim] {problem}: only the bookies [reclaim] http_urls names can be measured")
    http = BookieHttp(settings.reclaim)
    deadline = _Deadline(settings.reclaim.deadline_s)
    samples = []
    for target in _targets(settings, registrations, set(registrations) | named, problem).values():
        sample = BookieSample(target.bookie_id, datetime.now(UTC), url=target.url, found_by=target.found_by)
        # Each bookie on its own: whatever one answers is its own sample, never the others' baseline lost.
        samples.append(deadline.passed(sample) if deadline.left() <= 0 else http.sample(target, with_config=True))
    _append_samples(store, run_id, BEFORE, samples)
    return sum(s.measured for s in samples)


def _append_samples(store: TableStore, run_id: str, phase: str, samples: list[BookieSample]) -> None:
    if samples:
        store.append_rows("bookie_samples", [s.as_row(run_id, phase) for s in samples], BOOKIE_SAMPLES,
                          commit_metadata={"run_id": run_id, "phase": phase})


def _read_samples(store: TableStore, run_id: str, phase: str) -> dict[str, BookieSample]:
    if not store.exists("bookie_samples"):
        return {}
    rows = store.read_arrow("bookie_samples", where={"run_id": run_id, "phase": phase}).to_pylist()
    out: dict[str, BookieSample] = {}
    for row in sorted(rows, key=lambda r: r["sampled_at"]):
        out.setdefault(row["bookie_id"], BookieSample.from_row(row))  # the first is the baseline
    return out


def deleted_ledgers(store: TableStore, run_id: str) -> tuple[list[DeletedLedger], list[dict[str, Any]]]:
    """The run's executed deletes: BookKeeper ledgers (with their layout) and offloaded copies.

    A ledger's layout is the one its `delete_results` row carries from the run's plan (issue 46: reconcile read it in
    the run's snapshot); a row that carries none (an older version's, an operator's list, a retry) is looked up in
    `bk_ledgers` as before (`_snapshot_layouts`)."""
    if not store.exists("delete_results"):
        return [], []
    results = store.read_arrow("delete_results", where={"run_id": run_id, "outcome": "deleted", "dry_run": False},
                               columns=["ledger_id", "ledger_type", "s3_bucket", "s3_keys", "carried",
                                        "bk_layout"]).to_pylist()
    ids = sorted({r["ledger_id"] for r in results if r["ledger_type"] != OFFLOAD_LEDGER and r["ledger_id"] is not None})
    objects = [r for r in results if r["ledger_type"] == OFFLOAD_LEDGER and r["s3_keys"]]
    ledgers: dict[int, dict[str, Any]] = {}
    wanted = set(ids)
    for r in results:
        if r["ledger_id"] in wanted and r["carried"] and r["bk_layout"] is not None:  # an offloaded copy has none
            ledgers.setdefault(r["ledger_id"], r["bk_layout"])
    ledgers.update(_snapshot_layouts(store, [i for i in ids if i not in ledgers]))
    return [_deleted_ledger(i, r) for i, r in sorted(ledgers.items())], objects


def _snapshot_layouts(store: TableStore, ids: list[int]) -> dict[int, dict[str, Any]]:
    """Each ledger's layout as the latest snapshot of any run saw it: for deletes whose rows carry none."""
    ledgers: dict[int, dict[str, Any]] = {}
    if ids and store.exists("bk_ledgers"):
        for row in store.read_arrow("bk_ledgers", where={"ledger_id": ids},
                                    columns=["ledger_id", "captured_at", "length", "ensemble_size", "write_quorum",
                                             "bookies", "state", "last_entry_id", "segment_first_entries",
                                             "segment_ensembles"]).to_pylist():
            seen = ledgers.get(row["ledger_id"])
            if seen is None or row["captured_at"] > seen["captured_at"]:
                ledgers[row["ledger_id"]] = row
    return ledgers


def _deleted_ledger(ledger_id: int, row: dict[str, Any]) -> DeletedLedger:
    firsts, ensembles = row.get("segment_first_entries") or (), row.get("segment_ensembles") or ()
    segments = tuple((int(f), tuple(e or ())) for f, e in zip(firsts, ensembles, strict=False))
    return DeletedLedger(ledger_id, int(row["length"] or 0), int(row["ensemble_size"] or 0),
                         int(row["write_quorum"] or 0), tuple(row["bookies"] or ()),
                         closed=row.get("state") == "CLOSED",
                         last_entry_id=None if row.get("last_entry_id") is None else int(row["last_entry_id"]),
                         segments=segments)


def _deletes_ended(store: TableStore, run_id: str) -> datetime | None:
    """When the run's last executed delete was recorded (the driver's clock): collection passes after it saw them."""
    if not store.exists("delete_results"):
        return None
    found = store.aggregate_arrow("delete_results", ["run_id"], [("finished_at", "max")],
                                  where={"run_id": run_id, "outcome": "deleted", "dry_run": False}).to_pylist()
    return found[0]["finished_at_max"] if found else None


@dataclass
class _Triggered:
    """What this run asked of each bookie before, from its journal (intents are written before each PUT, so a
    killed run's request counts too)."""

    level: dict[str, int] = field(default_factory=dict)  # the strongest GC it may have run for this run
    done: set[str] = field(default_factory=set)  # bookies where a GC this run asked is known to have run


def _triggered(store: TableStore, run_id: str) -> _Triggered:
    """An intent counts unless its outcome says the bookie ignored the PUT (it answers 200 while a forced GC it did
    not start still runs): that GC may be asked again."""
    found = _Triggered()
    if not store.exists("reclaim_journal"):
        return found
    rows = store.read_arrow("reclaim_journal", where={"run_id": run_id},
                            columns=["bookie_id", "at", "phase", "force_major", "force_minor"]).to_pylist()
    pending: dict[str, int] = {}
    for r in sorted(rows, key=lambda r: r["at"]):
        bookie, level = r["bookie_id"], gc_level(bool(r["force_major"]), bool(r["force_minor"]))
        if r["phase"] == INTENT:
            pending[bookie] = level
            continue
        asked = pending.pop(bookie, None)
        if r["phase"] == IGNORED or asked is None:
            continue
        found.level[bookie] = max(asked, found.level.get(bookie, asked))
        if r["phase"] == DONE:
            found.done.add(bookie)
    for bookie, level in pending.items():  # no outcome: the run stopped after the PUT may have been sent
        found.level[bookie] = max(level, found.level.get(bookie, level))
    return found


def _journal(store: TableStore, run_id: str, bookie: str, phase: str, level: int, detail: str) -> None:
    store.append_rows("reclaim_journal", [{"run_id": run_id, "bookie_id": bookie, "at": datetime.now(UTC),
                                           "phase": phase, "force_major": level >= MAJOR,
                                           "force_minor": level >= MINOR, "detail": detail}], RECLAIM_JOURNAL,
                      commit_metadata={"run_id": run_id})


def _wait_for_gc(http: BookieHttp, target: BookieTarget, timeout_s: float, poll_s: float,
                 sleep: Callable[[float], None] = time.sleep) -> tuple[bool, float, bool]:
    """Poll the bookie until neither a forced GC nor a compaction runs (or the timeout): (finished, seconds, whether
    it was seen running)."""
    t0 = time.monotonic()
    seen = False
    sleep(min(poll_s, 0.5))  # the PUT only queues the GC on the collector's thread
    while time.monotonic() - t0 < timeout_s:
        try:
            if not http.busy(target):
                return True, time.monotonic() - t0, seen
            seen = True
        except (BookieUnreachable, BookieAnswerError):
            pass
        sleep(poll_s)
    return False, time.monotonic() - t0, seen


class _Deadline:
    """The whole step's deadline ([reclaim] deadline_s): a bookie reached after it is not measured, never waited on."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def passed(self, sample: BookieSample) -> BookieSample:
        return sample.failed(f"not reached: the reclaim step's [reclaim] deadline_s ({self.seconds:.0f}s) had passed")


def run_reclaim(config: SweeperConfig, store: TableStore, run_id: str, trigger: bool = False,
                log: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep) -> ReclaimResult:
    """`run` from a whole config (tests and notebooks)."""
    return run(store, run_id, ReclaimSettings.from_config(config, trigger=trigger, log=log), sleep)


def run(store: TableStore, run_id: str, settings: ReclaimSettings,
        sleep: Callable[[float], None] = time.sleep) -> ReclaimResult:
    t0 = time.monotonic()
    trigger, log = settings.trigger, settings.log
    deadline = _Deadline(settings.reclaim.deadline_s)
    ledgers, objects = deleted_ledgers(store, run_id)
    shares = expected_shares(ledgers)
    before = _read_samples(store, run_id, BEFORE)
    registrations, problem = _registrations(settings)
    targets = _targets(settings, registrations, set(shares) | set(before), problem)
    http = BookieHttp(settings.reclaim)
    triggered = _triggered(store, run_id)
    deletes_ended = _deletes_ended(store, run_id)
    now: dict[str, BookieSample] = {}
    actions: dict[str, tuple[str, str, float | None, bool | None]] = {}
    gc_count = 0
    for bookie in sorted(shares):
        target = targets[bookie]
        base = BookieSample(bookie, datetime.now(UTC), url=target.url, found_by=target.found_by)
        if deadline.left() <= 0:
            now[bookie], actions[bookie] = deadline.passed(base), ("none", "", None, None)
            continue
        # Read right before its PUT: a bookie that went read-only or suspended its compaction since the step began
        # (or since the sample before the delete, minutes ago) gets what it allows now.
        sample = http.sample(target)
        plan = gc_plan(sample, shares[bookie], trigger, settings.reclaim.compaction, triggered.level.get(bookie))
        if not plan.trigger:
            now[bookie], actions[bookie] = sample, (plan.action, plan.why, None, None)
            continue
        _journal(store, run_id, bookie, INTENT, plan.level, plan.action)
        try:
            http.trigger_gc(target, plan.body)
        except BookieUnreachable as exc:
            _journal(store, run_id, bookie, FAILED_PHASE, plan.level, str(exc))
            now[bookie], actions[bookie] = http.sample(target), ("gc request failed", str(exc), None, None)
            continue
        gc_count += 1
        wait = max(0.0, min(settings.reclaim.gc_timeout_s, deadline.left()))
        log(f"[reclaim] {bookie}: {plan.action} requested; waiting for it (at most {wait:.0f}s)")
        finished, seconds, seen = _wait_for_gc(http, target, wait, settings.reclaim.gc_poll_s, sleep)
        after = http.sample(target)
        if finished and not gc_confirmed(sample, after, seen):
            _journal(store, run_id, bookie, IGNORED, plan.level,
                     "answered, but not seen running and no counter moved: the bookie may have ignored it (a forced "
                     "GC of its own was running); a later `reclaim --execute` may ask again")
            actions[bookie] = (plan.action, _join(plan.why, "the GC was not seen to run: maybe ignored by the bookie"),
                               round(seconds, 2), None)
        else:
            _journal(store, run_id, bookie, DONE if finished else FAILED_PHASE, plan.level,
                     f"finished in {seconds:.1f}s" if finished else f"still running after {seconds:.0f}s")
            if finished:
                triggered.done.add(bookie)
            actions[bookie] = (plan.action, plan.why, round(seconds, 2), finished)
        now[bookie] = after
    _append_samples(store, run_id, AFTER, [now[b] for b in sorted(now)])
    measured_at = datetime.now(UTC)
    rows = []
    for bookie in sorted(shares):
        b, a = before.get(bookie), now.get(bookie)
        seen_pass = b is not None and a is not None and collection_seen(bookie in triggered.done, b, a, deletes_ended)
        rows.append(_bookie_row(run_id, measured_at, bookie, targets[bookie], shares[bookie], b, a, actions[bookie],
                                settings.reclaim.freed_fraction, seen_pass))
    rows += _offload_rows(settings, store, run_id, measured_at, objects)
    if rows:
        store.append_rows("reclaim", rows, RECLAIM, commit_metadata={"run_id": run_id})
    return ReclaimResult(run_id, _counts(rows, gc_count), time.monotonic() - t0, rows)


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _bookie_row(run_id: str, measured_at: datetime, bookie: str, target: BookieTarget, expected: Expected,
                before: BookieSample | None, after: BookieSample | None,
                action: tuple[str, str, float | None, bool | None], freed_fraction: float,
                pass_seen: bool) -> dict[str, Any]:
    action_name, action_why, gc_seconds, finished = action
    judged, got = verdict(expected, before, after, freed_fraction, finished, pass_seen)
    why = _join(judged.why, action_why if action_name not in ("measured only",) else "")
    return {
        "run_id": run_id, "measured_at": measured_at, "target_kind": "bookie", "target": bookie,
        "url": target.url, "found_by": target.found_by, "expected_bytes": expected.bytes,
        "expected_ledgers": expected.ledgers,
        "freed_deletion_bytes": got.deletion if got else None,
        "freed_compaction_bytes": got.compaction if got else None,
        "freed_bytes": got.total if got else None,
        "active_log_delta_bytes": got.active_log_delta if got else None,
        "free_space_delta_bytes": got.free_space_delta if got else None,
        "pending_bytes": judged.pending_bytes, "verdict": judged.verdict, "why": why, "action": action_name,
        "gc_seconds": gc_seconds, "counter_reset": got.counter_reset if got else None,
        "freed_lower_bytes": judged.lower_bytes if got else None,
        "freed_upper_bytes": judged.upper_bytes if got else None,
        "others_collected": judged.others_collected if got else None,
        "collected_ledgers": got.deleted_ledgers if got else None,
        "unknown_ledgers": expected.unknown,
    }


def _offload_rows(settings: ReclaimSettings, store: TableStore, run_id: str, measured_at: datetime,
                  objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per bucket: the deleted objects' bytes, counted as freed once a HEAD finds each gone."""
    by_bucket: dict[str, set[str]] = {}
    for r in objects:
        by_bucket.setdefault(r["s3_bucket"], set()).update(r["s3_keys"] or ())
    rows = []
    for bucket, keys in sorted(by_bucket.items()):
        sizes: dict[str, int] = {}
        if store.exists("offload_objects"):
            for o in store.read_arrow("offload_objects", where={"bucket": bucket, "key": sorted(keys)},
                                      columns=["key", "size"]).to_pylist():
                sizes[o["key"]] = max(sizes.get(o["key"], 0), int(o["size"] or 0))
        expected = sum(sizes.values())
        row: dict[str, Any] = {"run_id": run_id, "measured_at": measured_at, "target_kind": "offload",
                               "target": bucket, "url": "", "found_by": "", "expected_bytes": expected,
                               "expected_ledgers": len(keys), "action": "measured only"}
        try:
            present, versioned = _objects_present(settings, bucket, keys)
        except Exception as exc:  # an object-store outage is reported, never a failed run
            rows.append({**row, "verdict": NOT_MEASURED, "pending_bytes": 0, "why": f"listing {bucket} failed: {exc}"})
            continue
        gone = sum(size for key, size in sizes.items() if key not in present)
        pending = expected - gone
        if versioned:
            verdict_, why = PENDING_GC, ("the bucket keeps versions: the deleted objects' bytes stay billed until a "
                                          "lifecycle rule expires noncurrent versions")
        elif present:
            verdict_, why = PENDING_GC, f"{len(present)} of the deleted objects are still listed"
        else:
            verdict_, why = FREED, ""
        rows.append({**row, "freed_deletion_bytes": gone, "freed_compaction_bytes": 0, "freed_bytes": gone,
                     "pending_bytes": pending, "verdict": verdict_, "why": why})
    return rows


def _objects_present(settings: ReclaimSettings, bucket: str, keys: set[str]) -> tuple[set[str], bool]:
    from botocore.exceptions import ClientError

    from sweeper.objectstore.s3 import S3Target

    client = settings.connections.s3(S3Target(bucket))
    present: set[str] = set()
    for key in sorted(keys):
        try:
            client.head_object(Bucket=bucket, Key=key)
            present.add(key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
    try:
        versioned = client.get_bucket_versioning(Bucket=bucket).get("Status") == "Enabled"
    except ClientError:
        versioned = False  # not allowed to ask: said nothing about versions
    return present, versioned


def _counts(rows: list[dict[str, Any]], gc_count: int) -> ReclaimCounts:
    bookies = [r for r in rows if r["target_kind"] == "bookie"]
    offload = [r for r in rows if r["target_kind"] == "offload"]
    return ReclaimCounts(
        bookies=len(bookies), measured=sum(r["verdict"] != NOT_MEASURED for r in bookies),
        freed=sum(r["verdict"] == FREED for r in bookies),
        pending_compaction=sum(r["verdict"] == PENDING_COMPACTION for r in bookies),
        pending_gc=sum(r["verdict"] == PENDING_GC for r in bookies),
        shared_window=sum(r["verdict"] == SHARED_WINDOW for r in bookies),
        restarted=sum(r["verdict"] == RESTARTED for r in bookies),
        unknown=sum(r["verdict"] == UNKNOWN for r in bookies),
        not_measured=sum(r["verdict"] == NOT_MEASURED for r in bookies), gc_triggered=gc_count,
        offload_buckets=len(offload),
        expected_bytes=sum(r["expected_bytes"] or 0 for r in bookies),
        freed_bytes=sum(_ours(r)[0] for r in bookies),
        freed_upper_bytes=sum(_ours(r)[1] for r in bookies),
        pending_bytes=sum(r["pending_bytes"] or 0 for r in bookies),
        offload_freed_bytes=sum(r["freed_bytes"] or 0 for r in offload))


def _ours(row: dict[str, Any]) -> tuple[int, int]:
    """(lower, upper) bound of what a bookie row says came back of this run's bytes. A row an older version wrote has
    no bounds: its capped freed bytes, as it reported them then."""
    if row.get("freed_lower_bytes") is None and row.get("freed_upper_bytes") is None:
        capped = min(row["freed_bytes"] or 0, row["expected_bytes"] or 0) if row["verdict"] != NOT_MEASURED else 0
        return capped, capped
    return int(row.get("freed_lower_bytes") or 0), int(row.get("freed_upper_bytes") or 0)


def latest_rows(store: TableStore, run_id: str) -> list[dict[str, Any]]:
    """The newest `reclaim` row per target of a run."""
    if not store.exists("reclaim"):
        return []
    newest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in store.read_arrow("reclaim", where={"run_id": run_id}).to_pylist():
        key = (row["target_kind"], row["target"])
        if key not in newest or row["measured_at"] > newest[key]["measured_at"]:
            newest[key] = row
    return [newest[k] for k in sorted(newest)]


def summary_line(rows: list[dict[str, Any]]) -> str:
    """The sweep summary's line: "bookies gave back 18.2 MiB of 20.0 MiB expected; 1.8 MiB waits for compaction on
    bookie-2"."""
    from sweeper.report.console import human_bytes

    bookies = [r for r in rows if r["target_kind"] == "bookie"]
    measured = [r for r in bookies if r["verdict"] != NOT_MEASURED]
    expected = sum(r["expected_bytes"] or 0 for r in measured)
    lower = sum(_ours(r)[0] for r in measured)
    upper = sum(_ours(r)[1] for r in measured)
    if measured:
        given = human_bytes(lower) if lower == upper else f"between {human_bytes(lower)} and {human_bytes(upper)}"
        parts = [f"bookies gave back {given} of {human_bytes(expected)} expected"]
    elif bookies:
        parts = [f"no bookie could be measured ({human_bytes(sum(r['expected_bytes'] or 0 for r in bookies))} "
                 f"expected back from {len(bookies)})"]
    else:
        parts = ["no bookie held data this run deleted"]
    for kind, words in ((PENDING_COMPACTION, "waits for compaction"), (PENDING_GC, "waits for the bookies' GC")):
        waiting = [r for r in bookies if r["verdict"] == kind]
        if waiting:
            parts.append(f"{human_bytes(sum(r['pending_bytes'] or 0 for r in waiting))} {words} on "
                         + _names(waiting))
    for kind, words in ((SHARED_WINDOW, "others' deletions were collected in the same window (a bound, not ours)"),
                        (RESTARTED, "restarted between the samples (a lower bound)"),
                        (UNKNOWN, "bytes unknown (never-closed ledgers, or no DELETED_LEDGER_TOTAL)")):
        named = [r for r in bookies if r["verdict"] == kind]
        if named:
            parts.append(f"{words} on {_names(named)}")
    unmeasured = [r for r in bookies if r["verdict"] == NOT_MEASURED]
    if unmeasured:
        parts.append(f"not measured on {_names(unmeasured)}: {unmeasured[0]['why']}")
    for r in rows:
        if r["target_kind"] == "offload":
            parts.append(f"{human_bytes(r['freed_bytes'] or 0)} of offloaded objects gone from {r['target']}"
                         + (f" ({r['why']})" if r["why"] else ""))
    return "; ".join(parts)


def _names(rows: list[dict[str, Any]], shown: int = 3) -> str:
    names = [r["target"] for r in rows]
    more = f" and {len(names) - shown} more (`sweeper show RUN reclaim` lists them)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
