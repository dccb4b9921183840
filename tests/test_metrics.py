"""Metrics: PIP-186's counters in Prometheus' text format, to a textfile and to a real HTTP endpoint."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from harness.zkserver import free_port
from sweeper.config import ConfigError, MetricsConfig
from sweeper.metrics import MetricsError, publish, render
from tests.support.config import BASE_CONFIG

STAGES = {"snapshot": {"seconds": 3.5, "pending_deletes": 7}, "reconcile": {"seconds": 1, "candidate": 12,
                                                                            "pulsar_ledgers": 100},
          "emit": {"seconds": 0.5, "published": 12}, "delete": {"seconds": 2, "dead_lettered": 1}}
OUTCOMES = [("LEDGER", "deleted")] * 9 + [("OFFLOAD_LEDGER", "deleted"), ("LEDGER", "in_use"), ("LEDGER", "failed")]


def test_render_has_pip186_counters_per_ledger_type() -> None:
    text = render("r-1", STAGES, OUTCOMES, finished_at_s=1700000000.5)
    lines = set(text.splitlines())
    assert "ledger_sweeper_pending_deletes_sent 12" in lines
    assert "ledger_sweeper_pending_deletes_received 7" in lines
    assert 'ledger_sweeper_deleted{ledger_type="LEDGER"} 9' in lines
    assert 'ledger_sweeper_deleted{ledger_type="OFFLOAD_LEDGER"} 1' in lines
    assert 'ledger_sweeper_acked{ledger_type="LEDGER"} 10' in lines  # deleted + in_use: both final
    assert 'ledger_sweeper_failed{ledger_type="LEDGER"} 1' in lines
    assert "ledger_sweeper_dead_lettered 1" in lines
    assert 'ledger_sweeper_stage_seconds{stage="snapshot"} 3.5' in lines
    assert "ledger_sweeper_last_run_timestamp_seconds 1700000000.5" in lines
    # Every sample has HELP and TYPE, as the text format asks.
    names = {line.split("{")[0].split(" ")[0] for line in lines if line and not line.startswith("#")}
    assert all(f"# TYPE {n} gauge" in lines for n in names)


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
    text = render("r-2", STAGES, OUTCOMES)
    target = tmp_path / "textfile" / "ledger_sweeper.prom"
    done = publish(text, MetricsConfig(textfile=str(target), pushgateway_url=pushgateway, job="sweeper"))
    assert target.read_text() == text and len(done) == 2
    path, body = _Sink.received[-1]
    assert path == "/metrics/job/sweeper" and body.decode() == text
    with pytest.raises(MetricsError, match="unreachable"):
        publish(text, MetricsConfig(pushgateway_url=f"http://127.0.0.1:{free_port()}"))


def test_metrics_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="pushgateway_url"):
        BASE_CONFIG.replace(metrics={"pushgateway_url": "pushgateway:9091"})
