"""One table API over Delta Lake, two engines.

    store = open_table_store("var/tables", spark)            # engine="auto"
    store.append("bk_ledgers", df, BK_LEDGERS, commit_metadata={"run_id": run_id, "stage": "snapshot"})
    store.read("bk_ledgers", version=3)

- "delta-rs": Spark tasks write Parquet with pyarrow, the driver commits once with delta-rs.
  Needs no Delta jars; the engine used locally, in tests and in CI.
- "delta-spark": Delta Lake's Spark integration; needs the delta-spark jars and SQL extension.
- "auto": the cluster engine on a cluster, the embedded engine embedded. Precisely: delta-spark
  when the session has Delta's jars and extension and was not started by `sweeper.spark.get_spark`
  in this process (spark-submit.sh, a cluster job, a notebook's own session); delta-rs otherwise
  (the CLI, the sandbox and the tests, even when their session carries the jars).
Both write ordinary Delta tables: either engine (or any Delta reader) can read the other's.

Upgrades: a write declaring nullable columns an existing table lacks adds them first (one commit), and reads
return each table in the schema this version declares (sweeper.table_schemas), with nulls in the columns a
table an earlier version wrote lacks; nothing else ever changes a table's schema (sweeper.tables.base, its
helpers in sweeper.tables.schema).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from sweeper.spark import (
    DELTA_CATALOG_CLASS,
    DELTA_EXTENSION_CLASS,
    DELTA_PACKAGES,
    delta_spark_available,
    delta_spark_configured,
    is_embedded,
    jars_dir,
)
from sweeper.tables.base import TableStore, TaskAppender
from sweeper.tables.commits import CommitResult
from sweeper.tables.delta_rs import DeltaRsTableStore
from sweeper.tables.errors import (
    DeltaSparkUnavailableError,
    NotNullViolation,
    TableNotFoundError,
    TableSchemaError,
    TableStorageUnavailableError,
)
from sweeper.tables.storage import TableStorage, check_spark_reaches, configure_spark, delta_rs_options

ENGINES = ("delta-rs", "delta-spark")


def delta_spark_package() -> str:
    """Maven coordinate of the delta-spark jar jvm/pom.xml pins (for --packages)."""
    return DELTA_PACKAGES[0]


def _how_to_enable() -> str:
    return (
        f"Run `mvn -f jvm/pom.xml package` (scripts/setup.sh does) to fetch delta-spark_2.13 and delta-storage "
        f"into {jars_dir()}/delta/, then start Spark with them: ./spark-submit.sh does, or spark-submit "
        f"--jars <those jars> (or --packages {delta_spark_package()}) "
        f"--conf spark.sql.extensions={DELTA_EXTENSION_CLASS} "
        f"--conf spark.sql.catalog.spark_catalog={DELTA_CATALOG_CLASS}; or use engine='delta-rs'."
    )


def auto_engine(spark: SparkSession) -> str:
    """The engine `engine = "auto"` means for this session (see the module doc)."""
    if is_embedded(spark):
        return "delta-rs"
    return "delta-spark" if delta_spark_available(spark) and delta_spark_configured(spark) else "delta-rs"


def open_table_store(root: str, spark: SparkSession, engine: str = "auto",
                     storage_options: dict[str, str] | None = None, *,
                     s3_endpoint: str = "", s3_region: str = "",
                     declared: Mapping[str, StructType] | None = None) -> TableStore:
    """The table store for `root` (a local path or a URI such as s3://bucket/prefix).

    s3_endpoint, s3_region: `[tables]` settings for a root on S3 (sweeper.tables.storage); they
    configure both delta-rs and the session's s3a. storage_options: delta-rs storage options
    instead of the ones derived from them (Spark tasks get them too; never log them).
    declared: the schema reads give each table (TableStore); default: sweeper.table_schemas.ALL_TABLES.
    Raises DeltaSparkUnavailableError / TableStorageUnavailableError, naming the missing jar or
    setting, before anything runs.
    """
    storage = TableStorage(root, s3_endpoint, s3_region)
    check_spark_reaches(spark, storage)
    configure_spark(spark, storage)
    if storage_options is None:
        storage_options = delta_rs_options(storage)
    if engine == "auto":
        engine = auto_engine(spark)
    if engine == "delta-rs":
        return DeltaRsTableStore(root, spark, storage_options, declared=declared)
    if engine == "delta-spark":
        if not delta_spark_available(spark):
            raise DeltaSparkUnavailableError(
                "engine 'delta-spark' needs Delta Lake's jars (delta-spark_2.13, delta-storage) on the Spark "
                f"classpath, and this session has none (class {DELTA_EXTENSION_CLASS} not found). {_how_to_enable()}")
        if not delta_spark_configured(spark):
            raise DeltaSparkUnavailableError(
                "engine 'delta-spark': the Delta jars are present but the session lacks Delta's SQL extension "
                f"(spark.sql.extensions={DELTA_EXTENSION_CLASS}); it is fixed when the session starts. "
                f"{_how_to_enable()}")
        from sweeper.tables.delta_spark import DeltaSparkTableStore

        return DeltaSparkTableStore(root, spark, storage_options, declared=declared)
    raise ValueError(f"unknown table engine {engine!r}: use 'auto', {', '.join(map(repr, ENGINES))}")


__all__ = [
    "ENGINES",
    "CommitResult",
    "DeltaRsTableStore",
    "DeltaSparkUnavailableError",
    "NotNullViolation",
    "TableNotFoundError",
    "TableSchemaError",
    "TableStorageUnavailableError",
    "TableStore",
    "TaskAppender",
    "auto_engine",
    "delta_spark_package",
    "open_table_store",
]
