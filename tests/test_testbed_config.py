"""The testbed's pure parts, without a JVM: tokens, the broker config it writes, the sweeper config, errors."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.testbed import server
from harness.testbed.admin import topic_path
from harness.testbed.orphans import ml_path, schema_path
from harness.testbed.processes import write_conf
from harness.testbed.server import (
    TestbedInfo,
    broker_settings,
    hs256_token,
    sweeper_toml,
)
from harness.testbed.storage import bookie_settings, plan_bookies
from sweeper import config as config_mod
from sweeper.cli import main


def _info(home: Path) -> TestbedInfo:
    return TestbedInfo(home=str(home), pulsar_home="/nowhere", pulsar_version="4.0.8", cluster="testbed",
                       zk_port=1, bk_port=2, broker_port=3, web_port=4, s3_endpoint="http://127.0.0.1:5",
                       s3_pid=0, pid=0, offload_bucket="b")


def test_token_is_an_hs256_jwt_naming_the_role() -> None:
    secret = b"k" * 32
    header, payload, signature = hs256_token(secret, "admin").split(".")

    def decode(part: str) -> bytes:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))

    assert json.loads(decode(header)) == {"alg": "HS256"}
    assert json.loads(decode(payload)) == {"sub": "admin"}
    expected = hmac.new(secret, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert decode(signature) == expected


def test_broker_conf_replaces_upstream_keys_and_appends_the_rest(tmp_path: Path) -> None:
    template = tmp_path / "standalone.conf"
    template.write_text("# comment=1\nclusterName=standalone\nmanagedLedgerMaxEntriesPerLedger=50000\n")
    target = tmp_path / "out.conf"
    settings = broker_settings(_info(tmp_path), tmp_path / "secret.key", tmp_path / "offloaders")
    write_conf(template, target, settings)
    lines = target.read_text().splitlines()
    assert "# comment=1" in lines
    assert "clusterName=testbed" in lines and "clusterName=standalone" not in lines
    assert "managedLedgerMaxEntriesPerLedger=10" in lines
    assert "PULSAR_STANDALONE_USE_ZOOKEEPER" not in target.read_text()  # an environment variable, not a key
    keys = [line.split("=", 1)[0] for line in lines if "=" in line and not line.startswith("#")]
    assert len(keys) == len(set(keys))
    assert settings["delayedDeliveryTrackerFactoryClassName"].endswith("BucketDelayedDeliveryTrackerFactory")
    assert settings["authenticationEnabled"] == "true" and settings["transactionCoordinatorEnabled"] == "true"


def test_sweeper_config_for_the_testbed_loads(tmp_path: Path) -> None:
    info = _info(tmp_path)
    path = tmp_path / "sweeper.toml"
    path.write_text(sweeper_toml(info))
    cfg = config_mod.load(path)
    assert cfg.bookkeeper.zookeeper == "127.0.0.1:1"
    assert cfg.system_topic.service_url == "pulsar://127.0.0.1:3"
    assert cfg.system_topic.auth_token_file.endswith("tokens/admin.jwt")
    assert cfg.offload.endpoint_override == "http://127.0.0.1:5"
    assert cfg.pulsar.cluster_name == "testbed"


def test_missing_distribution_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(server.TestbedError, match=r"mvn -B -f jvm/pom\.xml package"):
        server.testbed_up(tmp_path / "home", pulsar_home=tmp_path / "no-pulsar")


def test_cli_status_without_a_testbed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["testbed", "status", "--home", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["running"] is False
    assert main(["testbed", "seed", "--home", str(tmp_path)]) == 3


def test_names_as_pulsar_encodes_them() -> None:
    odd = "persistent://sweep/app/odd:name with space%x"
    assert ml_path(odd) == "/managed-ledgers/sweep/app/persistent/odd%3Aname+with+space%25x"
    assert schema_path(odd) == "/schemas/sweep/app/odd:name with space%x"
    assert topic_path(odd) == "persistent/sweep/app/odd%3Aname%20with%20space%25x"


def _oxia_info(home: Path) -> TestbedInfo:
    return TestbedInfo(**{**asdict(_info(home)), "zk_port": 0, "metadata": "oxia", "oxia_address": "127.0.0.1:6"})


def test_the_oxia_flavour_names_oxia_where_pulsar_and_bookkeeper_read_it(tmp_path: Path) -> None:
    """The broker started with --only-broker takes its store from the config file, and the sweeper's config spells
    the store as broker.conf and bookkeeper.conf do (docs/operations.md), with no ZooKeeper anywhere."""
    info = _oxia_info(tmp_path)
    settings = broker_settings(info, tmp_path / "secret.key", tmp_path / "offloaders")
    assert settings["metadataStoreUrl"] == settings["configurationMetadataStoreUrl"] == "oxia://127.0.0.1:6/default"
    assert "metadataStoreUrl" not in broker_settings(_info(tmp_path), tmp_path / "secret.key", tmp_path / "o")
    path = tmp_path / "sweeper.toml"
    path.write_text(sweeper_toml(info))
    cfg = config_mod.load(path)
    assert cfg.bookkeeper.metadata_service_uri == "metadata-store:oxia://127.0.0.1:6/default"
    assert cfg.pulsar.metadata_store_url == "oxia://127.0.0.1:6/default"
    assert cfg.bookkeeper_store().is_oxia and cfg.pulsar_store().is_oxia
    assert cfg.bookkeeper_store().ledgers_root == "/ledgers" and cfg.pulsar.zookeeper == ""
    with pytest.raises(server.TestbedError, match="Oxia"):
        _ = info.zookeeper  # a helper that would talk ZooKeeper to it is told so, not refused a connection


def test_a_state_file_from_before_the_oxia_flavour_loads_as_zookeeper(tmp_path: Path) -> None:
    old = {k: v for k, v in asdict(_info(tmp_path)).items() if k not in ("metadata", "oxia_address", "oxia_pid")}
    info = TestbedInfo(**json.loads(json.dumps(old)))
    assert not info.on_oxia and info.zookeeper == "127.0.0.1:1"
    assert info.bookkeeper_metadata_service_uri == "zk+hierarchical://127.0.0.1:1/ledgers"


def test_an_unknown_metadata_store_is_refused(tmp_path: Path) -> None:
    with pytest.raises(server.TestbedError, match="zookeeper, oxia"):
        server.testbed_up(tmp_path / "home", metadata="etcd")
    with pytest.raises(SystemExit):
        main(["testbed", "up", "--home", str(tmp_path), "--metadata", "etcd"])


def _three_bookies(info: TestbedInfo) -> TestbedInfo:
    """`info` as a new testbed records it: bookies planned at ports 10-15, bookie 0's in the old fields."""
    bookies = plan_bookies(Path(info.home), info.on_oxia, [(10, 11), (12, 13), (14, 15)])
    return TestbedInfo(**{**asdict(info), "bk_port": bookies[0].port, "bookie_http_port": bookies[0].http_port,
                          "bookies": bookies})


def test_the_broker_stripes_every_ledger_over_the_three_bookies(tmp_path: Path) -> None:
    """Issues 44/45: ensemble 3, write quorum 2, ack quorum 2, set where the broker reads them (its standalone.conf);
    the bookies no longer read that file, so nothing of theirs is in it."""
    settings = broker_settings(_three_bookies(_info(tmp_path)), tmp_path / "secret.key", tmp_path / "offloaders")
    assert (settings["managedLedgerDefaultEnsembleSize"], settings["managedLedgerDefaultWriteQuorum"],
            settings["managedLedgerDefaultAckQuorum"]) == ("3", "2", "2")
    assert "httpServerPort" not in settings and "gcWaitTime" not in settings


def test_each_bookie_has_its_own_ports_data_and_config(tmp_path: Path) -> None:
    """Three bookie processes, each with its bookie port, HTTP server port, journal and ledger dir, and the
    testbed's metadata service: on ZooKeeper the ids standalone's LocalBookkeeperEnsemble gave (bk<i>test), on Oxia
    host:port (BookKeeper's default: no bookieId)."""
    info = _three_bookies(_info(tmp_path))
    assert [b.bookie_id for b in info.bookies] == ["bk0test", "bk1test", "bk2test"]
    confs = [bookie_settings(info, b) for b in info.bookies]
    assert [c["bookiePort"] for c in confs] == ["10", "12", "14"]
    assert [c["httpServerPort"] for c in confs] == ["11", "13", "15"]
    assert len({c["ledgerDirectories"] for c in confs}) == 3
    assert all(c["journalDirectory"] == c["ledgerDirectories"] for c in confs)
    assert [c["bookieId"] for c in confs] == ["bk0test", "bk1test", "bk2test"]
    assert {c["metadataServiceUri"] for c in confs} == {"zk+hierarchical://127.0.0.1:1/ledgers"}
    assert all(c["autoRecoveryDaemonEnabled"] == "false" for c in confs)
    assert info.bookies[0].ledger_dir == tmp_path / "data" / "bookkeeper0" / "current"
    oxia = _three_bookies(_oxia_info(tmp_path))
    assert [b.bookie_id for b in oxia.bookies] == ["127.0.0.1:10", "127.0.0.1:12", "127.0.0.1:14"]
    oxia_conf = bookie_settings(oxia, oxia.bookies[1])
    assert "bookieId" not in oxia_conf
    assert oxia_conf["metadataServiceUri"] == "metadata-store:oxia://127.0.0.1:6/default"
    assert oxia.bookies[1].ledger_dir == tmp_path / "data" / "bookkeeper-oxia1" / "current"


def test_a_host_port_bookie_keeps_the_port_its_cookie_names(tmp_path: Path) -> None:
    """A bookie refuses data whose cookie names another address; on Oxia (ids host:port) a bookie started again on
    an earlier `up`'s data takes the port it had, as BKCluster does."""
    current = tmp_path / "data" / "bookkeeper-oxia1" / "current"
    current.mkdir(parents=True)
    (current / "VERSION").write_text('4\nbookieHost: "127.0.0.1:4242"\njournalDir: "x"\nledgerDirs: "1\\tx"\n')
    oxia = plan_bookies(tmp_path, True, [(10, 11), (12, 13), (14, 15)])
    assert [b.port for b in oxia] == [10, 4242, 14] and oxia[1].bookie_id == "127.0.0.1:4242"
    assert [b.port for b in plan_bookies(tmp_path, False, [(10, 11), (12, 13), (14, 15)])] == [10, 12, 14]


def test_the_bookie_serves_http_and_prometheus_metrics_and_collects_only_when_told(tmp_path: Path) -> None:
    """Issue 35: each bookie's HTTP server (admin API and /metrics) on the port the testbed recorded, small entry
    logs, Pulsar's compaction thresholds, and a GC interval long enough that only a triggered GC reclaims in a test."""
    info = _three_bookies(_info(tmp_path))
    settings = bookie_settings(info, info.bookies[2])
    assert settings["httpServerEnabled"] == "true" and settings["httpServerPort"] == "15"
    assert settings["httpServerClass"] == "org.apache.bookkeeper.http.vertx.VertxHttpServer"
    assert settings["statsProviderClass"] == "org.apache.bookkeeper.stats.prometheus.PrometheusMetricsProvider"
    assert settings["logSizeLimit"] == "4194304" and int(settings["flushInterval"]) <= 1000
    assert (settings["majorCompactionThreshold"], settings["minorCompactionThreshold"]) == ("0.5", "0.2")
    assert int(settings["gcWaitTime"]) >= 3_600_000
    # ZooKeeper flavour: the HTTP endpoint registers as 0.0.0.0 (the sweeper's fallback to the bookie's host);
    # Oxia flavour: loopback.
    assert "httpServerHost" not in settings
    oxia = _three_bookies(_oxia_info(tmp_path))
    assert bookie_settings(oxia, oxia.bookies[0])["httpServerHost"] == "127.0.0.1"


def test_a_state_file_from_before_the_bookie_http_server_loads(tmp_path: Path) -> None:
    from harness.testbed.bookie import BookieError, bookie_http_url, bookies, entry_log_bytes

    old = {k: v for k, v in asdict(_info(tmp_path)).items() if k not in ("bookie_http_port", "bookies",
                                                                         "zookeeper_pid")}
    info = TestbedInfo(**json.loads(json.dumps(old)))
    assert info.bookie_http_port == 0 and info.bookies == ()
    with pytest.raises(BookieError, match="without an HTTP server"):
        bookie_http_url(info, 0)
    assert entry_log_bytes(info, 0) == 0  # no bookie data yet
    assert [(b.bookie_id, b.port) for b in bookies(info)] == [("bk0test", 2)]


def test_a_state_file_from_before_the_three_bookies_loads_as_its_one_bookie(tmp_path: Path) -> None:
    """A testbed of one bookie in the standalone JVM: the bookie's ports are the testbed's own fields, its data where
    LocalBookkeeperEnsemble (bookkeeper0) or BKCluster (bookkeeper-oxia) kept it, and it cannot be stopped alone."""
    from harness.testbed.bookie import BookieError, bookies, ledger_dir, stop_bookie

    old = {k: v for k, v in asdict(_info(tmp_path)).items() if k not in ("bookies", "zookeeper_pid")}
    info = TestbedInfo(**json.loads(json.dumps({**old, "bookie_http_port": 7, "storage_pid": 99})))
    [only] = bookies(info)
    assert (only.bookie_id, only.port, only.http_url, only.pid) == ("bk0test", 2, "http://127.0.0.1:7", 0)
    assert ledger_dir(info, 0) == tmp_path / "data" / "bookkeeper0" / "current"
    oxia = TestbedInfo(**{**asdict(_oxia_info(tmp_path)), "bookie_http_port": 7})
    assert ledger_dir(oxia, "127.0.0.1:2") == tmp_path / "data" / "bookkeeper-oxia" / "current"
    with pytest.raises(BookieError, match="inside the standalone JVM"):
        stop_bookie(info, 0)


def test_a_state_file_round_trips_its_bookies(tmp_path: Path) -> None:
    info = _three_bookies(_info(tmp_path))
    again = TestbedInfo(**json.loads(json.dumps(asdict(info))))
    assert again == info and again.bookies[1].http_port == 13


def test_entry_logs_are_the_hex_named_files_of_the_ledger_dir(tmp_path: Path) -> None:
    from harness.testbed.bookie import entry_log_bytes, entry_log_bytes_by_bookie, entry_log_files, ledger_dir

    info = _three_bookies(_info(tmp_path))
    current = ledger_dir(info, 1)
    assert current == tmp_path / "data" / "bookkeeper1" / "current"
    (current / "ledgers").mkdir(parents=True)
    (current / "ledgers" / "000003.log").write_bytes(b"r" * 50)  # RocksDB's WAL, not an entry log
    (current / "a.log").write_bytes(b"x" * 10)
    (current / "2.log").write_bytes(b"x" * 7)
    (current / "1a21d62e097.txn").write_bytes(b"j" * 100)  # the journal
    assert [p.name for p in entry_log_files(info, "bk1test")] == ["2.log", "a.log"]
    assert entry_log_bytes(info, 1) == 17
    assert entry_log_bytes_by_bookie(info) == {"bk0test": 0, "bk1test": 17, "bk2test": 0}


def test_striped_bytes_follow_bookkeepers_round_robin_write_sets() -> None:
    """Entry e of a segment goes to ensemble positions e mod 3 and e+1 mod 3 (RoundRobinDistributionSchedule):
    10 entries of 100 bytes on (a, b, c) put 7 on a, 7 on b, 6 on c; an ensemble change moves the rest."""
    from harness.testbed.bookie import striped_bytes
    from sweeper.codecs.bookkeeper import LedgerMetadata, Segment

    def ledger(last_entry: int, *segments: Segment) -> LedgerMetadata:
        return LedgerMetadata(3, 3, 2, 2, "CLOSED", last_entry, (last_entry + 1) * 100, segments, "CRC32C", b"", None,
                              None)

    assert striped_bytes([ledger(9, Segment(0, ("a", "b", "c")))]) == {"a": 700, "b": 700, "c": 600}
    changed = ledger(5, Segment(0, ("a", "b", "c")), Segment(3, ("a", "d", "c")))
    # entries 0-2 on (a,b), (b,c), (c,a); entries 3-5 on (a,d), (d,c), (c,a)
    assert striped_bytes([changed]) == {"a": 400, "b": 200, "c": 400, "d": 200}
    assert striped_bytes([ledger(-1, Segment(0, ("a", "b", "c")))]) == {}


def test_a_ledger_of_one_entry_is_held_by_two_of_its_three_bookies() -> None:
    """Seen on the testbed: a one-entry ledger of ensemble (bk2, bk0, bk1) moved DELETED_LEDGER_TOTAL on bk2 and bk0
    only when deleted; the third member never stored (nor indexed) it."""
    from harness.testbed.bookie import ledger_holders
    from sweeper.codecs.bookkeeper import LedgerMetadata, Segment

    def ledger(last_entry: int) -> LedgerMetadata:
        return LedgerMetadata(3, 3, 2, 2, "CLOSED", last_entry, 35, (Segment(0, ("bk2", "bk0", "bk1")),), "CRC32C",
                              b"", None, None)

    assert ledger_holders(ledger(0)) == {"bk2", "bk0"}
    assert ledger_holders(ledger(1)) == {"bk2", "bk0", "bk1"}
    assert ledger_holders(ledger(-1)) == set()
