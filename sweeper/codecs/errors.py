"""The codecs' errors: one type for every undecodable metadata blob (with a short machine-readable kind), a pending
delete record we will not act on (both quarantined, never raised to the operator), and a ledger layout we refuse."""

from __future__ import annotations

from sweeper.errors import InternalError, Refused

KINDS = frozenset(
    {
        "unknown_format_version",
        "bad_header",
        "truncated",
        "invalid_protobuf",
        "invalid_text",
        "unknown_compression",
        "decompression_failed",
        "invalid_utf8",
        "invalid_reference",
    }
)


class MetadataDecodeError(InternalError, ValueError):
    """Raised for input we refuse to interpret; the message says what was wrong."""

    def __init__(self, message: str, kind: str = "invalid_protobuf") -> None:
        super().__init__(message)
        if kind not in KINDS:
            raise ValueError(f"unknown MetadataDecodeError kind {kind!r}")
        self.kind = kind


class InvalidPendingDelete(InternalError, ValueError):
    """A record we will not act on; `kind` says why (for the quarantine table)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class LayoutError(Refused, ValueError):
    """A ledger id, znode path or layout znode the configured ledger layout cannot hold: nothing is acted on."""
