"""Names Pulsar and BookKeeper write, and the sweeper's own status words: each defined once, here.

Every stage reads them from this module, so no stage imports another for a constant (issue 22).
"""

from __future__ import annotations

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

# The compaction subscription (Pulsar's Compactor.COMPACTION_SUBSCRIPTION).
COMPACTION_CURSOR = "__compaction"
# A delayed-delivery bucket snapshot's cursor property prefix (BucketDelayedDeliveryTracker's
# DELAYED_BUCKET_KEY_PREFIX) and the compacted ledger's property (CompactedTopicImpl / PulsarTopicCompactionService).
BUCKET_PREFIX = "#pulsar.internal.delayed.bucket"
COMPACTED_TOPIC_LEDGER = "CompactedTopicLedger"
# Each namespace's topic-policy system topic (SystemTopicNames.NAMESPACE_EVENTS_LOCAL_NAME).
CHANGE_EVENTS = "__change_events"

# Orphan row statuses: only `candidate` may ever be emitted or deleted.
CANDIDATE = "candidate"

# What a topic-level policy lookup found (the retention step's plan and the repair's lookups).
RULED_OUT, NOT_SET, SET, UNREAD, NOT_USED, UNCHECKED = "ruled_out", "not_set", "set", "unread", "not_used", "unchecked"

# A quarantine row's error_kind for an offload bucket slice that could not be listed (snapshot writes it; the gates
# and reconcile read it).
LISTING_FAILED = "listing_failed"
# ... and for an offload context whose driver the sweeper cannot read (issue 48): its objects stay unknown, and it is
# not a listing failure (no access to fix; DESIGN invariant 23).
UNKNOWN_DRIVER = "unknown_driver"
