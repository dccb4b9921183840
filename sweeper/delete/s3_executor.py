"""Delete orphan offloaded copies (tiered storage objects) after re-checking their managed ledger.

S3 has no compare-and-set across a ZooKeeper znode, so the guard is the re-read just before the
delete: Pulsar never re-references an offload uuid once it has dropped it (each offload attempt
draws a new uuid), so an unreferenced (uuid, ledger) pair stays unreferenced.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from sweeper.codecs import pulsar as codec
from sweeper.codecs.errors import MetadataDecodeError
from sweeper.delete import decide
from sweeper.delete.decide import LiveObject, ReferrerState, managed_ledger_name
from sweeper.delete.results import (
    ALREADY_GONE,
    ANSWER_LOST,
    DELETED,
    FAILED,
    REFUSED,
    WOULD_DELETE,
    DeleteResult,
    answer_lost_deleted,
    result_for,
)
from sweeper.delete.retry import is_transient, is_transient_code
from sweeper.objectstore.s3 import object_metadata
from sweeper.rules.owner import ActingRules, Owner, refusal
from sweeper.vocabulary import DAY_MS
from sweeper.zk import client as zkutil

MAX_KEYS_PER_REQUEST = 1000  # S3's DeleteObjects limit
_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code')}: {error.get('Message') or exc}"
    return f"{type(exc).__name__}: {exc}"


@dataclass
class _Pending:
    index: int
    record: Mapping[str, Any]
    bucket: str
    keys: list[str]
    started: float


class ObjectDeleter:
    def __init__(
        self,
        s3_client: Any,
        zk_client: KazooClient,
        *,
        managed_ledgers_root: str = "/managed-ledgers",
        allowed_buckets: Collection[str],
        execute: bool = False,
        op_timeout_s: float = 10.0,
        max_keys_per_request: int = MAX_KEYS_PER_REQUEST,
        shadows: Mapping[str, Sequence[str]] | None = None,
        local_cluster: str = "",
        min_age_ms: int = 7 * DAY_MS,
        now_ms: int | None = None,
        rules: ActingRules | None = None,
    ) -> None:
        if not 1 <= max_keys_per_request <= MAX_KEYS_PER_REQUEST:
            raise ValueError(f"max_keys_per_request must be in 1..{MAX_KEYS_PER_REQUEST}")
        self.s3 = s3_client
        self.zk = zk_client
        self.ml_root = "/" + managed_ledgers_root.strip("/")
        self.allowed_buckets = frozenset(allowed_buckets)
        self.execute = execute
        self.op_timeout_s = op_timeout_s
        self.max_keys = max_keys_per_request
        # Source managed ledger -> its shadow topics' managed ledgers, which may list the same offloads.
        self.shadows = {k: tuple(v) for k, v in (shadows or {}).items()}
        # Objects must carry this cluster's pulsarClusterName and be past the grace period by their own age.
        self.local_cluster = local_cluster
        self.min_age_ms = min_age_ms
        self.now_ms = now_ms
        # Today's scope and protection (sweeper.rules.owner); objects name their cluster (pulsarClusterName, written by
        # BlobStoreManagedLedgerOffloader from LedgerOffloader.METADATA_PULSAR_CLUSTER_NAME), so sharing is not asked.
        self.rules = rules
        # (bucket, key) -> the error that took the answer to its DeleteObjects: sent, maybe applied (DESIGN.md
        # invariant 18). Kept across the in-task retries, whose re-verification files such a record, its objects
        # gone, as `deleted` by this run rather than `already_gone`.
        self.answer_lost: dict[tuple[str, str], str] = {}

    def process(self, records: Sequence[Mapping[str, Any]]) -> list[DeleteResult]:
        """One result per record, in input order; never raises for an S3 or ZooKeeper error."""
        results: list[DeleteResult | None] = [None] * len(records)
        pending: list[_Pending] = []
        offloads: dict[str, Any] = {}  # ML path -> decoded info (or the exception met reading it)
        for index, record in enumerate(records):
            started = time.monotonic()
            try:
                result = self._verify(index, record, offloads, started, pending)
            except Exception as exc:  # per record: one bad read must not sink the others
                detail = "could not verify" if is_transient(exc) else "could not verify (unexpected error)"
                result = result_for(record, FAILED, detail, error=_error_text(exc))
            if result is not None:
                result.duration_ms = int((time.monotonic() - started) * 1000)
                results[index] = result
        for index, result in self._delete(pending).items():
            results[index] = result
        return [r for r in results if r is not None]

    def _verify(self, index: int, record: Mapping[str, Any], offloads: dict[str, Any], started: float,
                pending: list[_Pending]) -> DeleteResult | None:
        early = decide.check_object(record, self.allowed_buckets)
        if early is not None:
            return result_for(record, early.outcome, early.detail)
        context = record["offloadContext"]
        bucket = context["bucket"]
        live = [obj for obj in (self._head(bucket, key) for key in context["keys"]) if obj is not None]
        present = [obj.key for obj in live]
        referrer = self._referrer(record, offloads)
        now = self.now_ms if self.now_ms is not None else int(time.time() * 1000)
        decision = decide.decide_object(record, live, referrer, self.allowed_buckets, self.local_cluster, now,
                                        self.min_age_ms)
        lost = [self.answer_lost[(bucket, key)] for key in context["keys"] if (bucket, key) in self.answer_lost]
        if decision.outcome == ALREADY_GONE and lost:
            # Our own DeleteObjects went through: its answer was lost, and nothing but this run deletes an orphan.
            return result_for(record, DELETED, answer_lost_deleted(lost[0]), s3_keys=list(context["keys"]))
        if not decision.delete:
            return result_for(record, decision.outcome, decision.detail)
        if self.rules is not None:
            owner = Owner.of_record(record.get("topicName"), None, None)
            found = refusal(owner, self.rules, owner_exists=referrer.owner_exists, bookkeeper=False)
            if found is not None:
                return result_for(record, REFUSED, f"{found[0]}: {found[1]}")
        if not self.execute:
            return result_for(record, WOULD_DELETE, decision.detail, s3_keys=present)
        pending.append(_Pending(index, record, bucket, present, started))
        return None

    def _head(self, bucket: str, key: str) -> LiveObject | None:
        """The object as S3 holds it now (user metadata and age), or None when it is gone."""
        try:
            head = self.s3.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING_CODES:
                return None
            raise
        return LiveObject(key, int(head["LastModified"].timestamp() * 1000), object_metadata(head))

    def _referrer(self, record: Mapping[str, Any], offloads: dict[str, Any]) -> ReferrerState:
        ml_name = managed_ledger_name(record.get("topicName"))
        if ml_name is None:
            return ReferrerState(unverifiable=f"no managed ledger for topic {record.get('topicName')!r}")
        refs: list[str] = []
        for name in (ml_name, *self.shadows.get(ml_name, ())):
            state = self._listing(name, record, offloads)
            if state.unverifiable:
                return state
            refs.extend(state.references)
        return ReferrerState(tuple(refs), owner_exists=offloads.get(zkutil.join(self.ml_root, ml_name)) is not None)

    def _listing(self, ml_name: str, record: Mapping[str, Any], offloads: dict[str, Any]) -> ReferrerState:
        """Whether one managed ledger lists the record's offloaded copy."""
        path = zkutil.join(self.ml_root, ml_name)
        if path not in offloads:
            try:
                data, _ = self.zk.get_async(path).get(timeout=self.op_timeout_s)
                offloads[path] = codec.decode_managed_ledger_info(data)
            except NoNodeError:
                offloads[path] = None
            except MetadataDecodeError as exc:
                offloads[path] = exc
        info = offloads[path]
        if info is None:
            return ReferrerState()
        if isinstance(info, MetadataDecodeError):
            return ReferrerState(unverifiable=decide.unreadable(f"managed ledger {ml_name}", info))
        ledger_id, uuid = record["ledgerId"], record["offloadContext"]["uuid"]
        refs = [
            f"offload {uuid} of ledger {ledger_id} listed in managed ledger {ml_name}"
            for entry in info.ledgerInfo
            if entry.ledgerId == ledger_id and entry.HasField("offloadContext")
            and codec.offload_uuid(entry.offloadContext.uidMsb, entry.offloadContext.uidLsb) == uuid
        ]
        return ReferrerState(tuple(refs))

    def _delete(self, pending: list[_Pending]) -> dict[int, DeleteResult]:
        """Batched DeleteObjects across records; a record is deleted only when every key of it is gone."""
        errors: dict[tuple[str, str], str] = {}
        by_bucket: dict[str, dict[str, None]] = {}  # insertion-ordered sets: a key once per request
        for item in pending:
            by_bucket.setdefault(item.bucket, {}).update(dict.fromkeys(item.keys))
        for bucket, unique in by_bucket.items():
            keys = list(unique)
            for start in range(0, len(keys), self.max_keys):
                chunk = keys[start:start + self.max_keys]
                errors.update(self._delete_chunk(bucket, chunk))
        out: dict[int, DeleteResult] = {}
        for item in pending:
            failures = [f"{key}: {errors[(item.bucket, key)]}" for key in item.keys if (item.bucket, key) in errors]
            if failures and all((item.bucket, key) in self.answer_lost for key in item.keys
                                 if (item.bucket, key) in errors):
                result = result_for(item.record, FAILED, ANSWER_LOST, error="; ".join(failures), s3_keys=item.keys)
            elif failures:
                result = result_for(item.record, FAILED, "not every object was deleted", error="; ".join(failures),
                                    s3_keys=item.keys)
            else:
                result = result_for(item.record, DELETED, f"deleted {len(item.keys)} object(s)", s3_keys=item.keys)
            result.duration_ms = int((time.monotonic() - item.started) * 1000)
            out[item.index] = result
        return out

    def _delete_chunk(self, bucket: str, keys: list[str]) -> dict[tuple[str, str], str]:
        """Errors by (bucket, key) for keys that may still exist."""
        try:
            response = self.s3.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": False})
        except Exception as exc:
            if _maybe_applied(exc):
                # No answer (a timeout, a dropped connection) or a 5xx after boto3's own retries: S3 may have
                # deleted them (DeleteObjects is idempotent; a retry of it answers a key already gone as deleted).
                for k in keys:
                    self.answer_lost.setdefault((bucket, k), _error_text(exc))
            return {(bucket, k): _error_text(exc) for k in keys}
        done = {d["Key"] for d in response.get("Deleted", [])}
        errors: dict[tuple[str, str], str] = {}
        for error in response.get("Errors", []):
            code = error.get("Code")
            if code in _MISSING_CODES:
                done.add(error["Key"])
                continue
            kind = "transient" if is_transient_code(code) else "refused"
            errors[(bucket, error["Key"])] = f"{code} ({kind}): {error.get('Message', '')}"
        for key in keys:
            if key not in done and (bucket, key) not in errors:
                errors[(bucket, key)] = "no answer for this key in the DeleteObjects response"
        return errors


def _maybe_applied(exc: BaseException) -> bool:
    """Whether a DeleteObjects that raised may still have been applied: anything but S3's 4xx answer, which refuses
    the request as a whole (AccessDenied, NoSuchBucket, a bad signature) before deleting a key."""
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return not (isinstance(status, int) and 400 <= status < 500)
    # No connection was ever made: the request never left this host.
    return not isinstance(exc, EndpointConnectionError | ConnectTimeoutError)
