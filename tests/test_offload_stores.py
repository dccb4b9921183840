"""Tiered storage beyond S3 (issue 48): offload contexts written by the `google-cloud-storage` and `azureblob`
drivers are listed through their own store's API (fake-gcs-server, Azurite), not refused as an S3 listing that
failed, and reconcile finds their orphan objects as it does on S3 while objects in use, a peer cluster's and
unowned ones never become candidates. Until the delete stage acts on those stores, it refuses their records."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import seed_offload_store, seed_zookeeper
from sweeper.reconcile.stage import CANDIDATE, OTHER_CLUSTER, UNKNOWN, SafetySettings, run_reconcile
from sweeper.rules.safety import DAY_MS, CircuitBreaker
from sweeper.vocabulary import LISTING_FAILED, UNKNOWN_DRIVER
from tests.support.config import ZkTarget
from tests.support.seeded import SeededSnapshotMaker

pytestmark = pytest.mark.xdist_group("offload_stores")

Put = Callable[[str, str, bytes, dict[str, str]], None]


def _gcs_put(endpoint: str, bucket: str) -> Put:
    from sweeper.objectstore.gcs import gcs_client

    client = gcs_client(endpoint)
    client.create_bucket(bucket)

    def put(container: str, name: str, body: bytes, metadata: dict[str, str]) -> None:
        blob = client.bucket(container).blob(name)
        blob.metadata = metadata or None
        blob.upload_from_string(body)

    return put


def _azure_put(endpoint: str, container: str) -> Put:
    from sweeper.objectstore.azure import azure_service

    service = azure_service(endpoint)
    service.create_container(container)

    def put(name_of_container: str, name: str, body: bytes, metadata: dict[str, str]) -> None:
        service.get_container_client(name_of_container).upload_blob(name, body, metadata=metadata, overwrite=True)

    return put


@pytest.mark.parametrize("driver", ["google-cloud-storage", "azureblob"])
def test_orphan_objects_on_gcs_and_azure_are_found_by_reconcile(
    driver: str, zk: KazooClient, zk_target: ZkTarget, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession,
    request: pytest.FixtureRequest
) -> None:
    gcs = driver == "google-cloud-storage"
    server = request.getfixturevalue("gcs_server" if gcs else "azurite_server")
    container = "offload-gcs" if gcs else "offload-azure"
    cluster = build_cluster(SandboxSpec(seed=5, topics=50, offload_bucket=container, offload_driver=driver,
                                        offload_endpoint=server.endpoint))
    seed_zookeeper(zk, cluster)
    seed_offload_store((_gcs_put if gcs else _azure_put)(server.endpoint, container), cluster)
    assert {o.status for o in cluster.offload_objects} == {"in_use", "in_flight", "orphan", "other_cluster", "unknown"}

    _, _, store, run_id = seeded_snapshot(cluster, reseed=False, offload={"enabled": True})
    objects = {r["key"]: r.asDict() for r in store.read("offload_objects").where(f"run_id = '{run_id}'").collect()}
    assert set(objects) == {o.key for o in cluster.offload_objects}
    some = next(o for o in cluster.offload_objects if o.status == "in_use")
    row = objects[some.key]
    assert (row["bucket"], row["managed_ledger"], row["cluster_name"], row["metadata_read"]) == (
        container, some.managed_ledger, "sandbox", True)  # the metadata came with the listing: no HEAD per object
    quarantine = {r["path"]: r["error_kind"] for r in store.read("quarantine").where(f"run_id = '{run_id}'").collect()}
    scheme = "gs" if gcs else "azure"
    assert quarantine.get(f"{scheme}://{container}/notes/readme-0.txt") == "unknown_key"
    assert LISTING_FAILED not in quarantine.values()  # listed through its own API: nothing for the gate to refuse

    # Eight days on, the orphans are candidates; a peer cluster's objects and unowned ones never are.
    permissive = SafetySettings(breaker=CircuitBreaker(1.0), local_cluster="sandbox", bookkeeper_dedicated=True)
    run_reconcile(spark, store, run_id, permissive, now_ms=int(time.time() * 1000) + 8 * DAY_MS)
    rows = [r.asDict() for r in store.read("orphans").where(f"run_id = '{run_id}'").collect()]
    listed = {r["s3_key"]: r for r in rows if r["object_type"] == "offload_object"}
    by_status = {status: {o.key for o in cluster.offload_objects if o.status == status}
                 for status in ("orphan", "other_cluster", "unknown", "in_use")}
    assert {k for k, r in listed.items() if r["status"] == CANDIDATE} == by_status["orphan"]
    assert {k for k, r in listed.items() if r["status"] == OTHER_CLUSTER} == by_status["other_cluster"]
    assert {k for k, r in listed.items() if r["status"] == UNKNOWN} >= by_status["unknown"]
    assert not by_status["in_use"] & set(listed)

    # The delete stage does not send these to its S3 deleter (which would HEAD another store's bucket name on S3,
    # find nothing and call them `already_gone`): each record is refused, every object stays.
    from sweeper.codecs import pending_delete
    from sweeper.connections import ZooKeeperEndpoint
    from sweeper.delete.inputs import other_stores
    from sweeper.delete.records import PendingRecord
    from sweeper.delete.results import REFUSED
    from sweeper.delete.retry import RetryPolicy
    from sweeper.delete.settings import DeleteTarget
    from sweeper.delete.tasks import delete_partition
    from sweeper.objectstore import StoreTarget, open_store

    records = pending_delete.records_for_orphans(rows, {})
    items = [PendingRecord(f"OFFLOAD_LEDGER/{r['ledgerId']}/{container}/{r['offloadContext']['uuid']}", "emitted",
                           run_id, 0, pending_delete.encode(r)) for r in records if r["ledgerType"] != "LEDGER"]
    assert len(items) == len({(o.uuid, o.ledger_id) for o in cluster.offload_objects if o.status == "orphan"})
    others = other_stores(store, run_id, items)
    assert others == ((container, driver),)
    target = DeleteTarget(
        bookkeeper=ZooKeeperEndpoint(zk_target.hosts, 10.0), ledgers_root="/ledgers", layout="hierarchical",
        ml_root="/managed-ledgers", schemas_root="/schemas", min_age_ms=0, now_ms=None, execute=True, batch_size=10,
        deletes_per_second=1000.0, op_timeout_s=5.0, multi_read=1, policy=RetryPolicy(), endpoint_override="",
        buckets=((container, "", server.endpoint),), other_stores=others, local_cluster="sandbox")
    results = [row[-1] for row in delete_partition(iter([items]), target)]
    assert {r.outcome for r in results} == {REFUSED} and len(results) == len(items)
    assert all("deletes offloaded copies on S3 only" in r.detail for r in results)
    still = {o.name for o in open_store(StoreTarget(driver, container, "", server.endpoint)).list()}
    assert {o.key for o in cluster.offload_objects} <= still


def test_a_driver_the_sweeper_cannot_read_is_named_not_taken_for_a_failed_listing(
    zk: KazooClient, seeded_snapshot: SeededSnapshotMaker, spark: SparkSession
) -> None:
    cluster = build_cluster(SandboxSpec(seed=6, topics=20, offload_bucket="elsewhere", offload_driver="transient"))
    seed_zookeeper(zk, cluster)
    _, _, store, run_id = seeded_snapshot(cluster, reseed=False, offload={"enabled": True})
    rows = [r.asDict() for r in store.read("quarantine").where(f"run_id = '{run_id}'").collect()]
    assert [(r["path"], r["error_kind"]) for r in rows if r["source"] == "offload"] == [
        ("transient://elsewhere/", UNKNOWN_DRIVER)]
    assert store.read("offload_objects").where(f"run_id = '{run_id}'").count() == 0
