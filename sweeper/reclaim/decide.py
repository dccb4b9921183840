"""What a run's deletes should give back per bookie, what the bookies say they gave back, and the verdict.

Pure functions over plain records (DESIGN.md invariant 20: "freed" is what the bookies' own counters say).

- Expected: a deleted ledger's bytes live on `write_quorum` of its ensemble's bookies, striped (BookKeeper's
  round-robin `DistributionSchedule`): each bookie of an ensemble holds `length * write_quorum / ensemble_size`.
  A ledger whose ensemble changed (several segments) is spread evenly over every bookie it ever used: the
  metadata does not say how many bytes each segment holds, so that share is an estimate (said in `why`).
- Freed: the deltas of RECLAIMED_DELETION_SPACE_BYTES and RECLAIMED_COMPACTION_SPACE_BYTES between the sample
  before the delete and the one after. A counter that went down means the bookie restarted in between: the
  value after is then a lower bound of what was freed (`counter_reset`), never a negative.
  The counters count every ledger the bookie's collector reclaimed meanwhile, ours and Pulsar's own (trimmed
  ledgers, rolled cursor ledgers), so freed may exceed expected: `why` says so.
- Verdict: `freed` when the bookie gave back at least `freed_fraction` of what was expected; `pending_gc` while
  its collector has not yet dropped the deleted ledgers (DELETED_LEDGER_TOTAL moved less than their count:
  gcWaitTime, 15 minutes in Pulsar's bookkeeper.conf); `pending_compaction` when it did but space remains: those
  bytes share entry logs with live data (or sit in the log still being written) until a compaction rewrites them;
  `not_measured` with why, when a sample is missing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sweeper.reclaim.samples import BookieSample

FREED, PENDING_COMPACTION, PENDING_GC, NOT_MEASURED = "freed", "pending_compaction", "pending_gc", "not_measured"
VERDICTS = (FREED, PENDING_COMPACTION, PENDING_GC, NOT_MEASURED)

# Actions, as the `reclaim` table's `action` column spells them.
MEASURED_ONLY = "measured only"
GC_DELETION_ONLY = "gc (deletion only)"
GC_MINOR = "gc (deletion + minor compaction)"
GC_MAJOR = "gc (deletion + major compaction)"


@dataclass(frozen=True)
class DeletedLedger:
    ledger_id: int
    length: int
    ensemble_size: int
    write_quorum: int
    bookies: tuple[str, ...]  # every bookie of every segment


@dataclass
class Expected:
    bytes: int = 0
    ledgers: int = 0
    estimated: int = 0  # ledgers whose share is an estimate (their ensemble changed)
    # Ledgers whose metadata gives them bytes: those the bookie surely indexed. An empty ledger (or one left open,
    # whose metadata length stays 0) may have no index entry on the bookie, so its collector never counts it.
    with_data: int = 0


def expected_shares(ledgers: Iterable[DeletedLedger]) -> dict[str, Expected]:
    out: dict[str, Expected] = {}
    for ledger in ledgers:
        bookies = sorted(set(ledger.bookies))
        if not bookies or ledger.length <= 0:
            for bookie in bookies:
                out.setdefault(bookie, Expected()).ledgers += 1
            continue
        copies = max(1, min(ledger.write_quorum, len(bookies)))
        share = ledger.length * copies // max(len(bookies), ledger.ensemble_size or len(bookies))
        for bookie in bookies:
            e = out.setdefault(bookie, Expected())
            e.bytes += share
            e.ledgers += 1
            e.with_data += 1
            e.estimated += int(len(bookies) != ledger.ensemble_size)
    return out


@dataclass(frozen=True)
class GcPlan:
    trigger: bool
    force_major: bool = False
    force_minor: bool = False
    action: str = MEASURED_ONLY
    why: str = ""


# How much a GC may do: a deletion-only GC < one with a minor compaction < one with a major compaction.
DELETION_ONLY, MINOR, MAJOR = 0, 1, 2


def gc_level(force_major: bool, force_minor: bool) -> int:
    return MAJOR if force_major else MINOR if force_minor else DELETION_ONLY


def gc_plan(sample: BookieSample, expected: Expected, asked: bool, compaction: str,
            already_triggered: int | None) -> GcPlan:
    """Whether (and how) to trigger this bookie's GC: only when asked, never on a busy bookie, and a read-only
    bookie or one whose compaction is suspended gets a deletion-only GC. At most once per bookie per run for each
    kind: `already_triggered` is the strongest kind (`gc_level`) this run asked of it (None: none), and only a
    stronger one is asked again (an operator's `reclaim --execute` with compaction = "major" after the sweep's
    minor one; never the same GC twice, whatever re-runs)."""
    if not asked:
        return GcPlan(False, why="trigger_gc is off: measured only")
    if not sample.measured:
        return GcPlan(False, action="none")  # the verdict says why
    if expected.bytes <= 0 and expected.ledgers == 0:
        return GcPlan(False, why="held none of the deleted data")
    if sample.readonly or sample.major_suspended or sample.minor_suspended or compaction == "none":
        reason = ("read-only" if sample.readonly else "compaction suspended" if
                  (sample.major_suspended or sample.minor_suspended) else "[reclaim] compaction = none")
        plan = GcPlan(True, False, False, GC_DELETION_ONLY, why=f"{reason}: deletion only")
    elif compaction == "major":
        plan = GcPlan(True, True, True, GC_MAJOR)
    else:
        plan = GcPlan(True, False, True, GC_MINOR)
    if already_triggered is not None and already_triggered >= gc_level(plan.force_major, plan.force_minor):
        return GcPlan(False, action="none", why="a GC of this kind was already triggered on it for this run")
    if sample.in_force_gc or sample.compacting:
        return GcPlan(False, action="skipped", why="already in a forced GC or compacting: left alone")
    return plan


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


def _delta(before: int | None, after: int | None) -> tuple[int | None, bool]:
    if before is None or after is None:
        return None, False
    if after < before:
        return after, True  # restarted: counted from zero since
    return after - before, False


def freed(before: BookieSample, after: BookieSample) -> Freed:
    deletion, reset_d = _delta(before.deletion_bytes, after.deletion_bytes)
    compaction, reset_c = _delta(before.compaction_bytes, after.compaction_bytes)
    ledgers, reset_l = _delta(before.deleted_ledgers, after.deleted_ledgers)
    active = (after.active_log_bytes - before.active_log_bytes
              if after.active_log_bytes is not None and before.active_log_bytes is not None else None)
    free_space = (after.free_bytes - before.free_bytes
                  if after.free_bytes is not None and before.free_bytes is not None else None)
    return Freed(deletion or 0, compaction or 0, ledgers, active, free_space, reset_d or reset_c or reset_l)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    pending_bytes: int
    why: str


def verdict(expected: Expected, before: BookieSample | None, after: BookieSample | None, freed_fraction: float,
            gc_finished: bool | None = None) -> tuple[Verdict, Freed | None]:
    # What the bookie says now explains more than a missing baseline: it is the reason checked first.
    if after is None or not after.measured:
        why = after.error if after is not None and after.error else "no sample after the delete"
        return Verdict(NOT_MEASURED, 0, why), None
    if before is None or not before.measured:
        why = before.error if before is not None and before.error else (
            "no sample before the delete (it was not registered then, [reclaim] enabled was false, or the run "
            "predates the reclaim step)")
        return Verdict(NOT_MEASURED, 0, f"before the delete: {why}"), None
    got = freed(before, after)
    notes: list[str] = []
    if got.counter_reset:
        notes.append("the bookie restarted between the samples: freed counts only since its restart (a lower bound)")
    if expected.estimated:
        notes.append(f"{expected.estimated} ledger(s) changed ensemble: their share per bookie is estimated")
    if got.total > expected.bytes:
        notes.append("the counters include space of ledgers Pulsar itself deleted meanwhile")
    if gc_finished is False:
        notes.append("the triggered GC had not finished when sampled")
    pending = max(0, expected.bytes - got.total)
    if got.total >= freed_fraction * expected.bytes:
        return Verdict(FREED, 0, "; ".join(notes)), got
    # DELETED_LEDGER_TOTAL counts the ledgers the collector dropped from the bookie's index (doGcLedgers).
    collected = got.deleted_ledgers >= expected.with_data if got.deleted_ledgers is not None else got.total > 0
    if not collected:
        return Verdict(PENDING_GC, pending, "; ".join([
            "the bookie's garbage collector has not run over the deleted ledgers yet (gcWaitTime): "
            "`sweeper reclaim --run-id RUN` measures again, `--execute` triggers it", *notes])), got
    return Verdict(PENDING_COMPACTION, pending, "; ".join([
        "the rest shares entry logs with live data (or the log still being written) until a compaction rewrites "
        "them: [reclaim] compaction = \"major\" with `sweeper reclaim --run-id RUN --execute`", *notes])), got
