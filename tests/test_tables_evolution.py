"""Upgrades of a table's schema, against both engines (the contract of tests/test_tables_contract.py, for tables an
earlier version wrote): such a table reads in the schema this version declares, with nulls in the columns added
since; every append path first adds the declared nullable columns it lacks (one commit), and the other engine and
an independent Delta reader read the result alike; what an upgrade may not change is refused, naming the fix; and
writers adding the same columns at once, or appending while another adds them, all land.

The schemas are the tests' own (an "old" one and a "new" one that adds nullable columns in its middle and at its
end), not the product's: the store is told which schema it declares for the table, as each version's store is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

from sweeper.tables import TableSchemaError, TableStore, open_table_store
from sweeper.tables.commits import ADDED_KEY
from sweeper.tables.schema import arrow_schema

TABLE = "ledgers"
OLD = StructType([
    StructField("run_id", StringType(), False),
    StructField("ledger_id", LongType(), False),
    StructField("state", StringType()),
])
BOUND = StructType([StructField("low", LongType()), StructField("high", LongType())])
NEW = StructType([
    StructField("run_id", StringType(), False),
    StructField("ledger_id", LongType(), False),
    StructField("segments", IntegerType()),  # declared in the middle: the table gains it at its end
    StructField("state", StringType()),
    StructField("segment_bookies", ArrayType(StringType())),
    StructField("bound", BOUND),
])
ADDED = ["segments", "segment_bookies", "bound"]  # in the order the table gains them
OTHER = {"delta-rs": "delta-spark", "delta-spark": "delta-rs"}
META = {"run_id": "r1", "stage": "upgrade-test"}


@pytest.fixture(params=["delta-rs", "delta-spark"])
def engine(request: pytest.FixtureRequest) -> str:
    return request.param


def open_as(engine: str, root: Path, spark: SparkSession, declared: StructType) -> TableStore:
    """The store of a version that declares `declared` for the table."""
    return open_table_store(str(root), spark, engine=engine, declared={TABLE: declared})


def old_rows(run_id: str = "r0", n: int = 3, start: int = 0) -> list[dict[str, Any]]:
    return [{"run_id": run_id, "ledger_id": start + i, "state": None if i == 1 else "CLOSED"} for i in range(n)]


def new_rows(run_id: str = "r1", n: int = 4, start: int = 100) -> list[dict[str, Any]]:
    return [{"run_id": run_id, "ledger_id": start + i, "segments": i + 1, "state": "OPEN",
             "segment_bookies": [f"bk{i}:3181", f"bk{i + 1}:3181"], "bound": {"low": i, "high": 1000 + i}}
            for i in range(n)]


def as_new(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of the old schema as the new schema reads them: nulls in the columns added."""
    return [{**{c: None for c in NEW.fieldNames()}, **r} for r in rows]


def _canon_value(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _canon_value(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_canon_value(v) for v in value)
    return value


def canon(records: list[dict[str, Any]]) -> list[tuple]:
    """Order-free, comparable form of rows in the new schema's columns (missing keys fail: a read lost a column)."""
    return sorted((tuple(_canon_value(r[c]) for c in NEW.fieldNames()) for r in records), key=repr)


def records(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in df.collect()]


def write_old_table(engine: str, root: Path, spark: SparkSession, partitioned: bool = False) -> TableStore:
    """The table as the earlier version left it: two commits of old rows."""
    old = open_as(engine, root, spark, OLD)
    first = old.append(TABLE, spark.createDataFrame(old_rows(), OLD).repartition(2), OLD,
                       partition_by=["run_id"] if partitioned else None, commit_metadata={"run_id": "r0"})
    old.first_rows_version = first.version  # type: ignore[attr-defined]  # delta-spark: after its CREATE TABLE
    old.append_rows(TABLE, old_rows("r2", 2, start=50), OLD, commit_metadata={"run_id": "r2"})
    return old


def expected_old() -> list[dict[str, Any]]:
    return as_new(old_rows() + old_rows("r2", 2, start=50))


# --------------------------------------------------------------------------- reads


@pytest.mark.parametrize("partitioned", [False, True], ids=["plain", "partitioned"])
def test_an_older_table_reads_in_the_declared_schema(engine: str, spark: SparkSession, tmp_path: Path,
                                                     partitioned: bool) -> None:
    root = tmp_path / "tables"
    old = write_old_table(engine, root, spark, partitioned)
    version = old.version(TABLE)
    new = open_as(engine, root, spark, NEW)

    df = new.read(TABLE)
    assert [(f.name, f.dataType) for f in df.schema.fields] == [(f.name, f.dataType) for f in NEW.fields]
    assert canon(records(df)) == canon(expected_old())
    assert canon(records(new.read(TABLE, where={"run_id": "r2"}))) == canon(as_new(old_rows("r2", 2, start=50)))
    first = old.first_rows_version  # type: ignore[attr-defined]
    assert canon(records(new.read(TABLE, version=first))) == canon(as_new(old_rows()))  # time travel too
    # A condition on a column the table lacks: its rows are null there, and a null never matches.
    assert new.read(TABLE, where={"segments": 1}).count() == 0
    assert new.read(TABLE, where={"run_id": "r0", "segments": [1, 2]}).columns == NEW.fieldNames()

    arrow = new.read_arrow(TABLE)
    assert arrow.schema.names == NEW.fieldNames()
    assert pa.types.is_int32(arrow.schema.field("segments").type)  # typed nulls, not a null type
    assert pa.types.is_struct(arrow.schema.field("bound").type)
    bookies = arrow.schema.field("segment_bookies").type
    assert pa.types.is_list(bookies) or pa.types.is_large_list(bookies)
    assert canon(arrow.to_pylist()) == canon(expected_old())
    some = new.read_arrow(TABLE, {"run_id": "r0"}, ["ledger_id", "segment_bookies", "bound"])
    assert some.column_names == ["ledger_id", "segment_bookies", "bound"]
    assert sorted(some.to_pylist(), key=lambda r: r["ledger_id"]) == [
        {"ledger_id": i, "segment_bookies": None, "bound": None} for i in range(3)]
    none = new.read_arrow(TABLE, {"segments": [3, 4]}, ["ledger_id"])
    assert none.num_rows == 0 and none.column_names == ["ledger_id"]

    counts = new.aggregate_arrow(TABLE, ["run_id"], [("segments", "max"), ("segments", "count"),
                                                     ("ledger_id", "count")])
    assert sorted(counts.to_pylist(), key=lambda r: r["run_id"]) == [
        {"run_id": "r0", "segments_max": None, "segments_count": 0, "ledger_id_count": 3},
        {"run_id": "r2", "segments_max": None, "segments_count": 0, "ledger_id_count": 2}]
    frame = new.run_frames({TABLE: NEW}, "r0")[TABLE]
    assert frame.columns == NEW.fieldNames() and canon(records(frame)) == canon(as_new(old_rows()))

    # A store that declares nothing for the table reads it as it is; a call may declare the schema itself.
    plain = open_table_store(str(root), spark, engine=engine, declared={})
    assert plain.read(TABLE).columns == OLD.fieldNames()
    assert plain.read_arrow(TABLE, schema=NEW).column_names == NEW.fieldNames()
    assert plain.read(TABLE, where={"run_id": "r0"}, schema=NEW).columns == NEW.fieldNames()
    # The other engine reads it alike; and reading changed nothing.
    other = open_as(OTHER[engine], root, spark, NEW)
    assert canon(records(other.read(TABLE))) == canon(other.read_arrow(TABLE).to_pylist()) == canon(expected_old())
    assert new.version(TABLE) == version and new.layout(TABLE)[0].fieldNames() == OLD.fieldNames()


# --------------------------------------------------------------------------- every append path evolves


def _same(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def _without_route(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.RecordBatch.from_arrays([batch.column(c) for c in NEW.fieldNames()], names=NEW.fieldNames())


def append_new(path: str, store: TableStore, spark: SparkSession, rows: list[dict[str, Any]]) -> None:
    """`rows` (new schema) appended to the table by one of the store's append paths, declaring NEW."""
    if path == "append":
        store.append(TABLE, spark.createDataFrame(rows, NEW).repartition(2), NEW, commit_metadata=META)
    elif path == "append_rows":
        store.append_rows(TABLE, rows, NEW, commit_metadata=META)
    elif path == "append_columns":
        store.append_columns(TABLE, {c: [r[c] for r in rows] for c in NEW.fieldNames() if c != "state"}, NEW,
                             commit_metadata=META)  # a column left out is null
        for row in rows:
            row["state"] = None
    elif path == "append_arrow_frame":
        source = spark.createDataFrame(rows, NEW).repartition(2)
        store.append_arrow_frame(TABLE, source, _same, NEW, commit_metadata=META)
    elif path == "append_arrow_frames":
        routed = StructType([StructField("table", StringType(), False), *NEW.fields])
        source = spark.createDataFrame([{"table": TABLE, **r} for r in rows], routed).repartition(2)
        results = store.append_arrow_frames(source, "table", _without_route, {TABLE: NEW, "fresh": NEW},
                                            commit_metadata=META)
        assert results["fresh"].rows == 0 and store.layout("fresh")[0].fieldNames() == NEW.fieldNames()
    elif path == "task_writer":
        writer = store.task_writer({TABLE: NEW}, commit_metadata=META)
        if writer is None:
            pytest.skip(f"the {store.engine} engine offers no task writer (its producers append through Spark)")
        batch_schema = arrow_schema(NEW)

        def task(part: Iterator[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
            writing = writer.open()
            writing.write(TABLE, pa.RecordBatch.from_pylist(list(part), schema=batch_schema))  # declared order
            return iter(writing.close())

        written = spark.sparkContext.parallelize(rows, 2).mapPartitions(task).collect()
        store.commit_written(writer, {TABLE: [record for _, record in written]}, commit_metadata=META)
    elif path == "task_appender":
        appender = store.task_appender(TABLE, NEW, commit_metadata=META)
        spark.sparkContext.parallelize(rows, 2).foreachPartition(lambda part: appender.append(list(part)))
    else:
        raise AssertionError(path)


APPEND_PATHS = ["append", "append_rows", "append_columns", "append_arrow_frame", "append_arrow_frames",
                "task_writer", "task_appender"]


@pytest.mark.parametrize("path", APPEND_PATHS)
def test_each_append_path_adds_the_declared_columns_first(engine: str, path: str, spark: SparkSession,
                                                          tmp_path: Path) -> None:
    root = tmp_path / "tables"
    write_old_table(engine, root, spark)
    store = open_as(engine, root, spark, NEW)
    rows = new_rows()
    append_new(path, store, spark, rows)

    schema, parts = store.layout(TABLE)
    assert schema.fieldNames() == OLD.fieldNames() + ADDED and parts == []  # Delta appends them at the end
    assert [schema[c].dataType for c in ADDED] == [NEW[c].dataType for c in ADDED]
    assert all(schema[c].nullable for c in ADDED) and not schema["ledger_id"].nullable  # NOT NULL kept
    # One commit added the columns (the run and stage it was for on record), before the rows.
    adding = [h for h in store.history(TABLE) if ADDED_KEY in h["metadata"]]
    assert [h["metadata"][ADDED_KEY] for h in adding] == [",".join(ADDED)]
    assert (adding[0]["metadata"]["run_id"], adding[0]["metadata"]["stage"]) == ("r1", "upgrade-test")

    expected = expected_old() + rows  # the old rows with nulls in the new columns, the new rows with values
    for reader in (store, open_as(OTHER[engine], root, spark, NEW)):
        df = reader.read(TABLE)
        assert df.columns == NEW.fieldNames()
        assert canon(records(df)) == canon(expected)
        assert canon(reader.read_arrow(TABLE).to_pylist()) == canon(expected)
        assert canon(records(reader.read(TABLE, where={"segments": 2}))) == canon([rows[1]])
    independent = DeltaTable(store.path(TABLE)).to_pyarrow_table().to_pylist()
    assert canon(independent) == canon(expected)

    # The table has the columns now: a later append adds nothing more, and so does the other engine's.
    version = store.version(TABLE)
    store.append_rows(TABLE, new_rows("r3", 1, start=300), NEW)
    open_as(OTHER[engine], root, spark, NEW).append_rows(TABLE, new_rows("r4", 1, start=400), NEW)
    assert store.version(TABLE) == version + 2
    assert len([h for h in store.history(TABLE) if ADDED_KEY in h["metadata"]]) == 1


def test_the_other_engine_appends_to_an_evolved_table(engine: str, spark: SparkSession, tmp_path: Path) -> None:
    """A table one engine evolved takes the other engine's appends, by the old schema and by the new."""
    root = tmp_path / "tables"
    write_old_table(engine, root, spark)
    open_as(engine, root, spark, NEW).append_rows(TABLE, new_rows(), NEW)
    other = open_as(OTHER[engine], root, spark, NEW)
    other.append(TABLE, spark.createDataFrame(new_rows("r5", 2, start=500), NEW), NEW)
    assert canon(records(other.read(TABLE, where={"run_id": "r5"}))) == canon(new_rows("r5", 2, start=500))
    assert other.read(TABLE).count() == 5 + 4 + 2


# --------------------------------------------------------------------------- what an upgrade may not do

FORBIDDEN = {
    "dropped": (StructType([f for f in OLD.fields if f.name != "state"]), r"missing column\(s\): state.*never dropped"),
    "renamed": (StructType([*OLD.fields[:2], StructField("status", StringType())]),
                r"missing column\(s\): state.*never dropped or renamed"),
    "retyped": (StructType([OLD["run_id"], StructField("ledger_id", StringType(), False), OLD["state"]]),
                r"column 'ledger_id': declared string, the table has bigint.*type never changes"),
    "not-null": (StructType([*OLD.fields, StructField("segments", IntegerType(), False)]),
                 r"new column\(s\) segments declared NOT NULL.*declare them nullable"),
}


@pytest.mark.parametrize("change", sorted(FORBIDDEN))
def test_what_an_upgrade_may_not_change_is_refused_naming_the_fix(engine: str, change: str, spark: SparkSession,
                                                                   tmp_path: Path) -> None:
    root = tmp_path / "tables"
    old = write_old_table(engine, root, spark)
    version = old.version(TABLE)
    declared, message = FORBIDDEN[change]
    store = open_as(engine, root, spark, declared)
    pattern = rf"(?s)table '{TABLE}' at .*{message}.*An upgrade may add nullable columns to a table, nothing else"
    rows = [{f.name: "x" if isinstance(f.dataType, StringType) else 1 for f in declared.fields}]
    attempts = [
        lambda: store.append_rows(TABLE, rows, declared),
        lambda: store.append(TABLE, spark.createDataFrame(rows, declared), declared),
        lambda: store.task_appender(TABLE, declared),
        lambda: store.evolve(TABLE, declared),
    ]
    for attempt in attempts:
        with pytest.raises(TableSchemaError, match=pattern):
            attempt()
    assert old.version(TABLE) == version and old.layout(TABLE)[0] == OLD  # nothing committed
    # Rows whose columns differ from the declared schema are the data's error, as before, with nothing committed.
    with pytest.raises(TableSchemaError, match=r"missing column\(s\): segments"):
        open_as(engine, root, spark, NEW).append(TABLE, spark.createDataFrame(old_rows(), OLD), NEW)
    with pytest.raises(TableSchemaError, match="unknown column"):
        open_as(engine, root, spark, NEW).append_rows(TABLE, [{**new_rows()[0], "segmnets": 2}], NEW)
    assert old.version(TABLE) == version and old.layout(TABLE)[0] == OLD


# --------------------------------------------------------------------------- concurrent writers


def racing_store(engine: str, root: Path, spark: SparkSession, barrier: threading.Barrier) -> TableStore:
    """A store of the new version whose writer waits for the other's at the moment that makes them race: each
    holds what it saw of the old table before either adds the columns. delta-rs: each holds a snapshot of the
    old table to commit its ADD COLUMN on (so one of the two commits is refused as conflicting with the other's
    metadata change); delta-spark: each has decided to add them (so one ALTER TABLE finds them there)."""
    base = type(open_as(engine, root, spark, NEW))
    hook = "_log" if engine == "delta-rs" else "layout"

    class Racing(base):  # type: ignore[misc, valid-type]
        waited = False

        def _held(self, got: Any) -> Any:
            if not self.waited:
                self.waited = True
                barrier.wait(timeout=300)
            return got

    setattr(Racing, hook, lambda self, name: self._held(getattr(base, hook)(self, name)))
    return Racing(str(root), spark, declared={TABLE: NEW})


def test_two_writers_adding_the_same_columns_at_once_both_land(engine: str, spark: SparkSession,
                                                               tmp_path: Path) -> None:
    root = tmp_path / "tables"
    write_old_table(engine, root, spark)
    barrier = threading.Barrier(2)
    batches = {"a": new_rows("ra", 3, start=1000), "b": new_rows("rb", 3, start=2000)}
    errors: dict[str, BaseException] = {}

    def write(who: str) -> None:
        try:
            racing_store(engine, root, spark, barrier).append_rows(TABLE, batches[who], NEW,
                                                                   commit_metadata={"run_id": who})
        except BaseException as exc:  # reported below, with the other writer's
            errors[who] = exc
            barrier.abort()

    threads = [threading.Thread(target=write, args=(who,)) for who in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, errors
    store = open_as(engine, root, spark, NEW)
    assert canon(records(store.read(TABLE))) == canon(expected_old() + batches["a"] + batches["b"])
    assert store.layout(TABLE)[0].fieldNames() == OLD.fieldNames() + ADDED
    assert len([h for h in store.history(TABLE) if ADDED_KEY in h["metadata"]]) == 1  # the other's was refused


def _wait_for(path: Path, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} ({path})")
        time.sleep(0.05)


def test_an_append_whose_table_gains_columns_meanwhile_lands(engine: str, spark: SparkSession,
                                                             tmp_path: Path) -> None:
    """An older version still appending while an upgraded one adds columns (the upgrade's first run overlapping
    the last run of the version before): Delta refuses the older append's commit, read before the columns were
    added, as conflicting with that metadata change; its rows fit the table still, so it commits again."""
    root = tmp_path / "tables"
    old = write_old_table(engine, root, spark)
    rows = old_rows("late", 3, start=700)
    if engine == "delta-rs":
        # The append's files are written; the newer version adds the columns between its look and its commit.
        class Overtaken(type(old)):  # type: ignore[misc]
            overtaken = False

            def _log(self, name: str) -> DeltaTable:
                snapshot = super()._log(name)
                if not self.overtaken:
                    self.overtaken = True
                    assert open_as(engine, root, spark, NEW).evolve(TABLE, NEW) == ADDED
                return snapshot

        Overtaken(str(root), spark, declared={TABLE: OLD}).append_rows(TABLE, rows, OLD)
    else:
        # Delta-Spark's write reads the table as it starts and commits after its job: the newer version adds the
        # columns while the job runs.
        started, go = tmp_path / "started", tmp_path / "go"

        def hold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            started.touch()
            _wait_for(go, "go from the test")
            yield from batches

        def upgrade() -> None:
            _wait_for(started, "append job")
            open_as(engine, root, spark, NEW).evolve(TABLE, NEW)
            go.touch()

        upgrader = threading.Thread(target=upgrade)
        upgrader.start()
        try:
            old.append(TABLE, spark.createDataFrame(rows, OLD).coalesce(1).mapInArrow(hold, OLD), OLD)
        finally:
            go.touch()
            upgrader.join(timeout=300)
    new = open_as(engine, root, spark, NEW)
    assert new.layout(TABLE)[0].fieldNames() == OLD.fieldNames() + ADDED
    assert canon(records(new.read(TABLE))) == canon(expected_old() + as_new(rows))
    latest, before = new.history(TABLE)[:2]
    assert ADDED_KEY in before["metadata"] and latest["rows"] == 3  # committed once more after the columns came


def test_task_appenders_whose_table_gains_columns_meanwhile_land(engine: str, spark: SparkSession,
                                                                 tmp_path: Path) -> None:
    """Executor-side appends of an older version's appender (a journal written from the tasks) while an upgraded
    version adds columns: the appends after the change fill the new columns with nulls instead of failing."""
    root = tmp_path / "tables"
    old = write_old_table(engine, root, spark)
    appender = old.task_appender(TABLE, OLD)
    marks = tmp_path / "marks"
    marks.mkdir()

    def task(part: Iterator[int]) -> None:
        for i in part:
            appender.append([{"run_id": "task", "ledger_id": 900 + i, "state": "before" if i < 2 else "after"}])
            if i == 1:  # the first appends are on record: the upgrade comes before the next ones
                (marks / "appended").touch()
                _wait_for(marks / "upgraded", "the upgrade")

    def upgrade() -> None:
        _wait_for(marks / "appended", "the task's first appends")
        open_as(engine, root, spark, NEW).evolve(TABLE, NEW)
        (marks / "upgraded").touch()

    upgrader = threading.Thread(target=upgrade)
    upgrader.start()
    try:
        # One task: the other slot of the tests' local[2] runs what delta-spark's ALTER TABLE needs of Spark.
        spark.sparkContext.parallelize(range(4), 1).foreachPartition(task)
    finally:
        (marks / "upgraded").touch()
        upgrader.join(timeout=300)
    new = open_as(engine, root, spark, NEW)
    assert new.layout(TABLE)[0].fieldNames() == OLD.fieldNames() + ADDED
    got = new.read_arrow(TABLE, {"run_id": "task"})
    assert sorted(r["ledger_id"] for r in got.to_pylist()) == list(range(900, 904))
    assert all(r["segments"] is None and r["bound"] is None for r in got.to_pylist())
