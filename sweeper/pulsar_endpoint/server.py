"""Asyncio server speaking the producer half of Pulsar's binary protocol.

For tests and the local sandbox only: no auth, no TLS, no replication, one fixed ledger
per topic. It exists because no broker can be installed where the suite runs, and the
real C++-based ``pulsar-client`` must be exercised over TCP unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import struct
import threading
import time
from pathlib import Path

from google.protobuf.message import DecodeError

from . import PulsarApi_pb2 as pb
from .crc32c import crc32c
from .store import MessageStore, StoredMessage

log = logging.getLogger(__name__)

_U32 = struct.Struct(">I")
_MAGIC_CRC32C = 0x0E01
MAX_PROTOCOL_VERSION = 15
MAX_MESSAGE_SIZE = 5 * 1024 * 1024
# A frame can exceed max message size by its command and metadata; anything beyond this is
# a framing bug or garbage, and reading it would only stall the connection.
_MAX_FRAME = MAX_MESSAGE_SIZE + 10 * 1024 * 1024
_SERVER_VERSION = "ledger-sweeper-endpoint"


def normalize_topic(topic: str) -> str:
    """Short names get the same defaults the client applies (persistent://public/default/)."""
    if "://" in topic:
        return topic
    parts = topic.split("/")
    if len(parts) == 1:
        return f"persistent://public/default/{topic}"
    if len(parts) == 3:
        return f"persistent://{topic}"
    raise ValueError(f"invalid topic name {topic!r}")


def encode_command(cmd: pb.BaseCommand) -> bytes:
    body = cmd.SerializeToString()
    return _U32.pack(len(body) + 4) + _U32.pack(len(body)) + body


class _Connection:
    def __init__(self, endpoint: PulsarEndpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.ep = endpoint
        self.reader = reader
        self.writer = writer
        # producer id (client-chosen, per connection) -> (topic, producer name)
        self.producers: dict[int, tuple[str, str]] = {}

    def send(self, cmd: pb.BaseCommand) -> None:
        self.writer.write(encode_command(cmd))

    async def run(self) -> None:
        try:
            while True:
                try:
                    head = await self.reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                (total,) = _U32.unpack(head)
                if total < 4 or total > _MAX_FRAME:
                    log.warning("bad frame size %d, closing", total)
                    return
                frame = await self.reader.readexactly(total)
                if not self.handle_frame(frame):
                    return
                await self.writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        except Exception:
            # A protocol bug must cost one connection, never the server.
            log.exception("connection handler failed")
        finally:
            with contextlib.suppress(Exception):
                self.writer.close()

    def handle_frame(self, frame: bytes) -> bool:
        (cmd_size,) = _U32.unpack_from(frame, 0)
        cmd = pb.BaseCommand()
        try:
            cmd.ParseFromString(frame[4 : 4 + cmd_size])
        except DecodeError:
            # Most likely a command type newer than our enum: we cannot answer it by
            # request id, so closing is the clean way to fail the client fast.
            log.warning("undecodable or unsupported command, closing connection")
            return False
        rest = frame[4 + cmd_size :]
        t = cmd.type
        T = pb.BaseCommand
        if t == T.CONNECT:
            self.on_connect(cmd.connect)
        elif t == T.PING:
            self.send(pb.BaseCommand(type=T.PONG, pong=pb.CommandPong()))
        elif t == T.PONG:
            pass
        elif t == T.PARTITIONED_METADATA:
            self.on_partitioned_metadata(cmd.partitionMetadata)
        elif t == T.LOOKUP:
            self.on_lookup(cmd.lookupTopic)
        elif t == T.PRODUCER:
            self.on_producer(cmd.producer)
        elif t == T.SEND:
            self.on_send(cmd.send, rest)
        elif t == T.CLOSE_PRODUCER:
            self.producers.pop(cmd.close_producer.producer_id, None)
            rid = cmd.close_producer.request_id
            self.send(pb.BaseCommand(type=T.SUCCESS, success=pb.CommandSuccess(request_id=rid)))
        else:
            log.warning("unsupported command %s, closing connection", T.Type.Name(t))
            return False
        return True

    def on_connect(self, c: pb.CommandConnect) -> None:
        version = min(c.protocol_version, MAX_PROTOCOL_VERSION)
        self.send(
            pb.BaseCommand(
                type=pb.BaseCommand.CONNECTED,
                connected=pb.CommandConnected(
                    server_version=_SERVER_VERSION, protocol_version=version, max_message_size=MAX_MESSAGE_SIZE
                ),
            )
        )

    def on_partitioned_metadata(self, c: pb.CommandPartitionedTopicMetadata) -> None:
        R = pb.CommandPartitionedTopicMetadataResponse
        try:
            partitions = self.ep.partitions(c.topic)
            resp = R(request_id=c.request_id, partitions=partitions, response=R.Success)
        except ValueError as e:
            resp = R(request_id=c.request_id, response=R.Failed, error=pb.InvalidTopicName, message=str(e))
        self.send(pb.BaseCommand(type=pb.BaseCommand.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=resp))

    def on_lookup(self, c: pb.CommandLookupTopic) -> None:
        R = pb.CommandLookupTopicResponse
        # We are the only broker, so every lookup resolves to ourselves, authoritatively,
        # which stops the client from issuing a second redirect-chasing lookup.
        resp = R(
            request_id=c.request_id,
            response=R.Connect,
            brokerServiceUrl=self.ep.service_url,
            authoritative=True,
        )
        self.send(pb.BaseCommand(type=pb.BaseCommand.LOOKUP_RESPONSE, lookupTopicResponse=resp))

    def on_producer(self, c: pb.CommandProducer) -> None:
        try:
            topic = normalize_topic(c.topic)
        except ValueError as e:
            err = pb.CommandError(request_id=c.request_id, error=pb.InvalidTopicName, message=str(e))
            self.send(pb.BaseCommand(type=pb.BaseCommand.ERROR, error=err))
            return
        name = c.producer_name if c.HasField("producer_name") and c.producer_name else self.ep.new_producer_name()
        self.producers[c.producer_id] = (topic, name)
        ok = pb.CommandProducerSuccess(
            request_id=c.request_id,
            producer_name=name,
            last_sequence_id=self.ep.store.last_sequence_id(topic, name),
        )
        if c.HasField("schema"):
            self.ep.register_schema(topic, c.schema)
            # Single schema version per topic: the endpoint does not model schema evolution.
            ok.schema_version = struct.pack(">q", 0)
        self.send(pb.BaseCommand(type=pb.BaseCommand.PRODUCER_SUCCESS, producer_success=ok))

    def _send_error(self, c: pb.CommandSend, error: int, message: str) -> None:
        err = pb.CommandSendError(producer_id=c.producer_id, sequence_id=c.sequence_id, error=error, message=message)
        self.send(pb.BaseCommand(type=pb.BaseCommand.SEND_ERROR, send_error=err))

    def on_send(self, c: pb.CommandSend, rest: bytes) -> None:
        prod = self.producers.get(c.producer_id)
        if prod is None:
            self._send_error(c, pb.UnknownError, "producer not registered on this connection")
            return
        topic, name = prod
        if len(rest) >= 2 and struct.unpack_from(">H", rest, 0)[0] == _MAGIC_CRC32C:
            (checksum,) = _U32.unpack_from(rest, 2)
            body = rest[6:]
            if crc32c(body) != checksum:
                self._send_error(c, pb.ChecksumError, "checksum mismatch")
                return
        else:
            body = rest  # pre-v6 clients send no checksum
        (meta_size,) = _U32.unpack_from(body, 0)
        meta_bytes = body[4 : 4 + meta_size]
        payload = body[4 + meta_size :]
        meta = pb.MessageMetadata()
        try:
            meta.ParseFromString(meta_bytes)
        except DecodeError:
            self._send_error(c, pb.UnknownError, "bad message metadata")
            return
        highest = c.highest_sequence_id if c.highest_sequence_id > c.sequence_id else 0
        if not highest:
            highest = max(c.sequence_id + max(c.num_messages, 1) - 1, meta.highest_sequence_id)
        led, ent, _dup = self.ep.store.append(
            topic,
            name,
            c.sequence_id,
            highest,
            c.num_messages,
            meta_bytes,
            payload,
            publish_time=meta.publish_time or int(time.time() * 1000),
        )
        receipt = pb.CommandSendReceipt(
            producer_id=c.producer_id,
            sequence_id=c.sequence_id,
            message_id=pb.MessageIdData(ledgerId=led, entryId=ent),
        )
        if c.HasField("highest_sequence_id"):
            receipt.highest_sequence_id = c.highest_sequence_id
        self.send(pb.BaseCommand(type=pb.BaseCommand.SEND_RECEIPT, send_receipt=receipt))


class PulsarEndpoint:
    """A one-process stand-in for a Pulsar broker, producer side.

    ``start()`` binds 127.0.0.1 (port 0 picks a free one) and serves from a background
    thread; ``stop()`` closes it. State lives under ``data_dir`` so a new endpoint on the
    same directory sees earlier messages, partition counts and dedup positions.
    """

    def __init__(self, data_dir: str | Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.port = port
        self.store = MessageStore(self.data_dir)
        self._meta_path = self.data_dir / "partitioned_topics.json"
        self._partitioned: dict[str, int] = json.loads(self._meta_path.read_text()) if self._meta_path.exists() else {}
        self._schemas: dict[str, pb.Schema] = {}
        self._names = itertools.count()
        self._boot = int(time.time())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def service_url(self) -> str:
        return f"pulsar://{self.host}:{self.port}"

    # -- admin-ish API -------------------------------------------------------------------
    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        with self._lock:
            self._partitioned[normalize_topic(topic)] = partitions
            self._meta_path.write_text(json.dumps(self._partitioned, indent=1, sort_keys=True))

    def partitions(self, topic: str) -> int:
        with self._lock:
            return self._partitioned.get(normalize_topic(topic), 0)

    def register_schema(self, topic: str, schema: pb.Schema) -> None:
        with self._lock:
            self._schemas.setdefault(topic, schema)

    def schema(self, topic: str) -> pb.Schema | None:
        with self._lock:
            return self._schemas.get(normalize_topic(topic))

    def new_producer_name(self) -> str:
        with self._lock:
            return f"endpoint-{self._boot}-{next(self._names)}"

    def messages(self, topic: str) -> list[StoredMessage]:
        return self.store.messages(normalize_topic(topic))

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> PulsarEndpoint:
        if self._thread is not None:
            raise RuntimeError("already started")
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(asyncio.start_server(self._on_client, self.host, self.port))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as e:
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                self._server.close()
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                # Let cancelled connection handlers unwind so sockets close and nothing is
                # reported as "destroyed while pending".
                with contextlib.suppress(Exception):
                    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.close()

        self._thread = threading.Thread(target=run, name="pulsar-endpoint", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            self._thread = None
            raise failure[0]
        return self

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _Connection(self, reader, writer).run()

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        loop = self._loop

        def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            loop.stop()

        loop.call_soon_threadsafe(shutdown)
        self._thread.join(10)
        self._thread = None
        self._loop = None

    def __enter__(self) -> PulsarEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
