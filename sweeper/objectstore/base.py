"""The one interface every offload store answers: list a container with sizes and times, read an object's user
metadata, delete it (compare-and-set where the store has it).

Pulsar's offloaders (checked in apache/pulsar `tiered-storage/`):
- `JCloudBlobStoreProvider` (jcloud) serves the drivers `aws-s3`, `google-cloud-storage`, `azureblob` and
  `aliyun-oss` (S3's API), matched case-insensitively (`getProvider`); the context records the provider's driver
  name (`BlobStoreManagedLedgerOffloader.getOffloadDriverName`). `OffloadPoliciesImpl` also accepts `S3`, read here
  as S3. All of them go through `BlobStoreManagedLedgerOffloader`, so every store holds the same object names
  (`DataBlockUtils`: `<uuid>-ledger-<id>`, `<uuid>-ledger-<id>-index`) and the same user metadata.
- `FileSystemManagedLedgerOffloader` (driver `filesystem`) writes one Hadoop MapFile directory per ledger at
  `<storageBasePath>/<managed-ledger name>/<ledgerId>-<uuid>` and deletes it recursively.

User-metadata keys come back lower-cased from every adapter: jclouds normalises them so (`DataBlockUtils.VERSION_CHECK`
reads `s3managedledgeroffloaderformatversion`), S3 lower-cases them itself, and Azure's names are case-insensitive.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

StoreKind = Literal["s3", "gcs", "azure", "filesystem"]

# Driver name (lower-cased) -> the API its store speaks. `JCloudBlobStoreProvider.getProvider` compares names with
# equalsIgnoreCase; `aliyun-oss` is jclouds' S3 API with another endpoint; `S3` is a name OffloadPoliciesImpl takes.
_KINDS: dict[str, StoreKind] = {
    "aws-s3": "s3",
    "s3": "s3",
    "aliyun-oss": "s3",
    "google-cloud-storage": "gcs",
    "azureblob": "azure",
    "filesystem": "filesystem",
}

DeleteOutcome = Literal["deleted", "gone", "changed"]
DELETED: DeleteOutcome = "deleted"  # this call removed it
GONE: DeleteOutcome = "gone"  # nothing there to delete (already gone)
CHANGED: DeleteOutcome = "changed"  # the object is not the version we verified: refused, nothing deleted


def store_kind(driver: str | None) -> StoreKind | None:
    """The API a driver's store speaks, or None for a driver we do not know (its objects stay `unknown`, DESIGN
    invariant 23). No driver name at all is read as S3, as the sweeper always did for contexts that name a bucket."""
    if not driver:
        return "s3"
    return _KINDS.get(driver.strip().lower())


@dataclass(frozen=True, slots=True)
class StoreTarget:
    """Where one offload context's objects live. `container` is the bucket (S3, GCS), the container (Azure) or the
    storage base path (filesystem); credentials never travel here, each adapter reads its SDK's usual chain."""

    driver: str
    container: str
    region: str = ""
    endpoint: str = ""

    @property
    def kind(self) -> StoreKind | None:
        return store_kind(self.driver)


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object as the store lists it. `version` is the token a compare-and-set delete checks: the GCS generation,
    the Azure or S3 ETag, the filesystem's (size, newest mtime). `metadata` is None when it was not read."""

    name: str
    size: int
    last_modified_ms: int
    version: str
    metadata: Mapping[str, str] | None = field(default=None, compare=False)


class ObjectStore(Protocol):
    """An adapter over one container of one store."""

    kind: StoreKind
    container: str

    def url(self, name: str = "") -> str:
        """`scheme://container/name`, for rows and reports (never with a credential)."""
        ...

    def list(self, prefix: str = "", start_after: str = "", stop_at: str = "",
             with_metadata: bool = False) -> Iterator[StoredObject]:
        """The objects whose names start with `prefix`, after `start_after` and before `stop_at` (each empty for no
        bound), in name order; with `with_metadata`, each carries its user metadata."""
        ...

    def head(self, name: str) -> StoredObject | None:
        """The object with its user metadata, or None when it does not exist."""
        ...

    def delete(self, name: str, if_version: str = "") -> DeleteOutcome:
        """Delete one object; with `if_version`, only while it is still that version (`changed` otherwise)."""
        ...


def lower_keys(metadata: Mapping[str, str] | None) -> dict[str, str]:
    return {key.lower(): value for key, value in (metadata or {}).items()}
