"""Schema helpers of the table store: what "same type" means, what a write may change (`evolution`), what a read
returns (`read_schema`), and the Arrow schema of a table's files. The rules they implement: sweeper.tables.base's
module doc.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from sweeper.tables.errors import TableSchemaError


def loose_type(dtype: DataType) -> DataType:
    """The type with nullability and field metadata erased: what "same type" means here."""
    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, loose_type(f.dataType), True) for f in dtype.fields])
    if isinstance(dtype, ArrayType):
        return ArrayType(loose_type(dtype.elementType), True)
    if isinstance(dtype, MapType):
        return MapType(loose_type(dtype.keyType), loose_type(dtype.valueType), True)
    return dtype


def schema_problems(actual: StructType, expected: StructType) -> list[str]:
    """Differences between `actual` (the data) and `expected` (the table), as readable lines."""
    have = {f.name: f.dataType for f in actual.fields}
    want = {f.name: f.dataType for f in expected.fields}
    problems = []
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in want]
    if missing:
        problems.append(f"missing column(s): {', '.join(missing)}")
    if extra:
        problems.append(f"unexpected column(s): {', '.join(extra)}")
    for name, dtype in want.items():
        if name in have and loose_type(have[name]) != loose_type(dtype):
            problems.append(f"column {name!r}: data has {have[name].simpleString()}, table has {dtype.simpleString()}")
    if len(have) != len(actual.fields):
        problems.append("duplicate column names in the data")
    return problems


def evolution(name: str, path: str, table: StructType, declared: StructType) -> list[StructField]:
    """The columns `declared` adds to the existing table `table`, nullable, in declared order ([] when none): the one
    change an upgrade may make to a table. Raises TableSchemaError, naming the table and the fix, for the changes
    it may not: a column of the table left out or renamed (its rows' values would be lost to readers), a column's
    type changed (older files hold the old type), a new NOT NULL column (the rows already there have no value)."""
    have = {f.name: f for f in table.fields}
    want = {f.name: f for f in declared.fields}
    problems = []
    if len(want) != len(declared.fields):
        problems.append("duplicate column names in the declared schema")
    dropped = [n for n in have if n not in want]
    if dropped:
        problems.append(f"missing column(s): {', '.join(dropped)} (in the table, not declared: a column is never "
                        "dropped or renamed; declare it again, nullable if nothing writes it any more)")
    for column, fld in want.items():
        if column in have and loose_type(have[column].dataType) != loose_type(fld.dataType):
            problems.append(f"column {column!r}: declared {fld.dataType.simpleString()}, the table has "
                            f"{have[column].dataType.simpleString()} (a column's type never changes: declare a new "
                            "column instead)")
    added = [fld for column, fld in want.items() if column not in have]
    strict = [fld.name for fld in added if not fld.nullable]
    if strict:
        problems.append(f"new column(s) {', '.join(strict)} declared NOT NULL (the rows already in the table have no "
                        "value there: declare them nullable)")
    if problems:
        raise TableSchemaError(f"table {name!r} at {path} has another schema than the one given: "
                               + "; ".join(problems) + ". An upgrade may add nullable columns to a table, nothing else")
    return [StructField(fld.name, fld.dataType, True) for fld in added]


def read_schema(table: StructType, declared: StructType | None) -> StructType:
    """The columns a read of `table` returns for a caller that declares `declared`: the declared ones, in declared
    order, when the table is one an earlier version wrote (each of its columns declared, with the same type): its
    own as it has them, the ones added since nullable (they read as nulls). Any other table reads as it is: a
    declared schema that drops or retypes a column is for the write to refuse, and a read should not hide it."""
    if declared is None or table == declared:
        return table
    want = {f.name: f for f in declared.fields}
    if len(want) != len(declared.fields):
        return table
    for fld in table.fields:
        if fld.name not in want or loose_type(want[fld.name].dataType) != loose_type(fld.dataType):
            return table
    have = {f.name: f for f in table.fields}
    return StructType([have.get(f.name) or StructField(f.name, f.dataType, True) for f in declared.fields])


def matches_nothing(where: Mapping[str, Any] | None, table: StructType, schema: StructType) -> bool:
    """Whether `where` (as in read_arrow) conditions a column `schema` reads as nulls because `table` lacks it: a
    null never matches, so no row does, and no file need be opened to say so."""
    present = set(table.fieldNames())
    return any(column not in present and column in schema.fieldNames() for column in (where or {}))


def conformed(df: DataFrame, schema: StructType) -> DataFrame:
    """`df`, a table's rows, with `schema`'s columns in its order (read_schema): the ones it lacks as typed nulls."""
    if df.columns == schema.fieldNames():
        return df
    from pyspark.sql import functions as F

    present = set(df.columns)
    return df.select(*[F.col(f.name) if f.name in present else F.lit(None).cast(f.dataType).alias(f.name)
                       for f in schema.fields])


def arrow_schema(schema: StructType) -> pa.Schema:
    """Arrow schema of the table's Parquet files, exactly as Delta maps the Spark/Delta types
    (timestamp -> timestamp[us, tz=UTC], timestamp_ntz -> timestamp[us], map entries key/value)."""
    from deltalake import Schema as DeltaSchema

    return pa.schema(DeltaSchema.from_json(schema.json()).to_arrow())
