"""Oxia's read path over gRPC stubs generated from the server's own proto (schemas/proto/oxia_client.proto): what
the snapshot's bulk reader (`oxia.OxiaReader`) needs, and nothing else. Writes, sessions and ephemeral records stay
on the PyPI client (`oxia.OxiaStore`).

Why not the PyPI client here: its messages are decoded in pure Python (betterproto2), which bounded the Oxia
snapshot at half the ZooKeeper one (docs/benchmarks.md); protobuf's C decoder (upb) reads a 10,000-record range
scan ~8x faster on the same stream.

How a client reads a namespace, as the Go client does (oxia-db/oxia v0.17.1, `oxia/internal/shard_manager.go`,
`oxia/async_client_impl.go` `RangeScan`, `oxia/internal/rpc_provider.go`):
- `GetShardAssignments(namespace)` on the service address is a stream: its first message maps every shard of the
  namespace to its leader and its inclusive hash range, and each later message is the whole map again
  (`oxiad/dataserver/assignment/assignment_dispatcher.go` sends the namespace's full set on every change). The
  coordinator leaves out a split's children until the cutover and a parent being deleted
  (`oxiad/coordinator/runtime/runtime.go` `computeNewAssignments`), so a usable map covers the hash space once;
- a range scan goes to every shard's leader (`RangeScan` with the shard id: the server resolves the shard by id
  alone and answers a node that is not its leader with an error, `public_rpc_server.go` `resolveLeader`), and the
  shards' records, each already in the hierarchical key order, are merged in that order;
- a get goes to the shard holding xxh3(key) & 0xffffffff (`oxia_keys.server_hash`, as `oxia.OxiaStore` routes), many to
  one `Read` request.

What this client adds, because a partial scan would make a referenced ledger look unreferenced: a map that does not
cover the hash space exactly once (a gap, an overlap, a shard without a leader) is refused; a failed or cut-short
stream from any shard fails the whole read; a map that changed while a read was under way (a leader moved, a shard
split) fails it too. Every failure is `OxiaUnavailableError`, never fewer records. The Go client retries a scan
that failed before its first answer; this one leaves retrying to the caller (a Spark task is retried whole).
"""

from __future__ import annotations

import bisect
import heapq
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.experimental
from kazoo.protocol.states import ZnodeStat

from sweeper._proto import oxia_client_pb2 as pb
from sweeper._proto import oxia_client_pb2_grpc as pb_grpc
from sweeper.metastore.errors import OxiaUnavailableError
from sweeper.metastore.oxia_keys import HASH_SPACE_END, check_server_hash, hierarchical_key, server_hash

log = logging.getLogger(__name__)

# A stalled leader must fail the read rather than hang the task; the largest listing the snapshot makes (a
# namespace of 100,000 topics, with their ledger lists) takes seconds, far below this.
RPC_DEADLINE_S = 300.0
# gRPC's default 4 MiB is not enough: the server flushes a batch once it passes 2 MiB (`maxTotalReadValueSize`,
# public_rpc_server.go), so one message holds up to 2 MiB plus one record, and a managed ledger's record alone may
# list 100,000 ledgers.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
READ_BATCH = 1000  # gets per Read request
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A stream read on the calling thread rather than handed over from gRPC's polling thread: a directory listing
    # (one small scan per managed ledger's cursors) costs ~180 us of client CPU instead of ~430 us (measured here).
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
]

# A record read: (key, value, stat); the stat is what `oxia.stat_of` makes of the PyPI client's version.
Record = tuple[str, bytes, ZnodeStat]


@dataclass(frozen=True, slots=True)
class Shard:
    id: int
    leader: str
    low: int  # hash range, both ends inclusive
    high: int


@dataclass(frozen=True)
class ShardMap:
    """One namespace's shards, checked to cover the hash space exactly once, ordered by hash range."""

    shards: tuple[Shard, ...]
    _lows: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lows", [s.low for s in self.shards])

    def shard_of(self, key: str) -> Shard:
        return self.shards[bisect.bisect_right(self._lows, server_hash(key)) - 1]


def shard_map(namespace: str, message: Any) -> ShardMap:
    """The namespace's map from one `ShardAssignments` message, or why it cannot be used (OxiaUnavailableError)."""
    if namespace not in message.namespaces:
        raise OxiaUnavailableError(f"the shard assignments name no namespace {namespace!r}")
    assignments = message.namespaces[namespace]
    if assignments.shard_key_router != pb.XXHASH3:
        raise OxiaUnavailableError(f"namespace {namespace!r} routes keys with {assignments.shard_key_router}, "
                                   "not xxh3: its keys cannot be found")
    shards = []
    for a in assignments.assignments:
        if not a.HasField("int32_hash_range"):
            raise OxiaUnavailableError(f"shard {a.shard} of namespace {namespace!r} has no hash range")
        if not a.leader:
            raise OxiaUnavailableError(f"shard {a.shard} of namespace {namespace!r} has no leader (an election?)")
        r = a.int32_hash_range
        shards.append(Shard(a.shard, a.leader, r.min_hash_inclusive, r.max_hash_inclusive))
    shards.sort(key=lambda s: s.low)
    expected = 0
    for s in shards:
        if s.low != expected or s.high < s.low:
            what = "a gap" if s.low > expected else "an overlap"
            raise OxiaUnavailableError(f"the shards of namespace {namespace!r} leave {what} in the hash space at "
                                       f"{min(expected, s.low):#010x} ({_describe(shards)}): a read now could miss "
                                       "records")
        expected = s.high + 1
    if expected != HASH_SPACE_END + 1:
        raise OxiaUnavailableError(f"the shards of namespace {namespace!r} leave a gap in the hash space at "
                                   f"{expected:#010x} ({_describe(shards)}): a read now could miss records")
    return ShardMap(tuple(shards))


def _describe(shards: Sequence[Shard]) -> str:
    return ", ".join(f"shard {s.id} {s.low:#010x}-{s.high:#010x}" for s in shards) or "no shards"


def _stat(version: Any, length: int) -> ZnodeStat:
    # In ZnodeStat's field order (czxid mzxid ctime mtime version cversion aversion ephemeralOwner dataLength
    # numChildren pzxid), built as the tuple it is (a namedtuple's own __new__ is a Python call per record); an
    # unset session_id reads 0, as `stat_of` makes the PyPI client's None.
    return _new_stat(ZnodeStat, (0, 0, version.created_timestamp, version.modified_timestamp, version.version_id, 0,
                                 0, version.session_id, length, 0, 0))


_new_stat = tuple.__new__


class OxiaReadClient:
    """Range scans and batched gets on one Oxia namespace, over gRPC. Thread-safe: the reader runs its scans from
    a pool on one client. Plaintext, like the PyPI client the store uses."""

    def __init__(self, address: str, namespace: str, timeout_s: float = 15.0) -> None:
        check_server_hash()
        self.address, self.namespace, self.timeout_s = address, namespace, timeout_s
        self._lock = threading.Condition()
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, pb_grpc.OxiaClientStub] = {}
        self._map: ShardMap | None = None
        self._problem = "no shard assignments received yet"
        self._fatal = False
        self._closed = False
        self._call: Any = None
        self._watcher = threading.Thread(target=self._watch, name=f"oxia-assignments-{namespace}", daemon=True)
        self._watcher.start()
        try:
            self._current(timeout_s)
        except OxiaUnavailableError as exc:
            self.close()
            raise OxiaUnavailableError(f"cannot read Oxia at {address} (namespace {namespace!r}): {exc}") from None

    # -- shard assignments --

    def _stub(self, address: str) -> pb_grpc.OxiaClientStub:
        with self._lock:
            if self._closed:
                raise OxiaUnavailableError(f"the Oxia read client for {self.address} is closed")
            stub = self._stubs.get(address)
            if stub is None:
                channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                self._channels[address] = channel
                stub = self._stubs[address] = pb_grpc.OxiaClientStub(channel)
            return stub

    def _watch(self) -> None:
        """Follows the assignment stream for the client's life: every message replaces the map; while the stream
        is down there is no map, and reads wait for one (up to the timeout) rather than trust a stale one."""
        backoff = 0.1
        while True:
            with self._lock:
                if self._closed:
                    return
            try:
                call = self._stub(self.address).GetShardAssignments(
                    pb.ShardAssignmentsRequest(namespace=self.namespace))
                with self._lock:
                    if self._closed:
                        call.cancel()
                        return
                    self._call = call
                for message in call:
                    try:
                        usable: ShardMap | None = shard_map(self.namespace, message)
                        problem = ""
                    except OxiaUnavailableError as exc:
                        usable, problem = None, str(exc)
                    with self._lock:
                        self._map, self._problem = usable, problem
                        self._lock.notify_all()
                    backoff = 0.1
                problem = "the server ended the shard assignment stream"
            except grpc.RpcError as exc:
                problem = f"shard assignments: {exc.code().name}: {exc.details()}"
                if exc.code() == grpc.StatusCode.NOT_FOUND:  # the namespace does not exist: no retry mends that
                    with self._lock:
                        self._map, self._problem, self._fatal = None, problem, True
                        self._lock.notify_all()
                    return
            except OxiaUnavailableError:  # closed meanwhile
                return
            with self._lock:
                if self._closed:
                    return
                if self._map is not None:
                    log.warning("Oxia at %s: %s; reads wait for the assignments again", self.address, problem)
                self._map, self._problem = None, problem
                self._lock.notify_all()
                self._lock.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def _current(self, timeout_s: float | None = None) -> ShardMap:
        """The map to read with, waiting up to the timeout while there is none."""
        with self._lock:
            self._lock.wait_for(lambda: self._map is not None or self._fatal or self._closed,
                                self.timeout_s if timeout_s is None else timeout_s)
            if self._map is None:
                state = "closed" if self._closed else self._problem
                raise OxiaUnavailableError(f"no usable shard map for namespace {self.namespace!r} at "
                                           f"{self.address}: {state}")
            return self._map

    def _unchanged(self, used: ShardMap, what: str) -> None:
        """A read is only whole if every shard it asked still had the leader and range it was asked as."""
        with self._lock:
            now = self._map
        if now != used:
            state = "lost" if now is None else f"now {_describe(now.shards)}"
            raise OxiaUnavailableError(f"the shard assignments of namespace {self.namespace!r} changed during "
                                       f"{what} (read with {_describe(used.shards)}; {state}): not using a read "
                                       "that may have missed records")

    # -- reads --

    def range_scan(self, start: str, end: str) -> list[Record]:
        """Every record in [start, end) under the hierarchical key order, from every shard, in that order: all
        of them, or OxiaUnavailableError."""
        used = self._current()
        what = f"the range scan [{start!r}, {end!r})"
        calls = [(s, self._stub(s.leader).RangeScan(
            pb.RangeScanRequest(shard=s.id, start_inclusive=start, end_exclusive=end), timeout=RPC_DEADLINE_S))
            for s in used.shards]
        parts: list[list[Record]] = []
        try:
            for shard, call in calls:
                parts.append(self._records(call, shard, what))
        finally:
            for _, call in calls[len(parts):]:
                call.cancel()
        self._unchanged(used, what)
        if len(parts) == 1:
            return parts[0]
        return list(heapq.merge(*parts, key=lambda record: hierarchical_key(record[0])))

    @staticmethod
    def _records(call: Any, shard: Shard, what: str) -> list[Record]:
        out: list[Record] = []
        append = out.append
        try:
            for response in call:
                for record in response.records:
                    if record.status != pb.OK:
                        raise OxiaUnavailableError(f"{what} on shard {shard.id} at {shard.leader} answered "
                                                   f"{pb.Status.Name(record.status)} for {record.key!r}")
                    value = record.value
                    append((record.key, value, _stat(record.version, len(value))))
        except grpc.RpcError as exc:
            raise OxiaUnavailableError(f"{what} on shard {shard.id} at {shard.leader} failed: "
                                       f"{exc.code().name}: {exc.details()}") from None
        return out

    def get_many(self, keys: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """Each key's value and stat, None where there is no such key, in input order: each shard's keys in
        `READ_BATCH`-sized `Read` requests, all sent before any answer is awaited."""
        if not keys:
            return []
        used = self._current()
        what = f"a read of {len(keys)} keys"
        by_shard: dict[int, list[int]] = {}
        shards: dict[int, Shard] = {}
        for i, key in enumerate(keys):
            shard = used.shard_of(key)
            shards[shard.id] = shard
            by_shard.setdefault(shard.id, []).append(i)
        calls = []
        for shard_id, indexes in by_shard.items():
            shard = shards[shard_id]
            for k in range(0, len(indexes), READ_BATCH):
                batch = indexes[k:k + READ_BATCH]
                request = pb.ReadRequest(shard=shard_id, gets=[pb.GetRequest(key=keys[i], include_value=True)
                                                                for i in batch])
                calls.append((shard, batch, self._stub(shard.leader).Read(request, timeout=RPC_DEADLINE_S)))
        out: list[tuple[bytes, ZnodeStat] | None] = [None] * len(keys)
        done = 0
        try:
            for shard, batch, call in calls:
                self._fill(out, keys, batch, call, shard, what)
                done += 1
        finally:
            for _, _, call in calls[done:]:
                call.cancel()
        self._unchanged(used, what)
        return out

    @staticmethod
    def _fill(out: list[tuple[bytes, ZnodeStat] | None], keys: Sequence[str], batch: list[int], call: Any,
              shard: Shard, what: str) -> None:
        answered = 0
        try:
            for response in call:
                for got in response.gets:
                    if answered >= len(batch):
                        raise OxiaUnavailableError(f"{what} on shard {shard.id} got more answers than it asked for")
                    i = batch[answered]
                    answered += 1
                    if got.status == pb.OK:
                        value = got.value
                        out[i] = (value, _stat(got.version, len(value)))
                    elif got.status != pb.KEY_NOT_FOUND:
                        raise OxiaUnavailableError(f"{what} on shard {shard.id} at {shard.leader} answered "
                                                   f"{pb.Status.Name(got.status)} for {keys[i]!r}")
        except grpc.RpcError as exc:
            raise OxiaUnavailableError(f"{what} on shard {shard.id} at {shard.leader} failed: "
                                       f"{exc.code().name}: {exc.details()}") from None
        if answered != len(batch):
            raise OxiaUnavailableError(f"{what} on shard {shard.id} at {shard.leader} answered {answered} of "
                                       f"{len(batch)} keys")

    def exists(self, key: str) -> bool:
        return self.get_many([key])[0] is not None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            call, channels = self._call, list(self._channels.values())
            self._lock.notify_all()
        if call is not None:
            call.cancel()
        for channel in channels:
            channel.close()
        if threading.current_thread() is not self._watcher:
            self._watcher.join(timeout=5.0)

    def __enter__(self) -> OxiaReadClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
