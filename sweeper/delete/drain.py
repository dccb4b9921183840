"""PIP-186's consumer side: pending deletes taken from the system topic with a Shared subscription.

Messages are acknowledged only after their outcomes are committed to Delta (final results, or the
retry queue for what still fails), so a stage that dies in between leaves them on the
subscription to be delivered again; the delete path is idempotent, so a redelivery is harmless.
A dry run never acknowledges.
"""

from __future__ import annotations

from typing import Any

from sweeper.broker.errors import SystemTopicError
from sweeper.broker.system_topic import BrokerSettings, describe_client_error, open_client
from sweeper.codecs import pending_delete
from sweeper.codecs.errors import InvalidPendingDelete
from sweeper.config import SystemTopicConfig
from sweeper.delete.records import SOURCE_TOPIC, PendingRecord


class TopicDrain:
    def __init__(self, cfg: SystemTopicConfig, broker: BrokerSettings, subscription: str, max_messages: int,
                 wait_ms: int = 2000) -> None:
        self.cfg, self.subscription, self.max_messages, self.wait_ms = cfg, subscription, max_messages, wait_ms
        self.broker = broker
        self.client: Any = None
        self.consumer: Any = None
        self.messages: list[Any] = []

    def receive(self) -> list[PendingRecord]:
        """Up to `max_messages` records (one per distinct record; duplicates are acknowledged with it)."""
        import pulsar

        try:
            self.client = open_client(self.broker)
            self.consumer = self.client.subscribe(
                self.cfg.topic, self.subscription, consumer_type=pulsar.ConsumerType.Shared,
                initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1000)
        except pulsar.PulsarException as exc:
            self.close()
            raise SystemTopicError(describe_client_error(exc, self.broker)) from exc
        records: dict[str, PendingRecord] = {}
        while len(self.messages) < self.max_messages:
            try:
                msg = self.consumer.receive(self.wait_ms)
            except pulsar.Timeout:
                break
            self.messages.append(msg)
            payload = msg.data()
            try:
                record = pending_delete.decode(payload, check=False)
                key = pending_delete.record_key(record)
                origin = record.get("runId")
            except (InvalidPendingDelete, KeyError, TypeError):
                mid = msg.message_id()
                key, origin = f"topic/{mid.partition()}:{mid.ledger_id()}:{mid.entry_id()}:{mid.batch_index()}", None
            records.setdefault(key, PendingRecord(key, SOURCE_TOPIC, origin, 0, payload))
        return sorted(records.values(), key=lambda r: r.record_key)

    def acknowledge(self) -> int:
        for msg in self.messages:
            self.consumer.acknowledge(msg)
        return len(self.messages)

    def close(self) -> None:
        """Unacknowledged messages go back to the subscription for the next consumer."""
        if self.consumer is not None:
            self.consumer.close()
        if self.client is not None:
            self.client.close()
        self.consumer = self.client = None
