"""ZooKeeper's wire records as the wire reader (sweeper.zk.wire) speaks them: opcodes, special xids, error codes,
the records' layouts, and the few records built or decoded outside the reader's receive buffer.

Wire format (zookeeper.jute; kazoo/protocol/serialization.py agrees): every frame is an int32
length followed by the record. Requests are RequestHeader(xid int, type int) + body; replies are
ReplyHeader(xid int, zxid long, err int) + body, the body only present when err == 0. All
integers are big-endian; strings and buffers are int32 length (-1 = null) + bytes.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from kazoo.exceptions import EXCEPTIONS
from kazoo.protocol.states import ZnodeStat

# Opcodes (ZooDefs.OpCode) and the special xids (ClientCnxn).
_OP_GET_DATA = 4
_OP_GET_CHILDREN = 8
_OP_GET_ACL = 6
_OP_PING = 11
_OP_CLOSE = -11
_OP_MULTI_READ = 22
_OP_AUTH = 100
_OP_SASL = 102
_OP_WHO_AM_I = 107
_OP_ERROR = -1  # the op type of an ErrorResult inside a MultiResponse
_PING_XID = -2
_AUTH_XID = -4
_MAX_XID = 2**31 - 1

_UNIMPLEMENTED = -6
_NO_NODE = -101
_NO_AUTH = -102
_AUTH_FAILED = -115
_SESSION_CLOSED_REQUIRE_SASL_AUTH = -124

_INT = struct.Struct("!i")
_REPLY_HEADER = struct.Struct("!iqi")  # xid, zxid, err
# Stat: czxid, mzxid, ctime, mtime, version, cversion, aversion, ephemeralOwner, dataLength,
# numChildren, pzxid - the field order of kazoo's ZnodeStat.
_STAT = struct.Struct("!qqqqiiiqiiq")
# A read request up to the path bytes: frame length, xid, opcode, path length.
_READ_REQUEST_HEAD = struct.Struct("!iiii")
# ConnectRequest: protocolVersion int, lastZxidSeen long, timeOut int, sessionId long, then
# passwd buffer (16 zero bytes for a new session) and readOnly bool.
_CONNECT_REQUEST = struct.Struct("!iqiqi16s?")
# ConnectResponse up to its passwd buffer: protocolVersion int, timeOut int, sessionId long.
_CONNECT_RESPONSE_HEAD = struct.Struct("!iiq")
# One op of a multiRead: MultiHeader(type int, done bool, err int) + path length (path, watch follow).
_MULTI_OP = struct.Struct("!iBii")
_MULTI_HEADER = struct.Struct("!iBi")
_MULTI_END = _MULTI_HEADER.pack(-1, True, -1)
_PING_FRAME = struct.pack("!iii", 8, _PING_XID, _OP_PING)
_FALSE = b"\x00"

# ZnodeStat from an unpacked tuple without ZnodeStat(*fields)'s re-packing: it is on the hot path.
_new_stat = functools.partial(tuple.__new__, ZnodeStat)

T = TypeVar("T")
# Parses one result at a body offset in the receive buffer: (result, offset after it).
Parser = Callable[[str, int, int], tuple[T, int]]


class AclRead(NamedTuple):
    path: str
    acl: list[tuple[int, str, str]] | None  # (perms, scheme, id) entries; None: no such znode
    error: BaseException | None = None


def _decode_acl(raw: bytes) -> tuple[tuple[int, str, str], ...]:
    """A getACL reply's vector<ACL>: int count, then per entry int perms and the Id's two ustrings."""
    unpack = _INT.unpack_from
    (count,) = unpack(raw, 0)
    offset = 4
    entries = []
    for _ in range(max(count, 0)):
        (perms,) = unpack(raw, offset)
        offset += 4
        fields = []
        for _ in range(2):  # Id: ustring scheme, ustring id
            (length,) = unpack(raw, offset)
            offset += 4
            fields.append(str(raw[offset : offset + max(length, 0)], "utf-8"))
            offset += max(length, 0)
        entries.append((perms, fields[0], fields[1]))
    return tuple(entries)


def _multi_read_frame(xid: int, opcode: int, raw_paths: list[bytes]) -> bytes:
    """A multiRead request: MultiHeader + read request per op, then the done marker."""
    pack = _MULTI_OP.pack
    ops = b"".join(b"".join((pack(opcode, False, -1, len(raw)), raw, _FALSE)) for raw in raw_paths)
    body = ops + _MULTI_END
    return struct.pack("!iii", 8 + len(body), xid, _OP_MULTI_READ) + body


def _buffer(data: bytes) -> bytes:
    return _INT.pack(len(data)) + data


def _code_name(code: int) -> str:
    return f"{EXCEPTIONS[code].__name__} (code {code})" if code in EXCEPTIONS else f"code {code}"
