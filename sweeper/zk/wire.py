"""A small read-only ZooKeeper client that pipelines reads over one socket, speaking jute directly.

Why not kazoo: a pipelined kazoo scan spends most of its time in per-request Python machinery
(an AsyncResult, a lock, a queue hand-off to its I/O thread and back). Here a request is a few
bytes appended to a batch and a reply is parsed in place from a receive buffer, so the scan is
bounded by the server rather than by the client.

Scope is deliberately narrow: getData and getChildren (and whoAmI), no watches. A connection lost in the middle
of an iteration (a leader election: every member drops its clients while the ensemble has no quorum; a member
killed or silent for a session timeout) is reconnected, as ZooKeeper's own clients do, and the reads whose answers
never came are sent again (reads are idempotent): to another member first, resuming the session (a fresh one when it
expired), for up to `timeout` seconds from the loss. The handshake says the last zxid this reader saw, so no member
that is behind it serves the rest (ZooKeeper refuses such a client; ClientCnxn sends the same), and a scan never
reads older metadata after a reconnect than before it. A connection that cannot be restored in that time ends the
iteration with `ZooKeeperUnavailableError`; the caller retries the whole task, as it would with kazoo. Members are
tried in a shuffled order (as kazoo and ZooKeeper's StaticHostProvider do), so a scan's sessions spread over the
ensemble rather than all landing on the first member named.

Secured ensembles (`security`, a `sweeper.zk.security.ZkSecurity`): the socket is wrapped in TLS
before the ZooKeeper handshake; after it, a SASL exchange (op 102; each token a GetSASLRequest /
SetSASLResponse buffer, on ordinary positive xids as ClientCnxn.sendPacket assigns them; the
server answers a failed login with AUTHFAILED and hangs up, ZooKeeperServer.processSasl) and digest
credentials as an AuthPacket (op 100, xid -4, ClientCnxn.AUTHPACKET_XID). A refused handshake or
login is a `ZooKeeperSecurityError`; a read refused for lack of READ permission reports a
`ZooKeeperPermissionError` naming the znode.

`limiter` (a `sweeper.ratelimit.TokenBucket`) paces the reads sent, in small batches, so a rate
limit never turns into bursts of a whole window.

Even pipelined, one read per request leaves the server as the bottleneck: ZooKeeper's NIO server
hands each request through several threads. With `multi_read=N` (ZooKeeper >= 3.6) reads travel
N to a multiRead request instead; results and per-read errors are the same, at many times the rate.


Wire format: sweeper.zk.jute (the records), sweeper.zk.handshake (a connection's handshake, TLS and login).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import socket
import ssl
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from kazoo.hosts import collect_hosts
from kazoo.protocol.paths import normpath

from sweeper.records import ChildrenRead, ZnodeRead
from sweeper.zk.errors import (
    ZooKeeperPermissionError,
    ZooKeeperSecurityError,
    ZooKeeperUnavailableError,
    ZooKeeperWireError,
)
from sweeper.zk.handshake import _handshake
from sweeper.zk.jute import (
    _FALSE,
    _INT,
    _MAX_XID,
    _MULTI_HEADER,
    _NO_AUTH,
    _NO_NODE,
    _OP_CLOSE,
    _OP_ERROR,
    _OP_GET_ACL,
    _OP_GET_CHILDREN,
    _OP_GET_DATA,
    _OP_WHO_AM_I,
    _PING_FRAME,
    _READ_REQUEST_HEAD,
    _REPLY_HEADER,
    _STAT,
    _UNIMPLEMENTED,
    AclRead,
    Parser,
    T,
    _decode_acl,
    _multi_read_frame,
    _new_stat,
)

if TYPE_CHECKING:
    from sweeper.ratelimit import TokenBucket
    from sweeper.zk.security import ZkSecurity

__all__ = ["WireReader"]  # its errors: sweeper.zk.errors

DEFAULT_WINDOW = 2000

# Reconnects a reader may make in its life: a connection that keeps breaking is an outage to report, not to ride.
_MAX_RECONNECTS = 10

_RECV_BUFFER = 1 << 20
# Every reply is at least its length prefix and ReplyHeader, so for n replies owed at least
# n * _MIN_REPLY bytes are still to come: a safe receive low-water mark (capped).
_MIN_REPLY = 4 + _REPLY_HEADER.size
_MAX_LOWAT = 256 << 10
# Compact the receive buffer when fewer free bytes than this remain at its tail, so each
# recv_into gets a large window rather than dribbling in small reads.
_MIN_RECV = 64 << 10


_ACLS_REMEMBERED = 4096  # distinct ACL vectors a reader keeps decoded


class WireReader:
    """Pipelined getData/getChildren on one ZooKeeper session; a context manager.

    `hosts` is a kazoo-style connect string, `h1:p1,h2:p2/chroot`: the first host (in a shuffled order) that
    completes the handshake wins, and paths are read relative to the chroot. A connection lost during an
    iteration is restored within `timeout` (see the module's doc); `reconnects` counts them. One `get_many` or
    `children_many` iteration at a time: starting a new one abandons (and drains) the previous.

    `multi_read`: reads per request. Above 1 they go as multiRead requests, which needs
    ZooKeeper >= 3.6; each reply then holds that many results, so keep it modest where znodes or
    listings are large.
    """

    def __init__(self, hosts: str, timeout: float = 15.0, multi_read: int = 1, security: ZkSecurity | None = None,
                 limiter: TokenBucket | None = None) -> None:
        if multi_read < 1:
            raise ValueError(f"multi_read must be >= 1, got {multi_read}")
        self.hosts = hosts
        self.multi_read = multi_read
        self.limiter = limiter
        addresses, chroot = collect_hosts(hosts)
        random.shuffle(addresses)
        self._chroot = normpath(chroot).rstrip("/") if chroot else ""
        self._addresses = addresses
        self._timeout = timeout
        self._security = security
        self._last_zxid = 0  # the newest zxid a reply carried: a member behind it must not serve us after a reconnect
        self._lost = False  # the failure below is a lost connection (a reconnect may mend it), not a protocol error
        self.reconnects = 0
        (self._sock, self.session_timeout, self.session_id, self._passwd, self._xid,
         self._connected) = _handshake(hosts, addresses, timeout, security)
        tls = isinstance(self._sock, ssl.SSLSocket)
        # Receive state: buffered bytes are self._buf[self._head:self._tail].
        self._buf = bytearray(_RECV_BUFFER)
        self._view = memoryview(self._buf)
        self._head = 0
        self._tail = 0
        self._outstanding = 0  # requests sent whose replies are not read yet
        # Current SO_RCVLOWAT (0: unused). Not under TLS: the mark counts ciphertext on the socket while
        # decrypted bytes may already wait inside the TLS layer, so a wait for them could stall.
        self._lowat = 1 if hasattr(socket, "SO_RCVLOWAT") and not tls else 0
        self._iteration = 0  # bumped per get_many/children_many so a superseded one fails loudly
        self._acls_seen: dict[bytes, tuple[tuple[int, str, str], ...]] = {}  # an ACL vector's bytes -> its entries
        self._failure: ZooKeeperUnavailableError | None = None  # why the connection is unusable
        self._released = False  # close() has run
        # Keepalive: the server expires a session that sends nothing for its timeout, and a slow
        # consumer of our iterators sends nothing. A third of the timeout, as ZooKeeper's clients do.
        self._send_lock = threading.Lock()
        # One TLS connection must not be read and written by two threads at once (OpenSSL's SSL
        # objects are not thread-safe): under TLS the pinger's sends also wait for a receive to end.
        self._recv_lock: threading.Lock | contextlib.nullcontext[None] = (
            self._send_lock if tls else contextlib.nullcontext())
        self._last_send = time.monotonic()
        self._ping_interval = self.session_timeout / 3.0
        self._stop = threading.Event()
        # The thread holds only a weak reference, so a reader dropped without close() is not kept
        # alive (and its session pinged) forever.
        self._pinger = threading.Thread(
            target=_keepalive, args=(weakref.ref(self), self._stop), name="zkwire-ping", daemon=True
        )
        self._pinger.start()

    def __enter__(self) -> WireReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # Reads -----------------------------------------------------------------------------------

    def get_many(
        self, paths: Iterable[str], window: int = DEFAULT_WINDOW, multi_read: int | None = None
    ) -> Iterator[ZnodeRead]:
        """Data and stat of each path, in input order, with up to `window` requests in flight.

        `multi_read` overrides the reader's reads-per-request for this call.
        """
        self._check_usable(window)
        return self._pipeline(paths, window, _OP_GET_DATA, self._get_data_reply, multi_read or self.multi_read)

    def children_many(
        self, paths: Iterable[str], window: int = DEFAULT_WINDOW, multi_read: int | None = None
    ) -> Iterator[ChildrenRead]:
        """Sorted child names of each path, in input order, with up to `window` requests in flight."""
        self._check_usable(window)
        return self._pipeline(paths, window, _OP_GET_CHILDREN, self._children_reply, multi_read or self.multi_read)

    def acls_many(self, paths: Iterable[str], window: int = DEFAULT_WINDOW) -> Iterator[AclRead]:
        """Each path's ACL as (perms, scheme, id) entries, in input order, one request each (multiRead
        carries no getACL). Needs READ or ADMIN on the znode; without ADMIN digest ids read `user:x`."""
        self._check_usable(window)
        return self._pipeline(paths, window, _OP_GET_ACL, self._acl_reply, 1)

    def _acl_reply(self, path: str, err: int, offset: int) -> tuple[AclRead, int]:
        if err:
            return AclRead(path, None, None if err == _NO_NODE else _read_error(err, path)), offset
        # Most znodes of a cluster carry one of a few ACLs: find the vector's end by its lengths alone and decode
        # each distinct vector once (a delete's permission check reads tens of thousands).
        buf, unpack = self._buf, _INT.unpack_from
        start = offset
        (count,) = unpack(buf, offset)
        offset += 4
        for _ in range(max(count, 0)):
            offset += 4  # perms
            for _ in range(2):  # Id: ustring scheme, ustring id
                (length,) = unpack(buf, offset)
                offset += 4 + max(length, 0)
        raw = bytes(self._view[start:offset])
        entries = self._acls_seen.get(raw)
        if entries is None:
            entries = _decode_acl(raw)
            if len(self._acls_seen) < _ACLS_REMEMBERED:
                self._acls_seen[raw] = entries
        return AclRead(path, list(entries)), offset + _STAT.size

    def who_am_i(self) -> list[tuple[str, str]]:
        """This session's identities as the server sees them, (scheme, user) pairs (ZooKeeper >= 3.7).

        `digest` ids come back as the user name only (AuthUtil.getClientInfos); `super` with an
        empty user. Raises ZooKeeperWireError where the server does not know the request.
        """
        self._check_usable(1)
        while self._outstanding:  # an abandoned iteration's replies come first
            self._read_reply()
        self._iteration += 1  # any open iterator would now read our reply: it must fail instead
        self._xid = self._xid + 1 if self._xid < _MAX_XID else 1
        self._send(struct.pack("!iii", 8, self._xid, _OP_WHO_AM_I))
        self._outstanding += 1
        xid, err, offset, _ = self._read_reply()
        if xid != self._xid:
            raise self._fail(f"replied out of order (xid {xid}, expected {self._xid})")
        if err:
            raise ZooKeeperWireError(err, "whoAmI")
        buf = self._buf
        (count,) = _INT.unpack_from(buf, offset)
        offset += 4
        identities = []
        for _ in range(max(count, 0)):
            fields = []
            for _ in range(2):  # ClientInfo: ustring authScheme, ustring user
                (length,) = _INT.unpack_from(buf, offset)
                offset += 4
                fields.append(str(self._view[offset : offset + max(length, 0)], "utf-8"))
                offset += max(length, 0)
            identities.append((fields[0], fields[1]))
        return identities

    def _check_usable(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        # Lost while idle (the pinger's send found the connection gone): restored before the next reads.
        if self._failure is not None and not self._recover(self._failure):
            raise self._failure

    def _get_data_reply(self, path: str, err: int, offset: int) -> tuple[ZnodeRead, int]:
        if err:
            return ZnodeRead(path, None, None, None if err == _NO_NODE else _read_error(err, path)), offset
        buf = self._buf
        (length,) = _INT.unpack_from(buf, offset)
        offset += 4
        if length < 0:  # created with null data
            data = None
        else:
            data = bytes(self._view[offset : offset + length])
            offset += length
        return ZnodeRead(path, data, _new_stat(_STAT.unpack_from(buf, offset))), offset + _STAT.size

    def _children_reply(self, path: str, err: int, offset: int) -> tuple[ChildrenRead, int]:
        if err:
            return ChildrenRead(path, None, None if err == _NO_NODE else _read_error(err, path)), offset
        buf, view, unpack = self._buf, self._view, _INT.unpack_from
        (count,) = unpack(buf, offset)
        offset += 4
        children = []
        for _ in range(count):  # a null vector (-1) reads as no children
            (length,) = unpack(buf, offset)
            offset += 4
            children.append(str(view[offset : offset + length], "utf-8"))
            offset += length
        children.sort()
        return ChildrenRead(path, children), offset

    def _pipeline(
        self, paths: Iterable[str], window: int, opcode: int, parse: Parser[T], per_request: int
    ) -> Iterator[T]:
        # Replies still owed to an abandoned iteration come first on the wire: discard them (a reconnect drops them).
        while self._outstanding:
            try:
                self._read_reply()
            except ZooKeeperUnavailableError as exc:
                if not self._recover(exc):
                    raise
        self._iteration += 1
        iteration = self._iteration
        source = iter(paths)
        in_flight: deque[tuple[int, str | list[str]]] = deque()  # (xid, path or multiRead paths)
        pending = 0  # reads in flight
        exhausted = False
        # Refill once half the window has drained, so each sendall carries a sizeable batch.
        refill_at = window // 2
        while True:
            if self._iteration != iteration:  # checked before sending, so we never interleave with it
                raise RuntimeError("this WireReader iteration was superseded by a newer get_many/children_many")
            try:
                if not exhausted and pending <= refill_at:
                    count = window - pending
                    if self.limiter is not None:
                        # Paced sends: at most a short slice of the rate at a time, whole requests only, charged for
                        # the reads the send carries. (Charging the slice's room made every short listing, a few
                        # reads, wait out a whole slice: a small cluster's scan slept most of its time.)
                        count = min(count, max(per_request, self.limiter.slice(per_request)))
                        batch = list(itertools.islice(source, count))
                        if batch:
                            self.limiter.acquire(len(batch))
                        # Exhausted once a batch comes short, said before the send: a batch whose send failed is in
                        # `in_flight`, sent again after the reconnect.
                        exhausted = len(batch) < count
                        sent, _ = self._send_reads(iter(batch), len(batch), opcode, in_flight, per_request)
                    else:
                        sent, exhausted = self._send_reads(source, count, opcode, in_flight, per_request)
                    pending += sent
                if not in_flight:
                    return
                xid, err, offset, end = self._read_reply()
            except ZooKeeperUnavailableError as exc:
                pending = self._reconnected(exc, in_flight, opcode)
                continue
            expected, request = in_flight.popleft()
            if xid != expected:
                raise self._fail(f"replied out of order (xid {xid}, expected {expected})")
            if isinstance(request, str):
                pending -= 1
                yield parse(request, err, offset)[0]
            else:
                pending -= len(request)
                # All parsed before the first yield: a read by the next iteration may move the buffer.
                yield from self._multi_results(request, err, offset, end, opcode, parse)

    def _reconnected(self, failure: ZooKeeperUnavailableError, in_flight: deque[tuple[int, str | list[str]]],
                     opcode: int) -> int:
        """After `failure` in an iteration: the connection restored and every read still owed an answer sent again,
        in order; the reads now in flight. Raises `failure` (or the last one) when the connection cannot be restored."""
        while True:
            if not self._recover(failure):
                raise failure
            try:
                return self._resend(in_flight, opcode)
            except ZooKeeperUnavailableError as again:
                failure = again

    def _resend(self, in_flight: deque[tuple[int, str | list[str]]], opcode: int) -> int:
        """The requests of `in_flight` again, under new xids, in one write; how many reads they carry."""
        frames: list[bytes] = []
        requests: list[tuple[int, str | list[str]]] = []
        reads = 0
        xid = self._xid
        watch, extra = (b"", 12) if opcode == _OP_GET_ACL else (_FALSE, 13)
        for _, request in in_flight:
            xid = xid + 1 if xid < _MAX_XID else 1
            if isinstance(request, str):
                raw = self._raw(request)
                frames += (_READ_REQUEST_HEAD.pack(extra + len(raw), xid, opcode, len(raw)), raw, watch)
                reads += 1
            else:
                frames.append(_multi_read_frame(xid, opcode, [self._raw(path) for path in request]))
                reads += len(request)
            requests.append((xid, request))
        in_flight.clear()
        in_flight.extend(requests)
        self._xid = xid
        self._outstanding = len(requests)
        if frames:
            self._send(b"".join(frames))
        return reads

    def _raw(self, path: str) -> bytes:
        chroot = self._chroot
        return (chroot + path if path != "/" or not chroot else chroot).encode()

    def _recover(self, failure: ZooKeeperUnavailableError) -> bool:
        """A new connection after a lost one: other members first, the session resumed (a new one when it expired),
        within `timeout` of the loss. False when `failure` is no lost connection or none could be made in time."""
        if failure is not self._failure or not self._lost or self._released or self.reconnects >= _MAX_RECONNECTS:
            return False
        self._pinger.join(timeout=5.0)  # `_fail` stopped it: no ping may go out on the new socket from the old thread
        with contextlib.suppress(OSError):
            self._sock.close()
        at = self._addresses.index(self._connected) if self._connected in self._addresses else -1
        order = self._addresses[at + 1:] + self._addresses[:at + 1]  # the member we lost, last
        deadline = time.monotonic() + self._timeout
        delay = 0.05
        while True:
            left = deadline - time.monotonic()
            try:
                sock, negotiated, session_id, passwd, xid, connected = _handshake(
                    self.hosts, order, max(1.0, left), self._security, resume=(self.session_id, self._passwd),
                    last_zxid=self._last_zxid)
                break
            except ZooKeeperSecurityError:
                return False  # a login refused now is a setting, not the outage we ride out
            except ZooKeeperUnavailableError:
                if time.monotonic() + delay >= deadline:
                    return False
                time.sleep(delay)  # no member serves yet: an election takes a moment
                delay = min(2 * delay, 1.0)
        self._sock, self._connected = sock, connected
        self.session_timeout, self.session_id, self._passwd = negotiated, session_id, passwd
        self._xid = max(self._xid, xid)
        self._head = self._tail = 0
        self._outstanding = 0
        self._lowat = 1 if hasattr(socket, "SO_RCVLOWAT") and not isinstance(sock, ssl.SSLSocket) else 0
        self._failure, self._lost = None, False
        self._last_send = time.monotonic()
        self._ping_interval = negotiated / 3.0
        self._stop = threading.Event()
        self._pinger = threading.Thread(
            target=_keepalive, args=(weakref.ref(self), self._stop), name="zkwire-ping", daemon=True
        )
        self._pinger.start()
        self.reconnects += 1
        return True

    def _multi_results(
        self, paths: list[str], err: int, offset: int, end: int, opcode: int, parse: Parser[T]
    ) -> list[T]:
        """Split a MultiResponse: per op a MultiHeader, then its result or an ErrorResult(err)."""
        if err == _UNIMPLEMENTED:  # and the server hangs up: a setting to fix, not a per-read error
            raise self._fail("does not support multiRead (needs ZooKeeper >= 3.6): use multi_read=1")
        if err:  # the whole request failed: each of its reads reports it
            return [parse(path, err, offset)[0] for path in paths]
        buf = self._buf
        results = []
        for path in paths:
            if offset + _MULTI_HEADER.size > end:
                raise self._fail(f"sent a truncated multiRead reply (at {path!r})")
            op, _, _ = _MULTI_HEADER.unpack_from(buf, offset)
            offset += _MULTI_HEADER.size
            if op == _OP_ERROR:
                (code,) = _INT.unpack_from(buf, offset)
                offset += 4
                results.append(parse(path, code, offset)[0])
            elif op == opcode:
                result, offset = parse(path, 0, offset)
                results.append(result)
            else:
                raise self._fail(f"sent a malformed multiRead reply (op {op} for {path!r})")
        return results

    def _send_reads(
        self,
        source: Iterator[str],
        count: int,
        opcode: int,
        in_flight: deque[tuple[int, str | list[str]]],
        per_request: int,
    ) -> tuple[int, bool]:
        """Send up to `count` more reads in one write: (reads sent, whether `source` is exhausted)."""
        paths = list(itertools.islice(source, count))
        for path in paths:  # all checked before anything is sent
            if path[:1] != "/":  # under a chroot, "x" would silently read the sibling "/chrootx"
                raise ValueError(f"znode paths must be absolute, got {path!r}")
        raws = [self._raw(path) for path in paths]
        frames: list[bytes] = []
        requests: list[tuple[int, str | list[str]]] = []
        xid = self._xid
        if per_request == 1:
            pack = _READ_REQUEST_HEAD.pack
            watch, extra = (b"", 12) if opcode == _OP_GET_ACL else (_FALSE, 13)  # GetACLRequest has no watch flag
            for path, raw in zip(paths, raws, strict=True):
                xid = xid + 1 if xid < _MAX_XID else 1
                # frame length = xid + opcode + path length + path (+ watch flag)
                frames += (pack(extra + len(raw), xid, opcode, len(raw)), raw, watch)
                requests.append((xid, path))
        else:
            for start in range(0, len(paths), per_request):
                xid = xid + 1 if xid < _MAX_XID else 1
                frames.append(_multi_read_frame(xid, opcode, raws[start : start + per_request]))
                requests.append((xid, paths[start : start + per_request]))
        if requests:
            # In flight before the send: a send that fails leaves them there, to be sent again after a reconnect.
            self._xid = xid
            self._outstanding += len(requests)
            in_flight.extend(requests)
            self._send(b"".join(frames))
        return len(paths), len(paths) < count

    # Wire ------------------------------------------------------------------------------------

    def _send(self, frame: bytes) -> None:
        with self._send_lock:
            try:
                self._sock.sendall(frame)
            except OSError as exc:
                raise self._fail(f"lost: {exc}", lost=True) from exc
            self._last_send = time.monotonic()

    def _read_reply(self) -> tuple[int, int, int, int]:
        """(xid, err, body start, body end) in self._buf of the next reply to a request of ours."""
        while True:
            start, end = self._read_frame()
            xid, zxid, err = _REPLY_HEADER.unpack_from(self._buf, start)
            if zxid > self._last_zxid:
                self._last_zxid = zxid
            if xid < 0:  # our xids are positive: -2 is a ping reply, -1 a watch event (we set none)
                continue
            self._outstanding -= 1
            return xid, err, start + _REPLY_HEADER.size, end

    def _read_frame(self) -> tuple[int, int]:
        """Bounds (start, end) in self._buf of the next frame's payload; valid until the next read."""
        if self._tail - self._head < 4:
            self._fill(4)
        (length,) = _INT.unpack_from(self._buf, self._head)
        if self._tail - self._head < 4 + length:
            self._fill(4 + length)
        start = self._head + 4
        self._head = start + length
        return start, self._head

    def _fill(self, need: int) -> None:
        """Receive until at least `need` bytes are buffered from self._head on."""
        buffered = self._tail - self._head
        if len(self._buf) < need:  # a reply bigger than the buffer (a huge znode or listing)
            grown = bytearray(max(need, 2 * len(self._buf)))
            grown[:buffered] = self._view[self._head : self._tail]
            self._view.release()
            self._buf, self._view = grown, memoryview(grown)
            self._head, self._tail = 0, buffered
        elif len(self._buf) - self._head < need or len(self._buf) - self._tail < _MIN_RECV:
            self._buf[:buffered] = self._buf[self._head : self._tail]
            self._head, self._tail = 0, buffered
        while self._tail - self._head < need:
            if self._lowat:
                self._set_lowat(_MIN_REPLY * self._outstanding - (self._tail - self._head))
            try:
                with self._recv_lock:
                    received = self._sock.recv_into(self._view[self._tail :])
            except OSError as exc:
                raise self._fail(f"lost: {exc}", lost=True) from exc
            if not received:
                # A member that lost its leader closes every client connection; so does one expiring our session.
                raise self._fail("closed by the server (no quorum, or the session expired)", lost=True)
            self._tail += received

    def _set_lowat(self, owed: int) -> None:
        """Have recv wake us only once `owed` bytes, known to be on their way, can be returned.

        The server writes replies one by one; waking per reply costs more client CPU than parsing
        it, and on a small machine that CPU is taken from the server. Recomputed before every
        recv: a stale, larger mark could wait for bytes that never come.
        """
        lowat = max(1, min(owed, len(self._buf) - self._tail, _MAX_LOWAT))
        if lowat == self._lowat:
            return
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
            self._lowat = lowat
        except OSError:
            self._lowat = 0  # not supported here: plain wakeups are still correct

    def _fail(self, what: str, lost: bool = False) -> ZooKeeperUnavailableError:
        """Mark the connection unusable (the socket is released by close() or a reconnect); the error to raise.
        `lost`: the connection itself went (a reconnect may restore it), not a reply we cannot use."""
        if self._failure is None:
            self._failure = ZooKeeperUnavailableError(f"connection to ZooKeeper at {self.hosts!r} {what}")
            self._lost = lost
        self._stop.set()
        return self._failure

    def close(self) -> None:
        """End the session, so the server forgets it now rather than after its timeout."""
        if self._released:
            return
        self._released = True
        self._stop.set()
        self._pinger.join()  # no ping may race the close request
        healthy = self._failure is None
        self._failure = ZooKeeperUnavailableError(f"WireReader for {self.hosts!r} is closed")
        if healthy:
            try:
                self._xid = self._xid + 1 if self._xid < _MAX_XID else 1
                self._send(struct.pack("!iii", 8, self._xid, _OP_CLOSE))
                # Wait for the close reply (or EOF) so the server has the request before we hang up.
                self._sock.settimeout(min(2.0, self.session_timeout))
                while self._read_reply()[0] != self._xid:
                    pass
            except (OSError, ZooKeeperUnavailableError):
                pass
        self._sock.close()


def _keepalive(ref: weakref.ref[WireReader], stop: threading.Event) -> None:
    """Ping whenever the session has sent nothing for a third of its timeout."""
    while True:
        reader = ref()
        if reader is None:
            return
        wait = reader._ping_interval - (time.monotonic() - reader._last_send)
        if wait <= 0:
            try:
                reader._send(_PING_FRAME)
            except ZooKeeperUnavailableError:
                return  # the reading side reports the lost connection
            continue
        del reader  # don't hold it while asleep
        if stop.wait(wait):
            return


def _read_error(code: int, path: str) -> Exception:
    if code == _NO_AUTH:
        return ZooKeeperPermissionError(path, "READ")
    return ZooKeeperWireError(code, path)
