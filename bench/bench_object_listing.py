"""Listing offloaded objects with their user metadata, per store API (issue 48's choice of clients).

    .venv/bin/python bench/bench_object_listing.py [--objects 2000]

Seeds `--objects` small objects carrying the jclouds offloader's user metadata on moto (S3), Azurite (Azure Blob)
and fake-gcs-server (GCS), all on loopback, then times `ObjectStore.list(with_metadata=True)` through each adapter,
and the same listing without metadata. On S3 the metadata costs a HEAD per object; GCS and Azure return it in the
listing. Local servers, so the numbers compare calls, not a cloud's latency (which multiplies the S3 HEADs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.objectservers import start_azurite, start_fake_gcs, stop_server
from harness.s3server import start_s3, stop_s3
from sweeper.objectstore import ObjectStore, StoreTarget, open_store

METADATA = {"role": "data", "ManagedLedgerName": "public/default/persistent/t", "pulsarClusterName": "bench",
            "S3ManagedLedgerOffloaderFormatVersion": "1"}


def seed(put: Callable[[str], None], count: int) -> None:
    names = [f"{uuid.uuid4()}-ledger-{i}" for i in range(count)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, names))


def timed(store: ObjectStore, with_metadata: bool) -> tuple[float, int]:
    started = time.monotonic()
    count = sum(1 for _ in store.list(with_metadata=with_metadata))
    return time.monotonic() - started, count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        s3, az, gcs = start_s3(Path(tmp) / "s3"), start_azurite(Path(tmp) / "az"), start_fake_gcs(Path(tmp) / "gcs")
        try:
            from sweeper.objectstore.azure import azure_service
            from sweeper.objectstore.gcs import gcs_client
            from sweeper.objectstore.s3 import S3Target, s3_client

            client = s3_client(S3Target("bench", endpoint=s3.endpoint))
            client.create_bucket(Bucket="bench")
            seed(lambda n: client.put_object(Bucket="bench", Key=n, Body=b"x", Metadata=METADATA), args.objects)
            container = azure_service(az.endpoint).create_container("bench")
            seed(lambda n: container.upload_blob(n, b"x", metadata=METADATA), args.objects)
            bucket = gcs_client(gcs.endpoint).create_bucket("bench")

            def gcs_put(name: str) -> None:
                blob = bucket.blob(name)
                blob.metadata = METADATA
                blob.upload_from_string(b"x")

            seed(gcs_put, args.objects)
            for driver, endpoint in (("aws-s3", s3.endpoint), ("azureblob", az.endpoint),
                                     ("google-cloud-storage", gcs.endpoint)):
                store = open_store(StoreTarget(driver, "bench", "us-east-1", endpoint))
                bare, n = timed(store, False)
                full, m = timed(store, True)
                print(f"{driver:22} {n:6d} objects: listing {bare:6.2f} s, with user metadata {full:6.2f} s "
                      f"({full / max(bare, 1e-9):5.1f}x)")
                assert n == m == args.objects
        finally:
            stop_s3(s3)
            stop_server(az)
            stop_server(gcs)


if __name__ == "__main__":
    main()
