"""The table store's errors: a table root or engine the config cannot use (configuration errors, exit 2), and the
store's own internal errors (tests/test_errors.py says why none reaches the operator as such)."""

from __future__ import annotations

from sweeper.errors import ConfigurationError, InternalError


class TableNotFoundError(InternalError, LookupError):
    """No Delta table (or no such version of it) at the path."""


class TableSchemaError(InternalError, ValueError):
    """Data whose columns or types don't match the table's; nothing was committed."""


class NotNullViolation(InternalError, ValueError):
    """Rows with nulls in a column the table declares NOT NULL."""


class TableStorageUnavailableError(ConfigurationError, RuntimeError):
    """A table root Spark cannot reach: e.g. s3:// without hadoop-aws and the AWS SDK on the class path."""


class DeltaSparkUnavailableError(ConfigurationError, RuntimeError):
    """engine="delta-spark" on a session without Delta's jars or SQL extension."""
