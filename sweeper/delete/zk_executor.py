"""Delete orphan BookKeeper ledgers: re-verify each against ZooKeeper, then delete with compare-and-set.

Verification reads the ledger znode and the znodes that could still reference it (managed
ledger, cursors, schema locator). The delete is a ZooKeeper multi that checks every one of those
referrer znodes at the version just read and deletes the ledger znode at the version just
verified: if Pulsar touched any of them in between, nothing is deleted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    BadVersionError,
    ConnectionClosedError,
    NoAuthError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)

from sweeper import names
from sweeper.codecs import pulsar as codec
from sweeper.codecs.bookkeeper import decode_ledger_metadata
from sweeper.codecs.errors import LayoutError, MetadataDecodeError
from sweeper.codecs.layout import LedgerLayout, is_middle, is_tree_top, ledger_path, tree_depth
from sweeper.delete import decide
from sweeper.delete.decide import DELETE, LiveLedger, ReferrerState, managed_ledger_name
from sweeper.delete.results import (
    ALREADY_GONE,
    ANSWER_LOST,
    DELETED,
    FAILED,
    IN_USE,
    INVALID,
    REFUSED,
    WOULD_DELETE,
    DeleteResult,
    answer_lost_deleted,
    result_for,
)
from sweeper.delete.retry import is_transient
from sweeper.delete.zk_reads import WHY_READ, Read, _needs_bookkeeper_copy, _Reads, _released_copies
from sweeper.metastore.oxia import capabilities_of
from sweeper.rules.classify import CompactionPointer, CompactionRef, compaction_reference
from sweeper.rules.owner import OTHER_CLUSTER, PROTECTED, ActingRules, Owner, refusal
from sweeper.rules.protection import cursor_protection, describe
from sweeper.run_lock import Fence, LockWatch
from sweeper.vocabulary import BUCKET_PREFIX, COMPACTED_TOPIC_LEDGER, COMPACTION_CURSOR
from sweeper.zk import client as zkutil
from sweeper.zk.errors import ZooKeeperPermissionError

NowMs = int | Callable[[], int]
NOT_ATTEMPTED = "not attempted: a missing ZooKeeper permission stopped the run"
# The run's lock is not its own any more (sweeper.run_lock): nothing more is deleted, by this task or any other.
LOCK_LOST = LockWatch.detail_when_lost


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@dataclass
class Verified:
    """A ledger found deletable, with everything its compare-and-set delete must check."""

    index: int
    record: Mapping[str, Any]
    path: str
    version: int
    checks: tuple[tuple[str, int], ...]
    detail: str
    started: float = field(default_factory=time.monotonic)


OffloadCheck = Callable[[str, str, str, tuple[str, ...], str], str | None]


class LedgerDeleter:
    def __init__(
        self,
        client: KazooClient,
        *,
        ledgers_root: str,
        layout: LedgerLayout,
        managed_ledgers_root: str = "/managed-ledgers",
        schemas_root: str = "/schemas",
        min_age_ms: int,
        now_ms: NowMs | None = None,
        execute: bool = False,
        batch_size: int = 100,
        op_timeout_s: float = 10.0,
        reader: zkutil.ZnodeReader | None = None,
        shadows: Mapping[str, Sequence[str]] | None = None,
        rules: ActingRules | None = None,
        peers: Sequence[tuple[str, LedgerDeleter]] = (),
        offload_check: OffloadCheck | None = None,
        never_seen: frozenset[int] = frozenset(),
        fence: Fence | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.client = client
        self.ledgers_root = "/" + ledgers_root.strip("/")
        self.layout = layout
        self.ml_root = "/" + managed_ledgers_root.strip("/")
        self.schemas_root = "/" + schemas_root.strip("/")
        self.min_age_ms = min_age_ms
        self._now: Callable[[], int] = now_ms if callable(now_ms) else (
            _wall_ms if now_ms is None else (lambda: int(now_ms)))  # type: ignore[arg-type]
        self.execute = execute
        self.batch_size = batch_size
        # Sync kazoo calls wait forever while the session is reconnecting; a task must fail and retry instead.
        self.op_timeout_s = op_timeout_s
        # Optional bulk reader for verification (e.g. sweeper.zk.wire.WireReader with multiRead): many
        # reads per request. Writes always go through `client`, whose multi checks every version read.
        self.reader = reader
        # Source managed ledger -> its shadow topics' managed ledgers (PIP-180), which list the
        # source's ledgers: each is a referrer to re-read, as reconcile counted them.
        self.shadows = {k: tuple(v) for k, v in (shadows or {}).items()}
        # A NoAuth refuses the whole run: once met, nothing more is deleted (the driver stops the run).
        self.refusal: str | None = None
        # Today's rules (sweeper.rules.owner), re-applied to every record whatever planned it; None only for callers
        # that test the re-verification alone.
        self.rules = rules
        # Every other cluster writing to these bookies ([safety] peer_metadata): (name, a read-only deleter on its
        # metadata store). Their referrers are read right before the delete; no multi spans two ensembles, but
        # Pulsar never references an old unreferenced ledger again, so a fresh read closes the snapshot's gap.
        self.peers = tuple(peers)
        # (bucket, region, endpoint, keys, managed ledger) -> why the offloaded copy is not whole, or None.
        self.offload_check = offload_check
        # Operator-listed ids that no snapshot of the tables lists: with no znode either, a likely typo.
        self.never_seen = never_seen
        # Ledger path -> the error that took the answer to its delete: sent, maybe applied (DESIGN.md invariant 18).
        # Kept for the deleter's life, which spans the in-task retries (run_with_retries calls the same `process`):
        # a re-verification that finds such a ledger gone files it `deleted` by this run, not `already_gone`.
        self.answer_lost: dict[str, str] = {}
        # The run lock's fence (DESIGN.md invariant 22): its checks lead every multi, so a run whose session expired
        # or whose lock another run took deletes nothing more. `lock_lost` says why once a multi met that.
        self.fence = fence
        self.lock_lost: str | None = None

    @property
    def stopped(self) -> str | None:
        """Why nothing more may be deleted by this deleter (a refusal, or the lock lost), or None."""
        return self.refusal or self.lock_lost

    def _not_attempted(self) -> str:
        return LOCK_LOST if self.lock_lost is not None and self.refusal is None else NOT_ATTEMPTED

    # ---- the whole job ---------------------------------------------------------------------

    def process(self, records: Sequence[Mapping[str, Any]]) -> list[DeleteResult]:
        """One result per record, in input order; never raises for a ZooKeeper error."""
        verified, results = self.verify(records)
        if verified and self.stopped is not None:
            for item in verified:
                results[item.index] = self._done(item, FAILED, self._not_attempted(), self.stopped)
        elif verified:
            for index, result in self.delete(verified).items():
                results[index] = result
        return [r for r in results if r is not None]

    # ---- step 1: verify ----------------------------------------------------------------------

    def read(self, path: str) -> Read:
        try:
            data, stat = self.client.get_async(path).get(timeout=self.op_timeout_s)
        except NoNodeError:
            return None
        except NoAuthError as exc:
            raise ZooKeeperPermissionError(path, "READ", WHY_READ) from exc
        return data, stat

    def verify(self, records: Sequence[Mapping[str, Any]]) -> tuple[list[Verified], list[DeleteResult | None]]:
        """Deletable ledgers, and the final result of every other record (None where deletable)."""
        reads = _Reads(self)
        self._prefetch(records, reads)
        verified: list[Verified] = []
        results: list[DeleteResult | None] = []
        outage: str | None = None
        for index, record in enumerate(records):
            started = time.monotonic()
            if self.stopped is not None:
                results.append(result_for(record, FAILED, self._not_attempted(), error=self.stopped))
                continue
            if outage is not None and not self.client.connected:
                # Each read would wait out its timeout in turn; the retry re-verifies them all anyway.
                results.append(result_for(record, FAILED, "ZooKeeper unavailable", error=outage))
                continue
            try:
                item = self._verify_one(index, record, reads, started)
            except ZooKeeperPermissionError as exc:
                self.refusal = str(exc)
                item = result_for(record, FAILED, "refused: missing ZooKeeper permission", error=self.refusal)
            except Exception as exc:  # per record: one bad read must not sink the others
                item = result_for(record, FAILED, "could not verify", error=_error_text(exc))
                if is_transient(exc):
                    outage = item.error
                else:
                    item.detail = "could not verify (unexpected error)"
            if isinstance(item, Verified):
                if self.execute:
                    verified.append(item)
                    results.append(None)
                    continue
                item_result = result_for(record, WOULD_DELETE, item.detail, zk_path=item.path,
                                         zk_version=item.version)
                results.append(self._timed(item_result, started))
            else:
                results.append(self._timed(item, started))
        return verified, results

    def _prefetch(self, records: Sequence[Mapping[str, Any]], reads: _Reads) -> None:
        """Ledger znodes, then the referrers they may need, then those referrers' cursors, in bulk."""
        if not self.client.connected:
            return
        ledgers, referrers, schemas, shadows = [], [], [], []
        for record in records:
            try:
                ledgers.append(ledger_path(self.ledgers_root, record["ledgerId"], self.layout))
            except (LayoutError, TypeError, KeyError):
                continue
            if record.get("ledgerComponent") == "SCHEMA_STORAGE" and isinstance(record.get("schemaId"), str):
                schemas.append(zkutil.join(self.schemas_root, record["schemaId"]))
            else:
                ml_name = managed_ledger_name(record.get("topicName"))
                if ml_name is not None:
                    referrers.append(zkutil.join(self.ml_root, ml_name))
                    shadows.extend(zkutil.join(self.ml_root, s) for s in self.shadows.get(ml_name, ()))
        reads.prefetch(ledgers)
        reads.prefetch(referrers + schemas + shadows)
        reads.prefetch([p for p in referrers if reads.data.get(p) is not None], children=True)
        reads.prefetch(zkutil.join(p, c) for p in referrers for c in (reads.children.get(p) or []))

    @staticmethod
    def _timed(result: DeleteResult, started: float) -> DeleteResult:
        result.duration_ms = int((time.monotonic() - started) * 1000)
        return result

    def _verify_one(self, index: int, record: Mapping[str, Any], reads: _Reads,
                    started: float) -> Verified | DeleteResult:
        ledger_id = record.get("ledgerId")
        try:
            path = ledger_path(self.ledgers_root, ledger_id, self.layout)  # type: ignore[arg-type]
        except (LayoutError, TypeError) as exc:
            return result_for(record, INVALID, f"no ledger path for id {ledger_id!r}: {exc}")
        got = reads.get(path)
        live: LiveLedger | None = None
        if got is not None:
            data, stat = got
            try:
                live = LiveLedger.of(path, decode_ledger_metadata(data), stat.version, stat.ctime)
            except MetadataDecodeError as exc:
                # Never delete what we cannot read: it may be a ledger of a format we do not know.
                return result_for(record, INVALID, decide.unreadable("ledger metadata", exc), zk_path=path,
                                  zk_version=stat.version)
        version = live.zk_version if live else None
        if live is None and path in self.answer_lost:
            # Our own delete went through: its answer was lost, and nothing but this run deletes an orphan.
            return result_for(record, DELETED, answer_lost_deleted(self.answer_lost[path]), zk_path=path)
        early = decide.check_ledger(record, live, self._now(), self.min_age_ms, path,
                                    ever_seen=ledger_id not in self.never_seen)
        if early is not None:
            return result_for(record, early.outcome, early.detail, zk_path=path, zk_version=version)
        assert live is not None
        referrer = self.referrer_state(record, reads)
        refused = self._refused(record, referrer)
        if refused is not None:
            return result_for(record, REFUSED, refused, zk_path=path, zk_version=version)
        decision = decide.decide_referrer(referrer)  # check_ledger's rules passed just above
        if decision.delete and referrer.offloaded:
            decision = self._offloaded_copy_decision(referrer)
        if decision.delete and self.peers:
            decision = self._peer_decision(record, referrer)
        if not decision.delete:
            return result_for(record, decision.outcome, decision.detail, zk_path=path, zk_version=version)
        return Verified(index, record, path, live.zk_version, referrer.versions, decision.detail, started)

    def _refused(self, record: Mapping[str, Any], referrer: ReferrerState) -> str | None:
        """`<rule>: <why>` when today's rules forbid touching this ledger (sweeper.rules.owner, as reconcile applies
        them)."""
        if self.rules is None:
            return None
        cursor = record.get("cursorName")
        owner = Owner.of_record(record.get("topicName"), record.get("schemaId"),
                                names.decode_local_name(cursor) if isinstance(cursor, str) else None)
        found = refusal(owner, self.rules, referrer.owner_exists)
        if found is not None:
            return f"{found[0]}: {found[1]}"
        return referrer.protected

    def _offloaded_copy_decision(self, referrer: ReferrerState) -> decide.Decision:
        """The managed ledger reads this ledger from tiered storage now: its BookKeeper copy may go only once the
        offloaded objects are seen (an offload whose objects were lost leaves the BookKeeper copy the only one)."""
        if self.offload_check is None:
            return decide.Decision(IN_USE, "listed offloaded with bookkeeperDeleted, but this run cannot check the "
                                           "offloaded copy ([offload] enabled = false): kept")
        for bucket, region, endpoint, keys, ml_name in referrer.offloaded:
            problem = self.offload_check(bucket, region, endpoint, keys, ml_name)
            if problem is not None:
                return decide.Decision(IN_USE, f"offloaded copy not verified: {problem}: kept")
        return decide.Decision(DELETE, "offloaded copy verified in its bucket; no referrer needs the BookKeeper copy")

    def _peer_decision(self, record: Mapping[str, Any], ours: ReferrerState) -> decide.Decision:
        """Each peer cluster's referrers of this ledger, read now: any reference keeps it; a ledger whose owner
        exists only at a peer is the peer's to collect."""
        for name, peer in self.peers:
            state = peer.referrer_state(record, _Reads(peer))
            if state.unverifiable:
                return decide.Decision(IN_USE, f"peer cluster {name}: referrer cannot be verified: "
                                               f"{state.unverifiable}")
            if state.references:
                return decide.Decision(IN_USE, f"still referenced by peer cluster {name}: "
                                               + "; ".join(state.references))
            if state.owner_exists and not ours.owner_exists:
                return decide.Decision(REFUSED, f"{OTHER_CLUSTER}: its owner exists in peer cluster {name}'s "
                                                "metadata, not in ours: the peer's to collect")
        return decide.Decision(DELETE, "no referrer holds it, in this cluster or any peer")

    # ---- referrers -------------------------------------------------------------------------

    def referrer_state(self, record: Mapping[str, Any], reads: _Reads) -> ReferrerState:
        ledger_id = int(record["ledgerId"])
        component = record["ledgerComponent"]
        if component == "SCHEMA_STORAGE":
            return self._schema_referrer(str(record["schemaId"]), ledger_id, reads)
        ml_name = managed_ledger_name(record.get("topicName"))
        if ml_name is None:
            return ReferrerState(unverifiable=f"no managed ledger for topic {record.get('topicName')!r}")
        refs: list[str] = []
        versions: list[tuple[str, int]] = []
        if component == "MANAGED_LEDGER":
            problem = self._shadow_refs(ml_name, ledger_id, reads, refs, versions)
            if problem:
                return ReferrerState(tuple(refs), problem, tuple(versions))
        ml_path = zkutil.join(self.ml_root, ml_name)
        got = reads.get(ml_path)
        if got is None:
            # Topic deleted: nothing of it references the ledger (its shadows were checked above).
            return ReferrerState(tuple(refs), None, tuple(versions), owner_exists=False)
        data, stat = got
        versions.append((ml_path, stat.version))
        offloaded: tuple[tuple[str, str, str, tuple[str, ...], str], ...] = ()
        if component == "MANAGED_LEDGER":
            try:
                info = codec.decode_managed_ledger_info(data)
            except MetadataDecodeError as exc:
                return ReferrerState(unverifiable=decide.unreadable(f"managed ledger {ml_name}", exc),
                                     versions=tuple(versions))
            if _needs_bookkeeper_copy(info, ledger_id):
                refs.append(f"listed in managed ledger {ml_name}")
            else:
                offloaded = _released_copies(info, ledger_id, ml_name)
        cursors = reads.get_children(ml_path) or []
        protected: str | None = None
        if component == "COMPACTED_LEDGER":
            cursors = [c for c in cursors if c == COMPACTION_CURSOR]
        for cursor in cursors:
            cursor_path = zkutil.join(ml_path, cursor)
            got = reads.get(cursor_path)
            if got is None:
                continue
            cdata, cstat = got
            versions.append((cursor_path, cstat.version))
            try:
                cinfo = codec.decode_managed_cursor_info(cdata)
            except MetadataDecodeError as exc:
                return ReferrerState(tuple(refs), decide.unreadable(f"cursor {cursor_path}", exc), tuple(versions))
            problem = self._cursor_refs(component, ledger_id, cursor, cinfo, refs)
            if problem:
                return ReferrerState(tuple(refs), problem, tuple(versions))
            if component == "MANAGED_CURSOR" and cursor == record.get("cursorName"):
                found = cursor_protection(names.decode_local_name(cursor), {p.name: p.value for p in cinfo.properties})
                if found is not None:
                    protected = f"{PROTECTED}: {found.value}: {describe(found)}"
        return ReferrerState(tuple(refs), None, tuple(versions), protected=protected, offloaded=offloaded)

    def _shadow_refs(self, ml_name: str, ledger_id: int, reads: _Reads, refs: list[str],
                     versions: list[tuple[str, int]]) -> str | None:
        """Append the shadow topics' listings of `ledger_id`; return why one cannot be verified, if so."""
        for shadow in self.shadows.get(ml_name, ()):
            path = zkutil.join(self.ml_root, shadow)
            got = reads.get(path)
            if got is None:
                continue  # the shadow topic is gone
            data, stat = got
            versions.append((path, stat.version))
            try:
                info = codec.decode_managed_ledger_info(data)
            except MetadataDecodeError as exc:
                return decide.unreadable(f"shadow managed ledger {shadow}", exc)
            if _needs_bookkeeper_copy(info, ledger_id):
                refs.append(f"listed in shadow topic managed ledger {shadow}")
        return None

    @staticmethod
    def _cursor_refs(component: str, ledger_id: int, cursor: str, info: Any, refs: list[str]) -> str | None:
        """Append the cursor's references to `ledger_id`; return why it cannot be verified, if so."""
        if component in ("MANAGED_LEDGER", "MANAGED_CURSOR") and info.cursorsLedgerId == ledger_id:
            refs.append(f"cursor {cursor} stores its position in it")
        if component == "DELAYED_INDEX_BUCKET":
            for prop in info.cursorProperties:
                if not prop.name.startswith(BUCKET_PREFIX):
                    continue
                try:
                    value = int(prop.value)
                except ValueError:
                    return f"cursor {cursor} bucket property {prop.name!r} is not a ledger id: {prop.value!r}"
                if value == ledger_id:
                    refs.append(f"cursor {cursor} bucket {prop.name}")
        if component == "COMPACTED_LEDGER":
            # The rule reconcile applies (sweeper.rules.classify.compaction_reference): ZooKeeper's pointer lags
            # while the cursor has a cursor ledger, so only a lower id than it is provably superseded.
            longs = {p.name: p.value for p in info.properties}
            pointer = CompactionPointer(longs.get(COMPACTED_TOPIC_LEDGER), info.cursorsLedgerId != -1)
            ref, why = compaction_reference(ledger_id, pointer)
            if ref is CompactionRef.CURRENT:
                refs.append(f"cursor {cursor} {COMPACTED_TOPIC_LEDGER}")
            elif ref is CompactionRef.UNKNOWN:
                return (f"cursor {cursor}: {why}: {COMPACTED_TOPIC_LEDGER} in ZooKeeper is {pointer.zk_ledger}, "
                        f"cursor ledger {info.cursorsLedgerId} may name this ledger as the current compaction")
        return None

    def _schema_referrer(self, schema_id: str, ledger_id: int, reads: _Reads) -> ReferrerState:
        parts = schema_id.split("/")
        if len(parts) != 3 or any(p in ("", ".", "..") for p in parts):
            return ReferrerState(unverifiable=f"schemaId {schema_id!r} is not tenant/namespace/topic")
        path = zkutil.join(self.schemas_root, schema_id)
        got = reads.get(path)
        if got is None:
            return ReferrerState(owner_exists=False)
        data, stat = got
        versions = ((path, stat.version),)
        try:
            locator = codec.decode_schema_locator(data)
        except MetadataDecodeError as exc:
            return ReferrerState(unverifiable=decide.unreadable(f"schema locator {schema_id}", exc), versions=versions)
        refs = []
        if locator.HasField("info") and locator.info.position.ledgerId == ledger_id:
            refs.append(f"latest version {locator.info.version} of schema {schema_id}")
        refs += [f"version {e.version} of schema {schema_id}" for e in locator.index
                 if e.position.ledgerId == ledger_id]
        return ReferrerState(tuple(refs), None, versions)

    # ---- step 2: delete ----------------------------------------------------------------------

    IN_FLIGHT = 8  # multi-operations awaiting their answer at once: ZooKeeper group-commits them

    def delete(self, verified: Sequence[Verified]) -> dict[int, DeleteResult]:
        """Results by record index. Batches of compare-and-set deletes; a failed batch is retried one by one."""
        results: dict[int, DeleteResult] = {}
        # Without an atomic multi (Oxia), one ledger per compare-and-set: a batch whose later delete failed would
        # otherwise stay half applied, and its retried members would read as deleted by someone else.
        size = self.batch_size if capabilities_of(self.client).atomic_multi else 1
        batches = [list(verified[i:i + size]) for i in range(0, len(verified), size)]
        for start in range(0, len(batches), self.IN_FLIGHT):
            if self.stopped is not None:
                for item in (i for batch in batches[start:] for i in batch):
                    results[item.index] = self._done(item, FAILED, self._not_attempted(), self.stopped)
                break
            sent = [(batch, *self._send(batch)) for batch in batches[start:start + self.IN_FLIGHT]]
            for batch, checks, answer in sent:
                outcome = self._settle(batch, checks, answer)
                if outcome is None:
                    for item in batch:
                        results[item.index] = self._done(item, DELETED, "deleted with the verified version")
                elif len(batch) == 1:
                    results[batch[0].index] = outcome
                elif outcome.detail == ANSWER_LOST:
                    # The whole multi may have been applied: sending its members again now would find them gone and
                    # read as someone else's delete. The retry re-verifies them, after a back-off.
                    for item in batch:
                        results[item.index] = self._done(item, FAILED, ANSWER_LOST, outcome.error)
                else:
                    for item in batch:
                        if self.stopped is not None:
                            results[item.index] = self._done(item, FAILED, self._not_attempted(), self.stopped)
                            continue
                        single = self._settle([item], *self._send([item]))
                        results[item.index] = single or self._done(item, DELETED,
                                                                   "deleted with the verified version")
        if capabilities_of(self.client).tidies_empty_parents:
            # On Oxia a parent key deleted under a ledger BookKeeper is creating would hide that ledger from every
            # listing; BookKeeper leaves them there too (PulsarLedgerManager.removeLedgerMetadata).
            self.remove_empty_parents(r.zk_path for r in results.values() if r.outcome == DELETED and r.zk_path)
        return results

    def _done(self, item: Verified, outcome: str, detail: str, error: str | None = None) -> DeleteResult:
        result = result_for(item.record, outcome, detail, error=error, zk_path=item.path, zk_version=item.version)
        return self._timed(result, item.started)

    def _send(self, batch: list[Verified]) -> tuple[list[tuple[str, int]], Any]:
        """One multi: check the run's lock (its fence), every referrer at the version read, and delete every ledger
        at the version verified."""
        tx = self.client.transaction()
        fence = self.fence.checks() if self.fence is not None else ()
        checks = list(dict.fromkeys([*fence, *(c for item in batch for c in item.checks)]))
        for path, version in checks:
            tx.check(path, version)
        for item in batch:
            tx.delete(item.path, version=item.version)
        try:
            return checks, tx.commit_async()
        except Exception as exc:  # not even queued: settled as "not sent", retried after re-verification
            return checks, exc

    def _settle(self, batch: list[Verified], checks: list[tuple[str, int]], answer: Any) -> DeleteResult | None:
        """None when every delete went through; else, for a single-ledger batch, that ledger's result
        (for a larger batch only that it failed: the caller retries its members one by one, or, when the answer
        was lost (detail ANSWER_LOST), files them all failed for the retry to re-verify)."""
        if isinstance(answer, Exception):  # the client refused to queue it: never sent
            return self._done(batch[0], FAILED, "delete not sent", _error_text(answer))
        try:
            outcome = answer.get(timeout=self.op_timeout_s)
        except (ConnectionClosedError, AuthFailedError) as exc:
            # kazoo's _call short-circuits these before queueing the request (KazooClient._call, kazoo 2.11).
            return self._done(batch[0], FAILED, "delete not sent", _error_text(exc))
        except Exception as exc:
            # Sent, and no answer: ZooKeeper may have applied the multi. ZooKeeper's own client fails every request
            # awaiting its reply with CONNECTIONLOSS when the connection drops (ClientCnxn.cleanup -> conLossPacket),
            # and the project's error-handling guide says such a request may or may not have been applied
            # (cwiki.apache.org/confluence/display/ZOOKEEPER/ErrorHandling, "requests in flight"). kazoo does the
            # same to its `_pending` requests (KazooClient._notify_pending, kazoo 2.11); a timeout here leaves the
            # request in kazoo's `_queue`, to be sent after a reconnect. The retry re-verifies: gone means ours.
            return self._answer_lost(batch, _error_text(exc))
        failure = next(((i, r) for i, r in enumerate(outcome)
                        if isinstance(r, Exception) and not isinstance(r, RolledBackError | RuntimeInconsistency)),
                       None)
        if failure is None:
            if any(isinstance(r, Exception) for r in outcome):
                return self._done(batch[0], FAILED, "multi rolled back without a reason", repr(outcome))
            return None
        position, error = failure
        item = batch[0]
        fenced = len(self.fence.checks()) if self.fence is not None else 0
        if position < fenced and isinstance(error, NoNodeError | BadVersionError):
            # The lock node is gone (the session expired) or the epoch moved (another run took the lock): the multi
            # was refused as a whole, so nothing of it applied. Say why, as the fence would on a read.
            assert self.fence is not None
            self.lock_lost = (self.fence.lost_because(None, None) if isinstance(error, NoNodeError) and position == 0
                              else f"its lock {self.fence.lock_path} was taken by another run (checked in the "
                                   "compare-and-set multi)")
            return self._done(item, FAILED, LOCK_LOST, self.lock_lost)
        if len(batch) > 1:
            return self._done(item, FAILED, "batch failed", _error_text(error))
        if isinstance(error, NoAuthError):
            # Named per ledger: a larger batch that failed is retried one by one by delete().
            if position < len(checks):
                denied = ZooKeeperPermissionError(checks[position][0], "READ", "checked in the compare-and-set multi")
            else:
                denied = ZooKeeperPermissionError(item.path.rsplit("/", 1)[0], "DELETE",
                                                  f"deleting {item.path} needs DELETE on its parent")
            self.refusal = str(denied)
            return self._done(item, FAILED, "refused: missing ZooKeeper permission", self.refusal)
        if position < len(checks):
            path = checks[position][0]
            if not isinstance(error, NoNodeError | BadVersionError):  # Oxia's re-read failed: nothing was sent
                return self._done(item, FAILED, f"referrer {path} could not be re-read before the delete",
                                  _error_text(error))
            # The referrer moved after we read it: what it says now must be verified again, so retry.
            return self._done(item, FAILED, f"referrer {path} changed after verification", _error_text(error))
        if is_transient(error):
            # A store without a multi (Oxia) answers per delete: this one was sent and its answer lost
            # (sweeper.metastore.oxia turns gRPC's UNAVAILABLE / DEADLINE_EXCEEDED into kazoo's ConnectionLoss).
            return self._answer_lost([item], _error_text(error))
        if isinstance(error, NoNodeError) and item.path in self.answer_lost:
            # Sent again after an earlier send's answer was lost: that earlier delete went through.
            return self._done(item, DELETED, answer_lost_deleted(self.answer_lost[item.path]))
        if isinstance(error, NoNodeError):
            return self._done(item, ALREADY_GONE, "deleted by someone else after verification")
        if isinstance(error, BadVersionError):
            return self._done(item, IN_USE, "ledger metadata changed after verification")
        return self._done(item, FAILED, "delete refused", _error_text(error))

    def _answer_lost(self, batch: list[Verified], error: str) -> DeleteResult:
        """Every ledger of the batch remembered as maybe deleted; `failed` with ANSWER_LOST for the caller."""
        for item in batch:
            self.answer_lost.setdefault(item.path, error)
        return self._done(batch[0], FAILED, ANSWER_LOST, error)

    # ---- step 3: tidy ------------------------------------------------------------------------

    def _is_layout_dir(self, path: str) -> bool:
        if not path.startswith(self.ledgers_root + "/"):
            return False
        parts = path[len(self.ledgers_root) + 1:].split("/")
        return (is_tree_top(parts[0]) and len(parts) <= tree_depth(parts[0])
                and all(is_middle(p) for p in parts[1:]))

    def remove_empty_parents(self, deleted_paths: Iterable[str]) -> list[str]:
        """Delete the layout directories the deletes emptied, deepest first; the ledgers root never.

        A plain delete of a directory that gained a child fails with NotEmpty, so a ledger created
        meanwhile is safe; BookKeeper recreates missing parents when it creates a ledger.
        """
        removed: list[str] = []
        kept: set[str] = set()
        parents = {p.rsplit("/", 1)[0] for p in deleted_paths}
        for parent in sorted(parents, key=lambda p: (-p.count("/"), p)):
            path = parent
            while self._is_layout_dir(path) and path not in kept:
                try:
                    self.client.delete_async(path).get(timeout=self.op_timeout_s)
                    removed.append(path)
                except NoNodeError:
                    pass  # removed by another task: the level above may be empty now
                except NotEmptyError:
                    kept.add(path)
                    break
                except Exception:
                    break  # cosmetic: an empty directory harms nothing, the next run tidies it
                path = path.rsplit("/", 1)[0]
        return removed
