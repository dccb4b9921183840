"""The delete's Spark tasks: each takes its share of the records, opens its own clients, and runs the executors
(sweeper.delete.zk_executor, sweeper.delete.s3_executor) chunk by chunk at the configured pace, journalling intents
and outcomes, and stopping for good once a watch (the run lock, a PIP-454 migration) says so."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from botocore.exceptions import ClientError

from sweeper.codecs import pending_delete
from sweeper.codecs.errors import InvalidPendingDelete
from sweeper.codecs.layout import LedgerLayout
from sweeper.delete.decide import LiveObject, object_mismatch, unsupported_store
from sweeper.delete.records import PendingRecord
from sweeper.delete.results import FAILED, INVALID, REFUSED, DeleteResult, result_for
from sweeper.delete.retry import run_with_retries
from sweeper.delete.s3_executor import ObjectDeleter
from sweeper.delete.settings import DeleteTarget
from sweeper.delete.zk_executor import LOCK_LOST, LedgerDeleter, OffloadCheck
from sweeper.names import topic_for_managed_ledger
from sweeper.objectstore.s3 import S3Target, object_metadata, s3_client
from sweeper.ratelimit import TokenBucket
from sweeper.rules.classify import Sharing
from sweeper.run_lock import LockWatch
from sweeper.zk import client as zkutil

# ---- tasks -------------------------------------------------------------------------------------

def _decode(item: PendingRecord) -> tuple[dict[str, Any] | None, str | None]:
    """Well-formed Avro only: the executors validate the fields themselves, after "gone" and "not Pulsar's"."""
    if item.unencodable:
        return None, f"malformed: {item.unencodable}"
    try:
        return pending_delete.decode(item.payload, check=False), None
    except InvalidPendingDelete as exc:
        return None, f"{exc.kind}: {exc}"


def _paced(items: list[Any], per_second: float) -> Iterator[list[Any]]:
    """Chunks of work; after each, the task pays for its records on the token bucket every stage shares, so it
    stays under `per_second` records a second.

    A chunk is paid for after its work, so the bucket banks up to a chunk: the time the work took counts toward
    its budget. With the default one-slice burst it would bank none of it and sleep a whole chunk's worth on top,
    halving the rate whenever ZooKeeper is as slow as the pace (66fcce4)."""
    chunk = max(1, min(int(per_second), 2000))
    bucket = TokenBucket(per_second, burst=chunk, start_full=False)
    for start in range(0, len(items), chunk):
        part = items[start:start + chunk]
        yield part
        if start + chunk < len(items):
            bucket.acquire(len(part))


class Watch(Protocol):
    """A condition re-read before each executor call that may delete; once it says stop, the task stops for good
    (sweeper.metastore.migration.MigrationWatch, sweeper.run_lock.LockWatch)."""

    detail: str | None
    error: str | None

    def stop(self) -> bool: ...


def _stopped(watches: Sequence[Watch]) -> Watch | None:
    return next((w for w in watches if w.stop()), None)


def _run_records(fn: Any, pairs: list[tuple[PendingRecord, dict[str, Any]]], target: DeleteTarget,
                 rng: random.Random, watches: Sequence[Watch] = ()) -> list[tuple[PendingRecord, DeleteResult]]:
    out: list[tuple[PendingRecord, DeleteResult]] = []
    lock = next((w for w in watches if isinstance(w, LockWatch)), None)
    if watches:
        fn = _unless_stopped(fn, watches, lock)
    started = 0
    stopped: Watch | None = None
    for part in _paced(pairs, target.deletes_per_second):
        stopped = _stopped(watches)
        if stopped is not None:
            break  # a migration began, or the lock was lost: what is left is on record below, never journalled
        started += len(part)
        if target.journal is not None:
            target.journal.intents(part)  # on record before any of them can be deleted
        results = run_with_retries(fn, [r for _, r in part], target.policy, rng=rng)
        done = []
        for (item, _), result in zip(part, results, strict=True):
            result.attempt += item.attempts_before
            done.append((item, result))
        if target.journal is not None:
            _failpoint_before_outcomes()
            target.journal.outcomes(done)
        out += done
    if stopped is not None:
        for item, record in pairs[started:]:
            result = _left_alone(record, stopped)
            result.attempt += item.attempts_before
            out.append((item, result))
    return out


def _left_alone(record: Mapping[str, Any], watch: Watch) -> DeleteResult:
    return result_for(record, FAILED, watch.detail or "", error=watch.error)


def _unless_stopped(fn: Any, watches: Sequence[Watch], lock: LockWatch | None) -> Any:
    """`fn`, called only while every watch allows deleting: read again before each call, so an in-task retry round
    after a back-off deletes nothing once a migration began or the lock was lost. A multi that met the lost lock
    tells the lock's watch, so the task's next call is not even tried."""
    def call(records: list[Mapping[str, Any]]) -> list[DeleteResult]:
        stopped = _stopped(watches)
        if stopped is not None:
            return [_left_alone(record, stopped) for record in records]
        results = fn(records)
        if lock is not None:
            lost = next((r for r in results if r.detail == LOCK_LOST), None)
            if lost is not None:
                lock.lost(lost.error or "")
        return results

    return call


# A test failpoint: seconds to wait between a chunk's deletes and the commit of their outcomes, so a kill test
# lands in that window (the case the journal's intents exist for) more often than by chance. Unset: no wait.
FAILPOINT_BEFORE_OUTCOMES_ENV = "SWEEPER_FAILPOINT_BEFORE_OUTCOMES_S"


def _failpoint_before_outcomes() -> None:
    import os

    wait = float(os.environ.get(FAILPOINT_BEFORE_OUTCOMES_ENV) or 0)
    if wait > 0:
        time.sleep(wait)


TaskRow = tuple[str, str, str | None, bytes | None, DeleteResult]


def _store_for_the_task(target: DeleteTarget) -> Any:
    """BookKeeper's store, or on Oxia with Pulsar in a namespace of its own, both behind one client that sends
    each path to its store (the delete's referrers are Pulsar's records, its ledgers BookKeeper's)."""
    client = target.bookkeeper.connect()
    if target.pulsar is None:
        return client
    from sweeper.metastore.oxia_split import SplitStore

    fence_paths = [path for path, _ in target.fence.checks()] if target.fence is not None else []
    return SplitStore(client, target.pulsar.connect(), target.ledgers_root, bookkeeper_paths=fence_paths)


def _reader_for_the_task(target: DeleteTarget) -> Any:
    """The bulk reader that reads each path where `_store_for_the_task` would: ledgers in BookKeeper's store,
    referrers in Pulsar's."""
    reader = target.bookkeeper.wire_reader(target.multi_read)
    if target.pulsar is None:
        return reader
    from sweeper.metastore.oxia_split import SplitReader

    return SplitReader(reader, target.pulsar.wire_reader(target.multi_read), target.ledgers_root)


def delete_partition(items: Iterator[list[PendingRecord]], target: DeleteTarget) -> Iterator[TaskRow]:
    items = [item for group in items for item in group]
    if not items:
        return
    decoded: list[tuple[PendingRecord, dict[str, Any]]] = []
    finished: list[tuple[PendingRecord, DeleteResult]] = []
    for item in items:
        record, problem = _decode(item)
        if record is None:
            finished.append((item, result_for({}, INVALID, f"record refused: {problem}")))
        else:
            decoded.append((item, record))
    rng = random.Random(hash(items[0].record_key))
    client = _store_for_the_task(target)
    # Pulsar's store is `client` itself, or behind it (SplitStore sends the flag's path to Pulsar's namespace).
    watches: list[Watch] = []
    if target.fence is not None:
        # First: a run that lost its lock acts on nothing, whatever the migration flag says.
        watches.append(LockWatch(client, target.fence, target.op_timeout_s))
    if target.migration is not None:
        watches.append(target.migration.watch(client))
    reader: Any = None
    peer_clients: list[Any] = []
    try:
        ledgers = [(i, r) for i, r in decoded if r["ledgerType"] == "LEDGER"]
        if ledgers:
            # Bulk verification reads on a second session; a missing one only makes verification slower.
            with contextlib.suppress(Exception):
                reader = _reader_for_the_task(target)
        objects = [(i, r) for i, r in decoded if r["ledgerType"] != "LEDGER"]
        if ledgers:
            rules, peers = target.rules, []
            try:
                for peer in target.peers:
                    peer_client = peer.connect()
                    peer_clients.append(peer_client)
                    peers.append((peer.hosts, LedgerDeleter(
                        peer_client, ledgers_root=target.ledgers_root, layout=LedgerLayout(target.layout),
                        managed_ledgers_root=target.ml_root, schemas_root=target.schemas_root,
                        min_age_ms=target.min_age_ms, now_ms=target.now_ms, op_timeout_s=target.op_timeout_s)))
            except Exception:  # a peer we cannot read now: nothing it may reference is deleted
                rules = dataclasses.replace(rules, sharing=Sharing.UNVERIFIED)
            deleter = LedgerDeleter(
                client, ledgers_root=target.ledgers_root, layout=LedgerLayout(target.layout),
                managed_ledgers_root=target.ml_root, schemas_root=target.schemas_root, min_age_ms=target.min_age_ms,
                now_ms=target.now_ms, execute=target.execute, batch_size=target.batch_size,
                op_timeout_s=target.op_timeout_s, reader=reader, shadows=dict(target.shadows), rules=rules,
                peers=peers, offload_check=offload_checker(target), never_seen=target.never_seen, fence=target.fence)
            finished += _run_records(deleter.process, ledgers, target, rng, watches)
        by_bucket: dict[str, list[tuple[PendingRecord, dict[str, Any]]]] = {}
        for item, record in objects:
            by_bucket.setdefault((record.get("offloadContext") or {}).get("bucket") or "", []).append((item, record))
        allowed = {b for b, _, _ in target.buckets}
        regions = {b: (region, endpoint) for b, region, endpoint in target.buckets}
        unsupported = dict(target.other_stores)
        for bucket, pairs in sorted(by_bucket.items()):
            why = unsupported_store(bucket, unsupported)
            if why is not None:
                finished += _run_records(lambda records, why=why: [result_for(r, REFUSED, why) for r in records],
                                         pairs, target, rng, watches)
                continue
            region, endpoint = regions.get(bucket, ("", ""))
            s3 = s3_client(S3Target(bucket or "-", region, endpoint), target.endpoint_override)
            objects_deleter = ObjectDeleter(s3, client, managed_ledgers_root=target.ml_root, allowed_buckets=allowed,
                                            execute=target.execute, op_timeout_s=target.op_timeout_s,
                                            shadows=dict(target.shadows), local_cluster=target.local_cluster,
                                            min_age_ms=target.min_age_ms, now_ms=target.now_ms, rules=target.rules)
            # An object store has no multi to carry the fence: the watch reads it before each DeleteObjects call
            # (sweeper.run_lock: the window left is that read and the call).
            finished += _run_records(objects_deleter.process, pairs, target, rng, watches)
    finally:
        if reader is not None:
            reader.close()
        for peer_client in peer_clients:
            zkutil.close(peer_client)
        zkutil.close(client)
    for item, result in finished:
        # The payload travels back only where the retry queue will need it.
        yield (item.record_key, item.source, item.origin_run_id,
               item.payload if result.outcome == FAILED else None, result)


def offload_checker(target: DeleteTarget) -> OffloadCheck | None:
    """Whether a ledger's offloaded copy is whole in its bucket (both objects, non-empty, this cluster's and the
    listing managed ledger's by their own metadata), asked right before its BookKeeper copy is deleted."""
    if not target.offload_enabled:
        return None
    clients: dict[tuple[str, str, str], Any] = {}

    def check(bucket: str, region: str, endpoint: str, keys: tuple[str, ...], ml_name: str) -> str | None:
        if not bucket:
            return "the offload context names no bucket"
        where = (bucket, region, endpoint)
        if where not in clients:
            clients[where] = s3_client(S3Target(bucket, region, endpoint), target.endpoint_override)
        live = []
        for key in keys:
            try:
                head = clients[where].head_object(Bucket=bucket, Key=key)
            except ClientError as exc:
                return f"s3://{bucket}/{key}: {exc.response.get('Error', {}).get('Code', exc)}"
            if not head.get("ContentLength"):
                return f"s3://{bucket}/{key} is empty"
            live.append(LiveObject(key, 0, object_metadata(head)))
        # The rule an offload record's objects must pass (this cluster's, this managed ledger's); age is not asked.
        wrong = object_mismatch({"topicName": topic_for_managed_ledger(ml_name)}, live, target.local_cluster, 0, 0)
        return f"s3://{bucket}/{wrong.detail}" if wrong is not None else None

    return check
