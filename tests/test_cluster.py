"""The scheduled-job path for real: spark-submit.sh on a multi-process Spark standalone cluster.

A master and two workers from pyspark's own launch classes (harness.spark_standalone), each
executor its own JVM with its own Python workers, temporary directory and scratch space; the
driver is spark-submit in client mode with its own working directory. The tables live on the
sandbox's S3 (moto), reached by delta-spark through s3a (what `engine = "auto"` picks under
spark-submit with the fetched jars) and by the executors' pyarrow/boto3 with credentials from
their own environment, never from the config. A task that wrote a local file for the driver to
read, or state kept in the driver's Python process, fails here where `local[*]` hides it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from deltalake import DeltaTable

from harness.sandbox import PORT_SPAN, SandboxSpec, build_cluster, s3_endpoint, sandbox_down
from harness.spark_standalone import StandaloneCluster, start_cluster, stop_cluster
from harness.zkserver import free_port_block
from sweeper.codecs.layout import LedgerLayout, ledger_path
from sweeper.zk import client as zkutil
from tests.support.config import SHORT_LIVED_JVM

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
TABLE_BUCKET = "sweeper-tables"
# Any key works against moto; what matters is where it comes from: the environment of the driver
# and of every worker (so of every executor), as an instance role or a pod's secret would on a cluster.
AWS_ENV = {"AWS_ACCESS_KEY_ID": "cluster-test", "AWS_SECRET_ACCESS_KEY": "cluster-test-secret",
           "AWS_REGION": "us-east-1"}
STAGES = ("snapshot", "reconcile", "retention_debt", "emit", "delete", "reclaim")  # retention debt too; reclaim after
# an executed delete (issue 35: the sandbox's bookies are names without servers, so it reports them not_measured)

# Minutes: a master, two workers and spark-submit, each its own JVM.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("spark-standalone"), workers=2, cores=1, memory="1g",
                            env={**AWS_ENV, "PYTHONPATH": ""})
    yield cluster
    stop_cluster(cluster)


def _config(tmp_path: Path) -> Path:
    text = (REPO / "conf" / "local.toml").read_text()
    text = text.replace('root = "var/tables"', f'root = "s3://{TABLE_BUCKET}/ledger-sweeper/tables"')
    assert TABLE_BUCKET in text
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def _leftover_data_files(work_dir: Path) -> list[str]:
    """Files an executor left in its own disk space other than Spark's bookkeeping and logs."""
    ours = (".parquet", ".json", ".avro", ".crc", ".arrow")
    return [str(p) for p in work_dir.rglob("*") if p.is_file() and p.name.endswith(ours)
            and "blockmgr-" not in str(p)]


@pytest.mark.timeout(1800)
def test_sandbox_sweep_on_a_standalone_cluster_with_tables_on_s3(spark_cluster: StandaloneCluster,
                                                                  tmp_path: Path) -> None:
    home, driver_dir = tmp_path / "sandbox", tmp_path / "driver"
    driver_dir.mkdir()
    env = {**os.environ, **AWS_ENV, "SPARK_MASTER": spark_cluster.master_url,
           "SPARK_SUBMIT": str(VENV_BIN / "spark-submit"), "PYSPARK_PYTHON": sys.executable,
           "SWEEPER_BUILD_DIR": str(tmp_path / "build"), "PYTHONPATH": "", "TMPDIR": str(driver_dir),
           "SPARK_EXTRA_ARGS": "--conf spark.executor.memory=768m --conf spark.driver.memory=1g "
                               "--conf spark.ui.enabled=false --conf spark.executor.cores=1 "
                               f"--conf spark.driver.extraJavaOptions={SHORT_LIVED_JVM} "
                               f"--conf spark.executor.extraJavaOptions={SHORT_LIVED_JVM}"}
    port = free_port_block(PORT_SPAN)
    try:
        done = subprocess.run(
            [str(REPO / "spark-submit.sh"), "sweep", "--sandbox", "--config", str(_config(tmp_path)),
             "--home", str(home), "--port", str(port), "--topics", "40", "--json", "--execute"],
            env=env, cwd=driver_dir, capture_output=True, text=True, timeout=1700)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        run_id, stages = summary["run_id"], summary["stages"]

        # Deletes == the sandbox's ground truth, checked in ZooKeeper itself.
        manifest = json.loads((home / "manifest.json").read_text())
        orphans = {int(k) for k, v in manifest["not_in_use"].items() if v["status"] == "orphan"}
        assert stages["reconcile"]["candidate.ledger"] == len(orphans)
        assert stages["emit"]["published"] == stages["reconcile"]["candidate"]
        assert stages["delete"]["deleted"] == len(orphans) and stages["delete"]["queued_for_retry"] == 0
        spec = SandboxSpec(**{**manifest["spec"], "layout": LedgerLayout(manifest["spec"]["layout"])})
        model = build_cluster(spec)
        client = zkutil.connect(f"127.0.0.1:{port}")
        try:
            present = {i for i in model.ledgers if client.exists(ledger_path(spec.ledgers_root, i, spec.layout))}
        finally:
            zkutil.close(client)
        assert present == set(model.ledgers) - orphans

        # The runs table, on S3, read with another engine (delta-rs) than the one that wrote it.
        endpoint = s3_endpoint(home)
        options = {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", **AWS_ENV}
        runs = DeltaTable(f"s3://{TABLE_BUCKET}/ledger-sweeper/tables/runs", storage_options=options)
        rows = [r for r in runs.to_pyarrow_table().to_pylist() if r["run_id"] == run_id]
        assert sorted(r["stage"] for r in rows) == sorted(STAGES)
        for row in rows:
            assert row["status"] == "succeeded", row
            assert row["engine"] == "delta-spark"  # auto under spark-submit with the fetched jars
            assert row["finished_at"] >= row["started_at"] and row["duration_s"] >= 0
            assert row["counts"] and row["config_hash"]
        by_stage = {r["stage"]: dict(r["counts"]) for r in rows}
        assert by_stage["delete"]["deleted"] == len(orphans)
        assert by_stage["snapshot"]["bk_ledgers"] == manifest["counts"]["bk_ledgers"]

        # Every table is on S3; nothing landed in the driver's working directory.
        keys = {o["Key"] for page in boto3.client("s3", endpoint_url=endpoint, **_boto_keys()).get_paginator(
            "list_objects_v2").paginate(Bucket=TABLE_BUCKET) for o in page.get("Contents", [])}
        tables = {k.split("/")[2] for k in keys if "/_delta_log/" in k}
        assert {"bk_ledgers", "ml_ledgers", "orphans", "emitted", "delete_results", "runs"} <= tables
        assert not [p for p in driver_dir.rglob("*") if p.is_file() and "_delta_log" in str(p)]

        # Both workers ran executors of this application, and those left no data files behind:
        # whatever the driver committed, the executors had put on S3.
        for worker in spark_cluster.workers:
            apps = list(Path(worker.work_dir).glob("app-*/*/stderr"))
            assert apps, f"{worker.name} ran no executor"
            assert _leftover_data_files(Path(worker.work_dir)) == []
    finally:
        sandbox_down(home, wipe=True)


def _boto_keys() -> dict[str, str]:
    return {"aws_access_key_id": AWS_ENV["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": AWS_ENV["AWS_SECRET_ACCESS_KEY"], "region_name": AWS_ENV["AWS_REGION"]}
