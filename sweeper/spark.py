"""The one place a SparkSession is made.

Two situations:
- launched by `spark-submit` (a cluster, or the wrapper script): the submit command owns the
  master, the resources and the jars; we only add what our code relies on (UTC session time
  zone, Arrow).
- a plain `python` process (tests, notebooks, `sweeper` CLI on a laptop): we start an *embedded*
  session tuned for a small machine, bound to loopback, with Python workers that run the same
  interpreter (the venv) and can import our packages. When `scripts/setup.sh` has fetched the JVM
  parts (jvm/pom.xml -> jvm/target/), the session also gets Delta's jars and SQL extension and
  hadoop-aws (s3a://), so either table engine and tables on S3 work in it; the embedded session is
  marked (EMBEDDED_CONF) and `[tables] engine = "auto"` keeps delta-rs there.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# The directory the `sweeper` package is imported from: site-packages when installed, the checkout in development.
# Python workers get it on their path, so they unpickle our functions whatever their working directory.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[1])
REPO_ROOT = PACKAGE_PARENT  # its older name

DEFAULT_MASTER = "local[*]"
MASTER_ENV = "SWEEPER_SPARK_MASTER"
DELTA_EXTENSION_CLASS = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG_CLASS = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
S3A_FILESYSTEM_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"
# Set on the sessions get_spark starts in-process (CLI, sandbox, tests): `engine = "auto"` then
# means delta-rs, the embedded engine, even when Delta's jars are on the classpath.
EMBEDDED_CONF = "spark.sweeper.embedded"

# The JVM parts jvm/pom.xml pins (keep in step with its properties). Maven Central serves
# delta-spark up to 4.4.0 while pip's delta-spark is 4.4.1: same Delta protocol, same Spark 4.2.
DELTA_VERSION = "4.4.0"
HADOOP_AWS_VERSION = "3.5.0"  # = pyspark's bundled hadoop-client
AWS_SDK_VERSION = "2.35.4"  # what hadoop-aws 3.5.0's pom asks for
S3_ANALYTICS_VERSION = "1.3.1"  # software.amazon.s3.analyticsaccelerator, which hadoop-aws 3.5.0 also loads
DELTA_PACKAGES = (f"io.delta:delta-spark_2.13:{DELTA_VERSION}",)
S3A_PACKAGES = (f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}",
                f"software.amazon.awssdk:bundle:{AWS_SDK_VERSION}",
                f"software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:{S3_ANALYTICS_VERSION}")
JARS_DIR_ENV = "SWEEPER_JARS_DIR"  # where `mvn -f jvm/pom.xml package` put them (see jars_dir)
JARS_SUBDIR = Path("jvm") / "target"

# Settings our code depends on wherever it runs: timestamps are UTC end to end, and
# mapInArrow / createDataFrame(arrow) paths assume Arrow is on.
REQUIRED_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}

# Defaults for every session, unless given at submit time. Reconcile caches frames whose plans shuffle; Spark
# keeps a cached plan's shuffle partitioning as planned (spark.sql.shuffle.partitions, 200 by default) unless
# adaptive execution may change it. Then every stage over those frames runs 200 tasks, most of them Python
# (mapInArrow): under spark-submit on two cores the sandbox's reconcile took 47 s instead of 11 s.
SQL_TUNING: dict[str, str] = {
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
}

# Defaults for a local session on a developer machine or CI (2 cores there); all overridable.
LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    # Only effective when this call starts the JVM; a running JVM keeps its heap.
    "spark.driver.memory": "4g",
    # A local session's JVM is the driver and the executor, for runs of seconds to minutes on a few cores: there
    # the optimizing JIT (C2) costs more CPU than it gives back, and G1's concurrent work competes with the tasks.
    # The million-ledger reconcile on a fresh JVM took 24.5 s with the JVM's defaults, 20 s with C1 only, 22 s with
    # the parallel collector, 18.2-18.9 s with both; run again in the same JVM, 12.0-13.2 s and 10.9-11.8 s
    # (docs/benchmarks.md). Like the memory, only effective when this call starts the JVM.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC",
}


@dataclass(frozen=True)
class ProjectJars:
    """The jars scripts/setup.sh fetched (absolute paths; empty when not fetched)."""

    delta: tuple[str, ...]  # delta-spark + delta-storage
    s3a: tuple[str, ...]  # hadoop-aws + the AWS SDK bundle + the S3 analytics accelerator

    @property
    def all(self) -> tuple[str, ...]:
        return self.delta + self.s3a


def jars_dir() -> Path:
    """Where the fetched jars are looked for: $SWEEPER_JARS_DIR when set; else jvm/target in the working directory,
    else beside the imported package (a development checkout, where scripts/setup.sh fetched them). An installed
    wheel has no jars of its own: then it is the working directory's jvm/target, which holds none, the embedded
    session runs without them (delta-rs), and what needs them says so naming this directory and the variable."""
    if os.environ.get(JARS_DIR_ENV):
        return Path(os.environ[JARS_DIR_ENV])
    here = JARS_SUBDIR.absolute()
    for candidate in (here, Path(PACKAGE_PARENT) / JARS_SUBDIR):
        if candidate.is_dir():
            return candidate
    return here


def project_jars() -> ProjectJars:
    base = jars_dir()

    def found(sub: str, *prefixes: str) -> tuple[str, ...]:
        jars = sorted(glob.glob(str(base / sub / "*.jar")))
        # Only a complete set counts: half of it gives ClassNotFoundError deep inside a job.
        if all(any(Path(j).name.startswith(p) for j in jars) for p in prefixes):
            return tuple(jars)
        return ()

    return ProjectJars(found("delta", "delta-spark_", "delta-storage-"), found("s3a", "hadoop-aws-", "bundle-",
                                                                                 "analyticsaccelerator-s3-"))


def delta_session_conf() -> dict[str, str]:
    """What a session needs for the delta-spark engine (besides the jars)."""
    return {"spark.sql.extensions": DELTA_EXTENSION_CLASS, "spark.sql.catalog.spark_catalog": DELTA_CATALOG_CLASS}


def _jar_conf(jars: ProjectJars) -> dict[str, str]:
    if not jars.all:
        return {}
    # extraClassPath, not spark.jars: the jars are on this machine, so nothing is copied (the AWS
    # SDK bundle alone is ~650 MiB) and the classes load from the JVM's own class path.
    classpath = os.pathsep.join(jars.all)
    conf = {"spark.driver.extraClassPath": classpath, "spark.executor.extraClassPath": classpath}
    if jars.delta:
        conf.update(delta_session_conf())
    return conf


DELTA_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


def _tune_sql(spark: SparkSession) -> None:
    try:
        given = spark.sparkContext.getConf()
        for key, value in SQL_TUNING.items():
            if not given.contains(key):
                spark.conf.set(key, value)
    except Exception as exc:  # Spark Connect: no SparkContext here
        log.debug("cannot tune Spark SQL: %s", exc)


def _tune_delta(spark: SparkSession) -> None:
    """Delta rebuilds a table's state (on every read and write) with `snapshotPartitions` tasks,
    50 by default: our logs hold a few commits per run, and 50 tasks on a 2-core machine cost
    seconds per table for nothing. Use the cluster's parallelism, at most Delta's default; a
    value given at submit time wins."""
    if not delta_spark_configured(spark):
        return
    try:
        if spark.sparkContext.getConf().contains(DELTA_SNAPSHOT_PARTITIONS):
            return
        spark.conf.set(DELTA_SNAPSHOT_PARTITIONS, str(max(2, min(50, spark.sparkContext.defaultParallelism))))
    except Exception as exc:  # Spark Connect: no SparkContext here
        log.debug("cannot tune Delta's snapshot partitions: %s", exc)


def _launched_by_spark_submit() -> bool:
    # spark-submit starts the JVM first and hands Python its gateway through this variable.
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _python_path_with_package() -> str:
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if PACKAGE_PARENT not in parts:
        parts.insert(0, PACKAGE_PARENT)
    return os.pathsep.join(parts)


def _apply_runtime_conf(spark: SparkSession, conf: dict[str, str]) -> None:
    for key, value in conf.items():
        try:
            spark.conf.set(key, value)
        except Exception as exc:  # static settings cannot change on a running session
            log.warning("cannot set %s on the running Spark session: %s", key, exc)


def get_spark(app_name: str = "ledger-sweeper", master: str | None = None,
              conf: dict[str, str] | None = None) -> SparkSession:
    """Return the active SparkSession, or start a local one.

    Master for a local session: `master`, else $SWEEPER_SPARK_MASTER, else `local[*]`. A session
    that already exists (a notebook's, or one made by spark-submit) keeps its master; `conf` is
    then applied as far as a running session allows.
    """
    conf = dict(conf or {})
    active = SparkSession.getActiveSession()
    if active is not None:
        _apply_runtime_conf(active, {**REQUIRED_CONF, **conf})
        return active

    if _launched_by_spark_submit():
        # Master, name, memory and packages come from the spark-submit command line.
        builder = SparkSession.builder
        for key, value in conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        _apply_runtime_conf(spark, {**REQUIRED_CONF, **{k: v for k, v in conf.items() if k.startswith("spark.sql.")}})
        _tune_sql(spark)
        _tune_delta(spark)
        return spark

    # Python workers are forked by the JVM from these variables: they must run this venv's
    # interpreter (pyarrow, deltalake, our code) and find our package even when cwd is elsewhere.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = _python_path_with_package()

    settings = {
        **LOCAL_CONF,
        **_jar_conf(project_jars()),
        EMBEDDED_CONF: "true",
        **REQUIRED_CONF,
        # Covers a JVM that was started earlier in this process with an older environment.
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
        **conf,
    }
    builder = SparkSession.builder.appName(app_name).master(master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _tune_sql(spark)
    _tune_delta(spark)
    return spark


def delta_spark_available(spark: SparkSession) -> bool:
    """True when Delta's Spark classes (the delta-spark jars) are on the JVM's classpath."""
    return jvm_class_available(spark, DELTA_EXTENSION_CLASS)


def is_embedded(spark: SparkSession) -> bool:
    """True for a session get_spark started in this process (not spark-submit's, not a notebook's own)."""
    try:
        return (spark.conf.get(EMBEDDED_CONF, "false") or "").lower() == "true"
    except Exception:
        return False


def jvm_class_available(spark: SparkSession, name: str) -> bool:
    """True when the JVM behind `spark` can load class `name` (False on Spark Connect: no local JVM)."""
    from py4j.protocol import Py4JError

    try:
        jvm = spark._jvm
    except Exception:
        return False
    if jvm is None:
        return False
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(name, False, loader)
    except Py4JError:
        return False
    return True


def delta_spark_configured(spark: SparkSession) -> bool:
    """True when the session was started with Delta's SQL extension (needed for DeltaTable APIs)."""
    try:
        extensions = spark.conf.get("spark.sql.extensions", "") or ""
    except Exception:
        return False
    return DELTA_EXTENSION_CLASS in extensions


def task_error(exc: BaseException, kinds: tuple[str, ...]) -> str:
    """The message a Spark task raised with one of our exception types, not the JVM's whole stack trace."""
    text = str(exc)
    for kind in kinds:
        marker = f"{kind}: "
        if marker in text:
            return text.rsplit(marker, 1)[1].splitlines()[0]
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
