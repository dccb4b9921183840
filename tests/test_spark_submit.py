"""spark-submit.sh as an operator runs it: our code shipped as a zip, a stage run by real spark-submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.sandbox import PORT_SPAN, sandbox_down
from harness.zkserver import free_port_block
from tests.support.config import SHORT_LIVED_JVM

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def _build_zip(out: Path) -> None:
    subprocess.run([sys.executable, str(REPO / "scripts" / "build_pyfiles.py"), str(out)], check=True,
                   capture_output=True)


@pytest.mark.integration  # builds the zip and runs a fresh interpreter
def test_the_zip_alone_is_enough_for_executors_to_encode_and_decode_records(tmp_path: Path) -> None:
    shipped = tmp_path / "ledger_sweeper.zip"
    _build_zip(shipped)
    names = set(zipfile.ZipFile(shipped).namelist())
    assert {"sweeper/__init__.py", "sweeper/delete/stage.py", "sweeper/jobs/sweep.py",
            "sweeper/resources/pending_delete_ledger_info.avsc"} <= names
    assert not any("__pycache__" in n for n in names) and {n.split("/")[0] for n in names} == {"sweeper"}
    # A fresh interpreter with the zip first on its path by a relative name, as an executor sees
    # --py-files (./ledger_sweeper.zip in its work directory): the package and its Avro schema must
    # come from the zip, not from this checkout.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import sweeper.codecs.pending_delete as pd\n"
        "assert pd.__file__.startswith(sys.argv[1]), pd.__file__\n"
        "import sweeper.resources as r\n"
        "assert r.__file__.startswith(sys.argv[1]), r.__file__\n"
        "record = {'topicName': 'persistent://t/n/x', 'ledgerComponent': 'MANAGED_LEDGER',\n"
        "          'ledgerType': 'LEDGER', 'ledgerId': 7, 'cursorName': None, 'schemaId': None,\n"
        "          'offloadContext': None, 'properties': {}, 'reason': 'r', 'runId': 'x'}\n"
        "assert pd.decode(pd.encode(record)) == record\n"
        "print(pd.schema()['name'])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, "./ledger_sweeper.zip"], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    assert "PendingDeleteLedgerInfo" in done.stdout


@pytest.mark.slow  # a sandbox and a sweep under real spark-submit
def test_spark_submit_runs_a_sandbox_sweep_and_reports_exit_codes(tmp_path: Path) -> None:
    # Without the fetched jars: the delta-rs engine under spark-submit (tests/test_cluster.py runs delta-spark).
    env = {**os.environ, "SPARK_MASTER": "local[2]", "DELTA_JARS": "", "S3A_JARS": "",
           "SPARK_SUBMIT": str(VENV_BIN / "spark-submit"), "PYSPARK_PYTHON": sys.executable,
           "SWEEPER_BUILD_DIR": str(tmp_path / "build"),
           "SPARK_EXTRA_ARGS": f"--conf spark.driver.extraJavaOptions={SHORT_LIVED_JVM}"}
    submit = [str(REPO / "spark-submit.sh")]

    unknown = subprocess.run([*submit, "no-such-stage"], env=env, capture_output=True, text=True)
    assert unknown.returncode == 2 and "no such stage" in unknown.stderr

    home, port = tmp_path / "sandbox", free_port_block(PORT_SPAN)
    try:
        done = subprocess.run(
            [*submit, "sweep", "--sandbox", "--config", str(REPO / "conf" / "local.toml"), "--home", str(home),
             "--port", str(port), "--tables", str(tmp_path / "tables"), "--topics", "40", "--json",
             "--execute"],
            env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        manifest = json.loads((home / "manifest.json").read_text())
        orphans = sum(1 for v in manifest["not_in_use"].values() if v["status"] == "orphan")
        assert summary["stages"]["reconcile"]["candidate.ledger"] == orphans
        assert summary["stages"]["emit"]["published"] == summary["stages"]["reconcile"]["candidate"]
        assert summary["stages"]["delete"]["deleted"] == summary["stages"]["reconcile"]["candidate"]
        assert (tmp_path / "build" / "ledger_sweeper.zip").exists()
    finally:
        sandbox_down(home, wipe=True)
