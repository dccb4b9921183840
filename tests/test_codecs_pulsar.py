"""Pulsar's metadata: compression envelope, managed-ledger, cursor and schema-locator codecs."""

from __future__ import annotations

import uuid
import zlib

import cramjam
import lz4.block
import pytest
import zstandard

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
            ctx.driverMetadata.properties.add(key="serviceEndpoint", value="http://s3:9000")
            item.properties.add(key="minPublishTimestamp", value="1")
    info.terminatedPosition.ledgerId, info.terminatedPosition.entryId = 1049, 3
    info.properties.add(key="PULSAR.SHADOW_SOURCE", value="persistent://t/ns/src")
    return info


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_managed_ledger_round_trip_every_compression(compression: str) -> None:
    info = _ml_info()
    data = codec.encode_managed_ledger_info(info, compression)
    assert (int.from_bytes(data[:2], "big") == MAGIC) == (compression != "NONE")
    decoded = codec.decode_managed_ledger_info(data)
    assert decoded == info
    ctx = decoded.ledgerInfo[0].offloadContext
    assert (ctx.uidMsb, ctx.uidLsb, ctx.complete, ctx.bookkeeperDeleted, ctx.timestamp) == (-5, 7, True, True, 42)
    assert {p.key: p.value for p in ctx.driverMetadata.properties}["bucket"] == "offload"
    assert not decoded.ledgerInfo[1].HasField("offloadContext")


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_envelope_round_trip(compression: str) -> None:
    payload = b"\x0a\x02\x08\x01" * 500
    data = wrap(payload, compression)
    assert int.from_bytes(data[:2], "big") == MAGIC
    assert unwrap(data) == payload


def test_envelope_layout_is_pulsars() -> None:
    # short magic, int32 header size, {compressionType, uncompressedSize}, then a raw LZ4 block
    payload = b"x" * 100
    data = wrap(payload, "LZ4")
    header = bytes([0x08, 0x01, 0x10, 100])
    assert data[:10] == b"\x47\x78" + (4).to_bytes(4, "big") + header
    assert lz4.block.decompress(data[10:], uncompressed_size=100) == payload


@pytest.mark.parametrize(
    ("compression", "compress"),
    [
        ("ZLIB", zlib.compress),  # java.util.zip.Deflater: a zlib stream with header and checksum
        ("ZSTD", lambda b: zstandard.ZstdCompressor().compress(b)),
        ("SNAPPY", lambda b: bytes(cramjam.snappy.compress_raw(b))),
        ("LZ4", lambda b: lz4.block.compress(b, store_size=False)),
    ],
)
def test_unwrap_reads_payloads_compressed_elsewhere(compression: str, compress: object) -> None:
    payload = _ml_info().SerializeToString()
    type_number = COMPRESSIONS.index(compression)
    data = _envelope(type_number, len(payload), compress(payload))  # type: ignore[operator]
    assert codec.decode_managed_ledger_info(data) == _ml_info()


def test_data_without_the_magic_is_returned_as_is() -> None:
    assert unwrap(b"\x0a\x02\x08\x01") == b"\x0a\x02\x08\x01"
    assert unwrap(b"") == b""
    assert unwrap(b"\x47") == b"\x47"


def test_wrap_refuses_an_unknown_compression() -> None:
    with pytest.raises(ValueError):
        wrap(b"x", "BROTLI")


def test_empty_managed_ledger_znode_is_an_empty_info() -> None:
    info = codec.decode_managed_ledger_info(b"")
    assert len(info.ledgerInfo) == 0 and not info.HasField("terminatedPosition")


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


_ZLIB_100 = zlib.compress(b"a" * 100)
_ZSTD_100 = zstandard.ZstdCompressor().compress(b"a" * 100)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (_envelope(7, 4, b"junk"), "unknown_compression"),
        (MAGIC.to_bytes(2, "big"), "truncated"),
        (MAGIC.to_bytes(2, "big") + b"\x00", "truncated"),
        (MAGIC.to_bytes(2, "big") + (500).to_bytes(4, "big") + b"\x08\x01", "truncated"),
        (MAGIC.to_bytes(2, "big") + (-1).to_bytes(4, "big", signed=True), "truncated"),
        (MAGIC.to_bytes(2, "big") + (0).to_bytes(4, "big") + b"\x0a\x02\x08\x01", "bad_header"),
        (MAGIC.to_bytes(2, "big") + (2).to_bytes(4, "big") + b"\xff\xff", "bad_header"),
        (MAGIC.to_bytes(2, "big") + (2).to_bytes(4, "big") + b"\x08\x01", "bad_header"),  # no size
        (_envelope(1, 100, b"\xff\xff\xff\xff"), "decompression_failed"),
        (_envelope(3, 100, b"not zstd at all"), "decompression_failed"),
        (_envelope(2, 100, b"not zlib"), "decompression_failed"),
        (_envelope(4, 100, b"\xff\xff\xff"), "decompression_failed"),
        (_envelope(2, 100, _ZLIB_100[:-6]), "decompression_failed"),  # truncated stream
        (_envelope(2, 50, _ZLIB_100), "decompression_failed"),  # longer than the header says
        (_envelope(3, 50, _ZSTD_100), "decompression_failed"),  # frame declares another size
        (_envelope(4, 50, bytes(cramjam.snappy.compress_raw(b"a" * 100))), "decompression_failed"),
        (_envelope(1, 50, lz4.block.compress(b"a" * 100, store_size=False)), "decompression_failed"),
        (_envelope(0, 99, b"\x0a\x02\x08\x01"), "decompression_failed"),  # size mismatch
    ],
)
def test_bad_envelopes(data: bytes, kind: str) -> None:
    with pytest.raises(MetadataDecodeError) as info:
        codec.decode_managed_ledger_info(data)
    assert info.value.kind == kind
    with pytest.raises(MetadataDecodeError):
        codec.decode_managed_cursor_info(data)


def test_every_truncation_of_an_envelope_is_refused() -> None:
    data = codec.encode_managed_ledger_info(_ml_info(), "ZSTD")
    for cut in range(1, len(data)):
        with pytest.raises(MetadataDecodeError):
            codec.decode_managed_ledger_info(data[:cut])


def test_truncated_and_garbage_protobuf() -> None:
    data = codec.encode_managed_ledger_info(_ml_info())
    with pytest.raises(MetadataDecodeError) as info:
        codec.decode_managed_ledger_info(data[:-3])
    assert info.value.kind == "invalid_protobuf"
    with pytest.raises(MetadataDecodeError) as info:
        codec.decode_managed_ledger_info(b"\x0a\x05\x10\x01")  # a ledger entry without its required id
    assert info.value.kind == "invalid_protobuf"
    with pytest.raises(MetadataDecodeError):
        codec.decode_managed_ledger_info(b"\x0f\xff\xff")


def test_unknown_fields_round_trip() -> None:
    # LedgerInfo.offloadContext.offloadSegment (7) and ManagedCursorInfo.individualDeletedMessages (4)
    # are upstream fields we do not declare: they must survive decode and re-encode untouched.
    segment = b"\x08\x01\x10\x02\x18\x01"
    ledger = b"\x08\xe8\x07" + b"\x2a" + bytes([2 + len(segment)]) + b"\x3a" + bytes([len(segment)]) + segment
    ml_data = b"\x0a" + bytes([len(ledger)]) + ledger
    info = codec.decode_managed_ledger_info(ml_data)
    assert info.ledgerInfo[0].ledgerId == 1000
    assert codec.encode_managed_ledger_info(info) == ml_data

    ranges = b"\x22\x0c\x0a\x04\x08\x01\x10\x02\x12\x04\x08\x01\x10\x05"
    cursor_data = b"\x08\x7f" + ranges
    cursor = codec.decode_managed_cursor_info(cursor_data)
    assert cursor.cursorsLedgerId == 127
    assert codec.encode_managed_cursor_info(cursor) == cursor_data
    assert codec.decode_managed_cursor_info(codec.encode_managed_cursor_info(cursor, "LZ4")) == cursor


def test_invalid_utf8_in_strings_becomes_replacement_characters() -> None:
    # Pulsar's Java parser decodes such bytes as U+FFFD; upb would hand us bytes in a str field.
    info = _ml_info(2)
    data = info.SerializeToString().replace(b"offload", b"off\xffoad")
    decoded = codec.decode_managed_ledger_info(data)
    props = decoded.ledgerInfo[0].offloadContext.driverMetadata.properties
    assert props[0].value == "off\ufffdoad"
    assert all(isinstance(p.value, str) for p in props)
    assert decoded.ledgerInfo[1].ledgerId == 1001


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_cursor_round_trip_with_properties(compression: str) -> None:
    info = pb.ManagedCursorInfo(cursorsLedgerId=-1, markDeleteLedgerId=12, markDeleteEntryId=3, lastActive=99)
    info.properties.add(name="CompactedTopicLedger", value=99)
    info.cursorProperties.add(name="#pulsar.internal.delayed.bucket_1_2", value="77")
    decoded = codec.decode_managed_cursor_info(codec.encode_managed_cursor_info(info, compression))
    assert decoded == info
    assert decoded.cursorsLedgerId == -1
    assert {p.name: p.value for p in decoded.cursorProperties} == {"#pulsar.internal.delayed.bucket_1_2": "77"}


@pytest.mark.parametrize("bad", [b"", b"\x08", b"\x10\x05"])
def test_bad_cursor_info(bad: bytes) -> None:
    with pytest.raises(MetadataDecodeError):
        codec.decode_managed_cursor_info(bad)


def test_schema_locator_round_trip_and_garbage() -> None:
    locator = pb.SchemaLocator()
    for version in range(3):
        entry = locator.index.add(version=version, hash=b"h" * 32)
        entry.position.ledgerId, entry.position.entryId = 500 + version, 0
    locator.info.CopyFrom(locator.index[-1])
    decoded = codec.decode_schema_locator(codec.encode_schema_locator(locator))
    assert decoded == locator
    assert [e.position.ledgerId for e in decoded.index] == [500, 501, 502]
    for bad in (b"", b"\xff\xff\xff", locator.SerializeToString()[:-5], b"\x12\x00"):
        with pytest.raises(MetadataDecodeError):
            codec.decode_schema_locator(bad)


@pytest.mark.parametrize(
    ("msb", "lsb", "expected"),
    [
        (-1, -1, "ffffffff-ffff-ffff-ffff-ffffffffffff"),
        (0, 0, "00000000-0000-0000-0000-000000000000"),
        (0, 1, "00000000-0000-0000-0000-000000000001"),
        (-(2**63), 2**63 - 1, "80000000-0000-0000-7fff-ffffffffffff"),
        # new UUID(0x123e4567e89b12d3L, 0xa456426614174000L): the lsb is negative as a Java long
        (0x123E4567E89B12D3, 0xA456426614174000 - 2**64, "123e4567-e89b-12d3-a456-426614174000"),
        (0x123E4567E89B12D3, -0x5B5B8B8B8B8B8B8C, "123e4567-e89b-12d3-a4a4-747474747474"),
    ],
)
def test_offload_uuid_as_java_prints_it(msb: int, lsb: int, expected: str) -> None:
    assert codec.offload_uuid(msb, lsb) == expected
    parsed = uuid.UUID(expected)  # and back: the signed halves are what Pulsar stores
    assert (parsed.int >> 64) - ((parsed.int >> 127) << 64) == msb
    assert (parsed.int & (2**64 - 1)) - (((parsed.int >> 63) & 1) << 64) == lsb
