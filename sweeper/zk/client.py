"""Small ZooKeeper adapter over kazoo: connecting with clear errors and pipelined reads.

Pipelining matters: a sequential `get` pays a full round trip per znode; keeping a window of
requests in flight on one session turns the scan into a stream.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import AuthFailedError, NoAuthError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from sweeper.records import ChildrenRead, ZnodeRead
from sweeper.zk.errors import (
    WrongRootError,
    ZooKeeperPermissionError,
    ZooKeeperSecurityError,
    ZooKeeperUnavailableError,
)

if TYPE_CHECKING:
    from sweeper.zk.security import ZkSecurity

DEFAULT_WINDOW = 1000

# kazoo logs every connection attempt at WARNING while a server is down; our error says it once.
logging.getLogger("kazoo.client").setLevel(logging.ERROR)


def connect(hosts: str, timeout: float = 15.0, read_only: bool = False,
            security: ZkSecurity | None = None) -> KazooClient:
    """Connected client for `hosts` (which may carry a chroot, e.g. `zk1:2181/pulsar`).

    With `security` (TLS, SASL, digest credentials), one short wire-protocol session first proves
    the handshake and the login, so that a wrong certificate or password is a clear error at once
    rather than kazoo retrying until the timeout.
    """
    kwargs = {}
    if security is not None and security.enabled:
        from sweeper.zk.wire import WireReader

        WireReader(hosts, timeout=timeout, security=security).close()
        kwargs = security.kazoo_kwargs()
    client = KazooClient(hosts=hosts, timeout=timeout, read_only=read_only, connection_retry=None, **kwargs)
    try:
        client.start(timeout=timeout)
        if kwargs.get("sasl_options"):
            # kazoo reports CONNECTED before its SASL exchange; the first request shows whether it held.
            client.exists("/")
    except KazooTimeoutError as exc:
        client.close()
        raise ZooKeeperUnavailableError(
            f"cannot connect to ZooKeeper at {hosts!r} within {timeout:.0f}s: is the server up and the "
            "connect string right?"
        ) from exc
    except AuthFailedError as exc:
        close(client)
        assert security is not None
        raise ZooKeeperSecurityError(
            f"ZooKeeper at {hosts!r} refused the login ({security.describe()}): wrong user name or password?"
        ) from exc
    return client


def close(client: KazooClient) -> None:
    try:
        client.stop()
    finally:
        client.close()


def require_node(client: KazooClient, path: str, what: str) -> None:
    if client.exists(path) is None:
        hosts = getattr(client, "hosts", "?")
        raise WrongRootError(
            f"{what} root {path!r} does not exist in {hosts}: check the root path and chroot (or namespace)"
        )


def get_many(client: KazooClient, paths: Iterable[str], window: int = DEFAULT_WINDOW) -> Iterator[ZnodeRead]:
    """Read znodes with up to `window` requests in flight; results come back in input order."""
    in_flight: deque[tuple[str, object]] = deque()

    def settle() -> ZnodeRead:
        path, pending = in_flight.popleft()
        try:
            data, stat = pending.get()  # type: ignore[attr-defined]
            return ZnodeRead(path, data, stat)
        except NoNodeError:
            return ZnodeRead(path, None, None)
        except NoAuthError:
            return ZnodeRead(path, None, None, ZooKeeperPermissionError(path, "READ"))
        except Exception as exc:  # reported per znode so one bad read never sinks the scan
            return ZnodeRead(path, None, None, exc)

    for path in paths:
        in_flight.append((path, client.get_async(path)))
        if len(in_flight) >= window:
            yield settle()
    while in_flight:
        yield settle()


def children_many(
    client: KazooClient, paths: Iterable[str], window: int = DEFAULT_WINDOW
) -> Iterator[ChildrenRead]:
    in_flight: deque[tuple[str, object]] = deque()

    def settle() -> ChildrenRead:
        path, pending = in_flight.popleft()
        try:
            return ChildrenRead(path, sorted(pending.get()))  # type: ignore[attr-defined]
        except NoNodeError:
            return ChildrenRead(path, None)
        except NoAuthError:
            return ChildrenRead(path, None, ZooKeeperPermissionError(path, "READ"))
        except Exception as exc:
            return ChildrenRead(path, None, exc)

    for path in paths:
        in_flight.append((path, client.get_children_async(path)))
        if len(in_flight) >= window:
            yield settle()
    while in_flight:
        yield settle()


def join(parent: str, child: str) -> str:
    return f"{parent.rstrip('/')}/{child}" if parent != "/" else f"/{child}"


class ZnodeReader(Protocol):
    """Bulk, pipelined reads: what a scan task needs from ZooKeeper."""

    def get_many(self, paths: Iterable[str], window: int = DEFAULT_WINDOW) -> Iterator[ZnodeRead]: ...

    def children_many(self, paths: Iterable[str], window: int = DEFAULT_WINDOW) -> Iterator[ChildrenRead]: ...


class KazooReader:
    """`ZnodeReader` over a kazoo client (planning, tests, and anywhere a client is at hand)."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client

    def get_many(self, paths: Iterable[str], window: int = DEFAULT_WINDOW) -> Iterator[ZnodeRead]:
        return get_many(self.client, paths, window)

    def children_many(self, paths: Iterable[str], window: int = DEFAULT_WINDOW) -> Iterator[ChildrenRead]:
        return children_many(self.client, paths, window)
