"""What a run's deletes should give back per bookie, what the bookies say they gave back, and what of it is ours.

Pure functions over plain records (DESIGN.md invariants 20 and 21: "freed" is what the bookies' own counters say, and
a report claims only what its evidence proves). Facts from BookKeeper 4.17.2's source, as Pulsar 4.0.8 ships it:

- Where bytes live: entry e of a segment goes to the ensemble positions (e + i) % ensembleSize, i < writeQuorum
  (`RoundRobinDistributionSchedule.WriteSetImpl.reset`, e the absolute entry id); a segment runs from its firstEntryId
  to the next segment's first entry - 1, the last one to lastEntryId
  (`BookKeeperAdmin.areEntriesOfSegmentStoredInTheBookie`).
  A bookie's share of a closed ledger is the entries it was sent times the ledger's mean entry size: exact in entry
  counts, an estimate in bytes where entries differ in size (said in `why`). A ledger never closed has metadata length
  0 and no known size: its bytes are unknown, never zero.
- What a collection pass counts: `DELETED_LEDGER_TOTAL` goes up once for every ledger the bookie's index holds and the
  metadata no longer lists, whoever deleted it (`ScanAndCompareGarbageCollector.gc` -> `garbageCleaner`), with no
  minimum age; a pass collects every such ledger at once. `RECLAIMED_DELETION_SPACE_BYTES` adds the whole size of an
  entry log once none of its ledgers lives (`GarbageCollectorThread.doGcEntryLogs`), and
  `RECLAIMED_COMPACTION_SPACE_BYTES` every dead byte of a log a compaction rewrote (`doCompactEntryLogs`): both count
  other deleters' ledgers as readily as ours.

So the bookie-wide counters prove what came back for this run's ledgers only in a window where the bookie collected
this run's ledgers and nobody else's: `DELETED_LEDGER_TOTAL` moved by exactly the number of our ledgers it indexed,
after a collection pass known to have run after our deletes (so that none of ours can be among the uncounted). Then
the freed bytes are this run's (released because of its deletes, up to what it expected), and the verdict is `freed`
or `pending_compaction`. When other ledgers were collected in the same window, the counters cannot tell whose bytes
left: the verdict is `shared_window`, the bookie-wide bytes an upper bound of ours and 0 the lower bound (a later
`sweeper reclaim --run-id RUN --execute` measures again). A bookie that restarted between the samples lost its
counters: `restarted`, a lower bound only. Ledgers of unknown length on a bookie make the bytes `unknown`. A per-ledger
probe would not help: BookKeeper's HTTP API has no per-ledger endpoint, and a ledger gone from a bookie's index may
still have its bytes in a shared entry log until a compaction (`LedgerMetadataIndex.delete` vs `doCompactEntryLogs`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sweeper.reclaim.samples import BookieSample

FREED, PENDING_COMPACTION, PENDING_GC = "freed", "pending_compaction", "pending_gc"
SHARED_WINDOW, RESTARTED, UNKNOWN, NOT_MEASURED = "shared_window", "restarted", "unknown", "not_measured"
VERDICTS = (FREED, PENDING_COMPACTION, PENDING_GC, SHARED_WINDOW, RESTARTED, UNKNOWN, NOT_MEASURED)

# Actions, as the `reclaim` table's `action` column spells them.
MEASURED_ONLY = "measured only"
GC_DELETION_ONLY = "gc (deletion only)"
GC_MINOR = "gc (deletion + minor compaction)"
GC_MAJOR = "gc (deletion + major compaction)"

# The bodies of PUT /api/v1/bookie/gc (TriggerGCService, GarbageCollectorThread.enableForceGC). An explicit `true`
# forces that compaction past the bookie's own suspension (the two-argument enableForceGC passes `!forceMajor` as
# suspendMajor, ignoring the live flag a full disk set), so no body here ever says `true`:
# - deletion only: both flags false: the pass removes the deleted ledgers and the logs they emptied, and compacts
#   nothing whatever the bookie's state;
# - minor: `forceMajor` false and `forceMinor` left out, so the bookie applies its own minor suspension (the omitted
#   flag defaults to `!isMinorGcSuspended()`). On a bookie with several ledger dirs that default is the AND over the
#   dirs (DbLedgerStorage.isMinorGcSuspended is allMatch), which would force a full dir: such a bookie gets
#   deletion only;
# - major: an empty body, `forceGC()`, which reads every dir's live suspension flags (enableForceGC() passes
#   suspendMajorCompaction.get()): major compaction wherever the bookie allows it.
BODY_DELETION_ONLY = json.dumps({"forceMajor": False, "forceMinor": False})
BODY_MINOR = json.dumps({"forceMajor": False})
BODY_MAJOR = ""


@dataclass(frozen=True)
class DeletedLedger:
    ledger_id: int
    length: int
    ensemble_size: int
    write_quorum: int
    bookies: tuple[str, ...]  # every bookie of every segment
    closed: bool = True  # state CLOSED: its length is its size; otherwise the size is unknown
    last_entry_id: int | None = None
    # (first entry id, ensemble) per segment, as the snapshot read them; () when the snapshot predates them
    segments: tuple[tuple[int, tuple[str, ...]], ...] = ()


@dataclass
class Expected:
    """What one bookie held of a run's deleted ledgers."""

    bytes: int = 0
    ledgers: int = 0
    estimated: int = 0  # ledgers whose share here is an estimate (no segment layout, or entries of unequal size)
    # Ledgers this bookie surely indexed: it was sent entries of them (their metadata gives them bytes). Each adds one
    # to its DELETED_LEDGER_TOTAL when collected.
    with_data: int = 0
    # Ledgers that list this bookie without known entries on it: never closed (entries, maybe, of unknown size), or
    # closed with none sent here (indexed only if it was fenced in a recovery). Each may or may not add one.
    unknown: int = 0  # never closed: bytes unknown
    empty: int = 0  # closed with no entry here
    ledger_ids: list[int] = field(default_factory=list)

    @property
    def maybe(self) -> int:
        return self.unknown + self.empty


def _entries_on(index: int, first: int, last: int, ensemble_size: int, write_quorum: int) -> int:
    """How many of the entries first..last ensemble position `index` was sent: entry e goes to (e + i) % E, i < WQ,
    i.e. to `index` when (index - e) mod E < WQ. Whole cycles of E entries give WQ each; the rest counted one by one."""
    if last < first or ensemble_size <= 0:
        return 0
    quorum = max(1, min(write_quorum, ensemble_size))
    count = last - first + 1
    cycles, rest = divmod(count, ensemble_size)
    extra = sum(1 for e in range(first, first + rest) if (index - e) % ensemble_size < quorum)
    return cycles * quorum + extra


def ledger_shares(ledger: DeletedLedger) -> tuple[dict[str, int], bool]:
    """Bytes of a closed ledger per bookie, and whether that split is an estimate beyond the entries' mean size."""
    entries = (-1 if ledger.last_entry_id is None else ledger.last_entry_id) + 1
    if ledger.length <= 0 or entries <= 0:
        return {}, False
    if not ledger.segments:
        # A snapshot without the layout: spread evenly over every bookie it used (an estimate when it changed).
        bookies = sorted(set(ledger.bookies))
        if not bookies:
            return {}, False
        copies = max(1, min(ledger.write_quorum, len(bookies)))
        share = ledger.length * copies // max(len(bookies), ledger.ensemble_size or len(bookies))
        # Exact only when every bookie holds every entry; otherwise which entries each got is not known.
        return dict.fromkeys(bookies, share), copies < len(bookies)
    counts: dict[str, int] = {}
    segments = sorted(ledger.segments)
    for n, (first, ensemble) in enumerate(segments):
        last = segments[n + 1][0] - 1 if n + 1 < len(segments) else entries - 1
        size = ledger.ensemble_size or len(ensemble)
        for index, bookie in enumerate(ensemble):
            got = _entries_on(index, first, last, size, ledger.write_quorum)
            if got:
                counts[bookie] = counts.get(bookie, 0) + got
    per_entry = ledger.length / entries
    return {bookie: round(n * per_entry) for bookie, n in counts.items()}, True


def expected_shares(ledgers: Iterable[DeletedLedger]) -> dict[str, Expected]:
    """Per bookie: the bytes and ledgers it held of `ledgers`. A bookie listed only in ensembles of closed ledgers it
    was sent no entry of holds none of the data: it has no entry here."""
    out: dict[str, Expected] = {}
    for ledger in ledgers:
        listed = set(ledger.bookies) | {b for _, ensemble in ledger.segments for b in ensemble}
        if not ledger.closed:
            for bookie in sorted(listed):
                e = out.setdefault(bookie, Expected())
                e.ledgers += 1
                e.unknown += 1
                e.ledger_ids.append(ledger.ledger_id)
            continue
        shares, estimated = ledger_shares(ledger)
        for bookie, share in shares.items():
            e = out.setdefault(bookie, Expected())
            e.bytes += share
            e.ledgers += 1
            e.with_data += 1
            e.estimated += int(estimated)
            e.ledger_ids.append(ledger.ledger_id)
        for bookie in sorted(listed - set(shares)):
            if bookie in out:  # held data of another of the run's ledgers: this one may be in its index too
                out[bookie].ledgers += 1
                out[bookie].empty += 1
    return out


@dataclass(frozen=True)
class GcPlan:
    trigger: bool
    body: str = BODY_DELETION_ONLY
    level: int = 0  # gc_level of what it asks
    action: str = MEASURED_ONLY
    why: str = ""


# How much a GC may do: a deletion-only GC < one with a minor compaction < one with a major compaction.
DELETION_ONLY, MINOR, MAJOR = 0, 1, 2


def gc_level(force_major: bool, force_minor: bool) -> int:
    return MAJOR if force_major else MINOR if force_minor else DELETION_ONLY


def gc_plan(sample: BookieSample, expected: Expected, asked: bool, compaction: str,
            already_triggered: int | None) -> GcPlan:
    """Whether (and how) to trigger this bookie's GC: only when asked, never on a busy bookie, and never so as to
    override the bookie's own protection (see the bodies above): a read-only bookie, one whose compaction is
    suspended and `compaction = "none"` get a deletion-only GC. `sample` is read right before the PUT. At most once per
    bookie per run for each kind: `already_triggered` is the strongest kind (`gc_level`) this run asked of it and saw
    done or may have sent (None: none), and only a stronger one is asked again."""
    if not asked:
        return GcPlan(False, why="trigger_gc is off: measured only")
    if not sample.measured:
        return GcPlan(False, action="none")  # the verdict says why
    if expected.bytes <= 0 and expected.ledgers == 0:
        return GcPlan(False, why="held none of the deleted data")
    if sample.readonly or sample.major_suspended or sample.minor_suspended or compaction == "none":
        reason = ("read-only" if sample.readonly else "compaction suspended" if
                  (sample.major_suspended or sample.minor_suspended) else "[reclaim] compaction = none")
        plan = GcPlan(True, BODY_DELETION_ONLY, DELETION_ONLY, GC_DELETION_ONLY, why=f"{reason}: deletion only")
    elif compaction == "major":
        plan = GcPlan(True, BODY_MAJOR, MAJOR, GC_MAJOR, why="compaction wherever the bookie's own flags allow")
    elif sample.ledger_dirs > 1:
        plan = GcPlan(True, BODY_DELETION_ONLY, DELETION_ONLY, GC_DELETION_ONLY,
                      why=f"{sample.ledger_dirs} ledger dirs: a minor compaction cannot be asked without overriding a "
                          "full dir's suspension (BookKeeper's default for the flag is the AND over its dirs): "
                          "deletion only")
    else:
        plan = GcPlan(True, BODY_MINOR, MINOR, GC_MINOR)
    if already_triggered is not None and already_triggered >= plan.level:
        return GcPlan(False, action="none", why="a GC of this kind was already triggered on it for this run")
    if sample.in_force_gc or sample.compacting:
        return GcPlan(False, action="skipped", why="already in a forced GC or compacting: left alone")
    return plan


def gc_confirmed(before_put: BookieSample, after: BookieSample, seen_running: bool) -> bool:
    """Whether a GC asked with a PUT is known to have run (the bookie answers 200 also to a PUT it ignores, while a
    forced GC already runs: `enableForceGC`'s compareAndSet): seen running, or its counters moved since the sample
    read right before the PUT (a pass that collected something, or a compaction)."""
    if seen_running:
        return True
    if after.restarted_since(before_put):
        return False
    moved = [(b, a) for b, a in ((before_put.deleted_ledgers, after.deleted_ledgers),
                                  (before_put.major_compactions, after.major_compactions),
                                  (before_put.minor_compactions, after.minor_compactions),
                                  (before_put.deletion_bytes, after.deletion_bytes)) if b is not None and a is not None]
    return any(a > b for b, a in moved)


@dataclass(frozen=True)
class Freed:
    deletion: int
    compaction: int
    deleted_ledgers: int | None
    active_log_delta: int | None
    free_space_delta: int | None
    counter_reset: bool

    @property
    def total(self) -> int:
        return self.deletion + self.compaction


def _delta(before: int | None, after: int | None, restarted: bool) -> tuple[int | None, bool]:
    if before is None or after is None:
        return None, False
    if restarted or after < before:
        return after, True  # restarted: counted from zero since
    return after - before, False


def freed(before: BookieSample, after: BookieSample) -> Freed:
    """The counters' deltas; after a restart (seen in the process start time, or a counter gone down) each counts
    only since the restart: a lower bound of the window's."""
    restarted = bool(after.restarted_since(before))
    deletion, reset_d = _delta(before.deletion_bytes, after.deletion_bytes, restarted)
    compaction, reset_c = _delta(before.compaction_bytes, after.compaction_bytes, restarted)
    ledgers, reset_l = _delta(before.deleted_ledgers, after.deleted_ledgers, restarted)
    active = (after.active_log_bytes - before.active_log_bytes
              if after.active_log_bytes is not None and before.active_log_bytes is not None else None)
    free_space = (after.free_bytes - before.free_bytes
                  if after.free_bytes is not None and before.free_bytes is not None else None)
    return Freed(deletion or 0, compaction or 0, ledgers, active, free_space,
                 restarted or reset_d or reset_c or reset_l)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    pending_bytes: int  # of the expected bytes, what may still be on the bookie (expected - the lower bound)
    why: str
    lower_bytes: int = 0  # of what the bookie gave back, what is provably this run's
    upper_bytes: int = 0  # what could be this run's at most
    others_collected: int = 0  # ledgers not this run's that the bookie collected in the window (at least)


def collection_seen(gc_done_after_deletes: bool, before: BookieSample, after: BookieSample,
                    deletes_ended: datetime | None) -> bool:
    """Whether a collection pass is known to have started after the run's last delete: a GC this run triggered and saw
    run, or the bookie's own collector, which runs every gcWaitTime (GarbageCollectorThread's fixed delay), given
    twice that since the deletes (a pass may itself take a while)."""
    if gc_done_after_deletes:
        return True
    wait_ms = after.gc_wait_ms or before.gc_wait_ms
    if not wait_ms or deletes_ended is None:
        return False
    return (after.sampled_at - deletes_ended).total_seconds() * 1000 >= 2 * wait_ms


def verdict(expected: Expected, before: BookieSample | None, after: BookieSample | None, freed_fraction: float,
            gc_finished: bool | None = None, pass_seen: bool = False) -> tuple[Verdict, Freed | None]:
    """The bookie's verdict on this run's ledgers (module doc). `pass_seen`: a collection pass is known to have run
    after the deletes (`collection_seen`)."""
    # What the bookie says now explains more than a missing baseline: it is the reason checked first.
    if after is None or not after.measured:
        why = after.error if after is not None and after.error else "no sample after the delete"
        return Verdict(NOT_MEASURED, 0, why, upper_bytes=expected.bytes), None
    if before is None or not before.measured:
        why = before.error if before is not None and before.error else (
            "no sample before the delete (it was not registered then, [reclaim] enabled was false, or the run "
            "predates the reclaim step)")
        return Verdict(NOT_MEASURED, 0, f"before the delete: {why}", upper_bytes=expected.bytes), None
    got = freed(before, after)
    notes: list[str] = []
    if expected.estimated:
        notes.append(f"{expected.estimated} ledger(s)' share here is estimated (from their mean entry size, or spread "
                     "evenly where the snapshot has no segment layout)")
    if gc_finished is False:
        notes.append("the triggered GC had not finished when sampled")
    expected_bytes = expected.bytes
    upper = min(got.total, expected_bytes)
    if got.counter_reset:
        return Verdict(RESTARTED, expected_bytes, _join(
            f"the bookie restarted between the samples: its counters count only since ({got.total:,} B given back "
            "since, a lower bound of the bookie's; how much of it is this run's cannot be told): "
            "`sweeper reclaim --run-id RUN` measures again", *notes), 0, expected_bytes), got
    if got.deleted_ledgers is None:
        return Verdict(UNKNOWN, expected_bytes, _join(
            "the bookie exports no DELETED_LEDGER_TOTAL: whose ledgers it collected cannot be told", *notes),
            0, upper), got
    collected, must = got.deleted_ledgers, expected.with_data
    if collected < must:
        return Verdict(PENDING_GC, expected_bytes, _join(
            f"the bookie's collector dropped {collected} ledger(s) since the delete, fewer than the {must} of this "
            "run's it held (gcWaitTime: Pulsar's bookkeeper.conf has 15 minutes): `sweeper reclaim --run-id RUN` "
            "measures again, `--execute` triggers a GC", *notes), 0, upper), got
    others = collected - must - expected.maybe
    if others > 0 or (collected > must and expected.empty and not expected.unknown):
        # More collected than this run's ledgers could account for: somebody else's were collected too, and the
        # counters cannot say whose bytes left.
        return Verdict(SHARED_WINDOW, expected_bytes, _join(
            f"the bookie also collected {max(others, 1)}+ ledger(s) not this run's in the same window (Pulsar's own "
            f"deletions): of the {got.total:,} B it gave back, between 0 and {upper:,} B are this run's; "
            "`sweeper reclaim --run-id RUN --execute` measures a new window", *notes), 0, upper, max(others, 1)), got
    if not pass_seen:
        return Verdict(PENDING_GC, expected_bytes, _join(
            "no collection pass is known to have run since the deletes, so some of this run's ledgers may not be "
            "among those counted: `sweeper reclaim --run-id RUN --execute` triggers one", *notes), 0, upper), got
    if expected.unknown:
        return Verdict(UNKNOWN, expected_bytes, _join(
            f"{expected.unknown} deleted ledger(s) held here were never closed: their length is unknown, so neither "
            f"what they freed nor whether the {collected} collected were all this run's can be told", *notes),
            0, upper), got
    # A window with this run's ledgers alone: what the bookie gave back came back because of this run's deletes
    # (a log deleted whole held only dead ledgers, ours the only new ones), up to what it expected.
    lower = min(got.deletion, expected_bytes)
    if got.total > expected_bytes:
        notes.append(f"{got.total - expected_bytes:,} B more than expected came back: dead bytes of earlier deletions "
                     "in the same entry logs")
    if expected_bytes > 0 and got.total >= freed_fraction * expected_bytes:
        return Verdict(FREED, 0, _join(*notes), upper, upper), got
    if got.compaction:
        notes.append("compaction bytes count every dead byte of the logs it rewrote")
    return Verdict(PENDING_COMPACTION, max(0, expected_bytes - upper), _join(
        "the rest shares entry logs with live data (or the log still being written) until a compaction rewrites "
        "them: [reclaim] compaction = \"major\" with `sweeper reclaim --run-id RUN --execute`", *notes),
        lower, upper), got


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)
