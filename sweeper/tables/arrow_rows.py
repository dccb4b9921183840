"""Rows and columns built on the driver (runs, quarantine, a stage's few rows) as an Arrow table of a table's types,
refused (TableSchemaError) before anything is committed when they do not fit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import Row
from pyspark.sql.types import StructType

from sweeper.tables.errors import TableSchemaError
from sweeper.tables.files import check_not_null
from sweeper.tables.schema import arrow_schema

_SCALAR_TYPES = frozenset({str, int, float, bool, bytes, type(None), datetime})


def _plain(value: Any) -> Any:
    if type(value) in _SCALAR_TYPES:  # most values: nothing to unwrap
        return value
    if isinstance(value, list) and all(type(v) in _SCALAR_TYPES for v in value):
        return value
    if isinstance(value, Row) and hasattr(value, "__fields__"):
        return value.asDict(recursive=True)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) and not isinstance(value, Row):
        return [_plain(v) for v in value]
    return value


def rows_to_arrow(name: str, rows: Sequence[Mapping[str, Any] | Row | tuple], schema: StructType) -> pa.Table:
    """Driver-side rows as an Arrow table of the table's types. Naive datetimes are taken as UTC."""
    names = schema.fieldNames()
    known = set(names)
    records = []
    for i, row in enumerate(rows):
        if isinstance(row, Row) and hasattr(row, "__fields__"):
            record = row.asDict(recursive=True)
        elif isinstance(row, Mapping):
            record = {k: _plain(v) for k, v in row.items()}
        elif isinstance(row, tuple | list):
            if len(row) != len(names):
                raise TableSchemaError(f"table {name!r}: row {i} has {len(row)} values for {len(names)} columns")
            record = {k: _plain(v) for k, v in zip(names, row, strict=True)}
        else:
            raise TableSchemaError(f"table {name!r}: row {i} is a {type(row).__name__}, not a dict or Row")
        unknown = [k for k in record if k not in known]
        if unknown:
            # Silently dropping a misspelt key would store a null where the caller meant a value.
            raise TableSchemaError(f"table {name!r}: row {i} has unknown column(s) {', '.join(map(str, unknown))}")
        records.append(record)
    target = arrow_schema(schema)
    try:
        table = pa.Table.from_pylist(records, schema=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise TableSchemaError(f"table {name!r}: rows don't fit the table schema: {exc}") from exc
    for i, fld in enumerate(target):
        check_not_null(table.column(i).combine_chunks(), fld, fld.name, name)
    return table


def columns_to_arrow(name: str, columns: Mapping[str, Sequence[Any]], schema: StructType) -> pa.Table:
    """Driver-side columns (name -> values; missing columns are null) as an Arrow table of the table's types."""
    unknown = set(columns) - set(schema.fieldNames())
    if unknown:
        raise TableSchemaError(f"table {name!r}: unknown column(s) {', '.join(sorted(unknown))}")
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise TableSchemaError(f"table {name!r}: columns of different lengths {sorted(lengths)}")
    rows = lengths.pop() if lengths else 0
    target = arrow_schema(schema)
    try:
        arrays = [pa.array(columns[f.name], type=f.type) if f.name in columns else pa.nulls(rows, f.type)
                  for f in target]
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise TableSchemaError(f"table {name!r}: columns don't fit the table schema: {exc}") from exc
    table = pa.Table.from_arrays(arrays, schema=target)
    for i, fld in enumerate(target):
        check_not_null(table.column(i).combine_chunks(), fld, fld.name, name)
    return table
