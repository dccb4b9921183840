"""BookKeeper's records in one Oxia namespace and Pulsar's in another (Pulsar's documented layout, with
`bookkeeperMetadataServiceUri=metadata-store:oxia://host:6648/bookkeeper`): a store and a bulk reader that send each
path to its namespace, for the delete, which checks a ledger and its referrers through one client.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from kazoo.protocol.states import ZnodeStat

from sweeper.metastore.oxia import DEFAULT_WINDOW, OXIA_CAPABILITIES, OxiaReader, OxiaStore, OxiaTransaction, Settled
from sweeper.records import ChildrenRead, ZnodeRead


class SplitStore:
    """BookKeeper's records in one Oxia namespace and Pulsar's in another (Pulsar's documented layout, with
    `bookkeeperMetadataServiceUri=metadata-store:oxia://host:6648/bookkeeper`): what lies under the ledgers root
    is read and deleted in the first, every referrer is read in the second. Only for stores without a multi-key
    transaction, where the split loses nothing atomic (on ZooKeeper the delete refuses two ensembles instead)."""

    capabilities = OXIA_CAPABILITIES

    def __init__(self, bookkeeper: OxiaStore, pulsar: OxiaStore, ledgers_root: str,
                 bookkeeper_paths: Iterable[str] = ()) -> None:
        self.bookkeeper, self.pulsar, self.ledgers_root = bookkeeper, pulsar, ledgers_root.rstrip("/")
        # Records of ours kept in BookKeeper's namespace beside the ledgers: the run lock and its epoch, which the
        # delete's fence checks with every compare-and-set (sweeper.run_lock).
        self.bookkeeper_paths = frozenset(bookkeeper_paths)
        self.hosts = f"{bookkeeper.hosts} (ledgers), {pulsar.hosts} (Pulsar)"

    def _for(self, path: str) -> OxiaStore:
        inside = (path == self.ledgers_root or path.startswith(self.ledgers_root + "/")
                  or path in self.bookkeeper_paths)
        return self.bookkeeper if inside else self.pulsar

    @property
    def connected(self) -> bool:
        return self.bookkeeper.connected and self.pulsar.connected

    @property
    def client_id(self) -> tuple[int, bytes]:
        return self.bookkeeper.client_id

    def get(self, path: str) -> tuple[bytes, ZnodeStat]:
        return self._for(path).get(path)

    def exists(self, path: str) -> ZnodeStat | None:
        return self._for(path).exists(path)

    def get_children(self, path: str) -> list[str]:
        return self._for(path).get_children(path)

    def get_async(self, path: str) -> Settled:
        return self._for(path).get_async(path)

    def get_children_async(self, path: str) -> Settled:
        return self._for(path).get_children_async(path)

    def delete(self, path: str, version: int = -1) -> bool:
        return self._for(path).delete(path, version)

    def delete_async(self, path: str, version: int = -1) -> Settled:
        return self._for(path).delete_async(path, version)

    def transaction(self) -> OxiaTransaction:
        return OxiaTransaction(self)

    def stop(self) -> None:
        self.bookkeeper.stop()
        self.pulsar.stop()

    def close(self) -> None:
        self.bookkeeper.close()
        self.pulsar.close()


class SplitReader:
    """The bulk reader of a `SplitStore`: each path read in its own namespace, results in input order. The
    delete's verification prefetches ledgers and referrers through one reader; a reader of BookKeeper's namespace
    alone would find no managed ledger there and take a listed ledger for unreferenced."""

    def __init__(self, bookkeeper: OxiaReader, pulsar: OxiaReader, ledgers_root: str) -> None:
        self.bookkeeper, self.pulsar, self.ledgers_root = bookkeeper, pulsar, ledgers_root.rstrip("/")

    def _inside(self, path: str) -> bool:
        return path == self.ledgers_root or path.startswith(self.ledgers_root + "/")

    def _routed(self, paths: Iterable[str], read: Any) -> Iterator[Any]:
        ordered = list(paths)
        ours = [p for p in ordered if self._inside(p)]
        theirs = [p for p in ordered if not self._inside(p)]
        by_path: dict[str, Any] = {}
        for result in [*read(self.bookkeeper, ours), *read(self.pulsar, theirs)]:
            by_path[result.path] = result
        return (by_path[p] for p in ordered)

    def get_many(self, paths: Iterable[str], window: int = DEFAULT_WINDOW) -> Iterator[ZnodeRead]:
        return self._routed(paths, lambda reader, some: list(reader.get_many(some, window)))

    def children_many(self, paths: Iterable[str], window: int = DEFAULT_WINDOW,
                      multi_read: int = 1) -> Iterator[ChildrenRead]:
        return self._routed(paths, lambda reader, some: list(reader.children_many(some, window)))

    def close(self) -> None:
        self.bookkeeper.close()
        self.pulsar.close()
