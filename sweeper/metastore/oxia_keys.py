"""What an Oxia server does with a key, for every module that reads or writes one: the shard it routes the key to
(`server_hash`), the order a shard returns keys in (`hierarchical_key`), the key ranges that hold a directory's
children and grandchildren, and how a failed read is reported (`OxiaUnavailableError`).

Nothing here uses the PyPI `oxia` client: the store (`oxia.OxiaStore`, over that client, whose router
`oxia_client_fix` replaces with `server_hash`) and the gRPC read client (`oxia_grpc.OxiaReadClient`) both route and
order keys by these rules, so a key one writes is where the other reads it.
"""

from __future__ import annotations

from sweeper.metastore.errors import OxiaUnavailableError

# ---- shard routing ---------------------------------------------------------------------------------------------

# The server routes a key to the shard whose hash range holds xxh3_64(key) & 0xffffffff (oxia-db/oxia
# common/hash/hash.go `Xxh332`; its test vectors: foo 125730186, bar 2687685474, baz 862947621). PyPI's
# `oxia` 0.2.1 hashes with xxh64 instead (internal/service_discovery.py `get_shard`), so on a namespace of more
# than one shard its `get`, `put` and `delete` reach the wrong shard: a ledger Pulsar wrote reads as absent.
# Range scans ask every shard and are unaffected. `oxia_client_fix` replaces the client's router, once, by this
# rule, and `check_server_hash` proves it on the server's vectors before any store or read client is used.
ROUTING_VECTORS = {"foo": 125730186, "bar": 2687685474, "baz": 862947621}
HASH_SPACE_END = 0xFFFFFFFF


def server_hash(key: str) -> int:
    """The 32-bit hash the server routes `key` by (its shards' inclusive ranges cover 0..HASH_SPACE_END)."""
    import xxhash

    return int(xxhash.xxh3_64(key).intdigest()) & HASH_SPACE_END


def check_server_hash() -> None:
    """Refuses a host whose xxhash would route keys unlike the server (the store's gets and the read client's)."""
    wrong = {k: server_hash(k) for k, v in ROUTING_VECTORS.items() if server_hash(k) != v}
    if wrong:
        raise OxiaUnavailableError(f"this host's xxhash routes keys unlike the Oxia server ({wrong}): refusing to "
                                   "read a store whose records would look absent")


# ---- key order and ranges --------------------------------------------------------------------------------------


def children_range(path: str) -> tuple[str, str]:
    """The key range of `path`'s direct children under Oxia's hierarchical sort (`OxiaMetadataStore.getChildren`)."""
    prefix = "/" if path == "/" else path.rstrip("/") + "/"
    return prefix, prefix + "/"


def parent_of(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0] or "/"


def hierarchical_key(key: str) -> tuple[int, bytes]:
    """A sort key for the order a shard returns its records in: the server's hierarchical encoding
    (common/compare/encode.go `encoderHierarchical.Encode`, what its Pebble store compares): keys sort by their
    number of '/' (a trailing "//" counting once), then bytewise with '/' after every other byte. The PyPI and Go
    clients merge shards with `CompareWithSlash` instead, which orders keys of different depths otherwise; for the
    keys of one directory listing ([P/, P//): one depth, one prefix, no '/' after it) both are plain byte order."""
    depth = key.count("/")
    if depth and key.endswith("//"):
        depth -= 1
    return depth, key.encode().replace(b"/", b"\xff")


def grandchildren_range(path: str) -> tuple[str, str]:
    """The keys two levels below `path` (`path/a/b`), as one range under the hierarchical encoding
    (`hierarchical_key`): all of them have `path`'s depth + 2 and begin with `path/`, so they lie together, after
    `path/\\x00/` and before `path///` (whose trailing "//" counts once). Only that encoding makes it so: under
    `CompareWithSlash` the range is empty (its start sorts after its end), and under byte order it holds `path`'s
    own children whose names sort below '/' (a topic named `-x` or `.x`) next to their children. A caller takes a
    non-empty answer whose every key is `path/a/b` for the grandchildren, and anything else as no answer."""
    base = path.rstrip("/")
    return f"{base}/\x00/", f"{base}///"
