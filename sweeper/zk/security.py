"""Connection settings for a secured ZooKeeper: TLS, SASL (DIGEST-MD5, GSSAPI) and digest credentials.

One picklable, secret-safe `ZkSecurity` per metadata store, built on the driver from one section's
access settings (`ZooKeeperAccessConfig`, [bookkeeper]'s or [pulsar]'s; the config says which reaches
which store, this module never reads the whole config), then used alike by kazoo (`kazoo_kwargs`) and
by the wire reader (`ssl_context`, `sasl_client`, `digest_credentials`). Secrets are read when it is
built, from a file or an environment variable, never from the config, and stay in `Secret`, whose repr
and str never show them.

Upstream facts relied on:
- DIGEST-MD5: ZooKeeper's server and Java client use protocol "zookeeper" and the fixed server name
  "zk-sasl-md5" (SecurityUtils.createSaslClient / createSaslServer), not the host's name.
- GSSAPI: the server principal is `<service>/<host>@REALM`, service "zookeeper" by default
  (ZKClientConfig zookeeper.sasl.client.username).
- digest ids are `user:base64(sha1(user:password))` (DigestAuthenticationProvider.generateDigest).
"""

from __future__ import annotations

import base64
import hashlib
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sweeper.config import ZooKeeperAccessConfig
from sweeper.errors import ConfigError
from sweeper.records import Secret

DIGEST_MD5_SERVER_NAME = "zk-sasl-md5"


@dataclass(frozen=True)
class ZkSecurity:
    """How to open a session to one ZooKeeper ensemble: small, picklable, safe to print."""

    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    verify_hostname: bool = True
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: Secret | None = None
    sasl_principal: str = ""
    sasl_keytab: str = ""
    sasl_service: str = "zookeeper"
    digest: Secret | None = None  # "user:password" for the `digest` scheme

    @property
    def enabled(self) -> bool:
        return self.tls or bool(self.sasl_mechanism) or self.digest is not None

    @property
    def digest_user(self) -> str:
        return self.digest.value.split(":", 1)[0] if self.digest else ""

    def digest_id(self) -> str:
        """Our `digest` ACL id, `user:base64(sha1(user:password))`; empty without digest credentials."""
        if self.digest is None:
            return ""
        user = self.digest_user
        hashed = hashlib.sha1(self.digest.value.encode()).digest()  # ZooKeeper's digest scheme, not our choice
        return f"{user}:{base64.b64encode(hashed).decode()}"

    def describe(self) -> str:
        """What this session presents, for error messages: never a secret."""
        parts = []
        if self.tls:
            parts.append(f"TLS (client certificate {self.cert_file})" if self.cert_file else "TLS")
        if self.sasl_mechanism == "DIGEST-MD5":
            parts.append(f"SASL DIGEST-MD5 as {self.sasl_username!r}")
        elif self.sasl_mechanism:
            parts.append(f"SASL {self.sasl_mechanism} as {self.sasl_principal!r}")
        if self.digest is not None:
            parts.append(f"digest credentials of {self.digest_user!r}")
        return ", ".join(parts) or "no authentication"

    # ---- TLS -------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """A client context: the server's certificate is always verified; its host name unless told not to."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = self.verify_hostname
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            if self.ca_file:
                context.load_verify_locations(cafile=self.ca_file)
            else:
                context.load_default_certs(ssl.Purpose.SERVER_AUTH)
            if self.cert_file:
                context.load_cert_chain(certfile=self.cert_file, keyfile=self.key_file or None)
        except (OSError, ssl.SSLError) as exc:
            which = "tls_ca_file" if self.ca_file and not _loadable(self.ca_file) else "tls_cert_file / tls_key_file"
            raise ConfigError(f"ZooKeeper TLS: cannot load {which} ({self.ca_file or '-'}, {self.cert_file or '-'}, "
                              f"{self.key_file or '-'}): {exc}") from exc
        return context

    # ---- SASL ------------------------------------------------------------------------------

    def sasl_client(self, host: str) -> Any:
        """A pure-sasl client for one connection to `host` (its state is per connection)."""
        try:
            from puresasl.client import SASLClient
        except ImportError as exc:  # a dependency of the project: only a broken install lacks it
            raise ConfigError("SASL to ZooKeeper needs the pure-sasl package") from exc
        if self.sasl_mechanism == "DIGEST-MD5":
            assert self.sasl_password is not None
            return SASLClient(DIGEST_MD5_SERVER_NAME, service="zookeeper", mechanism="DIGEST-MD5",
                              username=self.sasl_username, password=self.sasl_password.value)
        self.prepare_kerberos()
        return SASLClient(host, service=self.sasl_service, mechanism="GSSAPI", principal=self.sasl_principal)

    def prepare_kerberos(self) -> None:
        """GSSAPI: point MIT Kerberos at the keytab (it then gets tickets itself), and check the bindings."""
        if self.sasl_mechanism != "GSSAPI":
            return
        if self.sasl_keytab:
            os.environ["KRB5_CLIENT_KTNAME"] = self.sasl_keytab
        try:
            import kerberos  # noqa: F401 - pure-sasl's GSSAPI mechanism needs it
        except ImportError as exc:
            raise ConfigError("sasl_mechanism GSSAPI needs the `kerberos` Python package (pip install kerberos) "
                              "and a Kerberos client configuration (/etc/krb5.conf)") from exc

    # ---- kazoo -----------------------------------------------------------------------------

    def kazoo_kwargs(self) -> dict[str, Any]:
        from kazoo.security import ACL, Id, Permissions

        kwargs: dict[str, Any] = {}
        if self.tls:
            self.ssl_context()  # load errors named here, not deep inside kazoo's connection thread
            kwargs.update(use_ssl=True, ca=self.ca_file or None, certfile=self.cert_file or None,
                          keyfile=self.key_file or None, verify_certs=True, check_hostname=self.verify_hostname)
        if self.sasl_mechanism == "DIGEST-MD5":
            assert self.sasl_password is not None
            kwargs["sasl_options"] = {"mechanism": "DIGEST-MD5", "username": self.sasl_username,
                                      "password": self.sasl_password.value}
        elif self.sasl_mechanism == "GSSAPI":
            self.prepare_kerberos()
            kwargs["sasl_options"] = {"mechanism": "GSSAPI", "service": self.sasl_service,
                                      "principal": self.sasl_principal}
        if self.digest is not None:
            kwargs["auth_data"] = [("digest", self.digest.value)]
        if self.sasl_mechanism or self.digest is not None:
            # What the sweeper creates (its run lock) is its own, readable by all: as BookKeeper's
            # zkEnableSecurity does, never world-writable on a secured ensemble.
            kwargs["default_acl"] = [ACL(Permissions.ALL, Id("auth", "")), ACL(Permissions.READ, Id("world", "anyone"))]
        return kwargs


def _loadable(path: str) -> bool:
    try:
        ssl.create_default_context(cafile=path)
        return True
    except (OSError, ssl.SSLError):
        return False


def read_secret(section: str, name: str, path: str, env: str) -> Secret | None:
    """A secret from `<name>_file` (a path) or `<name>_env` (a variable name); None when neither is set."""
    if path:
        try:
            value = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"[{section}] {name}_file {path} cannot be read: {exc.strerror}") from exc
        if not value:
            raise ConfigError(f"[{section}] {name}_file {path} is empty")
        return Secret(value)
    if env:
        value = os.environ.get(env, "").strip()
        if not value:
            raise ConfigError(f"[{section}] {name}_env names ${env}, which is not set")
        return Secret(value)
    return None


def security_from_options(section: str, options: ZooKeeperAccessConfig) -> ZkSecurity:
    digest = read_secret(section, "digest_auth", options.digest_auth_file, options.digest_auth_env)
    if digest is not None and ":" not in digest.value:
        raise ConfigError(f"[{section}] digest_auth must hold user:password")
    password = None
    if options.sasl_mechanism == "DIGEST-MD5":
        password = read_secret(section, "sasl_password", options.sasl_password_file, options.sasl_password_env)
    return ZkSecurity(
        tls=options.tls, ca_file=options.tls_ca_file, cert_file=options.tls_cert_file, key_file=options.tls_key_file,
        verify_hostname=options.tls_verify_hostname, sasl_mechanism=options.sasl_mechanism,
        sasl_username=options.sasl_username, sasl_password=password, sasl_principal=options.sasl_principal,
        sasl_keytab=options.sasl_keytab, sasl_service=options.sasl_service or "zookeeper", digest=digest)


class HasZooKeeperAccess(Protocol):
    """Whatever says which access settings reach a store (`SweeperConfig.zookeeper_access`)."""

    def zookeeper_access(self, store: str) -> tuple[str, ZooKeeperAccessConfig]: ...


def bookkeeper_security(settings: HasZooKeeperAccess) -> ZkSecurity:
    """How to reach BookKeeper's metadata store."""
    return security_from_options(*settings.zookeeper_access("bookkeeper"))


def pulsar_security(settings: HasZooKeeperAccess) -> ZkSecurity:
    """How to reach Pulsar's: its own options when [pulsar] zookeeper names an ensemble, else BookKeeper's."""
    return security_from_options(*settings.zookeeper_access("pulsar"))
