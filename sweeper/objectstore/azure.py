"""Azure Blob Storage (driver `azureblob`) through Microsoft's own client, azure-storage-blob.

A listing with `include=["metadata"]` returns each blob's size, last-modified time, ETag and user metadata in one
call (the ETag comes quoted from a read and bare from a listing: kept bare). A delete with the ETag we verified
(`If-Match`) is the store's own compare-and-set: 412 when it changed.

The account: the broker reads AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_ACCESS_KEY (`JCloudBlobStoreProvider`,
AZURE_BLOB); so do we. The endpoint is the context's `serviceEndpoint` when it names one (an account URL such as
`https://<account>.blob.core.windows.net` or an emulator's `http://127.0.0.1:<port>/<account>`), else the
account's public endpoint. On a loopback endpoint without those variables, the emulator's documented development
account is used (Azurite's, public and the same on every install), never for a remote endpoint.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator
from typing import Any

from sweeper.objectstore.base import CHANGED, DELETED, GONE, DeleteOutcome, StoredObject, StoreKind, lower_keys
from sweeper.objectstore.errors import ObjectStoreError

ACCOUNT_ENV, KEY_ENV = "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCESS_KEY"
# Azurite's well-known development account (documented by Microsoft for the emulator; it guards nothing).
_EMULATOR_ACCOUNT = "devstoreaccount1"
_EMULATOR_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")


def _loopback(endpoint: str) -> bool:
    host = urllib.parse.urlparse(endpoint).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def account_url(endpoint: str, account: str) -> str:
    """The account URL the client talks to: the configured endpoint, else the account's public one."""
    if endpoint:
        return endpoint.rstrip("/")
    if not account:
        raise ObjectStoreError(f"no Azure endpoint and no {ACCOUNT_ENV} to name the account")
    return f"https://{account}.blob.core.windows.net"


def azure_service(endpoint: str = "") -> Any:
    from azure.storage.blob import BlobServiceClient

    account, key = os.environ.get(ACCOUNT_ENV, ""), os.environ.get(KEY_ENV, "")
    if not account and endpoint and _loopback(endpoint):
        account, key = _EMULATOR_ACCOUNT, _EMULATOR_KEY
    credential: Any = {"account_name": account, "account_key": key} if account and key else None
    try:
        return BlobServiceClient(account_url(endpoint, account), credential=credential)
    except ValueError as exc:  # a malformed account URL or key
        raise ObjectStoreError(f"cannot reach Azure Blob at {endpoint or account!r}: {exc}") from exc


class AzureStore:
    kind: StoreKind = "azure"

    def __init__(self, service: Any, container: str) -> None:
        self.service = service
        self.container = container
        self._container = service.get_container_client(container)

    def url(self, name: str = "") -> str:
        return f"azure://{self.container}/{name}"

    @staticmethod
    def _object(name: str, props: Any, metadata: Any) -> StoredObject:
        return StoredObject(name, int(props.size or 0), int(props.last_modified.timestamp() * 1000),
                            str(props.etag).strip('"'), None if metadata is None else lower_keys(metadata))

    def list(self, prefix: str = "", start_after: str = "", stop_at: str = "",
             with_metadata: bool = False) -> Iterator[StoredObject]:
        from azure.core.exceptions import AzureError

        include = ["metadata"] if with_metadata else None
        try:
            # Azure lists in name order and has no start-after: names at or before it are skipped here.
            for blob in self._container.list_blobs(name_starts_with=prefix or None, include=include):
                if start_after and blob.name <= start_after:
                    continue
                if stop_at and blob.name >= stop_at:
                    return
                yield self._object(blob.name, blob, blob.metadata if with_metadata else None)
        except AzureError as exc:
            raise ObjectStoreError(f"cannot list {self.url(prefix)}: {exc}") from exc

    def head(self, name: str) -> StoredObject | None:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        try:
            props = self._container.get_blob_client(name).get_blob_properties()
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise ObjectStoreError(f"cannot read {self.url(name)}: {exc}") from exc
        return self._object(name, props, props.metadata or {})

    def delete(self, name: str, if_version: str = "") -> DeleteOutcome:
        from azure.core import MatchConditions
        from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError

        kwargs: dict[str, Any] = {"delete_snapshots": "include"}
        if if_version:
            kwargs.update(etag=f'"{if_version}"', match_condition=MatchConditions.IfNotModified)
        try:
            self._container.delete_blob(name, **kwargs)
        except ResourceNotFoundError:
            return GONE
        except ResourceModifiedError:
            # If-Match on a blob that is not there is answered 412 as well: tell the two apart by looking.
            return CHANGED if self.head(name) is not None else GONE
        except AzureError as exc:
            raise ObjectStoreError(f"cannot delete {self.url(name)}: {exc}") from exc
        return DELETED
