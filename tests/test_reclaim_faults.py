"""Issue 44: one bookie never fails the run, nor spoils another's figures.

Two bookies hold a run's deleted data (tests/support/bookie_server.py, as loopback HTTP servers, registered in a real
ZooKeeper): one behaves, the other misbehaves in each way a real one can, before the delete (its baseline) or after
it. Each time the step ends without an error, the misbehaving bookie is `not_measured` with why (or measured, where
what it serves is fine), and the good bookie's row is what it would be alone. A bookie that drips its answer is cut
off by the call's deadline, not after the whole drip. The last test runs `sweeper reclaim` itself: exit 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from sweeper.pipeline import reclaim_stage
from sweeper.reclaim.decide import FREED, NOT_MEASURED
from sweeper.reclaim.stage import sample_before
from sweeper.tables.delta_rs import DeltaRsTableStore
from tests.support.bookie_server import METRICS, BookieHttpServer, BookieState
from tests.support.config import ZkTarget
from tests.support.tls_certs import make_tls_files
from tests.test_reclaim_stage import MIB, RUN, config_for, register, seed_deleted

GOOD, BAD = "bk-good", "bk-bad"


@pytest.fixture
def store(tmp_path: Path) -> DeltaRsTableStore:
    return DeltaRsTableStore(str(tmp_path / "tables"), None)  # type: ignore[arg-type] - driver commits need no Spark


@pytest.fixture
def good() -> Iterator[BookieHttpServer]:
    with BookieHttpServer(BookieState(bookie_id=GOOD), gc_duration_s=0.05) as server:
        yield server


def _delete_happened(*servers: BookieHttpServer) -> None:
    for server in servers:
        with server.lock:  # the next GC finds the ledger gone and its logs whole
            server.state.pending_deleted_ledgers = 1
            server.state.pending_deletion_bytes = 4 * MIB


def _good_row_alone(rows: list[dict[str, Any]]) -> None:
    [row] = [r for r in rows if r["target"] == GOOD]
    assert (row["verdict"], row["freed_bytes"], row["expected_bytes"]) == (FREED, 4 * MIB, 4 * MIB), row


def _broken(server: BookieHttpServer, fault: str) -> None:
    if fault == "garbage":
        server.raw_for[METRICS] = b"HELLO THERE\r\n\r\n"  # not an HTTP status line: http.client's BadStatusLine
    elif fault == "truncated":
        server.raw_for[METRICS] = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n# TYPE bookie_X counter\n"
    elif fault == "ten_mb":
        server.metrics_padding = 10 * MIB
    elif fault == "inf":
        server.metrics_extra = ("# TYPE bookie_DELETED_LEDGER_TOTAL counter\n"
                                'bookie_DELETED_LEDGER_TOTAL{indexDir="/x",ledgerDir="/x"} +Inf\n')
    elif fault == "drip":
        server.drip_for[METRICS] = 0.5  # a byte every half second: each read is in time, the answer never is
    elif fault == "not_json":
        server.status_for["/api/v1/bookie/info"] = (200, "<html>maintenance</html>")


FAULTS = ("garbage", "truncated", "ten_mb", "inf", "drip", "not_json")


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("fault", FAULTS)
def test_a_misbehaving_bookie_is_not_measured_and_the_other_is_unaffected(
        zk: KazooClient, zk_target: ZkTarget, tmp_path: Path, store: DeltaRsTableStore, good: BookieHttpServer,
        fault: str, when: str) -> None:
    with BookieHttpServer(BookieState(bookie_id=BAD), gc_duration_s=0.05) as bad:
        register(zk, GOOD, good.url)
        register(zk, BAD, bad.url)
        config = config_for(zk_target, tmp_path / "tables", trigger_gc=True, timeout_s=2.0)
        seed_deleted(store, {1: 4 * MIB}, bookies=(GOOD, BAD))
        if when == "before":
            _broken(bad, fault)
        started = time.monotonic()
        assert sample_before(config, store, RUN) == (1 if when == "before" else 2)
        _delete_happened(good, bad)
        if when == "after":
            _broken(bad, fault)
        result = reclaim_stage(config, store, RUN, trigger=True)
        took = time.monotonic() - started
        rows = {r["target"]: r for r in result.rows}
        assert rows[BAD]["verdict"] == NOT_MEASURED and rows[BAD]["why"], rows[BAD]
        print(f"[{fault}, {when}] {took:.1f}s: {rows[BAD]['why']}")
        _good_row_alone(result.rows)
        assert took < 30, took  # the drip is cut off by timeout_s (2 s a call), not waited out
        assert result.counts.not_measured == 1


def test_a_bookie_that_hangs_is_not_waited_on_past_the_calls_deadline(
        zk: KazooClient, zk_target: ZkTarget, tmp_path: Path, store: DeltaRsTableStore, good: BookieHttpServer) -> None:
    with BookieHttpServer(BookieState(bookie_id=BAD), gc_duration_s=0.05) as bad:
        register(zk, GOOD, good.url)
        register(zk, BAD, bad.url)
        config = config_for(zk_target, tmp_path / "tables", timeout_s=1.0)
        seed_deleted(store, {1: 4 * MIB}, bookies=(GOOD, BAD))
        sample_before(config, store, RUN)
        bad.delay_s = 60.0  # accepts, reads the request, answers nothing for a minute
        _delete_happened(good)
        started = time.monotonic()
        rows = {r["target"]: r for r in reclaim_stage(config.replace(reclaim={"trigger_gc": False}), store, RUN).rows}
        assert time.monotonic() - started < 20
        assert rows[BAD]["verdict"] == NOT_MEASURED and "timed out" in rows[BAD]["why"].lower(), rows[BAD]
        bad.delay_s = 0.0


def test_the_whole_step_has_a_deadline(zk: KazooClient, zk_target: ZkTarget, tmp_path: Path,
                                       store: DeltaRsTableStore, good: BookieHttpServer) -> None:
    register(zk, GOOD, good.url)
    config = config_for(zk_target, tmp_path / "tables", deadline_s=0.001)
    seed_deleted(store, {1: 4 * MIB}, bookies=(GOOD,))
    sample_before(config.replace(reclaim={"deadline_s": 60.0}), store, RUN)
    time.sleep(0.01)
    [row] = reclaim_stage(config, store, RUN).rows
    assert row["verdict"] == NOT_MEASURED and "deadline_s" in row["why"]


def test_https_with_a_private_ca_is_measured(zk: KazooClient, zk_target: ZkTarget, tmp_path: Path,
                                             store: DeltaRsTableStore) -> None:
    tls = make_tls_files(tmp_path / "tls", ("localhost", "127.0.0.1"))
    with BookieHttpServer(BookieState(bookie_id=BAD), gc_duration_s=0.05, tls=(str(tls.cert), str(tls.key))) as bad:
        # What BookKeeper registers with httpServerTlsEnable: "http" all the same (HttpService.publishInfo).
        register(zk, BAD, bad.url.replace("https://", "http://"))
        seed_deleted(store, {1: 4 * MIB}, bookies=(BAD,))
        plain = config_for(zk_target, tmp_path / "tables", trigger_gc=True, timeout_s=2.0)
        secured = plain.replace(reclaim={"http_scheme": "https", "tls_ca_file": str(tls.ca)})
        assert sample_before(secured, store, RUN) == 1
        _delete_happened(bad)
        [row] = reclaim_stage(secured, store, RUN, trigger=True).rows
        assert row["url"].startswith("https://") and row["verdict"] == FREED, row
        # Without the CA the certificate is refused: not measured, and said.
        [row] = reclaim_stage(plain.replace(reclaim={"http_scheme": "https"}), store, RUN).rows
        assert row["verdict"] == NOT_MEASURED and "certificate" in row["why"].lower(), row


def test_sweeper_reclaim_exits_0_whatever_a_bookie_answers(zk: KazooClient, zk_target: ZkTarget, tmp_path: Path,
                                                           store: DeltaRsTableStore, good: BookieHttpServer,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from datetime import UTC, datetime

    from sweeper import runs
    from sweeper.cli import EXIT_OK, main
    from sweeper.config import to_toml

    with BookieHttpServer(BookieState(bookie_id=BAD), gc_duration_s=0.05) as bad:
        register(zk, GOOD, good.url)
        register(zk, BAD, bad.url)
        config = config_for(zk_target, tmp_path / "tables", timeout_s=2.0)
        seed_deleted(store, {1: 4 * MIB}, bookies=(GOOD, BAD))
        runs.record(store, RUN, "delete", runs.SUCCEEDED, datetime.now(UTC), {}, config)
        sample_before(config, store, RUN)
        _delete_happened(good, bad)
        _broken(bad, "inf")
        path = tmp_path / "sweeper.toml"
        path.write_text(to_toml(config))
        capsys.readouterr()
        assert main(["reclaim", "--run-id", RUN, "--execute", "--config", str(path)]) == EXIT_OK
        out = capsys.readouterr()
        assert "Traceback" not in out.out + out.err and f"not measured on {BAD}" in out.out, out.out
