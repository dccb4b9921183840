"""The runs ledger: the one module that reads and writes the `runs` table (issue 22).

A run is one id shared by its stages (snapshot, reconcile, retention_debt, emit, delete; a retention repair
has its own id and names its plan's). Each stage appends one row when it ends, whatever the end: its status,
its counts and a one-line message (never a stack trace: that goes to the log file). A later stage requires
the earlier one to have succeeded for the same run id; "latest" means the newest succeeded run of a stage.

Reads go through `TableStore.read_arrow`, which delta-rs answers without a Spark job, so a CLI that only
reads (`sweeper runs`) needs no Spark session either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar

from sweeper.errors import Refused, StageRefused, caused_by_interrupt, one_line
from sweeper.table_schemas import RUNS

if TYPE_CHECKING:
    from sweeper.tables.base import TableStore


class ConfigHash(Protocol):
    """A config, or a stage's settings narrowed from one: either names the whole config by its hash."""

    def hash(self) -> str: ...


TABLE = "runs"

SUCCEEDED = "succeeded"
PARTIAL = "partial"  # some deletes or repairs failed and wait for a retry
REFUSED = "refused"
FAILED = "failed"
INTERRUPTED = "interrupted"
STATUSES = (SUCCEEDED, PARTIAL, REFUSED, FAILED, INTERRUPTED)

MESSAGE_LIMIT = 4000


def count(key: str) -> Any:
    """An int field of a `StageCounts` whose `runs` key is not its name (`bytes.orphan` for `orphan_bytes`)."""
    return dataclasses.field(default=0, metadata={"key": key})


def breakdown(*prefixes: str, whole_keys: bool = False) -> Any:
    """A `Mapping[str, int]` field of a `StageCounts`: the `runs` keys starting with `prefix`, by the rest of the
    key (`reason.topic_deleted` -> `topic_deleted`); or, with `whole_keys`, those starting with any of several
    prefixes, by the whole key (`candidate.ledger`), so that `as_row` can write each key back as it was."""
    if not prefixes or (len(prefixes) > 1 and not whole_keys):
        raise ValueError("a breakdown by the rest of the key has exactly one prefix; several need whole_keys=True")
    return dataclasses.field(default_factory=dict, metadata={"prefixes": prefixes, "whole_keys": whole_keys})


@dataclasses.dataclass(frozen=True)
class StageCounts:
    """A stage's counts, typed: each int field is a count other code reads by name, each `breakdown` field a count
    per open-ended key (a reason, a table, a state). The `runs` table keeps them as one map: `as_row` writes it,
    `from_row` reads it back. A key no field declares lands in `extra`, so nothing is lost, and a test runs every
    stage to keep `extra` empty: a count only a dict knows about is what this type exists to prevent.
    """

    extra: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Mapping[str, int]) -> Self:
        ints: dict[str, str] = {}  # runs key -> field name
        maps: list[tuple[str, str, bool]] = []  # (prefix, field name, whole_keys), longest prefix first
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            if "prefixes" in f.metadata:
                maps += [(p, f.name, f.metadata["whole_keys"]) for p in f.metadata["prefixes"]]
            else:
                ints[f.metadata.get("key", f.name)] = f.name
        maps.sort(key=lambda m: -len(m[0]))
        values: dict[str, Any] = {name: {} for _, name, _ in maps}
        extra: dict[str, int] = {}
        for key, value in row.items():
            if key in ints:
                values[ints[key]] = int(value)
                continue
            for prefix, name, whole in maps:
                if key.startswith(prefix):
                    values[name][key if whole else key[len(prefix):]] = int(value)
                    break
            else:
                extra[key] = int(value)
        return cls(extra=extra, **values)

    def as_row(self) -> dict[str, int]:
        """The `runs` row's map: every int field under its key, every breakdown's entries under theirs."""
        row: dict[str, int] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra":
                continue
            if "prefixes" in f.metadata:
                prefix = "" if f.metadata["whole_keys"] else f.metadata["prefixes"][0]
                row.update({prefix + k: int(v) for k, v in value.items()})
            else:
                row[f.metadata.get("key", f.name)] = int(value)
        row.update(self.extra)
        return row

    def with_counts(self, **changes: int | Mapping[str, int]) -> Self:
        return dataclasses.replace(self, **changes)


R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class Ending:
    """How a stage that returned ended: its counts, its status (a delete with retries queued is `partial`), a line."""

    counts: StageCounts
    status: str = SUCCEEDED
    message: str = ""


class Interrupts(Protocol):
    """How a stage's interrupted attempt reaches `runs` (sweeper.journal declares each stage's)."""

    def record_interrupt(self, store: TableStore, run_id: str, stage: str, started: datetime,
                         config: ConfigHash | None) -> None: ...


def stage(store: TableStore, config: ConfigHash | None, run_id: str, name: str, body: Callable[[], R],
          ending: Callable[[R], Ending], refusals: tuple[type[Exception], ...] = (),
          escalate: Callable[[Exception], Exception | None] = lambda exc: None, started: datetime | None = None,
          *, journal: Interrupts) -> R:
    """Run one stage's `body` and record how it ended in `runs`, whatever the end: the one wrapper of every stage.

    The status always agrees with the exit code the CLI gives the same end:
    - a `Refused` (exit 3) is `refused`; one of the stage's own `refusals` is raised again as `StageRefused`;
    - an interrupt (Ctrl-C, SIGTERM, or a Spark job PySpark cancelled for one) is `interrupted`, recorded as the
      stage's `journal` says (sweeper.journal: from the journal now, by the next attempt, or a plain row);
    - any other exception is `failed`, recorded as its first line (the trace goes to the log file), unless
      `escalate` turns it into a refusal.
    """
    started = started or datetime.now(UTC)

    def record_the_interrupt() -> None:
        with contextlib.suppress(Exception):  # the interrupt is what the operator must see
            journal.record_interrupt(store, run_id, name, started, config)

    try:
        result = body()
    except KeyboardInterrupt:
        record_the_interrupt()
        raise
    except Exception as exc:
        # First: a Spark job cancelled by PySpark's SIGINT handler, even when a stage turned that failure into
        # a refusal on its way out, is the interrupt (the CLI exits 130 for it).
        if caused_by_interrupt(exc):
            record_the_interrupt()
            raise KeyboardInterrupt from exc
        if isinstance(exc, Refused) and exc.leaves_run_to_next_holder:
            raise  # its journal stays open: the next holder of the lock records how it ended, once
        if isinstance(exc, (Refused, *refusals)):
            record(store, run_id, name, REFUSED, started, {}, config, str(exc))
            if isinstance(exc, refusals):
                raise StageRefused(str(exc)) from exc
            raise
        refusal = escalate(exc)
        record(store, run_id, name, FAILED if refusal is None else REFUSED, started, {}, config,
               exc if refusal is None else str(refusal))
        if refusal is not None:
            raise StageRefused(str(refusal)) from exc
        raise
    end = ending(result)
    record(store, run_id, name, end.status, started, end.counts, config, end.message)
    return result


def new_run_id(now: datetime | None = None) -> str:
    """Sortable by time, unique by its random suffix: `20261125T183459Z-1a2b3c4d`."""
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


def record(store: TableStore, run_id: str, stage: str, status: str, started: datetime,
           counts: StageCounts | Mapping[str, int] | None, config: ConfigHash | None,
           message: str | BaseException = "") -> None:
    """One stage of one run ended with `status`; `config` is the config or a stage's settings narrowed from it.

    An exception is kept as its first line only (a py4j error's text is a Java stack trace: that stays in the
    log file); a message of several lines is joined into one."""
    if status not in STATUSES:
        raise ValueError(f"unknown run status {status!r}")
    text = one_line(message) if isinstance(message, BaseException) else _first_line(message)
    finished = datetime.now(UTC)
    store.append_rows(TABLE, [{
        "run_id": run_id,
        "stage": stage,
        "status": status,
        "started_at": started,
        "finished_at": finished,
        "duration_s": (finished - started).total_seconds(),
        "counts": counts.as_row() if isinstance(counts, StageCounts) else dict(counts or {}),
        "config_hash": config.hash() if config is not None else None,
        "engine": store.engine,
        "message": text,
    }], RUNS)


def record_rows(store: TableStore, rows: Iterable[Mapping[str, Any]], commit_metadata: Mapping[str, Any]) -> None:
    """Rows made elsewhere (the delete journal's `interrupted` attempts), in the table's own schema."""
    rows = [{**row, "message": _first_line(str(row.get("message") or ""))} for row in rows]
    if rows:
        store.append_rows(TABLE, rows, RUNS, commit_metadata=dict(commit_metadata))


def _first_line(text: str) -> str:
    """A refusal's text on one line: an operator reads it in a table cell (a gate's list of failures joined)."""
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())[:MESSAGE_LIMIT]


def rows(store: TableStore, run_id: str | None = None, stage: str | None = None,
         status: str | None = None) -> list[dict[str, Any]]:
    """The `runs` rows matching, oldest first (by start, then end)."""
    if not store.exists(TABLE):
        return []
    where = {k: v for k, v in (("run_id", run_id), ("stage", stage), ("status", status)) if v is not None}
    found = store.read_arrow(TABLE, where=where).to_pylist()
    for row in found:
        row["counts"] = dict(row["counts"] or {})  # Arrow gives a map as (key, value) pairs
    return sorted(found, key=lambda r: (r["started_at"], r["finished_at"]))


def latest(store: TableStore, stage: str) -> str | None:
    """The newest run whose `stage` succeeded."""
    found = rows(store, stage=stage, status=SUCCEEDED)
    return found[-1]["run_id"] if found else None


# What a stage command needs before it, as its refusal names it.
_READY = {"snapshot": "successful snapshot", "reconcile": "reconciled run", "retention_debt": "retention debt",
          "emit": "emitted run", "delete": "delete run"}


def resolve_run(store: TableStore, run_id: str | None, stage: str, hint: str, *, recorded: bool = False) -> str:
    """The run a stage command acts on: `run_id` as named (with `recorded`, only if it has a `stage` row), else the
    newest run whose `stage` succeeded. None is `Refused` (exit 3): `no <what> in <root>; <hint>`."""
    if run_id and (not recorded or rows(store, run_id, stage)):
        return run_id
    found = None if run_id else latest(store, stage)
    if found is None:
        named = f"named {run_id!r} " if run_id else ""
        raise Refused(f"no {_READY[stage]} {named}in {store.root}; {hint}")
    return found


def succeeded(store: TableStore, run_id: str, stage: str) -> dict[str, int] | None:
    """The counts of `run_id`'s `stage` when it succeeded (its latest such row), else None."""
    found = rows(store, run_id=run_id, stage=stage, status=SUCCEEDED)
    return found[-1]["counts"] if found else None


def require(store: TableStore, run_id: str, stage: str, refusal: type[Exception], message: str) -> dict[str, int]:
    """The earlier stage a stage builds on must have succeeded for this run; else `refusal(message)`."""
    counts = succeeded(store, run_id, stage)
    if counts is None:
        raise refusal(message)
    return counts


# The reconcile row's count saying the data-quality gates ran on the run's snapshot and passed (issue 34). Only such
# a run may be emitted or deleted (DESIGN invariant 19), and only such a run is a later snapshot's gate baseline.
GATES_PASSED = "gate.passed"


def gates_passed(row: Mapping[str, Any]) -> bool:
    """Whether a `runs` row is a reconcile that succeeded after its gates passed (not one run with --skip-gates)."""
    return (row["stage"] == "reconcile" and row["status"] == SUCCEEDED
            and int((row.get("counts") or {}).get(GATES_PASSED, 0)) == 1)


def ungated(run_id: str, reconciles: Iterable[Mapping[str, Any]]) -> str | None:
    """Why the run's plan may never be emitted or deleted, or None: its reconcile did not pass the gates. Every
    succeeded reconcile row must say they passed (a second reconcile of a run is refused; should one be recorded
    anyway, an ungated one still taints the run's `orphans`)."""
    done = [r for r in reconciles if r["stage"] == "reconcile" and r["status"] == SUCCEEDED]
    if done and all(gates_passed(r) for r in done):
        return None
    if not done:
        return f"run {run_id} has no successful reconcile that passed the data-quality gates: take a new snapshot"
    return (f"run {run_id} was reconciled without the data-quality gates (--skip-gates is for audits only): it can "
            "be shown and audited, never emitted or deleted; take a new snapshot (`sweeper snapshot`) and reconcile "
            "it with the gates")


def require_gated(store: TableStore, run_id: str, refusal: type[Exception]) -> None:
    """The run's reconcile passed the gates; else `refusal` (exit 3) saying why and what to do."""
    why = ungated(run_id, rows(store, run_id=run_id, stage="reconcile"))
    if why is not None:
        raise refusal(why)


def started_at(store: TableStore, run_id: str) -> datetime | None:
    """When the run's first stage started."""
    found = rows(store, run_id=run_id)
    return found[0]["started_at"] if found else None


def holder(store: TableStore, run_id: str) -> str | None:
    """The `runs` row that already uses `run_id`, as words, or None."""
    found = rows(store, run_id=run_id)
    if not found:
        return None
    last = found[-1]
    return f"its {last['stage']} stage is recorded ({last['status']})"
