from pathlib import Path

import pytest

from sweeper.config import SweeperConfig, load
from sweeper.errors import ConfigError
from tests.support.config import BASE_CONFIG

REPO = Path(__file__).resolve().parents[1]


def test_defaults_and_local_config_load() -> None:
    cfg = load(REPO / "conf" / "local.toml")
    assert cfg.bookkeeper.zookeeper == "127.0.0.1:21810"
    assert cfg.pulsar_zookeeper == cfg.bookkeeper.zookeeper
    assert SweeperConfig().tables.engine == "auto"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[bookkeeper]\nzookeper = 'x'\n", "unknown option [bookkeeper] zookeper"),
        ("[nope]\n", "unknown config section [nope]"),
        ("[scan]\nwindow = 'many'\n", "[scan] window must be int"),
        ("[tables]\nengine = 'parquet'\n", "engine must be"),
        ("[bookkeeper]\nledgers_root = 'ledgers'\n", "absolute znode path"),
        ("[bookkeeper\n", "not valid TOML"),
        ("[system_topic]\nauth_token = 'abc'\n", "secrets never go in the config file"),
        ("[delete]\nexecute = true\n", "pass --execute on the command line"),
        ("[system_topic]\nservice_url = 'http://x'\n", "service_url must start with pulsar://"),
        ("[system_topic]\ntopic = 'persistent://a/b/c-partition-1'\n", "not one of its partitions"),
        ("[system_topic]\npartitions = 0\n", "partitions must be positive"),
        ("[delete]\nin_task_attempts = 20\n", "in_task_attempts <= max_attempts"),
        ("[metrics]\njob = 'a/b'\n", "job must be"),
        ("[retention]\ntopic_policies = 'admin'\n", 'topic_policies = "admin" needs [system_topic] admin_url'),
        ("[retention]\ntopic_policies = 'zk'\n", "topic_policies must be system_topic, admin or none"),
        ("[gates]\ndriver_rows = 'lots'\n", 'driver_rows must be "auto" or a number >= 0'),
        ("[gates]\ndriver_rows = -1\n", 'driver_rows must be "auto" or a number >= 0'),
        ("[gates]\ndriver_rows = 1.5\n", 'driver_rows must be "auto" or a number >= 0'),
    ],
)
def test_bad_config_names_the_option(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(path)


def test_cluster_example_loads_and_holds_no_secret() -> None:
    cfg = load(REPO / "conf" / "cluster.example.toml")
    assert cfg.system_topic.auth_token_env and not cfg.system_topic.auth_token_file
    assert cfg.safety.max_orphan_fraction <= SweeperConfig().safety.max_orphan_fraction


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "absent.toml")


def test_replace_and_hash() -> None:
    cfg = BASE_CONFIG
    other = cfg.replace(tables={"root": "/tmp/x"})
    assert other.tables.root == "/tmp/x" and cfg.tables.root != "/tmp/x"
    assert cfg.hash() != other.hash()


def test_offload_needs_the_cluster_name() -> None:
    # Issue 11 (2): without it, objects of a geo-replicated peer sharing the bucket could not be told apart.
    with pytest.raises(ConfigError, match=r"\[pulsar\] cluster_name is required"):
        SweeperConfig().replace(tables={"root": "/tmp/x"})
    assert SweeperConfig().replace(offload={"enabled": False}).pulsar.cluster_name == ""
    assert BASE_CONFIG.replace(offload={"enabled": True}).pulsar.cluster_name == "sandbox"
