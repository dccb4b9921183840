"""Deleting offloaded copies from a real S3 endpoint (moto's server), re-checked against ZooKeeper."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from kazoo.client import KazooClient

from harness.s3server import S3ServerInfo
from harness.zkserver import free_port
from sweeper.codecs import pulsar as codec
from sweeper.delete import ALREADY_GONE, DELETED, FAILED, IN_USE, INVALID, MISMATCH, WOULD_DELETE, ObjectDeleter
from sweeper.delete.retry import RetryPolicy, is_transient_code, run_with_retries
from sweeper.objectstore.s3 import S3Target, s3_client
from sweeper.vocabulary import DAY_MS
from tests.support.s3_faults import KeyFault, S3FaultProxy

ML_ROOT = "/managed-ledgers"
ML = "t/ns/persistent/topic-a"
TOPIC = "persistent://t/ns/topic-a"
U1 = (0x123E4567E89B12D3, -0x5B9BD9EBBFFFFFFF)  # referenced by the managed ledger
U1_TEXT = codec.offload_uuid(*U1)
U2 = "22222222-2222-4222-8222-222222222222"  # orphan copy of ledger 10
U3 = "33333333-3333-4333-8333-333333333333"  # orphan copy of ledger 11, data object only


CLUSTER = "east"
# What Pulsar's offloader puts on every object: this cluster's name and the managed ledger offloaded.
PULSAR_METADATA = {"role": "data", "ManagedLedgerName": ML, "pulsarClusterName": CLUSTER}


def objects_deleter(s3: Any, zk: KazooClient, **kw: Any) -> ObjectDeleter:
    """Objects made just now (moto cannot backdate them) judged eight days later, as this cluster."""
    kw.setdefault("local_cluster", CLUSTER)
    kw.setdefault("now_ms", int(time.time() * 1000) + 8 * DAY_MS)
    return ObjectDeleter(s3, zk, **kw)


def keys(uuid: str, ledger_id: int) -> list[str]:
    return [f"{uuid}-ledger-{ledger_id}", f"{uuid}-ledger-{ledger_id}-index"]


def orec(uuid: str, ledger_id: int, bucket: str = "offload-a") -> dict[str, Any]:
    return {"topicName": TOPIC, "ledgerComponent": "MANAGED_LEDGER", "ledgerType": "OFFLOAD_LEDGER",
            "ledgerId": ledger_id, "cursorName": None, "schemaId": None,
            "offloadContext": {"uuid": uuid, "bucket": bucket, "region": None, "endpoint": None,
                               "keys": keys(uuid, ledger_id)},
            "properties": {}, "reason": "offload_unreferenced", "runId": "run-1"}


def listing(client: Any, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", []))


@pytest.fixture
def world(zk: KazooClient, s3_server: S3ServerInfo, tmp_path: Path) -> tuple[Any, str, str]:
    # Fresh buckets per test (named after its tmp dir), so tests never see each other's objects.
    suffix = tmp_path.name.lower().replace("_", "-")[-20:].strip("-")
    a, b = f"a-{suffix}", f"b-{suffix}"
    s3 = s3_client(S3Target(a), s3_server.endpoint)
    s3.create_bucket(Bucket=a)
    s3.create_bucket(Bucket=b)
    for key in [*keys(U1_TEXT, 10), *keys(U2, 10), keys(U3, 11)[0]]:
        s3.put_object(Bucket=a, Key=key, Body=b"x", Metadata=PULSAR_METADATA)
    s3.put_object(Bucket=b, Key=keys(U2, 10)[0], Body=b"x", Metadata=PULSAR_METADATA)
    info = codec.pb.ManagedLedgerInfo()
    entry = info.ledgerInfo.add(ledgerId=10, entries=1, size=1, timestamp=1)
    entry.offloadContext.uidMsb, entry.offloadContext.uidLsb, entry.offloadContext.complete = U1[0], U1[1], True
    info.ledgerInfo.add(ledgerId=12, entries=1, size=1, timestamp=1)
    zk.create(f"{ML_ROOT}/{ML}", codec.encode_managed_ledger_info(info), makepath=True)
    return s3, a, b


def with_bucket(record: dict[str, Any], bucket: str) -> dict[str, Any]:
    record["offloadContext"]["bucket"] = bucket
    return record


def test_orphan_copies_deleted_referenced_and_other_buckets_left_alone(
        zk: KazooClient, world: tuple[Any, str, str]) -> None:
    s3, a, b = world
    recs = [with_bucket(orec(U2, 10), a), with_bucket(orec(U3, 11), a), with_bucket(orec(U1_TEXT, 10), a),
            with_bucket(orec(U2, 10), b)]
    before = (listing(s3, a), listing(s3, b))

    dry = objects_deleter(s3, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a})
    assert [r.outcome for r in dry.process(recs)] == [WOULD_DELETE, WOULD_DELETE, IN_USE, INVALID]
    assert (listing(s3, a), listing(s3, b)) == before

    # One key per request: the batching across records must still settle every record.
    live = objects_deleter(s3, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a}, execute=True,
                         max_keys_per_request=1)
    results = live.process(recs)
    assert [r.outcome for r in results] == [DELETED, DELETED, IN_USE, INVALID], [r.detail for r in results]
    assert results[0].s3_keys == keys(U2, 10) and results[1].s3_keys == keys(U3, 11)[:1]
    assert "listed in managed ledger" in results[2].detail and "not one this run" in results[3].detail
    assert listing(s3, a) == sorted(keys(U1_TEXT, 10))
    assert listing(s3, b) == before[1]

    rerun = live.process(recs)
    assert [r.outcome for r in rerun] == [ALREADY_GONE, ALREADY_GONE, IN_USE, INVALID]
    assert listing(s3, a) == sorted(keys(U1_TEXT, 10))


def test_unreadable_managed_ledger_and_unreachable_s3(zk: KazooClient, world: tuple[Any, str, str]) -> None:
    s3, a, _ = world
    zk.set(f"{ML_ROOT}/{ML}", b"\x0a\xff")
    results = objects_deleter(s3, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a}, execute=True).process(
        [with_bucket(orec(U2, 10), a)])
    assert results[0].outcome == IN_USE and "cannot be verified" in results[0].detail
    assert len(listing(s3, a)) == 5

    dead = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{free_port()}", region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="x",
                        config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=1))
    results = objects_deleter(dead, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a}, execute=True).process(
        [with_bucket(orec(U2, 10), a)])
    assert results[0].outcome == FAILED and "EndpointConnectionError" in (results[0].error or "")


@pytest.fixture
def faulty(s3_server: S3ServerInfo) -> Iterator[S3FaultProxy]:
    proxy = S3FaultProxy(s3_server.endpoint).start()
    yield proxy
    proxy.stop()


def test_per_key_throttling_fails_only_that_record_and_a_retry_deletes_it(
        zk: KazooClient, world: tuple[Any, str, str], faulty: S3FaultProxy) -> None:
    s3, a, _ = world
    # S3 answers DeleteObjects 200 OK with one key refused (SlowDown) the first time.
    faulty.faults[keys(U2, 10)[1]] = KeyFault("SlowDown", times=1)
    through_proxy = s3_client(S3Target(a), faulty.endpoint)
    deleter = objects_deleter(through_proxy, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a}, execute=True)
    recs = [with_bucket(orec(U2, 10), a), with_bucket(orec(U3, 11), a)]
    policy = RetryPolicy(in_task_attempts=3, base_delay_s=0.01, max_delay_s=0.02)

    first = deleter.process(recs)
    assert [r.outcome for r in first] == [FAILED, DELETED]
    assert "SlowDown (transient)" in (first[0].error or "") and keys(U2, 10)[1] in (first[0].error or "")
    assert keys(U2, 10)[1] in listing(s3, a)  # the refused key is still there, so the record is not done

    faulty.faults[keys(U2, 10)[1]] = KeyFault("SlowDown", times=1)
    sleeps: list[float] = []
    retried = run_with_retries(deleter.process, recs, policy, sleep=sleeps.append)
    # Round 1: U2's data key is already gone and its index key throttled again; round 2 deletes it.
    assert [(r.outcome, r.attempt) for r in retried] == [(DELETED, 2), (ALREADY_GONE, 1)]
    assert len(sleeps) == 1 and faulty.refused == [keys(U2, 10)[1]] * 2
    assert listing(s3, a) == sorted(keys(U1_TEXT, 10))


def test_per_key_access_denied_is_failed_and_nothing_is_claimed_deleted(
        zk: KazooClient, world: tuple[Any, str, str], faulty: S3FaultProxy) -> None:
    s3, a, _ = world
    for key in keys(U2, 10):
        faulty.faults[key] = KeyFault("AccessDenied")
    deleter = objects_deleter(s3_client(S3Target(a), faulty.endpoint), zk, managed_ledgers_root=ML_ROOT,
                            allowed_buckets={a}, execute=True)
    results = deleter.process([with_bucket(orec(U2, 10), a)])  # every key of the request refused
    assert results[0].outcome == FAILED and results[0].error is not None
    assert results[0].error.count("AccessDenied (refused)") == 2
    assert set(keys(U2, 10)) <= set(listing(s3, a))
    assert not is_transient_code("AccessDenied") and is_transient_code("SlowDown")


def test_an_offload_a_shadow_topic_still_lists_is_kept(zk: KazooClient, world: tuple[Any, str, str]) -> None:
    s3, a, _ = world
    shadow_ml = f"{ML}-shadow"
    info = codec.pb.ManagedLedgerInfo()
    entry = info.ledgerInfo.add(ledgerId=10, entries=1, size=1, timestamp=1)
    msb, lsb = (int(U2.replace("-", "")[:16], 16), int(U2.replace("-", "")[16:], 16))
    entry.offloadContext.uidMsb = msb - (1 << 64) if msb >= 1 << 63 else msb
    entry.offloadContext.uidLsb = lsb - (1 << 64) if lsb >= 1 << 63 else lsb
    assert codec.offload_uuid(entry.offloadContext.uidMsb, entry.offloadContext.uidLsb) == U2
    zk.create(f"{ML_ROOT}/{shadow_ml}", codec.encode_managed_ledger_info(info), makepath=True)
    rec = with_bucket(orec(U2, 10), a)
    blind = objects_deleter(s3, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a})
    assert blind.process([rec])[0].outcome == WOULD_DELETE  # the shadow's listing is what keeps it
    aware = objects_deleter(s3, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a}, execute=True,
                          shadows={ML: [shadow_ml]})
    result = aware.process([rec])[0]
    assert result.outcome == IN_USE and shadow_ml in result.detail
    assert set(keys(U2, 10)) <= set(listing(s3, a))


def test_an_offload_record_deletes_only_objects_that_name_this_cluster_and_its_managed_ledger(
        zk: KazooClient, world: tuple[Any, str, str]) -> None:
    # Issue 11 (4): a record for a live (uuid, ledger) pair under a wrong or made-up topic finds no referrer
    # there; only the objects' own user metadata ties the record to them.
    s3, a, _ = world
    forged = with_bucket(orec(U2, 10), a)
    forged["topicName"] = "persistent://t/ns/no-such-topic"
    peer = "55555555-5555-4555-8555-555555555555"  # a geo-replicated peer's objects in the shared bucket
    for key in keys(peer, 10):
        s3.put_object(Bucket=a, Key=key, Body=b"x", Metadata={**PULSAR_METADATA, "pulsarClusterName": "west"})
    bare = "66666666-6666-4666-8666-666666666666"  # no owner metadata at all
    for key in keys(bare, 10):
        s3.put_object(Bucket=a, Key=key, Body=b"x")
    before = listing(s3, a)
    live = objects_deleter(s3, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a}, execute=True)
    results = live.process([forged, with_bucket(orec(peer, 10), a), with_bucket(orec(bare, 10), a)])
    assert [r.outcome for r in results] == [MISMATCH] * 3, [r.detail for r in results]
    assert "ManagedLedgerName" in results[0].detail and "west" in results[1].detail
    assert listing(s3, a) == before
    # The grace period applies to the objects' own age too (they were written just now).
    young = objects_deleter(s3, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a}, execute=True,
                            now_ms=int(time.time() * 1000))
    assert [r.outcome for r in young.process([with_bucket(orec(U2, 10), a)])] == [IN_USE]
    assert listing(s3, a) == before
    # Nor may an unconfigured cluster name match an object without one.
    anonymous = objects_deleter(s3, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a}, execute=True,
                                local_cluster="")
    assert [r.outcome for r in anonymous.process([with_bucket(orec(U2, 10), a)])] == [MISMATCH]


def test_a_bookkeeper_copy_goes_only_with_its_offloaded_copy(world: tuple[Any, str, str],
                                                              s3_server: S3ServerInfo) -> None:
    # Issue 26 (7): the delete HEADs both objects of the copy that replaces the BookKeeper ledger.
    from sweeper.connections import ZooKeeperEndpoint
    from sweeper.delete.settings import DeleteTarget
    from sweeper.delete.tasks import offload_checker

    s3, a, _ = world
    target = DeleteTarget(
        bookkeeper=ZooKeeperEndpoint("", 1.0), ledgers_root="/ledgers", layout="hierarchical", ml_root=ML_ROOT,
        schemas_root="/schemas", min_age_ms=0, now_ms=None, execute=True, batch_size=1, deletes_per_second=1.0,
        op_timeout_s=1.0, multi_read=1, policy=RetryPolicy(), endpoint_override=s3_server.endpoint, buckets=(),
        local_cluster=CLUSTER, offload_enabled=True)
    check = offload_checker(target)
    assert check is not None
    assert check(a, "", "", tuple(keys(U1_TEXT, 10)), ML) is None  # both objects, ours, this managed ledger
    assert "NoSuchKey" in (check(a, "", "", tuple(keys(U3, 11)), ML) or "") or "404" in (
        check(a, "", "", tuple(keys(U3, 11)), ML) or "")  # the index object is missing
    assert "ManagedLedgerName" in (check(a, "", "", tuple(keys(U1_TEXT, 10)), "t/ns/persistent/other") or "")
    s3.put_object(Bucket=a, Key=keys(U2, 12)[0], Body=b"x", Metadata={**PULSAR_METADATA, "pulsarClusterName": "west"})
    s3.put_object(Bucket=a, Key=keys(U2, 12)[1], Body=b"x", Metadata=PULSAR_METADATA)
    assert "pulsarClusterName" in (check(a, "", "", tuple(keys(U2, 12)), ML) or "")
    assert offload_checker(DeleteTarget(**{**target.__dict__, "offload_enabled": False})) is None


def test_an_offload_record_of_a_namespace_denied_today_or_a_protected_topic_is_refused(
        zk: KazooClient, world: tuple[Any, str, str]) -> None:
    # Issue 26 (4): a record is a request; the object deleter applies today's scope and protection
    # (sweeper.rules.owner).
    from sweeper.delete.results import REFUSED
    from sweeper.rules.classify import Sharing
    from sweeper.rules.owner import ActingRules
    from sweeper.rules.safety import Scope

    s3, a, _ = world
    denied = ActingRules(scope=Scope(deny=("t/ns",)), sharing=Sharing.DEDICATED)
    results = objects_deleter(s3, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a}, execute=True,
                              rules=denied).process([with_bucket(orec(U2, 10), a)])
    assert [r.outcome for r in results] == [REFUSED] and results[0].detail.startswith("out_of_scope")
    assert set(keys(U2, 10)) <= set(listing(s3, a))
    # Offloaded objects name their cluster: an unverified shared BookKeeper is not their rule.
    allowed = objects_deleter(s3, zk, managed_ledgers_root=ML_ROOT, allowed_buckets={a}, rules=ActingRules())
    assert [r.outcome for r in allowed.process([with_bucket(orec(U2, 10), a)])] == [WOULD_DELETE]
