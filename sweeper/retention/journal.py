"""The retention repair's journal: an intent committed before every admin call, so a killed repair leaves a record
of every call it made, and the next repair attributes what the broker did to the run that asked for it.

`retention --execute` commits one `repair_journal` row before each call to the broker (the topic's stats, the
subscription delete, the trim, the internalStats load), naming the znode the call changes when it takes effect and
that znode as it was right before. The call's outcome is the action's `retention_actions` row, committed before the
next call (a second copy here would double the commits for nothing). A run that ends, whatever the end, closes
itself; a run killed (SIGKILL, a lost host) stays unclosed.

The next `retention --execute`, holding the repair lock (so an unclosed run it finds has stopped), folds every
unclosed run in: each action with an intent and no `retention_actions` row is settled from the live metadata
(`settle`, a pure function of the intent and what the znode says now), recorded as the killed run's row, and the
killed run gets a `runs` row `interrupted` with its counts. What the killed run set out to do and is now done was
done by it (DESIGN.md invariant 18); what cannot be told is `unknown` (invariant 13), and never the re-run's: the
re-run leaves those actions out of its own plan, all but a trim still owed after a deleted subscription, which the
re-run makes as its own call (`_owed_and_done`).

The evidence, from Pulsar's own code:
- Deleting a subscription removes its cursor's znode before the broker answers (`PersistentSubscription.delete`
  -> `ManagedLedgerImpl.asyncDeleteCursor` -> `MetaStoreImpl.asyncRemoveCursor`). Gone, or re-created since (a
  new ctime): deleted.
- Loading a topic that is not terminated writes its managed-ledger znode (`ManagedLedgerImpl.initializeBookKeeper`
  creates a ledger to write to and stores the list with it); a terminated one is loaded without a write. The
  trim endpoint loads the topic and trims it (`PersistentTopicsBase.internalTrimTopic` ->
  `ManagedLedgerImpl.trimConsumedLedgersInBackground`), and a trim that drops ledgers stores the shorter list
  (`ManagedLedgerImpl.internalTrimLedgers`). So: a ledger listed before the call and gone from the list now was
  trimmed; an unloaded topic whose znode was written since was loaded; an unloaded, unterminated topic whose znode
  was not written was not loaded. A trim of a topic already loaded (by this run's subscription delete) that
  dropped nothing leaves no trace: `unknown`. Asking the broker instead would load the topic: an action, not a
  look.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kazoo.exceptions import NoAuthError

from sweeper import journal, runs
from sweeper.codecs import pulsar as codec
from sweeper.codecs.errors import MetadataDecodeError
from sweeper.errors import RunLockHeld
from sweeper.retention.errors import RepairLockHeld
from sweeper.run_lock import RunLock
from sweeper.table_schemas import REPAIR_JOURNAL, RETENTION_ACTIONS
from sweeper.tables import TableStore

JOURNAL_TABLE = journal.REPAIR.table
INTENT, CLOSED = journal.INTENT, journal.CLOSED
STAGE = "retention_repair"

# The admin calls, in the order an action makes them.
STATS_CALL, DELETE_CALL, TRIM_CALL, LOAD_CALL = "stats", "delete_subscription", "trim", "internal_stats"
# The actions and the outcomes a fold-in can establish (the names `retention_actions` uses).
LOAD_TOPIC, DELETE_SUBSCRIPTION = "load_topic", "delete_subscription"
TRIMMED, LOADED, DELETED = "trimmed", "loaded", "deleted"
# The run stopped before its call took effect: not done, by anyone; the next run may do it as its own.
INTERRUPTED = "interrupted"
# Whether the call took effect cannot be told from what the metadata shows.
UNKNOWN = "unknown"
# What a killed run did (or may have done): the re-run never claims these actions.
DONE_OR_UNKNOWN = frozenset({DELETED, TRIMMED, LOADED, UNKNOWN})


@dataclass(frozen=True)
class Intent:
    """One intent row, as a plain record: the last call an action of a killed run was about to make."""

    call: str
    zk_path: str | None
    zk_version: int | None
    zk_ctime_ms: int | None
    topic_unloaded: bool = False
    listed_ledger_ids: tuple[int, ...] = ()
    trimmable_ledger_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class NodeNow:
    """The intent's znode as the fold-in reads it. `problem`: it could not be read or decoded."""

    found: bool
    version: int | None = None
    ctime_ms: int | None = None
    ledger_ids: frozenset[int] | None = None  # a managed ledger's list
    terminated: bool = False
    problem: str = ""


def settle(intent: Intent, now: NodeNow) -> tuple[str, str]:
    """What the killed run's last call of an action did, from its intent and the znode now: (outcome, why)."""
    if intent.call == STATS_CALL:
        return INTERRUPTED, "stopped after reading the topic's stats, before asking the broker to delete it"
    if now.problem:
        return UNKNOWN, f"{intent.zk_path} cannot be read now ({now.problem})"
    if intent.call == DELETE_CALL:
        if not now.found:
            return DELETED, f"its cursor's znode {intent.zk_path} is gone"
        if intent.zk_ctime_ms is not None and now.ctime_ms is not None and now.ctime_ms != intent.zk_ctime_ms:
            return DELETED, (f"its cursor's znode {intent.zk_path} was created again since (ctime {intent.zk_ctime_ms}"
                             f" -> {now.ctime_ms}): deleted, then subscribed to anew")
        return INTERRUPTED, f"the subscription is still there (its cursor's znode {intent.zk_path} is unchanged)"
    if intent.call not in (TRIM_CALL, LOAD_CALL):
        return UNKNOWN, f"an intent of an unknown call {intent.call!r}"
    if not now.found:
        return UNKNOWN, f"its managed ledger {intent.zk_path} is gone: whether the call came first cannot be told"
    listed = set(intent.listed_ledger_ids)
    watched = listed & set(intent.trimmable_ledger_ids) if intent.trimmable_ledger_ids else listed
    dropped = sorted(watched - (now.ledger_ids or frozenset()))
    if dropped:
        shown = ", ".join(str(x) for x in dropped[:5]) + (" ..." if len(dropped) > 5 else "")
        return TRIMMED, f"{len(dropped)} ledger(s) listed before the call are no longer listed ({shown})"
    written = now.version != intent.zk_version
    if intent.topic_unloaded and written:
        return LOADED, (f"its managed ledger was written since the call (version {intent.zk_version} -> "
                        f"{now.version}): a broker loaded it")
    if intent.topic_unloaded and not now.terminated:
        return INTERRUPTED, ("not loaded: a broker that loads a topic writes its managed ledger, and it is unchanged "
                             f"(version {intent.zk_version})")
    if intent.topic_unloaded:
        return UNKNOWN, "a terminated topic is loaded without a write to its managed ledger: cannot tell"
    return UNKNOWN, ("the topic was already loaded and no listed ledger is gone: a trim with nothing to trim leaves "
                     "no trace")


def node_now(read: Callable[[str], tuple[bytes, Any] | None], intent: Intent) -> NodeNow:
    """Read the intent's znode (read-only); `read` answers None for a missing znode."""
    if not intent.zk_path:
        return NodeNow(False, problem="the intent names no znode")
    try:
        found = read(intent.zk_path)
    except Exception as exc:  # a fold-in never crashes the run: what it cannot read is `unknown`
        return NodeNow(False, problem=f"{type(exc).__name__}: {exc}"[:300])
    if found is None:
        return NodeNow(False)
    data, stat = found
    version, ctime = getattr(stat, "version", None), getattr(stat, "ctime", None)
    if intent.call not in (TRIM_CALL, LOAD_CALL):
        return NodeNow(True, version, ctime)
    try:
        info = codec.decode_managed_ledger_info(data)
    except MetadataDecodeError as exc:
        return NodeNow(True, version, ctime, problem=f"its managed ledger cannot be decoded ({exc})")
    return NodeNow(True, version, ctime, frozenset(x.ledgerId for x in info.ledgerInfo),
                   info.HasField("terminatedPosition"))


class RepairLock:
    """One `retention --execute` at a time (`sweeper.run_lock`), so that a run the journal shows unclosed is one that
    stopped, and a killed holder's lock goes with its session."""

    def __init__(self, client: Any, path: str, run_id: str, wait_for_dead_local_holder_s: float = 0.0) -> None:
        self._lock = _RepairRunLock(client, path, run_id=run_id,
                                    wait_for_dead_local_holder_s=wait_for_dead_local_holder_s, log=print)
        self.path = path

    def check(self) -> None:
        """LockLost unless this run still holds its lock (`RunLock.check`)."""
        self._lock.check()

    def acquire(self) -> None:
        try:
            self._lock.acquire()
        except RunLockHeld as exc:
            raise RepairLockHeld(str(exc)) from None
        except NoAuthError:
            raise RepairLockHeld(f"the sweeper may not create its repair lock {self.path} (ZooKeeper NoAuth): make "
                                 "its parent writable by the sweeper, or set [delete] lock_path") from None

    def release(self) -> None:
        # Best effort: the node goes with our session anyway, and the run's own end (or error) is what must be seen.
        with contextlib.suppress(Exception):
            self._lock.release()


class _RepairRunLock(RunLock):
    what, command = "retention repair", "repair"


class RepairJournal:
    """One run's intents: each is its own Delta commit, on disk before the call it names is made."""

    def __init__(self, store: TableStore, run_id: str, plan_run_id: str, runs_row_follows: bool = False) -> None:
        self.store, self.run_id, self.plan_run_id = store, run_id, plan_run_id
        self.runs_row_follows = runs_row_follows  # closed by the stage wrapper, which records the run in `runs` next
        self.written = 0

    def _row(self, phase: str, **values: Any) -> dict[str, Any]:
        return {"run_id": self.run_id, "plan_run_id": self.plan_run_id, "at": datetime.now(UTC), "phase": phase,
                **values}

    def intent(self, seq: int, call: str, action: Mapping[str, Any], **facts: Any) -> None:
        row = self._row(INTENT, seq=seq, call=call, **action, **facts)
        self.store.append_rows(JOURNAL_TABLE, [row], REPAIR_JOURNAL,
                               commit_metadata={"run_id": self.run_id, "stage": STAGE})
        self.written += 1

    def close(self, detail: str = "") -> None:
        detail = journal.closed_detail(detail, self.runs_row_follows)
        self.store.append_rows(JOURNAL_TABLE, [self._row(CLOSED, detail=detail[:2000])], REPAIR_JOURNAL,
                               commit_metadata={"run_id": self.run_id, "stage": STAGE})


def action_key(row: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """An action of a plan: what it does, to which managed ledger, to which subscription."""
    return row["action"], row["managed_ledger"], row["cursor"]


@dataclass
class Resolution:
    """What folding the unclosed runs found."""

    run_ids: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)  # retention_actions rows recorded for those runs
    done: set[tuple[str, str, str | None]] = field(default_factory=set)  # their actions the re-run leaves out
    # Managed ledgers whose subscription a killed run deleted and that it did not get to trim: the re-run trims them.
    trim_owed: set[str] = field(default_factory=set)


def _owed_and_done(settled: Iterable[Mapping[str, Any]]) -> tuple[set[str], set[tuple[str, str, str | None]]]:
    """From every row of the runs being folded (theirs and the fold's): the managed ledgers whose subscription a
    killed run deleted and that no killed run is known to have trimmed, and the actions the re-run leaves out.

    A trim owed stays in the re-run's plan even when a killed run's trim call is `unknown` (its intent committed, the
    call perhaps never sent: a trim of a loaded topic that dropped nothing leaves no trace). That row stays the
    killed run's; the re-run's trim is its own call. Asking again is safe where asking a delete again would not be:
    the broker trims only what its own retention rules let go (`ManagedLedgerImpl.internalTrimLedgers`), so a
    second trim drops nothing the first would have kept."""
    rows = list(settled)
    trimmed = {r["managed_ledger"] for r in rows if r["action"] == LOAD_TOPIC and r["outcome"] in (TRIMMED, LOADED)}
    owed = {r["managed_ledger"] for r in rows if r["action"] == DELETE_SUBSCRIPTION and r["outcome"] == DELETED}
    owed -= trimmed
    done = {action_key(r) for r in rows if r["outcome"] in DONE_OR_UNKNOWN
            and not (r["action"] == LOAD_TOPIC and r["managed_ledger"] in owed)}
    return owed, done


def unclosed_runs(store: TableStore) -> list[str]:
    if not store.exists(JOURNAL_TABLE):
        return []
    phases = store.aggregate_arrow(JOURNAL_TABLE, ["run_id", "phase"], [("at", "count")]).to_pylist()
    closed = {r["run_id"] for r in phases if r["phase"] == CLOSED}
    return sorted({r["run_id"] for r in phases} - closed)


def unsettled(journal: Iterable[Mapping[str, Any]], recorded: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A run's actions with no `retention_actions` row (`recorded`: the run's rows), each as its last intent in
    `journal` (the call whose answer may be lost): what a fold-in settles, and what `sweeper show RUN actions`
    lists as in flight until then."""
    have = {action_key(r) for r in recorded}
    last: dict[int, dict[str, Any]] = {}
    for row in sorted((r for r in journal if r["phase"] == INTENT), key=lambda r: r["at"]):
        last[row["seq"]] = dict(row)
    return [r for r in last.values() if action_key(r) not in have]


def _intent_of(row: Mapping[str, Any]) -> Intent:
    return Intent(row["call"], row["zk_path"], row["zk_version"], row["zk_ctime_ms"], bool(row["topic_unloaded"]),
                  tuple(row["listed_ledger_ids"] or ()), tuple(row["trimmable_ledger_ids"] or ()))


def _record_unrecorded(store: TableStore, by_run: str) -> None:
    """An `interrupted` row for each repair that closed its journal under the stage wrapper and was killed before its
    `runs` row: what it did is in `retention_actions` already; only its status was missing."""
    if not store.exists(JOURNAL_TABLE):
        return
    closed = store.aggregate_arrow(JOURNAL_TABLE, ["run_id", "detail"], [("at", "max")],
                                   where={"phase": CLOSED}).to_pylist()
    gaps = journal.unrecorded(store, STAGE, ({**r, "at": r["at_max"]} for r in closed))
    if not gaps:
        return
    firsts = {r["run_id"]: r["at_min"] for r in store.aggregate_arrow(
        JOURNAL_TABLE, ["run_id"], [("at", "min")], where={"run_id": [g["run_id"] for g in gaps]}).to_pylist()}
    begun = {g["run_id"]: firsts.get(g["run_id"], g["at"]) for g in gaps}
    journal.record_interrupted(store, STAGE, [journal.interrupted_row(
        g["run_id"], STAGE, begun[g["run_id"]], g["at"], {},
        f"run {g['run_id']} finished its actions (in retention_actions) and stopped before recording its end here "
        f"(recorded by {by_run})", store.engine) for g in gaps], by_run)


def resolve_interrupted(store: TableStore, read: Callable[[str], tuple[bytes, Any] | None], by_run: str,
                        counts: Callable[[Mapping[str, int]], runs.StageCounts],
                        only: Iterable[str] | None = None, record_runs: bool = True) -> Resolution:
    """Fold the unclosed runs (all, or `only` these) in; see the module doc. `read(path)` re-reads a znode;
    `counts` makes the stage's typed counts from a map of outcome counts. Call it holding the repair lock.
    `record_runs=False`: no `runs` row (an interrupted run folding itself in: the stage wrapper records it)."""
    found = Resolution()
    pending = unclosed_runs(store)
    if only is not None:
        pending = [r for r in pending if r in set(only)]
    elif record_runs:
        _record_unrecorded(store, by_run)
    if not pending:
        return found
    written = store.read_arrow(JOURNAL_TABLE, where={"run_id": pending}).to_pylist()
    recorded: list[dict[str, Any]] = []
    if store.exists("retention_actions"):
        recorded = store.read_arrow("retention_actions", where={"run_id": pending, "dry_run": False}).to_pylist()
    with_runs_row = {r["run_id"] for r in runs.rows(store, stage=STAGE) if r["run_id"] in set(pending)}
    now = datetime.now(UTC)
    run_rows: list[dict[str, Any]] = []
    closing: list[dict[str, Any]] = []
    settled: list[dict[str, Any]] = []
    for run_id in pending:
        intents = [r for r in written if r["run_id"] == run_id and r["phase"] == INTENT]
        own = [r for r in recorded if r["run_id"] == run_id]
        added = []
        for row in unsettled(intents, own):  # what the run did not record itself
            outcome, why = settle(_intent_of(row), node_now(read, _intent_of(row)))
            added.append({
                "run_id": run_id, "plan_run_id": row["plan_run_id"] or "", "finished_at": row["at"],
                "action": row["action"], "tenant": row["tenant"], "namespace": row["namespace"],
                "topic_name": row["topic_name"], "managed_ledger": row["managed_ledger"], "cursor": row["cursor"],
                "outcome": outcome,
                "detail": (f"run {run_id} stopped before recording its {row['call']} call: {why} (its intent is in "
                           f"{JOURNAL_TABLE}; resolved by {by_run})")[:2000],
                "http_status": None, "planned_bytes": row["planned_bytes"], "bytes_before": row["bytes_before"],
                "bytes_after": None, "dry_run": False})
        mine = own + added
        found.rows += added
        settled += mine
        stamps = [r["at"] for r in written if r["run_id"] == run_id]
        started, ended = min(stamps), max([*stamps, *(r["finished_at"] for r in own)])
        if record_runs and run_id not in with_runs_row:
            tally = Counter(r["outcome"] for r in mine)
            done = ", ".join(f"{n} {k}" for k, n in sorted(tally.items())) or "nothing"
            run_rows.append(journal.interrupted_row(
                run_id, STAGE, started, ended,
                counts({**tally, "execute": 1, "recovered_from_journal": len(added)}).as_row(),
                f"run {run_id} stopped before it finished: {done} ({len(added)} from its intents in "
                f"{JOURNAL_TABLE}, resolved by {by_run})", store.engine))
        closing.append({"run_id": run_id, "plan_run_id": intents[0]["plan_run_id"] if intents else None, "at": now,
                        "phase": CLOSED, "detail": f"interrupted; resolved by {by_run}"})
        found.run_ids.append(run_id)
    found.trim_owed, found.done = _owed_and_done(settled)
    metadata = {"stage": STAGE, "resolved_by": by_run}
    if found.rows:
        store.append_rows("retention_actions", found.rows, RETENTION_ACTIONS, commit_metadata=metadata)
    journal.record_interrupted(store, STAGE, run_rows, by_run)
    # Closed last: killed before this, the next run folds them again, and finds these rows already recorded.
    store.append_rows(JOURNAL_TABLE, closing, REPAIR_JOURNAL, commit_metadata=metadata)
    return found
