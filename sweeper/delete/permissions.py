"""The delete run's permission check: every znode it will read or delete under, before anything is deleted.

Needed (sweeper.zk.acl for the rules): READ on each ledger znode (re-verified) and on each referrer
(managed ledger, its cursors, its shadow topics' managed ledgers, schema locator: re-read, then
checked in the compare-and-set multi); DELETE on each ledger znode's parent directory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sweeper.codecs import pending_delete
from sweeper.codecs.errors import LayoutError
from sweeper.codecs.layout import LedgerLayout, ledger_path
from sweeper.connections import ZooKeeperEndpoint
from sweeper.delete.decide import managed_ledger_name
from sweeper.ratelimit import TokenBucket
from sweeper.zk import client as zkutil
from sweeper.zk.acl import DELETE, READ, UNREADABLE, Acl, Identity, Missing, identity_of, missing_permissions
from sweeper.zk.errors import ZooKeeperPermissionError, ZooKeeperWireError
from sweeper.zk.wire import WireReader

log = logging.getLogger(__name__)

WHY_LEDGER = "the delete re-reads each ledger's metadata before deleting it"
WHY_PARENT = "deleting a ledger znode needs DELETE on its parent"
WHY_REFERRER = "the delete re-reads every referrer and checks its version in the same multi"

# ZooKeeper answers one session's requests in order, one at a time, so a single session's getACL pipeline is bound by
# the server's turn-around: 98k getACL took 5.0 s on one session, 2.9 s on two and 2.2 s on three (bench note in
# docs/benchmarks.md). Unpaced checks of many znodes spread over up to this many sessions, within [scan] max_sessions;
# paced ones ([scan] reads_per_second, by default) keep one: the rate bounds them, not the server's turn-around.
MAX_SESSIONS = 3
PATHS_PER_SESSION = 10_000

T = TypeVar("T")


@dataclass
class PermissionCheck:
    status: str  # "ok", "missing", or "skipped: why"
    missing: list[Missing] = field(default_factory=list)
    identity: Identity | None = None

    def refusal(self) -> str:
        assert self.missing and self.identity is not None
        more = f" (and {len(self.missing) - 1} more znode permission(s) missing)" if len(self.missing) > 1 else ""
        return (f"{self.missing[0].message(self.identity)}{more}; nothing was deleted: grant the permissions "
                "(docs/operations.md, 'ZooKeeper permissions') and run again")


def needed(records: Sequence[Mapping[str, Any]], *, ledgers_root: str, layout: LedgerLayout, ml_root: str,
           schemas_root: str, shadows: Mapping[str, Sequence[str]]) -> tuple[dict[str, tuple[int, str]], list[str]]:
    """(path -> (permission bits, why), managed-ledger paths whose cursors are referrers too)."""
    needs: dict[str, tuple[int, str]] = {}

    def need(path: str, permission: int, why: str) -> None:
        bits, reason = needs.get(path, (0, why))
        needs[path] = (bits | permission, reason if bits else why)

    managed: list[str] = []
    for record in records:
        if record.get("ledgerType") == "LEDGER":
            try:
                path = ledger_path(ledgers_root, record["ledgerId"], layout)
            except (LayoutError, TypeError, KeyError):
                continue  # refused as invalid by the executor
            need(path, READ, WHY_LEDGER)
            need(path.rsplit("/", 1)[0], DELETE, WHY_PARENT)
        if record.get("ledgerComponent") == "SCHEMA_STORAGE":
            if isinstance(record.get("schemaId"), str):
                need(zkutil.join(schemas_root, record["schemaId"]), READ, WHY_REFERRER)
            continue
        name = managed_ledger_name(record.get("topicName"))
        if name is None:
            continue
        for ml in (name, *shadows.get(name, ())):
            path = zkutil.join(ml_root, ml)
            need(path, READ, WHY_REFERRER)
            managed.append(path)
    return needs, managed


def check(endpoint: ZooKeeperEndpoint, payloads: Sequence[bytes], *,
          ledgers_root: str, layout: LedgerLayout, ml_root: str, schemas_root: str,
          shadows: Mapping[str, Sequence[str]], reads_per_second: float = 0.0, multi_read: int = 1,
          max_sessions: int = MAX_SESSIONS) -> PermissionCheck:
    """Whether this session may do the run: one wire-protocol session (whoAmI, listings, getACL, pipelined)."""
    limiter = TokenBucket.for_requests(reads_per_second, multi_read) if reads_per_second > 0 else None
    security = endpoint.security
    with endpoint.wire_reader(multi_read, limiter) as reader:
        try:
            who = reader.who_am_i()
        except ZooKeeperWireError as exc:  # ZooKeeper < 3.7: no whoAmI. The deletes still refuse on NoAuth.
            log.info("permission check skipped: %s", exc)
            return PermissionCheck(f"skipped: cannot ask ZooKeeper who this session is ({exc}); a missing "
                                   "permission will stop the run at its first NoAuth instead")
        identity = identity_of(who, security.digest_id() if security is not None else "")
        if identity.is_super:
            return PermissionCheck("ok", identity=identity)
        sessions = 1 if limiter is not None else max(1, min(MAX_SESSIONS, max_sessions))
        return _check(reader, identity, payloads, ledgers_root=ledgers_root, layout=layout, ml_root=ml_root,
                      schemas_root=schemas_root, shadows=shadows,
                      more_sessions=lambda: endpoint.wire_reader(multi_read), sessions=sessions)


def _spread(reader: WireReader, paths: list[str], read: Callable[[WireReader, list[str]], list[T]],
            more_sessions: Callable[[], WireReader] | None, sessions: int) -> list[T]:
    """`read` over contiguous shares of `paths`, in input order: the first share on `reader`, each other on a
    session of its own at the same time, at most `sessions` in all (see MAX_SESSIONS). A failed share fails the
    whole."""
    shares = 1 if more_sessions is None else max(1, min(sessions, len(paths) // PATHS_PER_SESSION))
    if shares == 1:
        return read(reader, paths)
    size = -(-len(paths) // shares)
    chunks = [paths[i:i + size] for i in range(0, len(paths), size)]

    def on_own_session(chunk: list[str]) -> list[T]:
        assert more_sessions is not None
        with more_sessions() as own:
            return read(own, chunk)

    with ThreadPoolExecutor(len(chunks) - 1, thread_name_prefix="acl-check") as pool:
        others = [pool.submit(on_own_session, chunk) for chunk in chunks[1:]]
        results = read(reader, chunks[0])
        for future in others:
            results.extend(future.result())
    return results


def _check(reader: WireReader, identity: Identity, payloads: Sequence[bytes], *, ledgers_root: str,
           layout: LedgerLayout, ml_root: str, schemas_root: str, shadows: Mapping[str, Sequence[str]],
           more_sessions: Callable[[], WireReader] | None = None, sessions: int = 1) -> PermissionCheck:
    records = []
    for payload in payloads:
        try:
            records.append(pending_delete.decode(payload, check=False))
        except Exception:  # refused as invalid by the executor, with the reason
            continue
    needs, managed = needed(records, ledgers_root=ledgers_root, layout=layout, ml_root=ml_root,
                            schemas_root=schemas_root, shadows=shadows)
    listings = _spread(reader, list(dict.fromkeys(managed)), lambda r, ps: list(r.children_many(ps)), more_sessions,
                       sessions)
    for listing in listings:
        for cursor in listing.children or ():  # unreadable: its own READ is missing, found below
            needs.setdefault(zkutil.join(listing.path, cursor), (READ, WHY_REFERRER))
    acls: dict[str, Acl] = {}
    for read in _spread(reader, list(needs), lambda r, ps: list(r.acls_many(ps)), more_sessions, sessions):
        acls[read.path] = UNREADABLE if isinstance(read.error, ZooKeeperPermissionError) else read.acl
    missing = missing_permissions(needs, acls, identity)
    return PermissionCheck("missing" if missing else "ok", missing, identity)
