"""The report's one error: a configured metrics target that failed (internal: the run warns, never fails for it)."""

from __future__ import annotations

from sweeper.errors import InternalError


class MetricsError(InternalError, RuntimeError):
    """A configured metrics target (textfile, pushgateway) failed; the pipeline prints it as a warning line."""
