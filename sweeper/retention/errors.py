"""Retention's refusals (exit 3): the debt step's, the repair's, and the repair lock's."""

from __future__ import annotations

from sweeper.errors import Refused


class RetentionDebtRefused(Refused):
    """The step will not run: no successful snapshot, or the run already has its retention debt."""


class RetentionRepairRefused(Refused):
    """The repair will not start (no plan, no broker to talk to) or had to stop (the broker refused us)."""


class RepairLockHeld(Refused):
    """The repair lock could not be taken (another repair holds it, or the sweeper may not create it): why."""
