"""Reads of a 1M-row table through the table store, as written and as an older table an upgrade reads.

    .venv/bin/python bench/bench_table_read.py --root /tmp/bench-tables [--rows 1000000] [--rounds 7]

The first run writes the table (delta-rs, four runs of a quarter of the rows each, Spark tasks' files) under
--root; later runs read the one there, so the same table can be read by another tree's code for a before/after
comparison (PYTHONPATH=<other checkout> .venv/bin/python bench/bench_table_read.py --root <same>). Each round times,
on the delta-rs engine: read_arrow of the whole table, read_arrow of one run's rows and three columns,
aggregate_arrow of the runs' counts (the driver-side paths), and Spark's count of one run's rows and of the whole
table through read() (the Spark path). "as written" declares the table's own schema; "older table" declares three
more nullable columns (what reads of a table an earlier version wrote do: nulls there), when the tree's store
takes a declaration. Reported: each read's median and best wall time over the rounds.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sweeper.spark import get_spark
from sweeper.tables.delta_rs import DeltaRsTableStore

TABLE = "ledgers"
WRITTEN = StructType([
    StructField("run_id", StringType(), False),
    StructField("captured_at", TimestampType(), False),
    StructField("ledger_id", LongType(), False),
    StructField("path", StringType(), False),
    StructField("state", StringType()),
    StructField("length", LongType()),
    StructField("ensemble_size", IntegerType()),
    StructField("bookies", ArrayType(StringType())),
    StructField("custom_metadata", MapType(StringType(), StringType())),
    StructField("managed_ledger", StringType()),
])
UPGRADED = StructType([*WRITTEN.fields[:5], StructField("segments", IntegerType()), *WRITTEN.fields[5:],
                       StructField("segment_bookies", ArrayType(StringType())),
                       StructField("last_segment_length", LongType())])
RUNS = ["run-0", "run-1", "run-2", "run-3"]


def write(store: DeltaRsTableStore, rows: int) -> None:
    spark = store.spark
    per_run = rows // len(RUNS)
    for run in RUNS:
        ids = spark.range(0, per_run, numPartitions=4)
        df = ids.select(
            F.lit(run).alias("run_id"),
            F.current_timestamp().alias("captured_at"),
            F.col("id").alias("ledger_id"),
            F.format_string("/ledgers/00/%04d/L%04d", F.floor(F.col("id") / 10000), F.col("id") % 10000).alias("path"),
            F.when(F.col("id") % 7 == 0, "OPEN").otherwise("CLOSED").alias("state"),
            (F.col("id") * 1031 % 100_000_000).alias("length"),
            F.lit(3).cast("int").alias("ensemble_size"),
            F.array(F.lit("bk-0:3181"), F.lit("bk-1:3181"), F.lit("bk-2:3181")).alias("bookies"),
            F.create_map(F.lit("application"), F.lit("pulsar"), F.lit("component"), F.lit("managed-ledger"))
            .alias("custom_metadata"),
            F.format_string("tenant/ns/persistent/topic-%d", F.col("id") % 5000).alias("managed_ledger"),
        )
        store.append(TABLE, df, WRITTEN, commit_metadata={"run_id": run})


def timed(fn: Callable[[], Any], rounds: int) -> tuple[float, float, Any]:
    fn()  # warm-up: the first read pays imports and Spark's first job
    times = []
    result = None
    for _ in range(rounds):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    spark = get_spark("bench-table-read", master="local[2]",
                      conf={"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"})
    takes_declared = "declared" in inspect.signature(DeltaRsTableStore.__init__).parameters
    declarations = {"as written": WRITTEN, "older table": UPGRADED} if takes_declared else {"as written": None}
    first = DeltaRsTableStore(args.root, spark)
    if not first.exists(TABLE):
        start = time.perf_counter()
        write(first, args.rows)
        print(f"wrote {args.rows} rows in {time.perf_counter() - start:.1f} s")
    print(f"code: {sys.modules['sweeper'].__file__}")
    for label, declared in declarations.items():
        store = (DeltaRsTableStore(args.root, spark, declared={TABLE: declared}) if declared is not None
                 else DeltaRsTableStore(args.root, spark))
        reads: dict[str, Callable[[], Any]] = {
            "read_arrow, whole table": lambda s=store: s.read_arrow(TABLE).num_rows,
            "read_arrow, one run, 3 columns": lambda s=store: s.read_arrow(
                TABLE, {"run_id": "run-2"}, ["ledger_id", "state", "length"]).num_rows,
            "aggregate_arrow, count by run": lambda s=store: s.aggregate_arrow(
                TABLE, ["run_id"], [("ledger_id", "count")]).num_rows,
            "read (Spark), one run, count": lambda s=store: s.read(TABLE, where={"run_id": "run-2"}).count(),
            "read (Spark), whole table, count": lambda s=store: s.read(TABLE).count(),
        }
        columns = store.read_arrow(TABLE, {"run_id": "run-0"}).column_names
        print(f"\n{label}: {len(columns)} columns read")
        for what, fn in reads.items():
            median, best, result = timed(fn, args.rounds)
            print(f"  {what:34s} median {median * 1000:8.1f} ms   best {best * 1000:8.1f} ms   ({result} rows)")
    spark.stop()


if __name__ == "__main__":
    main()
