"""Pure rules of the metadata-store layer (issue 24): addresses in Pulsar's and BookKeeper's spellings, and what a
PIP-454 migration flag lets the sweeper do."""

from __future__ import annotations

import pytest

from sweeper.connections import Connections, ZooKeeperEndpoint
from sweeper.errors import ConfigError
from sweeper.metastore.errors import MigrationRefused, StoreUrlError
from sweeper.metastore.migration import (
    COMPLETED,
    COPYING,
    FAILED,
    NOT_STARTED,
    PREPARATION,
    MigrationState,
    acknowledgement_refusal,
    migration_refusal,
    parse_migration_flag,
)
from sweeper.metastore.urls import OXIA, ZOOKEEPER, StoreUrl, parse_bookkeeper_service_uri, parse_pulsar_store_url
from sweeper.zk.security import pulsar_security
from tests.support.config import BASE_CONFIG

BASE = BASE_CONFIG.replace(offload={"enabled": False})


@pytest.mark.parametrize(("text", "expected"), [
    ("zk+hierarchical://zk1:2181;zk2:2181/ledgers", StoreUrl(ZOOKEEPER, "zk1:2181,zk2:2181", "", "/ledgers")),
    ("zk+longhierarchical://zk1:2181/pulsar/ledgers", StoreUrl(ZOOKEEPER, "zk1:2181", "", "/pulsar/ledgers")),
    ("metadata-store:oxia://oxia:6648/bookkeeper", StoreUrl(OXIA, "oxia:6648", "bookkeeper", "/ledgers")),
    ("metadata-store:zk:zk1:2181/chroot", StoreUrl(ZOOKEEPER, "zk1:2181/chroot", "", "/ledgers")),
])
def test_bookkeeper_metadata_service_uris(text: str, expected: StoreUrl) -> None:
    assert parse_bookkeeper_service_uri(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("zk:zk1:2181,zk2:2181/pulsar", StoreUrl(ZOOKEEPER, "zk1:2181,zk2:2181/pulsar")),
    ("zk1:2181", StoreUrl(ZOOKEEPER, "zk1:2181")),
    ("oxia://oxia:6648/pulsar", StoreUrl(OXIA, "oxia:6648", "pulsar")),
    ("oxia://oxia:6648", StoreUrl(OXIA, "oxia:6648", "default")),
])
def test_pulsar_metadata_store_urls(text: str, expected: StoreUrl) -> None:
    assert parse_pulsar_store_url(text) == expected


@pytest.mark.parametrize("text", ["oxia://oxia:6648/ns/ledgers", "oxia:///ns", "zk://zk1:2181", "http://x:1",
                                  "zk+hierarchical://zk1:2181", "/ledgers"])
def test_addresses_neither_pulsar_nor_bookkeeper_accepts_are_refused(text: str) -> None:
    with pytest.raises(StoreUrlError):
        parse_pulsar_store_url(text) if not text.startswith("zk+") else parse_bookkeeper_service_uri(text)


def test_a_config_copied_from_broker_conf_and_bookkeeper_conf() -> None:
    cfg = BASE.replace(bookkeeper={"metadata_service_uri": "metadata-store:oxia://oxia:6648/bookkeeper"},
                       pulsar={"metadata_store_url": "oxia://oxia:6648/pulsar"})
    assert (cfg.bookkeeper_store(), cfg.pulsar_store()) == (StoreUrl(OXIA, "oxia:6648", "bookkeeper"),
                                                           StoreUrl(OXIA, "oxia:6648", "pulsar"))
    assert cfg.bookkeeper.zookeeper == ""  # nothing reaches a ZooKeeper by default on an Oxia cluster
    zk = BASE.replace(bookkeeper={"metadata_service_uri": "zk+hierarchical://zk1:2181;zk2:2181/pulsar/ledgers"})
    assert (zk.bookkeeper.zookeeper, zk.bookkeeper.ledgers_root) == ("zk1:2181,zk2:2181", "/pulsar/ledgers")
    assert zk.replace(tables={"root": "elsewhere"}).bookkeeper_store() == zk.bookkeeper_store()
    with pytest.raises(ConfigError, match="keep one"):
        BASE.replace(bookkeeper={"metadata_service_uri": "zk+hierarchical://zk1:2181/ledgers", "zookeeper": "zk9:1"})
    with pytest.raises(ConfigError, match="oxia://host:port/namespace"):
        BASE.replace(pulsar={"metadata_store_url": "oxia://oxia:6648/a/b"})


SOURCE = StoreUrl(ZOOKEEPER, "zk1:2181")
TARGET = StoreUrl(OXIA, "oxia1:6648", "default")
TARGET_URL = "oxia://oxia1:6648/default"


@pytest.mark.parametrize(("phase", "store", "deleting", "acknowledged", "refused"), [
    (NOT_STARTED, SOURCE, True, False, False),
    (FAILED, SOURCE, True, False, False),
    (PREPARATION, SOURCE, True, False, True),
    (COPYING, SOURCE, True, False, True),
    (COPYING, SOURCE, False, False, False),  # the source is still authoritative for reading
    (COMPLETED, SOURCE, False, False, True),  # a stale copy: not even read
    (COMPLETED, TARGET, True, False, False),
    (COPYING, TARGET, False, False, True),  # the target mid-copy, or the copy of the flag: the operator says
    (COPYING, TARGET, True, True, False),
])
def test_what_a_migration_flag_allows(phase: str, store: StoreUrl, deleting: bool, acknowledged: bool,
                                      refused: bool) -> None:
    refusal = migration_refusal(MigrationState(phase, TARGET_URL), store, deleting, acknowledged)
    assert bool(refusal) is refused
    if refused and phase == COMPLETED:
        assert TARGET_URL in str(refusal)


def test_the_flag_as_the_coordinator_writes_it_and_nothing_else() -> None:
    assert parse_migration_flag(b'{"phase":"COPYING","targetUrl":"oxia://o:6648/default"}') == MigrationState(
        COPYING, "oxia://o:6648/default")
    assert parse_migration_flag(b'{"phase":"NOT_STARTED"}') == MigrationState()  # targetUrl null is left out
    for bad in (b"not json", b'{"phase":"ROLLING_BACK"}', b'["COPYING"]', b'{"phase":"COPYING","targetUrl":3}'):
        with pytest.raises(MigrationRefused):
            parse_migration_flag(bad)


THIS = StoreUrl(OXIA, "oxia1:6648", "default")  # the migration's target, which the sweeper is pointed at
SOURCE_NAME = "zk1:2181"


@pytest.mark.parametrize(("source_state", "why"), [
    (MigrationState(COMPLETED, TARGET_URL), None),
    (MigrationState(FAILED, TARGET_URL), "partial copy"),  # DualMetadataStore went back to the source
    (MigrationState(COPYING, TARGET_URL), "not complete"),
    (MigrationState(PREPARATION, TARGET_URL), "not complete"),
    (MigrationState(), "shows no migration"),  # a failed migration's flag cleared for another try
    (MigrationState(COMPLETED, "oxia://elsewhere:6648/default"), "not to"),
    (MigrationState(COMPLETED), "not to"),
    (None, "needs [safety] migration_source_store"),
])
def test_the_completion_acknowledgement_holds_only_while_the_source_reads_completed_to_this_store(
        source_state: MigrationState | None, why: str | None) -> None:
    refusal = acknowledgement_refusal(source_state, SOURCE_NAME, THIS)
    if why is None:
        assert refusal is None
    else:
        assert refusal is not None and why in refusal
        if source_state is not None:
            assert SOURCE_NAME in refusal


def test_the_source_store_is_required_with_the_acknowledgement_and_spelled_as_pulsar_does() -> None:
    with pytest.raises(ConfigError, match=r"acknowledge_migration_completed = true needs \[safety\] "
                                          "migration_source_store"):
        BASE.replace(safety={"acknowledge_migration_completed": True})
    with pytest.raises(ConfigError, match=r"\[safety\] migration_source_store: 'zk://zk1:2181'"):
        BASE.replace(safety={"acknowledge_migration_completed": True, "migration_source_store": "zk://zk1:2181"})
    cfg = BASE.replace(safety={"acknowledge_migration_completed": True, "migration_source_store": "zk:zk1:2181/p"})
    assert Connections.from_config(cfg).migration_source == ZooKeeperEndpoint(
        "zk1:2181/p", cfg.bookkeeper.session_timeout_s, pulsar_security(cfg))
    assert Connections.from_config(BASE).migration_source is None
