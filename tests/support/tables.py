"""Rows and frames of every column type the table stores must keep exact, and an order-free form to compare them
in: the table contract (tests/test_tables_contract.py) and the cross-engine tests (tests/test_tables_engines.py, and
the writer processes those start) use the same data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA = StructType([
    StructField("run_id", StringType(), False),
    StructField("id", LongType(), False),
    StructField("captured_at", TimestampType()),
    StructField("name", StringType()),
    StructField("raw", BinaryType()),
    StructField("bookies", ArrayType(StringType())),
    StructField("meta", MapType(StringType(), StringType())),
])
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
T0 = datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC)


def sample_rows(n: int, run_id: str = "r1", start: int = 0) -> list[dict[str, Any]]:
    """Rows exercising every column type, with nulls, empties and awkward values."""
    rows = []
    for i in range(start, start + n):
        rows.append({
            "run_id": run_id,
            "id": i * 1_000_000_007 + 2**53,  # beyond double precision: must stay exact
            "captured_at": None if i % 5 == 0 else T0 + timedelta(microseconds=i * 1_001),
            "name": None if i % 7 == 0 else f"ledger-{i}-ü€",
            "raw": None if i % 3 == 0 else bytes([i % 256, 0, 255, 0x80]),  # not UTF-8
            "bookies": None if i % 4 == 0 else ([] if i % 4 == 1 else [f"bk{i}:3181", None]),
            "meta": None if i % 6 == 0 else {"application": "pulsar", "n": str(i), "empty": None},
        })
    return rows


def big_frame(spark: SparkSession, n: int, partitions: int, run_id: str) -> DataFrame:
    """n rows in exactly `partitions` Spark partitions, generated in the JVM."""
    ids = spark.range(0, n, numPartitions=partitions)
    return ids.select(
        F.lit(run_id).alias("run_id"),
        F.col("id"),
        F.timestamp_micros(F.col("id") * 1_000_003).alias("captured_at"),
        F.when(F.col("id") % 10 == 0, None).otherwise(F.concat(F.lit("n"), F.col("id").cast("string"))).alias("name"),
        F.col("id").cast("string").cast("binary").alias("raw"),
        F.array(F.col("id").cast("string")).alias("bookies"),
        F.create_map(F.lit("k"), F.col("id").cast("string")).alias("meta"),
    )


def _canon_value(value: Any) -> Any:
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        return (aware - EPOCH) // timedelta(microseconds=1)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    if isinstance(value, list) and value and isinstance(value[0], tuple):  # Arrow map entries
        return tuple(sorted(value))
    if isinstance(value, list):
        return tuple(value)
    return value


def canon(records: list[dict[str, Any]], columns: list[str] | None = None) -> list[tuple]:
    """Comparable, order-free form: timestamps as epoch micros, maps as sorted items."""
    columns = columns or SCHEMA.fieldNames()
    return sorted((tuple(_canon_value(r[c]) for c in columns) for r in records), key=repr)
