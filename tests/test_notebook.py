"""notebooks/audit.ipynb runs top to bottom on a fresh sandbox (through `sweeper audit`), so it cannot rot."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest

from harness.sandbox import PORT_SPAN, sandbox_down
from harness.zkserver import free_port_block
from sweeper.cli import EXIT_OK, main
from tests.support.config import SHORT_LIVED_SPARK_ENV

REPO = Path(__file__).resolve().parents[1]

# A sandbox, a sweep and the notebook's own kernel with its own Spark.
pytestmark = pytest.mark.slow


def test_audit_notebook_executes_and_plots(tmp_path: Path) -> None:
    home = tmp_path / "sandbox"
    env = {"SWEEPER_SANDBOX_HOME": str(home), "SWEEPER_SANDBOX_PORT": str(free_port_block(PORT_SPAN)),
           "SWEEPER_TOPICS": "40", "PYSPARK_PYTHON": sys.executable, **SHORT_LIVED_SPARK_ENV}
    # `sweeper audit` sets the others for the kernel; all are restored afterwards.
    saved = {k: os.environ.get(k) for k in (*env, "SWEEPER_REPO", "SWEEPER_CONFIG", "SWEEPER_TABLES")}
    os.environ.update(env)
    os.environ.pop("SWEEPER_CONFIG", None)
    out = tmp_path / "reports" / "audit.ipynb"
    try:
        assert main(["audit", "--out", str(out), "--tables", str(tmp_path / "tables")]) == EXIT_OK
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sandbox_down(home, wipe=True)
    notebook = nbformat.read(out, as_version=4)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 5  # bytes by namespace, ages, reasons, bytes by cause, trend
    text = "".join(o.get("text", "") for o in outputs)
    assert "candidates" in text and "GiB reclaimable" in text
    assert "reclaimable by cause: orphans" in text and "pinned by idle cursors" in text
