"""Delta tables through Delta Lake's own Spark integration (the delta-spark jars).

For clusters started with the Delta packages and SQL extension (see `spark-submit.sh`). Same
contract as the delta-rs engine: schema checks happen before writing (base class), one append is
one Delta commit, a zero-row append to an existing table commits nothing.

Differences to know:
- Creating a table is its own commit (CREATE TABLE with the exact schema, so NOT NULL columns
  stay NOT NULL: Delta makes every column of a DataFrame write nullable, see Delta's
  ImplicitMetadataOperation.updateMetadata), followed by the append. So a first append whose job
  fails leaves the empty table it created (version 0, no rows), where delta-rs leaves nothing.
- A zero-row append commits nothing because Delta's WriteIntoDelta skips empty commits
  (OptimisticTransaction.commitIfNeeded); nothing evaluates the DataFrame twice.
- Version, schema and partitioning come from the table's DeltaLog snapshot through the JVM (its
  protocol and metadata, no Spark job), with Delta's public API as the fallback.
- `storage_options` only passes Hadoop keys (`fs.*`, `dfs.*`) as read/write options; credentials for
  s3a:// come from the Hadoop credential chain (environment, instance role), endpoints from the
  session's Hadoop configuration (sweeper.storage sets them from `[tables]`).
- Appends write with `mergeSchema` false, whatever the session's `autoMerge` setting: the base class has
  checked the rows against the table, and a write must not change the table's schema behind that check
  (a merge adds whatever column the data has and the table lacks). Columns an upgrade declares are added
  on their own, before the append, by `ALTER TABLE ... ADD COLUMNS` (one commit, "ADD COLUMNS" in the
  history): exactly the ones the base class decided, nullable. (A zero-row `mergeSchema` write would add
  them too, but leaves an empty data file in the table.)
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructField, StructType

from sweeper.tables.base import TableStore
from sweeper.tables.commits import COMMIT_ID_KEY, CommitResult, history_entry, parse_user_metadata
from sweeper.tables.conditions import filtered
from sweeper.tables.errors import TableNotFoundError
from sweeper.tables.schema import conformed, matches_nothing, read_schema
from sweeper.tables.storage import spark_uri

log = logging.getLogger(__name__)

_USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
# The session-wide userMetadata setting is shared state: one table creation at a time sets it.
_conf_lock = threading.Lock()


class DeltaSparkTableStore(TableStore):
    engine = "delta-spark"

    def __init__(self, root: str, spark: SparkSession, storage_options: dict[str, str] | None = None, *,
                 declared: Mapping[str, StructType] | None = None) -> None:
        # Hadoop names S3 s3a://; delta-rs writes the same table as s3:// (the log holds relative paths).
        super().__init__(spark_uri(spark, root), spark, storage_options, declared=declared)
        from delta.tables import DeltaTable  # the delta-spark Python package

        self._delta_table = DeltaTable
        self._hadoop_options = {k: v for k, v in self._storage_options.items() if k.startswith(("fs.", "dfs."))}
        ignored = sorted(set(self._storage_options) - set(self._hadoop_options))
        if ignored:
            log.warning("delta-spark engine ignores non-Hadoop storage options: %s", ", ".join(ignored))

    def _handle(self, name: str):  # -> delta.tables.DeltaTable
        if not self.exists(name):
            raise TableNotFoundError(f"no Delta table {name!r} at {self.path(name)}")
        return self._delta_table.forPath(self.spark, self.path(name), self._hadoop_options)

    def _snapshot(self, name: str) -> tuple[int, StructType, list[str]] | None:
        """(version, schema, partition columns) of the latest snapshot, None without a table.

        Through Delta's DeltaLog: protocol and metadata are read from the log (or its checksum
        file) on the driver, where DeltaTable.detail() runs a job over the whole table state.
        """
        if self._hadoop_options:
            return self._snapshot_public(name)
        try:
            jvm = self.spark._jvm
            log_class = jvm.org.apache.spark.sql.delta.DeltaLog
            none = jvm.scala.Option.empty()
            snapshot = log_class.forTable(self.spark._jsparkSession, self.path(name)).update(False, none, none)
            version = int(snapshot.version())
            if version < 0:
                return None
            metadata = snapshot.metadata()
            schema = StructType.fromJson(json.loads(metadata.schemaString()))
            joined = metadata.partitionColumns().mkString("\u0000")  # no column name holds a NUL
            return version, schema, joined.split("\u0000") if joined else []
        except Py4JError as exc:  # another Delta version's internals: the public API still works
            log.debug("DeltaLog snapshot unavailable (%s); using DeltaTable.detail()", exc)
            return self._snapshot_public(name)

    def _snapshot_public(self, name: str) -> tuple[int, StructType, list[str]] | None:
        if not self.exists(name):
            return None
        handle = self._delta_table.forPath(self.spark, self.path(name), self._hadoop_options)
        version = int(handle.history(1).select("version").head()[0])
        parts = handle.detail().select("partitionColumns").head()[0] or []
        return version, handle.toDF().schema, list(parts)

    def exists(self, name: str) -> bool:
        return bool(self._delta_table.isDeltaTable(self.spark, self.path(name)))

    def version(self, name: str) -> int | None:
        snapshot = self._snapshot(name)
        return None if snapshot is None else snapshot[0]

    def layout(self, name: str) -> tuple[StructType, list[str]] | None:
        snapshot = self._snapshot(name)
        return None if snapshot is None else (snapshot[1], snapshot[2])

    def history(self, name: str) -> list[dict[str, Any]]:
        latest = self.version(name)
        if latest is None:
            raise TableNotFoundError(f"no Delta table {name!r} at {self.path(name)}")
        try:
            return [_entry(version, info) for version, info in self._commit_infos(name, latest)]
        except Py4JError:
            rows = self._handle(name).history().orderBy("version", ascending=False).collect()
            return [history_entry(r["version"], r["timestamp"], r["operation"], r["operationParameters"],
                                  r["operationMetrics"], r["userMetadata"], r["engineInfo"]) for r in rows]

    def _commit_infos(self, name: str, newest: int, limit: int | None = None):  # -> Iterator[(int, dict)]
        """(version, commitInfo) from `newest` down, read from the commit files through Hadoop's
        file system on the driver: a few small reads, where DeltaTable.history() runs a Spark job.
        Stops at a file log clean-up removed."""
        jvm = self.spark._jvm
        hadoop_path = jvm.org.apache.hadoop.fs.Path
        log_dir = hadoop_path(f"{self.path(name)}/_delta_log")
        conf = self.spark._jsc.hadoopConfiguration()
        if self._hadoop_options:
            conf = jvm.org.apache.hadoop.conf.Configuration(conf)
            for key, value in self._hadoop_options.items():
                conf.set(key, value)
        fs = log_dir.getFileSystem(conf)
        oldest = 0 if limit is None else max(0, newest - limit + 1)
        for version in range(newest, oldest - 1, -1):
            commit = hadoop_path(log_dir, f"{version:020d}.json")
            if not fs.exists(commit):
                return
            stream = fs.open(commit)
            try:
                text = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
            finally:
                stream.close()
            yield version, next((json.loads(line)["commitInfo"] for line in text.splitlines()
                                 if '"commitInfo"' in line), {})

    def read(self, name: str, version: int | None = None, where: Mapping[str, Any] | None = None,
             schema: StructType | None = None) -> DataFrame:
        latest = self.version(name)
        if latest is None:
            raise TableNotFoundError(f"no Delta table {name!r} at {self.path(name)}")
        reader = self.spark.read.format("delta").options(**self._hadoop_options)
        if version is not None:
            if not 0 <= version <= latest:
                raise TableNotFoundError(
                    f"Delta table {name!r} at {self.path(name)} has no version {version} (latest is {latest})")
            reader = reader.option("versionAsOf", version)
        df = reader.load(self.path(name))
        schema = read_schema(df.schema, self._declared_schema(name, schema))
        if matches_nothing(where, df.schema, schema):
            return self.spark.createDataFrame([], schema)
        # Delta-Spark skips the files whose statistics rule the condition out itself (data skipping); the columns
        # added as nulls are a projection above the scan, which the filter's pushdown passes through.
        return filtered(conformed(df, schema), where)

    # ---- writing

    def _create(self, name: str, schema: StructType, partition_by: list[str], metadata: dict[str, str]) -> None:
        builder = self._delta_table.createIfNotExists(self.spark).location(self.path(name)).addColumns(schema)
        if partition_by:
            builder = builder.partitionedBy(*partition_by)
        self._with_user_metadata(metadata, builder.execute)

    def _add_columns(self, name: str, fields: list[StructField], metadata: dict[str, str]) -> None:
        # The column types as Spark SQL spells them (quoted nested names included), from the JVM's own DataType.
        data_type = self.spark._jvm.org.apache.spark.sql.types.DataType
        columns = ", ".join(f"{_quoted(f.name)} {data_type.fromJson(f.dataType.json()).sql()}" for f in fields)
        path = self.path(name).replace("`", "``")
        # Path-based, so through the session's Hadoop configuration: a store given its own Hadoop options
        # (`fs.*`) must reach the table through the session's too.
        statement = f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})"
        self._with_user_metadata(metadata, lambda: self.spark.sql(statement))

    def _with_user_metadata(self, metadata: dict[str, str], action: Callable[[], object]) -> None:
        """Run `action` (a DDL, which takes no write options) with `metadata` as its commit's userMetadata."""
        with _conf_lock:
            previous = self.spark.conf.get(_USER_METADATA_CONF, None)
            self.spark.conf.set(_USER_METADATA_CONF, json.dumps(metadata, sort_keys=True))
            try:
                action()
            finally:
                if previous is None:
                    self.spark.conf.unset(_USER_METADATA_CONF)
                else:
                    self.spark.conf.set(_USER_METADATA_CONF, previous)

    def _append_frame(self, name: str, df: DataFrame, schema: StructType, partition_by: list[str],
                      create: bool, metadata: dict[str, str]) -> CommitResult:
        if create:
            self._create(name, schema, partition_by, metadata)
        writer = (
            df.write.format("delta")
            .mode("append")
            .option("mergeSchema", "false")
            .option("userMetadata", json.dumps(metadata, sort_keys=True))
            .options(**self._hadoop_options)
        )
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        try:
            writer.save(self.path(name))
        except Exception as exc:
            # Delta-Spark's transaction reads the table when the write starts and commits after the job: another
            # writer's change of the columns in between (an upgrade adding some) fails it with
            # MetadataChangedException, blind append or not. Our rows still fit a table that kept their columns
            # (Delta writes nulls for the ones added): the write is made once more, the job run again.
            if "MetadataChangedException" not in type(exc).__name__ + str(exc)[:2000]:
                raise
            self._check_still_fits(name, schema, partition_by, exc)
            log.info("table %s: its metadata changed under our append; writing again", name)
            writer.save(self.path(name))
        # Our commit, found by its id. None: Delta skipped the commit (no rows), or 100 others
        # landed since ours, which only a busy shared table sees.
        entry = self._find_commit(name, metadata[COMMIT_ID_KEY])
        if entry is None or entry["operation"] != "WRITE":
            return CommitResult(name, entry["version"] if entry else (self.version(name) or 0), 0, 0, self.engine)
        metrics = entry["operation_metrics"]
        return CommitResult(name, entry["version"], int(metrics.get("numOutputRows", 0)),
                            int(metrics.get("numFiles", 0)), self.engine)

    def _append_arrow(self, name: str, table: pa.Table, schema: StructType, partition_by: list[str],
                      create: bool, metadata: dict[str, str]) -> CommitResult:
        df = self.spark.createDataFrame(table, schema=schema)
        return self._append_frame(name, df, schema, partition_by, create, metadata)

    def _find_commit(self, name: str, commit_id: str) -> dict[str, Any] | None:
        latest = self.version(name) or 0
        try:
            for version, info in self._commit_infos(name, latest, limit=100):
                if parse_user_metadata(info.get("userMetadata")).get(COMMIT_ID_KEY) == commit_id:
                    return _entry(version, info)
            return None
        except Py4JError:
            pass
        for r in self._handle(name).history(100).collect():
            if parse_user_metadata(r["userMetadata"]).get(COMMIT_ID_KEY) == commit_id:
                return history_entry(r["version"], r["timestamp"], r["operation"], r["operationParameters"],
                                     r["operationMetrics"], r["userMetadata"], r["engineInfo"])
        return None


def _quoted(identifier: str) -> str:
    return "`" + identifier.replace("`", "``") + "`"


def _entry(version: int, info: dict[str, Any]) -> dict[str, Any]:
    return history_entry(version, info.get("timestamp"), info.get("operation"), info.get("operationParameters"),
                         info.get("operationMetrics"), info.get("userMetadata"), info.get("engineInfo"))
