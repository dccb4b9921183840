"""One contract, four stores (issue 48): every adapter of sweeper.objectstore lists with sizes and times, reads the
user metadata Pulsar's jcloud offloader writes, deletes, refuses a compare-and-set delete of an object that changed
since it was read, and answers a missing object as missing. Each runs against a real server of its API, seeded
through the vendor's own SDK: moto (S3), Azurite (Azure Blob), fake-gcs-server (GCS), and the local filesystem for
the filesystem offloader's MapFile directories.

Under xdist each test is its own unit (tests/conftest.py's scheduler); the servers are module-scoped fixtures, so a
worker starts each server at most once for this module (`xdist_group` names the group for a reader, as the ensemble
modules do)."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sweeper.objectstore import ObjectStore, ObjectStoreError, StoreTarget, open_store, store_kind
from sweeper.objectstore.base import CHANGED, DELETED, GONE

pytestmark = pytest.mark.xdist_group("objectstore_contract")

# The user metadata BlobStoreManagedLedgerOffloader puts on its objects (DataBlockUtils.addVersionInfo adds the
# format version under its lower-cased key; the cluster name is LedgerOffloader.METADATA_PULSAR_CLUSTER_NAME).
JCLOUDS_METADATA = {
    "role": "data",
    "ManagedLedgerName": "public/default/persistent/orders",
    "pulsarClusterName": "standalone",
    "S3ManagedLedgerOffloaderFormatVersion": "1",
}
ML_NAME = "public/default/persistent/orders"
_containers = itertools.count(1)


@dataclass
class World:
    """A store under test, and how to seed it with the store's own SDK."""

    store: ObjectStore
    put: Callable[[str, bytes, Mapping[str, str]], None]
    kind: str
    has_user_metadata: bool = True

    def name(self, ledger_id: int, uid: str, index: bool = False) -> str:
        """An offloaded ledger's object name as its offloader writes it."""
        if self.kind == "filesystem":  # FileSystemManagedLedgerOffloader: <ml name>/<ledgerId>-<uuid>
            return f"{ML_NAME}/{ledger_id}-{uid}"
        return f"{uid}-ledger-{ledger_id}" + ("-index" if index else "")  # DataBlockUtils


def _s3(request: pytest.FixtureRequest) -> World:
    from sweeper.objectstore.s3 import S3Target, s3_client

    server = request.getfixturevalue("s3_server")
    bucket = f"contract-{next(_containers)}"
    client = s3_client(S3Target(bucket, endpoint=server.endpoint))
    client.create_bucket(Bucket=bucket)

    def put(name: str, body: bytes, metadata: Mapping[str, str]) -> None:
        client.put_object(Bucket=bucket, Key=name, Body=body, Metadata=dict(metadata))

    return World(open_store(StoreTarget("aws-s3", bucket, "us-east-1", server.endpoint)), put, "s3")


def _azure(request: pytest.FixtureRequest) -> World:
    from sweeper.objectstore.azure import azure_service

    server = request.getfixturevalue("azurite_server")
    container = f"contract-{next(_containers)}"
    service = azure_service(server.endpoint)
    client = service.create_container(container)

    def put(name: str, body: bytes, metadata: Mapping[str, str]) -> None:
        client.upload_blob(name, body, metadata=dict(metadata), overwrite=True)

    return World(open_store(StoreTarget("azureblob", container, "", server.endpoint)), put, "azure")


def _gcs(request: pytest.FixtureRequest) -> World:
    from sweeper.objectstore.gcs import gcs_client

    server = request.getfixturevalue("gcs_server")
    bucket_name = f"contract-{next(_containers)}"
    bucket = gcs_client(server.endpoint).create_bucket(bucket_name)

    def put(name: str, body: bytes, metadata: Mapping[str, str]) -> None:
        blob = bucket.blob(name)
        blob.metadata = dict(metadata)
        blob.upload_from_string(body)

    return World(open_store(StoreTarget("google-cloud-storage", bucket_name, "", server.endpoint)), put, "gcs")


def _filesystem(request: pytest.FixtureRequest) -> World:
    base: Path = request.getfixturevalue("tmp_path") / "offload"
    base.mkdir()

    def put(name: str, body: bytes, metadata: Mapping[str, str]) -> None:
        # A MapFile directory as Hadoop's LocalFileSystem leaves it: `data`, `index` and their checksum files.
        path = base / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "data").write_bytes(body)
        (path / "index").write_bytes(b"i" * 7)
        (path / ".data.crc").write_bytes(b"c" * 3)
        (path / ".index.crc").write_bytes(b"c" * 2)

    return World(open_store(StoreTarget("filesystem", f"file://{base}")), put, "filesystem",
                 has_user_metadata=False)


def _extra_bytes(world: World) -> int:
    """What a seeded object weighs beyond its body: the filesystem's index and checksum files."""
    return 12 if world.kind == "filesystem" else 0


@pytest.fixture(params=["s3", "azure", "gcs", "filesystem"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    yield {"s3": _s3, "azure": _azure, "gcs": _gcs, "filesystem": _filesystem}[request.param](request)


def test_a_listing_gives_each_object_its_size_and_time(world: World) -> None:
    first, second = str(uuid.UUID(int=1 << 64)), str(uuid.UUID(int=0xA << 124))
    before = int(time.time() * 1000) - 2000
    world.put(world.name(11, first), b"x" * 100, JCLOUDS_METADATA)
    world.put(world.name(12, second), b"y" * 5, JCLOUDS_METADATA)
    after = int(time.time() * 1000) + 2000

    listed = list(world.store.list())
    assert [o.name for o in listed] == sorted([world.name(11, first), world.name(12, second)])
    sizes = {o.name: o.size for o in listed}
    extra = _extra_bytes(world)
    assert sizes == {world.name(11, first): 100 + extra, world.name(12, second): 5 + extra}
    assert all(before <= o.last_modified_ms <= after and o.version for o in listed)
    assert all(o.metadata is None for o in listed)  # not asked for

    # Slices: a prefix, and a (start_after, stop_at) range, as the snapshot's listing tasks ask for them.
    a, b = world.name(11, first), world.name(12, second)
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    prefix = world.name(11, first)[:shared + 1]
    assert [o.name for o in world.store.list(prefix=prefix)] == [world.name(11, first)]
    ranged = list(world.store.list(start_after=world.name(11, first), stop_at="~"))
    assert [o.name for o in ranged] == ([world.name(12, second)] if world.name(12, second) > world.name(11, first)
                                        else [])


def test_the_offloaders_user_metadata_reads_back_lower_cased(world: World) -> None:
    uid = str(uuid.uuid4())
    world.put(world.name(7, uid), b"data", JCLOUDS_METADATA)
    world.put(world.name(7, uid, index=True), b"index", {**JCLOUDS_METADATA, "role": "index"})
    expected = {k.lower(): v for k, v in JCLOUDS_METADATA.items()} if world.has_user_metadata else {}

    head = world.store.head(world.name(7, uid))
    assert head is not None and dict(head.metadata or {}) == expected
    listed = {o.name: dict(o.metadata or {}) for o in world.store.list(with_metadata=True)}
    assert listed[world.name(7, uid)] == expected
    if world.has_user_metadata:
        assert listed[world.name(7, uid, index=True)]["role"] == "index"
    else:
        # A MapFile carries no user metadata: the directory's own path names its managed ledger.
        assert world.name(7, uid).rpartition("/")[0] == ML_NAME


def test_a_delete_removes_the_object_and_a_second_finds_it_gone(world: World) -> None:
    uid = str(uuid.uuid4())
    name = world.name(21, uid)
    world.put(name, b"z" * 10, JCLOUDS_METADATA)
    assert world.store.delete(name) == DELETED
    assert world.store.head(name) is None
    assert world.store.delete(name) == GONE
    assert [o.name for o in world.store.list()] == []


def test_a_missing_object_is_missing(world: World) -> None:
    name = world.name(99, str(uuid.uuid4()))
    assert world.store.head(name) is None
    assert world.store.delete(name) == GONE
    assert world.store.delete(name, if_version="12345") == GONE


def test_a_compare_and_set_delete_refuses_an_object_that_changed(world: World) -> None:
    uid = str(uuid.uuid4())
    name = world.name(31, uid)
    world.put(name, b"first", JCLOUDS_METADATA)
    read = world.store.head(name)
    assert read is not None
    time.sleep(0.05)  # a new mtime on the filesystem
    world.put(name, b"second version", JCLOUDS_METADATA)  # rewritten since it was read: a new generation / ETag

    assert world.store.delete(name, if_version=read.version) == CHANGED
    now = world.store.head(name)
    assert now is not None and now.version != read.version  # still there, untouched
    assert world.store.delete(name, if_version=now.version) == DELETED
    assert world.store.head(name) is None


def test_the_driver_names_the_api() -> None:
    assert [store_kind(d) for d in ("aws-s3", "S3", "aliyun-oss", "google-cloud-storage", "azureblob",
                                    "AzureBlob", "filesystem", "", None)] == \
        ["s3", "s3", "s3", "gcs", "azure", "azure", "filesystem", "s3", "s3"]
    assert store_kind("transient") is None and store_kind("segment-store") is None
    with pytest.raises(ObjectStoreError, match="not one we can read"):
        open_store(StoreTarget("transient", "bucket"))


def test_the_filesystem_store_never_deletes_outside_an_offloaded_ledgers_directory(tmp_path: Path) -> None:
    base = tmp_path / "offload"
    (base / ML_NAME).mkdir(parents=True)
    (base / ML_NAME / "notes.txt").write_text("keep")
    outside = tmp_path / f"5-{uuid.uuid4()}"
    outside.mkdir()
    store = open_store(StoreTarget("filesystem", str(base)))
    listed: list[Any] = list(store.list())
    assert [o.name for o in listed] == [f"{ML_NAME}/notes.txt"]  # listed, so a report can name it
    for bad in (f"{ML_NAME}/notes.txt", f"../{outside.name}", f"{ML_NAME}/../../../../../{outside.name}", outside.name):
        with pytest.raises(ObjectStoreError):
            store.delete(bad)
    assert outside.is_dir() and (base / ML_NAME / "notes.txt").exists()
    with pytest.raises(ObjectStoreError, match="only local paths"):
        open_store(StoreTarget("filesystem", "hdfs://namenode:8020/offload"))
