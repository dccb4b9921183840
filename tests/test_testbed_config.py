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
from harness.testbed.server import (
    TestbedInfo,
    broker_settings,
    hs256_token,
    sweeper_toml,
    write_broker_conf,
)
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
    write_broker_conf(template, target, settings)
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


def test_the_bookie_serves_http_and_prometheus_metrics_and_collects_only_when_told(tmp_path: Path) -> None:
    """Issue 35: the bookie's HTTP server (admin API and /metrics) on the port the testbed recorded, small entry logs,
    Pulsar's compaction thresholds, and a GC interval long enough that only a triggered GC reclaims in a test."""
    info = TestbedInfo(**{**asdict(_info(tmp_path)), "bookie_http_port": 7})
    settings = broker_settings(info, tmp_path / "secret.key", tmp_path / "offloaders")
    assert settings["httpServerEnabled"] == "true" and settings["httpServerPort"] == "7"
    assert settings["httpServerClass"] == "org.apache.bookkeeper.http.vertx.VertxHttpServer"
    assert settings["statsProviderClass"] == "org.apache.bookkeeper.stats.prometheus.PrometheusMetricsProvider"
    assert settings["logSizeLimit"] == "4194304" and int(settings["flushInterval"]) <= 1000
    assert (settings["majorCompactionThreshold"], settings["minorCompactionThreshold"]) == ("0.5", "0.2")
    assert int(settings["gcWaitTime"]) >= 3_600_000
    # ZooKeeper flavour: the HTTP endpoint registers as 0.0.0.0 (the sweeper's fallback to the bookie's host);
    # Oxia flavour: loopback.
    assert "httpServerHost" not in settings
    oxia = TestbedInfo(**{**asdict(_oxia_info(tmp_path)), "bookie_http_port": 7})
    assert broker_settings(oxia, tmp_path / "secret.key", tmp_path / "o")["httpServerHost"] == "127.0.0.1"


def test_a_state_file_from_before_the_bookie_http_server_loads(tmp_path: Path) -> None:
    from harness.testbed.bookie import BookieError, bookie_http_url, entry_log_bytes

    old = {k: v for k, v in asdict(_info(tmp_path)).items() if k != "bookie_http_port"}
    info = TestbedInfo(**json.loads(json.dumps(old)))
    assert info.bookie_http_port == 0
    with pytest.raises(BookieError, match="without an HTTP server"):
        bookie_http_url(info)
    assert entry_log_bytes(info) == 0  # no bookie data yet


def test_entry_logs_are_the_hex_named_files_of_the_ledger_dir(tmp_path: Path) -> None:
    from harness.testbed.bookie import entry_log_bytes, entry_log_files, ledger_dir

    info = TestbedInfo(**{**asdict(_info(tmp_path)), "bookie_http_port": 7})
    current = ledger_dir(info)
    assert current == tmp_path / "data" / "bookkeeper0" / "current"
    assert ledger_dir(_oxia_info(tmp_path)) == tmp_path / "data" / "bookkeeper-oxia" / "current"
    (current / "ledgers").mkdir(parents=True)
    (current / "ledgers" / "000003.log").write_bytes(b"r" * 50)  # RocksDB's WAL, not an entry log
    (current / "a.log").write_bytes(b"x" * 10)
    (current / "2.log").write_bytes(b"x" * 7)
    (current / "1a21d62e097.txn").write_bytes(b"j" * 100)  # the journal
    assert [p.name for p in entry_log_files(info)] == ["2.log", "a.log"]
    assert entry_log_bytes(info) == 17
