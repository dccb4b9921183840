"""The table store's own errors (neither reaches the operator as such: tests/test_errors.py says why)."""

from __future__ import annotations

from sweeper.errors import InternalError


class TableNotFoundError(InternalError, LookupError):
    """No Delta table (or no such version of it) at the path."""


class TableSchemaError(InternalError, ValueError):
    """Data whose columns or types don't match the table's; nothing was committed."""
