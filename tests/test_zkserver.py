from pathlib import Path

from sweeper import zk as zkutil
from sweeper.zkserver import running_server, start_zookeeper, stop_zookeeper


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
