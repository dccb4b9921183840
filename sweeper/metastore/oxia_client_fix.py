"""The PyPI `oxia` client (0.2.1), mended once per process before any store is made: the server's key routing
(`oxia_keys.server_hash`) in place of the client's xxh64, and a race-free wait for the first shard map. Only the
store (`oxia.OxiaStore`) uses that client; the read path (`oxia_grpc`) has its own.
"""

from __future__ import annotations

import threading
from typing import Any

from sweeper.metastore.errors import OxiaUnavailableError
from sweeper.metastore.oxia_keys import check_server_hash, server_hash

_mend_lock = threading.Lock()
_mended = False


def mend_the_pypi_client() -> None:
    """Once per process, before any store is made: the server's key routing and a race-free wait for the first
    shard map (`_wait_for_the_first_map_safely`) in place of the PyPI client's own."""
    global _mended
    with _mend_lock:
        if _mended:
            return
        from oxia.internal import service_discovery

        def get_shard(self: Any, key: str) -> Any:
            h = server_hash(key)
            with self._lock:
                for shard in self._assignments.values():
                    if shard.contains(h):
                        return shard
            raise OxiaUnavailableError(f"no Oxia shard holds the hash of key {key!r}: shard assignments incomplete")

        if not hasattr(service_discovery.ServiceDiscovery, "get_shard"):
            raise OxiaUnavailableError("the installed oxia client has no ServiceDiscovery.get_shard to route keys "
                                       "with: install the version pyproject.toml pins")
        service_discovery.ServiceDiscovery.get_shard = get_shard
        _wait_for_the_first_map_safely(service_discovery)
        _mended = True
    check_server_hash()


def _wait_for_the_first_map_safely(service_discovery: Any) -> None:
    """Replaces the client's wait for its first shard map, which two races make fail or go stale.

    PyPI's `oxia` 0.2.1 (internal/service_discovery.py) starts the assignments thread before it creates the barrier
    that thread meets: on a loaded host the first map can arrive first, the thread dies on the missing attribute,
    and the constructor gives up after 30 s (a CI run lost the Oxia testbed's tests to it). The thread also meets
    the two-party barrier again on every later map, with nobody on the other side, so it never applies a second
    map. An event set by each map, waited on by the constructor, has neither race.
    """
    import grpc
    from oxia.internal.backoff import Backoff
    from oxia.internal.proto.io.streamnative.oxia import proto as pb

    discovery = service_discovery.ServiceDiscovery
    log = service_discovery.log

    def __init__(self: Any, service_address: str, connection_pool: Any, namespace: str,
                 init_timeout: float = 30) -> None:
        self._assignments = {}
        self._service_address = service_address
        self._connection_pool = connection_pool
        self._namespace = namespace
        self._closed = False
        self._lock = threading.Lock()
        self._has_a_map = threading.Event()
        self._thread = threading.Thread(target=self.get_assignments, daemon=True, name="oxia-shard-assignments")
        self._thread.start()
        if not self._has_a_map.wait(init_timeout):
            self._closed = True
            raise RuntimeError(f"Timed out after {init_timeout}s waiting for initial shard assignments from "
                               f"{service_address}")

    def get_assignments(self: Any) -> None:
        stub = self._connection_pool.get(self._service_address)
        backoff = Backoff()
        while not self._closed:
            try:
                request = pb.ShardAssignmentsRequest(namespace=self._namespace)
                for update in stub.get_shard_assignments(request):
                    self._parse_assignments(update.namespaces[self._namespace])
                    self._has_a_map.set()
                    backoff.reset()
            except grpc.RpcError as exc:
                if not self._closed:
                    if exc.code() != grpc.StatusCode.CANCELLED:
                        log.warning("Failed to get assignments: %s", exc)
                    backoff.wait_next()
            except ValueError as exc:
                # The client's close() closes its channels before it marks this object closed: the stream ends
                # CANCELLED, and the next call on the closed channel raises this. Nothing is left to read then; any
                # other ValueError still ends the thread loudly (a map it cannot apply must not pass unseen).
                if self._closed or "Channel closed" in str(exc):
                    return
                raise

    discovery.__init__ = __init__
    discovery.get_assignments = get_assignments
