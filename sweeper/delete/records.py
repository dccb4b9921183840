"""What the delete stage works on: one pending-delete record, where it came from, its attempts so far."""

from __future__ import annotations

from dataclasses import dataclass

SOURCE_EMITTED, SOURCE_RETRY, SOURCE_JSON, SOURCE_TOPIC = "emitted", "retry_queue", "from_json", "topic"


@dataclass(frozen=True)
class PendingRecord:
    record_key: str
    source: str
    origin_run_id: str | None
    attempts_before: int
    payload: bytes  # the Avro record, decoded (and validated) by the executors
    # An operator's entry that is no PendingDeleteLedgerInfo at all (say, a component Pulsar never writes): why,
    # so its `invalid` outcome names the field instead of an Avro decoder's complaint about its own bytes.
    unencodable: str = ""
