"""The retention-debt step's reads on the driver (sweeper.retention.debt): what every topic needs to be selected,
read once, and the small per-namespace and per-ledger facts (policies, bundle ownership, quarantine, change events,
BookKeeper's view of a few ledgers, orphan totals)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sweeper.retention.debt_types import RetentionSettings
from sweeper.rules.retention import (
    DebtReason,
    NamespacePolicy,
    Policy,
    change_events_may_hold_policies,
    effective_policy,
)
from sweeper.table_schemas import ALL_TABLES
from sweeper.tables import TableStore
from sweeper.vocabulary import CHANGE_EVENTS, COMPACTION_CURSOR


@dataclass(frozen=True)
class _Topics:
    """The run's managed ledgers, cursors and per-topic ledger-list facts as the driver needs them, read once."""

    managed_ledgers: pa.Table  # managed_ledger, tenant, namespace, topic, ledger_count
    cursors: pa.Table  # managed_ledger, cursor, cursors_ledger_id, mark-delete, zk_mtime_ms, last_active_ms
    lists: pa.Table  # managed_ledger, ledger_id_min, ledger_id_max, ledger_id_count, size_sum: per ledger list
    firsts: pa.Table  # managed_ledger, ledger_id, entries, size, timestamp_ms: each list's first entry
    captured_at: datetime | None  # the snapshot's capture time


def _read_topics(store: TableStore, run_id: str) -> _Topics:
    """What `retention.may_owe` needs of every topic, without a topic's rows brought together: the ledger lists
    only as aggregates (grouped by the table engine) and their first entries, the cursors as they are."""
    mls = _run_table(store, "managed_ledgers", run_id,
                     ["managed_ledger", "tenant", "namespace", "topic", "ledger_count", "captured_at"])
    cursors = _run_table(store, "ml_cursors", run_id,
                         ["managed_ledger", "cursor", "cursors_ledger_id", "mark_delete_ledger_id",
                          "mark_delete_entry_id", "zk_mtime_ms", "last_active_ms"])
    aggregates = [("ledger_id", "min"), ("ledger_id", "max"), ("ledger_id", "count"), ("size", "sum")]
    if store.exists("ml_ledgers"):
        lists = store.aggregate_arrow("ml_ledgers", ["managed_ledger"], aggregates, {"run_id": run_id})
    else:  # a store written before the table existed: no lists
        lists = pa.table({"managed_ledger": pa.array([], pa.string()),
                          **{f"{column}_{fn}": pa.array([], pa.int64()) for column, fn in aggregates}})
    firsts = _run_table(store, "ml_ledgers", run_id, ["managed_ledger", "ledger_id", "entries", "size", "timestamp_ms"],
                        {"position": 0})
    return _Topics(mls.drop_columns(["captured_at"]), cursors, lists, firsts, pc.max(mls["captured_at"]).as_py())


def _run_table(store: TableStore, name: str, run_id: str, columns: list[str],
               where: dict[str, Any] | None = None) -> pa.Table:
    """A run's rows of `name`, read on the driver (none when the table does not exist: a store written before
    it was added)."""
    if not store.exists(name):
        from pyspark.sql.pandas.types import to_arrow_schema

        return to_arrow_schema(ALL_TABLES[name], timezone="UTC").empty_table().select(columns)
    return store.read_arrow(name, {"run_id": run_id, **(where or {})}, columns)


def _run_columns(store: TableStore, name: str, run_id: str, columns: list[str],
                 where: dict[str, Any] | None = None) -> dict[str, list[Any]]:
    """`_run_table` as Python lists per column."""
    table = _run_table(store, name, run_id, columns, where)
    return {c: table.column(c).to_pylist() for c in columns}


def _policies(store: TableStore, run_id: str, settings: RetentionSettings) -> dict[
        str, tuple[Policy | None, DebtReason | None, str]]:
    columns = ["namespace", "readable", "error", "retention_minutes", "retention_size_mb", "ttl_seconds", "deleted"]
    read = _run_columns(store, "namespace_policies", run_id, columns)
    policies = {}
    for namespace, readable, error, minutes, size_mb, ttl, deleted in zip(*read.values(), strict=True):
        policies[namespace] = effective_policy(NamespacePolicy(readable, error, minutes, size_mb, ttl, bool(deleted)),
                                               settings.broker)
    return policies


def _owned_bundles(store: TableStore, run_id: str) -> tuple[dict[str, tuple[tuple[int, int], ...]], bool]:
    read = _run_columns(store, "bundle_owners", run_id, ["namespace", "lower", "upper"], {"ephemeral": True})
    owned: dict[str, list[tuple[int, int]]] = {}
    for namespace, lower, upper in zip(*read.values(), strict=True):
        owned.setdefault(namespace, []).append((lower, upper))
    return {ns: tuple(v) for ns, v in owned.items()}, bool(owned)


def _quarantined_owners(store: TableStore, run_id: str) -> frozenset[str]:
    read = _run_columns(store, "quarantine", run_id, ["owner"], {"source": ["managed_ledger", "cursor"]})
    return frozenset(owner for owner in read["owner"] if owner is not None)


@dataclass(frozen=True)
class _ChangeEvents:
    """Each namespace's `__change_events` partitions as listed: enough to rule topic-level policies out."""

    namespace_of: dict[str, str]  # managed ledger -> tenant/namespace
    listed: list[tuple[str, int, int]]  # (managed ledger, entries, ledger id)
    compacted: frozenset[str]  # managed ledgers with a `__compaction` cursor

    def bookkeeper_ids(self) -> set[int]:
        return {ledger_id for _, _, ledger_id in self.listed}

    def namespaces_that_may_hold_policies(self, bookkeeper: dict[int, tuple[str | None, int | None, int | None]]
                                          ) -> frozenset[str]:
        by_ml: dict[str, list[tuple[int, int, str | None, int | None]]] = {}
        for managed_ledger, entries, ledger_id in self.listed:
            state, last_entry_id, _ = bookkeeper.get(ledger_id, (None, None, None))
            by_ml.setdefault(managed_ledger, []).append((entries, ledger_id, state, last_entry_id))
        return frozenset(ns for managed_ledger, ns in self.namespace_of.items()
                         if change_events_may_hold_policies(by_ml.get(managed_ledger, []),
                                                            managed_ledger in self.compacted))


def _change_events(store: TableStore, run_id: str, topics: _Topics, settings: RetentionSettings) -> _ChangeEvents:
    if settings.topic_policies not in ("system_topic", "admin"):  # "admin" asks the broker only about these
        return _ChangeEvents({}, [], frozenset())
    mls = topics.managed_ledgers
    topic = mls["topic"]
    events = mls.filter(pc.fill_null(pc.or_(pc.equal(topic, CHANGE_EVENTS),
                                            pc.starts_with(topic, f"{CHANGE_EVENTS}-partition-")), False))
    namespace_of = {managed_ledger: f"{tenant}/{namespace}" for managed_ledger, tenant, namespace in zip(
        *(events[c].to_pylist() for c in ("managed_ledger", "tenant", "namespace")), strict=True)}
    if not namespace_of:
        return _ChangeEvents({}, [], frozenset())
    # A handful of `__change_events` topics: their ledgers and cursors are picked out of the big tables by name.
    ledgers = _run_columns(store, "ml_ledgers", run_id, ["managed_ledger", "entries", "ledger_id"],
                           {"managed_ledger": list(namespace_of)})
    listed = [(managed_ledger, entries or 0, ledger_id) for managed_ledger, entries, ledger_id
              in zip(*ledgers.values(), strict=True) if ledger_id is not None]
    compacted = _run_columns(store, "ml_cursors", run_id, ["managed_ledger"],
                             {"managed_ledger": list(namespace_of), "cursor": COMPACTION_CURSOR})
    return _ChangeEvents(namespace_of, listed, frozenset(compacted["managed_ledger"]))


def _bookkeeper_facts(store: TableStore, run_id: str, ids: set[int]) -> dict[int, tuple[str | None, int | None,
                                                                                         int | None]]:
    """(state, last entry id, length) of a few ledgers."""
    if not ids:
        return {}
    read = _run_columns(store, "bk_ledgers", run_id, ["ledger_id", "state", "last_entry_id", "length"],
                        {"ledger_id": sorted(ids)})
    return {ledger_id: (state, last_entry_id, length)
            for ledger_id, state, last_entry_id, length in zip(*read.values(), strict=True)}


OrphanTotals = dict[tuple[str | None, str | None], tuple[int, int]]


def orphan_totals(store: TableStore, run_id: str) -> OrphanTotals:
    """(candidate ledgers, their bytes) per (tenant, namespace) of a run's orphans."""
    read = _run_columns(store, "orphans", run_id, ["tenant", "namespace", "size_bytes"], {"status": "candidate"})
    totals: dict[tuple[str | None, str | None], tuple[int, int]] = {}
    for tenant, namespace, size in zip(*read.values(), strict=True):
        count, total = totals.get((tenant, namespace), (0, 0))
        totals[(tenant, namespace)] = (count + 1, total + (size or 0))
    return totals
