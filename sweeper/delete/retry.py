"""Retry policy for the delete phase: pure, so that every branch can be tested with a fake clock.

Two levels: a few quick attempts inside the Spark task (a ZooKeeper leader election or an S3
throttle passes in seconds), then the record goes back to the queue for a later run, and after
`max_attempts` in all to the dead-letter table, as PIP-186's consumer does.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.delete.results import FAILED, DeleteResult, result_for
from sweeper.zk.errors import is_connection_error

# S3 error codes that say "try again later", as in boto3's own retry handler.
TRANSIENT_S3_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestLimitExceeded", "TooManyRequestsException", "ProvisionedThroughputExceededException",
    "RequestTimeout", "RequestTimeoutException", "InternalError", "ServiceUnavailable", "500", "502", "503", "504",
})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 10
    in_task_attempts: int = 3
    base_delay_s: float = 0.2
    max_delay_s: float = 30.0
    retry_after_s: float = 300

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.in_task_attempts < 1:
            raise ValueError("max_attempts and in_task_attempts must be at least 1")
        if self.base_delay_s < 0 or self.max_delay_s < 0 or self.retry_after_s < 0:
            raise ValueError("delays must not be negative")

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        """Delay after failed attempt `attempt` (1-based): full jitter, so that many tasks do not retry in step."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** max(attempt - 1, 0))
        return rng.uniform(0.0, ceiling)

    def next_step(self, total_attempts: int, now_ms: int) -> tuple[str, int | None]:
        """After `total_attempts` failed attempts: queue for a later run, or give up to the dead-letter table."""
        if total_attempts >= self.max_attempts:
            return "dead_letter", None
        return "retry", now_ms + int(self.retry_after_s * 1000)


def is_transient_code(code: str | None, status: int | None = None) -> bool:
    return (code or "") in TRANSIENT_S3_CODES or (status is not None and status >= 500)


def is_transient(exc: BaseException) -> bool:
    """True for errors that another attempt may not meet: lost connections, timeouts, throttling."""
    if is_connection_error(exc):
        return True
    try:
        from botocore.exceptions import (
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            ReadTimeoutError,
        )
        from botocore.exceptions import (
            ConnectionClosedError as BotoConnectionClosed,
        )
    except ImportError:  # pragma: no cover - boto3 is a dependency, but ZooKeeper-only tasks need not import it
        pass
    else:
        if isinstance(exc, EndpointConnectionError | BotoConnectionClosed | ReadTimeoutError | ConnectTimeoutError):
            return True
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return is_transient_code(error.get("Code"), status)
    return isinstance(exc, ConnectionError | TimeoutError)


def run_with_retries(
    fn: Callable[[list[Mapping[str, Any]]], list[DeleteResult]],
    records: Sequence[Mapping[str, Any]],
    policy: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    first_attempt: int = 1,
) -> list[DeleteResult]:
    """Run `fn` (an executor's `process`, one result per record, in order) and re-run only what failed.

    Failed results get another go up to `in_task_attempts`; what still fails comes back as `failed`
    with its attempt number so the caller can queue it (`next_step`).
    """
    rng = rng or random.Random()
    results: list[DeleteResult | None] = [None] * len(records)
    pending = list(range(len(records)))
    attempt = first_attempt
    for round_no in range(1, policy.in_task_attempts + 1):
        batch = [records[i] for i in pending]
        try:
            outcome = fn(batch)
            if len(outcome) != len(batch):
                raise RuntimeError(f"executor returned {len(outcome)} results for {len(batch)} records")
        except Exception as exc:
            if not is_transient(exc):
                raise
            # Executors report per record; this is the safety net for a whole call failing at once.
            outcome = [result_for(r, FAILED, "attempt failed as a whole", error=f"{type(exc).__name__}: {exc}")
                       for r in batch]
        still: list[int] = []
        for i, result in zip(pending, outcome, strict=True):
            result.attempt = attempt
            results[i] = result
            if result.outcome == FAILED:
                still.append(i)
        pending = still
        if not pending or round_no == policy.in_task_attempts:
            break
        sleep(policy.backoff_s(round_no, rng))
        attempt += 1
    return [r for r in results if r is not None]
