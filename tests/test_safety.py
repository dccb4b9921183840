"""Each safety rule has a test that fails when the rule is removed or weakened."""

from __future__ import annotations

import pytest

from sweeper.rules.errors import SafetyConfigError
from sweeper.rules.safety import DAY_MS, HOUR_MS, CircuitBreaker, GracePeriod, Scope, ledger_age_ms, offload_in_flight

NOW = 1_800_000_000_000


def test_grace_period_defaults_to_seven_days() -> None:
    grace = GracePeriod()
    assert not grace.is_old_enough(NOW - 7 * DAY_MS + 1, NOW)
    assert grace.is_old_enough(NOW - 7 * DAY_MS, NOW)


@pytest.mark.parametrize("created", [None, 0, -1])
def test_unknown_age_is_never_old_enough(created: int | None) -> None:
    assert not GracePeriod.of(DAY_MS).is_old_enough(created, NOW)


def test_grace_period_floor_needs_force() -> None:
    with pytest.raises(SafetyConfigError, match="24h floor"):
        GracePeriod.of(23 * HOUR_MS)
    assert GracePeriod.of(HOUR_MS, force=True).is_old_enough(NOW - 2 * HOUR_MS, NOW)
    with pytest.raises(SafetyConfigError):
        GracePeriod.of(-1, force=True)


def test_age_comes_from_the_later_of_the_two_clocks() -> None:
    # Issue 11 (13): a broker clock running behind (or a forged ctime) must not make a fresh znode old.
    assert ledger_age_ms(NOW - 5 * DAY_MS, NOW - HOUR_MS, NOW) == HOUR_MS
    assert ledger_age_ms(NOW - HOUR_MS, NOW - 5 * DAY_MS, NOW) == HOUR_MS  # ZooKeeper's clock behind
    assert ledger_age_ms(None, NOW - HOUR_MS, NOW) == HOUR_MS
    assert ledger_age_ms(-1, NOW - HOUR_MS, NOW) == HOUR_MS  # BookKeeper writes -1 for "not set"
    assert ledger_age_ms(None, None, NOW) is None


def test_incomplete_recent_offload_is_in_flight() -> None:
    grace = GracePeriod()
    assert offload_in_flight(False, NOW - HOUR_MS, NOW, grace)
    assert offload_in_flight(False, None, NOW, grace)  # no timestamp: cannot tell, so assume in flight
    assert not offload_in_flight(False, NOW - 30 * DAY_MS, NOW, grace)
    assert not offload_in_flight(True, NOW - HOUR_MS, NOW, grace)


def test_circuit_breaker() -> None:
    breaker = CircuitBreaker(0.10)
    assert breaker.tripped(10, 100) is None
    assert "circuit breaker" in (breaker.tripped(11, 100) or "")
    assert breaker.tripped(0, 0) is None
    assert breaker.tripped(1, 0) is not None
    with pytest.raises(SafetyConfigError):
        CircuitBreaker(0)


def test_scope_allow_and_deny() -> None:
    scope = Scope(allow=("tenant-*",), deny=("tenant-1/critical", "tenant-9"))
    assert scope.permits("tenant-1", "ns")
    assert not scope.permits("tenant-1", "critical")
    assert not scope.permits("tenant-9", "anything")
    assert not scope.permits("other", "ns")
    assert not scope.permits(None, None)  # unknown owner is out of a restricted scope
    assert Scope().permits(None, None)


def test_plan_status_applies_every_rule_in_order() -> None:
    from sweeper.reconcile.stage import CANDIDATE, OUT_OF_SCOPE, UNKNOWN, YOUNG, SafetySettings, plan_status
    from sweeper.rules.classify import Verdict

    settings = SafetySettings(scope=Scope(deny=("t2",)))
    old = NOW - 30 * DAY_MS
    assert plan_status(Verdict.ORPHAN, old, NOW, "t1", "ns", settings) == CANDIDATE
    assert plan_status(Verdict.UNKNOWN, old, NOW, "t1", "ns", settings) == UNKNOWN
    assert plan_status(Verdict.ORPHAN, NOW - HOUR_MS, NOW, "t1", "ns", settings) == YOUNG
    assert plan_status(Verdict.ORPHAN, None, NOW, "t1", "ns", settings) == YOUNG
    assert plan_status(Verdict.ORPHAN, old, NOW, "t2", "ns", settings) == OUT_OF_SCOPE


def test_the_breaker_weighs_offloaded_objects_by_count_and_by_bytes() -> None:
    # Issue 11 (14): tiered storage has its own breaker; a few huge objects trip it by bytes.
    breaker = CircuitBreaker(0.10)
    assert breaker.tripped_objects(0, 0, 0, 0) is None
    assert breaker.tripped_objects(5, 100, 5_000, 100_000) is None
    assert "objects" in (breaker.tripped_objects(20, 100, 5_000, 100_000) or "")
    assert "bytes" in (breaker.tripped_objects(2, 100, 50_000, 100_000) or "")
    assert breaker.tripped_objects(1, 0, 1, 0) is not None
