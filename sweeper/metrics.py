"""Run metrics in Prometheus' text format: PIP-186's counters plus each stage's counts and time.

Written as a node-exporter textfile (atomically: write a temporary file, then rename) and/or
pushed to a Pushgateway, as `[metrics]` says. Labels carry no secret and no topic name (those
belong in the tables, not in a metrics system's cardinality).
"""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sweeper.config import MetricsConfig

PREFIX = "ledger_sweeper"
LEDGER_TYPES = ("LEDGER", "OFFLOAD_LEDGER")


class MetricsError(RuntimeError):
    pass


def _line(name: str, value: float, labels: Mapping[str, str] | None = None) -> str:
    if labels:
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        return f"{PREFIX}_{name}{{{body}}} {_number(value)}"
    return f"{PREFIX}_{name} {_number(value)}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(run_id: str, stages: Mapping[str, Mapping[str, Any]], outcomes: Iterable[tuple[str | None, str]] = (),
           finished_at_s: float | None = None, status: str = "succeeded",
           reclaim: Iterable[Mapping[str, Any]] = ()) -> str:
    """The exposition text for one run. `outcomes` are (ledger_type, outcome) pairs of the delete stage; `reclaim`
    the run's `reclaim` rows (what each bookie and offload bucket gave back)."""
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[float, Mapping[str, str] | None]]) -> None:
        lines.append(f"# HELP {PREFIX}_{name} {help_text}")
        lines.append(f"# TYPE {PREFIX}_{name} {kind}")
        lines.extend(_line(name, value, labels) for value, labels in samples)

    emit = stages.get("emit", {})
    snapshot = stages.get("snapshot", {})
    reconcile = stages.get("reconcile", {})
    metric("pending_deletes_sent", "gauge", "Pending-delete records published to the system topic by this run.",
           [(emit.get("published", 0), None)])
    metric("pending_deletes_received", "gauge", "Pending-delete messages read from the system topic by the snapshot.",
           [(snapshot.get("pending_deletes", 0), None)])
    by_type = Counter(outcomes)
    for name, outcome_set, help_text in (
            ("deleted", ("deleted",), "Ledgers or offloaded copies deleted by this run."),
            ("failed", ("failed",), "Deletes that failed after the in-task retries (queued or dead-lettered)."),
            ("acked", ("deleted", "already_gone", "not_found", "in_use", "mismatch", "invalid"),
             "Records settled with a final outcome (PIP-186 acknowledges these)."),
    ):
        metric(name, "gauge", help_text,
               [(sum(by_type[(t, o)] for o in outcome_set), {"ledger_type": t}) for t in LEDGER_TYPES])
    delete = stages.get("delete", {})
    metric("dead_lettered", "gauge", "Records moved to the dead-letter table by this run.",
           [(delete.get("dead_lettered", 0), None)])
    metric("delete_outcomes", "gauge", "Delete results by outcome.",
           [(count, {"outcome": outcome}) for outcome, count in sorted(Counter(o for _, o in outcomes).items())])
    metric("orphan_candidates", "gauge", "Orphans the run found safe to delete (ledgers and offloaded objects).",
           [(reconcile.get("candidate", 0), None)])
    metric("pulsar_ledgers", "gauge", "Pulsar ledgers in the snapshot.", [(reconcile.get("pulsar_ledgers", 0), None)])
    metric("stage_seconds", "gauge", "Wall time of each stage.",
           [(float(v.get("seconds", 0)), {"stage": k}) for k, v in stages.items()])
    reclaimed = list(reclaim)
    if reclaimed:
        def per_target(column: str) -> list[tuple[float, Mapping[str, str] | None]]:
            return [(float(r.get(column) or 0), {"kind": str(r["target_kind"]), "target": str(r["target"])})
                    for r in reclaimed]

        metric("reclaim_expected_bytes", "gauge", "Bytes the run's deletes should give back, per bookie (its share "
               "by ensemble and write quorum) and offload bucket.", per_target("expected_bytes"))
        metric("reclaim_freed_bytes", "gauge", "Bytes given back after the run's deletes: the bookies' reclaim "
               "counters (deletion + compaction), the offloaded objects listed gone.", per_target("freed_bytes"))
        metric("reclaim_pending_bytes", "gauge", "Expected bytes not given back yet (waiting for GC or compaction).",
               per_target("pending_bytes"))
        metric("reclaim_verdict", "gauge", "1 for each target's verdict: freed, pending_compaction, pending_gc or "
               "not_measured.", [(1, {"kind": str(r["target_kind"]), "target": str(r["target"]),
                                      "verdict": str(r["verdict"])}) for r in reclaimed])
    metric("run_info", "gauge", "The run this file describes.", [(1, {"run_id": run_id, "status": status})])
    if finished_at_s is not None:
        metric("last_run_timestamp_seconds", "gauge", "When the run finished.", [(round(finished_at_s, 3), None)])
    return "\n".join(lines) + "\n"


def publish(text: str, cfg: MetricsConfig) -> list[str]:
    """Where the metrics went (paths and URLs); raises MetricsError when a configured target fails."""
    done: list[str] = []
    if cfg.textfile:
        target = Path(cfg.textfile)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Rename is atomic: a scraper never reads half a file.
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, target)
        done.append(str(target))
    if cfg.pushgateway_url:
        url = f"{cfg.pushgateway_url.rstrip('/')}/metrics/job/{cfg.job}"
        request = urllib.request.Request(url, data=text.encode(), method="PUT")
        request.add_header("Content-Type", "text/plain; version=0.0.4")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                if response.status >= 300:
                    raise MetricsError(f"pushgateway {url} answered HTTP {response.status}")
        except (urllib.error.URLError, OSError) as exc:
            raise MetricsError(f"pushgateway {url} unreachable: {getattr(exc, 'reason', exc)}") from exc
        done.append(url)
    return done
