"""A secured ZooKeeper for tests: TLS client port (client certificates required), SASL DIGEST-MD5
users from a JAAS file, a `super` digest user, and what a client needs to reach it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.security import ACL, Id, Permissions

from harness.zkserver import ServerSecurity, ZooKeeperServerInfo, start_zookeeper, stop_zookeeper
from sweeper.records import Secret
from sweeper.zk.security import ZkSecurity
from tests.support.tls_certs import MutualTls, make_mutual_tls

# Test-only credentials of a throwaway server.
USERS = {"bookie": "bookie-secret", "sweeper": "sweeper-secret", "stranger": "stranger-secret"}
SUPER_PASSWORD = "super-secret"

_chroots = itertools.count(1)


@dataclass(frozen=True)
class SecureZk:
    server: ZooKeeperServerInfo
    pki: MutualTls
    home: Path

    @property
    def tls_hosts(self) -> str:
        """The TLS port by the name its certificate carries (the certificate does not name 127.0.0.1)."""
        return f"localhost:{self.server.secure_port}"

    def certificate(self, user: str | None) -> tuple[str, str]:
        """Client certificate and key: bookie has its own (its x509 id differs from the sweeper's)."""
        if user == "bookie":
            return str(self.pki.other_client_cert), str(self.pki.other_client_key)
        return str(self.pki.client_cert), str(self.pki.client_key)

    def security(self, user: str | None = "sweeper", password: str | None = None, **changes: Any) -> ZkSecurity:
        """What a session presents: TLS with a client certificate, SASL as `user`."""
        cert, key = self.certificate(user)
        base: dict[str, Any] = {"tls": True, "ca_file": str(self.pki.ca), "cert_file": cert, "key_file": key}
        if user is not None:
            base.update(sasl_mechanism="DIGEST-MD5", sasl_username=user,
                        sasl_password=Secret(password if password is not None else USERS[user]))
        return ZkSecurity(**{**base, **changes})

    def access_options(self, user: str = "sweeper", password_file: Path | None = None) -> dict[str, Any]:
        """[bookkeeper] options for the same, the password in a file as an operator would keep it."""
        if password_file is None:
            password_file = self.home / f"{user}.password"
            password_file.write_text(USERS[user] + "\n")
        cert, key = self.certificate(user)
        return {"tls": True, "tls_ca_file": str(self.pki.ca), "tls_cert_file": cert, "tls_key_file": key,
                "sasl_mechanism": "DIGEST-MD5", "sasl_username": user, "sasl_password_file": str(password_file)}

    def client(self, user: str = "bookie", chroot: str = "", default_acl: list[ACL] | None = None) -> KazooClient:
        """A kazoo session over TLS logged in as `user` ("super": the digest super user, over the plain port)."""
        if user == "super":
            client = KazooClient(hosts=self.server.connect_string + chroot, default_acl=default_acl,
                                 auth_data=[("digest", f"super:{SUPER_PASSWORD}")])
        else:
            security = self.security(user)
            kwargs = security.kazoo_kwargs()
            if default_acl is not None:
                kwargs["default_acl"] = default_acl
            client = KazooClient(hosts=self.tls_hosts + chroot, **kwargs)
        client.start(timeout=15)
        client.exists("/")  # the SASL login has gone through
        return client

    def new_chroot(self, acl: list[ACL]) -> str:
        """A fresh chroot created by the super user with `acl`."""
        chroot = f"/s-{next(_chroots)}"
        admin = self.client("super")
        try:
            admin.create(chroot, acl=acl)
        finally:
            admin.stop()
            admin.close()
        return chroot


def sasl(user: str, perms: int) -> ACL:
    return ACL(perms, Id("sasl", user))


CREATOR_ALL_WORLD_READ = [ACL(Permissions.ALL, Id("auth", "")), ACL(Permissions.READ, Id("world", "anyone"))]
WORLD_READ = ACL(Permissions.READ, Id("world", "anyone"))


def start_secure_zookeeper(home: Path) -> Iterator[SecureZk]:
    pki = make_mutual_tls(home / "pki", ip_san=False)
    server = start_zookeeper(home / "zookeeper", security=ServerSecurity(
        keystore=str(pki.server_keystore), truststore=str(pki.ca), sasl_users=tuple(USERS.items()),
        super_password=SUPER_PASSWORD))
    try:
        yield SecureZk(server, pki, home)
    finally:
        stop_zookeeper(server)
