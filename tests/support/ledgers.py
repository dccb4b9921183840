"""Ledger znodes as BookKeeper writes them, for tests that put ledgers in ZooKeeper by hand."""

from __future__ import annotations

from collections.abc import Mapping

from sweeper.codecs.bookkeeper import LedgerMetadata, Segment, encode_ledger_metadata

# A fixed creation time (epoch ms) in the hand-made ledgers' metadata: their age is then the tests' to choose.
CREATED = 1_700_000_000_000


def ledger_bytes(custom: Mapping[str, str], state: str = "CLOSED", ctime: int | None = CREATED) -> bytes:
    md = LedgerMetadata(
        format_version=3, ensemble_size=1, write_quorum_size=1, ack_quorum_size=1, state=state,
        last_entry_id=9 if state == "CLOSED" else -1, length=100, segments=(Segment(0, ("bookie-1:3181",)),),
        digest_type="CRC32C", password=b"", ctime=ctime, ctoken=None,
        custom_metadata={k: v.encode() for k, v in custom.items()})
    return encode_ledger_metadata(md)
