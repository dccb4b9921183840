"""Pulsar's metadata compression envelope.

Layout: big-endian short magic 0x4778, big-endian int32 header size, a header message
{compressionType, uncompressedSize}, then the compressed payload. Pulsar writes plain protobuf,
without the envelope, when compression is off, so data without the magic is returned as is.
Codecs as Pulsar's: LZ4 raw block, ZLIB stream (java.util.zip.Deflater), ZSTD frame, SNAPPY raw.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import lz4.block
import zstandard
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from sweeper._proto import pulsar_metadata_pb2 as pb
from sweeper.codecs.errors import MetadataDecodeError

MAGIC = 0x4778
_HEAD = struct.Struct(">Hi")
COMPRESSIONS = ("NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY")
# Far above any real managed-ledger info; refuses a forged size before allocating it.
MAX_UNCOMPRESSED = 256 * 1024 * 1024


def has_envelope(data: bytes) -> bool:
    # Unambiguous: 0x47 would open a protobuf field with wire type 7, which does not exist.
    return len(data) >= 2 and (data[0] << 8 | data[1]) == MAGIC


def _decompress(kind: str, payload: bytes, size: int) -> bytes:
    # Each codec is held to the header's uncompressed size, so a forged size or a bomb cannot
    # make us allocate more than that.
    if kind == "NONE":
        return payload
    if kind == "LZ4":
        return lz4.block.decompress(payload, uncompressed_size=size)
    if kind == "ZLIB":
        inflater = zlib.decompressobj()
        out = inflater.decompress(payload, size + 1)
        if not inflater.eof:
            raise ValueError("zlib stream is incomplete or longer than the header says")
        return out
    if kind == "ZSTD":
        declared = zstandard.frame_content_size(payload)
        if declared not in (-1, size):  # -1: the frame does not say
            raise ValueError(f"zstd frame declares {declared} bytes")
        return zstandard.ZstdDecompressor().decompress(payload, max_output_size=size)
    if kind == "SNAPPY":
        declared = cramjam.snappy.decompress_raw_len(payload)
        if declared != size:
            raise ValueError(f"snappy block declares {declared} bytes")
        return bytes(cramjam.snappy.decompress_raw(payload))
    raise AssertionError(kind)


def unwrap(data: bytes) -> bytes:
    """The protobuf payload inside `data`, decompressed; `data` itself when it has no envelope."""
    if not has_envelope(data):
        return data
    if len(data) < _HEAD.size:
        raise MetadataDecodeError(f"compression envelope truncated: {len(data)} bytes", kind="truncated")
    _, header_size = _HEAD.unpack_from(data)
    if header_size < 0 or _HEAD.size + header_size > len(data):
        raise MetadataDecodeError(
            f"compression envelope header of {header_size} bytes does not fit in {len(data)} bytes", kind="truncated"
        )
    header = pb.ManagedLedgerInfoMetadata()
    try:
        header.ParseFromString(data[_HEAD.size : _HEAD.size + header_size])
    except DecodeError as exc:
        raise MetadataDecodeError(
            f"compression envelope header is not valid protobuf: {exc}", kind="bad_header"
        ) from exc
    if not header.HasField("compressionType"):
        # proto2 keeps an enum value it does not know as an unknown field: tell that case apart.
        unknown = [f.data for f in UnknownFieldSet(header) if f.field_number == 1]
        if unknown:
            raise MetadataDecodeError(
                f"unknown compression type {unknown[0]} in metadata envelope", kind="unknown_compression"
            )
        raise MetadataDecodeError("compression envelope header has no compression type", kind="bad_header")
    if not header.HasField("uncompressedSize"):
        raise MetadataDecodeError("compression envelope header has no uncompressed size", kind="bad_header")
    kind = pb.CompressionType.Name(header.compressionType)
    size = header.uncompressedSize
    if size < 0 or size > MAX_UNCOMPRESSED:
        raise MetadataDecodeError(f"implausible uncompressed size {size} in metadata envelope", kind="bad_header")
    payload = data[_HEAD.size + header_size :]
    try:
        out = _decompress(kind, payload, size)
    except Exception as exc:  # each library has its own error type
        raise MetadataDecodeError(f"{kind} payload does not decompress: {exc}", kind="decompression_failed") from exc
    if len(out) != size:
        raise MetadataDecodeError(
            f"{kind} payload decompressed to {len(out)} bytes, header says {size}", kind="decompression_failed"
        )
    return out


def wrap(payload: bytes, compression: str = "NONE") -> bytes:
    """Wrap a protobuf payload as Pulsar does; NONE writes the envelope too (Pulsar would not)."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"unknown compression {compression!r}; one of {', '.join(COMPRESSIONS)}")
    if compression == "NONE":
        body = payload
    elif compression == "LZ4":
        body = lz4.block.compress(payload, store_size=False)
    elif compression == "ZLIB":
        body = zlib.compress(payload)
    elif compression == "ZSTD":
        body = zstandard.ZstdCompressor().compress(payload)
    else:
        body = bytes(cramjam.snappy.compress_raw(payload))
    header = pb.ManagedLedgerInfoMetadata(
        compressionType=pb.CompressionType.Value(compression), uncompressedSize=len(payload)
    ).SerializeToString()
    return _HEAD.pack(MAGIC, len(header)) + header + body
