"""The offload listing's rows from any store: each object as an `offload_objects` row, or a `quarantine` row for a
name that is not an offloaded ledger's. The same jcloud names and user metadata on every store (DataBlockUtils,
BlobStoreManagedLedgerOffloader), so one function serves them all."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sweeper.objectstore.base import ObjectStore
from sweeper.objectstore.s3 import CLUSTER_NAME_KEY, MANAGED_LEDGER_NAME_KEY, parse_offload_key
from sweeper.scan import quarantine_row


def metadata_in_listing(store: ObjectStore) -> bool:
    """Whether the store's listing answers carry user metadata (GCS's `objects.list`, Azure's `include=metadata`),
    so reading it costs no call per object; S3 needs a HEAD each."""
    return store.kind in ("gcs", "azure")


def offload_rows(store: ObjectStore, unit: tuple[str, str, str], head_metadata: bool) -> Iterator[dict[str, Any]]:
    """Rows for `offload_objects` (and `quarantine` for names that are not offload objects) of one listing slice
    (prefix, start_after, stop_at). Raises ObjectStoreError when the slice cannot be listed."""
    prefix, start_after, stop_at = unit
    with_metadata = head_metadata or metadata_in_listing(store)
    for obj in store.list(prefix, start_after, stop_at, with_metadata=with_metadata):
        parsed = parse_offload_key(obj.name)
        if parsed is None:
            yield quarantine_row("offload", store.url(obj.name), "unknown_key",
                                 "not an offload object key (<uuid>-ledger-<id>[-index])")
            continue
        metadata = obj.metadata or {}
        yield {
            "record_type": "offload_objects",
            "bucket": store.container,
            "key": obj.name,
            "uuid": parsed.uuid,
            "ledger_id": parsed.ledger_id,
            "role": parsed.role,
            "size": obj.size,
            "last_modified_ms": obj.last_modified_ms,
            "metadata_role": metadata.get("role"),
            "managed_ledger": metadata.get(MANAGED_LEDGER_NAME_KEY),
            "cluster_name": metadata.get(CLUSTER_NAME_KEY),
            "metadata_read": obj.metadata is not None,
        }
