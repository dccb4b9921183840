"""Consumer and reader side of the test endpoint, against the real pulsar-client over loopback TCP."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from pulsar.schema import AvroSchema, Integer, Record, String

from harness.sandbox.pulsar_endpoint import PulsarEndpoint

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
    return pulsar.Client(
        ep.service_url,
        operation_timeout_seconds=5,
        connection_timeout_ms=3000,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


def _drain(consumer: pulsar.Consumer, timeout_ms: int = 300) -> list[pulsar.Message]:
    """Everything currently deliverable; stops at the first receive timeout."""
    out: list[pulsar.Message] = []
    while True:
        try:
            out.append(consumer.receive(timeout_millis=timeout_ms))
        except pulsar.Timeout:
            return out


def _read_all(reader: pulsar.Reader) -> list[pulsar.Message]:
    # has_message_available() asks the endpoint for the last message id, so this ends
    # exactly at the end of the topic without relying on a receive timeout.
    out: list[pulsar.Message] = []
    while reader.has_message_available():
        out.append(reader.read_next(timeout_millis=2000))
    return out


def test_reader_from_earliest_on_partitioned_topic_reads_everything(endpoint: PulsarEndpoint) -> None:
    endpoint.create_partitioned_topic("parted", 3)
    endpoint.create_partitioned_topic("parted-avro", 2)
    client = _client(endpoint)
    try:
        batched = client.create_producer("parted", batching_enabled=True, batching_max_publish_delay_ms=5)
        for i in range(30):
            batched.send_async(f"b{i}".encode(), None, partition_key=f"k{i}")
        batched.flush()
        plain = client.create_producer("parted", batching_enabled=False)
        for i in range(9):
            plain.send(f"u{i}".encode(), partition_key=f"k{i}")
        avro_producer = client.create_producer("parted-avro", schema=AvroSchema(Reading), batching_enabled=False)
        for i in range(4):
            avro_producer.send(Reading(name=f"r{i}", value=i), partition_key=str(i))

        reader = client.create_reader("parted", pulsar.MessageId.earliest)
        got = _read_all(reader)
        assert not reader.has_message_available()
        assert sorted(m.data() for m in got) == sorted(
            [f"b{i}".encode() for i in range(30)] + [f"u{i}".encode() for i in range(9)]
        )
        assert {m.partition_key() for m in got} == {f"k{i}" for i in range(30)}
        # Batching really happened, so batch entries were delivered and unpacked by the client.
        entries = sum(
            len(endpoint.store.entries(f"persistent://public/default/parted-partition-{p}")) for p in range(3)
        )
        assert entries < 39
        reader.close()

        avro_reader = client.create_reader("parted-avro", pulsar.MessageId.earliest, schema=AvroSchema(Reading))
        records = [m.value() for m in _read_all(avro_reader)]
        assert sorted((r.name, r.value) for r in records) == [(f"r{i}", i) for i in range(4)]
        assert not avro_reader.has_message_available()
    finally:
        client.close()


def test_reader_at_latest_sees_only_new_messages(endpoint: PulsarEndpoint) -> None:
    client = _client(endpoint)
    try:
        producer = client.create_producer("latest", batching_enabled=False)
        for i in range(3):
            producer.send(f"old{i}".encode())
        reader = client.create_reader("latest", pulsar.MessageId.latest)
        assert not reader.has_message_available()
        producer.send(b"new0")
        producer.send(b"new1")
        assert reader.has_message_available()
        assert [reader.read_next(2000).data() for _ in range(2)] == [b"new0", b"new1"]
        assert not reader.has_message_available()
        # Tailing: a message produced while the reader waits is pushed to it.
        producer.send(b"new2")
        assert reader.read_next(2000).data() == b"new2"
    finally:
        client.close()


def test_shared_subscription_splits_and_acked_are_not_redelivered(endpoint: PulsarEndpoint) -> None:
    client = _client(endpoint)
    try:
        kw = {
            "consumer_type": pulsar.ConsumerType.Shared,
            "initial_position": pulsar.InitialPosition.Earliest,
            "receiver_queue_size": 5,
        }
        c1 = client.subscribe("shared", "workers", **kw)
        c2 = client.subscribe("shared", "workers", **kw)
        producer = client.create_producer("shared", batching_enabled=False)
        for i in range(20):
            producer.send(f"m{i}".encode())
        got1 = _drain(c1)
        got2 = _drain(c2)
        assert got1 and got2
        assert sorted(m.data() for m in got1 + got2) == sorted(f"m{i}".encode() for i in range(20))
        acked = {m.data() for m in got1}
        for m in got1:
            c1.acknowledge(m)
        c1.close()
        c2.close()  # closes without acking: its messages must come back
        again = client.subscribe("shared", "workers", **kw)
        redelivered = _drain(again)
        assert sorted(m.data() for m in redelivered) == sorted(m.data() for m in got2)
        assert not acked & {m.data() for m in redelivered}
        for m in redelivered:
            again.acknowledge(m)
    finally:
        client.close()
    assert endpoint.subscriptions("shared") == ["workers"]


@pytest.mark.integration  # an endpoint of its own
def test_durable_subscription_survives_restart(tmp_path: Path) -> None:
    data = tmp_path / "pulsar"
    ep = PulsarEndpoint(data).start()
    try:
        client = _client(ep)
        try:
            producer = client.create_producer("durable", batching_enabled=True, batching_max_publish_delay_ms=5)
            for i in range(10):
                producer.send_async(f"d{i}".encode(), None)
            producer.flush()
            plain = client.create_producer("durable", batching_enabled=False)
            for i in range(10, 14):
                plain.send(f"d{i}".encode())
            consumer = client.subscribe("durable", "keep", initial_position=pulsar.InitialPosition.Earliest)
            msgs = _drain(consumer)
            assert [m.data() for m in msgs] == [f"d{i}".encode() for i in range(14)]
            # Ack the whole batch and two of the plain entries, one of them out of order.
            for m in msgs[:10]:
                consumer.acknowledge(m)
            consumer.acknowledge(msgs[10])
            consumer.acknowledge(msgs[12])
            consumer.close()
        finally:
            client.close()
        port = ep.port
    finally:
        ep.stop()

    ep = PulsarEndpoint(data, port=port).start()
    try:
        cursor = ep.cursor("durable", "keep")
        assert cursor is not None and cursor.acked == {cursor.mark_delete + 2}
        client = _client(ep)
        try:
            consumer = client.subscribe("durable", "keep", initial_position=pulsar.InitialPosition.Earliest)
            assert [m.data() for m in _drain(consumer)] == [b"d11", b"d13"]
        finally:
            client.close()
    finally:
        ep.stop()


def test_negative_ack_redelivers_then_dead_letters(endpoint: PulsarEndpoint) -> None:
    client = _client(endpoint)
    try:
        consumer = client.subscribe(
            "nack",
            "sub",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
            negative_ack_redelivery_delay_ms=50,
            dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2),
        )
        producer = client.create_producer("nack", batching_enabled=False)
        producer.send(b"poison")
        producer.send(b"fine")
        counts: list[int] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                msg = consumer.receive(timeout_millis=500)
            except pulsar.Timeout:
                if len(counts) > 2:
                    break
                continue
            if msg.data() == b"fine":
                consumer.acknowledge(msg)
                continue
            counts.append(msg.redelivery_count())
            consumer.negative_acknowledge(msg)
        # Delivered with redelivery counts 0, 1, 2; the nack after the last one sends it to the DLQ.
        assert counts == [0, 1, 2]

        dlq = "persistent://public/default/nack-sub-DLQ"
        reader = client.create_reader(dlq, pulsar.MessageId.earliest)
        dead = _read_all(reader)
        assert [m.data() for m in dead] == [b"poison"]
    finally:
        client.close()
    # The client acknowledged the dead-lettered message on the original subscription.
    assert _eventually(lambda: (c := endpoint.cursor("nack", "sub")) is not None and c.mark_delete == 1)


def _eventually(check: object, timeout: float = 5.0) -> bool:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return bool(check())


def test_seek_to_message_id_rereads(endpoint: PulsarEndpoint) -> None:
    client = _client(endpoint)
    try:
        producer = client.create_producer("seek", batching_enabled=False)
        ids = [producer.send(f"s{i}".encode()) for i in range(6)]

        consumer = client.subscribe("seek", "sub", initial_position=pulsar.InitialPosition.Earliest)
        first = _drain(consumer)
        assert [m.data() for m in first] == [f"s{i}".encode() for i in range(6)]
        for m in first:
            consumer.acknowledge(m)
        consumer.seek(ids[2])
        # The C++ client treats the seek id as exclusive (start_message_id_inclusive=False).
        assert [m.data() for m in _drain(consumer)] == [b"s3", b"s4", b"s5"]

        reader = client.create_reader("seek", pulsar.MessageId.earliest)
        assert [reader.read_next(2000).data() for _ in range(5)] == [f"s{i}".encode() for i in range(5)]
        reader.seek(ids[0])
        assert [m.data() for m in _read_all(reader)] == [f"s{i}".encode() for i in range(1, 6)]
        # Seek by publish time: everything published at or after the first message.
        reader.seek(0)
        assert [m.data() for m in _read_all(reader)] == [f"s{i}".encode() for i in range(6)]
    finally:
        client.close()


def test_garbage_on_raw_socket_does_not_stop_server(endpoint: PulsarEndpoint) -> None:
    for junk in (
        struct.pack(">II", 6, 2) + b"\x08\x0b",  # FLOW without a body
        struct.pack(">I", 12) + struct.pack(">I", 8) + b"\x08\x04\x22\x04garb",  # SUBSCRIBE with a broken body
        b"\x00\x00\x00\x03abc",
    ):
        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            while s.recv(4096):
                pass
    client = _client(endpoint)
    try:
        client.create_producer("alive", batching_enabled=False).send(b"x")
        reader = client.create_reader("alive", pulsar.MessageId.earliest)
        assert reader.read_next(2000).data() == b"x"
    finally:
        client.close()
