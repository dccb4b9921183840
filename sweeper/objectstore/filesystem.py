"""The filesystem offloader's store (driver `filesystem`): local paths and `file://` URIs.

`FileSystemManagedLedgerOffloader` writes one Hadoop MapFile directory per offloaded ledger at
`<storageBasePath>/<managed-ledger name>/<ledgerId>-<uuid>` (ledger id first, unlike the jcloud names) and deletes
it with a recursive delete of that path. Here each such directory is one object: its name is its path under the
base, its size the sum of its files' sizes (the MapFile's `data` and `index`, and Hadoop's `.crc` files beside
them), its time and version its newest file's. A MapFile carries no user metadata: the managed-ledger name is the
directory's own path, and the cluster is not written anywhere (the base path must be this cluster's alone).

A directory is an object only when its name has that shape; everything else under the base is listed as the plain
file it is (so a listing can report it), never deleted as a ledger. A delete takes only a name of that shape, never
leaves the base, and with `if_version` refuses a directory that changed since it was read (checked just before the
delete: a filesystem has no compare-and-set across a directory tree).
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from sweeper.objectstore.base import CHANGED, DELETED, GONE, DeleteOutcome, StoredObject, StoreKind
from sweeper.objectstore.errors import ObjectStoreError

LEDGER_DIR = re.compile(
    r"^(?P<ledger>\d{1,19})-(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")


def base_path(storage_base: str) -> Path:
    """A local path from the context's `storageBasePath` (a path or a `file://` URI); other schemes (hdfs://) are
    not reachable from here."""
    parsed = urllib.parse.urlparse(storage_base)
    if parsed.scheme in ("", "file"):
        return Path(urllib.parse.unquote(parsed.path if parsed.scheme else storage_base))
    raise ObjectStoreError(f"{storage_base}: only local paths and file:// are supported, not {parsed.scheme}://")


def parse_ledger_dir(name: str) -> tuple[str, int, str] | None:
    """(managed-ledger name, ledger id, uuid) of an object name `<ml name>/<ledgerId>-<uuid>`, or None."""
    parent, _, leaf = name.rpartition("/")
    match = LEDGER_DIR.match(leaf)
    if match is None or not parent:
        return None
    ledger = int(match["ledger"])
    return (parent, ledger, match["uuid"]) if ledger < 2**63 else None


def _summary(path: Path) -> tuple[int, int]:
    """(total bytes, newest mtime in ns) of the files under a directory."""
    size = newest = 0
    for root, _dirs, files in os.walk(path):
        for file in files:
            stat = os.stat(os.path.join(root, file), follow_symlinks=False)
            size += stat.st_size
            newest = max(newest, stat.st_mtime_ns)
    return size, newest or path.stat().st_mtime_ns


class FileSystemStore:
    kind: StoreKind = "filesystem"

    def __init__(self, storage_base: str) -> None:
        self.container = storage_base
        self.base = base_path(storage_base)

    def url(self, name: str = "") -> str:
        return f"file://{self.base}/{name}"

    def _object(self, name: str, path: Path, with_metadata: bool) -> StoredObject:
        if path.is_dir():
            size, newest = _summary(path)
        else:
            stat = path.stat()
            size, newest = stat.st_size, stat.st_mtime_ns
        return StoredObject(name, size, newest // 1_000_000, f"{size}:{newest}", {} if with_metadata else None)

    def list(self, prefix: str = "", start_after: str = "", stop_at: str = "",
             with_metadata: bool = False) -> Iterator[StoredObject]:
        if not self.base.is_dir():
            raise ObjectStoreError(f"cannot list {self.url()}: not a directory")
        found: list[tuple[str, Path]] = []
        try:
            for root, dirs, files in os.walk(self.base):
                rel = Path(root).relative_to(self.base).as_posix()
                rel = "" if rel == "." else rel + "/"
                for d in list(dirs):
                    if LEDGER_DIR.match(d) and rel:
                        found.append((rel + d, Path(root, d)))
                        dirs.remove(d)  # a ledger's directory is one object: not descended into
                found.extend((rel + f, Path(root, f)) for f in files)
        except OSError as exc:
            raise ObjectStoreError(f"cannot list {self.url(prefix)}: {exc}") from exc
        for name, path in sorted(found):
            if not name.startswith(prefix) or (start_after and name <= start_after) or (stop_at and name >= stop_at):
                continue
            try:
                yield self._object(name, path, with_metadata)
            except FileNotFoundError:
                continue  # deleted while listed

    def _path(self, name: str) -> Path:
        path = (self.base / name).resolve()
        if parse_ledger_dir(name) is None or not path.is_relative_to(self.base.resolve()):
            raise ObjectStoreError(f"{name!r} is not an offloaded ledger's directory under {self.url()}")
        return path

    def head(self, name: str) -> StoredObject | None:
        path = self._path(name)
        try:
            return self._object(name, path, True) if path.is_dir() else None
        except FileNotFoundError:
            return None

    def delete(self, name: str, if_version: str = "") -> DeleteOutcome:
        path = self._path(name)
        if not path.exists():
            return GONE
        if not path.is_dir():
            raise ObjectStoreError(f"{self.url(name)} is not a directory: not a MapFile, not deleted")
        if if_version and self._object(name, path, False).version != if_version:
            return CHANGED
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return GONE
        except OSError as exc:
            raise ObjectStoreError(f"cannot delete {self.url(name)}: {exc}") from exc
        return DELETED
