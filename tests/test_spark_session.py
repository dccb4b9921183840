"""sweeper.spark: the local session is usable, and its Python workers run our code."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from sweeper.spark import (
    REPO_ROOT,
    delta_spark_available,
    delta_spark_configured,
    get_spark,
    is_embedded,
    jvm_class_available,
    project_jars,
)
from sweeper.tables import auto_engine

REPO = str(Path(__file__).resolve().parents[1])


def test_local_session_is_configured(spark: SparkSession) -> None:
    assert spark.sparkContext.master.startswith("local")
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    assert spark.conf.get("spark.ui.enabled") == "false"
    assert spark.sparkContext.getConf().get("spark.driver.host") == "127.0.0.1"
    assert spark.range(100).selectExpr("sum(id) AS s").head()["s"] == 4950


def test_get_spark_returns_the_active_session_without_changing_master(spark: SparkSession) -> None:
    again = get_spark("another-name", master="local[1]")
    assert again is spark
    assert again.sparkContext.master == spark.sparkContext.master


def _probe(_: object) -> list[tuple[str, str, str]]:
    import sweeper  # the point of the test: workers can import our package

    return [(sweeper.__file__, sys.executable, os.environ.get("PYTHONPATH", ""))]


def test_workers_import_sweeper_with_the_drivers_python(spark: SparkSession) -> None:
    assert REPO_ROOT == REPO
    results = spark.sparkContext.parallelize(range(4), 2).mapPartitions(_probe).collect()
    assert len(results) == 2
    for module_file, executable, pythonpath in results:
        assert Path(module_file).resolve().is_relative_to(REPO)
        # Same interpreter (the venv's pyarrow/deltalake), and the repo reaches workers through
        # PYTHONPATH rather than by luck of the working directory.
        assert Path(executable).resolve() == Path(sys.executable).resolve()
        assert REPO in pythonpath.split(os.pathsep)


def test_workers_import_sweeper_in_arrow_udfs(spark: SparkSession) -> None:
    def probe(batches):
        import pyarrow as pa

        import sweeper.tables.files as files

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"n": [batch.num_rows], "f": [files.__name__]})

    rows = spark.range(10, numPartitions=2).mapInArrow(probe, "n long, f string").collect()
    assert sum(r["n"] for r in rows) == 10
    assert {r["f"] for r in rows} == {"sweeper.tables.files"}


def test_the_embedded_session_carries_the_fetched_jars_and_auto_stays_delta_rs(spark: SparkSession) -> None:
    jars = project_jars()
    # scripts/setup.sh fetched them (jvm/pom.xml); without them the delta-spark tests could not run.
    assert jars.delta and jars.s3a, "run `mvn -f jvm/pom.xml package` (scripts/setup.sh) first"
    assert delta_spark_available(spark) and delta_spark_configured(spark)
    assert jvm_class_available(spark, "org.apache.hadoop.fs.s3a.S3AFileSystem")
    # The embedded engine stays the default in the process's own session (CLI, sandbox, tests);
    # delta-spark is what `auto` picks under spark-submit (tests/test_cluster.py).
    assert is_embedded(spark)
    assert auto_engine(spark) == "delta-rs"


def test_the_pinned_jar_versions_match_jvm_pom() -> None:
    """sweeper.spark names the jars in its messages and fallbacks; jvm/pom.xml fetches them."""
    import xml.etree.ElementTree as ET

    from sweeper import spark as spark_mod

    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    props = ET.parse(Path(REPO) / "jvm" / "pom.xml").getroot().find("m:properties", ns)
    assert props is not None
    pinned = {child.tag.split("}")[1]: child.text for child in props}
    assert pinned["delta.version"] == spark_mod.DELTA_VERSION
    assert pinned["hadoop.version"] == spark_mod.HADOOP_AWS_VERSION
    assert pinned["awssdk.version"] == spark_mod.AWS_SDK_VERSION
    assert pinned["s3analytics.version"] == spark_mod.S3_ANALYTICS_VERSION
    jars = project_jars()
    assert any(f"delta-spark_2.13-{spark_mod.DELTA_VERSION}.jar" in j for j in jars.delta)
    assert any(f"hadoop-aws-{spark_mod.HADOOP_AWS_VERSION}.jar" in j for j in jars.s3a)


def test_a_cached_frame_that_shuffles_is_not_held_at_the_planned_partition_count(spark: SparkSession) -> None:
    """sweeper.spark.SQL_TUNING: without it a cached plan keeps spark.sql.shuffle.partitions (200 under a plain
    spark-submit) and every stage over it runs that many tasks, most of them Python."""
    from pyspark.sql import functions as F

    assert spark.conf.get("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning") == "true"
    spark.conf.set("spark.sql.shuffle.partitions", "50")
    cached = spark.range(1000).groupBy((F.col("id") % 7).alias("k")).count().cache()
    try:
        assert cached.count() == 7
        assert cached.rdd.getNumPartitions() <= spark.sparkContext.defaultParallelism
    finally:
        cached.unpersist()
        spark.conf.set("spark.sql.shuffle.partitions", "2")
