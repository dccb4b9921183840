"""Reading the pending-delete topic for the snapshot: a reader per partition, from the earliest message.

A reader holds no durable subscription and acknowledges nothing, so the snapshot never changes
what a PIP-186 consumer will see. Anyone with produce permission can write to the topic, so every
message is decoded and validated; what fails lands in `quarantine` with its bytes, never as a
pending delete.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sweeper.broker.errors import SystemTopicError
from sweeper.broker.system_topic import BrokerSettings, describe_client_error, open_client, partition_topic
from sweeper.codecs import pending_delete
from sweeper.codecs.errors import InvalidPendingDelete
from sweeper.scan import Row, quarantine_row

READ_TIMEOUT_MS = 5000


def pending_delete_row(partition: int, message_id: str, publish_time_ms: int | None, message_key: str | None,
                       payload: bytes) -> Row:
    """A `pending_deletes` row for a valid record; InvalidPendingDelete for anything else."""
    record = pending_delete.decode(payload)
    context = record.get("offloadContext") or {}
    return {
        "record_type": "pending_deletes",
        "topic_partition": partition,
        "message_id": message_id,
        "publish_time_ms": publish_time_ms,
        "message_key": message_key,
        "record_key": pending_delete.record_key(record),
        "ledger_id": record["ledgerId"],
        "ledger_type": record["ledgerType"],
        "component": record["ledgerComponent"],
        "topic_name": record.get("topicName"),
        "cursor": record.get("cursorName"),
        "schema_id": record.get("schemaId"),
        "offload_uuid": context.get("uuid"),
        "s3_bucket": context.get("bucket"),
        "s3_keys": context.get("keys"),
        "reason": record.get("reason"),
        "source_run_id": record.get("runId"),
        "payload": payload,
    }


def _message_id(msg_id: Any) -> str:
    return f"{msg_id.ledger_id()}:{msg_id.entry_id()}:{msg_id.batch_index()}"


def read_partition(broker: BrokerSettings, topic: str, partition: int) -> Iterator[Row]:
    """Every message of one partition as it stands now, as rows for `pending_deletes` or `quarantine`."""
    import pulsar

    name = partition_topic(topic, partition)
    client = open_client(broker)
    try:
        try:
            reader = client.create_reader(name, pulsar.MessageId.earliest, receiver_queue_size=1000)
        except pulsar.PulsarException as exc:
            raise SystemTopicError(describe_client_error(exc, broker)) from exc
        while reader.has_message_available():
            msg = reader.read_next(READ_TIMEOUT_MS)
            message_id = _message_id(msg.message_id())
            payload = msg.data()
            try:
                yield pending_delete_row(partition, message_id, msg.publish_timestamp() or None,
                                         msg.partition_key() or None, payload)
            except InvalidPendingDelete as exc:
                yield quarantine_row("pending_delete", f"{name}@{message_id}", exc.kind, str(exc), raw=payload)
        reader.close()
    finally:
        client.close()
