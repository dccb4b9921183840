"""Google Cloud Storage (driver `google-cloud-storage`) through Google's own client, google-cloud-storage.

A listing returns each object's size, `updated` time, generation and user metadata in one call (the JSON API's
`objects.list` answers whole object resources), so no per-object read is needed for metadata. A delete with the
generation we verified (`ifGenerationMatch`) is the store's own compare-and-set: 412 when the object changed.

Credentials: Google's usual chain (GOOGLE_APPLICATION_CREDENTIALS, the metadata server); the broker's
`gcsManagedLedgerOffloadServiceAccountKeyFile` is such a file. A loopback endpoint (an emulator) is anonymous.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Any

from sweeper.objectstore.base import CHANGED, DELETED, GONE, DeleteOutcome, StoredObject, StoreKind, lower_keys
from sweeper.objectstore.errors import ObjectStoreError


def _loopback(endpoint: str) -> bool:
    host = urllib.parse.urlparse(endpoint).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def gcs_client(endpoint: str = "", project: str = "") -> Any:
    """A client on Google's usual credential chain; a loopback endpoint (an emulator) is anonymous. No credentials
    to be found is an ObjectStoreError (the listing files it as the container's failure)."""
    from google.auth.exceptions import GoogleAuthError
    from google.cloud import storage

    if endpoint and _loopback(endpoint):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=project or "local", credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": endpoint})
    options = {"api_endpoint": endpoint} if endpoint else None
    try:
        return storage.Client(project=project or None, client_options=options)
    except GoogleAuthError as exc:
        raise ObjectStoreError(f"no Google Cloud credentials for GCS: {exc}") from exc


def _ms(value: Any) -> int:
    return int(value.timestamp() * 1000) if value is not None else 0


class GcsStore:
    kind: StoreKind = "gcs"

    def __init__(self, client: Any, bucket: str) -> None:
        self.client = client
        self.container = bucket
        self._bucket = client.bucket(bucket)

    def url(self, name: str = "") -> str:
        return f"gs://{self.container}/{name}"

    def _object(self, blob: Any, with_metadata: bool) -> StoredObject:
        return StoredObject(blob.name, int(blob.size or 0), _ms(blob.updated), str(blob.generation),
                            lower_keys(blob.metadata) if with_metadata else None)

    def list(self, prefix: str = "", start_after: str = "", stop_at: str = "",
             with_metadata: bool = False) -> Iterator[StoredObject]:
        from google.api_core import exceptions

        # start_offset is inclusive: the name itself is skipped below.
        kwargs: dict[str, Any] = {"prefix": prefix or None, "start_offset": start_after or None,
                                  "end_offset": stop_at or None}
        try:
            for blob in self.client.list_blobs(self.container, **kwargs):
                if start_after and blob.name == start_after:
                    continue
                yield self._object(blob, with_metadata)
        except exceptions.GoogleAPIError as exc:
            raise ObjectStoreError(f"cannot list {self.url(prefix)}: {exc}") from exc

    def head(self, name: str) -> StoredObject | None:
        from google.api_core import exceptions

        try:
            blob = self._bucket.get_blob(name)
        except exceptions.GoogleAPIError as exc:
            raise ObjectStoreError(f"cannot read {self.url(name)}: {exc}") from exc
        return None if blob is None else self._object(blob, True)

    def delete(self, name: str, if_version: str = "") -> DeleteOutcome:
        from google.api_core import exceptions

        if if_version:
            # Read first, then delete with the precondition: GCS itself refuses a changed generation (412), and a
            # server that ignores `ifGenerationMatch` on delete (fake-gcs-server 1.56.1 reads only `generation`
            # there) still never deletes an object seen changed.
            current = self.head(name)
            if current is None:
                return GONE
            if current.version != if_version:
                return CHANGED
        blob = self._bucket.blob(name)
        try:
            blob.delete(if_generation_match=int(if_version) if if_version else None)
        except exceptions.NotFound:
            return GONE
        except exceptions.PreconditionFailed:
            return CHANGED
        except exceptions.GoogleAPIError as exc:
            raise ObjectStoreError(f"cannot delete {self.url(name)}: {exc}") from exc
        return DELETED
