"""BookKeeper ledger-metadata znodes: formats v1, v2 and v3, decoded and encoded.

Every znode starts with `BookieMetadataFormatVersion\\t<n>\\n`. Then:
- v3 (default since BookKeeper 4.9): a varint32 length, then binary `LedgerMetadataFormat`;
- v2: the same message in protobuf text format;
- v1: lines `quorum`, `ensemble`, `length`, one line per segment (`firstEntryId\\tbookie...`),
  and, once closed, `lastEntryId\\tCLOSED` (`-102\\tCLOSED` meaning in recovery).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import text_format
from google.protobuf.message import DecodeError

from sweeper._proto import bookkeeper_metadata_pb2 as pb
from sweeper.codecs.errors import MetadataDecodeError

HEADER_PREFIX = b"BookieMetadataFormatVersion\t"
_V3_HEADER = HEADER_PREFIX + b"3\n"  # nearly every znode since BookKeeper 4.9: one compare, no parsing
SUPPORTED_VERSIONS = (1, 2, 3)
V1_IN_RECOVERY = -102
V1_CLOSED = "CLOSED"
INVALID_ENTRY_ID = -1
COMPACTED_TO = "pulsar/compactedTo"  # the one Pulsar value that is binary, not text

STATE_NAMES = {v: k for k, v in pb.LedgerMetadataFormat.State.items()}
DIGEST_NAMES = {v: k for k, v in pb.LedgerMetadataFormat.DigestType.items()}


@dataclass(frozen=True, slots=True)
class Segment:
    first_entry_id: int
    ensemble: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    format_version: int
    ensemble_size: int
    write_quorum_size: int
    ack_quorum_size: int  # the write quorum when absent, as BookKeeper reads it
    state: str  # OPEN | IN_RECOVERY | CLOSED
    last_entry_id: int
    length: int
    segments: tuple[Segment, ...]
    digest_type: str | None
    password: bytes | None
    ctime: int | None  # ms since the epoch; None when absent
    ctoken: int | None
    custom_metadata: dict[str, bytes] = field(default_factory=dict)


def _split_header(data: bytes) -> tuple[int, bytes]:
    if not data.startswith(HEADER_PREFIX):
        raise MetadataDecodeError(f"not BookKeeper ledger metadata: starts with {data[:32]!r}", kind="bad_header")
    end = data.find(b"\n", len(HEADER_PREFIX))
    if end < 0:
        raise MetadataDecodeError("format-version header has no end of line", kind="truncated")
    raw_version = data[len(HEADER_PREFIX) : end]
    if not raw_version.isdigit():
        raise MetadataDecodeError(f"format version is not a number: {raw_version[:16]!r}", kind="bad_header")
    version = int(raw_version)
    if version not in SUPPORTED_VERSIONS:
        raise MetadataDecodeError(
            f"unknown ledger metadata format version {version} (known: 1, 2, 3)", kind="unknown_format_version"
        )
    return version, data[end + 1 :]


def as_text(value: str | bytes) -> str:
    # upb hands back a proto2 string field holding invalid UTF-8 as bytes; Java decodes it with
    # replacement characters, and so do we, so that every field has one type.
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def all_text(values: Iterable[str | bytes]) -> bool:
    """Whether every value is a str: the cheap way to find a bytes one (upb's invalid UTF-8) among the strings."""
    try:
        "".join(values)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def custom_metadata_of(msg: pb.LedgerMetadataFormat) -> dict[str, bytes]:
    """The message's custom metadata, keys as text (decoded as Java does where upb hands back bytes); a repeated
    key keeps its last value, as the HashMap of BookKeeper's LedgerMetadataSerDe.decodeFormat does."""
    custom = {e.key: e.value for e in msg.customMetadata}
    return custom if all_text(custom) else {as_text(e.key): e.value for e in msg.customMetadata}


def _from_message(msg: pb.LedgerMetadataFormat, version: int) -> LedgerMetadata:
    segments = []
    for s in msg.segment:
        ensemble = tuple(s.ensembleMember)
        if not all_text(ensemble):
            ensemble = tuple(map(as_text, ensemble))
        segments.append(Segment(s.firstEntryId, ensemble))
    custom = custom_metadata_of(msg)
    return LedgerMetadata(
        format_version=version,
        ensemble_size=msg.ensembleSize,
        write_quorum_size=msg.quorumSize,
        ack_quorum_size=msg.ackQuorumSize if msg.HasField("ackQuorumSize") else msg.quorumSize,
        state=STATE_NAMES[msg.state],
        last_entry_id=msg.lastEntryId if msg.HasField("lastEntryId") else INVALID_ENTRY_ID,
        length=msg.length,
        segments=tuple(segments),
        digest_type=DIGEST_NAMES[msg.digestType] if msg.HasField("digestType") else None,
        password=msg.password if msg.HasField("password") else None,
        ctime=msg.ctime if msg.HasField("ctime") else None,
        ctoken=msg.cToken if msg.HasField("cToken") else None,
        custom_metadata=custom,
    )


def _read_varint32(data: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the varint32 length prefix, as BookKeeper's readRawVarint32 reads it."""
    result = shift = 0
    while shift < 35:
        if pos >= len(data):
            raise MetadataDecodeError("v3 metadata ends inside its length prefix", kind="truncated")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise MetadataDecodeError("v3 metadata length prefix is not a valid varint32", kind="invalid_protobuf")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _decode_v3(data: bytes, pos: int) -> pb.LedgerMetadataFormat:
    size, pos = _read_varint32(data, pos)
    if pos + size > len(data):
        raise MetadataDecodeError(
            f"v3 metadata truncated: length prefix says {size} bytes, {len(data) - pos} present", kind="truncated"
        )
    msg = pb.LedgerMetadataFormat()
    try:
        # Bytes after the delimited message are ignored, as BookKeeper's readDelimited does.
        msg.ParseFromString(data[pos : pos + size])
    except DecodeError as exc:
        raise MetadataDecodeError(f"v3 metadata is not valid protobuf: {exc}", kind="invalid_protobuf") from exc
    if not msg.IsInitialized():
        missing = ", ".join(msg.FindInitializationErrors())
        raise MetadataDecodeError(f"v3 metadata lacks required fields: {missing}", kind="invalid_protobuf")
    return msg


# The plain v2 text BookKeeper writes (Java's TextFormat.printToString): one `name: value` or `name {` or `}`
# per line. protobuf's text parser is pure Python and costs ~1 ms a ledger, ~30% of a scan's decode time for
# 5% of the ledgers; `_fast_v2` reads this shape ~20x faster and hands anything else to text_format.
_V2_LINE = re.compile(r'\s*(?:(\w+): (?:(-?(?:0|[1-9][0-9]*))|([A-Za-z_]\w*)|"([^"\\]*)")|(\w+) \{|(\}))\s*')
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
# Field -> (kind, range or enum names, repeated) per message; kinds: int, enum, str, bytes, msg.
_V2_FIELDS: dict[str, dict[str, tuple[str, Any, bool]]] = {
    "": {
        "quorumSize": ("int", _INT32, False), "ensembleSize": ("int", _INT32, False),
        "length": ("int", _INT64, False), "lastEntryId": ("int", _INT64, False),
        "state": ("enum", frozenset(pb.LedgerMetadataFormat.State.keys()), False),
        "segment": ("msg", None, True),
        "digestType": ("enum", frozenset(pb.LedgerMetadataFormat.DigestType.keys()), False),
        "password": ("bytes", None, False), "ackQuorumSize": ("int", _INT32, False),
        "ctime": ("int", _INT64, False), "customMetadata": ("msg", None, True), "cToken": ("int", _INT64, False),
    },
    "segment": {"ensembleMember": ("str", None, True), "firstEntryId": ("int", _INT64, False)},
    "customMetadata": {"key": ("str", None, False), "value": ("bytes", None, False)},
}


def _fast_v2(text: str) -> pb.LedgerMetadataFormat | None:
    """The message of plain v2 text, exactly as text_format would build it; None for anything else (comments,
    escapes, non-ASCII, other spellings, duplicate or unknown fields, bad values, missing required fields),
    which text_format then parses or reports as before."""
    if not text.isascii():
        return None
    top: dict[str, Any] = {}
    current, block = top, ""  # the message being filled and its field name ("" for the top level)
    children: dict[str, list[dict[str, Any]]] = {"segment": [], "customMetadata": []}
    fields = _V2_FIELDS[""]
    match = _V2_LINE.fullmatch
    for line in text.split("\n"):
        if not line or line.isspace():
            continue
        m = match(line)
        if m is None:
            return None
        name, number, ident, string, opened, closed = m.groups()
        if closed is not None:
            if not block:
                return None
            current, block, fields = top, "", _V2_FIELDS[""]
            continue
        if opened is not None:
            if block or opened not in children:
                return None
            current, block, fields = {}, opened, _V2_FIELDS[opened]
            children[opened].append(current)
            continue
        spec = fields.get(name)
        if spec is None:
            return None
        kind, limits, repeated = spec
        if kind == "int":
            if number is None:
                return None
            value: Any = int(number)
            if not limits[0] <= value <= limits[1]:
                return None
        elif kind == "enum":
            if ident is None or ident not in limits:
                return None
            value = ident
        elif kind == "msg" or string is None:
            return None
        else:
            value = string if kind == "str" else string.encode("ascii")
        if repeated:
            current.setdefault(name, []).append(value)
        elif name in current:
            return None  # text_format refuses a second value of a singular field
        else:
            current[name] = value
    if block or not {"quorumSize", "ensembleSize", "length", "state"} <= top.keys():
        return None
    if any("firstEntryId" not in s for s in children["segment"]):
        return None
    msg = pb.LedgerMetadataFormat(**top)
    for segment in children["segment"]:
        msg.segment.add(**segment)
    for entry in children["customMetadata"]:
        msg.customMetadata.add(**entry)
    return msg


def _decode_v2(body: bytes) -> pb.LedgerMetadataFormat:
    try:
        fast = _fast_v2(body.decode("ascii"))
    except UnicodeDecodeError:
        fast = None
    if fast is not None:
        return fast
    msg = pb.LedgerMetadataFormat()
    try:
        text_format.Parse(body.decode("utf-8"), msg)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise MetadataDecodeError(f"v2 metadata is not valid protobuf text: {exc}", kind="invalid_text") from exc
    return msg


def _decode_v1(body: bytes) -> LedgerMetadata:
    try:
        lines = body.decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        raise MetadataDecodeError("v1 metadata is not text", kind="invalid_text") from exc
    if len(lines) < 3:
        raise MetadataDecodeError(f"v1 metadata has {len(lines)} lines, needs at least 3", kind="truncated")
    try:
        quorum, ensemble, length = int(lines[0]), int(lines[1]), int(lines[2])
        segments: list[Segment] = []
        state, last_entry_id = "OPEN", INVALID_ENTRY_ID
        for line in lines[3:]:
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) >= 2 and parts[1] == V1_CLOSED:
                marker = int(parts[0])
                if marker == V1_IN_RECOVERY:
                    state = "IN_RECOVERY"
                else:
                    state, last_entry_id = "CLOSED", marker
                break  # BookKeeper stops reading at the state line
            else:
                segments.append(Segment(int(parts[0]), tuple(parts[1:])))
    except ValueError as exc:
        raise MetadataDecodeError(f"v1 metadata not understood: {exc}", kind="invalid_text") from exc
    return LedgerMetadata(
        format_version=1,
        ensemble_size=ensemble,
        write_quorum_size=quorum,
        ack_quorum_size=quorum,
        state=state,
        last_entry_id=last_entry_id,
        length=length,
        segments=tuple(segments),
        digest_type=None,
        password=None,
        ctime=None,
        ctoken=None,
        custom_metadata={},
    )


def decode_ledger_message(data: bytes) -> tuple[pb.LedgerMetadataFormat, int] | None:
    """The protobuf message of a v3 or v2 ledger znode and its format version; None for v1, which is not protobuf
    (decode_ledger_metadata reads it). Raises MetadataDecodeError as decode_ledger_metadata does.

    The scan builds its rows from the message itself (sweeper.scan.bookkeeper.ledger_values): going through
    LedgerMetadata first was a third of a scan task's decoding time."""
    if data.startswith(_V3_HEADER):
        return _decode_v3(data, len(_V3_HEADER)), 3
    version, body = _split_header(data)
    if version == 3:  # a header spelled unusually, e.g. "03"
        return _decode_v3(body, 0), 3
    if version == 2:
        msg = _decode_v2(body)
        if not msg.IsInitialized():
            missing = ", ".join(msg.FindInitializationErrors())
            raise MetadataDecodeError(f"v2 metadata lacks required fields: {missing}", kind="invalid_text")
        return msg, 2
    return None


def decode_ledger_metadata(data: bytes) -> LedgerMetadata:
    """Decode a ledger znode's data (any of the three formats); raises MetadataDecodeError."""
    decoded = decode_ledger_message(data)
    if decoded is None:
        return _decode_v1(_split_header(data)[1])
    return _from_message(*decoded)


def ledger_message(md: LedgerMetadata) -> pb.LedgerMetadataFormat:
    """`md` as BookKeeper's protobuf message (what v2 and v3 store; a v1 ledger's fields map onto it)."""
    msg = pb.LedgerMetadataFormat(
        quorumSize=md.write_quorum_size,
        ensembleSize=md.ensemble_size,
        length=md.length,
        lastEntryId=md.last_entry_id,
        state=pb.LedgerMetadataFormat.State.Value(md.state),
        ackQuorumSize=md.ack_quorum_size,
    )
    for segment in md.segments:
        msg.segment.add(ensembleMember=list(segment.ensemble), firstEntryId=segment.first_entry_id)
    if md.digest_type is not None:
        msg.digestType = pb.LedgerMetadataFormat.DigestType.Value(md.digest_type)
    if md.password is not None:
        msg.password = md.password
    if md.ctime is not None:
        msg.ctime = md.ctime
    if md.ctoken is not None:
        msg.cToken = md.ctoken
    for key, value in md.custom_metadata.items():
        msg.customMetadata.add(key=key, value=value)
    return msg


def _encode_v1(md: LedgerMetadata) -> bytes:
    lines = [str(md.write_quorum_size), str(md.ensemble_size), str(md.length)]
    lines += ["\t".join([str(s.first_entry_id), *s.ensemble]) for s in md.segments]
    if md.state == "IN_RECOVERY":
        lines.append(f"{V1_IN_RECOVERY}\t{V1_CLOSED}")
    elif md.state == "CLOSED":
        lines.append(f"{md.last_entry_id}\t{V1_CLOSED}")
    return "\n".join(lines).encode()


def encode_ledger_metadata(md: LedgerMetadata, format_version: int = 3) -> bytes:
    """Serialize as BookKeeper would in `format_version`; v1 drops what v1 cannot hold, v2 drops cToken."""
    header = HEADER_PREFIX + str(format_version).encode() + b"\n"
    if format_version == 3:
        payload = ledger_message(md).SerializeToString()
        return header + _varint(len(payload)) + payload
    if format_version == 2:
        msg = ledger_message(md)
        msg.ClearField("cToken")  # as BookKeeper: v2 is frozen, older text parsers reject fields they lack
        return header + text_format.MessageToString(msg).encode()
    if format_version == 1:
        return header + _encode_v1(md)
    raise ValueError(f"cannot encode ledger metadata format version {format_version}")


def pulsar_custom_metadata(md: LedgerMetadata) -> dict[str, str]:
    """Custom metadata as text, without the binary `pulsar/compactedTo`; refuses non-UTF-8 values."""
    out: dict[str, str] = {}
    for key, value in md.custom_metadata.items():
        if key == COMPACTED_TO:
            continue
        try:
            out[key] = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MetadataDecodeError(f"custom metadata {key!r} is not UTF-8", kind="invalid_utf8") from exc
    return out
