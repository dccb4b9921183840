"""Issue 23, item 4: one way to point every command at a cluster or at the sandbox.

Commands find their config by one documented order (--config, $SWEEPER_CONFIG, the running sandbox's
var/sandbox/sweeper.toml, the checkout's conf/local.toml), print the one they use, and refuse (exit 2) when
there is none instead of acting on built-in defaults. `sandbox up --port N` writes the sandbox's config, so a
command with no flags reaches a sandbox on any port; `sandbox seed --port` is checked against what runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from harness.sandbox import PORT_SPAN, sandbox_down
from harness.zkserver import free_port_block
from sweeper import config as config_mod
from sweeper.cli import EXIT_OK, EXIT_USAGE, main

REPO = Path(__file__).resolve().parents[1]


def test_the_search_order_is_flag_environment_sandbox_checkout(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sandbox = tmp_path / "var" / "sandbox" / "sweeper.toml"
    assert config_mod.find_config(None, {}, sandbox).path is None
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "local.toml").write_text("")
    assert config_mod.find_config(None, {}, sandbox).path == config_mod.CHECKOUT_CONFIG
    sandbox.parent.mkdir(parents=True)
    sandbox.write_text("")
    assert config_mod.find_config(None, {}, sandbox).path == sandbox
    assert config_mod.find_config(None, {"SWEEPER_CONFIG": "/etc/prod.toml"}, sandbox).path == Path("/etc/prod.toml")
    chosen = config_mod.find_config("mine.toml", {"SWEEPER_CONFIG": "/etc/prod.toml"}, sandbox)
    assert chosen.path == Path("mine.toml") and chosen.describe() == "config: mine.toml (from --config)"


def test_the_toml_written_for_a_config_reads_back_equal(tmp_path: Path) -> None:
    cfg = config_mod.load(REPO / "conf" / "local.toml").replace(safety={"allow": "tenant-a, \"odd\\name\"/ns-ü"})
    path = tmp_path / "written.toml"
    path.write_text(config_mod.to_toml(cfg, header="two\nlines"))
    assert config_mod.load(path) == cfg


def test_no_config_outside_a_checkout_is_refused_not_defaulted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SWEEPER_CONFIG", raising=False)
    for command in (["snapshot"], ["reconcile"], ["emit"], ["delete"], ["retention"], ["dlq", "list"], ["runs"],
                    ["show", "some-run", "orphans"]):
        assert main(command) == EXIT_USAGE, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no config found" in err and "--config PATH" in err, (command, err)
    assert not (tmp_path / "var").exists()  # nothing was created in the stranger's directory
    # A read with an explicit table root needs no config: it names the root's problem instead.
    assert main(["runs", "--tables", str(tmp_path / "nowhere")]) == EXIT_USAGE
    assert "no tables at" in capsys.readouterr().err


def test_sandbox_up_on_any_port_is_found_by_every_command(spark: SparkSession, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no conf/ here: only the sandbox's own config can point the commands
    monkeypatch.delenv("SWEEPER_CONFIG", raising=False)
    port = free_port_block(PORT_SPAN)
    home = tmp_path / "var" / "sandbox"
    try:
        assert main(["sandbox", "up", "--port", str(port), "--config", str(REPO / "conf" / "local.toml")]) == EXIT_OK
        written = config_mod.load(home / "sweeper.toml")
        assert written.bookkeeper.zookeeper == f"127.0.0.1:{port}"
        assert written.offload.endpoint_override == f"http://127.0.0.1:{port + 1}"
        assert written.system_topic.service_url == f"pulsar://127.0.0.1:{port + 2}"
        assert written.system_topic.admin_url == f"http://127.0.0.1:{port + 3}"
        capsys.readouterr()
        # `seed --port` is honoured: another port than the running sandbox's is named, not silently ignored.
        assert main(["sandbox", "seed", "--port", str(port + 7), "--topics", "12"]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert f"serves ZooKeeper on {port}" in err and err.count("\n") == 1
        assert main(["sandbox", "seed", "--port", str(port), "--topics", "12"]) == EXIT_OK
        out = capsys.readouterr().out
        assert out.startswith("config: var/sandbox/sweeper.toml (the running sandbox's") and "seeded" in out
        # A stage with no flags at all reaches that sandbox, and says which config it used.
        assert main(["snapshot", "--json"]) == EXIT_OK
        out = capsys.readouterr().out
        assert out.splitlines()[0].startswith("config: var/sandbox/sweeper.toml")
        assert '"bk_ledgers": ' in out.splitlines()[-1]
        # $SWEEPER_CONFIG outranks the sandbox's file.
        monkeypatch.setenv("SWEEPER_CONFIG", str(tmp_path / "missing.toml"))
        assert main(["snapshot"]) == EXIT_USAGE
        assert "config file not found" in capsys.readouterr().err
    finally:
        sandbox_down(home, wipe=True)
