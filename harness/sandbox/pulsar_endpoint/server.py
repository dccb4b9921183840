"""Asyncio server speaking Pulsar's binary protocol (producers, consumers and readers).

For tests and the local sandbox only: token auth and TLS exist so the client's settings can be
exercised; no authorization, no replication, one fixed ledger per topic. It exists because no
broker can be installed where the suite runs, and the real C++-based ``pulsar-client`` must be
exercised over TCP unchanged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import hmac
import itertools
import json
import logging
import ssl
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from google.protobuf.message import DecodeError

from . import PulsarApi_pb2 as pb
from .crc32c import crc32c
from .store import _LEDGER_ID, CursorState, CursorStore, MessageStore, StoredEntry, StoredMessage, partition_of

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


# Client-side sentinels arrive as uint64: MessageId.earliest is (-1, -1) and latest is
# (INT64_MAX, INT64_MAX).
_UINT64_NEG1 = 2**64 - 1
_INT64_MAX = 2**63 - 1
_SCHEMA_VERSION = struct.pack(">q", 0)


def _batch_size(e: StoredEntry) -> int:
    return max(e.num_messages, 1)


def _is_batch(e: StoredEntry) -> bool:
    meta = pb.MessageMetadata()
    meta.ParseFromString(e.metadata)
    return meta.HasField("num_messages_in_batch")


class _Consumer:
    def __init__(self, conn: _Connection, consumer_id: int, sub: _Subscription, name: str, priority: int) -> None:
        self.conn = conn
        self.consumer_id = consumer_id
        self.sub = sub
        self.name = name
        self.priority = priority
        self.permits = 0

    def deliver(self, e: StoredEntry, redelivery_count: int, ack_set: list[int] | None) -> None:
        mid = pb.MessageIdData(ledgerId=e.ledger_id, entryId=e.entry_id)
        part = partition_of(self.sub.topic)
        if part >= 0:
            mid.partition = part
        msg = pb.CommandMessage(consumer_id=self.consumer_id, message_id=mid, redelivery_count=redelivery_count)
        if ack_set:
            msg.ack_set.extend(ack_set)
        cmd = pb.BaseCommand(type=pb.BaseCommand.MESSAGE, message=msg).SerializeToString()
        body = _U32.pack(len(e.metadata)) + e.metadata + e.payload
        # Always checksummed: the C++ client verifies it when present, which catches framing bugs here.
        frame = _U32.pack(len(cmd)) + cmd + struct.pack(">HI", _MAGIC_CRC32C, crc32c(body)) + body
        self.conn.writer.write(_U32.pack(len(frame)) + frame)
        self.permits -= _batch_size(e)


class _Subscription:
    """One cursor plus its dispatcher; lives on the endpoint's event loop thread only."""

    def __init__(
        self,
        ep: PulsarEndpoint,
        topic: str,
        name: str,
        sub_type: int,
        durable: bool,
        cursor: CursorState,
    ) -> None:
        self.ep = ep
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.durable = durable
        self.cursor = cursor
        self.read_pos = cursor.mark_delete + 1  # next entry never dispatched since (re)positioning
        self.replay: list[int] = []  # heap of entries to dispatch again
        self.redelivery: dict[int, int] = {}
        self.pending: dict[int, _Consumer] = {}  # dispatched, not yet acknowledged
        self.consumers: list[_Consumer] = []
        self._rr = 0
        # Set while consumers were disconnected by a seek: a non-durable subscription must
        # outlive that gap, because the client resubscribes expecting the reset position.
        self.keep_alive = False

    # -- cursor --------------------------------------------------------------------------
    def is_acked(self, entry_id: int) -> bool:
        return entry_id <= self.cursor.mark_delete or entry_id in self.cursor.acked

    def _ack_one(self, e: int) -> None:
        if e > self.cursor.mark_delete:
            self.cursor.acked.add(e)
        self.cursor.partial.pop(e, None)
        self.pending.pop(e, None)
        self.redelivery.pop(e, None)

    def _ack_upto(self, e: int) -> None:
        if e <= self.cursor.mark_delete:
            return
        self.cursor.mark_delete = e
        self.cursor.acked = {x for x in self.cursor.acked if x > e}
        self.cursor.partial = {k: v for k, v in self.cursor.partial.items() if k > e}
        for x in [x for x in self.pending if x <= e]:
            del self.pending[x]
        for x in [x for x in self.redelivery if x <= e]:
            del self.redelivery[x]

    def _ack_batch_indexes(self, e: int, ack_set: list[int]) -> None:
        if self.is_acked(e):
            return
        prev = self.cursor.partial.get(e)
        words = list(ack_set) if prev is None else [a & b for a, b in zip(prev, ack_set, strict=False)]
        if not any(words):
            self._ack_one(e)
        else:
            self.cursor.partial[e] = words

    def _collapse(self) -> None:
        while self.cursor.mark_delete + 1 in self.cursor.acked:
            self.cursor.acked.discard(self.cursor.mark_delete + 1)
            self.cursor.mark_delete += 1

    def persist(self) -> None:
        if self.durable:
            self.ep.cursors.save(self.topic, self.name, self.cursor)

    def ack(self, c: pb.CommandAck) -> None:
        for mid in c.message_id:
            e = mid.entryId
            if c.ack_type == pb.CommandAck.Cumulative:
                if any(mid.ack_set):
                    # A cumulative ack inside a batch covers the earlier entries and part of this one.
                    self._ack_upto(e - 1)
                    self._ack_batch_indexes(e, list(mid.ack_set))
                else:
                    self._ack_upto(e)
            elif len(mid.ack_set):
                self._ack_batch_indexes(e, list(mid.ack_set))
            else:
                self._ack_one(e)
        self._collapse()
        self.persist()

    def reset(self, entry_id: int) -> None:
        """Position so ``entry_id`` is the next entry read; acks at or after it are forgotten."""
        count = self.ep.store.entry_count(self.topic)
        entry_id = max(0, min(entry_id, count))
        self.cursor.mark_delete = entry_id - 1
        self.cursor.acked = {x for x in self.cursor.acked if x < entry_id}
        self.cursor.partial = {k: v for k, v in self.cursor.partial.items() if k < entry_id}
        self._collapse()
        self.pending.clear()
        self.replay.clear()
        self.read_pos = entry_id
        self.persist()

    # -- dispatch ------------------------------------------------------------------------
    def add_consumer(self, consumer: _Consumer) -> None:
        self.consumers.append(consumer)
        self.keep_alive = False

    def remove_consumer(self, consumer: _Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        # Whatever it held but never acknowledged goes to the others (or the next consumer).
        for e in [e for e, c in self.pending.items() if c is consumer]:
            del self.pending[e]
            heapq.heappush(self.replay, e)
        self.dispatch()

    def redeliver(self, consumer: _Consumer, entry_ids: list[int] | None) -> None:
        held = [e for e, c in self.pending.items() if c is consumer]
        targets = held if entry_ids is None else [e for e in entry_ids if e in self.pending]
        for e in targets:
            del self.pending[e]
            self.redelivery[e] = self.redelivery.get(e, 0) + 1
            heapq.heappush(self.replay, e)
        self.dispatch()

    def _active(self) -> list[_Consumer]:
        if self.sub_type in (pb.CommandSubscribe.Exclusive, pb.CommandSubscribe.Failover):
            # Failover: one active consumer, chosen by priority then connection order.
            ordered = sorted(self.consumers, key=lambda c: c.priority)
            return ordered[:1]
        return self.consumers

    def _next_entry(self) -> int | None:
        while self.replay:
            e = heapq.heappop(self.replay)
            if not self.is_acked(e) and e not in self.pending:
                return e
        count = self.ep.store.entry_count(self.topic)
        while self.read_pos < count:
            e = self.read_pos
            self.read_pos += 1
            if not self.is_acked(e) and e not in self.pending:
                return e
        return None

    def dispatch(self) -> None:
        while True:
            ready = [c for c in self._active() if c.permits > 0]
            if not ready:
                return
            e = self._next_entry()
            if e is None:
                return
            entry = self.ep.store.entry(self.topic, e)
            if entry is None:
                return
            consumer = ready[self._rr % len(ready)]
            self._rr += 1
            consumer.deliver(entry, self.redelivery.get(e, 0), self.cursor.partial.get(e))
            self.pending[e] = consumer


class _Connection:
    # command type -> (BaseCommand field, handler); filled in below the class body.
    _consumer_handlers: ClassVar[dict[int, tuple[str, Callable[[_Connection, Any], None]]]] = {}

    def __init__(self, endpoint: PulsarEndpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.ep = endpoint
        self.reader = reader
        self.writer = writer
        # producer id (client-chosen, per connection) -> (topic, producer name)
        self.producers: dict[int, tuple[str, str]] = {}
        self.consumers: dict[int, _Consumer] = {}
        # Receipts held back by the endpoint's persist latency, in the order the sends came.
        self._receipts: collections.deque[tuple[float, pb.BaseCommand]] = collections.deque()
        self._receipt_timer: asyncio.TimerHandle | None = None
        self.authenticated = endpoint.token is None

    def send(self, cmd: pb.BaseCommand) -> None:
        self.writer.write(encode_command(cmd))

    def send_receipt(self, cmd: pb.BaseCommand) -> None:
        """Now, or after the modelled persist latency; either way in arrival order, as a broker acks."""
        latency = self.ep.persist_latency_ms / 1000
        if not latency:
            self.send(cmd)
            return
        loop = asyncio.get_running_loop()
        ready = max(loop.time() + latency, self._receipts[-1][0] if self._receipts else 0.0)
        self._receipts.append((ready, cmd))
        if self._receipt_timer is None:
            self._receipt_timer = loop.call_at(ready, self._flush_receipts)

    def _flush_receipts(self) -> None:
        self._receipt_timer = None
        if self.writer.is_closing():
            self._receipts.clear()
            return
        now = asyncio.get_running_loop().time()
        while self._receipts and self._receipts[0][0] <= now:
            self.send(self._receipts.popleft()[1])
        if self._receipts:
            self._receipt_timer = asyncio.get_running_loop().call_at(self._receipts[0][0], self._flush_receipts)

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
                self.close_consumers()
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
            return self.on_connect(cmd.connect)
        if not self.authenticated:
            log.warning("%s before an accepted CONNECT, closing connection", T.Type.Name(t))
            return False
        if t == T.PING:
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
        elif t in self._consumer_handlers:
            field, handler = self._consumer_handlers[t]
            if not cmd.HasField(field):
                log.warning("%s without its body, closing connection", T.Type.Name(t))
                return False
            handler(self, getattr(cmd, field))
        else:
            log.warning("unsupported command %s, closing connection", T.Type.Name(t))
            return False
        return True

    def on_connect(self, c: pb.CommandConnect) -> bool:
        expected = self.ep.token
        if expected is not None:
            offered = c.auth_data.decode("utf-8", "replace") if c.HasField("auth_data") else ""
            if c.auth_method_name != "token" or not hmac.compare_digest(offered, expected):
                # As a broker does: an error with request id -1, then the connection is closed.
                err = pb.CommandError(request_id=_UINT64_NEG1, error=pb.AuthenticationError,
                                      message="Unable to authenticate")
                self.send(pb.BaseCommand(type=pb.BaseCommand.ERROR, error=err))
                return False
        self.authenticated = True
        version = min(c.protocol_version, MAX_PROTOCOL_VERSION)
        self.send(
            pb.BaseCommand(
                type=pb.BaseCommand.CONNECTED,
                connected=pb.CommandConnected(
                    server_version=_SERVER_VERSION, protocol_version=version, max_message_size=MAX_MESSAGE_SIZE
                ),
            )
        )
        return True

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
            brokerServiceUrl=self.ep.plain_url,
            brokerServiceUrlTls=self.ep.tls_url,
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

    # -- consumer side -------------------------------------------------------------------
    def _error(self, request_id: int, error: int, message: str) -> None:
        err = pb.CommandError(request_id=request_id, error=error, message=message)
        self.send(pb.BaseCommand(type=pb.BaseCommand.ERROR, error=err))

    def _success(self, request_id: int) -> None:
        self.send(pb.BaseCommand(type=pb.BaseCommand.SUCCESS, success=pb.CommandSuccess(request_id=request_id)))

    def on_subscribe(self, c: pb.CommandSubscribe) -> None:
        try:
            topic = normalize_topic(c.topic)
        except ValueError as e:
            self._error(c.request_id, pb.InvalidTopicName, str(e))
            return
        if self.ep.partitions(topic) > 0:
            # The client resolves partitions first; a broker also refuses the bare name.
            self._error(c.request_id, pb.InvalidTopicName, f"{topic} is partitioned, subscribe to its partitions")
            return
        if c.HasField("schema"):
            existing = self.ep.schema(topic)
            if existing is None:
                self.ep.register_schema(topic, c.schema)
            elif existing.type != c.schema.type:
                self._error(c.request_id, pb.IncompatibleSchema, "schema type differs from the topic's schema")
                return
        old = self.consumers.pop(c.consumer_id, None)
        if old is not None:
            old.sub.remove_consumer(old)
        sub = self.ep.subscription_for(topic, c)
        if c.subType == pb.CommandSubscribe.Exclusive and sub.consumers:
            self._error(
                c.request_id, pb.ConsumerBusy, f"exclusive subscription {c.subscription} already has a consumer"
            )
            return
        consumer = _Consumer(self, c.consumer_id, sub, c.consumer_name, c.priority_level)
        self.consumers[c.consumer_id] = consumer
        sub.add_consumer(consumer)
        self._success(c.request_id)

    def _consumer(self, consumer_id: int) -> _Consumer | None:
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            log.warning("command for unknown consumer %d", consumer_id)
        return consumer

    def on_flow(self, c: pb.CommandFlow) -> None:
        consumer = self._consumer(c.consumer_id)
        if consumer is not None:
            consumer.permits += c.messagePermits
            consumer.sub.dispatch()

    def on_ack(self, c: pb.CommandAck) -> None:
        consumer = self._consumer(c.consumer_id)
        if consumer is not None:
            consumer.sub.ack(c)
        # Only clients with ack receipts enabled set request_id and wait for this; others
        # would log an unknown-request warning for every ack.
        if c.HasField("request_id"):
            resp = pb.CommandAckResponse(consumer_id=c.consumer_id, request_id=c.request_id)
            if consumer is None:
                resp.error = pb.ConsumerNotFound
                resp.message = "consumer not found"
            self.send(pb.BaseCommand(type=pb.BaseCommand.ACK_RESPONSE, ackResponse=resp))

    def on_redeliver(self, c: pb.CommandRedeliverUnacknowledgedMessages) -> None:
        consumer = self._consumer(c.consumer_id)
        if consumer is not None:
            ids = [m.entryId for m in c.message_ids] if len(c.message_ids) else None
            consumer.sub.redeliver(consumer, ids)

    def _drop_consumer(self, consumer_id: int) -> None:
        consumer = self.consumers.pop(consumer_id, None)
        if consumer is not None:
            consumer.sub.remove_consumer(consumer)
            self.ep.maybe_drop_subscription(consumer.sub)

    def on_close_consumer(self, c: pb.CommandCloseConsumer) -> None:
        self._drop_consumer(c.consumer_id)
        self._success(c.request_id)

    def on_unsubscribe(self, c: pb.CommandUnsubscribe) -> None:
        consumer = self.consumers.get(c.consumer_id)
        if consumer is None:
            self._error(c.request_id, pb.ConsumerNotFound, "consumer not found")
            return
        sub = consumer.sub
        if any(other is not consumer for other in sub.consumers) and not c.force:
            self._error(c.request_id, pb.ConsumerBusy, "subscription has other consumers")
            return
        for other in list(sub.consumers):
            if other is not consumer:
                other.conn._server_close_consumer(other)
        self._drop_consumer(c.consumer_id)
        self.ep.delete_subscription(sub)
        self._success(c.request_id)

    def _server_close_consumer(self, consumer: _Consumer) -> None:
        """Broker-initiated close: the client reconnects and resubscribes on its own."""
        self.consumers.pop(consumer.consumer_id, None)
        consumer.sub.remove_consumer(consumer)
        close = pb.CommandCloseConsumer(consumer_id=consumer.consumer_id, request_id=0)
        self.send(pb.BaseCommand(type=pb.BaseCommand.CLOSE_CONSUMER, close_consumer=close))

    def on_seek(self, c: pb.CommandSeek) -> None:
        consumer = self.consumers.get(c.consumer_id)
        if consumer is None:
            self._error(c.request_id, pb.ConsumerNotFound, "consumer not found")
            return
        sub = consumer.sub
        if c.HasField("message_id"):
            target = self.ep.entry_for_message_id(sub.topic, c.message_id, default=0)
        elif c.HasField("message_publish_time"):
            target = self.ep.entry_for_publish_time(sub.topic, c.message_publish_time)
        else:
            self._error(c.request_id, pb.UnknownError, "seek needs a message id or a publish time")
            return
        # Like a broker: disconnect the subscription's consumers before answering, so the
        # client takes its reconnect path, drops prefetched messages and gets fresh permits.
        sub.keep_alive = True
        for other in list(sub.consumers):
            other.conn._server_close_consumer(other)
        sub.reset(target)
        self._success(c.request_id)

    def on_get_last_message_id(self, c: pb.CommandGetLastMessageId) -> None:
        consumer = self.consumers.get(c.consumer_id)
        if consumer is None:
            self._error(c.request_id, pb.ConsumerNotFound, "consumer not found")
            return
        sub = consumer.sub
        resp = pb.CommandGetLastMessageIdResponse(
            request_id=c.request_id, last_message_id=self.ep.last_message_id(sub.topic)
        )
        md = sub.cursor.mark_delete
        mark = pb.MessageIdData(
            ledgerId=_LEDGER_ID if md >= 0 else _UINT64_NEG1, entryId=md if md >= 0 else _UINT64_NEG1
        )
        resp.consumer_mark_delete_position.CopyFrom(mark)
        self.send(pb.BaseCommand(type=pb.BaseCommand.GET_LAST_MESSAGE_ID_RESPONSE, getLastMessageIdResponse=resp))

    def on_get_schema(self, c: pb.CommandGetSchema) -> None:
        resp = pb.CommandGetSchemaResponse(request_id=c.request_id)
        try:
            schema = self.ep.schema(c.topic)
        except ValueError:
            schema = None
        if schema is None:
            resp.error_code = pb.TopicNotFound
            resp.error_message = "no schema registered for topic"
        else:
            resp.schema.CopyFrom(schema)
            resp.schema_version = _SCHEMA_VERSION
        self.send(pb.BaseCommand(type=pb.BaseCommand.GET_SCHEMA_RESPONSE, getSchemaResponse=resp))

    def on_get_topics(self, c: pb.CommandGetTopicsOfNamespace) -> None:
        resp = pb.CommandGetTopicsOfNamespaceResponse(request_id=c.request_id, topics=self.ep.topics_of(c.namespace))
        self.send(
            pb.BaseCommand(type=pb.BaseCommand.GET_TOPICS_OF_NAMESPACE_RESPONSE, getTopicsOfNamespaceResponse=resp)
        )

    def on_consumer_stats(self, c: pb.CommandConsumerStats) -> None:
        resp = pb.CommandConsumerStatsResponse(
            request_id=c.request_id, error_code=pb.NotAllowedError, error_message="consumer stats not supported"
        )
        self.send(pb.BaseCommand(type=pb.BaseCommand.CONSUMER_STATS_RESPONSE, consumerStatsResponse=resp))

    def close_consumers(self) -> None:
        for consumer_id in list(self.consumers):
            self._drop_consumer(consumer_id)

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
        led, ent, dup = self.ep.store.append(
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
        self.send_receipt(pb.BaseCommand(type=pb.BaseCommand.SEND_RECEIPT, send_receipt=receipt))
        if not dup:
            self.ep.notify_appended(topic)


_Connection._consumer_handlers = {
    pb.BaseCommand.SUBSCRIBE: ("subscribe", _Connection.on_subscribe),
    pb.BaseCommand.FLOW: ("flow", _Connection.on_flow),
    pb.BaseCommand.ACK: ("ack", _Connection.on_ack),
    pb.BaseCommand.REDELIVER_UNACKNOWLEDGED_MESSAGES: ("redeliverUnacknowledgedMessages", _Connection.on_redeliver),
    pb.BaseCommand.CLOSE_CONSUMER: ("close_consumer", _Connection.on_close_consumer),
    pb.BaseCommand.UNSUBSCRIBE: ("unsubscribe", _Connection.on_unsubscribe),
    pb.BaseCommand.SEEK: ("seek", _Connection.on_seek),
    pb.BaseCommand.GET_LAST_MESSAGE_ID: ("getLastMessageId", _Connection.on_get_last_message_id),
    pb.BaseCommand.GET_SCHEMA: ("getSchema", _Connection.on_get_schema),
    pb.BaseCommand.GET_TOPICS_OF_NAMESPACE: ("getTopicsOfNamespace", _Connection.on_get_topics),
    pb.BaseCommand.CONSUMER_STATS: ("consumerStats", _Connection.on_consumer_stats),
}


def server_tls_context(cert_file: str, key_file: str | None) -> ssl.SSLContext:
    """The server side of TLS for the endpoint and its admin API."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context


class PulsarEndpoint:
    """A one-process stand-in for a Pulsar broker, producer side.

    ``start()`` binds 127.0.0.1 (port 0 picks a free one) and serves from a background
    thread; ``stop()`` closes it. State lives under ``data_dir`` so a new endpoint on the
    same directory sees earlier messages, partition counts and dedup positions.
    """

    def __init__(self, data_dir: str | Path, host: str = "127.0.0.1", port: int = 0,
                 persist_latency_ms: float = 0.0, token: str | None = None,
                 tls_cert_file: str | None = None, tls_key_file: str | None = None) -> None:
        """`persist_latency_ms` models how long a real cluster takes to make a write durable (journal
        fsync and replication to the ack quorum, typically a few ms): send receipts wait that long.
        The message is stored at once either way; 0 acknowledges immediately.

        `token`: clients must CONNECT with the token authentication method and this token.
        `tls_cert_file` / `tls_key_file`: serve TLS only (`pulsar+ssl://`) with this certificate."""
        self.persist_latency_ms = persist_latency_ms
        self.token = token
        self._ssl = server_tls_context(tls_cert_file, tls_key_file) if tls_cert_file else None
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.port = port
        self.store = MessageStore(self.data_dir)
        self._meta_path = self.data_dir / "partitioned_topics.json"
        self._partitioned: dict[str, int] = json.loads(self._meta_path.read_text()) if self._meta_path.exists() else {}
        self._schemas: dict[str, pb.Schema] = {}
        self.cursors = CursorStore(self.data_dir)
        self._subs: dict[str, dict[str, _Subscription]] = {}
        self._names = itertools.count()
        self._boot = int(time.time())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def service_url(self) -> str:
        return self.tls_url if self._ssl else self.plain_url

    @property
    def plain_url(self) -> str:
        return f"pulsar://{self.host}:{self.port}"  # what a lookup names; unused by a TLS client

    @property
    def tls_url(self) -> str:
        return f"pulsar+ssl://{self.host}:{self.port}"

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

    # -- subscriptions (event loop thread only, except the read-only helpers) -------------
    def subscription_for(self, topic: str, c: pb.CommandSubscribe) -> _Subscription:
        subs = self._subs.setdefault(topic, {})
        sub = subs.get(c.subscription)
        if sub is not None:
            return sub
        durable = c.durable
        count = self.store.entry_count(topic)
        cursor = self.cursors.get(topic, c.subscription) if durable else None
        if cursor is None:
            if not durable and c.HasField("start_message_id"):
                start = self.entry_for_message_id(topic, c.start_message_id, default=count)
            elif c.initialPosition == pb.CommandSubscribe.Earliest:
                start = 0
            else:
                start = count
            cursor = CursorState(mark_delete=start - 1)
        sub = _Subscription(self, topic, c.subscription, c.subType, durable, cursor)
        subs[c.subscription] = sub
        # A broker creates the durable cursor at subscribe time, so a subscription made at
        # "latest" keeps its position even if it is never acknowledged on.
        sub.persist()
        return sub

    def maybe_drop_subscription(self, sub: _Subscription) -> None:
        if not sub.durable and not sub.consumers and not sub.keep_alive:
            self._subs.get(sub.topic, {}).pop(sub.name, None)

    def delete_subscription(self, sub: _Subscription) -> None:
        self._subs.get(sub.topic, {}).pop(sub.name, None)
        if sub.durable:
            self.cursors.save(sub.topic, sub.name, None)

    def entry_for_message_id(self, topic: str, mid: pb.MessageIdData, default: int) -> int:
        """The entry a start/seek message id points at, inclusive: the client itself drops
        the messages before (or at, when not inclusive) the id it asked for."""
        count = self.store.entry_count(topic)
        if mid.ledgerId == _UINT64_NEG1 or mid.entryId == _UINT64_NEG1:
            return 0
        if mid.ledgerId >= _INT64_MAX or mid.entryId >= _INT64_MAX:
            return count
        if mid.ledgerId < _LEDGER_ID:
            return 0
        if mid.ledgerId > _LEDGER_ID:
            return default
        return min(mid.entryId, count)

    def entry_for_publish_time(self, topic: str, publish_time: int) -> int:
        entries = self.store.entries(topic)
        return next((e.entry_id for e in entries if e.publish_time >= publish_time), len(entries))

    def last_message_id(self, topic: str) -> pb.MessageIdData:
        count = self.store.entry_count(topic)
        if count == 0:
            return pb.MessageIdData(ledgerId=_UINT64_NEG1, entryId=_UINT64_NEG1)
        last = self.store.entry(topic, count - 1)
        assert last is not None
        mid = pb.MessageIdData(ledgerId=last.ledger_id, entryId=last.entry_id)
        part = partition_of(topic)
        if part >= 0:
            mid.partition = part
        if _is_batch(last):
            # The client compares batch indexes, so the last message of a batch must be named.
            mid.batch_index = _batch_size(last) - 1
            mid.batch_size = _batch_size(last)
        return mid

    def notify_appended(self, topic: str) -> None:
        for sub in list(self._subs.get(topic, {}).values()):
            sub.dispatch()

    def topics_of(self, namespace: str) -> list[str]:
        prefix = f"persistent://{namespace}/"
        names = {t for t in self.store.topics() if t.startswith(prefix)}
        with self._lock:
            for t, n in self._partitioned.items():
                if t.startswith(prefix):
                    names.update(f"{t}-partition-{i}" for i in range(n))
        return sorted(names)

    def subscriptions(self, topic: str) -> list[str]:
        """Durable subscriptions (persisted) plus live non-durable ones, for tests."""
        topic = normalize_topic(topic)
        live = set(self._subs.get(topic, {}))
        return sorted(live | set(self.cursors.names(topic)))

    def cursor(self, topic: str, subscription: str) -> CursorState | None:
        """A durable subscription's persisted cursor, for tests."""
        return self.cursors.get(normalize_topic(topic), subscription)

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
                self._server = loop.run_until_complete(asyncio.start_server(self._on_client, self.host, self.port,
                                                                                 ssl=self._ssl))
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
        # Swallow the shutdown cancellation: asyncio's stream callback calls task.exception()
        # on a cancelled handler and logs the CancelledError as an error otherwise.
        with contextlib.suppress(asyncio.CancelledError):
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
