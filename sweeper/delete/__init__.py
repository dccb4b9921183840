"""Delete phase (PIP-186 phase 2): verify each pending-delete record again, then delete safely.

No Spark here: a Spark job calls these from its tasks, one ZooKeeper session and S3 client each.
"""

from sweeper.delete.decide import (
    Decision,
    LiveLedger,
    ReferrerState,
    check_ledger,
    check_object,
    decide_ledger,
    decide_object,
    managed_ledger_name,
    ownership_mismatch,
)
from sweeper.delete.lock import DEFAULT_LOCK_PATH, DeleteRunLock
from sweeper.delete.results import (
    ALREADY_GONE,
    DELETED,
    FAILED,
    FINAL_OUTCOMES,
    IN_USE,
    INVALID,
    MISMATCH,
    NOT_FOUND,
    WOULD_DELETE,
    DeleteResult,
    result_for,
)
from sweeper.delete.retry import RetryPolicy, is_transient, is_transient_code, run_with_retries
from sweeper.delete.s3_executor import ObjectDeleter
from sweeper.delete.zk_executor import LedgerDeleter, Verified

__all__ = [
    "ALREADY_GONE",
    "DEFAULT_LOCK_PATH",
    "DELETED",
    "FAILED",
    "FINAL_OUTCOMES",
    "INVALID",
    "IN_USE",
    "MISMATCH",
    "NOT_FOUND",
    "WOULD_DELETE",
    "Decision",
    "DeleteResult",
    "DeleteRunLock",
    "LedgerDeleter",
    "LiveLedger",
    "ObjectDeleter",
    "ReferrerState",
    "RetryPolicy",
    "Verified",
    "check_ledger",
    "check_object",
    "decide_ledger",
    "decide_object",
    "is_transient",
    "is_transient_code",
    "managed_ledger_name",
    "ownership_mismatch",
    "result_for",
    "run_with_retries",
]
