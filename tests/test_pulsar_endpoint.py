"""The test endpoint against the real, unmodified pulsar-client over loopback TCP."""

from __future__ import annotations

import io
import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import _pulsar
import fastavro
import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, Record, String

from harness.sandbox.pulsar_endpoint import PulsarApi_pb2 as pb
from harness.sandbox.pulsar_endpoint import PulsarEndpoint
from harness.sandbox.pulsar_endpoint.crc32c import crc32c
from harness.sandbox.pulsar_endpoint.server import encode_command

pytestmark = pytest.mark.timeout(60)


class Reading(Record):
    name = String()
    value = Integer()


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[PulsarEndpoint]:
    ep = PulsarEndpoint(tmp_path / "pulsar").start()
    yield ep
    ep.stop()


def _client(ep: PulsarEndpoint) -> pulsar.Client:
    # Short timeouts turn a protocol bug into a quick failure instead of a hang.
    return pulsar.Client(ep.service_url, operation_timeout_seconds=10, connection_timeout_ms=5000)


def test_crc32c_known_vector() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_batched_async_send_keeps_order_keys_and_properties(endpoint: PulsarEndpoint) -> None:
    client = _client(endpoint)
    try:
        producer = client.create_producer(
            "batched",
            batching_enabled=True,
            batching_max_messages=16,
            batching_max_publish_delay_ms=5,
            block_if_queue_full=True,
        )
        results: list[pulsar.Result] = []
        for i in range(100):
            producer.send_async(
                f"m{i}".encode(),
                lambda res, _mid: results.append(res),
                partition_key=f"k{i}",
                properties={"i": str(i), "kind": "test"},
            )
        producer.flush()
        producer.close()
    finally:
        client.close()
    assert results == [pulsar.Result.Ok] * 100
    msgs = endpoint.messages("batched")
    assert [m.payload for m in msgs] == [f"m{i}".encode() for i in range(100)]
    assert [m.key for m in msgs] == [f"k{i}" for i in range(100)]
    assert [m.properties for m in msgs] == [{"i": str(i), "kind": "test"} for i in range(100)]
    assert [m.sequence_id for m in msgs] == list(range(100))
    # Batching really happened: fewer entries than messages, and batch indexes are set.
    entries = endpoint.store.entries("persistent://public/default/batched")
    assert len(entries) < 100
    assert any(m.batch_index > 0 for m in msgs)
    # Dedup position covers the whole last batch, not just its first sequence id.
    assert endpoint.store.last_sequence_id(msgs[0].topic, msgs[0].producer_name) == 99


def test_sync_send_returns_message_id(endpoint: PulsarEndpoint) -> None:
    client = _client(endpoint)
    try:
        producer = client.create_producer("persistent://public/default/sync", batching_enabled=False)
        first = producer.send(b"a")
        second = producer.send(b"b")
    finally:
        client.close()
    # Producer.send hands back the C++ binding's MessageId, not the pure-Python wrapper.
    assert isinstance(first, _pulsar.MessageId)
    assert (first.ledger_id(), first.entry_id()) == (1, 0)
    assert (second.ledger_id(), second.entry_id()) == (1, 1)
    stored = endpoint.messages("sync")
    assert [(m.payload, m.entry_id, m.batch_index) for m in stored] == [(b"a", 0, -1), (b"b", 1, -1)]


def test_partitioned_topic_spreads_keyed_messages(endpoint: PulsarEndpoint) -> None:
    endpoint.create_partitioned_topic("parted", 4)
    client = _client(endpoint)
    try:
        producer = client.create_producer("parted", batching_enabled=False)
        for i in range(40):
            producer.send(f"v{i}".encode(), partition_key=f"key-{i}")
    finally:
        client.close()
    per_partition = {p: endpoint.messages(f"parted-partition-{p}") for p in range(4)}
    assert all(per_partition.values()), {p: len(v) for p, v in per_partition.items()}
    assert all(m.partition == p for p, ms in per_partition.items() for m in ms)
    got = sorted(m.payload for ms in per_partition.values() for m in ms)
    assert got == sorted(f"v{i}".encode() for i in range(40))
    # The same key always lands on the same partition.
    owner = {m.key: p for p, ms in per_partition.items() for m in ms}
    assert len(owner) == 40


def test_avro_producer_payload_decodes(endpoint: PulsarEndpoint) -> None:
    client = _client(endpoint)
    try:
        producer = client.create_producer("avro", schema=AvroSchema(Reading))
        producer.send(Reading(name="probe", value=42))
    finally:
        client.close()
    schema = endpoint.schema("avro")
    assert schema is not None and schema.type == pb.Schema.Avro
    parsed = fastavro.parse_schema(json.loads(schema.schema_data))
    [msg] = endpoint.messages("avro")
    assert fastavro.schemaless_reader(io.BytesIO(msg.payload), parsed) == {"name": "probe", "value": 42}


@pytest.mark.integration  # an endpoint of its own
def test_restart_keeps_messages_and_dedups_by_producer_name(tmp_path: Path) -> None:
    data = tmp_path / "pulsar"
    ep = PulsarEndpoint(data).start()
    try:
        client = _client(ep)
        try:
            producer = client.create_producer("dedup", producer_name="fixed", batching_enabled=False)
            ids = [producer.send(f"p{s}".encode(), sequence_id=s) for s in range(5)]
        finally:
            client.close()
    finally:
        ep.stop()

    ep = PulsarEndpoint(data).start()
    try:
        assert [m.payload for m in ep.messages("dedup")] == [f"p{s}".encode() for s in range(5)]
        assert ep.store.last_sequence_id("persistent://public/default/dedup", "fixed") == 4
        client = _client(ep)
        try:
            producer = client.create_producer("dedup", producer_name="fixed", batching_enabled=False)
            assert producer.last_sequence_id() == 4
            dup = producer.send(b"again-p3", sequence_id=3)
            producer.send(b"p5", sequence_id=5)
            producer.send(b"again-p4", sequence_id=4)
            producer.send(b"p6", sequence_id=6)
        finally:
            client.close()
        msgs = ep.messages("dedup")
        dropped = ep.store.duplicates.get("persistent://public/default/dedup", 0)
    finally:
        ep.stop()
    assert [m.payload for m in msgs] == [f"p{s}".encode() for s in range(7)]
    assert [m.sequence_id for m in msgs] == list(range(7))
    assert dropped == 2  # the endpoint, not the client, dropped the re-sends
    # A duplicate is acknowledged with the id of the original write.
    assert (dup.ledger_id(), dup.entry_id()) == (ids[3].ledger_id(), ids[3].entry_id())


def test_garbage_and_unknown_commands_do_not_kill_server(endpoint: PulsarEndpoint) -> None:
    for junk in (
        b"\x00\x00\x00\x05hello",  # command size larger than the frame
        struct.pack(">II", 6, 2) + b"\x08\x04",  # SUBSCRIBE type without a body
        b"\xff\xff\xff\xff",  # absurd frame size
    ):
        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            while s.recv(4096):
                pass
    client = _client(endpoint)
    try:
        client.create_producer("still-alive").send(b"x")
    finally:
        client.close()
    assert [m.payload for m in endpoint.messages("still-alive")] == [b"x"]


@pytest.mark.parametrize(
    "compression",
    [pulsar.CompressionType.LZ4, pulsar.CompressionType.ZLib, pulsar.CompressionType.ZSTD],
    ids=["lz4", "zlib", "zstd"],
)
def test_compressed_batches_unpack(endpoint: PulsarEndpoint, compression: pulsar.CompressionType) -> None:
    client = _client(endpoint)
    try:
        producer = client.create_producer(
            "compressed", compression_type=compression, batching_enabled=True, batching_max_publish_delay_ms=5
        )
        for i in range(20):
            producer.send_async(f"payload-{i}-".encode() * 10, None, partition_key=str(i))
        producer.flush()
    finally:
        client.close()
    msgs = endpoint.messages("compressed")
    assert [m.payload for m in msgs] == [f"payload-{i}-".encode() * 10 for i in range(20)]
    assert [m.key for m in msgs] == [str(i) for i in range(20)]


@pytest.mark.integration  # an endpoint of its own
def test_torn_tail_record_is_ignored_on_reopen(tmp_path: Path) -> None:
    data = tmp_path / "pulsar"
    with PulsarEndpoint(data) as ep:
        client = _client(ep)
        try:
            producer = client.create_producer("torn", batching_enabled=False)
            producer.send(b"one")
            producer.send(b"two")
        finally:
            client.close()
    [log_file] = (data / "topics").iterdir()
    raw = log_file.read_bytes()
    log_file.write_bytes(raw[:-3])  # a crash mid-append leaves a partial last record
    with PulsarEndpoint(data) as ep:
        assert [m.payload for m in ep.messages("torn")] == [b"one"]
        client = _client(ep)
        try:
            client.create_producer("torn", batching_enabled=False).send(b"three")
        finally:
            client.close()
    # The torn bytes were cut, so the record appended after them reads back cleanly.
    with PulsarEndpoint(data) as ep:
        assert [m.payload for m in ep.messages("torn")] == [b"one", b"three"]


def _read_command(sock: socket.socket) -> pb.BaseCommand:
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "endpoint closed the connection"
            buf += chunk
        return buf

    (total,) = struct.unpack(">I", exactly(4))
    frame = exactly(total)
    (size,) = struct.unpack_from(">I", frame, 0)
    cmd = pb.BaseCommand()
    cmd.ParseFromString(frame[4 : 4 + size])
    return cmd


def test_bad_checksum_gets_send_error_and_is_not_stored(endpoint: PulsarEndpoint) -> None:
    T = pb.BaseCommand
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as s:
        s.sendall(
            encode_command(T(type=T.CONNECT, connect=pb.CommandConnect(client_version="raw", protocol_version=20)))
        )
        connected = _read_command(s)
        assert connected.type == T.CONNECTED and connected.connected.protocol_version == 15
        producer = pb.CommandProducer(topic="persistent://public/default/raw", producer_id=7, request_id=1)
        s.sendall(encode_command(T(type=T.PRODUCER, producer=producer)))
        ok = _read_command(s)
        assert ok.type == T.PRODUCER_SUCCESS and ok.producer_success.last_sequence_id == -1

        meta = pb.MessageMetadata(producer_name=ok.producer_success.producer_name, sequence_id=0, publish_time=1)
        meta_bytes = meta.SerializeToString()
        body = struct.pack(">I", len(meta_bytes)) + meta_bytes + b"payload"
        cmd = T(type=T.SEND, send=pb.CommandSend(producer_id=7, sequence_id=0)).SerializeToString()
        for checksum in (crc32c(body) ^ 1, crc32c(body)):
            tail = struct.pack(">HI", 0x0E01, checksum) + body
            frame = struct.pack(">I", len(cmd)) + cmd + tail
            s.sendall(struct.pack(">I", len(frame)) + frame)
        assert _read_command(s).type == T.SEND_ERROR
        receipt = _read_command(s)
        assert receipt.type == T.SEND_RECEIPT and receipt.send_receipt.message_id.entryId == 0
    assert [m.payload for m in endpoint.messages("raw")] == [b"payload"]


@pytest.mark.integration  # an endpoint of its own
def test_persist_latency_holds_receipts_in_order(tmp_path: Path) -> None:
    with PulsarEndpoint(tmp_path / "slow", persist_latency_ms=50) as ep:
        client = pulsar.Client(ep.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        sync = client.create_producer("slow-sync")
        started = time.monotonic()
        sync.send(b"one")
        assert time.monotonic() - started >= 0.05  # a sync send waits out the modelled durability
        batched = client.create_producer("slow-batched", batching_enabled=True, batching_max_messages=10)
        done: list[int] = []
        started = time.monotonic()
        for i in range(100):
            batched.send_async(str(i).encode(), lambda res, _id, i=i: done.append(i))
        batched.flush()
        elapsed = time.monotonic() - started
        assert done == list(range(100))  # receipts came back in order
        assert elapsed < 100 * 0.05 / 4  # in flight together: far less than one wait per message
        client.close()
