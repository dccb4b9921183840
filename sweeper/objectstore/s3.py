"""Tiered-storage (S3) objects written by Pulsar's offloader: key parsing and listing.

Pulsar names them `<uuid>-ledger-<id>` (data) and `<uuid>-ledger-<id>-index`, the uuid being
the offload context's (uidMsb, uidLsb) as a Java UUID. Listing is split by the first hex digit
of the uuid so that Spark tasks can list one bucket in parallel.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sweeper.objectstore.base import CHANGED, DELETED, GONE, DeleteOutcome, StoredObject, StoreKind
from sweeper.objectstore.errors import ObjectStoreError

OFFLOAD_KEY = re.compile(
    r"^(?P<uuid>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-ledger-(?P<ledger>\d{1,19})"
    r"(?P<index>-index)?$"
)
PREFIXES = tuple("0123456789abcdef")
_TOP = "\U0010ffff"  # sorts after any character S3 can hold in a key, in UTF-8 byte order


def listing_units() -> list[tuple[str, str, str]]:
    """(prefix, start_after, stop_at) slices covering a whole bucket, one Spark task each.

    Offload keys start with a hex digit (the uuid), so 16 prefix slices hold them all; three
    range slices pick up every other key, which we must see to report it.
    """
    units = [(p, "", "") for p in PREFIXES]
    units += [("", "", "0"), ("", "9" + _TOP, "a"), ("", "f" + _TOP, "")]
    return units


@dataclass(frozen=True, slots=True)
class OffloadKey:
    uuid: str
    ledger_id: int
    role: str  # data | index


def parse_offload_key(key: str) -> OffloadKey | None:
    """The (uuid, ledger id, role) a key encodes, or None when it is not an offload object."""
    match = OFFLOAD_KEY.match(key)
    if match is None:
        return None
    ledger_id = int(match["ledger"])
    if ledger_id >= 2**63:
        return None
    return OffloadKey(match["uuid"], ledger_id, "index" if match["index"] else "data")


def offload_keys(uuid: str, ledger_id: int) -> tuple[str, str]:
    return f"{uuid}-ledger-{ledger_id}", f"{uuid}-ledger-{ledger_id}-index"


@dataclass(frozen=True)
class S3Target:
    """Where and how to reach a bucket; credentials come from the environment, never from here."""

    bucket: str
    region: str = ""
    endpoint: str = ""


def _loopback(endpoint: str) -> bool:
    host = urllib.parse.urlparse(endpoint).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def s3_client(target: S3Target, endpoint_override: str = "") -> Any:
    """A boto3 client; credentials from boto3's usual chain (environment, profile, instance role)."""
    import boto3
    from botocore.config import Config

    endpoint = endpoint_override or target.endpoint or None
    extra: dict[str, str] = {}
    if endpoint and _loopback(endpoint) and not os.environ.get("AWS_ACCESS_KEY_ID"):
        # The local sandbox endpoint accepts any key; never used for a remote endpoint.
        extra = {"aws_access_key_id": "sandbox", "aws_secret_access_key": "sandbox"}
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=target.region or "us-east-1",
        config=Config(retries={"max_attempts": 5, "mode": "adaptive"}, max_pool_connections=32),
        **extra,
    )


def _list(client: Any, bucket: str, prefix: str, start_after: str, stop_at: str) -> Iterator[dict[str, Any]]:
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    if start_after:
        kwargs["StartAfter"] = start_after
    for page in client.get_paginator("list_objects_v2").paginate(**kwargs):
        for obj in page.get("Contents", []):
            if stop_at and obj["Key"] >= stop_at:
                return
            yield obj


# User metadata Pulsar's jcloud offloader puts on every object it writes (BlobStoreManagedLedgerOffloader:
# the broker's offloader metadata, with LedgerOffloader.METADATA_PULSAR_CLUSTER_NAME = "pulsarClusterName",
# plus `role` and the extra metadata "ManagedLedgerName"). S3 returns user-metadata keys lower-cased.
CLUSTER_NAME_KEY = "pulsarclustername"
MANAGED_LEDGER_NAME_KEY = "managedledgername"


def object_metadata(head: dict[str, Any]) -> dict[str, str]:
    """An object's user metadata from a HeadObject answer, keys lower-cased as S3 (and Pulsar's scanner) treat them."""
    return {k.lower(): v for k, v in (head.get("Metadata") or {}).items()}


class S3Store:
    """One bucket of an S3-compatible store (drivers `aws-s3`, `S3`, `aliyun-oss`) behind the ObjectStore interface
    (sweeper.objectstore.base). A listing does not carry user metadata on S3: `with_metadata` costs a HEAD per
    object. A delete with `if_version` sends the ETag verified as `If-Match` (S3's conditional DeleteObject; a store
    that ignores the header deletes unconditionally, so the HEAD just before still guards it)."""

    kind: StoreKind = "s3"

    def __init__(self, client: Any, bucket: str) -> None:
        self.client = client
        self.container = bucket

    def url(self, name: str = "") -> str:
        return f"s3://{self.container}/{name}"

    def list(self, prefix: str = "", start_after: str = "", stop_at: str = "",
             with_metadata: bool = False) -> Iterator[StoredObject]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            for obj in _list(self.client, self.container, prefix, start_after, stop_at):
                metadata = None
                if with_metadata:
                    head = self.head(obj["Key"])
                    if head is None:
                        continue  # deleted while listed
                    metadata = head.metadata
                yield StoredObject(obj["Key"], int(obj.get("Size", 0)), int(obj["LastModified"].timestamp() * 1000),
                                   str(obj.get("ETag", "")), metadata)
        except (ClientError, BotoCoreError) as exc:
            raise ObjectStoreError(f"cannot list {self.url(prefix)}: {exc}") from exc

    def head(self, name: str) -> StoredObject | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = self.client.head_object(Bucket=self.container, Key=name)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise ObjectStoreError(f"cannot read {self.url(name)}: {exc}") from exc
        except BotoCoreError as exc:
            raise ObjectStoreError(f"cannot read {self.url(name)}: {exc}") from exc
        return StoredObject(name, int(head.get("ContentLength", 0)), int(head["LastModified"].timestamp() * 1000),
                            str(head.get("ETag", "")), object_metadata(head))

    def delete(self, name: str, if_version: str = "") -> DeleteOutcome:
        from botocore.exceptions import BotoCoreError, ClientError

        # S3 answers a delete of a missing key with success: look first, so `gone` is told apart from `deleted`.
        current = self.head(name)
        if current is None:
            return GONE
        if if_version and current.version != if_version:
            return CHANGED
        kwargs: dict[str, Any] = {"Bucket": self.container, "Key": name}
        if if_version:
            kwargs["IfMatch"] = if_version
        try:
            self.client.delete_object(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("404", "NoSuchKey", "NotFound"):
                return GONE
            if code in ("412", "PreconditionFailed"):
                return CHANGED
            raise ObjectStoreError(f"cannot delete {self.url(name)}: {exc}") from exc
        except BotoCoreError as exc:
            raise ObjectStoreError(f"cannot delete {self.url(name)}: {exc}") from exc
        return DELETED
