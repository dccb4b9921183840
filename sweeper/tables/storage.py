"""Where the tables live: a local (or shared) path, or S3 through each engine's own client.

    [tables]
    root = "s3://ops-bucket/ledger-sweeper/tables"   # s3a:// is the same place
    s3_endpoint = ""    # an S3-compatible endpoint (MinIO, Ceph, the sandbox's moto); empty: AWS
    s3_region = ""

Who talks to S3, and how each finds its settings:
- delta-rs (the driver's commits and reads of the log) and pyarrow (the Parquet files Spark tasks
  write): the storage options built here, plus the usual AWS chain for credentials in each process
  (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, the instance or pod role).
- Spark's own reads, and every delta-spark read and write: Hadoop's s3a file system (hadoop-aws and
  the AWS SDK bundle on the class path). The endpoint and region go into the session's Hadoop
  configuration for the table bucket only (`fs.s3a.bucket.<bucket>.*`), so other buckets keep the
  cluster's settings; credentials come from s3a's default provider chain, which reads the same
  environment variables and instance roles.
Credentials are never read from the config file and never put into a storage option, except the
fixed dummy key for a loopback endpoint (the sandbox's moto accepts any key), as sweeper.objectstore.s3 does.

Committing safely on S3 (no rename, no atomic "create if absent" before 2024):
- delta-rs writes each commit with a conditional PUT (`If-None-Match: *`), so two writers never
  both win a version; the loser retries on the next one. The store must honour conditional writes
  (AWS S3 since 2024-08, MinIO, moto); we ask for it explicitly (`aws_conditional_put`).
- delta-spark on s3a uses Delta's S3SingleDriverLogStore: safe for one writing cluster (driver)
  at a time only. Concurrent jobs writing one table root need Delta's S3DynamoDBLogStore.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass

from pyspark.sql import SparkSession

from sweeper.spark import (
    AWS_SDK_VERSION,
    HADOOP_AWS_VERSION,
    S3_ANALYTICS_VERSION,
    S3A_FILESYSTEM_CLASS,
    jars_dir,
    jvm_class_available,
)
from sweeper.tables.errors import TableStorageUnavailableError

S3_SCHEMES = ("s3", "s3a")
# What each jar of jvm/target/s3a/ brings; hadoop-aws 3.5.0 needs all three to start an s3a file system.
S3A_JAR_CLASSES = (
    (f"hadoop-aws-{HADOOP_AWS_VERSION}.jar", S3A_FILESYSTEM_CLASS),
    (f"bundle-{AWS_SDK_VERSION}.jar", "software.amazon.awssdk.services.s3.S3Client"),
    (f"analyticsaccelerator-s3-{S3_ANALYTICS_VERSION}.jar",
     "software.amazon.s3.analyticsaccelerator.request.ObjectClient"),
)


@dataclass(frozen=True)
class TableStorage:
    root: str
    s3_endpoint: str = ""
    s3_region: str = ""

    @property
    def scheme(self) -> str:
        return urllib.parse.urlparse(self.root).scheme

    @property
    def on_s3(self) -> bool:
        return self.scheme in S3_SCHEMES

    @property
    def bucket(self) -> str:
        return urllib.parse.urlparse(self.root).netloc


def is_loopback(endpoint: str) -> bool:
    host = urllib.parse.urlparse(endpoint).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _sandbox_keys(storage: TableStorage) -> bool:
    # Only for a loopback endpoint and only when the environment has no key of its own.
    return bool(storage.s3_endpoint) and is_loopback(storage.s3_endpoint) and not os.environ.get("AWS_ACCESS_KEY_ID")


def delta_rs_options(storage: TableStorage) -> dict[str, str]:
    """Storage options for delta-rs and the task-side pyarrow writer (no credentials)."""
    if not storage.on_s3:
        return {}
    options = {"aws_conditional_put": "etag"}  # commits are PUT If-None-Match: * (see the module doc)
    if storage.s3_endpoint:
        options["AWS_ENDPOINT_URL"] = storage.s3_endpoint
        if storage.s3_endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    region = storage.s3_region or ("us-east-1" if storage.s3_endpoint else "")
    if region:
        options["AWS_REGION"] = region
    if _sandbox_keys(storage):
        options.update({"AWS_ACCESS_KEY_ID": "sandbox", "AWS_SECRET_ACCESS_KEY": "sandbox"})
    return options


def s3a_settings(storage: TableStorage) -> dict[str, str]:
    """Hadoop settings for the table bucket (per-bucket keys, so other buckets are untouched)."""
    if not storage.on_s3 or not storage.s3_endpoint:
        return {}
    prefix = f"fs.s3a.bucket.{storage.bucket}."
    settings = {
        prefix + "endpoint": storage.s3_endpoint,
        prefix + "endpoint.region": storage.s3_region or "us-east-1",
        # S3-compatible servers are addressed by path (no bucket.host DNS names).
        prefix + "path.style.access": "true",
        prefix + "connection.ssl.enabled": "false" if storage.s3_endpoint.startswith("http://") else "true",
    }
    if _sandbox_keys(storage):
        settings.update({prefix + "access.key": "sandbox", prefix + "secret.key": "sandbox"})
    return settings


def s3a_jar_help() -> str:
    return (
        f"Spark reads tables on S3 through s3a, which needs hadoop-aws-{HADOOP_AWS_VERSION}.jar (= the Hadoop "
        f"client in pyspark), the AWS SDK v2 bundle-{AWS_SDK_VERSION}.jar and analyticsaccelerator-s3-"
        f"{S3_ANALYTICS_VERSION}.jar on the driver's and executors' class path. Run `mvn -f jvm/pom.xml package` "
        f"(scripts/setup.sh does) to fetch them into {jars_dir()}/s3a/; "
        f"./spark-submit.sh then passes them, or give them to spark-submit with --jars (or --packages "
        f"org.apache.hadoop:hadoop-aws:{HADOOP_AWS_VERSION}). EMR and Dataproc ship them already."
    )


def check_spark_reaches(spark: SparkSession, storage: TableStorage) -> None:
    """Refuse early, naming the missing jar, instead of a ClassNotFoundException deep in a job."""
    if not storage.on_s3:
        return
    if storage.scheme == "s3" and _hadoop_conf(spark, "fs.s3.impl"):
        return  # the cluster maps s3:// itself (EMR's EMRFS)
    missing = [(jar, cls) for jar, cls in S3A_JAR_CLASSES if not jvm_class_available(spark, cls)]
    if missing:
        raise TableStorageUnavailableError(
            f"[tables] root {storage.root} is on S3, and this Spark session lacks "
            f"{', '.join(f'{jar} (class {cls})' for jar, cls in missing)}. {s3a_jar_help()}")


def _hadoop_conf(spark: SparkSession, key: str) -> str | None:
    try:
        return spark.sparkContext._jsc.hadoopConfiguration().get(key)
    except Exception:
        return spark.conf.get(f"spark.hadoop.{key}", None)


def configure_spark(spark: SparkSession, storage: TableStorage) -> None:
    """Put the table bucket's s3a settings into the running session's Hadoop configuration.

    Jobs ship this configuration to their tasks, so executors see it too. A setting the operator
    gave at submit time (spark.hadoop.fs.s3a.bucket.<bucket>.*) wins over ours.
    """
    settings = s3a_settings(storage)
    if not settings:
        return
    try:
        conf = spark.sparkContext._jsc.hadoopConfiguration()
    except Exception:  # Spark Connect: no JVM here; the server's configuration applies
        return
    for key, value in settings.items():
        if spark.conf.get(f"spark.hadoop.{key}", None) is None:
            conf.set(key, value)


def spark_uri(spark: SparkSession, uri: str) -> str:
    """The URI Spark's Hadoop file systems take: s3:// becomes s3a:// unless the cluster maps s3://."""
    if uri.startswith("s3://") and not _hadoop_conf(spark, "fs.s3.impl"):
        return "s3a://" + uri[len("s3://"):]
    return uri
