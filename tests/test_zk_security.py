"""TLS, SASL DIGEST-MD5, digest credentials and ACLs against a real secured ZooKeeper, through both of
our clients (kazoo via `sweeper.zk.client.connect`, and the wire reader)."""

from __future__ import annotations

import dataclasses

import pytest
from kazoo.security import ACL, Id, Permissions

from harness.zkserver import super_digest
from sweeper.records import Secret
from sweeper.zk import client as zkutil
from sweeper.zk.errors import ZooKeeperPermissionError, ZooKeeperSecurityError, ZooKeeperUnavailableError
from sweeper.zk.wire import WireReader
from tests.support.secure_zk import SecureZk, sasl

STRICT = [sasl("bookie", Permissions.ALL), sasl("sweeper", Permissions.READ)]


@pytest.fixture
def strict_tree(secure_zk: SecureZk) -> str:
    """A chroot whose znodes only `bookie` (all) and `sweeper` (read) may touch; returns the chroot."""
    chroot = secure_zk.new_chroot(STRICT)
    bookie = secure_zk.client("bookie", chroot, default_acl=STRICT)
    try:
        bookie.create("/ledgers/00/0000/L0001", b"ledger-1", makepath=True)
        bookie.create("/ledgers/00/0000/L0002", b"ledger-2")
    finally:
        bookie.stop()
        bookie.close()
    return chroot


def test_both_clients_read_through_tls_and_sasl(secure_zk: SecureZk, strict_tree: str) -> None:
    hosts = secure_zk.tls_hosts + strict_tree
    security = secure_zk.security("sweeper")
    with WireReader(hosts, security=security, multi_read=10) as reader:
        reads = list(reader.get_many(["/ledgers/00/0000/L0001", "/ledgers/00/0000/L0002", "/nope"]))
        assert [r.data for r in reads] == [b"ledger-1", b"ledger-2", None]
        assert list(reader.children_many(["/ledgers/00/0000"])) == [
            zkutil.ChildrenRead("/ledgers/00/0000", ["L0001", "L0002"])]
        identities = reader.who_am_i()
    assert ("sasl", "sweeper") in identities
    assert any(scheme == "x509" and "CN=ledger-sweeper" in user for scheme, user in identities)
    client = zkutil.connect(hosts, timeout=10, security=security)
    try:
        assert client.get("/ledgers/00/0000/L0001")[0] == b"ledger-1"
        assert [r.data for r in zkutil.get_many(client, ["/ledgers/00/0000/L0002"])] == [b"ledger-2"]
    finally:
        zkutil.close(client)


def test_server_certificate_from_an_unknown_ca_is_refused(secure_zk: SecureZk) -> None:
    security = secure_zk.security(ca_file=str(secure_zk.pki.rogue_ca))
    for attempt in (lambda: WireReader(secure_zk.tls_hosts, timeout=5, security=security),
                    lambda: zkutil.connect(secure_zk.tls_hosts, timeout=5, security=security)):
        with pytest.raises(ZooKeeperSecurityError, match=r"TLS certificate is not trusted.*tls_ca_file"):
            attempt()


def test_host_name_verification(secure_zk: SecureZk) -> None:
    # The server's certificate names localhost only: reached as 127.0.0.1 it fails the check ...
    by_address = f"127.0.0.1:{secure_zk.server.secure_port}"
    with pytest.raises(ZooKeeperSecurityError, match=r"does not name 127\.0\.0\.1"):
        WireReader(by_address, timeout=5, security=secure_zk.security())
    # ... unless the operator turns hostname verification off (the chain is still verified).
    relaxed = secure_zk.security(verify_hostname=False)
    WireReader(by_address, timeout=5, security=relaxed).close()
    zkutil.close(zkutil.connect(by_address, timeout=5, security=relaxed))


def test_client_certificate_the_server_does_not_trust_is_refused(secure_zk: SecureZk) -> None:
    security = secure_zk.security(cert_file=str(secure_zk.pki.rogue_client_cert),
                                  key_file=str(secure_zk.pki.rogue_client_key))
    with pytest.raises(ZooKeeperSecurityError, match=r"client certificate|tls_cert_file"):
        zkutil.connect(secure_zk.tls_hosts, timeout=5, security=security)
    no_certificate = secure_zk.security(cert_file="", key_file="")
    with pytest.raises(ZooKeeperSecurityError, match=r"client certificate|tls_cert_file"):
        WireReader(secure_zk.tls_hosts, timeout=5, security=no_certificate)


def test_plain_client_on_the_tls_port_and_tls_on_the_plain_port(secure_zk: SecureZk) -> None:
    with pytest.raises(ZooKeeperUnavailableError, match=r"set tls = true"):
        WireReader(secure_zk.tls_hosts, timeout=3)
    with pytest.raises(ZooKeeperSecurityError, match=r"TLS"):
        WireReader(f"localhost:{secure_zk.server.port}", timeout=3, security=secure_zk.security())


def test_wrong_sasl_password_is_a_clear_error_and_never_printed(secure_zk: SecureZk) -> None:
    security = secure_zk.security("sweeper", password="not-the-password")
    for attempt in (lambda: WireReader(secure_zk.tls_hosts, timeout=5, security=security),
                    lambda: zkutil.connect(secure_zk.tls_hosts, timeout=5, security=security)):
        with pytest.raises(ZooKeeperSecurityError, match=r"DIGEST-MD5 login as 'sweeper' refused") as caught:
            attempt()
        assert "not-the-password" not in str(caught.value)
    assert "not-the-password" not in repr(security) and "not-the-password" not in security.describe()


def test_missing_read_permission_names_the_znode(secure_zk: SecureZk, strict_tree: str) -> None:
    hosts = secure_zk.tls_hosts + strict_tree
    stranger = secure_zk.security("stranger")
    with WireReader(hosts, security=stranger, multi_read=5) as reader:
        (read,) = list(reader.get_many(["/ledgers/00/0000/L0001"]))
        (listing,) = list(reader.children_many(["/ledgers/00/0000"]))
    for error, path in ((read.error, "/ledgers/00/0000/L0001"), (listing.error, "/ledgers/00/0000")):
        assert isinstance(error, ZooKeeperPermissionError)
        assert str(error).startswith(f"no READ permission on znode {path} (ZooKeeper NoAuth)")
    client = zkutil.connect(hosts, timeout=5, security=stranger)
    try:
        (kazoo_read,) = list(zkutil.get_many(client, ["/ledgers/00/0000/L0002"]))
        assert isinstance(kazoo_read.error, ZooKeeperPermissionError)
    finally:
        zkutil.close(client)


def test_digest_credentials(secure_zk: SecureZk) -> None:
    """The `digest` scheme (addauth): the right credentials read, wrong ones meet NoAuth."""
    chroot = secure_zk.new_chroot([ACL(Permissions.ALL, Id("digest", super_digest("pw", user="reader")))])
    admin = secure_zk.client("super", chroot)
    try:
        admin.create("/x", b"payload", acl=[ACL(Permissions.READ, Id("digest", super_digest("pw", user="reader")))])
    finally:
        admin.stop()
        admin.close()
    hosts = secure_zk.tls_hosts + chroot
    right = secure_zk.security(user=None, digest=Secret("reader:pw"))
    assert right.digest_id() == super_digest("pw", user="reader")
    with WireReader(hosts, security=right) as reader:
        assert [r.data for r in reader.get_many(["/x"])] == [b"payload"]
        assert ("digest", "reader") in reader.who_am_i()
        # getACL with READ but not ADMIN: the digest id comes back redacted (FinalRequestProcessor).
        (acl, missing) = list(reader.acls_many(["/x", "/nope"]))
        assert acl.acl == [(Permissions.READ, "digest", "reader:x")] and missing.acl is None
    client = zkutil.connect(hosts, timeout=5, security=right)
    try:
        assert client.get("/x")[0] == b"payload"
    finally:
        zkutil.close(client)
    wrong = dataclasses.replace(right, digest=Secret("reader:nope"))
    with WireReader(hosts, security=wrong) as reader:
        (read,) = list(reader.get_many(["/x"]))
        (acl,) = list(reader.acls_many(["/x"]))
    assert isinstance(read.error, ZooKeeperPermissionError)
    assert isinstance(acl.error, ZooKeeperPermissionError)  # getACL needs READ or ADMIN
