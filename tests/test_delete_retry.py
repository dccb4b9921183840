"""Retry policy: pure, so a seeded rng and a fake sleep stand in for time."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NoAuthError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from sweeper.delete import (
    DELETED,
    FAILED,
    IN_USE,
    DeleteResult,
    RetryPolicy,
    is_transient,
    result_for,
    run_with_retries,
)


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "DeleteObjects")


def test_backoff_is_full_jitter_exponential_and_capped() -> None:
    policy = RetryPolicy(base_delay_s=0.2, max_delay_s=3.0)
    rng = random.Random(7)
    for attempt, ceiling in [(1, 0.2), (2, 0.4), (3, 0.8), (4, 1.6), (5, 3.0), (30, 3.0)]:
        delays = [policy.backoff_s(attempt, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # jitter spans the range, not a fixed delay
    assert RetryPolicy().backoff_s(3, random.Random(1)) == RetryPolicy().backoff_s(3, random.Random(1))


def test_next_step_retries_then_dead_letters() -> None:
    policy = RetryPolicy(max_attempts=10, retry_after_s=300)
    assert policy.next_step(1, 1_000) == ("retry", 301_000)
    assert policy.next_step(9, 0) == ("retry", 300_000)
    assert policy.next_step(10, 0) == ("dead_letter", None)
    assert policy.next_step(11, 0) == ("dead_letter", None)
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


@pytest.mark.parametrize(("exc", "transient"), [
    (ConnectionLoss(), True),
    (SessionExpiredError(), True),
    (OperationTimeoutError(), True),
    (KazooTimeoutError(), True),
    (NoNodeError(), False),
    (BadVersionError(), False),
    (NoAuthError(), False),
    (EndpointConnectionError(endpoint_url="http://x"), True),
    (ReadTimeoutError(endpoint_url="http://x"), True),
    (client_error("SlowDown", 503), True),
    (client_error("InternalError", 500), True),
    (client_error("ServiceUnavailable", 503), True),
    (client_error("Whatever", 502), True),
    (client_error("AccessDenied", 403), False),
    (client_error("NoSuchBucket", 404), False),
    (ConnectionResetError(), True),
    (ValueError("x"), False),
])
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def records(n: int) -> list[dict[str, Any]]:
    return [{"ledgerId": i, "ledgerType": "LEDGER", "ledgerComponent": "MANAGED_LEDGER"} for i in range(n)]


class Flaky:
    """Fails each record a set number of times, then deletes it."""

    def __init__(self, failures: Mapping[int, int]) -> None:
        self.left = dict(failures)
        self.calls: list[list[int]] = []

    def __call__(self, batch: list[Mapping[str, Any]]) -> list[DeleteResult]:
        self.calls.append([r["ledgerId"] for r in batch])
        out = []
        for r in batch:
            if self.left.get(r["ledgerId"], 0) > 0:
                self.left[r["ledgerId"]] -= 1
                out.append(result_for(r, FAILED, error="ConnectionLoss"))
            else:
                out.append(result_for(r, IN_USE if r["ledgerId"] == 0 else DELETED))
        return out


def test_only_failed_records_are_rerun_with_backoff() -> None:
    fn = Flaky({1: 1, 2: 2})
    slept: list[float] = []
    policy = RetryPolicy(in_task_attempts=3)
    results = run_with_retries(fn, records(4), policy, sleep=slept.append, rng=random.Random(3))
    assert fn.calls == [[0, 1, 2, 3], [1, 2], [2]]
    assert [r.outcome for r in results] == [IN_USE, DELETED, DELETED, DELETED]
    assert [r.attempt for r in results] == [1, 2, 3, 1]
    rng = random.Random(3)
    assert slept == [policy.backoff_s(1, rng), policy.backoff_s(2, rng)]


def test_records_still_failing_are_handed_back_for_the_queue() -> None:
    fn = Flaky({1: 5})
    slept: list[float] = []
    results = run_with_retries(fn, records(2), RetryPolicy(in_task_attempts=3), sleep=slept.append,
                               rng=random.Random(0), first_attempt=4)
    assert [(r.outcome, r.attempt) for r in results] == [(IN_USE, 4), (FAILED, 6)]
    assert len(fn.calls) == 3 and len(slept) == 2  # no sleep after the last attempt
    assert RetryPolicy().next_step(results[1].attempt, 0)[0] == "retry"


def test_no_sleep_when_nothing_failed_and_whole_call_failures_become_failed() -> None:
    slept: list[float] = []
    assert [r.outcome for r in run_with_retries(Flaky({}), records(2), RetryPolicy(), sleep=slept.append)] == [
        IN_USE, DELETED]
    assert slept == []
    calls = []

    def down(batch: list[Mapping[str, Any]]) -> list[DeleteResult]:
        calls.append(len(batch))
        raise ConnectionLoss()

    results = run_with_retries(down, records(2), RetryPolicy(in_task_attempts=2), sleep=slept.append)
    assert [r.outcome for r in results] == [FAILED, FAILED] and calls == [2, 2]

    def broken(batch: list[Mapping[str, Any]]) -> list[DeleteResult]:
        raise ValueError("bug")

    with pytest.raises(ValueError):
        run_with_retries(broken, records(1), RetryPolicy(), sleep=slept.append)
