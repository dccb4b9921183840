"""Token auth and TLS as our config hands them to the real pulsar-client, against the local endpoint."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from harness.sandbox.pulsar_endpoint import PulsarApi_pb2 as pb
from harness.sandbox.pulsar_endpoint.server import PulsarEndpoint, encode_command
from sweeper.broker.errors import SystemTopicError
from sweeper.broker.system_topic import BrokerSettings, broker_partitions, describe_client_error, open_client
from tests.support.config import BASE_CONFIG
from tests.support.tls_certs import TlsFiles, make_tls_files

TOKEN = "tok-3f9a1c"
TOPIC = "persistent://public/default/secured"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def endpoint(tmp_path: Path, tls: TlsFiles) -> Iterator[PulsarEndpoint]:
    ep = PulsarEndpoint(tmp_path / "pulsar", token=TOKEN, tls_cert_file=str(tls.cert),
                        tls_key_file=str(tls.key)).start()
    yield ep
    ep.stop()


def settings(ep: PulsarEndpoint, tmp_path: Path, token: str | None = TOKEN, **tls: object) -> BrokerSettings:
    overrides: dict[str, object] = {"service_url": ep.service_url, "operation_timeout_s": 3, **tls}
    if token is not None:
        (tmp_path / "token").write_text(token + "\n")
        overrides["auth_token_file"] = str(tmp_path / "token")
    return BrokerSettings.from_config(BASE_CONFIG.replace(system_topic=overrides).system_topic)


def test_token_and_tls_from_config_reach_the_broker(endpoint: PulsarEndpoint, tmp_path: Path, tls: TlsFiles) -> None:
    assert endpoint.service_url.startswith("pulsar+ssl://")
    good = settings(endpoint, tmp_path, tls_trust_certs_file=str(tls.ca), tls_validate_hostname=True)
    assert TOKEN not in repr(good)
    client = open_client(good)
    try:
        client.create_producer(TOPIC).send(b"over tls")
        reader = client.create_reader(TOPIC, pulsar.MessageId.earliest)
        assert reader.read_next(3000).data() == b"over tls"
    finally:
        client.close()


def test_a_wrong_or_missing_token_is_refused_with_a_hint_and_never_echoed(
        endpoint: PulsarEndpoint, tmp_path: Path, tls: TlsFiles) -> None:
    for token in ("wrong-token", None):
        bad = settings(endpoint, tmp_path, token=token, tls_trust_certs_file=str(tls.ca))
        started = time.monotonic()
        with pytest.raises(SystemTopicError) as info:
            broker_partitions(bad, TOPIC)
        assert time.monotonic() - started < 15
        message = str(info.value)
        assert "wrong-token" not in message
        if token is not None:
            assert "rejected token" in message, message
    assert endpoint.messages(TOPIC) == []


def test_an_untrusted_certificate_is_refused_and_insecure_mode_is_explicit(
        endpoint: PulsarEndpoint, tmp_path: Path) -> None:
    stranger = make_tls_files(tmp_path / "other-ca")
    untrusted = settings(endpoint, tmp_path, tls_trust_certs_file=str(stranger.ca))
    with pytest.raises(SystemTopicError, match="TLS handshake"):
        broker_partitions(untrusted, TOPIC)
    # Only an explicit tls_allow_insecure accepts a certificate nobody vouches for.
    insecure = settings(endpoint, tmp_path, tls_allow_insecure=True)
    assert broker_partitions(insecure, TOPIC) == 0


def test_commands_before_an_accepted_connect_close_the_connection(endpoint: PulsarEndpoint, tls: TlsFiles) -> None:
    import ssl

    context = ssl.create_default_context(cafile=str(tls.ca))
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as conn:
        lookup = pb.BaseCommand(type=pb.BaseCommand.LOOKUP,
                                lookupTopic=pb.CommandLookupTopic(topic=TOPIC, request_id=1))
        conn.sendall(encode_command(lookup))
        assert conn.recv(4096) == b""  # closed without an answer

        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as raw2, \
                context.wrap_socket(raw2, server_hostname="localhost") as conn2:
            connect = pb.BaseCommand(type=pb.BaseCommand.CONNECT, connect=pb.CommandConnect(
                client_version="probe", protocol_version=20, auth_method_name="token", auth_data=b"nope"))
            conn2.sendall(encode_command(connect))
            reply = conn2.recv(4096)
            command = pb.BaseCommand()
            size = int.from_bytes(reply[4:8], "big")
            command.ParseFromString(reply[8:8 + size])
            assert command.type == pb.BaseCommand.ERROR and command.error.error == pb.AuthenticationError
            assert conn2.recv(4096) == b""


def test_describe_client_error_names_the_setting() -> None:
    plain = BrokerSettings("pulsar://h:6650", None, "", False, True, "", "", 5)
    assert "rejected token" not in describe_client_error(pulsar.Timeout("x"), plain)
    assert "unreachable" in describe_client_error(pulsar.ConnectError("x"), plain)
