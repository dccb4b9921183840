"""Schemas of the Delta tables, in one place.

Times read from metadata stay milliseconds since the epoch (`*_ms`, as BookKeeper and Pulsar
store them); `captured_at` is when the run read them. Every row carries its `run_id`.
Ledger passwords and offload driver credentials are never columns (safety invariant 8).
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

S, L, INT, B, BIN, TS = StringType(), LongType(), IntegerType(), BooleanType(), BinaryType(), TimestampType()


def _schema(*fields: tuple[str, DataType] | tuple[str, DataType, bool]) -> StructType:
    out = []
    for spec in fields:
        name, dtype = spec[0], spec[1]
        nullable = spec[2] if len(spec) == 3 else True
        out.append(StructField(name, dtype, nullable))
    return StructType(out)


RUN_COLUMNS: tuple[tuple[str, DataType, bool], ...] = (("run_id", S, False), ("captured_at", TS, False))

BK_LEDGERS = _schema(
    *RUN_COLUMNS,
    ("ledger_id", L, False),
    ("path", S, False),
    ("tree", S),  # short | long | flat
    ("zk_version", INT),
    ("zk_ctime_ms", L),
    ("zk_mtime_ms", L),
    ("format_version", INT),
    ("state", S),
    ("ensemble_size", INT),
    ("write_quorum", INT),
    ("ack_quorum", INT),
    ("last_entry_id", L),
    ("length", L),
    ("metadata_ctime_ms", L),
    ("created_ms", L),  # metadata ctime when present, else the znode's ctime
    ("created_source", S),  # metadata | znode
    ("digest_type", S),
    ("segments", INT),
    ("bookies", ArrayType(S)),
    ("custom_metadata", MapType(S, S)),
    ("custom_metadata_binary", MapType(S, BIN)),  # values that are not UTF-8 (e.g. pulsar/compactedTo)
    ("is_pulsar", B),
    ("component", S),
    ("managed_ledger", S),
    ("cursor", S),
    ("schema_id", S),
    ("compacted_topic", S),
    ("bucket_key", S),
    ("bucket_topic", S),
    ("bucket_cursor", S),
    # Each segment's first entry id and ensemble, in order (issue 44): where each bookie holds which entries, for each
    # bookie's expected share of a deleted ledger (sweeper.reclaim.decide). Null in a snapshot an older version took.
    ("segment_first_entries", ArrayType(L)),
    ("segment_ensembles", ArrayType(ArrayType(S))),
)

MANAGED_LEDGERS = _schema(
    *RUN_COLUMNS,
    ("managed_ledger", S, False),
    ("tenant", S),
    ("namespace", S),
    ("topic", S),  # decoded local name
    ("topic_name", S),  # persistent://tenant/namespace/topic
    ("path", S),
    ("zk_version", INT),
    ("zk_ctime_ms", L),
    ("zk_mtime_ms", L),
    ("compression", S),
    ("ledger_count", INT),
    ("cursor_count", INT),
    ("properties", MapType(S, S)),
    ("terminated", B),
    ("shadow_source", S),
)

ML_LEDGERS = _schema(
    *RUN_COLUMNS,
    ("managed_ledger", S, False),
    ("tenant", S),
    ("namespace", S),
    ("topic", S),
    ("ledger_id", L, False),
    ("position", INT),
    ("is_current", B),
    ("entries", L),
    ("size", L),
    ("timestamp_ms", L),
    ("offloaded", B),
    ("offload_complete", B),
    ("offload_bookkeeper_deleted", B),
    ("offload_uuid", S),
    ("offload_timestamp_ms", L),
    ("offload_driver", S),
    ("offload_bucket", S),
    ("offload_region", S),
    ("offload_endpoint", S),
)

ML_CURSORS = _schema(
    *RUN_COLUMNS,
    ("managed_ledger", S, False),
    ("tenant", S),
    ("namespace", S),
    ("topic", S),
    ("cursor", S, False),  # decoded name
    ("cursor_znode", S),  # URL-encoded, as in ZooKeeper and in ledger custom metadata
    ("path", S),
    ("zk_version", INT),
    ("zk_mtime_ms", L),
    ("last_active_ms", L),  # ManagedCursorInfo.lastActive, written with the znode (null: not recorded)
    ("cursors_ledger_id", L),  # -1: state kept in ZooKeeper, no cursor ledger
    ("mark_delete_ledger_id", L),
    ("mark_delete_entry_id", L),
    ("long_properties", MapType(S, L)),
    ("cursor_properties", MapType(S, S)),
)

# References found in cursor state: delayed-delivery bucket snapshots and compacted ledgers.
CURSOR_LEDGER_REFS = _schema(
    *RUN_COLUMNS,
    ("managed_ledger", S, False),
    ("topic_name", S),
    ("cursor", S),
    # delayed_bucket | compacted_ledger | compacted_ledger_lagging | compacted_ledger_unreadable |
    # compacted_ledger_unrecorded (sweeper.scan.pulsar.compaction_ref_row)
    ("kind", S, False),
    ("ref_key", S),
    ("ledger_id", L),  # null for compacted_ledger_unreadable / _unrecorded
)

# Namespaces this cluster's metadata knows: a ledger of any other namespace may be another cluster's.
NAMESPACES = _schema(
    *RUN_COLUMNS,
    ("namespace", S, False),  # tenant/namespace (tenant/cluster/namespace for old names)
    ("sources", ArrayType(S)),  # managed_ledgers | policies
)

# Each namespace's retention and TTL as its Policies JSON in the configuration store sets them (null: not
# set, the broker default applies). Only these fields: the JSON also holds offload and auth settings.
NAMESPACE_POLICIES = _schema(
    *RUN_COLUMNS,
    ("namespace", S, False),
    ("readable", B, False),  # false: the JSON could not be read as Pulsar would (`error` says why)
    ("error", S),
    ("retention_minutes", INT),
    ("retention_size_mb", L),
    ("ttl_seconds", INT),
    ("deleted", B),
    ("zk_version", INT),
)

# Bundles a live broker owns (modular load manager: ephemeral znodes under [retention] bundle_owners_root).
BUNDLE_OWNERS = _schema(
    *RUN_COLUMNS,
    ("namespace", S, False),
    ("bundle", S, False),  # 0xlower_0xupper
    ("lower", L),
    ("upper", L),
    ("ephemeral", B),
    ("owner", S),  # the owning broker's nativeUrl
)

SCHEMA_LEDGERS = _schema(
    *RUN_COLUMNS,
    ("schema_id", S, False),
    ("path", S),
    ("zk_version", INT),
    ("version", L),
    ("ledger_id", L, False),
    ("entry_id", L),
    ("is_latest", B),
)

OFFLOAD_OBJECTS = _schema(
    *RUN_COLUMNS,
    ("bucket", S, False),
    ("key", S, False),
    ("uuid", S, False),
    ("ledger_id", L, False),
    ("role", S),  # data | index, from the key
    ("size", L),
    ("last_modified_ms", L),
    ("metadata_role", S),  # the object's user metadata, when read
    ("managed_ledger", S),  # user metadata `managedledgername`
    ("cluster_name", S),  # user metadata `pulsarclustername`: which Pulsar cluster offloaded it
    ("metadata_read", B),  # whether the user metadata was read ([offload] head_metadata)
)

QUARANTINE = _schema(
    *RUN_COLUMNS,
    ("source", S, False),  # bookkeeper | managed_ledger | cursor | schema | layout | offload
    ("path", S, False),
    ("ledger_id", L),
    ("owner", S),  # managed ledger or schema id the znode belongs to, when known from its path
    ("error_kind", S, False),
    ("error", S, False),
    ("zk_version", INT),
    ("raw", BIN),  # the bytes as read, so nothing is lost
)

# What the delete and reclaim stages need of a BookKeeper ledger, carried from the planning snapshot's `bk_ledgers` row
# (same names and types) through `orphans` -> `emitted` -> `delete_results` (issue 46), so reclaim need not read the
# snapshot again. A plan, not proof: the delete re-reads the live metadata before it deletes (DESIGN.md invariant 5).
BK_LAYOUT = StructType([StructField(name, BK_LEDGERS[name].dataType) for name in (
    "length", "ensemble_size", "write_quorum", "state", "last_entry_id", "bookies", "segment_first_entries",
    "segment_ensembles")])

# Carried (issue 46): true in every row this version writes to `orphans` and `emitted` (and to `delete_results` for a
# record with an `emitted` row); null in a row an older version wrote, or one with nothing it could carry, whose readers
# then go back to the snapshot tables as that version did. A carried value is null where there is nothing to carry
# (`bk_layout` of an offloaded copy).
CARRIED_COLUMNS: tuple[tuple[str, DataType], ...] = (
    ("carried", B),
    ("bk_layout", BK_LAYOUT),  # ledger rows
    # offloaded objects: their bucket as the run's offload contexts (ml_ledgers) name it (null: none does, say an
    # [offload] extra_buckets one), with that context's region, endpoint and driver (issue 48: the store it lives on,
    # which the delete must reach it through)
    ("offload_bucket", S),
    ("offload_region", S),
    ("offload_endpoint", S),
    ("offload_driver", S),
)

ORPHANS = _schema(
    ("run_id", S, False),
    ("captured_at", TS, False),
    ("object_type", S, False),  # ledger | offload_object | missing_ledger
    ("ledger_id", L),
    # candidate | young | out_of_scope | unknown | missing | stale_pointer | other_cluster | protected: only
    # candidates act
    ("status", S, False),
    ("verdict", S, False),  # orphan | unknown | missing (sweeper.rules.classify)
    ("reason", S, False),
    ("detail", S),
    ("component", S),
    ("tenant", S),
    ("namespace", S),
    ("topic", S),
    ("managed_ledger", S),
    ("cursor", S),
    ("schema_id", S),
    ("bucket_key", S),
    ("size_bytes", L),
    ("created_ms", L),
    ("age_ms", L),
    ("created_source", S),
    ("zk_path", S),
    ("zk_version", INT),
    ("s3_bucket", S),
    ("s3_key", S),
    ("offload_uuid", S),
    *CARRIED_COLUMNS,
)

ORPHAN_REPORT = _schema(
    ("run_id", S, False),
    ("tenant", S),
    ("namespace", S),
    ("topic", S),
    ("orphans", L),
    ("reclaimable_bytes", L),
    ("min_age_days", DoubleType()),
    ("median_age_days", DoubleType()),
    ("max_age_days", DoubleType()),
    ("reasons", ArrayType(S)),
)

RUNS = _schema(
    ("run_id", S, False),
    ("stage", S, False),
    ("status", S, False),  # succeeded | failed | refused | interrupted
    ("started_at", TS, False),
    ("finished_at", TS, False),
    ("duration_s", DoubleType()),
    ("counts", MapType(S, L)),
    ("config_hash", S),
    ("engine", S),
    ("message", S),
)

# The pending-delete system topic as read by the snapshot (a reader: nothing is acknowledged).
PENDING_DELETES = _schema(
    *RUN_COLUMNS,
    ("topic_partition", INT, False),
    ("message_id", S, False),  # ledger:entry:batch of the system topic's partition
    ("publish_time_ms", L),
    ("message_key", S),
    ("record_key", S, False),  # what makes two messages the same request (sweeper.codecs.pending_delete.record_key)
    ("ledger_id", L, False),
    ("ledger_type", S, False),  # LEDGER | OFFLOAD_LEDGER
    ("component", S, False),
    ("topic_name", S),
    ("cursor", S),
    ("schema_id", S),
    ("offload_uuid", S),
    ("s3_bucket", S),
    ("s3_keys", ArrayType(S)),
    ("reason", S),
    ("source_run_id", S),  # the run that emitted it (null for records from other producers)
    ("payload", BIN, False),
)

SNAPSHOT_TABLES: dict[str, StructType] = {
    "bk_ledgers": BK_LEDGERS,
    "managed_ledgers": MANAGED_LEDGERS,
    "ml_ledgers": ML_LEDGERS,
    "ml_cursors": ML_CURSORS,
    "cursor_ledger_refs": CURSOR_LEDGER_REFS,
    "schema_ledgers": SCHEMA_LEDGERS,
    "quarantine": QUARANTINE,
    "namespaces": NAMESPACES,
    "namespace_policies": NAMESPACE_POLICIES,
    "bundle_owners": BUNDLE_OWNERS,
}
ZK_SNAPSHOT_TABLES = dict(SNAPSHOT_TABLES)

# What the snapshot read from each peer cluster's metadata ([safety] peer_metadata): the clusters sharing these
# bookies. `kind` (sweeper.rules.references): peer_read | peer_unread (why in `referrer`) | reference | owner |
# namespace | quarantined_owner. Reconcile takes the union of every cluster's references.
PEER_REFERENCES = _schema(
    *RUN_COLUMNS,
    ("cluster", S, False),  # the peer's metadata connect string, as configured
    ("kind", S, False),
    ("ledger_id", L),
    ("ref_kind", S),
    ("owner", S),
    ("referrer", S),
)
SNAPSHOT_TABLES = {**SNAPSHOT_TABLES, "offload_objects": OFFLOAD_OBJECTS, "pending_deletes": PENDING_DELETES,
                   "peer_references": PEER_REFERENCES}

# What the emit stage published, one row per record, committed once per stage run.
EMITTED = _schema(
    ("run_id", S, False),
    ("emitted_at", TS, False),
    ("record_key", S, False),
    ("ledger_id", L, False),
    ("ledger_type", S, False),
    ("component", S, False),
    ("topic_name", S),
    ("topic_partition", INT, False),
    ("producer_name", S, False),
    ("sequence_id", L, False),
    ("message_id", S),  # null when the broker already held it (deduplicated by producer name and sequence id)
    ("status", S, False),  # published | already_published | refused_oversize
    ("payload", BIN, False),  # the Avro record as sent, so the delete stage needs no topic read
    # The record's orphan rows' carried values: tables only, the record on the topic keeps PIP-186's schema.
    *CARRIED_COLUMNS,
)

# One `emit` invocation's trace (issue 22): `started` before any send, an `intent` per producer slot before its
# sends (its partition, producer and sequence ids: what may be on the topic), `closed` once `emitted` holds every
# row. An attempt left unclosed (a kill) is folded in by the next emit: `runs` gets it as `interrupted`.
EMIT_JOURNAL = _schema(
    ("run_id", S, False),
    ("attempt_id", S, False),
    ("at", TS, False),
    ("phase", S, False),  # started | intent | closed
    ("topic_partition", INT),
    ("producer_name", S),
    ("first_sequence_id", L),
    ("last_sequence_id", L),
    ("records", L),
    ("detail", S),
)

# Phase 2: one row per record per attempt that ended a task's work on it (PIP-186's outcomes).
DELETE_RESULTS = _schema(
    ("run_id", S, False),
    ("origin_run_id", S),  # the run that planned it (differs for retried and operator-listed records)
    ("finished_at", TS, False),
    ("record_key", S, False),
    ("ledger_id", L),
    ("ledger_type", S),
    ("component", S),
    ("topic_name", S),
    # deleted | would_delete | already_gone | not_found | in_use | mismatch | invalid | refused | failed
    ("outcome", S, False),
    ("detail", S),
    ("error", S),
    ("attempt", INT, False),  # attempts so far across runs, this one included
    ("duration_ms", L),
    ("zk_path", S),
    ("zk_version", INT),
    ("s3_bucket", S),
    ("s3_keys", ArrayType(S)),
    ("dry_run", B, False),
    ("source", S, False),  # emitted | retry_queue | from_json
    # From the record's `emitted` row (source `emitted`); null for other sources, and from older versions: reclaim
    # then reads `bk_ledgers` for the ledger (sweeper.reclaim.stage.deleted_ledgers).
    ("carried", B),
    ("bk_layout", BK_LAYOUT),
)

# What each delete attempt is about to do and then did, appended by the Spark tasks themselves in one small
# commit per chunk (before its compare-and-set deletes, and after), so a driver killed at any instant leaves
# a record of every ledger it touched. The next delete run folds an interrupted attempt's rows into
# delete_results (an intent whose znode is gone was deleted by that attempt) and closes it.
DELETE_JOURNAL = _schema(
    ("run_id", S, False),
    ("attempt_id", S, False),  # one `delete` invocation; a run id is resumed by later attempts
    ("at", TS, False),
    ("phase", S, False),  # intent | outcome | closed
    ("record_key", S),
    ("source", S),
    ("origin_run_id", S),
    ("ledger_id", L),
    ("ledger_type", S),
    ("zk_path", S),
    ("outcome", S),
    ("detail", S),
    ("zk_version", INT),
    ("attempt", INT),
)

# Records still failing after a task's retries: due again at next_attempt_at. Append-only; the
# latest row per record_key says whether it is queued, resolved or dead-lettered.
RETRY_QUEUE = _schema(
    ("run_id", S, False),
    ("recorded_at", TS, False),
    ("record_key", S, False),
    ("ledger_id", L),
    ("state", S, False),  # queued | resolved | dead_lettered
    ("attempts", INT, False),
    ("next_attempt_at", TS),
    ("last_error", S),
    ("payload", BIN, False),
)

DEAD_LETTER = _schema(
    ("run_id", S, False),
    ("recorded_at", TS, False),
    ("record_key", S, False),
    ("ledger_id", L),
    ("state", S, False),  # dead | redriven
    ("attempts", INT, False),
    ("last_error", S),
    ("payload", BIN, False),
)

# Reconcile's verdict on every pending delete found on the topic.
PENDING_DELETE_STATUS = _schema(
    ("run_id", S, False),
    ("record_key", S, False),
    ("ledger_id", L, False),
    ("ledger_type", S, False),
    ("component", S, False),
    ("topic_name", S),
    ("source_run_id", S),
    ("messages", L, False),  # copies of the record on the topic
    ("first_publish_time_ms", L),
    ("state", S, False),  # stuck | in_use | done | unknown
    ("detail", S),
)

# Retention debt (issue 15): per topic, ledgers Pulsar's own rules would trim that nobody trims (or that
# cannot be judged); per idle cursor, what it alone keeps from being trimmed. One row per topic that owes
# something or is `unknown`, one per idle cursor (sweeper.retention.debt).
RETENTION_DEBT = _schema(
    ("run_id", S, False),
    ("captured_at", TS, False),
    ("kind", S, False),  # topic | cursor
    # topic: candidate | awaiting_broker | none | out_of_scope | protected | unknown
    # cursor: candidate | idle | protected | out_of_scope | unknown. Only candidates are ever repaired.
    ("status", S, False),
    # sweeper.rules.retention.Reason; a protected row: why (a sweeper.rules.protection.Protected value, or system_topic)
    ("reason", S, False),
    ("detail", S),
    ("tenant", S),
    ("namespace", S),
    ("topic", S),
    ("topic_name", S),
    ("managed_ledger", S, False),
    ("cursor", S),  # cursor rows: the decoded subscription name
    ("system_topic", B),
    ("policy_source", S),  # namespace | namespace+broker_default_retention | ... (null: unknown)
    # topic-level policies: ruled_out (its namespace's __change_events holds no event) | not_set (the broker
    # says so) | set (not evaluated: unknown) | unread (unknown) | not_used ([retention] topic_policies = none,
    # or a protected row: never acted on, so not checked)
    ("topic_policy", S),
    ("retention_minutes", INT),
    ("retention_size_mb", L),
    ("ttl_seconds", INT),
    ("ledgers", INT),  # topic rows: ledgers listed, and their bytes
    ("total_bytes", L),
    # topic rows: what the broker would trim now; cursor rows: what this cursor alone keeps from that
    ("reclaimable_ledgers", INT),
    ("reclaimable_bytes", L),
    ("reclaimable_offloaded_bytes", L),  # of which in tiered storage
    ("ledger_ids", ArrayType(L)),
    ("eligible_since_ms", L),  # topic rows: trimmable since, at the latest
    ("unloaded_evidence", S),  # bundle_not_owned | not_trimmed_since
    ("bundle_owned", B),  # null: ownership not readable (extensible load manager, no permission)
    ("idle_cursors", INT),
    ("idle_pinned_bytes", L),  # topic rows: what its idle cursors keep together
    ("idle_ms", L),  # cursor rows: at least this long without a persisted acknowledgement
    ("last_possible_ack_ms", L),
    ("last_active_ms", L),
    ("position_may_lag", B),  # an active cursor ledger: ZooKeeper's mark-delete is a lower bound
    ("mark_delete_ledger_id", L),
    ("mark_delete_entry_id", L),
    ("cursor_ledger_id", L),
    ("cursor_ledger_bytes", L),  # as BookKeeper records it (0 while the ledger is open)
    ("zk_mtime_ms", L),  # the managed-ledger (topic rows) or cursor (cursor rows) znode, as planned:
    ("zk_version", INT),  # the repair re-checks these before acting
)

# Reclaimable bytes by cause per tenant and namespace (orphan candidates come from the run's `orphans`).
RECLAIMABLE_REPORT = _schema(
    ("run_id", S, False),
    ("tenant", S),
    ("namespace", S),
    ("orphan_bytes", L),
    ("orphan_ledgers", L),
    ("expired_unloaded_bytes", L),
    ("expired_unloaded_topics", L),
    ("idle_cursor_bytes", L),  # what idle cursors keep together, plus their own cursor ledgers
    ("idle_cursors", L),
    ("awaiting_broker_bytes", L),  # past retention on topics that may be loaded: their broker should trim
    ("unknown_topics", L),
    ("total_bytes", L),  # orphans + expired-but-unloaded + idle cursors
)

# One row per repair action (sweeper.retention.repair), dry runs included.
RETENTION_ACTIONS = _schema(
    ("run_id", S, False),  # the repair run
    ("plan_run_id", S, False),  # the run whose retention_debt planned it
    ("finished_at", TS, False),
    ("action", S, False),  # load_topic | delete_subscription
    ("tenant", S),
    ("namespace", S),
    ("topic_name", S, False),
    ("managed_ledger", S),
    ("cursor", S),
    # would_load | trimmed | loaded | would_delete | deleted | skipped_active | skipped_gone | deferred | failed
    # | not_needed | skipped (a rule of today's config or metadata said no: the detail starts with its name)
    ("outcome", S, False),
    ("detail", S),
    ("http_status", INT),
    ("planned_bytes", L),
    ("bytes_before", L),  # the managed ledger's listed bytes before and after (execute)
    ("bytes_after", L),
    ("dry_run", B, False),
)

# The retention repair's intents (sweeper.retention.journal): one row, committed, before every admin call; its
# outcomes are its `retention_actions` rows (each committed before the next call). The next `retention --execute`
# folds a run left unclosed (killed) into retention_actions, from the live metadata, and closes it.
REPAIR_JOURNAL = _schema(
    ("run_id", S, False),  # the repair run (`retention-...`)
    ("plan_run_id", S),
    ("at", TS, False),
    ("phase", S, False),  # intent | closed
    ("seq", INT),  # the action's place in the run's plan: the calls of one action share it
    ("call", S),  # stats | delete_subscription | trim | internal_stats
    ("action", S),  # load_topic | delete_subscription
    ("tenant", S),
    ("namespace", S),
    ("topic_name", S),
    ("managed_ledger", S),
    ("cursor", S),
    ("planned_bytes", L),
    ("zk_path", S),  # the znode the call changes when it takes effect: the cursor's, or the managed ledger's
    ("zk_version", INT),  # that znode as read right before the call
    ("zk_ctime_ms", L),
    ("topic_unloaded", B),  # trim/load: the topic was unloaded when asked (a load writes its managed ledger)
    ("listed_ledger_ids", ArrayType(L)),  # trim/load: the managed ledger's list right before the call
    ("trimmable_ledger_ids", ArrayType(L)),  # trim/load: what the plan said the broker would trim
    ("bytes_before", L),
    ("detail", S),
)

# What each bookie's HTTP server said, before an executed delete and after it (issue 35): the counters the
# `reclaim` rows are the deltas of. One row per bookie per sample.
BOOKIE_SAMPLES = _schema(
    ("run_id", S, False),
    ("phase", S, False),  # before | after
    ("bookie_id", S, False),
    ("sampled_at", TS, False),
    ("url", S),
    ("found_by", S),  # registration | registration, 0.0.0.0 -> bookie host | config | http_port
    ("readonly", B),
    ("error", S),  # why it could not be measured; the numbers are then null
    ("deletion_bytes", L),  # RECLAIMED_DELETION_SPACE_BYTES, summed over the ledger dirs
    ("compaction_bytes", L),  # RECLAIMED_COMPACTION_SPACE_BYTES
    ("active_log_bytes", L),  # ACTIVE_ENTRY_LOG_SPACE_BYTES (a gauge)
    ("deleted_ledgers", L),  # DELETED_LEDGER_TOTAL
    ("major_compactions", L),
    ("minor_compactions", L),
    ("ledger_dirs", INT),
    ("free_bytes", L),  # /api/v1/bookie/info
    ("total_bytes", L),
    ("in_force_gc", B),
    ("compacting", B),
    ("major_suspended", B),
    ("minor_suspended", B),
    ("notes", ArrayType(S)),
    ("started_at_s", DoubleType()),  # process_start_time_seconds: a restart between samples is told by it (issue 44)
    ("gc_wait_ms", L),  # the bookie's gcWaitTime, from its server config (the "before" sample)
)

# A GC this tool asked a bookie for: the intent before the PUT, then its end (DESIGN.md invariant 18), so a run
# triggers at most one per bookie even when re-run or killed.
RECLAIM_JOURNAL = _schema(
    ("run_id", S, False),
    ("bookie_id", S, False),
    ("at", TS, False),
    ("phase", S, False),  # intent | done | failed
    ("force_major", B),
    ("force_minor", B),
    ("detail", S),
)

# Per run and bookie (and per offload bucket): what the run's deletes should give back and what was given back.
# Appended each time the run is measured (`sweep --execute`, then `sweeper reclaim --run-id RUN`): the newest row
# per (run_id, target) is the answer.
RECLAIM = _schema(
    ("run_id", S, False),
    ("measured_at", TS, False),
    ("target_kind", S, False),  # bookie | offload
    ("target", S, False),  # bookie id, or the offload bucket
    ("url", S),
    ("found_by", S),
    ("expected_bytes", L),  # bookie: its share of the deleted ledgers' lengths; offload: the deleted objects' sizes
    ("expected_ledgers", L),
    ("freed_deletion_bytes", L),  # counter deltas (offload: the bytes of the objects listed gone)
    ("freed_compaction_bytes", L),
    ("freed_bytes", L),
    ("active_log_delta_bytes", L),
    ("free_space_delta_bytes", L),
    ("pending_bytes", L),  # expected - freed, when not all came back
    # freed | pending_compaction | pending_gc | shared_window | restarted | unknown | not_measured
    ("verdict", S, False),
    ("why", S),
    ("action", S),  # measured only | gc (...) | skipped | none
    ("gc_seconds", DoubleType()),
    ("counter_reset", B),
    # Issue 44: what of the bookie-wide bytes is this run's. Equal in a window where the bookie collected this run's
    # ledgers alone; [0, freed] when others' were collected too (`others_collected` at least), or it restarted.
    ("freed_lower_bytes", L),
    ("freed_upper_bytes", L),
    ("others_collected", L),
    ("collected_ledgers", L),  # DELETED_LEDGER_TOTAL's delta over the window
    ("unknown_ledgers", L),  # deleted ledgers held here that were never closed: bytes unknown
)

ALL_TABLES: dict[str, StructType] = {**SNAPSHOT_TABLES, "orphans": ORPHANS, "orphan_report": ORPHAN_REPORT,
                                     "runs": RUNS, "emitted": EMITTED, "pending_delete_status": PENDING_DELETE_STATUS,
                                     "delete_results": DELETE_RESULTS, "retry_queue": RETRY_QUEUE,
                                     "delete_journal": DELETE_JOURNAL, "emit_journal": EMIT_JOURNAL,
                                     "dead_letter": DEAD_LETTER, "retention_debt": RETENTION_DEBT,
                                     "reclaimable_report": RECLAIMABLE_REPORT, "retention_actions": RETENTION_ACTIONS,
                                     "repair_journal": REPAIR_JOURNAL, "bookie_samples": BOOKIE_SAMPLES,
                                     "reclaim_journal": RECLAIM_JOURNAL, "reclaim": RECLAIM}
