"""The emit stage's errors: a refusal before sending anything (exit 3), and a failed send (internal: the pipeline turns
it into a refusal naming what the broker acknowledged)."""

from __future__ import annotations

from sweeper.errors import InternalError, Refused


class EmitRefused(Refused):
    """Nothing was emitted on purpose: the run is not reconciled, or the topic is not as configured."""


class EmitFailed(InternalError, RuntimeError):
    """Sending failed; what the broker acknowledged is in `emitted`, and a rerun sends only the rest."""
