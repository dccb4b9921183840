"""Every live reference a Pulsar cluster's metadata holds to a BookKeeper ledger, from its snapshot tables.

One definition for this cluster's snapshot (reconcile anti-joins BookKeeper against it) and for each
peer cluster's (the snapshot stores a peer's references in `peer_references`, so reconcile can take
the union of every cluster writing to the same bookies).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

# `peer_references.kind`: what one row says about a peer cluster.
PEER_READ = "peer_read"  # the peer was read completely: its other rows are all it references
PEER_UNREAD = "peer_unread"  # the peer could not be read (detail in `referrer`): sharing stays unverified
PEER_REFERENCE = "reference"  # the peer references `ledger_id`
PEER_OWNER = "owner"  # a managed ledger or schema id that exists in the peer's metadata
PEER_NAMESPACE = "namespace"  # a tenant/namespace the peer's metadata knows
PEER_QUARANTINED = "quarantined_owner"  # a peer's managed ledger, cursor or schema that could not be decoded


def released_from_bookkeeper() -> Any:
    """An `ml_ledgers` entry whose BookKeeper copy Pulsar no longer reads: offloaded, complete, and
    `bookkeeperDeleted`. Pulsar reads from tiered storage only once the offload is complete
    (ManagedLedgerImpl.getLedgerHandle checks `offloadContext.complete`), so `bookkeeperDeleted` alone
    releases nothing."""
    return (F.coalesce(F.col("offload_bookkeeper_deleted"), F.lit(False))
            & F.coalesce(F.col("offload_complete"), F.lit(False)))


def references(frames: dict[str, DataFrame]) -> DataFrame:
    """(ledger_id, ref_kind, owner, referrer): every live reference in one cluster's snapshot tables."""
    ml = frames["ml_ledgers"]
    live_ml = ml.where(~released_from_bookkeeper())
    parts = [
        live_ml.select(
            "ledger_id",
            F.lit("managed_ledger").alias("ref_kind"),
            F.col("managed_ledger").alias("owner"),
            F.col("managed_ledger").alias("referrer"),
        ),
        frames["ml_cursors"]
        .where(F.col("cursors_ledger_id") >= 0)
        .select(
            F.col("cursors_ledger_id").alias("ledger_id"),
            F.lit("cursor").alias("ref_kind"),
            F.col("managed_ledger").alias("owner"),
            F.concat_ws("/", "managed_ledger", "cursor_znode").alias("referrer"),
        ),
        frames["cursor_ledger_refs"]
        .where(F.col("ledger_id").isNotNull())
        .select(
            "ledger_id",
            F.col("kind").alias("ref_kind"),
            F.col("managed_ledger").alias("owner"),
            F.concat_ws(" ", "managed_ledger", "cursor", "ref_key").alias("referrer"),
        ),
        frames["schema_ledgers"].select(
            "ledger_id",
            F.lit("schema").alias("ref_kind"),
            F.col("schema_id").alias("owner"),
            F.col("schema_id").alias("referrer"),
        ),
    ]
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


def peer_rows(frames: dict[str, DataFrame], cluster: str) -> DataFrame:
    """A peer's snapshot tables as `peer_references` rows (without run columns): its references, the owners
    and namespaces it has, and the owners it could not decode."""
    refs = references(frames).select(F.lit(PEER_REFERENCE).alias("kind"), "ledger_id", "ref_kind", "owner",
                                     "referrer")
    owners = (frames["managed_ledgers"].select(F.col("managed_ledger").alias("owner"))
              .unionByName(frames["schema_ledgers"].select(F.col("schema_id").alias("owner"))).distinct()
              .select(F.lit(PEER_OWNER).alias("kind"), F.lit(None).cast("long").alias("ledger_id"),
                      F.lit(None).cast("string").alias("ref_kind"), "owner",
                      F.lit(None).cast("string").alias("referrer")))
    quarantined = (frames["quarantine"].where(F.col("owner").isNotNull()).select("owner").distinct()
                   .select(F.lit(PEER_QUARANTINED).alias("kind"), F.lit(None).cast("long").alias("ledger_id"),
                           F.lit(None).cast("string").alias("ref_kind"), "owner",
                           F.lit(None).cast("string").alias("referrer")))
    return refs.unionByName(owners).unionByName(quarantined).withColumn("cluster", F.lit(cluster))
