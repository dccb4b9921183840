"""WireReader against a real ZooKeeper: every read must match what kazoo sees."""

from __future__ import annotations

import os
import time

import pytest
from kazoo.client import KazooClient

from harness.zkserver import free_port
from sweeper.records import ChildrenRead, ZnodeRead
from sweeper.zk import handshake, jute
from sweeper.zk.errors import ZooKeeperPermissionError, ZooKeeperUnavailableError, ZooKeeperWireError
from sweeper.zk.wire import WireReader

from .conftest import ZkTarget


@pytest.fixture(params=[1, 5], ids=["single", "multi_read"])
def multi_read(request: pytest.FixtureRequest) -> int:
    """Reads per request: every result must be the same whether or not they travel as multiRead."""
    return request.param


def test_get_many_matches_kazoo(zk: KazooClient, zk_target: ZkTarget, multi_read: int) -> None:
    zk.create("/a", b"alpha")
    zk.create("/a/b", b"beta")
    zk.set("/a/b", b"beta-2")  # version and mzxid differ from the create
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        reads = list(reader.get_many(["/a", "/a/b"]))
    assert [r.path for r in reads] == ["/a", "/a/b"]
    for read in reads:
        assert isinstance(read, ZnodeRead)
        data, stat = zk.get(read.path)
        assert (read.data, read.stat, read.error) == (data, stat, None)
        assert tuple(read.stat) == tuple(stat)
    assert reads[1].stat.version == 1
    assert reads[0].stat.numChildren == 1


def test_children_many_matches_sorted_kazoo(zk: KazooClient, zk_target: ZkTarget, multi_read: int) -> None:
    for name in ["zeta", "alpha", "mu", "beta"]:
        zk.create(f"/p/{name}", makepath=True)
    zk.create("/leaf")
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        reads = list(reader.children_many(["/p", "/leaf", "/missing"]))
    assert reads == [
        ChildrenRead("/p", sorted(zk.get_children("/p"))),
        ChildrenRead("/leaf", []),
        ChildrenRead("/missing", None),
    ]
    assert reads[0].children == ["alpha", "beta", "mu", "zeta"]


def test_missing_znode_reads_as_none(zk_target: ZkTarget, multi_read: int) -> None:
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        assert list(reader.get_many(["/nope"])) == [ZnodeRead("/nope", None, None)]


def test_order_kept_across_windows_with_missing_paths(zk: KazooClient, zk_target: ZkTarget, multi_read: int) -> None:
    paths = [f"/n{i:02d}" for i in range(50)]
    for i, path in enumerate(paths):
        if i % 3:
            zk.create(path, f"value-{i}".encode())
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        reads = list(reader.get_many(paths, window=7))
        listings = list(reader.children_many(paths, window=7))
    assert [r.path for r in reads] == paths
    assert [r.path for r in listings] == paths
    for i, read in enumerate(reads):
        if i % 3:
            assert read.data == f"value-{i}".encode()
            assert read.stat == zk.get(read.path)[1]
            assert listings[i].children == []
        else:
            assert (read.data, read.stat, read.error) == (None, None, None)
            assert listings[i].children is None


def test_empty_none_and_binary_data(zk: KazooClient, zk_target: ZkTarget, multi_read: int) -> None:
    binary = bytes(range(256)) * 4 + b"\x00\xff\x00"
    zk.create("/empty", b"")
    zk.create("/none", None)
    zk.create("/binary", binary)
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        reads = {r.path: r for r in reader.get_many(["/empty", "/none", "/binary"])}
    for path in reads:
        assert (reads[path].data, reads[path].stat) == zk.get(path)
    assert reads["/empty"].data == b""
    assert reads["/none"].data is None
    assert reads["/binary"].data == binary
    assert reads["/binary"].stat.dataLength == len(binary)


def test_one_megabyte_znode(zk: KazooClient, zk_target: ZkTarget, multi_read: int) -> None:
    # 1 MB: the server refuses requests over jute.maxbuffer (default 1 MiB - 1), create included.
    big = os.urandom(1_000_000)
    zk.create("/big", big)
    zk.create("/small", b"after")
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        reads = list(reader.get_many(["/small", "/big", "/small", "/big", "/small"]))
    assert [r.data for r in reads] == [b"after", big, b"after", big, b"after"]
    assert reads[1].stat == zk.get("/big")[1]


def _create_children(zk: KazooClient, parent: str, names: list[str]) -> None:
    zk.create(parent)
    for start in range(0, len(names), 1000):
        for pending in [zk.create_async(f"{parent}/{name}", b"") for name in names[start : start + 1000]]:
            pending.get()


def test_parent_with_many_children(zk: KazooClient, zk_target: ZkTarget, multi_read: int) -> None:
    names = [f"child-{i:05d}-{'x' * 40}" for i in range(3000)]
    _create_children(zk, "/many", names)
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        (listing,) = reader.children_many(["/many"])
        reads = list(reader.get_many(f"/many/{name}" for name in names))
    assert listing.children == sorted(zk.get_children("/many")) == sorted(names)
    assert [r.path for r in reads] == [f"/many/{name}" for name in names]
    assert all(r.data == b"" and r.stat is not None for r in reads)


def test_listing_of_several_megabytes(zk: KazooClient, zk_target: ZkTarget, multi_read: int) -> None:
    # ~2.4 MB in one reply: more than WireReader's initial 1 MiB receive buffer.
    names = [f"{i:05d}-{'y' * 190}" for i in range(12_000)]
    _create_children(zk, "/wide", names)
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        before, listing, after = reader.children_many(["/", "/wide", "/"])
        (again,) = reader.children_many(["/wide"])
    assert listing.children == sorted(names) == sorted(zk.get_children("/wide"))
    assert again.children == listing.children
    assert before.children == after.children == ["wide"]


def test_chroot_isolation(zk: KazooClient, zk_target: ZkTarget, multi_read: int) -> None:
    zk.create("/inside", b"in")
    server = zk_target.server.connect_string
    # A sibling sharing the chroot's name as a prefix: naive string joins would reach it.
    outside = zk_target.chroot + "-outside"
    admin = KazooClient(hosts=server)
    admin.start()
    try:
        admin.create(outside, b"out")
    finally:
        admin.stop()
        admin.close()
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        reads = list(reader.get_many(["/inside", outside, zk_target.chroot, "/"]))
        (root,) = reader.children_many(["/"])
    assert reads[0].data == b"in"
    assert (reads[1].data, reads[1].stat) == (None, None)  # /t-N-outside is not under /t-N
    assert (reads[2].data, reads[2].stat) == (None, None)  # nor is /t-N itself, as /t-N/t-N
    assert reads[3].stat == zk.get("/")[1]  # "/" is the chroot
    assert root.children == sorted(zk.get_children("/")) == ["inside"]
    with WireReader(server, multi_read=multi_read) as unrooted:
        inside, sibling = unrooted.get_many([zk_target.chroot + "/inside", outside])
    assert (inside.data, sibling.data) == (b"in", b"out")


def test_relative_path_rejected(zk_target: ZkTarget, multi_read: int) -> None:
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader, pytest.raises(ValueError, match="absolute"):
        list(reader.get_many(["inside"]))


def test_unreachable_host_fails_fast() -> None:
    hosts = f"127.0.0.1:{free_port()}/chroot"
    started = time.monotonic()
    with pytest.raises(ZooKeeperUnavailableError, match=hosts):
        WireReader(hosts, timeout=2)
    assert time.monotonic() - started < 3


def test_first_reachable_host_wins(zk: KazooClient, zk_target: ZkTarget) -> None:
    zk.create("/x", b"1")
    hosts = f"127.0.0.1:{free_port()},{zk_target.hosts}"
    with WireReader(hosts, timeout=4) as reader:
        assert next(reader.get_many(["/x"])).data == b"1"


def test_a_member_behind_what_the_reader_saw_refuses_it_and_a_reconnect_resumes_the_session(
        zk: KazooClient, zk_target: ZkTarget) -> None:
    """After a lost connection the reader says the newest zxid it saw and asks for its own session back: a member
    that is behind refuses it (ZooKeeper's rule: reads never go back in time), one that is not resumes the session."""
    zk.create("/z", b"1")
    host, port = zk_target.server.host, zk_target.server.port
    with WireReader(zk_target.hosts) as reader:
        assert next(reader.get_many(["/z"])).data == b"1"
        seen = reader._last_zxid
        assert seen > 0
        with pytest.raises(ZooKeeperUnavailableError, match="handshake failed"):
            handshake._handshake(zk_target.hosts, [(host, port)], 2.0, None, last_zxid=seen + 2**40)
        sock, _, session, _, _, reached = handshake._handshake(
            zk_target.hosts, [(host, port)], 2.0, None, resume=(reader.session_id, reader._passwd), last_zxid=seen)
        sock.close()
        assert session == reader.session_id and reached == (host, port)
        # A session the server does not know (expired meanwhile) is answered with a zero timeout: a new one is made.
        sock, _, fresh, _, _, _ = handshake._handshake(zk_target.hosts, [(host, port)], 2.0, None,
                                                       resume=(12345, bytes(16)), last_zxid=seen)
        sock.close()
        assert fresh not in (0, 12345, reader.session_id)


def test_server_error_is_reported_per_read(zk: KazooClient, zk_target: ZkTarget, multi_read: int) -> None:
    from kazoo.security import make_digest_acl

    zk.create("/secret", b"s", acl=[make_digest_acl("someone", "pw", all=True)])
    zk.create("/public", b"p")
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        secret, public = reader.get_many(["/secret", "/public"])
        (listing,) = reader.children_many(["/secret"])
    # NoAuth (code -102) is the one error with its own type: it names the znode and the permission.
    assert isinstance(secret.error, ZooKeeperPermissionError)
    assert str(secret.error).startswith("no READ permission on znode /secret (ZooKeeper NoAuth)")
    assert (secret.data, secret.stat) == (None, None)
    assert public.data == b"p" and public.error is None
    assert isinstance(listing.error, ZooKeeperPermissionError) and listing.children is None
    assert str(ZooKeeperWireError(-103, "/x")) == "BadVersionError (code -103) reading '/x'"


def test_idle_session_kept_alive_by_pings(zk: KazooClient, zk_target: ZkTarget) -> None:
    zk.create("/alive", b"yes")
    with WireReader(zk_target.hosts, timeout=4) as reader:
        assert reader.session_timeout == 4.0  # the server's minimum: 2 * tickTime
        assert next(reader.get_many(["/alive"])).data == b"yes"
        # Longer than the session timeout plus the server's expiry granularity (one tick): without
        # pings the server would have expired the session and closed the socket.
        time.sleep(7)
        assert next(reader.get_many(["/alive"])).data == b"yes"
        assert next(reader.children_many(["/"])).children == ["alive"]


def test_abandoned_iteration_does_not_confuse_the_next(zk: KazooClient, zk_target: ZkTarget, multi_read: int) -> None:
    for i in range(30):
        zk.create(f"/k{i}", str(i).encode())
    paths = [f"/k{i}" for i in range(30)]
    with WireReader(zk_target.hosts, multi_read=multi_read) as reader:
        first = reader.get_many(paths, window=10)
        assert next(first).data == b"0"  # replies left unread on the wire
        assert [r.data for r in reader.get_many(paths[::-1])] == [str(i).encode() for i in range(29, -1, -1)]
        resumed = []
        with pytest.raises(RuntimeError, match="superseded"):
            # Results parsed before the new iteration began (the rest of a multiRead reply) may
            # still come, and correctly; then the old iteration stops loudly.
            resumed.extend(r.data for r in first)
        assert resumed == [str(i).encode() for i in range(1, 1 + len(resumed))]
        assert len(resumed) < multi_read


def test_close_ends_the_session(zk_target: ZkTarget) -> None:
    reader = WireReader(zk_target.hosts)
    reader.close()
    reader.close()  # idempotent
    with pytest.raises(ZooKeeperUnavailableError, match="closed"):
        list(reader.get_many(["/"]))


def test_server_without_multi_read_fails_clearly(
    zk: KazooClient, zk_target: ZkTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pre-3.6 server answers an opcode it doesn't know with UNIMPLEMENTED and hangs up; an
    # opcode unknown to this server provokes exactly that reply.
    monkeypatch.setattr(jute, "_OP_MULTI_READ", 99)  # the multiRead frame is built there
    zk.create("/x", b"1")
    with WireReader(zk_target.hosts, multi_read=5) as reader:
        with pytest.raises(ZooKeeperUnavailableError, match=r"multiRead .*multi_read=1"):
            list(reader.get_many(["/x"] * 12))
        with pytest.raises(ZooKeeperUnavailableError):
            list(reader.get_many(["/x"]))


def test_a_paced_reader_is_charged_for_the_reads_it_sends_not_for_the_room_a_send_had(
        zk: KazooClient, zk_target: ZkTarget) -> None:
    """Issue 37: each short listing (a few reads) used to take a whole slice of the rate from the bucket (400 tokens
    at 20,000/s), so a small cluster's scan slept most of its time. Twenty listings of three reads take 60 tokens."""
    from sweeper.ratelimit import TokenBucket

    for name in ("a", "b", "c"):
        zk.create(f"/paced/{name}", makepath=True)
    limiter = TokenBucket(20_000)
    with WireReader(zk_target.hosts, multi_read=1, limiter=limiter) as reader:
        for _ in range(20):
            assert len(list(reader.children_many(["/paced/a", "/paced/b", "/paced/c"]))) == 3
    assert limiter.acquired == 60
    assert limiter.waited_s < 0.05
