"""Pulsar's ZooKeeper metadata: managed ledgers, cursors and schema locators.

Managed-ledger and cursor znodes may carry the compression envelope (`sweeper.codecs.envelope`);
an empty managed-ledger znode is a managed ledger with no ledgers yet.
"""

from __future__ import annotations

import uuid

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from sweeper._proto import pulsar_metadata_pb2 as pb
from sweeper.codecs.envelope import unwrap, wrap
from sweeper.codecs.errors import MetadataDecodeError

__all__ = [
    "decode_managed_cursor_info",
    "decode_managed_ledger_info",
    "decode_schema_locator",
    "encode_managed_cursor_info",
    "encode_managed_ledger_info",
    "encode_schema_locator",
    "offload_uuid",
    "pb",
]


# Per message type: its string fields and its message fields that lead to one, as (name, repeated).
_Plan = tuple[tuple[tuple[str, bool], ...], tuple[tuple[str, bool], ...]]
_TEXT_PLANS: dict[str, _Plan] = {}


def _reaches_text(desc: Descriptor, seen: set[str]) -> bool:
    seen.add(desc.full_name)
    for f in desc.fields:
        if f.type == FieldDescriptor.TYPE_STRING:
            return True
        if (
            f.type == FieldDescriptor.TYPE_MESSAGE
            and f.message_type.full_name not in seen
            and _reaches_text(f.message_type, seen)
        ):
            return True
    return False


def _text_plan(desc: Descriptor) -> _Plan:
    plan = _TEXT_PLANS.get(desc.full_name)
    if plan is None:
        strings = tuple((f.name, f.is_repeated) for f in desc.fields if f.type == FieldDescriptor.TYPE_STRING)
        nested = tuple(
            (f.name, f.is_repeated)
            for f in desc.fields
            if f.type == FieldDescriptor.TYPE_MESSAGE and _reaches_text(f.message_type, set())
        )
        plan = _TEXT_PLANS[desc.full_name] = (strings, nested)
    return plan


def _repair_text(message: Message) -> None:
    """Give invalid UTF-8 in string fields Java's replacement characters, in place.

    upb returns such a proto2 string as bytes; Pulsar's Java parser decodes it with U+FFFD and
    carries on, so we do the same rather than let a stray byte in a property hide the ledgers.
    """
    strings, nested = _text_plan(message.DESCRIPTOR)
    for name, repeated in strings:
        if repeated:
            values = getattr(message, name)
            for i, value in enumerate(values):
                if isinstance(value, bytes):
                    values[i] = value.decode("utf-8", "replace")
        else:
            value = getattr(message, name)
            if isinstance(value, bytes):
                setattr(message, name, value.decode("utf-8", "replace"))
    for name, repeated in nested:
        if repeated:
            items = getattr(message, name)
            if not items:
                continue
            item_strings, item_nested = _text_plan(items[0].DESCRIPTOR)
            for item in items:
                # Items whose text is only in nested messages (a ledger list's offload contexts and properties):
                # most have none, and a scan meets hundreds of thousands of them.
                if item_strings or any(len(getattr(item, n)) if r else item.HasField(n) for n, r in item_nested):
                    _repair_text(item)
        elif message.HasField(name):
            _repair_text(getattr(message, name))


def _parse(message: Message, payload: bytes, what: str) -> None:
    try:
        message.ParseFromString(payload)
    except DecodeError as exc:
        raise MetadataDecodeError(f"{what} is not valid protobuf: {exc}", kind="invalid_protobuf") from exc
    if not message.IsInitialized():
        missing = ", ".join(message.FindInitializationErrors())
        raise MetadataDecodeError(f"{what} lacks required fields: {missing}", kind="invalid_protobuf")
    _repair_text(message)


def decode_managed_ledger_info(data: bytes) -> pb.ManagedLedgerInfo:
    info = pb.ManagedLedgerInfo()
    if data:
        _parse(info, unwrap(data), "managed-ledger info")
    return info


def decode_managed_cursor_info(data: bytes) -> pb.ManagedCursorInfo:
    info = pb.ManagedCursorInfo()
    if not data:
        raise MetadataDecodeError("cursor znode is empty", kind="truncated")
    _parse(info, unwrap(data), "cursor info")
    return info


def decode_schema_locator(data: bytes) -> pb.SchemaLocator:
    locator = pb.SchemaLocator()
    if not data:
        raise MetadataDecodeError("schema locator znode is empty", kind="truncated")
    _parse(locator, data, "schema locator")
    return locator


def _encode(message: Message, compression: str) -> bytes:
    payload = message.SerializeToString()
    # Pulsar writes bare protobuf when compression is off; so do we.
    return payload if compression == "NONE" else wrap(payload, compression)


def encode_managed_ledger_info(info: pb.ManagedLedgerInfo, compression: str = "NONE") -> bytes:
    return _encode(info, compression)


def encode_managed_cursor_info(info: pb.ManagedCursorInfo, compression: str = "NONE") -> bytes:
    return _encode(info, compression)


def encode_schema_locator(locator: pb.SchemaLocator) -> bytes:
    return locator.SerializeToString()


def offload_uuid(msb: int, lsb: int) -> str:
    """`new java.util.UUID(msb, lsb).toString()` for the signed longs Pulsar stores."""
    return str(uuid.UUID(int=((msb & 0xFFFFFFFFFFFFFFFF) << 64) | (lsb & 0xFFFFFFFFFFFFFFFF)))
