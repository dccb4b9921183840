"""The one place a SparkSession is made.

Two situations:
- launched by `spark-submit` (a cluster, or the wrapper script): the submit command owns the
  master and the resources; we only add what our code relies on (UTC session time zone, Arrow).
- a plain `python` process (tests, notebooks, `sweeper` CLI on a laptop): we start a local
  session tuned for a small machine, bound to loopback, with Python workers that run the same
  interpreter (the venv) and can import our packages.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Parent of the `sweeper` package: workers need it on their path to unpickle our functions.
REPO_ROOT = str(Path(__file__).resolve().parents[1])

DEFAULT_MASTER = "local[*]"
MASTER_ENV = "SWEEPER_SPARK_MASTER"
DELTA_EXTENSION_CLASS = "io.delta.sql.DeltaSparkSessionExtension"

# Settings our code depends on wherever it runs: timestamps are UTC end to end, and
# mapInArrow / createDataFrame(arrow) paths assume Arrow is on.
REQUIRED_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
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
}


def _launched_by_spark_submit() -> bool:
    # spark-submit starts the JVM first and hands Python its gateway through this variable.
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _python_path_with_repo() -> str:
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if REPO_ROOT not in parts:
        parts.insert(0, REPO_ROOT)
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
        return spark

    # Python workers are forked by the JVM from these variables: they must run this venv's
    # interpreter (pyarrow, deltalake, our code) and find the repo even when cwd is elsewhere.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = _python_path_with_repo()

    settings = {
        **LOCAL_CONF,
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
    return spark


def delta_spark_available(spark: SparkSession) -> bool:
    """True when Delta's Spark classes (the delta-spark jars) are on the JVM's classpath."""
    from py4j.protocol import Py4JError

    try:
        jvm = spark._jvm  # None or missing on Spark Connect, which has no local JVM
    except Exception:
        return False
    if jvm is None:
        return False
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(DELTA_EXTENSION_CLASS, False, loader)
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
