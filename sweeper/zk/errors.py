"""How ZooKeeper access fails, shared by the kazoo client (`sweeper.zk.client`) and the wire reader
(`sweeper.zk.wire`). Each is a refusal (exit 3): the run stops before doing anything."""

from __future__ import annotations

from sweeper.errors import InternalError, Refused


class ZooKeeperUnavailableError(Refused, ConnectionError):
    pass


class WrongRootError(Refused, LookupError):
    pass


class ZooKeeperSecurityError(ZooKeeperUnavailableError):
    """The TLS handshake or the authentication failed: a certificate, key, password or principal to fix."""


class ZooKeeperPermissionError(Refused, PermissionError):
    """ZooKeeper refused an operation for lack of a permission (NoAuth): names the znode and the permission."""

    def __init__(self, path: str, permission: str, why: str = "", identity: str = "",
                 message: str | None = None) -> None:
        who = f" for this sweeper's identity ({identity})" if identity else ""
        super().__init__(message or f"no {permission} permission on znode {path} (ZooKeeper NoAuth){who}"
                         + (f": {why}" if why else ""))
        self.path = path
        self.permission = permission


class HandshakeRefused(InternalError):
    """One host refused our TLS session or our login: a setting to fix, not an outage. The handshake collects them
    into a ZooKeeperSecurityError once no host let us in."""


def is_connection_error(exc: BaseException) -> bool:
    """A kazoo error of the connection or the session, not of the request: another attempt may not meet it."""
    from kazoo.exceptions import (
        ConnectionClosedError,
        ConnectionDropped,
        ConnectionLoss,
        OperationTimeoutError,
        SessionExpiredError,
        SessionMovedError,
    )
    from kazoo.handlers.threading import KazooTimeoutError

    return isinstance(exc, ConnectionLoss | SessionExpiredError | OperationTimeoutError | ConnectionDropped
                      | ConnectionClosedError | SessionMovedError | KazooTimeoutError)


class ZooKeeperWireError(InternalError):
    """A per-request error code from the server, reported on the read it belongs to."""

    def __init__(self, code: int, path: str) -> None:
        from kazoo.exceptions import EXCEPTIONS

        # kazoo's names (NoAuthError, ...) read better than bare codes; its table raises on unknown ones.
        name = EXCEPTIONS[code].__name__ if code in EXCEPTIONS else "ZooKeeper error"
        super().__init__(f"{name} (code {code}) reading {path!r}")
        self.code = code
        self.path = path
