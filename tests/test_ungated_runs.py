"""Issue 34 (4): `reconcile --skip-gates` is for audits only. Its run can be read, shown and audited; emit and delete
refuse it (exit 3, one line naming why and the fix), a second reconcile of the run is refused, and `sweep` has no
way to skip the gates (DESIGN invariant 19: what the gates never ran on is never emitted or deleted)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from pyspark.sql import SparkSession

from harness.sandbox.model import SandboxSpec, build_cluster
from harness.sandbox.seed import seed_zookeeper
from sweeper import runs
from sweeper.cli import EXIT_OK, EXIT_REFUSED, main
from sweeper.codecs.layout import ledger_path
from sweeper.reconcile.stage import CANDIDATE
from sweeper.tables import open_table_store
from tests.support.config import ZkTarget


def _row(status: str, counts: dict[str, int] | None = None) -> dict[str, Any]:
    return {"run_id": "r", "stage": "reconcile", "status": status, "counts": counts or {}}


def test_only_a_reconcile_whose_gates_passed_may_be_acted_on() -> None:
    gated, skipped = _row(runs.SUCCEEDED, {runs.GATES_PASSED: 1}), _row(runs.SUCCEEDED, {runs.GATES_PASSED: 0})
    assert runs.ungated("r", [gated]) is None
    assert runs.ungated("r", [_row(runs.REFUSED), gated]) is None  # a refused try before, then a gated one
    why = runs.ungated("r", [skipped])
    assert why is not None and "--skip-gates" in why and "new snapshot" in why and "\n" not in why
    assert runs.ungated("r", [_row(runs.SUCCEEDED)]) is not None  # no record that the gates passed
    assert runs.ungated("r", [gated, skipped]) is not None  # an ungated plan under the id taints the run
    assert runs.ungated("r", []) is not None


def test_a_run_reconciled_with_skip_gates_is_never_emitted_or_deleted(
        zk: KazooClient, zk_target: ZkTarget, spark: SparkSession, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cluster = build_cluster(SandboxSpec(seed=4, topics=10))
    seed_zookeeper(zk, cluster)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[bookkeeper]\nzookeeper = "{zk_target.hosts}"\n[tables]\nroot = "{tmp_path / "t"}"\n'
                   '[offload]\nenabled = false\n[safety]\nmax_orphan_fraction = 1.0\nbookkeeper_dedicated = true\n'
                   '[gates]\nrequire_live_brokers = false\n')
    config = ["--config", str(cfg), "--run-id", "audit-1"]
    assert main(["snapshot", *config]) == EXIT_OK
    assert main(["reconcile", *config, "--skip-gates"]) == EXIT_OK
    store = open_table_store(str(tmp_path / "t"), spark, engine="delta-rs")
    candidates = [r["ledger_id"] for r in store.read_arrow("orphans", where={"run_id": "audit-1"}).to_pylist()
                  if r["status"] == CANDIDATE and r["object_type"] == "ledger"]
    assert candidates, "the audit found nothing: the test would prove nothing"
    assert not runs.gates_passed(runs.rows(store, run_id="audit-1", stage="reconcile")[-1])

    def refused(command: list[str], *words: str) -> None:
        capsys.readouterr()
        assert main(command) == EXIT_REFUSED
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and all(w in err for w in words), err

    # A gated reconcile of the same run cannot put a second plan under its id (its orphans are the audit's).
    refused(["reconcile", *config], "already reconciled", "new snapshot")
    refused(["emit", *config], "--skip-gates", "audit", "new snapshot")
    refused(["emit", "--config", str(cfg)], "--skip-gates")  # the latest reconciled run is this one

    # An emit recorded anyway (by hand, another tool, a version before this rule): the delete asks again.
    runs.record(store, "audit-1", "emit", runs.SUCCEEDED, datetime.now(UTC), {}, None)
    refused(["delete", *config, "--execute"], "--skip-gates", "new snapshot")
    for ledger_id in candidates:
        assert zk.exists(ledger_path("/ledgers", ledger_id, cluster.spec.layout)), ledger_id
    statuses = [(r["stage"], r["status"]) for r in runs.rows(store, run_id="audit-1")]
    assert statuses == [("snapshot", runs.SUCCEEDED), ("reconcile", runs.SUCCEEDED), ("reconcile", runs.REFUSED),
                        ("emit", runs.REFUSED), ("emit", runs.REFUSED), ("emit", runs.SUCCEEDED),
                        ("delete", runs.REFUSED)], statuses

    # The sweep (the only command that goes on to emit and delete) has no way to skip the gates.
    with pytest.raises(SystemExit) as usage:
        main(["sweep", "--config", str(cfg), "--skip-gates", "--execute"])
    assert usage.value.code == 2
