"""A lost answer is an unknown outcome, not a failure (DESIGN.md invariant 18, issue 34 item 1).

A delete can be applied and its answer lost: ZooKeeper applies a multi and the connection drops before the reply
(the client sees ConnectionLoss), Oxia applies a write and the gRPC call fails, S3 deletes the objects and answers
500. The next look at the target (the in-task retry, the next attempt, a task Spark runs again) must file what this
run set out to delete and now finds gone as `deleted` by this run, not `already_gone` ("deleted by someone else").
Each case here runs against the real server with the fault between it and the client: a TCP proxy that forwards a
deleting multi to ZooKeeper and drops the connection before its reply, a gRPC interceptor on the Oxia client's
channel that lets the write reach the server and then fails the call, an HTTP proxy that forwards DeleteObjects to
moto and answers 500.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.oxiaserver import OxiaServerInfo
from harness.s3server import S3ServerInfo
from harness.sandbox.model import SandboxSpec, Status
from sweeper.codecs import pulsar as codec
from sweeper.codecs.layout import LedgerLayout, layout_znode, ledger_path
from sweeper.delete import ALREADY_GONE, DELETED, FAILED, LedgerDeleter, ObjectDeleter
from sweeper.delete.journal import INTENT, OUTCOME, lost_answer_evidence
from sweeper.delete.results import ANSWER_LOST
from sweeper.delete.retry import RetryPolicy, run_with_retries
from sweeper.delete.stage import run_delete
from sweeper.metastore.oxia import OxiaStore
from sweeper.objectstore.s3 import S3Target, s3_client
from sweeper.vocabulary import DAY_MS
from tests.support.broker import Broker
from tests.support.config import ZkTarget
from tests.support.ledgers import ledger_bytes
from tests.support.s3_faults import S3FaultProxy
from tests.support.seeded import orphans_past_grace, planned_delete
from tests.support.zk_faults import ZkFaultProxy

LOST = "the answer to its delete was lost"


# ---- the journal's evidence, on plain rows --------------------------------------------------------------------

def _row(attempt: str, phase: str, key: str, minute: int, outcome: str | None = None,
         detail: str | None = None) -> dict[str, Any]:
    return {"attempt_id": attempt, "phase": phase, "record_key": key, "outcome": outcome, "detail": detail,
            "at": datetime(2026, 11, 27, 12, tzinfo=UTC) + timedelta(minutes=minute)}


def test_the_evidence_that_a_delete_of_ours_may_have_been_sent() -> None:
    """Which journal rows make a target found gone this run's deletion, and which leave it `already_gone`."""
    rows = [
        # A: answer lost in attempt a1; a2 (this attempt) finds it gone.
        _row("r@a1", INTENT, "LEDGER/1", 0), _row("r@a1", OUTCOME, "LEDGER/1", 1, FAILED, ANSWER_LOST),
        _row("r@a2", INTENT, "LEDGER/1", 10), _row("r@a2", OUTCOME, "LEDGER/1", 11, ALREADY_GONE, "no znode"),
        # B: answer lost, then a later attempt settled it (final): the story ended; a2's `already_gone` stands.
        _row("r@a0", OUTCOME, "LEDGER/2", 0, FAILED, ANSWER_LOST), _row("r@a1", OUTCOME, "LEDGER/2", 1, "in_use"),
        _row("r@a2", INTENT, "LEDGER/2", 10), _row("r@a2", OUTCOME, "LEDGER/2", 11, ALREADY_GONE, "no znode"),
        # C: answer lost, then retries that failed otherwise (ZooKeeper down): still ours.
        _row("r@a0", OUTCOME, "LEDGER/3", 0, FAILED, ANSWER_LOST),
        _row("r@a1", OUTCOME, "LEDGER/3", 1, FAILED, "could not verify"),
        _row("r@a2", INTENT, "LEDGER/3", 10), _row("r@a2", OUTCOME, "LEDGER/3", 11, ALREADY_GONE, "no znode"),
        # D: Spark ran the task again in a2: the first execution journalled its intent and stopped.
        _row("r@a2", INTENT, "LEDGER/4", 10), _row("r@a2", INTENT, "LEDGER/4", 12),
        _row("r@a2", OUTCOME, "LEDGER/4", 13, ALREADY_GONE, "no znode"),
        # E: the first execution of a2 deleted it and journalled that; its result never reached the driver.
        _row("r@a2", INTENT, "LEDGER/5", 10), _row("r@a2", OUTCOME, "LEDGER/5", 11, DELETED, "deleted"),
        _row("r@a2", INTENT, "LEDGER/5", 12), _row("r@a2", OUTCOME, "LEDGER/5", 13, ALREADY_GONE, "no znode"),
        # F: an intent and its outcome, one execution: an intent alone proves nothing (written before verifying).
        _row("r@a2", INTENT, "LEDGER/6", 10), _row("r@a2", OUTCOME, "LEDGER/6", 11, ALREADY_GONE, "no znode"),
        # G: an earlier attempt stopped after its intent (the fold re-verified it): no evidence either.
        _row("r@a1", INTENT, "LEDGER/7", 0),
        _row("r@a2", INTENT, "LEDGER/7", 10), _row("r@a2", OUTCOME, "LEDGER/7", 11, ALREADY_GONE, "no znode"),
        # H: as A, but a deletion of it is already on record: recorded once.
        _row("r@a1", OUTCOME, "LEDGER/8", 1, FAILED, ANSWER_LOST),
        _row("r@a2", INTENT, "LEDGER/8", 10), _row("r@a2", OUTCOME, "LEDGER/8", 11, ALREADY_GONE, "no znode"),
    ]
    found = lost_answer_evidence(rows, "r@a2", deleted_on_record=["LEDGER/8"])
    assert set(found) == {"LEDGER/1", "LEDGER/3", "LEDGER/4", "LEDGER/5"}
    assert found["LEDGER/1"][0] == "r@a1" and found["LEDGER/3"][0] == "r@a0"
    assert found["LEDGER/4"][0] == found["LEDGER/5"][0] == "r@a2"
    assert "intent, never its outcome" in found["LEDGER/4"][1]


# ---- ZooKeeper: the delete stage through a proxy that loses the answers of deleting multis ----------------------

def _results(store: Any, run_id: str) -> list[dict[str, Any]]:
    return store.read_arrow("delete_results", where={"run_id": run_id, "dry_run": False}).to_pylist()


@pytest.mark.parametrize("in_task_attempts", [3, 1], ids=["in-task-retry", "next-attempt"])
def test_a_multi_applied_whose_answer_was_lost_is_deleted_by_this_run(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path, broker: Broker,
        in_task_attempts: int) -> None:
    """The whole delete stage (its driver, its Spark task's kazoo session and bulk reader) talks to ZooKeeper
    through the proxy, which lets the first two deleting multis through and drops the connection before their
    replies. kazoo fails them with ConnectionLoss and resumes its session on a new connection. With in-task
    retries the retry re-verifies them; with one attempt per task they wait in the retry queue and the next
    `delete --execute` re-verifies them. Either way: every ledger of a dropped multi is `deleted` by this run,
    every orphan has exactly one `deleted` row, nothing is `already_gone`, and nothing in use is touched."""
    spec = SandboxSpec(seed=5, topics=30)
    cluster, cfg, store, run_id = planned_delete(zk, zk_target.hosts, spark, tmp_path, broker, spec)
    orphans = orphans_past_grace(cluster)
    in_use = [i for i, x in cluster.ledgers.items() if x.status is Status.IN_USE]
    by_path = {zk_target.chroot + ledger_path(spec.ledgers_root, i, spec.layout): i for i in cluster.ledgers}
    proxy = ZkFaultProxy((zk_target.server.host, zk_target.server.port), drop_multis=2).start()
    try:
        cfg = cfg.replace(bookkeeper={"zookeeper": proxy.hosts(zk_target.chroot)},
                          delete={"batch_size": 10, "in_task_attempts": in_task_attempts, "retry_after_s": 0,
                                  "op_timeout_s": 5.0})
        started = time.monotonic()
        first = run_delete(spark, cfg, store, run_id, execute=True)
        runs = [first]
        while runs[-1].counts.queued_for_retry and len(runs) < 4:
            runs.append(run_delete(spark, cfg, store, run_id, execute=True))
        took = time.monotonic() - started
    finally:
        proxy.stop()
    assert len(proxy.dropped) == 2 and proxy.connections > 1, (proxy.dropped, proxy.connections)
    lost = {by_path[p] for paths in proxy.dropped for p in paths}
    # Two whole multis lost, each of at most batch_size ledgers (a group's last batch may hold fewer: CI once saw
    # 10 + 9, the records' order after the emitted rows' de-duplication being Spark's), all of them orphans.
    assert all(1 <= len(paths) <= 10 for paths in proxy.dropped) and len(lost) == sum(map(len, proxy.dropped))
    assert lost <= orphans
    if in_task_attempts == 1:
        assert first.counts.queued_for_retry >= len(lost) and len(runs) > 1
    rows = _results(store, run_id)
    deleted: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        if row["outcome"] == DELETED:
            deleted.setdefault(row["ledger_id"], []).append(row)
    assert not [r for r in rows if r["outcome"] == ALREADY_GONE], [
        (r["ledger_id"], r["detail"]) for r in rows if r["outcome"] == ALREADY_GONE]
    assert set(deleted) == orphans and all(len(v) == 1 for v in deleted.values())
    assert all(LOST in deleted[i][0]["detail"] for i in lost), [deleted[i][0]["detail"] for i in lost]
    for ledger in in_use:
        assert zk.exists(ledger_path(spec.ledgers_root, ledger, spec.layout)), ledger
    for ledger in orphans:
        assert not zk.exists(ledger_path(spec.ledgers_root, ledger, spec.layout)), ledger
    print(f"\n{len(orphans)} orphans, {len(lost)} in dropped multis, {len(runs)} delete run(s), {took:.1f} s")


# ---- Oxia: the write reaches the server, the call fails --------------------------------------------------------

class _Unavailable(grpc.RpcError):
    """What the gRPC runtime raises for a call whose connection went before its answer came."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "Connection reset by peer (injected after the server answered)"


class LoseWriteAnswers(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """On the Oxia client's own channel: the first `times` Write calls that delete are sent, and the server's
    answer is awaited (it applied them), then the call fails UNAVAILABLE as if the connection dropped."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.lost: list[str] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = continuation(details, request)
        if details.method.endswith("/Write") and list(request.deletes) and self.times > 0:
            call.result()  # the server applied the delete and answered
            self.times -= 1
            self.lost += [d.key for d in request.deletes]
            raise _Unavailable()
        return call


def _intercept(store: OxiaStore, interceptor: grpc.UnaryUnaryClientInterceptor) -> None:
    from oxia.internal.proto.io.streamnative.oxia.proto import OxiaClientStub

    pool = store._client._connections
    with pool._lock:
        for address, (channel, _) in list(pool.connections.items()):
            pool.connections[address] = (channel, OxiaClientStub(grpc.intercept_channel(channel, interceptor)))


def test_on_oxia_a_delete_applied_whose_call_failed_is_deleted_by_this_run(oxia_server: OxiaServerInfo) -> None:
    """The Oxia deleter (one ledger per compare-and-set) on a real server, with the client's gRPC channel failing
    the first two deleting Write calls UNAVAILABLE after the server applied them: the store reports a lost answer
    (kazoo's ConnectionLoss), the in-task retry re-verifies and files both `deleted` by this run; the third
    ledger is deleted as usual."""
    store = OxiaStore(oxia_server.address, "default")
    now = int(time.time() * 1000) + 10 * DAY_MS
    custom = {"application": "pulsar", "component": "managed-ledger", "pulsar/managed-ledger": "t/ns/persistent/a"}
    ledgers = (30, 31, 32)
    try:
        store.create("/ledgers/LAYOUT", layout_znode(LedgerLayout.HIERARCHICAL), makepath=True)
        store.ensure_path("/managed-ledgers/t/ns/persistent")
        store.create("/managed-ledgers/t/ns/persistent/a", codec.encode_managed_ledger_info(
            codec.pb.ManagedLedgerInfo()))
        for ledger in ledgers:
            store.create(ledger_path("/ledgers", ledger, LedgerLayout.HIERARCHICAL),
                         ledger_bytes(custom, ctime=now - 30 * DAY_MS), makepath=True)
        interceptor = LoseWriteAnswers(times=2)
        _intercept(store, interceptor)
        deleter = LedgerDeleter(store, ledgers_root="/ledgers", layout=LedgerLayout.HIERARCHICAL,
                                min_age_ms=7 * DAY_MS, now_ms=lambda: now, execute=True, batch_size=100)
        records = [{"topicName": "persistent://t/ns/a", "ledgerComponent": "MANAGED_LEDGER", "ledgerType": "LEDGER",
                    "ledgerId": ledger, "cursorName": None, "schemaId": None, "offloadContext": None,
                    "properties": {}, "reason": "test", "runId": "run-1"} for ledger in ledgers]
        rounds: list[list[tuple[str, str]]] = []

        def process(batch: list[dict[str, Any]]) -> list[Any]:
            out = deleter.process(batch)
            rounds.append([(r.outcome, r.detail) for r in out])
            return out

        results = run_with_retries(process, records, RetryPolicy(base_delay_s=0.01), sleep=lambda _: None)
        assert [o for o, _ in rounds[0]] == [FAILED, FAILED, DELETED] and rounds[0][0][1] == ANSWER_LOST, rounds
        assert [r.outcome for r in results] == [DELETED] * 3, [(r.outcome, r.detail) for r in results]
        assert [r.attempt for r in results] == [2, 2, 1]
        assert all(LOST in r.detail and "UNAVAILABLE" in r.detail for r in results[:2]), results
        assert LOST not in results[2].detail
        assert len(interceptor.lost) == 2
        assert all(store.exists(ledger_path("/ledgers", i, LedgerLayout.HIERARCHICAL)) is None for i in ledgers)
    finally:
        store.close()


# ---- S3: DeleteObjects applied, answered 500 ---------------------------------------------------------------------

ML = "t/ns/persistent/topic-a"
UUID = "44444444-4444-4444-8444-444444444444"
METADATA = {"role": "data", "ManagedLedgerName": ML, "pulsarClusterName": "east"}


@pytest.fixture
def lossy_s3(s3_server: S3ServerInfo) -> Iterator[S3FaultProxy]:
    proxy = S3FaultProxy(s3_server.endpoint).start()
    yield proxy
    proxy.stop()


def test_an_s3_delete_applied_and_answered_500_is_deleted_by_this_run(
        zk: KazooClient, s3_server: S3ServerInfo, lossy_s3: S3FaultProxy, tmp_path: Path) -> None:
    """moto deletes the objects; the proxy answers each of boto3's tries 500 (the client's own retries meet
    objects already gone, which S3 answers as deleted, so every try must lose its answer). The record fails with
    a lost answer; the in-task retry finds no object left and files it `deleted` by this run."""
    bucket = f"lost-{tmp_path.name.lower().replace('_', '-')[-20:].strip('-')}"
    direct = s3_client(S3Target(bucket), s3_server.endpoint)
    direct.create_bucket(Bucket=bucket)
    keys = [f"{UUID}-ledger-40", f"{UUID}-ledger-40-index"]
    for key in keys:
        direct.put_object(Bucket=bucket, Key=key, Body=b"x", Metadata=METADATA)
    zk.create(f"/managed-ledgers/{ML}", codec.encode_managed_ledger_info(codec.pb.ManagedLedgerInfo()),
              makepath=True)
    record = {"topicName": "persistent://t/ns/topic-a", "ledgerComponent": "MANAGED_LEDGER",
              "ledgerType": "OFFLOAD_LEDGER", "ledgerId": 40, "cursorName": None, "schemaId": None,
              "offloadContext": {"uuid": UUID, "bucket": bucket, "region": None, "endpoint": None, "keys": keys},
              "properties": {}, "reason": "offload_unreferenced", "runId": "run-1"}
    through = s3_client(S3Target(bucket), lossy_s3.endpoint)  # boto3's retries as the delete stage has them
    attempts = through.meta.config.retries["total_max_attempts"]
    lossy_s3.lose_delete_answers = attempts
    deleter = ObjectDeleter(through, zk, allowed_buckets={bucket}, execute=True, local_cluster="east",
                            now_ms=int(time.time() * 1000) + 8 * DAY_MS)
    started = time.monotonic()
    first = deleter.process([record])
    assert first[0].outcome == FAILED and first[0].detail == ANSWER_LOST, (first[0].detail, first[0].error)
    assert "InternalError" in (first[0].error or "") and len(lossy_s3.lost) == attempts
    assert not direct.list_objects_v2(Bucket=bucket).get("Contents")  # moto deleted them on the first try
    results = run_with_retries(deleter.process, [record], RetryPolicy(base_delay_s=0.01), sleep=lambda _: None)
    assert results[0].outcome == DELETED and LOST in results[0].detail, (results[0].outcome, results[0].detail)
    print(f"\nS3 lost answer settled in {time.monotonic() - started:.1f} s")
