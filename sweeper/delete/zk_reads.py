"""What the ZooKeeper executor (sweeper.delete.zk_executor) reads: the reads shared by the records of one call,
prefetched in bulk, and what a managed ledger's listing says of a ledger's BookKeeper copy and its offloaded ones."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError

from sweeper.codecs import pulsar as codec
from sweeper.zk import client as zkutil
from sweeper.zk.errors import ZooKeeperPermissionError

WHY_READ = "the delete re-reads the ledger and its referrers"
Read = tuple[bytes, Any] | None  # (data, stat), None when the znode does not exist


class Deleter(Protocol):
    """What the reads use of the deleter they serve (sweeper.delete.zk_executor.LedgerDeleter): its session, its
    optional bulk reader (dropped when its session is gone), its timeout, and its read of one znode."""

    client: KazooClient
    reader: zkutil.ZnodeReader | None
    op_timeout_s: float

    def read(self, path: str) -> Read: ...


class _Reads:
    """Reads shared by the records of one call: safe, since the delete re-checks every version it relies on.

    `prefetch` issues many reads at once and waits for them together, so verifying a chunk costs a
    few round trips instead of one per znode; anything a prefetch could not read is read again
    (and its error reported) on first use.
    """

    WINDOW = 1000

    def __init__(self, deleter: Deleter) -> None:
        self.deleter = deleter
        self.data: dict[str, Read] = {}
        self.children: dict[str, list[str] | None] = {}

    def prefetch(self, paths: Iterable[str], children: bool = False) -> None:
        cache: dict[str, Any] = self.children if children else self.data
        todo = [p for p in dict.fromkeys(paths) if p not in cache]
        if self.deleter.reader is not None:
            self._prefetch_wire(todo, children)
            return
        client, timeout = self.deleter.client, self.deleter.op_timeout_s
        for start in range(0, len(todo), self.WINDOW):
            window = todo[start:start + self.WINDOW]
            calls = []
            for path in window:
                try:
                    calls.append((path, client.get_children_async(path) if children else client.get_async(path)))
                except Exception:  # e.g. a path the client refuses: left to the per-record read
                    continue
            for path, call in calls:
                try:
                    value = call.get(timeout=timeout)
                except NoNodeError:
                    cache[path] = None
                except Exception:  # read again on use, where the error becomes the record's result
                    continue
                else:
                    cache[path] = sorted(value) if children else value

    def _prefetch_wire(self, todo: list[str], children: bool) -> None:
        """The same through a pipelined reader (many reads per request); failures are read again on use."""
        reader = self.deleter.reader
        assert reader is not None
        try:
            if children:
                for listing in reader.children_many(todo, self.WINDOW):
                    if listing.error is None:
                        self.children[listing.path] = None if listing.children is None else sorted(listing.children)
            else:
                for read in reader.get_many(todo, self.WINDOW):
                    if read.error is None:
                        self.data[read.path] = None if read.data is None else (read.data, read.stat)
        except Exception:  # the reader's session is gone: fall back to per-record reads, which report it
            self.deleter.reader = None

    def get(self, path: str) -> Read:
        if path not in self.data:
            self.data[path] = self.deleter.read(path)
        return self.data[path]

    def get_children(self, path: str) -> list[str] | None:
        if path not in self.children:
            try:
                self.children[path] = sorted(
                    self.deleter.client.get_children_async(path).get(timeout=self.deleter.op_timeout_s))
            except NoNodeError:
                self.children[path] = None
            except NoAuthError as exc:
                raise ZooKeeperPermissionError(path, "READ", WHY_READ) from exc
        return self.children[path]



def _released_copies(info: Any, ledger_id: int, ml_name: str) -> tuple[tuple[str, str, str, tuple[str, ...], str], ...]:
    """The offloaded copies a ManagedLedgerInfo lists for a ledger it no longer reads from BookKeeper."""
    out = []
    for entry in info.ledgerInfo:
        if entry.ledgerId != ledger_id or not entry.HasField("offloadContext"):
            continue
        ctx = entry.offloadContext
        props = {p.key: p.value for p in ctx.driverMetadata.properties}
        uuid = codec.offload_uuid(ctx.uidMsb, ctx.uidLsb)
        keys = (f"{uuid}-ledger-{ledger_id}", f"{uuid}-ledger-{ledger_id}-index")
        out.append((props.get("bucket", ""), props.get("region", ""), props.get("serviceEndpoint", ""), keys, ml_name))
    return tuple(out)


def _needs_bookkeeper_copy(info: Any, ledger_id: int) -> bool:
    """Whether a ManagedLedgerInfo lists the ledger as still read from BookKeeper.

    An entry offloaded `complete` with `bookkeeperDeleted` does not count: its BookKeeper copy is
    garbage by design. Without `complete`, Pulsar still reads it from BookKeeper (ManagedLedgerImpl.getLedgerHandle
    reads tiered storage only for a complete offload). Reconcile applies the same rule to every
    managed ledger, shadows included.
    """
    def released(entry: Any) -> bool:
        return (entry.HasField("offloadContext") and entry.offloadContext.bookkeeperDeleted
                and entry.offloadContext.complete)

    return any(entry.ledgerId == ledger_id and not released(entry) for entry in info.ledgerInfo)
