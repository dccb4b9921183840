"""Small ZooKeeper adapter over kazoo: connecting with clear errors and pipelined reads.

Pipelining matters: a sequential `get` pays a full round trip per znode; keeping a window of
requests in flight on one session turns the scan into a stream.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import AuthFailedError, NoAuthError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError

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

R = TypeVar("R")


class ReadRetryingClient(KazooClient):
    """kazoo's client, whose synchronous reads ride out a lost connection.

    A leader election drops every client connection of the ensemble, and kazoo fails whatever was in flight with
    ConnectionLoss while it reconnects the session. A read is safe to send again, so `get`, `exists`,
    `get_children` and `get_acls` are, once the session is back, for up to the session timeout from the first
    failure; after that the read fails with ZooKeeperUnavailableError (a refusal: exit 3, one line) rather than a
    kazoo error and a traceback. Writes are not retried here: one whose answer was lost may have been applied, and
    its caller settles it by reading again (DESIGN.md invariant 18). Nor is an expired session: it took this run's
    ephemeral lock with it (invariant 22), and its caller must see that.
    """

    def __init__(self, *args: Any, read_retry_s: float = 15.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_retry = KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=1.0, deadline=read_retry_s,
                                      ignore_expire=False, sleep_func=self.handler.sleep_func)
        self._read_retry_s = read_retry_s

    def _reading(self, read: Callable[..., R], path: str, *args: Any, **kwargs: Any) -> R:
        try:
            return self._read_retry.copy()(read, path, *args, **kwargs)
        except RetryFailedError as exc:
            raise ZooKeeperUnavailableError(
                f"ZooKeeper at {self._given_hosts!r} did not answer a read of {path} for {self._read_retry_s:.0f}s "
                "(its connection lost again and again: no quorum, or a partition)") from exc

    @property
    def _given_hosts(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.hosts) + (self.chroot or "")

    def get(self, path: str, watch: Any = None) -> Any:
        return self._reading(super().get, path, watch=watch)

    def exists(self, path: str, watch: Any = None) -> Any:
        return self._reading(super().exists, path, watch=watch)

    def get_children(self, path: str, watch: Any = None, include_data: bool = False) -> Any:
        return self._reading(super().get_children, path, watch=watch, include_data=include_data)

    def get_acls(self, path: str) -> Any:
        return self._reading(super().get_acls, path)


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
    client = ReadRetryingClient(hosts=hosts, timeout=timeout, read_only=read_only, connection_retry=None,
                                read_retry_s=timeout, **kwargs)
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
