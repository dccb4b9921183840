"""Append-only per-topic message log for the test endpoint.

Each SEND that is accepted becomes one record, so a batch stays one entry exactly as a
broker would write it to a BookKeeper ledger; batches are only unpacked on read.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import urllib.parse
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from . import PulsarApi_pb2 as pb

# ledger id, entry id, sequence id, highest sequence id, publish time, num messages,
# then lengths of producer name, metadata, payload.
_HEADER = struct.Struct(">QQQQQiIII")
_LEN = struct.Struct(">I")

# One fixed ledger id per topic keeps message ids stable across restarts without a ledger
# rollover model; the entry id is the per-topic counter.
_LEDGER_ID = 1


@dataclass(frozen=True)
class StoredEntry:
    """One persisted SEND (a whole batch when the producer batches)."""

    ledger_id: int
    entry_id: int
    producer_name: str
    sequence_id: int
    highest_sequence_id: int
    publish_time: int
    num_messages: int
    metadata: bytes
    payload: bytes


@dataclass(frozen=True)
class StoredMessage:
    """One application message, with batches unpacked."""

    topic: str
    ledger_id: int
    entry_id: int
    batch_index: int  # -1 when the entry was not a batch
    partition: int
    producer_name: str
    sequence_id: int
    publish_time: int
    payload: bytes
    key: str | None
    properties: dict[str, str] = field(default_factory=dict)
    event_time: int = 0


def _encode_record(e: StoredEntry) -> bytes:
    name = e.producer_name.encode()
    body = (
        _HEADER.pack(
            e.ledger_id,
            e.entry_id,
            e.sequence_id,
            e.highest_sequence_id,
            e.publish_time,
            e.num_messages,
            len(name),
            len(e.metadata),
            len(e.payload),
        )
        + name
        + e.metadata
        + e.payload
    )
    return _LEN.pack(len(body)) + body


def _record_body_len(e: StoredEntry) -> int:
    return _HEADER.size + len(e.producer_name.encode()) + len(e.metadata) + len(e.payload)


def _decode_records(data: bytes) -> list[StoredEntry]:
    out: list[StoredEntry] = []
    pos = 0
    while pos + _LEN.size <= len(data):
        (n,) = _LEN.unpack_from(data, pos)
        if pos + _LEN.size + n > len(data):
            break  # torn tail from a crash mid-append: ignore, like an unacknowledged write
        body = data[pos + _LEN.size : pos + _LEN.size + n]
        pos += _LEN.size + n
        led, ent, seq, hseq, pt, nm, ln, lm, lp = _HEADER.unpack_from(body, 0)
        off = _HEADER.size
        name = body[off : off + ln].decode()
        off += ln
        meta = body[off : off + lm]
        off += lm
        payload = body[off : off + lp]
        out.append(StoredEntry(led, ent, name, seq, hseq, pt, nm, meta, payload))
    return out


def _decompress(meta: pb.MessageMetadata, payload: bytes) -> bytes:
    if meta.compression == pb.NONE:
        return payload
    if meta.compression == pb.ZLIB:
        return zlib.decompress(payload)
    if meta.compression == pb.LZ4:
        import lz4.block  # pinned project dependency; imported lazily as it is rarely needed

        return lz4.block.decompress(payload, uncompressed_size=meta.uncompressed_size)
    if meta.compression == pb.ZSTD:
        import zstandard

        return zstandard.ZstdDecompressor().decompress(payload, max_output_size=meta.uncompressed_size)
    raise ValueError(f"unsupported compression {meta.compression}")


def partition_of(topic: str) -> int:
    base, sep, idx = topic.rpartition("-partition-")
    if sep and base and idx.isdigit():
        return int(idx)
    return -1


def unpack_entry(topic: str, e: StoredEntry) -> list[StoredMessage]:
    meta = pb.MessageMetadata()
    meta.ParseFromString(e.metadata)
    payload = _decompress(meta, e.payload)
    part = partition_of(topic)
    if not meta.HasField("num_messages_in_batch"):
        return [
            StoredMessage(
                topic,
                e.ledger_id,
                e.entry_id,
                -1,
                part,
                meta.producer_name,
                meta.sequence_id,
                meta.publish_time,
                payload,
                meta.partition_key if meta.HasField("partition_key") else None,
                {kv.key: kv.value for kv in meta.properties},
                meta.event_time,
            )
        ]
    out: list[StoredMessage] = []
    pos = 0
    for i in range(meta.num_messages_in_batch):
        (n,) = _LEN.unpack_from(payload, pos)
        pos += _LEN.size
        single = pb.SingleMessageMetadata()
        single.ParseFromString(payload[pos : pos + n])
        pos += n
        body = payload[pos : pos + single.payload_size]
        pos += single.payload_size
        out.append(
            StoredMessage(
                topic,
                e.ledger_id,
                e.entry_id,
                i,
                part,
                meta.producer_name,
                single.sequence_id if single.HasField("sequence_id") else meta.sequence_id + i,
                meta.publish_time,
                body,
                single.partition_key if single.HasField("partition_key") else None,
                {kv.key: kv.value for kv in single.properties},
                single.event_time or meta.event_time,
            )
        )
    return out


class _TopicLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[StoredEntry] = []
        if path.exists():
            data = path.read_bytes()
            self.entries = _decode_records(data)
            valid = sum(_LEN.size + _record_body_len(e) for e in self.entries)
            if valid < len(data):
                # Cut the torn tail now, or the next append would land after garbage.
                with path.open("r+b") as f:
                    f.truncate(valid)
        # producer name -> highest persisted sequence id, and sequence id -> (ledger, entry)
        # so a duplicate can be acknowledged with the id of the original write.
        self.last_seq: dict[str, int] = {}
        self.seq_index: dict[tuple[str, int], tuple[int, int]] = {}
        for e in self.entries:
            self._index(e)

    def _index(self, e: StoredEntry) -> None:
        self.last_seq[e.producer_name] = max(self.last_seq.get(e.producer_name, -1), e.highest_sequence_id)
        # Every sequence id of a batch maps to its entry, so re-sending any of them finds it.
        for seq in range(e.sequence_id, max(e.sequence_id, e.highest_sequence_id) + 1):
            self.seq_index[(e.producer_name, seq)] = (e.ledger_id, e.entry_id)

    def append(self, e: StoredEntry) -> None:
        with self.path.open("ab") as f:
            f.write(_encode_record(e))
            f.flush()
        self.entries.append(e)
        self._index(e)


class MessageStore:
    """Thread-safe: the server loop writes while tests read from their own thread."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        (self.data_dir / "topics").mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._logs: dict[str, _TopicLog] = {}
        # Per topic, SENDs dropped as duplicates since this store was opened; lets tests tell
        # broker-side dedup apart from the client skipping already-acknowledged sequence ids.
        self.duplicates: dict[str, int] = {}

    def _log(self, topic: str) -> _TopicLog:
        log = self._logs.get(topic)
        if log is None:
            fname = urllib.parse.quote(topic, safe="") + ".log"
            log = _TopicLog(self.data_dir / "topics" / fname)
            self._logs[topic] = log
        return log

    def last_sequence_id(self, topic: str, producer_name: str) -> int:
        with self._lock:
            return self._log(topic).last_seq.get(producer_name, -1)

    def append(
        self,
        topic: str,
        producer_name: str,
        sequence_id: int,
        highest_sequence_id: int,
        num_messages: int,
        metadata: bytes,
        payload: bytes,
        publish_time: int,
    ) -> tuple[int, int, bool]:
        """Persist unless duplicate; returns (ledger id, entry id, was_duplicate)."""
        with self._lock:
            log = self._log(topic)
            if sequence_id <= log.last_seq.get(producer_name, -1):
                led, ent = log.seq_index.get((producer_name, sequence_id), (_LEDGER_ID, 0))
                self.duplicates[topic] = self.duplicates.get(topic, 0) + 1
                return led, ent, True
            entry = StoredEntry(
                _LEDGER_ID,
                len(log.entries),
                producer_name,
                sequence_id,
                highest_sequence_id,
                publish_time,
                num_messages,
                metadata,
                payload,
            )
            log.append(entry)
            return entry.ledger_id, entry.entry_id, False

    def entries(self, topic: str) -> list[StoredEntry]:
        with self._lock:
            return list(self._log(topic).entries)

    def entry_count(self, topic: str) -> int:
        with self._lock:
            return len(self._log(topic).entries)

    def entry(self, topic: str, entry_id: int) -> StoredEntry | None:
        with self._lock:
            entries = self._log(topic).entries
            return entries[entry_id] if 0 <= entry_id < len(entries) else None

    def topics(self) -> list[str]:
        """Every topic with a log on disk or opened since start (empty ones included)."""
        with self._lock:
            names = set(self._logs)
        for f in (self.data_dir / "topics").glob("*.log"):
            names.add(urllib.parse.unquote(f.name[: -len(".log")]))
        return sorted(names)

    def messages(self, topic: str) -> list[StoredMessage]:
        out: list[StoredMessage] = []
        for e in self.entries(topic):
            out.extend(unpack_entry(topic, e))
        return out


@dataclass
class CursorState:
    """A durable subscription's acknowledgement state.

    ``mark_delete`` is the highest entry id below which everything is acknowledged (-1 when
    nothing is); ``acked`` holds entries above it acknowledged out of order, and ``partial``
    the still-unacknowledged batch-index bitsets of partly acknowledged batch entries.
    """

    mark_delete: int = -1
    acked: set[int] = field(default_factory=set)
    partial: dict[int, list[int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "mark_delete": self.mark_delete,
            "acked": sorted(self.acked),
            "partial": {str(k): v for k, v in sorted(self.partial.items())},
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> CursorState:
        partial = d.get("partial", {})
        acked = d.get("acked", [])
        assert isinstance(partial, dict) and isinstance(acked, list)
        return cls(int(d["mark_delete"]), {int(x) for x in acked}, {int(k): list(v) for k, v in partial.items()})


class CursorStore:
    """Durable cursors, one small JSON file per topic, replaced atomically on every change.

    Rewriting on each ack is wasteful for a broker but keeps a restart exact, which is what
    the tests care about; the files stay small because acked prefixes collapse into
    ``mark_delete``.
    """

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / "cursors"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, CursorState]] = {}

    def _path(self, topic: str) -> Path:
        return self.dir / (urllib.parse.quote(topic, safe="") + ".json")

    def _load(self, topic: str) -> dict[str, CursorState]:
        subs = self._cache.get(topic)
        if subs is None:
            path = self._path(topic)
            raw = json.loads(path.read_text()) if path.exists() else {}
            subs = {name: CursorState.from_json(v) for name, v in raw.items()}
            self._cache[topic] = subs
        return subs

    def get(self, topic: str, subscription: str) -> CursorState | None:
        with self._lock:
            state = self._load(topic).get(subscription)
            if state is None:
                return None
            return CursorState(state.mark_delete, set(state.acked), {k: list(v) for k, v in state.partial.items()})

    def names(self, topic: str) -> list[str]:
        with self._lock:
            return sorted(self._load(topic))

    def save(self, topic: str, subscription: str, state: CursorState | None) -> None:
        with self._lock:
            subs = self._load(topic)
            if state is None:
                subs.pop(subscription, None)
            else:
                subs[subscription] = CursorState(
                    state.mark_delete, set(state.acked), {k: list(v) for k, v in state.partial.items()}
                )
            path = self._path(topic)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({k: v.to_json() for k, v in subs.items()}, sort_keys=True))
            os.replace(tmp, path)
