"""Pulsar's metadata: compression envelope, managed-ledger, cursor and schema-locator codecs."""

from __future__ import annotations

import uuid

import pytest

from sweeper.codecs import pulsar as codec
from sweeper.codecs.envelope import COMPRESSIONS, MAGIC, unwrap, wrap
from sweeper.codecs.errors import MetadataDecodeError

pb = codec.pb


def _ml_info(ledgers: int = 50) -> pb.ManagedLedgerInfo:
    info = pb.ManagedLedgerInfo()
    for i in range(ledgers):
        item = info.ledgerInfo.add(ledgerId=1000 + i, entries=10 * i, size=700 * i, timestamp=1_700_000_000_000 + i)
        if i == 0:
            ctx = item.offloadContext
            ctx.uidMsb, ctx.uidLsb, ctx.complete, ctx.bookkeeperDeleted, ctx.timestamp = -5, 7, True, True, 42
            ctx.driverMetadata.name = "aws-s3"
            ctx.driverMetadata.properties.add(key="bucket", value="offload")
    info.properties.add(key="PULSAR.SHADOW_SOURCE", value="persistent://t/ns/src")
    return info


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_managed_ledger_round_trip_every_compression(compression: str) -> None:
    info = _ml_info()
    data = codec.encode_managed_ledger_info(info, compression)
    assert (int.from_bytes(data[:2], "big") == MAGIC) == (compression != "NONE")
    assert codec.decode_managed_ledger_info(data) == info


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_envelope_round_trip(compression: str) -> None:
    payload = b"\x0a\x02\x08\x01" * 500
    assert unwrap(wrap(payload, compression)) == payload


def test_empty_managed_ledger_znode_is_an_empty_info() -> None:
    assert len(codec.decode_managed_ledger_info(b"").ledgerInfo) == 0


def _envelope(compression_type: int, size: int, payload: bytes) -> bytes:
    header = bytes([0x08, compression_type, 0x10]) + _varint(size)
    return MAGIC.to_bytes(2, "big") + len(header).to_bytes(4, "big") + header + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (_envelope(7, 4, b"junk"), "unknown_compression"),
        (MAGIC.to_bytes(2, "big") + b"\x00", "truncated"),
        (MAGIC.to_bytes(2, "big") + (500).to_bytes(4, "big") + b"\x08\x01", "truncated"),
        (_envelope(1, 100, b"\xff\xff\xff\xff"), "decompression_failed"),
        (_envelope(3, 100, b"not zstd at all"), "decompression_failed"),
        (_envelope(2, 100, b"not zlib"), "decompression_failed"),
        (_envelope(4, 100, b"\xff\xff\xff"), "decompression_failed"),
        (_envelope(0, 99, b"\x0a\x02\x08\x01"), "decompression_failed"),  # size mismatch
        (MAGIC.to_bytes(2, "big") + (2).to_bytes(4, "big") + b"\xff\xff", "bad_header"),
    ],
)
def test_bad_envelopes(data: bytes, kind: str) -> None:
    with pytest.raises(MetadataDecodeError) as info:
        codec.decode_managed_ledger_info(data)
    assert info.value.kind == kind


def test_truncated_and_garbage_protobuf() -> None:
    data = codec.encode_managed_ledger_info(_ml_info())
    with pytest.raises(MetadataDecodeError) as info:
        codec.decode_managed_ledger_info(data[:-3])
    assert info.value.kind == "invalid_protobuf"
    with pytest.raises(MetadataDecodeError):
        codec.decode_managed_ledger_info(b"\x0a\x05\x10\x01")  # a ledger entry without its required id


def test_cursor_round_trip_with_properties() -> None:
    info = pb.ManagedCursorInfo(cursorsLedgerId=-1, markDeleteLedgerId=12, markDeleteEntryId=3)
    info.properties.add(name="CompactedTopicLedger", value=99)
    info.cursorProperties.add(name="#pulsar.internal.delayed.bucket_1_2", value="77")
    for compression in ("NONE", "ZSTD"):
        assert codec.decode_managed_cursor_info(codec.encode_managed_cursor_info(info, compression)) == info
    for bad in (b"", b"\x08"):
        with pytest.raises(MetadataDecodeError):
            codec.decode_managed_cursor_info(bad)


def test_schema_locator_round_trip_and_garbage() -> None:
    locator = pb.SchemaLocator()
    for version in range(3):
        entry = locator.index.add(version=version, hash=b"h" * 32)
        entry.position.ledgerId, entry.position.entryId = 500 + version, 0
    locator.info.CopyFrom(locator.index[-1])
    assert codec.decode_schema_locator(codec.encode_schema_locator(locator)) == locator
    for bad in (b"", b"\xff\xff\xff", locator.SerializeToString()[:-5]):
        with pytest.raises(MetadataDecodeError):
            codec.decode_schema_locator(bad)


@pytest.mark.parametrize(
    ("msb", "lsb", "expected"),
    [
        (-1, -1, "ffffffff-ffff-ffff-ffff-ffffffffffff"),
        (0, 1, "00000000-0000-0000-0000-000000000001"),
        # java: new UUID(0x123e4567e89b12d3L, 0xa456426614174000L) (the lsb is negative as a long)
        (0x123E4567E89B12D3, 0xA456426614174000 - 2**64, "123e4567-e89b-12d3-a456-426614174000"),
    ],
)
def test_offload_uuid_as_java_prints_it(msb: int, lsb: int, expected: str) -> None:
    assert codec.offload_uuid(msb, lsb) == expected
    assert uuid.UUID(expected)
