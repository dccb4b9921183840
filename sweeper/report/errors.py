"""The report's one error: a configured metrics target that failed (internal: the run warns, never fails for it)."""

from __future__ import annotations

from sweeper.errors import InternalError


class MetricsError(InternalError, RuntimeError):
    pass
