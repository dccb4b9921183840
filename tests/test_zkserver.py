import socket
from pathlib import Path

import pytest

from harness.sandbox import PORT_SPAN, SandboxError, sandbox_down, sandbox_up
from harness.zkserver import free_port_block, running_server, start_zookeeper, stop_zookeeper
from sweeper.zk import client as zkutil


@pytest.mark.integration  # starts ZooKeeper itself
def test_restart_keeps_data_and_stop_frees_the_port(tmp_path: Path) -> None:
    info = start_zookeeper(tmp_path)
    assert running_server(tmp_path) == info
    client = zkutil.connect(info.connect_string)
    client.create("/kept", b"yes")
    zkutil.close(client)
    stop_zookeeper(info)
    assert running_server(tmp_path) is None

    again = start_zookeeper(tmp_path, port=info.port)
    try:
        client = zkutil.connect(again.connect_string)
        assert client.get("/kept")[0] == b"yes"
        zkutil.close(client)
    finally:
        stop_zookeeper(again)


def test_the_sandbox_names_a_taken_port_instead_of_a_dead_s3_server(tmp_path: Path) -> None:
    base = free_port_block(PORT_SPAN)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        try:
            with pytest.raises(SandboxError, match=f"S3 port {base + 1} is taken"):
                sandbox_up(tmp_path, port=base)
            assert running_server(tmp_path / "zookeeper") is None  # checked before anything started
        finally:
            sandbox_down(tmp_path, wipe=True)
    for port in range(base, base + PORT_SPAN):  # nothing was left listening
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
