"""The reconcile stage's refusals (exit 3): a data-quality gate failed, or the breaker tripped."""

from __future__ import annotations

from typing import Protocol

from sweeper.errors import Refused


class ReconcileRefused(Refused):
    """The run stops before planning anything: a gate failed or the breaker tripped."""

    def __init__(self, message: str, failures: list[str] | None = None) -> None:
        super().__init__(message)
        self.failures = failures or []


class GateOutcome(Protocol):
    """What GateFailed reads of the gates' result (`sweeper.reconcile.gates.GateResult`), named without importing it."""

    @property
    def run_id(self) -> str: ...

    @property
    def failures(self) -> list[str]: ...


class GateFailed(Refused):
    """The data-quality gates failed for the snapshot: each failure on its own line."""

    def __init__(self, result: GateOutcome) -> None:
        lines = "\n".join(f"  - {failure}" for failure in result.failures)
        super().__init__(f"data-quality gates failed for snapshot {result.run_id}:\n{lines}")
        self.result = result
