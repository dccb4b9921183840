"""The object stores Pulsar's offloaders write to, one interface (`base.ObjectStore`) with an adapter per API:
S3 (`s3`, also Aliyun OSS), Google Cloud Storage (`gcs`), Azure Blob (`azure`) and the filesystem offloader's
directories (`filesystem`). `open_store` picks the adapter from an offload context's driver name; each adapter
imports its SDK only when opened, so a run that never meets a store never loads its client."""

from __future__ import annotations

from sweeper.objectstore.base import ObjectStore, StoreTarget, store_kind
from sweeper.objectstore.errors import ObjectStoreError

__all__ = ["ObjectStore", "ObjectStoreError", "StoreTarget", "open_store", "store_kind"]


def open_store(target: StoreTarget, endpoint_override: str = "") -> ObjectStore:
    """The adapter for `target`'s driver; `endpoint_override` replaces the context's `serviceEndpoint` (a store
    reached through another address from where the sweeper runs). Raises ObjectStoreError for a driver we do not
    know: its objects cannot be listed, and must stay unknown (DESIGN invariant 23)."""
    kind = target.kind
    endpoint = endpoint_override or target.endpoint
    if kind == "s3":
        from sweeper.objectstore.s3 import S3Store, S3Target, s3_client

        return S3Store(s3_client(S3Target(target.container, target.region, target.endpoint), endpoint_override),
                       target.container)
    if kind == "gcs":
        from sweeper.objectstore.gcs import GcsStore, gcs_client

        return GcsStore(gcs_client(endpoint), target.container)
    if kind == "azure":
        from sweeper.objectstore.azure import AzureStore, azure_service

        return AzureStore(azure_service(endpoint), target.container)
    if kind == "filesystem":
        from sweeper.objectstore.filesystem import FileSystemStore

        return FileSystemStore(target.container)
    raise ObjectStoreError(f"offload driver {target.driver!r} is not one we can read (aws-s3, S3, aliyun-oss, "
                           "google-cloud-storage, azureblob, filesystem)")
