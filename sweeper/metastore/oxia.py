"""Oxia, through the same interface as ZooKeeper: a kazoo-shaped client (`OxiaStore`) over the PyPI `oxia` client
(0.2.1, synchronous), and a bulk reader (`OxiaReader`) over our gRPC read client (`oxia_grpc.OxiaReadClient`,
generated from the server's proto: the PyPI client's pure-Python decoding is too slow for a snapshot).

How Pulsar keeps its metadata in Oxia, which this mirrors (`org.apache.pulsar.metadata.impl.oxia.OxiaMetadataStore`,
Pulsar 4.0.8 and master):
- a metadata path is the Oxia key, unchanged; parents are keys with an empty value (`createParents`);
- the children of `P` are the keys in `[P/, P//)` under the namespace's hierarchical sort (`getChildren`), which
  holds exactly the direct children;
- a record's `Stat` is Oxia's version: `version` = `version_id`, creation and modification times =
  `created_timestamp` / `modified_timestamp`, ephemeral = it has a session (`convertStat`);
- `delete(path, expectedVersion)` is a delete with `IfVersionIdEquals`, refused while the key has children;
- there is no multi-key transaction.
BookKeeper on Oxia (`org.apache.pulsar.metadata.bookkeeper.PulsarLedgerManager`) writes ledger metadata with the
same `LedgerMetadataSerDe` as on ZooKeeper, at the same hybrid-hierarchical paths, and deletes it with the
version alone, leaving empty parent keys behind. It writes no `LAYOUT` record: Pulsar's driver
(`PulsarMetadataClientDriver`) hands out its `PulsarLedgerManagerFactory` without reading or storing one (seen on a
real Pulsar 4.0.8 on Oxia: /ledgers holds INSTANCEID, available, cookies, idgen and the ledger tree only).

What this store does not do, it declares in `capabilities` rather than emulating: the delete then sends one
ledger per compare-and-set and leaves empty parents (as BookKeeper does here), and the ACL check is skipped.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)
from kazoo.protocol.states import ZnodeStat

from sweeper.metastore.errors import OxiaUnavailableError
from sweeper.metastore.oxia_client_fix import mend_the_pypi_client
from sweeper.metastore.oxia_keys import children_range, grandchildren_range, parent_of
from sweeper.records import ChildrenRead, ZnodeRead

if TYPE_CHECKING:
    from sweeper.metastore.oxia_grpc import OxiaReadClient, Record

DEFAULT_WINDOW = 1000


@dataclass(frozen=True)
class Capabilities:
    """What a metadata store offers beyond single-key reads and versioned writes."""

    atomic_multi: bool = True  # one multi checks every referrer's version and deletes, all or nothing
    acls: bool = True  # per-node ACLs, which the delete checks before its lock
    tidies_empty_parents: bool = True  # BookKeeper removes emptied layout directories itself
    # BookKeeper records its ledger layout in `<root>/LAYOUT`. Pulsar's `metadata-store:` driver, the only one that
    # reaches Oxia, writes none and always uses the hybrid hierarchical paths.
    layout_record: bool = True


ZOOKEEPER_CAPABILITIES = Capabilities()
OXIA_CAPABILITIES = Capabilities(atomic_multi=False, acls=False, tidies_empty_parents=False, layout_record=False)


def capabilities_of(client: Any) -> Capabilities:
    """A kazoo client is ZooKeeper; an `OxiaStore` says what it lacks."""
    return getattr(client, "capabilities", ZOOKEEPER_CAPABILITIES)


# ---- records ---------------------------------------------------------------------------------------------------


def _ms(value: datetime | None) -> int:
    # The client turns the server's epoch milliseconds into a naive local datetime; timestamp() undoes that.
    return 0 if value is None else round(value.timestamp() * 1000)


def stat_of(version: Any, data_length: int, children: int = 0) -> ZnodeStat:
    """Oxia's version as the `ZnodeStat` every rule reads (Pulsar's `OxiaMetadataStore.convertStat`)."""
    session = version.session_id() or 0
    return ZnodeStat(czxid=0, mzxid=0, ctime=_ms(version.created_timestamp()),
                     mtime=_ms(version.modified_timestamp()), version=version.version_id(), cversion=0, aversion=0,
                     ephemeralOwner=session, dataLength=data_length, numChildren=children, pzxid=0)



class Settled:
    """An already-settled call, in kazoo's async result shape (`.get(timeout)`)."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error

    def get(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _settled(call: Any) -> Settled:
    try:
        return Settled(call())
    except Exception as exc:
        return Settled(error=exc)


# ---- the store -------------------------------------------------------------------------------------------------


class OxiaStore:
    """One Oxia namespace as a kazoo-shaped client: what the snapshot's planning, the gates, the delete and the
    retention step call. Errors are kazoo's (`NoNodeError`, `NodeExistsError`, `BadVersionError`,
    `NotEmptyError`), so the rules that handle them on ZooKeeper handle them here. `numChildren` is counted
    only for keys with an empty value (directories)."""

    capabilities = OXIA_CAPABILITIES

    def __init__(self, address: str, namespace: str, timeout_s: float = 15.0) -> None:
        mend_the_pypi_client()
        import oxia

        self.address, self.namespace = address, namespace
        self.hosts = f"oxia://{address}/{namespace}"
        try:
            self._client = oxia.Client(address, namespace=namespace, session_timeout_ms=int(timeout_s * 1000))
        except Exception as exc:  # the client raises RuntimeError after waiting for its shard assignments
            raise OxiaUnavailableError(f"cannot connect to Oxia at {address} (namespace {namespace!r}): "
                                       f"{type(exc).__name__}: {exc}") from None
        self.connected = True
        self._closed = False
        self._session_id = 0
        self._sequence = itertools.count()

    # -- reads --

    def get(self, path: str) -> tuple[bytes, ZnodeStat]:
        from oxia.ex import KeyNotFound

        try:
            _, value, version = self._client.get(path)
        except KeyNotFound:
            raise NoNodeError(path) from None
        data = bytes(value or b"")
        # Children are counted for empty-valued keys only: those are the directories (a plan sizes its shards by
        # them); a ledger's or a referrer's read, which the delete makes for each record, costs one call.
        children = 0 if data else len(self._client.list(*children_range(path)))
        return data, stat_of(version, len(data), children)

    def exists(self, path: str) -> ZnodeStat | None:
        if path == "/":
            return stat_of(_RootVersion(), 0)
        try:
            return self.get(path)[1]
        except NoNodeError:
            return None

    def get_children(self, path: str) -> list[str]:
        start, _ = children_range(path)
        names = [key[len(start):] for key in self._client.list(*children_range(path))]
        if not names and path != "/" and self.exists(path) is None:
            raise NoNodeError(path)  # kazoo's answer for a missing parent, which callers rely on
        return names

    def get_async(self, path: str) -> Settled:
        return _settled(lambda: self.get(path))

    def get_children_async(self, path: str) -> Settled:
        return _settled(lambda: self.get_children(path))

    # -- writes --

    def create(self, path: str, value: bytes = b"", ephemeral: bool = False, sequence: bool = False,
               makepath: bool = False, include_data: bool = False, **_: Any) -> Any:
        from oxia.ex import UnexpectedVersionId

        if sequence:
            # Only the clock probe creates sequential records; a unique suffix stands for ZooKeeper's counter.
            path = f"{path}{time.time_ns():020d}{next(self._sequence):04d}"
        if makepath:
            self.ensure_path(path.rsplit("/", 1)[0] or "/")
        try:
            _, version = self._client.put(path, value, expected_version_id=-1, ephemeral=ephemeral)
        except UnexpectedVersionId:
            raise NodeExistsError(path) from None
        if ephemeral:
            self._session_id = version.session_id() or self._session_id
        return (path, stat_of(version, len(value))) if include_data else path

    def ensure_path(self, path: str) -> None:
        """Every missing ancestor as an empty record, as Pulsar's `createParents` writes them."""
        parts = [p for p in path.split("/") if p]
        for depth in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:depth])
            if self.exists(prefix) is None:
                with contextlib.suppress(NodeExistsError):  # created meanwhile: what was wanted
                    self.create(prefix, b"")

    def set(self, path: str, value: bytes, version: int = -1) -> ZnodeStat:
        from oxia.ex import UnexpectedVersionId

        if self.exists(path) is None:
            raise NoNodeError(path)
        try:
            _, new = self._client.put(path, value, expected_version_id=None if version == -1 else version)
        except UnexpectedVersionId:
            raise BadVersionError(path) from None
        return stat_of(new, len(value))

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> bool:
        import grpc
        from oxia.ex import KeyNotFound, UnexpectedVersionId

        if recursive:
            raise NotImplementedError("the sweeper never deletes recursively")
        if self._client.list(*children_range(path)):
            raise NotEmptyError(path)  # as OxiaMetadataStore.delete refuses
        try:
            deleted = self._client.delete(path, expected_version_id=None if version == -1 else version)
        except grpc.RpcError as exc:
            if exc.code().name in _ANSWER_LOST_CODES:
                # Sent, and its answer lost: the server may have applied it. Raised as kazoo's ConnectionLoss, which
                # the delete settles as a lost answer (sweeper.delete.zk_executor), not as a refusal.
                raise ConnectionLoss(f"Oxia delete of {path}: {exc.code().name}: {exc.details()}: the answer was "
                                     "lost; the delete may have been applied") from exc
            raise
        except UnexpectedVersionId:
            # Oxia answers a versioned delete of a missing key with a version mismatch; kazoo's callers tell
            # "someone deleted it" (NoNode) from "it changed" (BadVersion), so ask which it was.
            try:
                self._client.get(path, include_value=False)
            except KeyNotFound:
                raise NoNodeError(path) from None
            raise BadVersionError(path) from None
        if not deleted:
            raise NoNodeError(path)
        return True

    def delete_async(self, path: str, version: int = -1) -> Settled:
        return _settled(lambda: self.delete(path, version))

    def transaction(self) -> OxiaTransaction:
        return OxiaTransaction(self)

    # -- session --

    @property
    def client_id(self) -> tuple[int, bytes]:
        """The session that owns this client's ephemeral records (known once one was written)."""
        return self._session_id, b""

    def stop(self) -> None:
        """Ends the session, as kazoo's `stop` does: this client's ephemeral records (the run lock, a clock probe)
        go now, not when the session times out; callers that only `stop` a client leak nothing."""
        self.close()

    def close(self) -> None:
        self.connected = False
        if not self._closed:  # kazoo's close after stop is the usual pair: the second call has nothing to do
            self._closed = True
            self._client.close()


# gRPC statuses of a write that may have reached the server (PyPI `oxia` 0.2.1 sends `OxiaClient/Write` as one
# unary call without a deadline, and does not retry it): the connection went (UNAVAILABLE), the call was cut or
# timed out (CANCELLED, DEADLINE_EXCEEDED), or the transport failed mid-answer (UNKNOWN, INTERNAL).
_ANSWER_LOST_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "UNKNOWN", "INTERNAL"})


class _RootVersion:
    def session_id(self) -> None:
        return None

    def created_timestamp(self) -> None:
        return None

    def modified_timestamp(self) -> None:
        return None

    def version_id(self) -> int:
        return 0


class OxiaTransaction:
    """The delete's compare-and-set on a store without multi-key transactions.

    `commit` first re-reads every referrer it was asked to check and compares its version with the one the
    verification read; only when all still match does it delete, each record with the version verified. A
    referrer that changed since the verification therefore stops the delete, as ZooKeeper's multi would. What
    no single-key store can close is the one round trip between that re-read and the delete; Pulsar never adds
    an existing ledger to a referrer in it: a managed ledger lists only ledgers it has just created
    (`ManagedLedgerImpl.ledgerCreated` / `createLedgerAfterClosed`), a cursor switches to a new ledger
    (`ManagedCursorImpl.createNewMetadataLedger`), and schema, compaction and bucket snapshots are new ledgers
    too (`BookkeeperSchemaStorage.createLedger`, `AbstractTwoPhaseCompactor`, `BookkeeperBucketSnapshotStorage`),
    all younger than the grace period no candidate is within. The delete sends one ledger per transaction on
    such a store (`capabilities.atomic_multi` is false), so a failed check never leaves half a batch deleted.
    """

    def __init__(self, store: Any) -> None:  # an OxiaStore, or an oxia_split.SplitStore
        self.store = store
        self.checks: list[tuple[str, int]] = []
        self.deletes: list[tuple[str, int]] = []

    def check(self, path: str, version: int) -> None:
        self.checks.append((path, version))

    def delete(self, path: str, version: int = -1) -> None:
        self.deletes.append((path, version))

    def commit(self) -> list[Any]:
        results: list[Any] = []
        failed = False
        for path, version in self.checks:
            try:
                stat = self.store.exists(path)
            except Exception as exc:  # a check that could not be read stops the delete before it is sent
                results.append(exc)
                failed = True
                continue
            error = NoNodeError(path) if stat is None else BadVersionError(path) if stat.version != version else None
            failed = failed or error is not None
            results.append(error if error is not None else True)
        if failed:
            return [r if isinstance(r, Exception) else RolledBackError() for r in results] + [
                RolledBackError() for _ in self.deletes]
        for path, version in self.deletes:
            try:
                self.store.delete(path, version)
                results.append(True)
            except Exception as exc:
                results.append(exc)
        return results

    def commit_async(self) -> Settled:
        return _settled(self.commit)


class OxiaReader:
    """The scan's bulk reader (`ZnodeReader`) on Oxia, over the gRPC read client (`oxia_grpc.OxiaReadClient`, not
    the PyPI client: its pure-Python decoding halved the snapshot's speed). A directory is listed with its
    children's values in one range scan, and the reads that follow are answered from it, so a scan costs a round
    trip per directory rather than per ledger; the listings of many children of one directory (each managed
    ledger's cursors) come from one scan of its grandchildren; any other read goes with up to `window` others in
    batched gets.

    Every listing and read is whole or fails (`OxiaUnavailableError` as the read's error): a shard that cannot be
    read, or a shard map that changed meanwhile, never shows as fewer children. Stats carry Oxia's version and
    times (`stat_of`'s fields); numChildren is 0, which no scan reads (planning counts children through the store).
    """

    IN_FLIGHT = 16
    # Listings asked for ahead of the one being yielded: the empty ones among them (a managed ledger without
    # cursors) are told from vanished directories by one batch of gets rather than a get each.
    LOOKAHEAD = 512
    # A scan task lists a namespace's managed ledgers, then the cursors of its share of them: a range scan each,
    # ~0.3 ms of client and server time apiece. When at least GRANDCHILDREN_MIN children of a directory this reader
    # has listed are asked for at once, and at least one in GRANDCHILDREN_SHARE of its children, one scan of the
    # directory's grandchildren answers them all (~4 us a record), even though it reads the other children's too.
    GRANDCHILDREN_MIN = 16
    GRANDCHILDREN_SHARE = 64

    def __init__(self, client: OxiaReadClient) -> None:
        self.client = client
        self._values: dict[str, Record] = {}  # what listings brought, by key, until a read takes it
        self._sizes: dict[str, int] = {}  # how many children each directory this reader listed had
        self._pool = ThreadPoolExecutor(self.IN_FLIGHT, thread_name_prefix="oxia-scan")
        self.reads = 0

    def children_many(self, paths: Iterable[str], window: int = DEFAULT_WINDOW,
                      multi_read: int = 1) -> Iterator[ChildrenRead]:
        """Listings in input order; `IN_FLIGHT` range scans at once (one is a round trip, and a scan task lists
        a directory per managed ledger for its cursors), or the grandchildren of their common parent in one."""
        paths = list(paths)
        grandchildren = self._grandchildren_of(paths)
        pending: deque[tuple[str, Future[list[Record]]]] = deque()
        for path in paths:
            parent = parent_of(path)
            scan = (self._from(grandchildren[parent], path) if parent in grandchildren
                    else self._pool.submit(self.client.range_scan, *children_range(path)))
            pending.append((path, scan))
            if len(pending) >= self.LOOKAHEAD:
                yield from self._settle(pending)
        while pending:
            yield from self._settle(pending)

    def _grandchildren_of(self, paths: list[str]) -> dict[str, Future[dict[str, list[Record]] | None]]:
        """One scan of the grandchildren for each parent of many of `paths` (see GRANDCHILDREN_MIN), started now:
        each listing is read when it is asked for, never reused by a later call."""
        asked = Counter(parent_of(path) for path in paths)
        return {parent: self._pool.submit(self._grandchildren, parent) for parent, count in asked.items()
                if parent != "/" and parent in self._sizes and count >= self.GRANDCHILDREN_MIN
                and count * self.GRANDCHILDREN_SHARE >= self._sizes[parent]}

    def _grandchildren(self, parent: str) -> dict[str, list[Record]] | None:
        """`parent`'s grandchildren by child, or None where the one range cannot be taken for them (see
        `grandchildren_range`): no record at all (also what a server ordering keys otherwise answers), or a key that
        is not two levels below `parent`."""
        prefix = parent.rstrip("/") + "/"
        by_child: dict[str, list[Record]] = {}
        records = self.client.range_scan(*grandchildren_range(parent))
        for record in records:
            key = record[0]
            child, slash, name = key[len(prefix):].partition("/")
            if not key.startswith(prefix) or not slash or "/" in name:
                return None
            by_child.setdefault(prefix + child, []).append(record)
        return by_child if records else None

    def _from(self, grandchildren: Future[dict[str, list[Record]] | None], path: str) -> Future[list[Record]]:
        """`path`'s listing out of its parent's grandchildren, or its own range scan where those are no answer."""
        listing: Future[list[Record]] = Future()

        def own(scan: Future[list[Record]]) -> None:
            try:
                listing.set_result(scan.result())
            except Exception as exc:
                listing.set_exception(exc)

        def taken(source: Future[dict[str, list[Record]] | None]) -> None:
            try:
                found = source.result()
                if found is None:
                    self._pool.submit(self.client.range_scan, *children_range(path)).add_done_callback(own)
                else:
                    listing.set_result(found.get(path, []))
            except Exception as exc:  # the grandchildren's scan failed (or the reader closed): so does the listing
                listing.set_exception(exc)

        grandchildren.add_done_callback(taken)
        return listing

    def _settle(self, pending: deque[tuple[str, Future[list[Record]]]]) -> Iterator[ChildrenRead]:
        """The first pending listing and every finished one after it, in order."""
        pending[0][1].exception()  # waits
        ready = []
        while pending and pending[0][1].done():
            ready.append(pending.popleft())
        # An empty range is an empty directory or none at all (kazoo's NoNode): its own key says which.
        empty = [path for path, scan in ready if path != "/" and scan.exception() is None and not scan.result()]
        asked, gone = set(empty), set[str]()
        unknown: Exception | None = None
        if empty:
            try:
                gone = {path for path, got in zip(empty, self.client.get_many(empty), strict=True) if got is None}
            except Exception as exc:
                unknown = exc
        for path, scan in ready:
            error = scan.exception()
            if error is None and unknown is not None and path in asked:
                error = unknown
            if error is not None:
                yield ChildrenRead(path, None, error)
            elif path in gone:
                yield ChildrenRead(path, None)
            else:
                yield self._listed(path, scan.result())

    def _listed(self, path: str, records: list[Record]) -> ChildrenRead:
        cut = len(children_range(path)[0])
        values = self._values
        names = []
        for record in records:
            key = record[0]
            values[key] = record
            names.append(key[cut:])
        self._sizes[path.rstrip("/") or "/"] = len(names)
        names.sort()  # already so from one shard, and from a merge of several
        return ChildrenRead(path, names)

    def get_many(self, paths: Iterable[str], window: int = DEFAULT_WINDOW) -> Iterator[ZnodeRead]:
        """Reads in input order: from the listings' values where a listing brought them, the rest `window` paths
        to a batch of gets."""
        chunk: list[str] = []
        for path in paths:
            chunk.append(path)
            if len(chunk) >= max(1, window):
                yield from self._read(chunk)
                chunk = []
        yield from self._read(chunk)

    def _read(self, paths: list[str]) -> Iterator[ZnodeRead]:
        cached: list[tuple[bytes, ZnodeStat] | None] = []
        for path in paths:
            record = self._values.pop(path, None)
            cached.append(None if record is None else (record[1], record[2]))
        missing = [path for path, hit in zip(paths, cached, strict=True) if hit is None]
        fetched: dict[str, tuple[bytes, ZnodeStat] | None] = {}
        error: Exception | None = None
        if missing:
            try:
                fetched = dict(zip(missing, self.client.get_many(missing), strict=True))
            except Exception as exc:  # reported per path, as one failed read is on ZooKeeper
                error = exc
        for path, hit in zip(paths, cached, strict=True):
            if hit is None:
                if error is not None:
                    yield ZnodeRead(path, None, None, error)
                    continue
                hit = fetched[path]
            yield ZnodeRead(path, None, None) if hit is None else ZnodeRead(path, hit[0], hit[1])

    def close(self) -> None:
        """The reader owns its client (`OxiaEndpoint.wire_reader` opened it for this reader alone)."""
        self._values.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    def __enter__(self) -> OxiaReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
