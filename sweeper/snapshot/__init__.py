"""The snapshot stage: every store's metadata (BookKeeper's and Pulsar's znodes, the offloaded objects, the pending
deletes on the system topic, the peer clusters' references) into the snapshot's Delta tables, one run at a time.
The modules follow the stage as it runs: `settings` (what it reads of the config, its counts, result and errors),
`planning` (the driver lists down to the scan units and deals them to sessions), `scanners` (the Spark tasks that
read the znodes), `packer` (their rows packed per table), `offload_listing`, `pending` and `peers` (the other
producers), `outputs` (where the rows go: cached and appended, or written by the tasks) and `stage` (the run).
"""

from sweeper.snapshot.errors import ClockSkewRefused, SnapshotIncomplete
from sweeper.snapshot.offload_listing import OBJECTS_PER_HEAD_TASK, listing_tasks
from sweeper.snapshot.packer import TablePacker
from sweeper.snapshot.peers import PEER_TABLES
from sweeper.snapshot.planning import (
    LEAVES_PER_DIRECTORY,
    ZNODES_PER_SESSION,
    deal_tasks,
    namespace_policy_row,
    plan_tasks,
    scan_sessions,
    session_count,
    share_divisor,
)
from sweeper.snapshot.scanners import scan_dataframe
from sweeper.snapshot.settings import (
    OFFLOAD_TARGET,
    STAT_READS,
    ScanTarget,
    SnapshotCounts,
    SnapshotResult,
    SnapshotSettings,
    zk_load,
)
from sweeper.snapshot.stage import claim_run_id, run

__all__ = [
    "LEAVES_PER_DIRECTORY",
    "OBJECTS_PER_HEAD_TASK",
    "OFFLOAD_TARGET",
    "PEER_TABLES",
    "STAT_READS",
    "ZNODES_PER_SESSION",
    "ClockSkewRefused",
    "ScanTarget",
    "SnapshotCounts",
    "SnapshotIncomplete",
    "SnapshotResult",
    "SnapshotSettings",
    "TablePacker",
    "claim_run_id",
    "deal_tasks",
    "listing_tasks",
    "namespace_policy_row",
    "plan_tasks",
    "run",
    "scan_dataframe",
    "scan_sessions",
    "session_count",
    "share_divisor",
    "zk_load",
]
