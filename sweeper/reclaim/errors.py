"""How a bookie fails the reclaim stage's measurement (internal: that bookie is not_measured, never a failed run)."""

from __future__ import annotations

from sweeper.errors import InternalError


class BookieAnswerError(InternalError, ValueError):
    """A bookie answered something we cannot read (not Prometheus text, not the JSON its API documents)."""


class BookieUnreachable(InternalError, RuntimeError):
    """No answer, or an HTTP error: the bookie is not measured (never a failed run)."""
