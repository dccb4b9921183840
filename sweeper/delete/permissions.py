"""The delete run's permission check: every znode it will read or delete under, before anything is deleted.

Needed (sweeper.zk.acl for the rules): READ on each ledger znode (re-verified) and on each referrer
(managed ledger, its cursors, its shadow topics' managed ledgers, schema locator: re-read, then
checked in the compare-and-set multi); DELETE on each ledger znode's parent directory.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sweeper import pending_delete
from sweeper.connections import ZooKeeperEndpoint
from sweeper.delete.decide import managed_ledger_name
from sweeper.layout import LayoutError, LedgerLayout, ledger_path
from sweeper.ratelimit import TokenBucket
from sweeper.zk import client as zkutil
from sweeper.zk.acl import DELETE, READ, UNREADABLE, Acl, Identity, Missing, identity_of, missing_permissions
from sweeper.zk.errors import ZooKeeperPermissionError
from sweeper.zk.wire import WireReader, ZooKeeperWireError

log = logging.getLogger(__name__)

WHY_LEDGER = "the delete re-reads each ledger's metadata before deleting it"
WHY_PARENT = "deleting a ledger znode needs DELETE on its parent"
WHY_REFERRER = "the delete re-reads every referrer and checks its version in the same multi"


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
          shadows: Mapping[str, Sequence[str]], reads_per_second: float = 0.0, multi_read: int = 1) -> PermissionCheck:
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
        return _check(reader, identity, payloads, ledgers_root=ledgers_root, layout=layout, ml_root=ml_root,
                      schemas_root=schemas_root, shadows=shadows)


def _check(reader: WireReader, identity: Identity, payloads: Sequence[bytes], *, ledgers_root: str,
           layout: LedgerLayout, ml_root: str, schemas_root: str,
           shadows: Mapping[str, Sequence[str]]) -> PermissionCheck:
    records = []
    for payload in payloads:
        try:
            records.append(pending_delete.decode(payload, check=False))
        except Exception:  # refused as invalid by the executor, with the reason
            continue
    needs, managed = needed(records, ledgers_root=ledgers_root, layout=layout, ml_root=ml_root,
                            schemas_root=schemas_root, shadows=shadows)
    for listing in reader.children_many(list(dict.fromkeys(managed))):
        for cursor in listing.children or ():  # unreadable: its own READ is missing, found below
            needs.setdefault(zkutil.join(listing.path, cursor), (READ, WHY_REFERRER))
    acls: dict[str, Acl] = {}
    for read in reader.acls_many(list(needs)):
        acls[read.path] = UNREADABLE if isinstance(read.error, ZooKeeperPermissionError) else read.acl
    missing = missing_permissions(needs, acls, identity)
    return PermissionCheck("missing" if missing else "ok", missing, identity)
