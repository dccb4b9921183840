"""Run metrics in Prometheus' text format: PIP-186's counters, each stage's counts and time, and what the
bookies gave back.

Built in a prometheus_client registry (the ecosystem's: its escaping, HELP/TYPE lines and exposition), written
as a node-exporter textfile (`write_to_textfile`: a temporary file, then rename) and/or pushed to a Pushgateway
(`push_to_gateway`), as `[metrics]` says. Labels carry no secret and no topic name (those belong in the tables,
not in a metrics system's cardinality).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest, push_to_gateway, write_to_textfile

from sweeper.config import MetricsConfig
from sweeper.report.errors import MetricsError

PREFIX = "ledger_sweeper"
LEDGER_TYPES = ("LEDGER", "OFFLOAD_LEDGER")


def registry(run_id: str, stages: Mapping[str, Mapping[str, Any]], outcomes: Iterable[tuple[str | None, str]] = (),
             finished_at_s: float | None = None, status: str = "succeeded",
             reclaim: Iterable[Mapping[str, Any]] = ()) -> CollectorRegistry:
    """The run's metrics. `outcomes` are (ledger_type, outcome) pairs of the delete stage; `reclaim` the run's
    `reclaim` rows (what each bookie and offload bucket gave back)."""
    out = CollectorRegistry(auto_describe=True)

    def metric(name: str, help_text: str, samples: list[tuple[float, Mapping[str, str] | None]]) -> None:
        labels = sorted({k for _, ls in samples for k in (ls or {})})
        gauge = Gauge(f"{PREFIX}_{name}", help_text, labels, registry=out)
        for value, ls in samples:
            (gauge.labels(**ls) if labels else gauge).set(value)

    emit = stages.get("emit", {})
    snapshot = stages.get("snapshot", {})
    reconcile = stages.get("reconcile", {})
    metric("pending_deletes_sent", "Pending-delete records published to the system topic by this run.",
           [(emit.get("published", 0), None)])
    metric("pending_deletes_received", "Pending-delete messages read from the system topic by the snapshot.",
           [(snapshot.get("pending_deletes", 0), None)])
    by_type = Counter(outcomes)
    for name, outcome_set, help_text in (
            ("deleted", ("deleted",), "Ledgers or offloaded copies deleted by this run."),
            ("failed", ("failed",), "Deletes that failed after the in-task retries (queued or dead-lettered)."),
            ("acked", ("deleted", "already_gone", "not_found", "in_use", "mismatch", "invalid"),
             "Records settled with a final outcome (PIP-186 acknowledges these)."),
    ):
        metric(name, help_text,
               [(sum(by_type[(t, o)] for o in outcome_set), {"ledger_type": t}) for t in LEDGER_TYPES])
    delete = stages.get("delete", {})
    metric("dead_lettered", "Records moved to the dead-letter table by this run.",
           [(delete.get("dead_lettered", 0), None)])
    by_outcome = sorted(Counter(o for _, o in outcomes).items())
    if by_outcome:
        metric("delete_outcomes", "Delete results by outcome.",
               [(count, {"outcome": outcome}) for outcome, count in by_outcome])
    metric("orphan_candidates", "Orphans the run found safe to delete (ledgers and offloaded objects).",
           [(reconcile.get("candidate", 0), None)])
    metric("pulsar_ledgers", "Pulsar ledgers in the snapshot.", [(reconcile.get("pulsar_ledgers", 0), None)])
    if stages:
        metric("stage_seconds", "Wall time of each stage.",
               [(float(v.get("seconds", 0)), {"stage": k}) for k, v in stages.items()])
    reclaimed = list(reclaim)
    if reclaimed:
        def per_target(column: str) -> list[tuple[float, Mapping[str, str] | None]]:
            return [(float(r.get(column) or 0), {"kind": str(r["target_kind"]), "target": str(r["target"])})
                    for r in reclaimed]

        metric("reclaim_expected_bytes", "Bytes the run's deletes should give back, per bookie (its share by "
               "ensemble and write quorum) and offload bucket.", per_target("expected_bytes"))
        metric("reclaim_freed_bytes", "Bytes given back after the run's deletes: the bookies' reclaim counters "
               "(deletion + compaction), the offloaded objects listed gone.", per_target("freed_bytes"))
        metric("reclaim_pending_bytes", "Expected bytes not given back yet (waiting for GC or compaction).",
               per_target("pending_bytes"))
        metric("reclaim_freed_lower_bytes", "Of the bookie's freed bytes, what is provably this run's (0 when "
               "others' ledgers were collected in the same window, or it restarted).", per_target("freed_lower_bytes"))
        metric("reclaim_freed_upper_bytes", "Of the bookie's freed bytes, what could be this run's at most.",
               per_target("freed_upper_bytes"))
        metric("reclaim_verdict", "1 for each target's verdict: freed, pending_compaction, pending_gc, shared_window, "
               "restarted, unknown or not_measured.", [(1, {"kind": str(r["target_kind"]), "target": str(r["target"]),
                                      "verdict": str(r["verdict"])}) for r in reclaimed])
    metric("run_info", "The run this file describes.", [(1, {"run_id": run_id, "status": status})])
    if finished_at_s is not None:
        metric("last_run_timestamp_seconds", "When the run finished.", [(round(finished_at_s, 3), None)])
    return out


def render(*args: Any, **kwargs: Any) -> str:
    """The exposition text of `registry(...)`, as a textfile or a Pushgateway receives it."""
    return generate_latest(registry(*args, **kwargs)).decode()


def publish(metrics: CollectorRegistry, cfg: MetricsConfig) -> list[str]:
    """Where the metrics went (paths and URLs); raises MetricsError when a configured target fails."""
    done: list[str] = []
    if cfg.textfile:
        target = Path(cfg.textfile)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_to_textfile(str(target), metrics)  # a temporary file, then rename: a scraper never reads half
        except OSError as exc:
            raise MetricsError(f"metrics textfile {target} not written: {exc}") from exc
        done.append(str(target))
    if cfg.pushgateway_url:
        url = cfg.pushgateway_url.rstrip("/")
        try:
            push_to_gateway(url, job=cfg.job, registry=metrics, timeout=10)
        except OSError as exc:  # urllib's URLError and HTTPError are OSErrors
            raise MetricsError(f"pushgateway {url} unreachable or refused the push: {exc}") from exc
        done.append(f"{url}/metrics/job/{cfg.job}")
    return done
