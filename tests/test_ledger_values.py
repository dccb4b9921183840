"""The scan's `bk_ledgers` rows, built straight from the decoded message, are the rows the decoded LedgerMetadata
gives, for every format and for the odd input the codec accepts; the packer's tuple chunks are its dict rows."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sweeper._proto import bookkeeper_metadata_pb2 as pb
from sweeper.codecs.bookkeeper import (
    LedgerMetadata,
    Segment,
    decode_ledger_message,
    decode_ledger_metadata,
    encode_ledger_metadata,
    ledger_message,
)
from sweeper.codecs.errors import MetadataDecodeError
from sweeper.rules.safety import ledger_created_ms
from sweeper.scan import RowChunk, as_rows
from sweeper.scan.bookkeeper import LEDGER_COLUMNS, OWNERSHIP_KEYS, ledger_row, ledger_values
from sweeper.table_schemas import SNAPSHOT_TABLES

ZK_CTIME, ZK_MTIME = 1_700_000_000_500, 1_700_000_001_000


def reference_row(md: LedgerMetadata, zk_ctime_ms: int = ZK_CTIME) -> dict[str, Any]:
    """The row as the scan built it before, a dict from LedgerMetadata: the independent statement of the mapping."""
    text: dict[str, str] = {}
    binary: dict[str, bytes] = {}
    for key, value in md.custom_metadata.items():
        try:
            text[key] = value.decode("utf-8")
        except UnicodeDecodeError:
            if key in OWNERSHIP_KEYS:
                raise MetadataDecodeError("ownership not text", kind="invalid_utf8") from None
            binary[key] = value
    ctime = md.ctime if md.ctime is not None and md.ctime > 0 else None
    return {
        "ledger_id": 42, "path": "/ledgers/00/0000/L0042", "tree": "short", "zk_version": 3,
        "zk_ctime_ms": zk_ctime_ms, "zk_mtime_ms": ZK_MTIME, "format_version": md.format_version, "state": md.state,
        "ensemble_size": md.ensemble_size, "write_quorum": md.write_quorum_size, "ack_quorum": md.ack_quorum_size,
        "last_entry_id": md.last_entry_id, "length": md.length, "metadata_ctime_ms": ctime,
        "created_ms": ledger_created_ms(ctime, zk_ctime_ms),
        "created_source": "metadata" if ctime is not None and ctime >= zk_ctime_ms else "znode",
        "digest_type": md.digest_type, "segments": len(md.segments),
        "bookies": sorted({b for s in md.segments for b in s.ensemble}), "custom_metadata": text,
        "custom_metadata_binary": binary or None, "is_pulsar": text.get("application") == "pulsar",
        "component": text.get("component"), "managed_ledger": text.get("pulsar/managed-ledger"),
        "cursor": text.get("pulsar/cursor"), "schema_id": text.get("pulsar/schemaId"),
        "compacted_topic": text.get("pulsar/compactedTopic"), "bucket_key": text.get("pulsar/delayedIndexBucketKey"),
        "bucket_topic": text.get("pulsar/delayedIndexTopic"), "bucket_cursor": text.get("pulsar/delayedIndexCursor"),
        "segment_first_entries": [s.first_entry_id for s in md.segments],
        "segment_ensembles": [list(s.ensemble) for s in md.segments],
    }


def scanned_row(data: bytes, zk_ctime_ms: int = ZK_CTIME) -> dict[str, Any]:
    """What scan_ledger_units makes of a znode's bytes."""
    decoded = decode_ledger_message(data)
    if decoded is None:
        md = decode_ledger_metadata(data)
        decoded = ledger_message(md), md.format_version
    values = ledger_values("/ledgers/00/0000/L0042", 42, "short", *decoded, 3, zk_ctime_ms, ZK_MTIME)
    return dict(zip(LEDGER_COLUMNS, values, strict=True))


def _random_ledger(rng: random.Random) -> LedgerMetadata:
    bookies = [f"10.0.0.{i}:3181" for i in range(6)]
    ensemble = rng.randint(1, 4)
    custom: dict[str, bytes] = {}
    for key in rng.sample(["application", "component", "pulsar/managed-ledger", "pulsar/cursor", "pulsar/schemaId",
                           "pulsar/compactedTopic", "pulsar/delayedIndexBucketKey", "pulsar/delayedIndexTopic",
                           "pulsar/delayedIndexCursor", "other", "pulsar/compactedTo"], rng.randint(0, 6)):
        custom[key] = b"\x00\xff\x01" if key in ("pulsar/compactedTo", "other") and rng.random() < 0.5 else (
            b"pulsar" if key == "application" else f"{key}-{rng.randint(0, 9)}".encode())
    return LedgerMetadata(
        format_version=3, ensemble_size=ensemble, write_quorum_size=ensemble, ack_quorum_size=rng.randint(1, ensemble),
        state=rng.choice(["OPEN", "IN_RECOVERY", "CLOSED"]), last_entry_id=rng.randint(-1, 10**6),
        length=rng.randint(0, 10**9),
        segments=tuple(Segment(first, tuple(rng.sample(bookies, ensemble)))
                       for first in sorted(rng.sample(range(0, 1000), rng.randint(1, 3)))),
        digest_type=rng.choice(list(pb.LedgerMetadataFormat.DigestType.keys())), password=b"",
        # Absent, zero, older and newer than the znode: each sets created_ms and created_source apart.
        ctime=rng.choice([None, 0, -5, ZK_CTIME - 10_000, ZK_CTIME, ZK_CTIME + 10_000]),
        ctoken=rng.choice([None, 0, 7]), custom_metadata=custom)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_rows_from_the_message_are_the_rows_of_the_metadata(version: int) -> None:
    rng = random.Random(version)
    for _ in range(300):
        md = _random_ledger(rng)
        data = encode_ledger_metadata(md, version)
        assert scanned_row(data) == reference_row(decode_ledger_metadata(data)), data


def test_upstream_fixtures_and_odd_encodings_give_the_same_rows(shared_fixtures: Path) -> None:
    samples = [(shared_fixtures / "bookkeeper" / name).read_bytes()
               for name in ("version1.bin", "version2.bin", "version2ctime.bin", "version3.bin")]
    v3 = encode_ledger_metadata(_random_ledger(random.Random(5)), 3)
    samples.append(v3.replace(b"Version\t3\n", b"Version\t03\n"))  # the header spelled unusually
    samples.append(v3 + b"trailing bytes")  # ignored after the delimited message, as BookKeeper does
    # No ack quorum and no last entry: the write quorum and INVALID_ENTRY_ID, as BookKeeper reads them.
    bare = pb.LedgerMetadataFormat(quorumSize=2, ensembleSize=3, length=0, state=pb.LedgerMetadataFormat.OPEN)
    bare.segment.add(firstEntryId=0, ensembleMember=["b:1", "a:1", "b:1"])
    payload = bare.SerializeToString()
    samples.append(b"BookieMetadataFormatVersion\t3\n" + bytes([len(payload)]) + payload)
    # Invalid UTF-8 in string fields (upb hands back bytes): replacement characters, as Java reads them.
    odd = pb.LedgerMetadataFormat(quorumSize=1, ensembleSize=1, length=0, state=pb.LedgerMetadataFormat.OPEN)
    odd.segment.add(firstEntryId=0, ensembleMember=["BOOKIE"])
    odd.segment.add(firstEntryId=5, ensembleMember=["bk\ufffd:11"])
    odd.customMetadata.add(key="KEY", value=b"\xff")
    odd.customMetadata.add(key="other", value=b"one")
    odd.customMetadata.add(key="other", value=b"\xfe")  # a repeated key: the last value, binary here
    payload = odd.SerializeToString().replace(b"BOOKIE", b"bk\xff:11").replace(b"KEY", b"k\xfe\xff")
    samples.append(b"BookieMetadataFormatVersion\t3\n" + bytes([len(payload)]) + payload)
    for data in samples:
        for zk_ctime in (ZK_CTIME, 1):
            assert scanned_row(data, zk_ctime) == reference_row(decode_ledger_metadata(data), zk_ctime), data
    assert scanned_row(samples[-1])["bookies"] == ["bk\ufffd:11"]
    assert scanned_row(samples[-1])["custom_metadata_binary"] == {"k\ufffd\ufffd": b"\xff", "other": b"\xfe"}


def test_a_repeated_text_key_keeps_its_last_value() -> None:
    # BookKeeper's LedgerMetadataSerDe.decodeFormat puts each entry into a HashMap, so the last one wins. The
    # reference above reads through the same custom_metadata_of, so this one states the answer literally.
    msg = pb.LedgerMetadataFormat(quorumSize=1, ensembleSize=1, length=0, state=pb.LedgerMetadataFormat.CLOSED)
    msg.segment.add(firstEntryId=0, ensembleMember=["bk:3181"])
    for key, value in (("application", b"pulsar"), ("component", b"a"),
                       ("pulsar/managed-ledger", b"t/ns/x/persistent/one"), ("component", b"b"),
                       ("pulsar/managed-ledger", b"t/ns/x/persistent/two")):
        msg.customMetadata.add(key=key, value=value)
    payload = msg.SerializeToString()
    assert 127 < len(payload) < 2**14  # the delimiting length is a two-byte varint
    prefix = bytes([len(payload) & 0x7F | 0x80, len(payload) >> 7])
    row = scanned_row(b"BookieMetadataFormatVersion\t3\n" + prefix + payload)
    assert row["component"] == "b"
    assert row["managed_ledger"] == "t/ns/x/persistent/two"
    assert row["custom_metadata"] == {"application": "pulsar", "component": "b",
                                      "pulsar/managed-ledger": "t/ns/x/persistent/two"}
    assert row["custom_metadata_binary"] is None


def test_ownership_that_is_not_text_is_refused_either_way() -> None:
    md = replace(_random_ledger(random.Random(1)),
                 custom_metadata={"application": b"pulsar", "pulsar/managed-ledger": b"\xff\xfe"})
    data = encode_ledger_metadata(md, 3)
    with pytest.raises(MetadataDecodeError) as exc:
        scanned_row(data)
    assert exc.value.kind == "invalid_utf8"
    with pytest.raises(MetadataDecodeError):
        reference_row(decode_ledger_metadata(data))


def test_ledger_row_is_the_dict_of_the_same_values() -> None:
    md = _random_ledger(random.Random(2))
    row = ledger_row("/ledgers/00/0000/L0042", 42, "short", md, 3, ZK_CTIME, ZK_MTIME)
    assert row.pop("record_type") == "bk_ledgers"
    assert row == reference_row(md)


def test_the_columns_are_the_tables_own_in_its_order() -> None:
    names = [f.name for f in SNAPSHOT_TABLES["bk_ledgers"].fields if f.name not in ("run_id", "captured_at")]
    assert list(LEDGER_COLUMNS) == names


def test_a_chunk_packs_as_its_dict_rows_do() -> None:
    from sweeper.snapshot import TablePacker

    rng = random.Random(3)
    values = [ledger_values(f"/ledgers/L{i}", i, "short", ledger_message(md), 3, 3, ZK_CTIME, ZK_MTIME)
              for i, md in enumerate(_random_ledger(rng) for _ in range(50))]
    chunk = RowChunk("bk_ledgers", LEDGER_COLUMNS, values)
    captured = datetime(2026, 11, 27, tzinfo=UTC)
    packed_chunk = TablePacker("r", captured)._pack_chunk(chunk)
    by_rows = TablePacker("r", captured, batch_rows=10**6)
    for row in as_rows([chunk]):
        assert list(by_rows.add(row)) == []
    (packed_rows,) = [b for b in by_rows.flush() if b.column("record_type")[0].as_py() == "bk_ledgers"]
    assert packed_chunk.equals(packed_rows)
    with pytest.raises(ValueError, match="not the table's"):
        TablePacker("r", captured)._pack_chunk(RowChunk("bk_ledgers", LEDGER_COLUMNS[:-1], [v[:-1] for v in values]))
