"""Contract of sweeper.tables, run against both engines, delta-rs and delta-spark.

The test session carries Delta's jars (scripts/setup.sh fetches them into jvm/target/ and
sweeper.spark.get_spark puts them on the class path), so neither engine is skipped: a missing
jar fails the delta-spark cases with the message that names it.
"""

from __future__ import annotations

import glob
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from sweeper.spark import delta_spark_available
from sweeper.tables import (
    CommitResult,
    DeltaRsTableStore,
    NotNullViolation,
    TableNotFoundError,
    TableSchemaError,
    TableStore,
    open_table_store,
)
from tests.support.tables import EPOCH, SCHEMA, T0, big_frame, canon, sample_rows

TS_COLUMNS = {"captured_at"}


@pytest.fixture(params=["delta-rs", "delta-spark"])
def store(request: pytest.FixtureRequest, spark: SparkSession, tmp_path: Path) -> TableStore:
    return open_table_store(str(tmp_path / "tables"), spark, engine=request.param)


# --------------------------------------------------------------------------- data helpers


def frame(spark: SparkSession, rows: list[dict[str, Any]], partitions: int = 3) -> DataFrame:
    return spark.createDataFrame(rows, SCHEMA).repartition(partitions)


def spark_records(df: DataFrame) -> list[dict[str, Any]]:
    # Timestamps leave Spark as epoch micros so the check doesn't depend on the machine's zone.
    cols = [F.unix_micros(c).alias(c) if c in TS_COLUMNS else F.col(c) for c in SCHEMA.fieldNames()]
    return [row.asDict(recursive=True) for row in df.select(*cols).collect()]


def parquet_files(store: TableStore, name: str) -> list[str]:
    return glob.glob(os.path.join(store.path(name), "**", "*.parquet"), recursive=True)


# --------------------------------------------------------------------------- the contract


def test_missing_table(store: TableStore) -> None:
    assert not store.exists("nope")
    assert store.version("nope") is None
    with pytest.raises(TableNotFoundError, match=str(store.path("nope"))):
        store.read("nope")
    with pytest.raises(TableNotFoundError):
        store.history("nope")


def test_first_append_creates_the_table(store: TableStore, spark: SparkSession) -> None:
    rows = sample_rows(20)
    result = store.append("bk_ledgers", frame(spark, rows), SCHEMA)
    assert isinstance(result, CommitResult)
    assert (result.table, result.rows, result.engine) == ("bk_ledgers", 20, store.engine)
    assert result.files >= 1
    assert store.exists("bk_ledgers")
    assert store.version("bk_ledgers") == result.version
    if store.engine == "delta-rs":
        assert result.version == 0  # created and filled in one commit
    read = store.read("bk_ledgers")
    assert read.columns == SCHEMA.fieldNames()
    assert canon(spark_records(read)) == canon(rows)


def test_many_partitions_append_is_one_commit(store: TableStore, spark: SparkSession) -> None:
    first = store.append("t", big_frame(spark, 100, 2, "r0"), SCHEMA)
    history_before = len(store.history("t"))
    df = big_frame(spark, 10_000, 10, "r1")
    assert df.rdd.getNumPartitions() == 10
    result = store.append("t", df, SCHEMA)
    assert result.version == first.version + 1 == store.version("t")
    assert len(store.history("t")) == history_before + 1
    assert result.rows == 10_000
    if store.engine == "delta-rs":
        assert result.files == 10  # one file per task
    counts = {r["run_id"]: r["count"] for r in store.read("t").groupBy("run_id").count().collect()}
    assert counts == {"r0": 100, "r1": 10_000}


def test_read_back_equals_written_for_every_type(store: TableStore, spark: SparkSession) -> None:
    rows = sample_rows(60)
    store.append("types", frame(spark, rows, partitions=4), SCHEMA)
    assert canon(spark_records(store.read("types"))) == canon(rows)
    schema = store.read("types").schema
    assert [(f.name, f.dataType) for f in schema.fields] == [(f.name, f.dataType) for f in SCHEMA.fields]


def test_table_is_readable_by_an_independent_delta_reader(store: TableStore, spark: SparkSession) -> None:
    rows = sample_rows(30)
    result = store.append("plain", frame(spark, rows), SCHEMA)
    table = DeltaTable(store.path("plain"))
    assert table.version() == result.version
    assert canon(table.to_pyarrow_table().to_pylist()) == canon(rows)
    assert [f.name for f in table.schema().fields] == SCHEMA.fieldNames()


def test_time_travel(store: TableStore, spark: SparkSession) -> None:
    versions = []
    for i in range(3):
        versions.append(store.append("tt", frame(spark, sample_rows(5, f"r{i}", start=10 * i)), SCHEMA).version)
    assert versions == sorted(versions) and len(set(versions)) == 3
    for i, version in enumerate(versions):
        run_ids = {r["run_id"] for r in store.read("tt", version=version).select("run_id").distinct().collect()}
        assert run_ids == {f"r{j}" for j in range(i + 1)}
    assert store.read("tt").count() == 15
    with pytest.raises(TableNotFoundError, match="no version"):
        store.read("tt", version=versions[-1] + 1)


def test_schema_mismatch_raises_and_commits_nothing(store: TableStore, spark: SparkSession) -> None:
    store.append("s", frame(spark, sample_rows(5)), SCHEMA)
    version, files = store.version("s"), parquet_files(store, "s")
    good = frame(spark, sample_rows(5))
    wrong_type = good.withColumn("id", F.col("id").cast("string"))
    missing = good.drop("name")
    extra = good.withColumn("surprise", F.lit(1))
    for bad, what in ((wrong_type, "'id'"), (missing, "missing column"), (extra, "unexpected column")):
        with pytest.raises(TableSchemaError, match=what):
            store.append("s", bad)
    other = StructType([*SCHEMA.fields[:-1], StructField("meta", MapType(StringType(), LongType()))])
    with pytest.raises(TableSchemaError, match="another schema"):
        store.append("s", good, other)
    with pytest.raises(TableSchemaError, match="partitioned by"):
        store.append("s", good, SCHEMA, partition_by=["run_id"])
    assert store.version("s") == version
    assert parquet_files(store, "s") == files


def test_columns_are_matched_by_name(store: TableStore, spark: SparkSession) -> None:
    rows = sample_rows(8)
    reordered = frame(spark, rows).select(*reversed(SCHEMA.fieldNames()))
    store.append("by_name", reordered, SCHEMA)
    assert store.read("by_name").columns == SCHEMA.fieldNames()
    assert canon(spark_records(store.read("by_name"))) == canon(rows)


def test_not_null_violation_fails_and_commits_nothing(store: TableStore, spark: SparkSession) -> None:
    store.append("nn", frame(spark, sample_rows(3)), SCHEMA)
    version = store.version("nn")
    with_null = frame(spark, sample_rows(3)).withColumn(
        "run_id", F.when(F.col("id") > 2**53, None).otherwise(F.col("run_id")))
    with pytest.raises(Exception, match=r"(?i)not null"):
        store.append("nn", with_null)
    with pytest.raises(NotNullViolation):
        store.append_rows("nn", [{"run_id": None, "id": 1}], SCHEMA)
    assert store.version("nn") == version


def test_zero_row_append(store: TableStore, spark: SparkSession) -> None:
    empty = spark.createDataFrame([], SCHEMA).repartition(3)
    created = store.append("z", empty, SCHEMA)
    assert store.exists("z")
    assert (created.rows, created.files, created.version) == (0, 0, store.version("z"))
    read = store.read("z")
    assert read.count() == 0 and read.columns == SCHEMA.fieldNames()

    store.append("z", frame(spark, sample_rows(4)), SCHEMA)
    version, history = store.version("z"), len(store.history("z"))
    again = store.append("z", empty)
    assert (again.rows, again.files, again.version) == (0, 0, version)
    assert store.version("z") == version and len(store.history("z")) == history


def test_append_rows(store: TableStore) -> None:
    naive = datetime(2024, 5, 1, 12, 0, 0, 250)
    rows: list[Any] = [
        {"run_id": "r1", "id": 1, "captured_at": naive, "meta": {"a": "b"}},  # missing keys are null
        Row(run_id="r1", id=2, captured_at=T0, name="x", raw=b"\x00\xff", bookies=["b1"], meta=None),
    ]
    result = store.append_rows("runs", rows, SCHEMA, commit_metadata={"stage": "test"})
    assert result.rows == 2 and result.version == store.version("runs")
    got = {r["id"]: r for r in spark_records(store.read("runs"))}
    assert got[1]["captured_at"] == (naive.replace(tzinfo=UTC) - EPOCH) // timedelta(microseconds=1)  # naive = UTC
    assert got[1]["name"] is None and got[1]["meta"] == {"a": "b"}
    assert bytes(got[2]["raw"]) == b"\x00\xff" and got[2]["bookies"] == ["b1"]
    with pytest.raises(TableSchemaError, match="unknown column"):
        store.append_rows("runs", [{"run_id": "r", "id": 3, "nmae": "typo"}], SCHEMA)
    with pytest.raises(TableSchemaError):
        store.append_rows("runs", [{"run_id": "r", "id": "three"}], SCHEMA)
    assert store.version("runs") == result.version


def test_append_columns(store: TableStore) -> None:
    result = store.append_columns("cols", {"run_id": ["r", "r"], "id": [1, 2], "captured_at": [T0, None],
                                           "bookies": [["b1"], None]}, SCHEMA)
    assert result.rows == 2
    got = {r["id"]: r for r in spark_records(store.read("cols"))}
    assert got[1]["captured_at"] == (T0 - EPOCH) // timedelta(microseconds=1) and got[1]["bookies"] == ["b1"]
    assert got[2]["name"] is None and got[2]["captured_at"] is None  # missing columns are null
    with pytest.raises(TableSchemaError, match="unknown column"):
        store.append_columns("cols", {"run_id": ["r"], "id": [3], "nmae": ["typo"]}, SCHEMA)
    with pytest.raises(TableSchemaError, match="different lengths"):
        store.append_columns("cols", {"run_id": ["r", "r"], "id": [3]}, SCHEMA)
    with pytest.raises(NotNullViolation):
        store.append_columns("cols", {"run_id": [None], "id": [3]}, SCHEMA)
    assert store.version("cols") == result.version


def test_history_lists_commit_metadata(store: TableStore, spark: SparkSession) -> None:
    store.append("h", frame(spark, sample_rows(3)), SCHEMA, commit_metadata={"run_id": "run-1", "stage": "snapshot"})
    second = store.append("h", frame(spark, sample_rows(3)), commit_metadata={"run_id": "run-2", "stage": "reconcile"})
    history = store.history("h")
    assert [h["version"] for h in history] == sorted((h["version"] for h in history), reverse=True)
    latest = history[0]
    assert latest["version"] == second.version
    assert latest["metadata"]["run_id"] == "run-2" and latest["metadata"]["stage"] == "reconcile"
    assert latest["metadata"]["sweeper.table"] == "h" and latest["metadata"]["sweeper.engine"] == store.engine
    assert isinstance(latest["timestamp"], int) and latest["timestamp"] > 0
    assert isinstance(latest["operation"], str)
    assert latest["rows"] == 3
    stages = [h["metadata"].get("stage") for h in history]
    assert "snapshot" in stages


def test_failed_task_leaves_no_partial_commit(store: TableStore, spark: SparkSession) -> None:
    def fail_in_partition_2(batches):
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 2:
            raise RuntimeError("boom in partition 2")
        yield from batches

    def failing(n: int) -> DataFrame:
        return big_frame(spark, n, 4, "bad").mapInArrow(fail_in_partition_2, SCHEMA)

    with pytest.raises(Exception, match="boom in partition 2"):
        store.append("f", failing(400), SCHEMA)
    if store.engine == "delta-rs":
        assert not store.exists("f")  # not even created
    else:
        # delta-spark creates the table (exact schema, NOT NULL kept) in a commit of its own first.
        assert [h["operation"] for h in store.history("f")] == ["CREATE TABLE"]
        assert store.read("f").count() == 0

    store.append("f", big_frame(spark, 40, 2, "good"), SCHEMA)
    version = store.version("f")
    with pytest.raises(Exception, match="boom in partition 2"):
        store.append("f", failing(4000))
    assert store.version("f") == version
    assert {r["run_id"] for r in store.read("f").select("run_id").distinct().collect()} == {"good"}
    assert store.read("f").count() == 40


def test_partitioned_table(store: TableStore, spark: SparkSession) -> None:
    rows = sample_rows(24)
    for i, row in enumerate(rows):
        row["run_id"] = ["a b", "x/y:z=1", "ü%", "plain"][i % 4]
    schema = StructType([StructField("shard", IntegerType()), *SCHEMA.fields])
    for i, row in enumerate(rows):
        row["shard"] = None if i % 5 == 0 else i % 2
    df = spark.createDataFrame(rows, schema).repartition(3)
    result = store.append("parts", df, schema, partition_by=["run_id", "shard"])
    assert result.rows == 24
    read = store.read("parts")
    assert read.columns == schema.fieldNames()
    got = [r.asDict(recursive=True) for r in read.select(
        "shard", *[F.unix_micros(c).alias(c) if c in TS_COLUMNS else F.col(c) for c in SCHEMA.fieldNames()]
    ).collect()]
    columns = schema.fieldNames()
    assert canon(got, columns) == canon(rows, columns)
    assert read.where(F.col("run_id") == "x/y:z=1").count() == 6
    independent = DeltaTable(store.path("parts")).to_pyarrow_table().to_pylist()
    assert canon(independent, columns) == canon(rows, columns)
    # Later appends keep the table's partitioning; another one is refused.
    store.append("parts", df)
    assert store.read("parts").count() == 48
    with pytest.raises(TableSchemaError, match="partitioned by"):
        store.append("parts", df, partition_by=["shard"])


def test_append_arrow_frames_routes_rows_to_their_tables(store: TableStore, spark: SparkSession) -> None:
    import pyarrow as pa

    narrow = StructType([StructField("run_id", StringType(), False), StructField("id", LongType(), False)])
    source = spark.createDataFrame([("a" if i % 3 else "b", "r1", i) for i in range(60)],
                                   "table string, run_id string, id long").repartition(4)

    def to_batches(batches: Any) -> Any:  # the target's rows from the source's (here: drop the route)
        for batch in batches:
            yield pa.RecordBatch.from_arrays([batch.column("run_id"), batch.column("id")], names=["run_id", "id"])

    schemas = {"a": narrow, "b": narrow, "empty": narrow}
    first = store.append_arrow_frames(source, "table", to_batches, schemas, commit_metadata={"run_id": "r1"})
    assert {name: r.rows for name, r in first.items()} == {"a": 40, "b": 20, "empty": 0}
    assert store.exists("empty") and store.read("empty").count() == 0  # created, though it got no row
    assert sorted(r["id"] for r in store.read("b").collect()) == [i for i in range(60) if i % 3 == 0]
    assert store.history("a")[0]["metadata"]["run_id"] == "r1"
    again = store.append_arrow_frames(source, "table", to_batches, schemas)
    assert again["a"].version == first["a"].version + 1 and store.read("a").count() == 80
    assert again["empty"].version == first["empty"].version  # nothing to commit


def test_task_writer_files_are_committed_per_table(store: TableStore, spark: SparkSession) -> None:
    """An engine that writes from the tasks: their files, and the driver's, become one commit per table; files
    whose records are not handed to the commit (a failed attempt's) are in no table. An engine without it
    says so with None (delta-spark: producers then append through Spark)."""
    import pyarrow as pa

    narrow = StructType([StructField("run_id", StringType(), False), StructField("id", LongType(), False)])
    schemas = {"a": narrow, "b": narrow, "empty": narrow}
    writer = store.task_writer(schemas)
    if writer is None:
        assert store.engine == "delta-spark"
        with pytest.raises(NotImplementedError):
            store.commit_written(None, {})  # type: ignore[arg-type]
        return
    arrow = pa.schema([pa.field("run_id", pa.string(), False), pa.field("id", pa.int64(), False)])

    def task(ids: Any) -> Any:  # a Spark task: writes its rows, returns (table, record) of each file
        writing = writer.open()
        for i in ids:
            writing.write("a" if i % 3 else "b", pa.record_batch([["r1"], [i]], schema=arrow))
        return iter(writing.close())

    written = spark.sparkContext.parallelize(range(60), 4).mapPartitions(task).collect()
    records: dict[str, list[dict[str, Any]]] = {}
    for table, record in written:
        records.setdefault(table, []).append(record)
    driver = writer.open(task=0)
    driver.write("b", pa.record_batch([["r1"], [1000]], schema=arrow))
    for table, record in driver.close():
        records.setdefault(table, []).append(record)
    # A file written and never handed to the commit: never part of the table.
    stray = writer.open(task=9)
    stray.write("a", pa.record_batch([["r1"], [-1]], schema=arrow))
    stray.close()
    with pytest.raises(ValueError, match="not one of the tables"):
        writer.open().write("other", pa.record_batch([["r1"], [0]], schema=arrow))

    first = store.commit_written(writer, records, commit_metadata={"run_id": "r1"})
    assert {name: r.rows for name, r in first.items()} == {"a": 40, "b": 21, "empty": 0}
    assert store.exists("empty") and store.read("empty").count() == 0  # created, though it got no file
    assert sorted(r["id"] for r in store.read("b").collect()) == [i for i in range(60) if i % 3 == 0] + [1000]
    assert sorted(r["id"] for r in store.read("a").collect()) == [i for i in range(60) if i % 3]
    assert store.history("a")[0]["metadata"]["run_id"] == "r1"
    later = store.task_writer(schemas)  # the tables exist now: appended to, not created
    more = later.open(task=0)
    more.write("a", pa.record_batch([["r2"], [2000]], schema=arrow))
    again = store.commit_written(later, {table: [r] for table, r in more.close()})
    assert again["a"].version == first["a"].version + 1 and again["b"].version == first["b"].version
    assert again["a"].rows == 1 and store.read("a").count() == 41
    with pytest.raises(TableSchemaError):
        store.task_writer({"a": StructType([StructField("other", StringType())])})


def test_read_arrow_filters_on_the_driver(store: TableStore, spark: SparkSession) -> None:
    rows = sample_rows(40) + sample_rows(10, run_id="r2", start=100)
    store.append("small", frame(spark, rows), SCHEMA)
    store.append("small", frame(spark, sample_rows(5, run_id="r3", start=200)), SCHEMA)  # the latest version
    columns = ["run_id", "id", "name", "captured_at"]
    assert canon(store.read_arrow("small").to_pylist()) == canon(rows + sample_rows(5, run_id="r3", start=200))
    got = store.read_arrow("small", {"run_id": "r1"}, columns)
    assert got.column_names == columns
    assert canon(got.to_pylist(), columns) == canon([r for r in rows if r["run_id"] == "r1"], columns)
    names = {"ledger-3-ü€", "ledger-5-ü€", "ledger-101-ü€", "missing"}
    wanted = [r for r in rows if r["name"] in names and r["run_id"] in ("r1", "r2")]
    for choice in (sorted(names), tuple(names), set(names), frozenset(names)):
        got = store.read_arrow("small", {"run_id": ["r1", "r2"], "name": choice}, columns)
        assert canon(got.to_pylist(), columns) == canon(wanted, columns)
    assert store.read_arrow("small", {"name": []}, ["id"]).num_rows == 0
    # A string column whose files carry no min/max statistics (too long for them) filters like any other.
    long_names = [{**r, "run_id": "long", "name": f"persistent://tenant/namespace/{'x' * 40}-{r['id']}"}
                  for r in sample_rows(6, start=300)]
    store.append("small", frame(spark, long_names, partitions=2), SCHEMA)
    wanted = [long_names[1]["name"], long_names[4]["name"]]
    got = store.read_arrow("small", {"name": wanted, "run_id": "long"}, ["name"])
    assert sorted(got.column("name").to_pylist()) == sorted(wanted)
    assert store.read_arrow("small", {"name": wanted[0]}, ["name"]).num_rows == 1
    assert store.read_arrow("small", {"name": None}, ["id"]).num_rows == 0  # a null never matches
    with pytest.raises(TableNotFoundError):
        store.read_arrow("nope")


def test_read_with_a_condition_returns_the_matching_rows(store: TableStore, spark: SparkSession) -> None:
    runs = {run: sample_rows(8, run_id=run, start=100 * i) for i, run in enumerate(["r1", "r2", "r3"])}
    for rows in runs.values():
        store.append("runs", frame(spark, rows, partitions=2), SCHEMA)
    assert canon(spark_records(store.read("runs", where={"run_id": "r2"}))) == canon(runs["r2"])
    ids = [runs["r1"][0]["id"], runs["r2"][1]["id"], runs["r3"][2]["id"], 5]
    both = store.read("runs", where={"run_id": ["r1", "r3"], "id": ids})
    assert canon(spark_records(both)) == canon([runs["r1"][0], runs["r3"][2]])
    assert store.read("runs", where={"run_id": "missing"}).count() == 0
    assert store.read("runs", where={"run_id": []}).count() == 0
    assert store.read("runs", version=0, where={"run_id": "r2"}).count() == 0  # r2 came with version 1
    # A long string column carries no usable statistics: its files are read and filtered, never skipped.
    long_id = f"run-{'x' * 40}"
    store.append("runs", frame(spark, sample_rows(3, run_id=long_id, start=900), partitions=1), SCHEMA)
    assert store.read("runs", where={"run_id": long_id}).count() == 3
    assert sorted(store.run_frames({"runs": SCHEMA, "absent": SCHEMA}, "r3")["runs"]
                  .select("id").toPandas()["id"]) == [r["id"] for r in runs["r3"]]


def test_aggregate_arrow_groups_on_the_engine(store: TableStore, spark: SparkSession) -> None:
    rows = sample_rows(40) + sample_rows(10, run_id="r2", start=100)
    for i, row in enumerate(rows):
        row["name"] = None if i % 9 == 0 else f"group-{i % 4}-ü€"  # a null key is a group of its own
    store.append("small", frame(spark, rows), SCHEMA)
    aggregates = [("id", "min"), ("id", "max"), ("id", "sum"), ("captured_at", "count"), ("captured_at", "max")]
    got = store.aggregate_arrow("small", ["name"], aggregates, {"run_id": "r1"})
    assert got.column_names == ["name", "id_min", "id_max", "id_sum", "captured_at_count", "captured_at_max"]
    expected = {}
    for row in rows[:40]:
        group = expected.setdefault(row["name"], [])
        group.append(row)
    assert got.num_rows == len(expected)
    for r in got.to_pylist():
        group = expected[r["name"]]
        ids = [x["id"] for x in group]
        times = [x["captured_at"] for x in group if x["captured_at"] is not None]
        assert (r["id_min"], r["id_max"], r["id_sum"]) == (min(ids), max(ids), sum(ids))  # exact beyond 2**53
        assert r["captured_at_count"] == len(times)
        assert r["captured_at_max"] == (max(times) if times else None)
    nothing = store.aggregate_arrow("small", ["name"], [("id", "count")], {"run_id": "missing"})
    assert nothing.num_rows == 0
    with pytest.raises(ValueError, match="unknown functions"):
        store.aggregate_arrow("small", ["name"], [("id", "median")])
    with pytest.raises(TableNotFoundError):
        store.aggregate_arrow("nope", ["name"], [("id", "count")])


def test_read_arrow_of_a_partitioned_table(store: TableStore, spark: SparkSession) -> None:
    rows = sample_rows(12)
    for i, row in enumerate(rows):
        row["run_id"] = ["x/y:z=1", "plain"][i % 2]
    store.append("parts", frame(spark, rows), SCHEMA, partition_by=["run_id"])
    got = store.read_arrow("parts", {"run_id": "x/y:z=1"}, ["run_id", "id"])
    assert canon(got.to_pylist(), ["run_id", "id"]) == canon([r for r in rows if r["run_id"] == "x/y:z=1"],
                                                             ["run_id", "id"])


# --------------------------------------------------------------------------- delta-rs specifics


def test_delta_rs_rolls_files_but_commits_once(spark: SparkSession, tmp_path: Path) -> None:
    store = DeltaRsTableStore(str(tmp_path / "tables"), spark, target_file_bytes=1)
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    previous = spark.conf.get(key)
    spark.conf.set(key, "100")
    try:
        result = store.append("roll", big_frame(spark, 1_000, 2, "r"), SCHEMA)
    finally:
        spark.conf.set(key, previous)
    assert result.version == 0 and result.rows == 1_000
    assert result.files >= 10  # every 100-row batch rolled to a new file
    assert len(DeltaTable(store.path("roll")).file_uris()) == result.files
    assert store.read("roll").count() == 1_000


def test_delta_rs_file_statistics_allow_pruning(spark: SparkSession, tmp_path: Path) -> None:
    store = DeltaRsTableStore(str(tmp_path / "tables"), spark)
    store.append("stats", big_frame(spark, 1_000, 4, "r"), SCHEMA)  # range partitions: contiguous ids
    table = DeltaTable(store.path("stats"))
    assert len(table.file_uris()) == 4
    assert len(table.file_uris(file_pruning_predicate="id >= 900")) == 1
    assert table.count() == 1_000
    # captured_at grows with id (about 1 s per id): only the last file can hold > 900 s.
    assert len(table.file_uris(file_pruning_predicate=[("captured_at", ">", EPOCH + timedelta(seconds=900))])) == 1


def test_delta_rs_reads_only_the_files_that_may_hold_the_condition(spark: SparkSession, tmp_path: Path) -> None:
    store = DeltaRsTableStore(str(tmp_path / "tables"), spark)
    for run in ("r1", "r2", "r3", "r4"):
        store.append("runs", frame(spark, sample_rows(6, run_id=run), partitions=2), SCHEMA)
    everything = store.read("runs").inputFiles()
    assert len(everything) == 8
    one_run = store.read("runs", where={"run_id": "r3"}).inputFiles()
    assert len(one_run) == 2 and set(one_run) < set(everything)
    assert len(store.read("runs", where={"run_id": ["r1", "r2"]}).inputFiles()) == 4  # r1..r2: one range
    assert store.read("runs", where={"run_id": "r9"}).inputFiles() == []
    # The driver reader skips the same files: a run's rows are read, the other runs' files are not opened.
    for path in set(everything) - set(one_run):
        os.remove(path.removeprefix("file:"))
    assert store.read_arrow("runs", {"run_id": "r3"}).num_rows == 6
    assert store.read("runs", where={"run_id": "r3"}).count() == 6


def test_file_statistics_leave_a_file_out_only_when_they_prove_it_holds_no_match() -> None:
    import pyarrow as pa

    from sweeper.tables.delta_rs import _files_that_may_match

    # d's max sorts below "r0", but it is as long as a truncated bound: only the length rule keeps d below.
    long = "q" * 40
    actions = pa.table({
        "path": ["a", "b", "c", "d", "e"],
        "min.run": ["r1", "r3", None, "a", "r0"], "max.run": ["r2", "r4", None, long, "r0"],
        "min.id": pa.array([0, 10, 20, None, 5], pa.int64()), "max.id": pa.array([9, 19, 29, None, 5], pa.int64()),
        "min.at": pa.array([0, 0, 0, 0, 0], pa.timestamp("us", tz="UTC")),
        "max.at": pa.array([0, 0, 0, 0, 0], pa.timestamp("us", tz="UTC")),
    })

    def kept(where: dict[str, Any]) -> list[str]:
        return actions.filter(_files_that_may_match(actions, where)).column("path").to_pylist()

    assert kept({}) == ["a", "b", "c", "d", "e"]
    assert kept({"run": "r3"}) == ["b", "c", "d"]  # c: no statistics; d: a max too long to trust
    assert kept({"run": ["r0", "r2"]}) == ["a", "c", "d", "e"]
    assert kept({"run": "r3", "id": 15}) == ["b", "d"]  # c: its ids rule it out
    assert kept({"id": 25}) == ["c", "d"]
    assert kept({"id": 2**70}) == ["a", "b", "c", "d", "e"]  # a value the column cannot hold: not decided here
    assert kept({"id": True}) == ["a", "b", "c", "d", "e"]  # not an integer condition
    assert kept({"at": datetime(2020, 1, 1, tzinfo=UTC)}) == ["a", "b", "c", "d", "e"]  # only strings, integers
    assert kept({"missing": "x"}) == ["a", "b", "c", "d", "e"]
    assert kept({"run": None}) == ["a", "b", "c", "d", "e"]


def test_delta_rs_checkpoints_every_ten_commits(spark: SparkSession, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store = DeltaRsTableStore(str(tmp_path / "tables"), spark)
    log_dir = Path(store.path("runs")) / "_delta_log"
    for i in range(10):
        store.append_rows("runs", sample_rows(1, run_id=f"r{i}", start=i), SCHEMA)
    assert not (log_dir / "_last_checkpoint").exists()  # versions 0-9: nothing due yet
    store.append_rows("runs", sample_rows(1, run_id="r10", start=10), SCHEMA)
    assert json.loads((log_dir / "_last_checkpoint").read_text())["version"] == 10
    assert DeltaTable(store.path("runs")).version() == 10 and store.read("runs").count() == 11
    assert len(store.history("runs")) == 11  # the commits stay: they are the table's audit trail

    def broken(self: DeltaTable) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(DeltaTable, "create_checkpoint", broken)
    for i in range(11, 21):
        store.append_rows("runs", sample_rows(1, run_id=f"r{i}", start=i), SCHEMA)  # a missed checkpoint is no error
    assert store.read("runs", where={"run_id": "r20"}).count() == 1


def test_engine_selection(spark: SparkSession, tmp_path: Path) -> None:
    # The test session is embedded (sweeper.spark.get_spark) and carries Delta's jars: auto keeps
    # the embedded engine, and delta-spark is there when asked for. Without the jars the request is
    # refused naming them (tests/test_tables_engines.py, in a session without them).
    assert delta_spark_available(spark)
    assert open_table_store(str(tmp_path), spark).engine == "delta-rs"
    assert open_table_store(str(tmp_path), spark, engine="delta-spark").engine == "delta-spark"
    with pytest.raises(ValueError, match="unknown table engine"):
        open_table_store(str(tmp_path), spark, engine="parquet")
    store = open_table_store(str(tmp_path / "rel" / ".." / "tables"), spark, engine="delta-rs")
    assert store.root == str(tmp_path / "tables")
    assert store.path("runs") == f"{tmp_path}/tables/runs"
    with pytest.raises(ValueError, match="bad table name"):
        store.path("../escape")


def test_delta_rs_refuses_tables_with_features_it_would_bypass(spark: SparkSession, tmp_path: Path) -> None:
    store = DeltaRsTableStore(str(tmp_path / "tables"), spark)
    store.append("checked", frame(spark, sample_rows(3)), SCHEMA)
    DeltaTable(store.path("checked")).alter.add_constraint({"positive_id": "id > 0"})
    version = store.version("checked")
    with pytest.raises(NotImplementedError, match="CHECK constraints"):
        store.append("checked", frame(spark, sample_rows(3)))
    assert store.version("checked") == version
    assert store.read("checked").count() == 3  # reading is unaffected


def test_delta_rs_writes_to_s3(spark: SparkSession, tmp_path: Path) -> None:
    s3server = pytest.importorskip("harness.s3server")
    boto3 = pytest.importorskip("boto3")
    info = s3server.start_s3(tmp_path / "moto")
    try:
        options = {"AWS_ENDPOINT_URL": info.endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                   "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
        boto3.client("s3", endpoint_url=info.endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                     region_name="us-east-1").create_bucket(Bucket="lake")
        store = open_table_store("s3://lake/tables/", spark, engine="delta-rs", storage_options=options)
        assert "test" not in repr(store)  # credentials stay out of logs
        assert store.append_rows("runs", sample_rows(2), SCHEMA).version == 0  # driver-side write
        result = store.append("runs", big_frame(spark, 300, 3, "r"), SCHEMA)  # task-side writes
        assert (result.version, result.rows, result.files) == (1, 300, 3)
        table = DeltaTable("s3://lake/tables/runs", storage_options=options)
        assert table.version() == 1 and table.to_pyarrow_table().num_rows == 302
        assert store.history("runs")[0]["metadata"]["sweeper.table"] == "runs"
        assert store.read_arrow("runs", {"run_id": "r"}, ["id"]).num_rows == 300  # the driver reads S3 too
    finally:
        s3server.stop_s3(info)
