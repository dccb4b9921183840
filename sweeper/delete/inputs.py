"""The delete's inputs: the run's emitted records and the due retries (the retry queue, with its dead letters), an
operator's ledger list, and what the snapshot in the tables says of them (buckets, shadow topics, ids never seen).

The run's own records bring what reconcile carried for them in `emitted` (issue 46): the buckets the run may delete
from, and each ledger's layout for `delete_results` (reclaim's input). Shadow topics and ids never seen are read from
the snapshot tables still: they are about every snapshot, not about the run's plan (`_shadows`, `_never_seen`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

from sweeper.codecs import pending_delete
from sweeper.codecs.bookkeeper import decode_ledger_metadata
from sweeper.codecs.layout import LedgerLayout, ledger_path
from sweeper.delete.errors import DeleteRefused
from sweeper.delete.records import SOURCE_EMITTED, SOURCE_JSON, SOURCE_RETRY, PendingRecord
from sweeper.delete.results import FAILED
from sweeper.delete.settings import DeleteSettings
from sweeper.names import managed_ledger_for_topic, topic_for_managed_ledger
from sweeper.objectstore.base import store_kind
from sweeper.scan.bookkeeper import split_custom_metadata
from sweeper.table_schemas import DEAD_LETTER, RETRY_QUEUE
from sweeper.tables import TableStore

QUEUED, RESOLVED, DEAD_LETTERED = "queued", "resolved", "dead_lettered"


def _latest_by_key(rows: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    latest: dict[str, Mapping[str, Any]] = {}
    for row in sorted(rows, key=lambda r: r["recorded_at"]):
        latest[row["record_key"]] = row
    return latest


def retry_states(store: TableStore) -> dict[str, Mapping[str, Any]]:
    if not store.exists("retry_queue"):
        return {}
    return _latest_by_key(store.read("retry_queue").toArrow().to_pylist())


Layouts = dict[str, Mapping[str, Any] | None]  # record key -> the `bk_layout` its emitted row carries


def load_inputs(store: TableStore, run_id: str, now: datetime, limit: int | None = None,
                carried: Layouts | None = None) -> tuple[list[PendingRecord], dict[str, int]]:
    """The run's emitted records without a final result yet, and every queued record that is due,
    by record key; at most `limit` of them (`counts["selected"]` says how many there were). `carried`, when given,
    gets each picked emitted record's carried `bk_layout` (null for an offloaded copy) by record key, for those
    whose `emitted` row carries one (sweeper.emit.carry): `delete_results` keeps it for reclaim.

    The run's emitted records are filtered, counted and cut to the first `limit` in Spark: only
    what this run will process reaches the driver, not every record the run ever emitted. The
    retry queue (failed deletes only) is read on the driver as before.
    """
    counts = {"emitted": 0, "already_final": 0, "not_due": 0, "due_retries": 0}
    queue = retry_states(store)
    picked: list[PendingRecord] = []
    pending = 0
    if store.exists("emitted"):
        emitted = (store.read("emitted", where={"run_id": run_id}).select("record_key", "payload", "carried",
                                                                           "bk_layout")
                   .dropDuplicates(["record_key"]))
        counts["emitted"] = emitted.count()
        todo = emitted
        if store.exists("delete_results"):
            final = store.read("delete_results", where={"run_id": run_id}).where(
                (F.col("outcome") != FAILED) & ~F.col("dry_run")).select("record_key")
            counts["already_final"] = emitted.join(final, "record_key", "left_semi").count()
            todo = todo.join(final, "record_key", "left_anti")
        if queue:  # the queue governs records that failed before
            spark = emitted.sparkSession
            todo = todo.join(spark.createDataFrame([(k,) for k in queue], "record_key string"), "record_key",
                             "left_anti")
        pending = todo.count()
        head = todo.orderBy("record_key")
        if limit is not None:
            head = head.limit(limit)
        rows = head.toArrow().to_pylist()
        picked = [PendingRecord(row["record_key"], SOURCE_EMITTED, run_id, 0, row["payload"]) for row in rows]
        if carried is not None:
            carried.update((row["record_key"], row["bk_layout"]) for row in rows if row["carried"])
    retries: list[PendingRecord] = []
    for key, row in queue.items():
        if row["state"] != QUEUED:
            continue
        due = row["next_attempt_at"]
        if due is not None and due.replace(tzinfo=due.tzinfo or UTC) > now:
            counts["not_due"] += 1
            continue
        counts["due_retries"] += 1
        retries.append(PendingRecord(key, SOURCE_RETRY, row["run_id"], int(row["attempts"]), row["payload"]))
    selected = sorted(picked + retries, key=lambda p: p.record_key)
    counts["selected"] = pending + len(retries)
    return (selected if limit is None else selected[:limit]), counts


def read_operator_list(path: str | Path) -> list[Mapping[str, Any]]:
    """The entries of an operator's ledger list, each an object (a bare ledger id N becomes `{"ledgerId": N}`);
    DeleteRefused naming the file and the fault when it cannot be read or is not such a list."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DeleteRefused(f"cannot read the ledger list {path}: {exc}") from exc
    if isinstance(entries, Mapping):
        entries = entries.get("ledgers")
    if not isinstance(entries, list):
        raise DeleteRefused(f"{path} must hold a JSON list of ledgers (or {{\"ledgers\": [...]}})")
    out: list[Mapping[str, Any]] = []
    for n, entry in enumerate(entries):
        if isinstance(entry, int) and not isinstance(entry, bool):
            entry = {"ledgerId": entry}
        if not isinstance(entry, Mapping):
            raise DeleteRefused(f"{path} entry {n} is not an object or a ledger id: {entry!r}")
        out.append(entry)
    return out


def records_from_json(entries: list[Mapping[str, Any]], client: Any, ledgers_root: str,
                      layout: LedgerLayout) -> list[PendingRecord]:
    """An operator's list (read_operator_list): full PendingDeleteLedgerInfo objects, or `{"ledgerId": N}`
    completed from the ledger's own metadata (its ownership then only decides the referrer to check; every
    other rule holds)."""
    out: list[PendingRecord] = []
    for n, entry in enumerate(entries):
        record = dict(entry) if "ledgerType" in entry else _record_from_metadata(entry, client, ledgers_root, layout)
        unencodable = ""
        try:
            payload = pending_delete.encode({**_RECORD_DEFAULTS, **record})
        except Exception as exc:  # the delete path reports it as invalid, with the reason
            payload = json.dumps(record, default=str).encode()
            try:
                pending_delete.validate({**_RECORD_DEFAULTS, **record})
                unencodable = f"entry {n} is not a PendingDeleteLedgerInfo: {exc}"
            except pending_delete.InvalidPendingDelete as invalid:
                unencodable = f"entry {n}: {invalid}"
        out.append(PendingRecord(f"json/{n}/{record.get('ledgerType')}/{record.get('ledgerId')}", SOURCE_JSON, None,
                                 0, payload, unencodable))
    return out


_RECORD_DEFAULTS: dict[str, Any] = {"topicName": None, "cursorName": None, "schemaId": None, "offloadContext": None,
                                    "properties": {}, "reason": "operator_list", "runId": None}


def _record_from_metadata(entry: Mapping[str, Any], client: Any, ledgers_root: str,
                          layout: LedgerLayout) -> dict[str, Any]:
    ledger_id = entry.get("ledgerId", entry.get("ledger_id"))
    base = {**_RECORD_DEFAULTS, "ledgerType": "LEDGER", "ledgerId": ledger_id, "ledgerComponent": "MANAGED_LEDGER"}
    if not isinstance(ledger_id, int) or isinstance(ledger_id, bool) or ledger_id < 0:
        return base  # refused as invalid by the executor, with the reason
    try:
        data, _ = client.get(ledger_path(ledgers_root, ledger_id, layout))
        custom, _ = split_custom_metadata(decode_ledger_metadata(data).custom_metadata)
    except Exception:  # missing or unreadable: the executor reports already_gone / invalid
        return base
    component = pending_delete.COMPONENTS.get(custom.get("component") or "", "MANAGED_LEDGER")
    if component == "MANAGED_LEDGER" and custom.get("pulsar/cursor"):
        component = "MANAGED_CURSOR"
    ml = custom.get("pulsar/managed-ledger")
    topic = custom.get("pulsar/compactedTopic") or custom.get("pulsar/delayedIndexTopic")
    if ml:
        # None for a name Pulsar cannot have written: the executor then refuses the record as invalid.
        topic = topic_for_managed_ledger(ml)
    properties = {"bucket_key": custom["pulsar/delayedIndexBucketKey"]} if custom.get(
        "pulsar/delayedIndexBucketKey") else {}
    return {**base, "ledgerComponent": component, "topicName": topic, "cursorName": custom.get("pulsar/cursor"),
            "schemaId": custom.get("pulsar/schemaId"), "properties": properties}


def _buckets(store: TableStore, settings: DeleteSettings, run_id: str | None) -> tuple[tuple[str, str, str], ...]:
    """Buckets named by the offload contexts of the run's snapshot (or the latest), plus the configured extras."""
    found: dict[str, tuple[str, str, str]] = {}
    if store.exists("ml_ledgers"):
        frame = store.read("ml_ledgers", where=None if run_id is None else {"run_id": run_id}).where(
            F.col("offload_bucket").isNotNull())
        for r in frame.select("offload_bucket", "offload_region", "offload_endpoint").distinct().collect():
            found[r["offload_bucket"]] = (r["offload_bucket"], r["offload_region"] or "", r["offload_endpoint"] or "")
    return _with_extras(found, settings)


def _with_extras(found: dict[str, tuple[str, str, str]],
                 settings: DeleteSettings) -> tuple[tuple[str, str, str], ...]:
    """`found` and the buckets `[offload] extra_buckets` adds (an older offloader's: no context names them)."""
    for bucket in (b.strip() for b in settings.offload.extra_buckets.split(",")):
        if bucket and bucket not in found:
            found[bucket] = (bucket, settings.offload.region, "")
    return tuple(found[b] for b in sorted(found))


def other_stores(store: TableStore, run_id: str | None, inputs: Sequence[PendingRecord]) -> tuple[tuple[str, str], ...]:
    """(bucket, driver) of the containers the offload contexts put on a store other than S3, read only when an
    offloaded copy is among the inputs: from what the run's `emitted` rows carry (issue 46), else from the snapshot's
    offload contexts (the run's, or every snapshot's) as before: for an operator's list, the topic, a due retry of an
    offloaded copy, or rows an older version emitted. A bucket named by both an S3 context and another store's is
    listed here: refused rather than guessed."""
    if all(item.record_key.startswith("LEDGER/") for item in inputs):
        return ()
    retried_copy = any(item.source == SOURCE_RETRY and not item.record_key.startswith("LEDGER/") for item in inputs)
    pairs = None if run_id is None or retried_copy else _carried_drivers(store, run_id)
    if pairs is None:
        if not store.exists("ml_ledgers"):
            return ()
        groups = store.aggregate_arrow("ml_ledgers", ["offload_bucket", "offload_driver"], [("ledger_id", "count")],
                                       where=None if run_id is None else {"run_id": run_id}).to_pylist()
        pairs = {(g["offload_bucket"], g["offload_driver"]) for g in groups if g["offload_bucket"] is not None}
    return tuple(sorted((bucket, driver) for bucket, driver in pairs if store_kind(driver) != "s3"))


def _carried_drivers(store: TableStore, run_id: str) -> set[tuple[str, str]] | None:
    """(bucket, driver) as the run's `emitted` rows carry them; None when the run emitted nothing, a row carries
    nothing, or a bucket comes without its driver (emitted before issue 48 carried it): the snapshot is read then."""
    if not store.exists("emitted"):
        return None
    groups = store.aggregate_arrow("emitted", ["carried", "offload_bucket", "offload_driver"],
                                   [("record_key", "count")], where={"run_id": run_id}).to_pylist()
    if not groups or any(g["carried"] is None or (g["offload_bucket"] is not None and g["offload_driver"] is None)
           for g in groups):
        return None
    return {(g["offload_bucket"], g["offload_driver"]) for g in groups if g["offload_bucket"] is not None}


def run_buckets(store: TableStore, settings: DeleteSettings, run_id: str,
                inputs: Sequence[PendingRecord]) -> tuple[tuple[str, str, str], ...]:
    """The buckets a delete of the run's emitted records (and due retries) may delete from.

    From what the run's `emitted` rows carry (each offloaded copy's bucket, when the run's offload contexts name it,
    with their region and endpoint), plus the configured extras. A bucket is only ever asked for by the object records
    being deleted, and for every one of the run's own records that is the same answer as the snapshot's list
    (`_buckets`): reconcile joined the same offload contexts. The snapshot is read instead, as before, when the run's
    rows carry nothing (emitted by an older version), or when a due retry is an offloaded copy: it may name a bucket
    the run's snapshot knows but none of its own records does."""
    carried = _carried_buckets(store, run_id)
    retried_copy = any(item.source == SOURCE_RETRY and not item.record_key.startswith("LEDGER/") for item in inputs)
    if carried is None or retried_copy:
        return _buckets(store, settings, run_id)
    return _with_extras(carried, settings)


def _carried_buckets(store: TableStore, run_id: str) -> dict[str, tuple[str, str, str]] | None:
    """bucket -> (bucket, region, endpoint) as the run's `emitted` rows carry them; None when a row carries nothing
    (an older version emitted it). One aggregation: a few groups, whatever the number of records."""
    if not store.exists("emitted"):
        return {}
    groups = store.aggregate_arrow("emitted", ["carried", "offload_bucket", "offload_region", "offload_endpoint"],
                                   [("record_key", "count")], where={"run_id": run_id}).to_pylist()
    if any(g["carried"] is None for g in groups):
        return None
    return {g["offload_bucket"]: (g["offload_bucket"], g["offload_region"] or "", g["offload_endpoint"] or "")
            for g in groups if g["offload_bucket"] is not None}


def listed_ledger_ids(entries: list[Mapping[str, Any]]) -> set[int]:
    """The BookKeeper ledger ids an operator's list names (offloaded copies are checked by their objects)."""
    ids = set()
    for entry in entries:
        ledger_id = entry.get("ledgerId", entry.get("ledger_id"))
        if entry.get("ledgerType", "LEDGER") == "LEDGER" and isinstance(ledger_id, int) \
                and not isinstance(ledger_id, bool):
            ids.add(ledger_id)
    return ids


def _never_seen(store: TableStore, ids: set[int]) -> frozenset[int]:
    """Those of `ids` that no snapshot of the tables lists (all of them with no snapshot at all).

    Read from `bk_ledgers`, not carried: the ids are an operator's list, which need have no orphan row or emitted
    record at all, and "never listed" is a question about every snapshot, not about one run's plan."""
    if not ids or not store.exists("bk_ledgers"):
        return frozenset(ids)
    seen = store.read_arrow("bk_ledgers", where={"ledger_id": frozenset(ids)}, columns=["ledger_id"])
    return frozenset(ids - set(seen.column("ledger_id").to_pylist()))


def _shadows(store: TableStore) -> tuple[tuple[str, tuple[str, ...]], ...] | None:
    """Shadow topics (PIP-180) seen by any snapshot, by source managed ledger; None with no snapshot at all.

    A shadow topic's managed ledger lists its source's ledgers, so each is a referrer the delete must
    re-read. A shadow created after the snapshot copies its source's list as it is then, which no
    longer holds a ledger the source had dropped, so a snapshot's view is enough.

    Not carried in `emitted` (issue 46): it decides which referrers the live re-verification re-reads, for every
    input (retries, operator lists and topic records have no emitted row), and it is the union of every snapshot.
    One run's plan would be a narrower list: fewer referrers re-read is not a change to make to save one read.
    """
    if not store.exists("managed_ledgers"):
        return None
    by_source: dict[str, set[str]] = {}
    rows = (store.read("managed_ledgers").where(F.col("shadow_source").isNotNull())
            .select("shadow_source", "managed_ledger").distinct().collect())
    for row in rows:
        source = managed_ledger_for_topic(row["shadow_source"])
        if source is not None:
            by_source.setdefault(source, set()).add(row["managed_ledger"])
    return tuple((source, tuple(sorted(names))) for source, names in sorted(by_source.items()))


# ---- dead letters --------------------------------------------------------------------------------

def dead_letters(store: TableStore) -> list[Mapping[str, Any]]:
    """Records whose latest dead-letter row is `dead` (not yet re-driven)."""
    if not store.exists("dead_letter"):
        return []
    return [r for r in _latest_by_key(store.read_arrow("dead_letter").to_pylist()).values() if r["state"] == "dead"]


def redrive(store: TableStore, record_keys: Sequence[str] | None = None) -> int:
    """Queue dead letters again with a fresh attempt budget; all of them when `record_keys` is None."""
    now = datetime.now(UTC)
    chosen = [r for r in dead_letters(store) if record_keys is None or r["record_key"] in record_keys]
    if not chosen:
        return 0
    store.append_rows("retry_queue", [{
        "run_id": r["run_id"], "recorded_at": now, "record_key": r["record_key"], "ledger_id": r["ledger_id"],
        "state": QUEUED, "attempts": 0, "next_attempt_at": now, "last_error": r["last_error"], "payload": r["payload"],
    } for r in chosen], RETRY_QUEUE, commit_metadata={"stage": "dlq_redrive"})
    store.append_rows("dead_letter", [{**r, "recorded_at": now, "state": "redriven"} for r in chosen], DEAD_LETTER,
                      commit_metadata={"stage": "dlq_redrive"})
    return len(chosen)
