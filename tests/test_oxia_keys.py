"""Oxia's key routing is ours (`sweeper.metastore.oxia_keys`), shared by the store and the read client: the server's
xxh3 rule on its own vectors, and the mended PyPI client routing every key to the shard our gRPC read client reads
it from. No server needed."""

from __future__ import annotations

import random
import string
import threading
from types import SimpleNamespace

import pytest
import xxhash

from sweeper.metastore import oxia_grpc, oxia_keys
from sweeper.metastore.oxia_client_fix import mend_the_pypi_client


def _even_shards(count: int) -> list[tuple[int, int, int]]:
    """(id, low, high) ranges splitting the hash space as the coordinator does for `count` initial shards."""
    step = (oxia_keys.HASH_SPACE_END + 1) // count
    bounds = [i * step for i in range(count)] + [oxia_keys.HASH_SPACE_END + 1]
    return [(i, bounds[i], bounds[i + 1] - 1) for i in range(count)]


def _keys(n: int) -> list[str]:
    rng = random.Random(36)
    ledgers = [f"/ledgers/{i // 10_000 % 100:02d}/{i // 100 % 10_000:04d}/L{i % 10_000:04d}" for i in range(n // 2)]
    other = ["/" + "/".join("".join(rng.choices(string.printable, k=rng.randint(1, 12))) for _ in range(3))
             for _ in range(n // 2)]
    return ledgers + other + ["", "/", "é/日本", "a" * 1000]


def test_the_server_hash_is_the_servers_on_its_own_vectors() -> None:
    assert {k: oxia_keys.server_hash(k) for k in oxia_keys.ROUTING_VECTORS} == oxia_keys.ROUTING_VECTORS
    oxia_keys.check_server_hash()
    assert all(0 <= oxia_keys.server_hash(k) <= oxia_keys.HASH_SPACE_END for k in _keys(1000))


@pytest.mark.parametrize("shards", [1, 4, 7, 16])
def test_the_mended_pypi_client_routes_every_key_where_the_read_client_reads_it(shards: int) -> None:
    from oxia.internal import service_discovery

    mend_the_pypi_client()
    ranges = _even_shards(shards)
    discovery = object.__new__(service_discovery.ServiceDiscovery)
    discovery._lock = threading.Lock()
    discovery._assignments = {
        i: service_discovery.Shard(i, f"node{i}:6648", service_discovery.HashRange(
            SimpleNamespace(min_hash_inclusive=low, max_hash_inclusive=high)))
        for i, low, high in ranges}
    reads = oxia_grpc.ShardMap(tuple(oxia_grpc.Shard(i, f"node{i}:6648", low, high) for i, low, high in ranges))
    keys = _keys(20_000)
    assert [discovery.get_shard(k).shard for k in keys] == [reads.shard_of(k).id for k in keys]
    if shards > 1:  # the client's own rule, xxh64, would send many of them elsewhere: the test can tell
        def unmended(key: str) -> int:
            h = xxhash.xxh64(key).intdigest() & oxia_keys.HASH_SPACE_END
            return next(i for i, low, high in ranges if low <= h <= high)

        assert sum(unmended(k) != reads.shard_of(k).id for k in keys) > len(keys) // 4
