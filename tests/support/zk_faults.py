"""A TCP proxy in front of a real ZooKeeper that loses the answers to deleting multis, as a network cut or a
leader change does: the multi reaches the server and is applied, its reply never reaches the client.

It reads ZooKeeper's framing (the jute records of `zookeeper.jute`): every packet is a 4-byte big-endian length
and that many bytes. The first packet of a connection each way is the session handshake (ConnectRequest /
ConnectResponse); after it a request starts with a RequestHeader (xid int32, type int32) and a reply with a
ReplyHeader (xid int32, zxid int64, err int32). A multi (opcode 14) is a sequence of MultiHeader (type int32,
done bool, err int32) each followed by its operation's record, ended by a header with done set. The proxy
forwards everything unchanged; for the first `drop_multis` multis holding a delete (opcode 2) it notes the
request's xid, and when the server's reply to that xid arrives it closes both sockets instead of forwarding it.
The client (kazoo) then fails every request awaiting an answer with ConnectionLoss and reconnects, through the
proxy again, to the same session.

`doom` chooses the requests whose answers are lost instead (any opcode: the fault tests on a ZooKeeper ensemble
lose a read's answer too), and `on_drop` runs when such an answer has arrived, before the connection is dropped:
there a test kills the ensemble's leader, so that the answer is lost the way a leader election loses it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

MULTI, DELETE, CHECK, CREATE, SET_DATA, GET_DATA, EXISTS, GET_CHILDREN2, CREATE2 = 14, 2, 13, 1, 5, 4, 3, 12, 15


def _string(buf: bytes, at: int) -> tuple[str | None, int]:
    (size,) = struct.unpack_from(">i", buf, at)
    at += 4
    if size < 0:
        return None, at
    return buf[at:at + size].decode("utf-8", "replace"), at + size


def _skip_buffer(buf: bytes, at: int) -> int:
    (size,) = struct.unpack_from(">i", buf, at)
    return at + 4 + max(size, 0)


def multi_deletes(body: bytes) -> list[str]:
    """The paths a multi's delete operations name (`body`: the request after its RequestHeader). Parsing stops at
    an operation it does not know; the sweeper's multis hold checks and deletes, and its run lock's a create and a
    setData."""
    return [path for op, path in multi_ops(body) if op == DELETE]


def multi_creates(body: bytes) -> list[str]:
    """The paths a multi's create operations name (the run lock's multi: the lock's create and its epoch's bump)."""
    return [path for op, path in multi_ops(body) if op == CREATE]


def multi_ops(body: bytes) -> list[tuple[int, str]]:
    """(opcode, path) of each operation of a multi, in order."""
    paths: list[tuple[int, str]] = []
    at = 0
    while at + 9 <= len(body):
        op, done, _ = struct.unpack_from(">i?i", body, at)
        at += 9
        if done:
            break
        if op in (DELETE, CHECK):
            path, at = _string(body, at)
            at += 4  # version
            if path is not None:
                paths.append((op, path))
        elif op == SET_DATA:
            path, at = _string(body, at)
            at = _skip_buffer(body, at) + 4
            if path is not None:
                paths.append((op, path))
        elif op == CREATE:
            path, at = _string(body, at)
            if path is not None:
                paths.append((op, path))
            at = _skip_buffer(body, at)
            (acls,) = struct.unpack_from(">i", body, at)
            at += 4
            for _ in range(max(acls, 0)):
                at += 4  # perms
                _, at = _string(body, at)
                _, at = _string(body, at)
            at += 4  # flags
        else:
            break
    return paths


def read_path(body: bytes) -> str | None:
    """The path a getData, exists or getChildren request names (`body`: the request after its RequestHeader)."""
    return _string(body, 0)[0] if len(body) >= 4 else None


def _read_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        try:
            chunk = sock.recv(left)
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_packet(sock: socket.socket) -> bytes | None:
    """One length-prefixed packet, its length included, or None when the socket closed."""
    head = _read_exact(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    body = _read_exact(sock, size) if size > 0 else b""
    return None if body is None else head + body


@dataclass
class ZkFaultProxy:
    upstream: tuple[str, int]  # the real server's host and port
    drop_multis: int = 0  # how many more deleting multis lose their answer
    dropped: list[list[str]] = field(default_factory=list)  # the paths of each multi whose answer was lost
    multis: int = 0  # deleting multis seen
    connections: int = 0  # client connections accepted (a reconnect is one more)
    # (opcode, request after its RequestHeader) -> whether its answer is lost; unset: the first `drop_multis`
    # deleting multis. A test may share one between proxies (one per member of an ensemble).
    doom: Callable[[int, bytes], bool] | None = None
    on_drop: Callable[[], None] | None = None  # runs when a doomed answer has arrived, before the connection drops
    _server: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sockets: list[socket.socket] = field(default_factory=list)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.getsockname()[1])

    def hosts(self, chroot: str = "") -> str:
        return f"127.0.0.1:{self.port}{chroot}"

    def start(self) -> ZkFaultProxy:
        self._server = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True, name="zk-fault-proxy").start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        with self._lock:
            for sock in self._sockets:
                _close(sock)
            self._sockets.clear()

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self.connections += 1
                self._sockets += [client, server]
            doomed: set[int] = set()
            threading.Thread(target=self._requests, args=(client, server, doomed), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, doomed), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket, doomed: set[int]) -> None:
        first = True
        while (packet := _read_packet(client)) is not None:
            if not first and len(packet) >= 12:
                xid, op = struct.unpack_from(">ii", packet, 4)
                if self.doom is not None:
                    if self.doom(op, packet[12:]):
                        with self._lock:
                            # A multi's deletes (or, for the run lock's, its create), else the path read.
                            body = packet[12:]
                            self.dropped.append((multi_deletes(body) or multi_creates(body)) if op == MULTI
                                                else [read_path(body) or ""])
                            doomed.add(xid)
                elif op == MULTI:
                    paths = multi_deletes(packet[12:])
                    if paths:
                        with self._lock:
                            self.multis += 1
                            if self.drop_multis > 0:
                                self.drop_multis -= 1
                                self.dropped.append(paths)
                                doomed.add(xid)
            first = False
            try:
                server.sendall(packet)
            except OSError:
                break
        _close(client)
        _close(server)

    def _replies(self, server: socket.socket, client: socket.socket, doomed: set[int]) -> None:
        first = True
        while (packet := _read_packet(server)) is not None:
            if not first and len(packet) >= 8:
                (xid,) = struct.unpack_from(">i", packet, 4)
                if xid in doomed:
                    if self.on_drop is not None:
                        self.on_drop()
                    break  # applied by the server; its answer never reaches the client
            first = False
            try:
                client.sendall(packet)
            except OSError:
                break
        _close(client)
        _close(server)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
