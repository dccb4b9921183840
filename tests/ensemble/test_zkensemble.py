"""The three-node ensemble of the fault tests is a real one (harness.zkensemble): a write acknowledged before the
leader is killed survives it, the other two elect a new leader and keep serving writes, a restarted member rejoins
with everything it missed; a frozen leader is replaced too. And the sweeper's own ZooKeeper clients reach it as an
operator configures them: every member in the connect string, then a chroot.
"""

from __future__ import annotations

import signal
import time

import pytest
from kazoo.client import KazooClient

from harness import zkensemble as ens
from harness.zkensemble import EnsembleInfo
from sweeper.connections import Connections
from sweeper.zk import client as zkutil
from sweeper.zk.wire import WireReader
from tests.support.config import BASE_CONFIG
from tests.support.zk_ensemble import EnsembleTarget, kill_leader

pytestmark = [pytest.mark.xdist_group("zk-ensemble-harness"), pytest.mark.timeout(300)]


def test_a_write_survives_the_leader_killed_and_a_restarted_member_rejoins(
        zk_ensemble: EnsembleInfo, ensemble_target: EnsembleTarget, ensemble_zk: KazooClient) -> None:
    info = zk_ensemble
    assert len(info.members) == 3 and len({m.client_port for m in info.members}) == 3
    assert len(set(info.ports)) == 9 and len(set(info.data_dirs.values())) == 3
    ensemble_zk.create("/before", b"acknowledged before the kill")

    election = kill_leader(info)
    assert election.new_leader is not election.killed and not election.killed.running
    print(f"\nkilled {election.killed}; {election.new_leader} leads after {election.elected_s:.2f} s")
    # The session rode out the election (kazoo reconnected to a survivor), and two of three are a quorum for writes.
    assert ensemble_zk.get("/before")[0] == b"acknowledged before the kill"
    ensemble_zk.create("/during", b"written with one member down")
    others = [m for m in info.members if m is not election.killed]
    assert sorted(ens.mode(m) for m in others) == ["follower", "leader"]

    ens.restart(info, election.killed)
    assert ens.mode(election.killed) == "follower"  # it rejoins under the new leader, it does not take over
    # Read from the restarted member alone: it caught up with the write it missed.
    alone = zkutil.connect(f"{election.killed.address}{ensemble_target.chroot}")
    try:
        assert alone.get("/during")[0] == b"written with one member down"
        assert alone.get("/before")[0] == b"acknowledged before the kill"
    finally:
        zkutil.close(alone)
    ens.wait_for_quorum(info)


def test_a_frozen_leader_is_replaced_and_rejoins_when_thawed(
        zk_ensemble: EnsembleInfo, ensemble_target: EnsembleTarget, ensemble_zk: KazooClient) -> None:
    """SIGSTOP (a long GC pause): the followers give up on the leader after syncLimit ticks and elect another; thawed,
    the old leader finds it has no followers left and follows."""
    info = zk_ensemble
    frozen = ens.leader(info)
    started = time.monotonic()
    ens.freeze(info, frozen)
    new = ens.leader(info, timeout=30)
    print(f"\nfroze {frozen}; {new} leads after {time.monotonic() - started:.2f} s")
    assert new is not frozen and ens.mode(frozen, timeout=0.3) == ""
    # A session on the frozen member hears nothing until its read timeout (2/3 of the session's) and then moves to
    # another member; a create sent into the frozen socket meanwhile fails with ConnectionLoss (never applied: the
    # frozen member processed nothing), so kazoo's own retry sends it again.
    short = zkutil.connect(ensemble_target.hosts, timeout=4.0)
    try:
        short.retry(short.create, "/while-frozen", b"x")
    finally:
        zkutil.close(short)
    ens.thaw(info, frozen)
    ens.wait_for_quorum(info)
    assert ens.mode(frozen) == "follower"  # it rejoins under the leader elected meanwhile


def test_stop_and_restart_keep_ports_and_data(zk_ensemble: EnsembleInfo, ensemble_target: EnsembleTarget,
                                              ensemble_zk: KazooClient) -> None:
    info = zk_ensemble
    follower = next(m for m in info.members if ens.mode(m) == "follower")
    ports, data = (follower.client_port, follower.quorum_port, follower.election_port), follower.data_dir
    old_pid = follower.pid
    ens.stop(info, follower)
    assert not follower.running and ens.mode(follower) == ""
    ensemble_zk.create("/while-stopped", b"y")
    ens.restart(info, follower)
    assert follower.pid != old_pid
    assert (follower.client_port, follower.quorum_port, follower.election_port) == ports
    assert follower.data_dir == data
    ens.wait_for_quorum(info)


def test_the_sweepers_clients_reach_every_member_through_a_chroot(
        zk_ensemble: EnsembleInfo, ensemble_target: EnsembleTarget, ensemble_zk: KazooClient) -> None:
    """`[bookkeeper] zookeeper = "h:a,h:b,h:c/chroot"` reaches the chroot over kazoo and over the wire reader (the
    scan's and the delete verification's multiRead), from whichever member it lands on, the leader down too."""
    ensemble_zk.create("/ledgers/00/0000/L0007", b"seven", makepath=True)
    cfg = BASE_CONFIG.replace(bookkeeper={"zookeeper": ensemble_target.hosts, "ledgers_root": "/ledgers"})
    endpoint = Connections.from_config(cfg).bookkeeper
    assert endpoint.hosts == ensemble_target.hosts
    with endpoint.session() as client:
        assert client.get("/ledgers/00/0000/L0007")[0] == b"seven"
    for member in zk_ensemble.members:  # each member alone, then all of them
        one = f"{member.address}{ensemble_target.chroot}"
        with WireReader(one, multi_read=10) as reader:
            [read] = reader.get_many(["/ledgers/00/0000/L0007"])
            assert read.data == b"seven" and read.error is None
    ens.kill(zk_ensemble, ens.leader(zk_ensemble), signal.SIGKILL)
    ens.leader(zk_ensemble, timeout=30)
    with endpoint.wire_reader(multi_read=10) as reader:
        [read] = reader.get_many(["/ledgers/00/0000/L0007"])
        [listing] = reader.children_many(["/ledgers/00/0000"])
    assert read.data == b"seven" and listing.children == ["L0007"]


def _many(client: KazooClient, count: int) -> list[str]:
    from harness.sandbox.seed import create_many

    client.ensure_path("/many")
    paths = [f"/many/z{i:05d}" for i in range(count)]
    create_many(client, ((p, p.encode()) for p in paths))
    return paths


@pytest.mark.parametrize("multi_read", [1, 10], ids=["getData", "multiRead"])
def test_the_wire_reader_rides_out_the_leaders_kill_mid_iteration(
        zk_ensemble: EnsembleInfo, ensemble_target: EnsembleTarget, ensemble_zk: KazooClient, multi_read: int) -> None:
    """Every member drops its clients when the leader dies; the scan's reader reconnects (another member first, its
    session resumed) and sends again the reads that were in flight: every read comes back, in order, once."""
    from sweeper.ratelimit import TokenBucket

    paths = _many(ensemble_zk, 3000)
    # Paced (about 2 s in all), so the kill lands with reads in flight and more to send.
    with WireReader(ensemble_target.hosts, multi_read=multi_read, limiter=TokenBucket(1500)) as reader:
        session = reader.session_id
        results = []
        for read in reader.get_many(paths, window=200):
            results.append(read)
            if len(results) == 600:
                election = kill_leader(zk_ensemble)
        assert [r.path for r in results] == paths
        assert all(r.error is None and r.data == r.path.encode() for r in results)
        assert reader.reconnects >= 1 and reader.session_id == session  # resumed, not a new session
        [listing] = reader.children_many(["/many"])  # the reader stays usable
    assert listing.children is not None and len(listing.children) == 3000
    print(f"\n{election.killed} killed after 600 reads; {reader.reconnects} reconnect(s), "
          f"new leader after {election.elected_s:.2f} s")


def test_the_wire_reader_gives_up_once_no_quorum_returns_within_its_timeout(
        zk_ensemble: EnsembleInfo, ensemble_target: EnsembleTarget, ensemble_zk: KazooClient) -> None:
    """Two of three members gone: the last one drops its clients and serves nobody. The reader tries for its timeout
    and then fails the iteration with ZooKeeperUnavailableError (a refusal, exit 3), never hangs."""
    from sweeper.zk.errors import ZooKeeperUnavailableError

    paths = _many(ensemble_zk, 50)
    with WireReader(ensemble_target.hosts, timeout=3.0) as reader:
        assert len(list(reader.get_many(paths))) == 50
        follower = next(m for m in zk_ensemble.members if ens.mode(m) == "follower")
        for member in (follower, ens.leader(zk_ensemble)):
            ens.kill(zk_ensemble, member)
        started = time.monotonic()
        with pytest.raises(ZooKeeperUnavailableError, match=r"cannot connect|closed by the server|lost"):
            list(reader.get_many(paths))
        took = time.monotonic() - started
    assert took < 3.0 + 5.0, took
