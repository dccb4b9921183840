"""The permission rules the delete run checks before it starts (ZooKeeperServer.checkACL's)."""

from __future__ import annotations

import pytest

from harness.zkserver import super_digest
from sweeper.codecs.layout import LedgerLayout
from sweeper.delete.permissions import WHY_PARENT, needed
from sweeper.zk.acl import (
    ADMIN,
    DELETE,
    READ,
    UNREADABLE,
    Identity,
    Missing,
    allows,
    identity_of,
    missing_permissions,
)
from tests.support.config import ZkTarget

SWEEPER = Identity(frozenset({("sasl", "sweeper"), ("ip", "10.1.2.3")}))
CREATOR_ALL_WORLD_READ = [(31, "sasl", "bookie"), (READ, "world", "anyone")]


def test_world_sasl_ip_and_empty_acls() -> None:
    assert allows(CREATOR_ALL_WORLD_READ, SWEEPER, READ)
    assert not allows(CREATOR_ALL_WORLD_READ, SWEEPER, DELETE)
    assert allows([(READ | DELETE, "sasl", "sweeper")], SWEEPER, DELETE)
    assert not allows([(READ, "sasl", "sweeper")], SWEEPER, DELETE)  # the bit matters, not just the id
    assert allows([(DELETE, "ip", "10.1.0.0/16")], SWEEPER, DELETE)
    assert not allows([(DELETE, "ip", "10.2.0.0/16")], SWEEPER, DELETE)
    assert allows([], SWEEPER, DELETE)  # an empty ACL restricts nothing


def test_super_is_allowed_everything() -> None:
    root = Identity(frozenset({("super", ""), ("ip", "127.0.0.1")}))
    assert allows([(31, "sasl", "bookie")], root, DELETE)
    assert missing_permissions({"/a": (READ, "why")}, {"/a": UNREADABLE}, root) == []


def test_digest_ids_from_who_am_i_and_redacted_acls() -> None:
    mine = super_digest("pw", user="ops")
    identity = identity_of([("digest", "ops"), ("ip", "127.0.0.1")], digest_id=mine)
    assert ("digest", mine) in identity.ids and identity.describe() == "digest:ops"
    assert allows([(DELETE, "digest", mine)], identity, DELETE)
    wrong_password = identity_of([("digest", "ops")], digest_id=super_digest("other", user="ops"))
    assert not allows([(DELETE, "digest", mine)], wrong_password, DELETE)
    # Without ADMIN getACL shows digest ids as user:x: the user name decides, the server the rest.
    assert allows([(DELETE, "digest", "ops:x")], wrong_password, DELETE)


def test_missing_permissions_named_per_znode() -> None:
    needs = {"/ledgers/00/0000": (DELETE, WHY_PARENT), "/managed-ledgers/t/n/persistent/a": (READ, "referrer"),
             "/schemas/t/n/x": (READ, "referrer"), "/gone": (READ, "referrer")}
    acls = {"/ledgers/00/0000": CREATOR_ALL_WORLD_READ, "/managed-ledgers/t/n/persistent/a": UNREADABLE,
            "/schemas/t/n/x": [(READ | ADMIN, "sasl", "sweeper")], "/gone": None}
    missing = missing_permissions(needs, acls, SWEEPER)
    assert missing == [Missing("/ledgers/00/0000", DELETE, WHY_PARENT),
                       Missing("/managed-ledgers/t/n/persistent/a", READ, "referrer")]
    assert missing[0].message(SWEEPER) == (
        "no DELETE permission on znode /ledgers/00/0000 (ZooKeeper NoAuth) for this sweeper's identity "
        f"(sasl:sweeper): {WHY_PARENT}")


def test_what_a_delete_run_needs() -> None:
    records = [
        {"ledgerType": "LEDGER", "ledgerId": 7, "ledgerComponent": "MANAGED_LEDGER",
         "topicName": "persistent://t/n/topic"},
        {"ledgerType": "LEDGER", "ledgerId": 9, "ledgerComponent": "SCHEMA_STORAGE", "schemaId": "t/n/topic"},
        {"ledgerType": "OFFLOAD_LEDGER", "ledgerId": 8, "ledgerComponent": "MANAGED_LEDGER",
         "topicName": "persistent://t/n/other"},
        {"ledgerType": "LEDGER", "ledgerId": "bad"},
    ]
    needs, managed = needed(records, ledgers_root="/ledgers", layout=LedgerLayout.HIERARCHICAL,
                            ml_root="/managed-ledgers", schemas_root="/schemas",
                            shadows={"t/n/persistent/topic": ["t/n/persistent/shadow"]})
    assert {path: bits for path, (bits, _) in needs.items()} == {
        "/ledgers/00/0000/L0007": READ, "/ledgers/00/0000/L0009": READ, "/ledgers/00/0000": DELETE,
        "/managed-ledgers/t/n/persistent/topic": READ, "/managed-ledgers/t/n/persistent/shadow": READ,
        "/schemas/t/n/topic": READ, "/managed-ledgers/t/n/persistent/other": READ}
    assert managed == ["/managed-ledgers/t/n/persistent/topic", "/managed-ledgers/t/n/persistent/shadow",
                       "/managed-ledgers/t/n/persistent/other"]


def test_the_check_spread_over_sessions_finds_what_one_session_finds(
        zk_target: ZkTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real ZooKeeper: the check's reads split over three sessions still see every znode; the two that lack
    READ (a ledger, a cursor) sit in the second and third shares, so a share's answers lost would pass them."""
    from kazoo.security import ACL, Id, Permissions

    from sweeper.codecs import pending_delete
    from sweeper.connections import ZooKeeperEndpoint
    from sweeper.delete import permissions
    from sweeper.zk import client as zkutil

    client = zkutil.connect(zk_target.hosts)
    other_only = [ACL(Permissions.ALL, Id("digest", super_digest("pw", user="someone-else")))]
    no_read = [ACL(Permissions.ALL & ~Permissions.READ, Id("world", "anyone"))]
    payloads = []
    try:
        for i in range(1, 61):
            client.create(f"/ledgers/00/0000/L{i:04d}", b"x", makepath=True,
                          acl=other_only if i == 55 else None)
            ml = f"/managed-ledgers/t/n/persistent/topic-{i}"
            client.create(ml, b"", makepath=True)
            client.create(f"{ml}/c1", b"", acl=no_read if i == 50 else None)
            payloads.append(pending_delete.encode({
                "topicName": f"persistent://t/n/topic-{i}", "ledgerComponent": "MANAGED_LEDGER",
                "ledgerType": "LEDGER", "ledgerId": i, "cursorName": None, "schemaId": None,
                "offloadContext": None, "properties": {}, "reason": "test", "runId": "r"}))
    finally:
        zkutil.close(client)
    sessions: list[int] = []
    opened = ZooKeeperEndpoint.wire_reader
    monkeypatch.setattr(ZooKeeperEndpoint, "wire_reader",
                        lambda self, *a, **kw: sessions.append(1) or opened(self, *a, **kw))
    monkeypatch.setattr(permissions, "PATHS_PER_SESSION", 20)
    endpoint = ZooKeeperEndpoint(zk_target.hosts, 10.0, None)
    found = set()
    # (pace, [scan] max_sessions) -> sessions opened: unpaced, the check's own and up to two more for each spread
    # read, within max_sessions; paced, one.
    for pace, most, opened_sessions in ((0.0, 8, 5), (0.0, 2, 3), (0.0, 1, 1), (1e6, 8, 1)):
        sessions.clear()
        check = permissions.check(endpoint, payloads, ledgers_root="/ledgers", layout=LedgerLayout.HIERARCHICAL,
                                  ml_root="/managed-ledgers", schemas_root="/schemas", shadows={},
                                  reads_per_second=pace, max_sessions=most)
        found.add((check.status, tuple(sorted((m.path, m.permission) for m in check.missing))))
        assert len(sessions) == opened_sessions, (pace, most)
    assert found == {("missing", (
        ("/ledgers/00/0000/L0055", READ), ("/managed-ledgers/t/n/persistent/topic-50/c1", READ)))}
