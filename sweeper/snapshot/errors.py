"""The snapshot's errors: a host clock we refuse to trust (a refusal, exit 3), and tables that do not hold what the scan
read (internal: the run is failed and recorded, never used)."""

from __future__ import annotations

from sweeper.errors import InternalError, Refused


class SnapshotIncomplete(InternalError, RuntimeError):
    """The committed tables hold other row counts than the scan produced: the run is failed, never used."""


class ClockSkewRefused(Refused):
    """This host's clock disagrees with ZooKeeper's beyond [safety] max_clock_skew_seconds."""
