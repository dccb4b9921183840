"""The two table engines together: one reads what the other wrote, both on S3, and concurrent
writers on S3 lose no commit. The per-engine contract is tests/test_tables_contract.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import boto3
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from harness.s3server import S3ServerInfo
from sweeper.tables import TableStore, open_table_store
from sweeper.tables.storage import TableStorage, delta_rs_options
from tests.support.tables import SCHEMA, big_frame, canon, sample_rows

REPO = Path(__file__).resolve().parents[1]
OTHER = {"delta-rs": "delta-spark", "delta-spark": "delta-rs"}
PARTITIONED = StructType([StructField("shard", IntegerType()), *SCHEMA.fields])


def _bucket(s3: S3ServerInfo, name: str) -> str:
    boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id="sandbox", aws_secret_access_key="sandbox",
                 region_name="us-east-1").create_bucket(Bucket=name)
    return name


def _comparable_history(store: TableStore, name: str) -> list[tuple]:
    return [(h["version"], h["rows"], h["metadata"].get("stage"), h["metadata"].get("sweeper.commit_id"),
             h["metadata"].get("sweeper.engine")) for h in store.history(name)]


def _rows_with_shard(n: int, run_id: str, start: int = 0) -> list[dict]:
    rows = sample_rows(n, run_id, start)
    for i, row in enumerate(rows):
        row["shard"] = None if i % 5 == 0 else i % 3
    return rows


def _check_both_ways(spark: SparkSession, writer: TableStore, reader: TableStore) -> None:
    """`writer` makes a table, `reader` sees the same rows, schema and history, then appends; and back."""
    columns = PARTITIONED.fieldNames()
    first = _rows_with_shard(12, "r1")
    writer.append("shared", spark.createDataFrame(first, PARTITIONED).repartition(3), PARTITIONED,
                  partition_by=["shard"], commit_metadata={"stage": "snapshot"})
    writer.append_rows("shared", _rows_with_shard(3, "r2", start=100), PARTITIONED,
                       commit_metadata={"stage": "reconcile"})
    expected = first + _rows_with_shard(3, "r2", start=100)

    def records(store: TableStore) -> list[dict]:
        df = store.read("shared")
        assert df.columns == columns
        return [r.asDict(recursive=True) for r in df.select(
            *[F.unix_micros(c).alias(c) if c == "captured_at" else F.col(c) for c in columns]).collect()]

    for store in (writer, reader):
        assert canon(records(store), columns) == canon(expected, columns)
        assert store.layout("shared") == (PARTITIONED, ["shard"])  # NOT NULL columns stay NOT NULL
        assert store.version("shared") == writer.version("shared")
    assert _comparable_history(reader, "shared") == _comparable_history(writer, "shared")
    assert {h["metadata"]["sweeper.engine"] for h in reader.history("shared")} == {writer.engine}

    # The reader appends to the writer's table; the writer reads it back.
    later = _rows_with_shard(4, "r3", start=200)
    result = reader.append("shared", spark.createDataFrame(later, PARTITIONED), commit_metadata={"stage": "emit"})
    assert result.rows == 4 and result.version == writer.version("shared")
    assert canon(records(writer), columns) == canon(expected + later, columns)
    assert _comparable_history(writer, "shared") == _comparable_history(reader, "shared")
    assert writer.history("shared")[0]["metadata"]["sweeper.engine"] == reader.engine
    # And any Delta reader agrees.
    independent = DeltaTable(writer.path("shared"),
                             storage_options=writer._storage_options or None).to_pyarrow_table().to_pylist()
    assert canon(independent, columns) == canon(expected + later, columns)


@pytest.mark.parametrize("writer_engine", ["delta-rs", "delta-spark"])
def test_a_table_written_by_one_engine_is_read_by_the_other(spark: SparkSession, tmp_path: Path,
                                                            writer_engine: str) -> None:
    root = str(tmp_path / "tables")
    writer = open_table_store(root, spark, engine=writer_engine)
    reader = open_table_store(root, spark, engine=OTHER[writer_engine])
    _check_both_ways(spark, writer, reader)


@pytest.mark.parametrize("writer_engine", ["delta-rs", "delta-spark"])
def test_tables_on_s3_with_either_engine(spark: SparkSession, s3_server: S3ServerInfo, writer_engine: str) -> None:
    bucket = _bucket(s3_server, f"tables-{writer_engine}")
    root = f"s3://{bucket}/ledger-sweeper/tables"
    writer = open_table_store(root, spark, engine=writer_engine, s3_endpoint=s3_server.endpoint)
    reader = open_table_store(root, spark, engine=OTHER[writer_engine], s3_endpoint=s3_server.endpoint)
    assert "sandbox" not in repr(writer) and "sandbox" not in repr(reader)  # no key in logs
    result = writer.append("runs", big_frame(spark, 300, 3, "r"), SCHEMA, commit_metadata={"stage": "snapshot"})
    assert result.rows == 300 and writer.read("runs").count() == 300
    _check_both_ways(spark, writer, reader)
    # Everything is in the bucket, under the prefix; nothing on the local disk.
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_server.endpoint, aws_access_key_id="sandbox",
                                           aws_secret_access_key="sandbox", region_name="us-east-1")
            .list_objects_v2(Bucket=bucket)["Contents"]]
    assert {k.split("/")[2] for k in keys} == {"runs", "shared"}
    assert all(k.startswith("ledger-sweeper/tables/") for k in keys)


_WRITER = textwrap.dedent("""
    import json, sys
    from sweeper.tables.delta_rs import DeltaRsTableStore
    from tests.support.tables import SCHEMA, sample_rows
    root, who, commits, options = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    store = DeltaRsTableStore(root, None, options)  # driver-side commits need no Spark session
    versions = [store.append_rows("shared", sample_rows(2, run_id=f"{who}-{i}"), SCHEMA,
                                  commit_metadata={"writer": who}).version for i in range(commits)]
    print(json.dumps(versions))
""")


def test_two_writers_on_s3_lose_no_commit(s3_server: S3ServerInfo, tmp_path: Path) -> None:
    """Two processes commit to one table on S3 at once (delta-rs: conditional PUT of each commit)."""
    bucket = _bucket(s3_server, "concurrent-writers")
    root = f"s3://{bucket}/tables"
    options = delta_rs_options(TableStorage(root, s3_server.endpoint))
    assert options["aws_conditional_put"] == "etag"
    commits = 8
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, root, who, str(commits), json.dumps(options)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
               for who in ("a", "b")]
    outputs = [w.communicate(timeout=540) for w in writers]
    for writer, (_, err) in zip(writers, outputs, strict=True):
        assert writer.returncode == 0, err[-3000:]
    reported = [v for out, _ in outputs for v in json.loads(out.strip().splitlines()[-1])]
    table = DeltaTable(f"{root}/shared", storage_options=options)
    # Every commit has its own version (one of them also created the table), and every row is there.
    assert sorted(reported) == list(range(2 * commits)) and table.version() == 2 * commits - 1
    run_ids = table.to_pyarrow_table().column("run_id").to_pylist()
    assert sorted(set(run_ids)) == sorted(f"{w}-{i}" for w in "ab" for i in range(commits))
    assert len(run_ids) == 2 * 2 * commits


_NO_JARS = textwrap.dedent("""
    import sys
    from sweeper.cli import main
    codes = [main(["snapshot", "--config", path]) for path in sys.argv[1:]]
    print("codes", *codes)
""")


@pytest.mark.integration  # the CLI and its Spark in a process
def test_missing_jars_are_named_not_a_java_stack_trace(tmp_path: Path) -> None:
    """A session without the fetched jars (SWEEPER_JARS_DIR points at nothing): engine delta-spark,
    then a table root on S3, each refused with exit 2 and a message naming the jar to fetch."""
    configs = []
    for name, tables in (("delta.toml", 'root = "var/tables"\nengine = "delta-spark"'),
                         ("s3.toml", 'root = "s3://some-bucket/tables"\nengine = "delta-rs"')):
        path = tmp_path / name
        path.write_text(f'[bookkeeper]\nzookeeper = "127.0.0.1:1"\n[pulsar]\ncluster_name = "sandbox"\n'
                        f'[tables]\n{tables}\n')
        configs.append(str(path))
    env = {**os.environ, "PYTHONPATH": str(REPO), "SWEEPER_JARS_DIR": str(tmp_path / "no-jars")}
    done = subprocess.run([sys.executable, "-c", _NO_JARS, *configs], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "codes 2 2"
    errors = [line for line in done.stderr.splitlines() if line.startswith("configuration error:")]
    assert len(errors) == 2, done.stderr[-3000:]
    assert "delta-spark_2.13" in errors[0] and "mvn -f jvm/pom.xml package" in errors[0]
    assert "hadoop-aws-3.5.0.jar" in errors[1] and "bundle-2.35.4.jar" in errors[1]
    assert "Traceback" not in done.stderr and "\tat org." not in done.stderr
