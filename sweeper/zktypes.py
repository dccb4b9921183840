"""What a ZooKeeper read returns and how ZooKeeper access fails: shared by the kazoo helpers (`sweeper.zk`) and
the wire-protocol reader (`sweeper.zkwire`), so neither imports the other for them."""

from __future__ import annotations

from dataclasses import dataclass

from kazoo.protocol.states import ZnodeStat

from sweeper.errors import Refused


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


@dataclass(frozen=True, slots=True)
class ZnodeRead:
    path: str
    data: bytes | None  # None: the znode vanished (NoNode) between listing and reading
    stat: ZnodeStat | None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class ChildrenRead:
    path: str
    children: list[str] | None  # None: the znode vanished
    error: BaseException | None = None
