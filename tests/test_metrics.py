"""Metrics: PIP-186's counters in Prometheus' text format, to a textfile and to a real HTTP endpoint."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from harness.zkserver import free_port
from sweeper.config import MetricsConfig
from sweeper.errors import ConfigError
from sweeper.report.errors import MetricsError
from sweeper.report.metrics import publish, registry, render
from tests.support.config import BASE_CONFIG

STAGES = {"snapshot": {"seconds": 3.5, "pending_deletes": 7}, "reconcile": {"seconds": 1, "candidate": 12,
                                                                            "pulsar_ledgers": 100},
          "emit": {"seconds": 0.5, "published": 12}, "delete": {"seconds": 2, "dead_lettered": 1}}
OUTCOMES = [("LEDGER", "deleted")] * 9 + [("OFFLOAD_LEDGER", "deleted"), ("LEDGER", "in_use"), ("LEDGER", "failed")]


def samples(text: str) -> dict[str, float]:
    """Every sample of an exposition text, read with prometheus_client's own parser: `name{k="v",...}` -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def test_render_has_pip186_counters_per_ledger_type() -> None:
    text = render("r-1", STAGES, OUTCOMES, finished_at_s=1700000000.5)
    values = samples(text)
    assert values["ledger_sweeper_pending_deletes_sent"] == 12
    assert values["ledger_sweeper_pending_deletes_received"] == 7
    assert values['ledger_sweeper_deleted{ledger_type="LEDGER"}'] == 9
    assert values['ledger_sweeper_deleted{ledger_type="OFFLOAD_LEDGER"}'] == 1
    assert values['ledger_sweeper_acked{ledger_type="LEDGER"}'] == 10  # deleted + in_use: both final
    assert values['ledger_sweeper_failed{ledger_type="LEDGER"}'] == 1
    assert values["ledger_sweeper_dead_lettered"] == 1
    assert values['ledger_sweeper_stage_seconds{stage="snapshot"}'] == 3.5
    assert values["ledger_sweeper_last_run_timestamp_seconds"] == 1700000000.5
    assert values['ledger_sweeper_run_info{run_id="r-1",status="succeeded"}'] == 1
    # Every sample has HELP and TYPE, as the text format asks.
    lines = set(text.splitlines())
    names = {line.split("{")[0].split(" ")[0] for line in lines if line and not line.startswith("#")}
    assert all(f"# TYPE {n} gauge" in lines and any(x.startswith(f"# HELP {n} ") for x in lines) for n in names)


def test_label_values_are_escaped() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    odd = 'r"1\\\n2'
    text = render(odd, {})
    [info] = [f for f in text_string_to_metric_families(text) if f.name == "ledger_sweeper_run_info"]
    assert info.samples[0].labels["run_id"] == odd  # quoted, escaped and read back whole


class _Sink(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, bytes]]] = []

    def do_PUT(self) -> None:
        self.received.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def pushgateway() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_textfile_and_pushgateway(tmp_path: Path, pushgateway: str) -> None:
    metrics = registry("r-2", STAGES, OUTCOMES)
    text = render("r-2", STAGES, OUTCOMES)
    target = tmp_path / "textfile" / "ledger_sweeper.prom"
    done = publish(metrics, MetricsConfig(textfile=str(target), pushgateway_url=pushgateway, job="sweeper"))
    assert target.read_text() == text and len(done) == 2
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # the temporary file was renamed
    path, body = _Sink.received[-1]
    assert path == "/metrics/job/sweeper" and body.decode() == text
    with pytest.raises(MetricsError, match="unreachable"):
        publish(metrics, MetricsConfig(pushgateway_url=f"http://127.0.0.1:{free_port()}"))


def test_metrics_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="pushgateway_url"):
        BASE_CONFIG.replace(metrics={"pushgateway_url": "pushgateway:9091"})
