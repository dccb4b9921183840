"""One table API over Delta Lake, two engines.

    store = open_table_store("var/tables", spark)            # engine="auto"
    store.append("bk_ledgers", df, BK_LEDGERS, commit_metadata={"run_id": run_id, "stage": "snapshot"})
    store.read("bk_ledgers", version=3)

- "delta-rs": Spark tasks write Parquet with pyarrow, the driver commits once with delta-rs.
  Needs no Delta jars; the engine used locally, in tests and in CI.
- "delta-spark": Delta Lake's Spark integration; needs the delta-spark jars and SQL extension.
- "auto": delta-spark when the session has the jars and the extension, else delta-rs.
Both write ordinary Delta tables: either engine (or any Delta reader) can read the other's.
"""

from __future__ import annotations

import importlib.metadata

import pyspark
from pyspark.sql import SparkSession

from sweeper.spark import delta_spark_available, delta_spark_configured
from sweeper.tables.base import (
    CommitResult,
    TableNotFoundError,
    TableSchemaError,
    TableStore,
)
from sweeper.tables.delta_rs import DeltaRsTableStore
from sweeper.tables.files import NotNullViolation

ENGINES = ("delta-rs", "delta-spark")


class DeltaSparkUnavailableError(RuntimeError):
    """engine="delta-spark" on a session without Delta's jars or SQL extension."""


def delta_spark_package() -> str:
    """Maven coordinate of the delta-spark jar matching the installed pyspark and delta-spark."""
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    try:
        delta_version = importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError:
        delta_version = "<delta-spark version>"
    return f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version}"


_HOW_TO_ENABLE = (
    "Start Spark with the jars and the extension, e.g. spark-submit --packages {package} "
    "--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension "
    "--conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog "
    "(or the same as spark.jars.packages / jars already on the cluster), or use engine='delta-rs'."
)


def open_table_store(root: str, spark: SparkSession, engine: str = "auto",
                     storage_options: dict[str, str] | None = None) -> TableStore:
    """The table store for `root` (a local path or a URI such as s3://bucket/prefix).

    storage_options: delta-rs storage options (e.g. AWS_ENDPOINT_URL, AWS_REGION,
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ALLOW_HTTP); Spark tasks get them too.
    """
    if engine == "auto":
        engine = "delta-spark" if delta_spark_available(spark) and delta_spark_configured(spark) else "delta-rs"
    if engine == "delta-rs":
        return DeltaRsTableStore(root, spark, storage_options)
    if engine == "delta-spark":
        how = _HOW_TO_ENABLE.format(package=delta_spark_package())
        if not delta_spark_available(spark):
            raise DeltaSparkUnavailableError(
                "engine 'delta-spark' needs Delta Lake's jars on the Spark classpath, and this session has "
                f"none (class io.delta.sql.DeltaSparkSessionExtension not found). {how}")
        if not delta_spark_configured(spark):
            raise DeltaSparkUnavailableError(
                "engine 'delta-spark': the Delta jars are present but the session lacks Delta's SQL extension "
                f"(spark.sql.extensions). These are fixed when the session starts. {how}")
        from sweeper.tables.delta_spark import DeltaSparkTableStore

        return DeltaSparkTableStore(root, spark, storage_options)
    raise ValueError(f"unknown table engine {engine!r}: use 'auto', {', '.join(map(repr, ENGINES))}")


__all__ = [
    "ENGINES",
    "CommitResult",
    "DeltaRsTableStore",
    "DeltaSparkUnavailableError",
    "NotNullViolation",
    "TableNotFoundError",
    "TableSchemaError",
    "TableStore",
    "delta_spark_package",
    "open_table_store",
]
