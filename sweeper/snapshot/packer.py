"""The rows of many tables packed per table into Arrow IPC batches (TablePacker), as every snapshot task emits them,
and unpacked again into each table's rows."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sweeper.scan import RowChunk
from sweeper.snapshot.settings import BATCH_ROWS, FILE_WRITTEN, OFFLOAD_TARGET, PACKED_SCHEMA
from sweeper.table_schemas import SNAPSHOT_TABLES
from sweeper.tables.files import TablesWriting


def _tuples(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[str, int, bytes]]:
    for batch in batches:
        yield from zip(batch.column("record_type").to_pylist(), batch.column("rows").to_pylist(),
                       batch.column("payload").to_pylist(), strict=True)


class TablePacker:
    """Collects rows of several tables and packs them per table into Arrow IPC batches."""

    def __init__(self, run_id: str, captured_at: datetime, writing: TablesWriting | None = None,
                 batch_rows: int = BATCH_ROWS) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.run_id, self.captured_at, self.batch_rows = run_id, captured_at, batch_rows
        # With `writing`, each batch goes into its table's files here and the packed row only counts it (its
        # payload empty): the count is the packer's own, so the driver can hold it against the rows committed.
        self.writing = writing
        self.schemas = {t: to_arrow_schema(schema, timezone="UTC") for t, schema in SNAPSHOT_TABLES.items()}
        self.packed = to_arrow_schema(PACKED_SCHEMA)
        self.buffers: dict[str, list[dict[str, Any]]] = {t: [] for t in SNAPSHOT_TABLES}
        # A scanner's many rows come as tuples (sweeper.scan.RowChunk), held per table until a batch is full.
        self.chunks: dict[str, RowChunk] = {}
        # The offload targets (driver, bucket, region, endpoint: a StoreTarget's fields) the `ml_ledgers` rows name,
        # with their ledgers: flushed as OFFLOAD_TARGET rows, so the Spark driver learns which containers to list,
        # and through which store's API, from the scan's own totals.
        self.offload_targets: Counter[tuple[str, str, str, str]] = Counter()
        # run_id and captured_at are the same in every row: one scalar each, repeated per batch, rather than a
        # value per row converted one by one (a timezone-aware datetime is one of the dearest to convert).
        self._constant = {t: {name: pa.scalar(value, type=schema.field(name).type)
                              for name, value in (("run_id", run_id), ("captured_at", captured_at))
                              if name in schema.names}
                          for t, schema in self.schemas.items()}

    def add(self, row: dict[str, Any] | RowChunk) -> Iterator[pa.RecordBatch]:
        if isinstance(row, RowChunk):
            yield from self._add_chunk(row)
            return
        table = row.pop("record_type")
        if table == "ml_ledgers":
            self._count_offload_target(row.get("offload_driver"), row.get("offload_bucket"), row.get("offload_region"),
                                       row.get("offload_endpoint"))
        buffer = self.buffers[table]
        buffer.append(row)
        if len(buffer) >= self.batch_rows:
            yield self._pack(table)

    def _add_chunk(self, chunk: RowChunk) -> Iterator[pa.RecordBatch]:
        if chunk.table == "ml_ledgers":
            self._count_offload_targets(chunk)
        held = self.chunks.get(chunk.table)
        if held is not None and held.columns != chunk.columns:
            yield self._pack_chunk(self.chunks.pop(chunk.table))
            held = None
        if held is None:
            held = self.chunks[chunk.table] = RowChunk(chunk.table, chunk.columns, [])
        held.rows.extend(chunk.rows)
        if len(held.rows) >= self.batch_rows:
            yield self._pack_chunk(self.chunks.pop(chunk.table))

    def _count_offload_targets(self, chunk: RowChunk) -> None:
        driver, bucket, region, endpoint = (chunk.columns.index(c) for c in (
            "offload_driver", "offload_bucket", "offload_region", "offload_endpoint"))
        for values in chunk.rows:
            self._count_offload_target(values[driver], values[bucket], values[region], values[endpoint])

    def _count_offload_target(self, driver: str | None, bucket: str | None, region: str | None,
                              endpoint: str | None) -> None:
        if bucket is not None:
            self.offload_targets[(driver or "", bucket, region or "", endpoint or "")] += 1

    def flush(self) -> Iterator[pa.RecordBatch]:
        for table, buffer in self.buffers.items():
            if buffer:
                yield self._pack(table)
        for table in list(self.chunks):
            yield self._pack_chunk(self.chunks.pop(table))
        if self.offload_targets:
            ordered = sorted(self.offload_targets)
            yield pa.RecordBatch.from_pydict(
                {"record_type": [OFFLOAD_TARGET] * len(ordered), "rows": [self.offload_targets[t] for t in ordered],
                 "payload": [json.dumps(t).encode() for t in ordered]}, schema=self.packed)
            self.offload_targets.clear()

    def _pack(self, table: str) -> pa.RecordBatch:
        rows, self.buffers[table] = self.buffers[table], []
        # What pyarrow's from_pylist does, minus the constant columns (a row's own run_id or captured_at, if it
        # has one, is overridden, as before).
        columns = {name: [row.get(name) for row in rows] for name in self.schemas[table].names
                   if name not in self._constant[table]}
        return self._packed(table, columns, len(rows))

    def _pack_chunk(self, chunk: RowChunk) -> pa.RecordBatch:
        """A scanner's tuples, turned into columns at once (zip transposes them in C)."""
        if set(chunk.columns) | self._constant[chunk.table].keys() != set(self.schemas[chunk.table].names):
            raise ValueError(f"a chunk of {chunk.table} rows with columns {chunk.columns}, not the table's")
        rows = len(chunk.rows)
        columns = dict(zip(chunk.columns, zip(*chunk.rows, strict=True) if rows else [()] * len(chunk.columns),
                           strict=True))
        return self._packed(chunk.table, columns, rows)

    def _packed(self, table: str, columns: Mapping[str, Sequence[Any]], rows: int) -> pa.RecordBatch:
        """The table's batch from its non-constant columns' values (the constant ones filled in), written or
        serialized; the packed row counts it."""
        schema, constant = self.schemas[table], self._constant[table]
        batch = pa.RecordBatch.from_arrays(
            [pa.repeat(constant[name], rows) if name in constant
             else pa.array(columns[name], type=schema.field(name).type) for name in schema.names], schema=schema)
        if self.writing is not None:
            self.writing.write(table, batch)
            return pa.RecordBatch.from_pydict({"record_type": [table], "rows": [rows], "payload": [b""]},
                                              schema=self.packed)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return pa.RecordBatch.from_pydict(
            {"record_type": [table], "rows": [rows], "payload": [sink.getvalue().to_pybytes()]},
            schema=self.packed,
        )


    def files(self) -> Iterator[pa.RecordBatch]:
        """With `writing`: its files closed, one FILE_WRITTEN row per file, the record as JSON (nothing without)."""
        if self.writing is None:
            return
        written = self.writing.close()
        if written:
            yield pa.RecordBatch.from_pydict(
                {"record_type": [FILE_WRITTEN] * len(written), "rows": [int(r["num_records"]) for _, r in written],
                 "payload": [json.dumps({"table": table, **record}).encode() for table, record in written]},
                schema=self.packed)

    def abort(self) -> None:
        """Removes what `writing` wrote, as far as it can (never committed either way)."""
        if self.writing is not None:
            self.writing.abort()


def _unpack(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for payload in batch.column("payload").to_pylist():
            with pa.ipc.open_stream(payload) as reader:
                yield from reader


def table_frame(scan: DataFrame, table: str) -> DataFrame:
    """One table's rows out of the packed scan output."""
    return scan.where(F.col("record_type") == table).select("payload").mapInArrow(_unpack, SNAPSHOT_TABLES[table])

