"""One error type for every undecodable metadata blob, with a short machine-readable kind."""

from __future__ import annotations

from sweeper.errors import InternalError

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
