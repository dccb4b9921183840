"""The snapshot as Spark frames, and the joins that give each unreferenced Pulsar ledger and each offloaded object
the facts `sweeper.rules.classify` decides on (the reconcile stage classifies their rows in the executors)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sweeper import names
from sweeper.rules.references import PEER_OWNER, PEER_QUARANTINED, released_from_bookkeeper
from sweeper.scan.pulsar import COMPACTION_KINDS
from sweeper.table_schemas import BK_LAYOUT, SNAPSHOT_TABLES
from sweeper.tables import TableStore


def snapshot_frames(store: TableStore, run_id: str) -> dict[str, DataFrame]:
    return store.run_frames(SNAPSHOT_TABLES, run_id)


def verified_offloads(frames: dict[str, DataFrame], local_cluster: str) -> DataFrame:
    """(ledger_id, _copy_verified): ledgers a managed ledger lists as released from BookKeeper whose offloaded copy
    this snapshot saw whole: the data and the index object (`<uuid>-ledger-<id>[-index]`, written by Pulsar's
    BlobStoreManagedLedgerOffloader), each carrying this cluster's pulsarClusterName and the listing managed ledger's
    name, both non-empty. (The data object's size is not compared with the listed ledger size: the offloader's
    block format adds headers and the listed size is what the broker counted, so only emptiness is certain.)"""
    released = (frames["ml_ledgers"].where(released_from_bookkeeper())
                .select("ledger_id", F.col("offload_uuid").alias("uuid"), F.col("managed_ledger").alias("_rel_ml")))
    objects = frames["offload_objects"].select("uuid", "ledger_id", "role", "size", "managed_ledger", "cluster_name",
                                               "metadata_read")
    good = (F.coalesce(F.col("metadata_read"), F.lit(False)) & (F.col("cluster_name") == F.lit(local_cluster))
            & (F.col("managed_ledger") == F.col("_rel_ml")) & (F.col("size") > 0))
    return (released.join(objects, ["uuid", "ledger_id"], "left")
            .groupBy("ledger_id", "uuid")
            .agg(F.countDistinct(F.when(good, F.col("role"))).alias("_roles"))
            .groupBy("ledger_id").agg(F.min(F.col("_roles") == 2).alias("_copy_verified")))


def _facts_frame(frames: dict[str, DataFrame], refs: DataFrame, local_cluster: str = "",
                 ref_ids: DataFrame | None = None) -> DataFrame:
    """Unreferenced Pulsar ledgers with the facts `classify` needs, one row each. `refs` holds every cluster's
    references (ours and the peers'); an owner a peer could not decode counts as quarantined. `ref_ids`: the
    distinct ledger ids of `refs`, when the caller has them already."""
    bk = frames["bk_ledgers"].where(F.col("is_pulsar"))
    unreferenced = bk.join(ref_ids if ref_ids is not None else refs.select("ledger_id").distinct(), "ledger_id",
                           "left_anti")
    mls = frames["managed_ledgers"]
    ml_names = mls.select(F.col("managed_ledger").alias("_ml"), F.lit(True).alias("_ml_exists"))
    peers = frames["peer_references"]
    quarantined = (
        frames["quarantine"]
        .where(F.col("owner").isNotNull())
        .select(F.col("owner").alias("_q_owner"))
        .unionByName(peers.where(F.col("kind") == PEER_QUARANTINED).select(F.col("owner").alias("_q_owner")))
        .distinct()
        .withColumn("_quarantined", F.lit(True))
    )
    peer_owners = (peers.where(F.col("kind") == PEER_OWNER).select(F.col("owner").alias("_p_owner")).distinct()
                   .withColumn("_owner_at_peer", F.lit(True)))
    cursors = frames["ml_cursors"].select(
        F.col("managed_ledger").alias("_c_ml"), F.col("cursor_znode").alias("_c"), F.lit(True).alias("_cursor_exists")
    )
    schemas = (
        frames["schema_ledgers"]
        .select(F.col("schema_id").alias("_schema"), F.lit(True).alias("_schema_exists"))
        .distinct()
    )
    compaction = (
        frames["cursor_ledger_refs"]
        .where(F.col("kind").isin(*COMPACTION_KINDS))
        .groupBy(F.col("managed_ledger").alias("_cp_ml"))
        .agg(F.first("kind").alias("_cp_kind"), F.first("ledger_id").alias("_cp_ledger"))
    )
    bk_deleted = (
        frames["ml_ledgers"]
        .where(released_from_bookkeeper())
        .select("ledger_id")
        .distinct()
        .withColumn("_bk_deleted", F.lit(True))
    )

    # Bucket and compacted ledgers name their topic; its managed ledger is the topic's canonical
    # encoding, computed (not joined), so a quarantined or missing managed ledger still matches.
    owner_topic = F.coalesce(F.col("bucket_topic"), F.col("compacted_topic"))
    topic_ml = F.udf(lambda topic: names.managed_ledger_for_topic(topic), "string")
    facts = (
        unreferenced.withColumn("owner_topic", owner_topic)
        .withColumn("owner_ml", F.when(F.col("owner_topic").isNotNull(), topic_ml(F.col("owner_topic")))
                    .otherwise(F.col("managed_ledger")))
        .join(ml_names, F.col("owner_ml") == F.col("_ml"), "left")
        .join(cursors, (F.col("owner_ml") == F.col("_c_ml")) & (F.col("cursor") == F.col("_c")), "left")
        .join(schemas, F.col("schema_id") == F.col("_schema"), "left")
        .join(compaction, F.col("owner_ml") == F.col("_cp_ml"), "left")
        .join(bk_deleted, "ledger_id", "left")
        .join(verified_offloads(frames, local_cluster), "ledger_id", "left")
        .join(quarantined, F.coalesce(F.col("owner_ml"), F.col("schema_id")) == F.col("_q_owner"), "left")
        .join(peer_owners, F.coalesce(F.col("owner_ml"), F.col("schema_id")) == F.col("_p_owner"), "left")
    )
    return facts.select(
        "ledger_id",
        "path",
        "zk_version",
        "component",
        "managed_ledger",
        "cursor",
        "schema_id",
        "owner_topic",
        "owner_ml",
        "bucket_key",
        "length",
        # Carried to emit, delete and reclaim in the orphan row (issue 46): they need not read bk_ledgers again.
        F.struct(*BK_LAYOUT.fieldNames()).alias("bk_layout"),
        "created_ms",
        "created_source",
        F.coalesce(F.col("_ml_exists"), F.lit(False)).alias("ml_exists"),
        F.coalesce(F.col("_schema_exists"), F.lit(False)).alias("schema_exists"),
        F.coalesce(F.col("_cursor_exists"), F.lit(False)).alias("cursor_exists"),
        F.col("_cp_kind").alias("compaction_kind"),
        F.col("_cp_ledger").alias("compaction_ledger"),
        F.coalesce(F.col("_bk_deleted"), F.lit(False)).alias("bk_deleted"),
        F.coalesce(F.col("_quarantined"), F.lit(False)).alias("owner_quarantined"),
        F.coalesce(F.col("_owner_at_peer"), F.lit(False)).alias("owner_at_peer"),
        F.coalesce(F.col("_copy_verified"), F.lit(False)).alias("copy_verified"),
    )


def _object_facts_frame(frames: dict[str, DataFrame]) -> DataFrame:
    contexts = (frames["ml_ledgers"].where(F.col("offload_uuid").isNotNull())
                .groupBy(F.col("offload_uuid").alias("uuid"), "ledger_id")
                .agg(F.max(F.coalesce("offload_complete", F.lit(False))).alias("complete"),
                     F.max("offload_timestamp_ms").alias("offload_ts"),
                     F.first("managed_ledger").alias("ref_ml")))
    quarantined = (frames["quarantine"].where(F.col("owner").isNotNull()).select(F.col("owner").alias("_q"))
                   .distinct().withColumn("owner_quarantined", F.lit(True)))
    # Each bucket the run's offload contexts name, with a region and endpoint they give it (a handful of buckets): the
    # orphan row carries them to emit's records and to the delete's list of buckets it may delete from (issue 46).
    # One per bucket, the same for all its objects (max: contexts that disagree are one cluster's misconfiguration).
    targets = (frames["ml_ledgers"].where(F.col("offload_bucket").isNotNull())
               .groupBy(F.col("offload_bucket").alias("bucket"))
               .agg(F.max(F.struct(F.col("offload_region").alias("region"),
                                   F.col("offload_endpoint").alias("endpoint"),
                                   F.col("offload_driver").alias("driver"))).alias("_target")))
    # classify_object's first rule, applied before Python: a referenced object whose offload completed is in use
    # and yields no row. (Pulsar's ManagedLedgerImpl.getLedgerHandle opens such a ledger from tiered storage by
    # the uuid in its complete OffloadContext: readOffloaded(ledgerId, uid, ...); "referenced" is that uuid and
    # ledger id listed by a managed ledger, the join above.) Most objects are such (157k of 205k in the 1M bench),
    # and shipping them to Python to be skipped cost about a third of reconcile's Python time. Every other object
    # still goes through classify_object.
    in_use_complete = F.col("ref_ml").isNotNull() & F.coalesce(F.col("complete"), F.lit(False))
    return (frames["offload_objects"].join(contexts, ["uuid", "ledger_id"], "left")
            .where(~in_use_complete)
            .join(quarantined, F.col("managed_ledger") == F.col("_q"), "left")
            .join(F.broadcast(targets), "bucket", "left")
            .select("bucket", "key", "uuid", "ledger_id", "size", "last_modified_ms", "managed_ledger", "ref_ml",
                    "complete", "offload_ts", "cluster_name",
                    F.when(F.col("_target").isNotNull(), F.col("bucket")).alias("offload_bucket"),
                    F.col("_target.region").alias("offload_region"),
                    F.col("_target.endpoint").alias("offload_endpoint"),
                    F.col("_target.driver").alias("offload_driver"),
                    F.coalesce("metadata_read", F.lit(False)).alias("metadata_read"),
                    F.coalesce("owner_quarantined", F.lit(False)).alias("owner_quarantined")))
