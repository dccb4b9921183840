"""The whole pipeline through TLS + SASL DIGEST-MD5 under ZooKeeper ACLs, driven by the CLI as an
operator would: the sandbox seeded by BookKeeper's identity with creator-all ACLs (BookKeeper's
zkEnableSecurity, ZkUtils.getACLs) plus world-read, or stricter ones (only bookie and the sweeper
may read), then snapshot -> reconcile -> emit -> delete. A wrong certificate, a wrong password and a missing
permission each stop the run with exit code 3, a message naming what to fix, and nothing deleted."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.security import ACL, Id, Permissions
from pyspark.sql import SparkSession

from harness.sandbox.model import OrphanKind, SandboxCluster, SandboxSpec, Status, build_cluster
from harness.sandbox.seed import seed_zookeeper
from sweeper.cli import EXIT_OK, EXIT_REFUSED, main
from sweeper.tables import open_table_store
from sweeper.zk import client as zkutil
from tests.support.broker import Broker
from tests.support.secure_zk import CREATOR_ALL_WORLD_READ, USERS, WORLD_READ, SecureZk, sasl

STRICT = [sasl("bookie", Permissions.ALL), sasl("sweeper", Permissions.READ)]
SWEEPER_DELETES = [*STRICT, sasl("sweeper", Permissions.DELETE)]


def _toml(sections: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, options in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in options.items()]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _seeded(secure_zk: SecureZk, acl: list[ACL], topics: int = 20) -> Iterator[tuple[str, SandboxCluster]]:
    """A chroot seeded by `bookie` with `acl` on every znode, a live broker registered (the session stays
    open while the block runs), and the sweeper's lock directory made writable for it."""
    chroot = secure_zk.new_chroot([sasl("bookie", Permissions.ALL), WORLD_READ] if acl == CREATOR_ALL_WORLD_READ
                                  else acl)
    bookie = secure_zk.client("bookie", chroot, default_acl=acl)
    try:
        cluster = build_cluster(SandboxSpec(seed=11, topics=topics))
        seed_zookeeper(bookie, cluster)
        bookie.create("/loadbalance/brokers/broker-1:8080", b"{}", ephemeral=True, makepath=True)
        # An operator prepares the run lock's directory (docs/operations.md).
        bookie.create("/ledger-sweeper")
        bookie.create("/ledger-sweeper/locks", acl=[sasl("sweeper", Permissions.ALL), sasl("bookie", Permissions.ALL)])
        yield chroot, cluster
    finally:
        bookie.stop()
        bookie.close()


def _config(tmp_path: Path, secure_zk: SecureZk, chroot: str, broker: Broker, name: str = "cluster",
            **access: Any) -> Path:
    options = {**secure_zk.access_options(), **access}
    path = tmp_path / f"{name}.toml"
    path.write_text(_toml({
        "bookkeeper": {"zookeeper": secure_zk.tls_hosts + chroot, "session_timeout_s": 10.0, **options},
        "tables": {"root": str(tmp_path / "tables"), "engine": "delta-rs"},
        # The seed's namespaces replicate to this cluster by name: the repair acts only where it is named.
        "pulsar": {"cluster_name": "sandbox"},
        "offload": {"enabled": False},
        "safety": {"max_orphan_fraction": 1.0, "bookkeeper_dedicated": True},
        "system_topic": {**broker.config(read_in_snapshot=False)},
        "delete": {"deletes_per_second": 100000.0, "in_task_attempts": 1, "op_timeout_s": 5.0},
    }))
    return path


def _ledgers(client: KazooClient, root: str = "/ledgers") -> set[str]:
    out, stack = set(), [root]
    while stack:
        node = stack.pop()
        children = client.get_children(node)
        if node.rsplit("/", 1)[-1].startswith("L"):
            out.add(node)
        stack.extend(zkutil.join(node, c) for c in children)
    return out


def _orphans(cluster: SandboxCluster) -> int:
    """Offload is off here: a BookKeeper copy released by an offload stays until its offloaded copy is seen."""
    return sum(1 for x in cluster.ledgers.values() if x.status is Status.ORPHAN
               and x.orphan_kind is not OrphanKind.BOOKKEEPER_DELETED_BUT_PRESENT)


def _grant_delete_on_ledger_directories(secure_zk: SecureZk, chroot: str) -> None:
    """Minimal rights for deleting: DELETE on the directories that hold ledger znodes (and their parents,
    which the tidy step removes when emptied); READ everywhere else, from STRICT."""
    bookie = secure_zk.client("bookie", chroot)
    try:
        stack = ["/ledgers"]
        while stack:
            node = stack.pop()
            children = bookie.get_children(node)
            directories = [zkutil.join(node, c) for c in children if not c.startswith("L")]
            if children and (directories or node != "/ledgers"):
                bookie.set_acls(node, SWEEPER_DELETES)
            stack.extend(directories)
    finally:
        bookie.stop()
        bookie.close()


def test_sweep_through_tls_and_sasl_with_only_the_sweeper_reading(
        spark: SparkSession, tmp_path: Path, secure_zk: SecureZk, broker: Broker,
        capsys: pytest.CaptureFixture[str]) -> None:
    with _seeded(secure_zk, STRICT) as (chroot, cluster):
        _grant_delete_on_ledger_directories(secure_zk, chroot)
        _sweep_as_the_sweeper(spark, tmp_path, secure_zk, broker, capsys, chroot, cluster)


def _sweep_as_the_sweeper(spark: SparkSession, tmp_path: Path, secure_zk: SecureZk, broker: Broker,
                          capsys: pytest.CaptureFixture[str], chroot: str, cluster: SandboxCluster) -> None:
    config = _config(tmp_path, secure_zk, chroot, broker)
    admin = secure_zk.client("super", chroot)
    try:
        before = _ledgers(admin)
        assert main(["sweep", "--config", str(config), "--execute", "--json"]) == EXIT_OK
        out = capsys.readouterr().out
        summary = json.loads(out.strip().splitlines()[-1])
        after = _ledgers(admin)
    finally:
        admin.stop()
        admin.close()
    orphans = _orphans(cluster)
    assert orphans > 0
    assert summary["stages"]["delete"]["deleted"] == summary["stages"]["reconcile"]["candidate.ledger"] == orphans
    assert len(before - after) == orphans and after <= before
    snapshot = summary["stages"]["snapshot"]
    assert snapshot["bk_ledgers"] == cluster.counts()["bk_ledgers"]
    # The run's report shows the ZooKeeper load and both limits.
    assert snapshot["zk_reads"] >= len(before) and snapshot["reads_per_second_limit"] == 20000
    assert 1 <= snapshot["scan_sessions"] <= 8
    assert "ZooKeeper: " in out and "limit 20,000 reads/s" in out and "deletes/s per task" in out
    assert USERS["sweeper"] not in out
    # Issue 22: the retention repair reaches the secured ensemble as every other stage does (TLS + SASL, the
    # sweeper's read-only identity): its dry run re-reads each planned topic's and subscription's znode there.
    assert main(["retention", "--config", str(config)]) == EXIT_OK
    out = capsys.readouterr().out
    unloaded = sum(1 for e in cluster.retention if e.status == "candidate")
    assert unloaded > 0 and out.count("load_topic           would_load") == unloaded, out
    assert "dry run: pass --execute" in out


def test_bookkeeper_acls_let_the_sweeper_read_but_not_delete(
        spark: SparkSession, tmp_path: Path, secure_zk: SecureZk, broker: Broker,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Creator-all + world-read: snapshot and reconcile work for any identity; deleting needs the
    creator's. The delete run is refused before it deletes anything, then goes through as bookie."""
    with _seeded(secure_zk, CREATOR_ALL_WORLD_READ) as (chroot, cluster):
        _refused_then_deleted_as_bookie(spark, tmp_path, secure_zk, broker, capsys, chroot, cluster)


def _refused_then_deleted_as_bookie(spark: SparkSession, tmp_path: Path, secure_zk: SecureZk, broker: Broker,
                                    capsys: pytest.CaptureFixture[str], chroot: str, cluster: SandboxCluster) -> None:
    config = _config(tmp_path, secure_zk, chroot, broker)
    admin = secure_zk.client("super", chroot)
    try:
        before = _ledgers(admin)
        assert main(["sweep", "--config", str(config), "--execute"]) == EXIT_REFUSED
        err = capsys.readouterr().err
        assert "no DELETE permission on znode /ledgers/" in err and "(ZooKeeper NoAuth)" in err
        assert "sasl:sweeper" in err and "nothing was deleted" in err
        assert _ledgers(admin) == before
        store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
        runs = {r["stage"]: r["status"] for r in store.read("runs").toArrow().to_pylist()}
        assert runs == {"snapshot": "succeeded", "reconcile": "succeeded", "retention_debt": "succeeded",
                        "emit": "succeeded", "delete": "refused"}

        # With BookKeeper's own identity (the znodes' creator) the same marks are deleted.
        as_bookie = _config(tmp_path, secure_zk, chroot, broker, name="as-bookie",
                            **secure_zk.access_options("bookie"))
        assert main(["delete", "--config", str(as_bookie), "--execute", "--json"]) == EXIT_OK
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["counts"]["deleted"] == _orphans(cluster) == len(before - _ledgers(admin))
    finally:
        admin.stop()
        admin.close()


def test_wrong_certificate_wrong_password_and_missing_read_permission_exit_3(
        spark: SparkSession, tmp_path: Path, secure_zk: SecureZk, broker: Broker,
        capsys: pytest.CaptureFixture[str]) -> None:
    with _seeded(secure_zk, STRICT, topics=8) as (chroot, _):
        _each_refusal(spark, tmp_path, secure_zk, broker, capsys, chroot)


def _each_refusal(spark: SparkSession, tmp_path: Path, secure_zk: SecureZk, broker: Broker,
                  capsys: pytest.CaptureFixture[str], chroot: str) -> None:
    pki = secure_zk.pki
    password_file = tmp_path / "wrong.password"
    password_file.write_text("not-the-password\n")
    cases = {
        "wrong-cert": ({"tls_cert_file": str(pki.rogue_client_cert), "tls_key_file": str(pki.rogue_client_key)},
                       "refused our client certificate"),
        "wrong-ca": ({"tls_ca_file": str(pki.rogue_ca)}, "TLS certificate is not trusted"),
        "wrong-password": ({"sasl_password_file": str(password_file)},
                           "SASL DIGEST-MD5 login as 'sweeper' refused"),
        "stranger": (secure_zk.access_options("stranger"), "no READ permission on znode /ledgers (ZooKeeper NoAuth)"),
    }
    for name, (access, message) in cases.items():
        config = _config(tmp_path, secure_zk, chroot, broker, name=name, **access)
        assert main(["snapshot", "--config", str(config)]) == EXIT_REFUSED, name
        err = capsys.readouterr().err
        assert err.startswith("refused: ") and message in err, (name, err)
        assert "not-the-password" not in err and "Traceback" not in err

    # Listing allowed, one ledger not: the Spark task that meets it fails the snapshot, naming it.
    bookie = secure_zk.client("bookie", chroot)
    try:
        hidden = sorted(_ledgers(bookie))[3]
        bookie.set_acls(hidden, [sasl("bookie", Permissions.ALL)])
    finally:
        bookie.stop()
        bookie.close()
    config = _config(tmp_path, secure_zk, chroot, broker, name="one-hidden")
    assert main(["snapshot", "--config", str(config)]) == EXIT_REFUSED
    err = capsys.readouterr().err
    assert f"no READ permission on znode {hidden} (ZooKeeper NoAuth)" in err
    store = open_table_store(str(tmp_path / "tables"), spark, engine="delta-rs")
    assert not store.exists("bk_ledgers")  # nothing half-written
    assert {r["status"] for r in store.read("runs").toArrow().to_pylist()} == {"refused"}  # as exit 3 says
    assert all(Id("sasl", "stranger") != acl.id for acl in STRICT)
