"""Issue 23, done-when: the usual operator mistakes, each driven through the CLI.

Every one ends with the documented exit code (2 usage or configuration, 3 refused), one line on stderr naming
the problem and the fix, and no traceback. Those that are configuration are caught before Spark starts.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox import PORT_SPAN
from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import seed_zookeeper
from harness.zkserver import free_port, free_port_block
from sweeper.cli import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, main
from tests.support.config import ZkTarget

REPO = Path(__file__).resolve().parents[1]


def _one_line(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err and all(n in err for n in needles), err
    return lines[0]


def _config(tmp_path: Path, body: str, name: str = "c.toml") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def test_configuration_mistakes_are_exit_2_in_a_second_before_spark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    base = f'[tables]\nroot = "{tmp_path / "t"}"\n[pulsar]\ncluster_name = "c1"\n'
    monkeypatch.delenv("SWEEPER_TEST_UNSET", raising=False)
    cases = [
        ("[bookkeeper\nzookeeper = 1", ["not valid TOML"]),
        ("[bookkeeper]\nzookeper = \"zk:2181\"\n", ["unknown option [bookkeeper] zookeper", "known:"]),
        ("[offload]\nenabled = true\n", ["cluster_name is required", "broker.conf"]),
        (base + '[system_topic]\nauth_token_env = "SWEEPER_TEST_UNSET"\n',
         ["auth_token_env names $SWEEPER_TEST_UNSET, which is not set"]),
        (base + '[bookkeeper]\nsasl_mechanism = "DIGEST-MD5"\nsasl_username = "u"\n'
                'sasl_password_env = "SWEEPER_TEST_UNSET"\n', ["sasl_password_env names $SWEEPER_TEST_UNSET"]),
        (base + f'[system_topic]\nauth_token_file = "{tmp_path / "no-token"}"\n',
         ["auth_token_file", "cannot be read"]),
    ]
    for i, (body, needles) in enumerate(cases):
        config = _config(tmp_path, body, f"c{i}.toml")
        for command in (["snapshot"], ["sweep"], ["emit"], ["delete", "--execute"], ["retention"]):
            started = time.monotonic()
            assert main([*command, "--config", config]) == EXIT_USAGE, (command, body)
            _one_line(capsys, "configuration error:", *needles)
            assert time.monotonic() - started < 2.0, "checked before Spark starts"
    assert not (tmp_path / "t").exists()


def test_operator_lists_that_cannot_be_read_are_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, f'[tables]\nroot = "{tmp_path / "t"}"\n[pulsar]\ncluster_name = "c1"\n')
    for name, text, needle in (("bad.json", "{not json", "bad.json"), ("empty.json", "[]", "lists no ledgers"),
                               ("object.json", '{"ledgerId": 1}', "object.json")):
        listed = tmp_path / name
        listed.write_text(text)
        assert main(["delete", "--config", config, "--from-json", str(listed), "--execute"]) == EXIT_USAGE
        _one_line(capsys, "usage error:", needle)
    assert main(["delete", "--config", config, "--from-json", str(tmp_path / "absent.json")]) == EXIT_USAGE
    _one_line(capsys, "absent.json")


@pytest.mark.integration  # its snapshot command starts Spark
def test_wrong_host_taken_port_and_contradictory_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, f'[bookkeeper]\nzookeeper = "127.0.0.1:{free_port()}"\nsession_timeout_s = 2\n'
                               f'[tables]\nroot = "{tmp_path / "t"}"\n[offload]\nenabled = false\n')
    assert main(["snapshot", "--config", config]) == EXIT_REFUSED
    _one_line(capsys, "refused:", "cannot connect to ZooKeeper")
    port = free_port_block(PORT_SPAN)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port + 1))
        holder.listen()
        assert main(["sandbox", "up", "--home", str(tmp_path / "sb"), "--port", str(port)]) == EXIT_REFUSED
        _one_line(capsys, "refused:", f"port {port + 1} is taken", "pick another --port")
    assert main(["sweep", "--config", config, "--until", "reconcile", "--execute"]) == EXIT_USAGE
    _one_line(capsys, "--until reconcile", "drop --execute")


def test_wrong_root_unknown_and_forged_ids_and_a_held_lock(zk: KazooClient, zk_target: ZkTarget, spark: SparkSession,
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seed_zookeeper(zk, build_cluster(SandboxSpec(seed=4, topics=6)))
    settings = (f'[tables]\nroot = "{tmp_path / "t"}"\n[offload]\nenabled = false\n[pulsar]\ncluster_name = "c1"\n'
                '[gates]\nrequire_live_brokers = false\n[safety]\nmax_orphan_fraction = 1.0\n')
    wrong = _config(tmp_path, f'[bookkeeper]\nzookeeper = "{zk_target.hosts}"\nledgers_root = "/ledgerz"\n'
                              + settings, "wrong.toml")
    assert main(["snapshot", "--config", wrong]) == EXIT_REFUSED
    _one_line(capsys, "refused:", "/ledgerz")

    config = _config(tmp_path, f'[bookkeeper]\nzookeeper = "{zk_target.hosts}"\n' + settings)
    assert main(["snapshot", "--config", config]) == EXIT_OK
    listed = tmp_path / "list.json"
    # An id no snapshot ever listed and that has no znode: `not_found` (check the id), never `already_gone`.
    # A forged entry (a component Pulsar never writes) is refused on its own line; neither stops the other.
    listed.write_text(json.dumps([
        {"ledgerId": 987_654_321, "ledgerType": "LEDGER", "ledgerComponent": "MANAGED_LEDGER",
         "topicName": "persistent://tenant-0/ns-0/t"},
        {"ledgerId": 12, "ledgerType": "LEDGER", "ledgerComponent": "ROOT_KIT", "topicName": "persistent://a/b/c"}]))
    capsys.readouterr()
    assert main(["delete", "--config", config, "--from-json", str(listed), "--execute"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "not_found" in out and "already_gone" not in out and "deleted" not in out.split("delete ")[0], out
    forged = next(line for line in out.splitlines() if line.startswith("invalid"))
    assert "entry 1" in forged and "ROOT_KIT" in forged, forged

    # Another delete run holds the lock: its holder, an ISO time and what to do; nothing is deleted.
    zk.ensure_path("/ledger-sweeper/locks")
    zk.create("/ledger-sweeper/locks/delete", json.dumps({"run_id": "nightly-7", "host": "h1", "pid": 42,
                                                          "started_ms": 1_790_000_000_000}).encode(), ephemeral=True)
    assert main(["delete", "--config", config, "--from-json", str(listed), "--execute"]) == EXIT_REFUSED
    line = _one_line(capsys, "refused:", "nightly-7", "2026-09-21T", "Wait for it to end")
    assert "1790000000000" not in line


def test_init_config_prints_the_example_and_never_overwrites_a_file(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The example config ships in the package (issue 36): printed, or written once; an existing file is exit 2."""
    assert main(["init-config"]) == EXIT_OK
    assert capsys.readouterr().out == (REPO / "conf" / "cluster.example.toml").read_text()
    out = tmp_path / "prod.toml"
    assert main(["init-config", "--out", str(out)]) == EXIT_OK
    assert out.read_text() == (REPO / "conf" / "cluster.example.toml").read_text()
    capsys.readouterr()
    assert main(["init-config", "--out", str(out)]) == EXIT_USAGE
    _one_line(capsys, "exists: not overwritten")
