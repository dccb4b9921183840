"""The bookie HTTP stand-in (tests/support/bookie_server.py) answers as BookKeeper 4.17.2's bookie does."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.bookie_server import (
    DEFAULT_LEDGER_DIR,
    GC,
    GC_DETAILS,
    METRIC_NAMES,
    BookieHttpServer,
    BookieState,
)

REAL_METRICS = Path(__file__).parent / "data" / "bookie_metrics_4.17.2.txt"
SAMPLE = re.compile(r'^(\w+)\{indexDir="([^"]*)",ledgerDir="([^"]*)"\} (\S+)$')


def call(url: str, method: str = "GET", body: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 5.0) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metrics(url: str) -> tuple[dict[str, str], dict[tuple[str, str], float]]:
    """(type per name, value per (name, ledgerDir)) of the bookie's own series."""
    status, text = call(url + "/metrics")
    assert status == 200
    types, values = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name not in types, f"two TYPE lines for {name}"
            types[name] = kind
        elif m := SAMPLE.match(line):
            values[(m[1], m[3])] = float(m[4])
    return types, values


def wait_idle(url: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while json.loads(call(url + GC)[1])["is_in_force_gc"] == "true":
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_endpoints_answer_as_the_bookie() -> None:
    state = BookieState(free_space=111, total_space=999)
    state.active_entry_log_bytes = 5000
    with BookieHttpServer(state) as bookie:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", bookie.url)
        status, body = call(bookie.url + "/api/v1/bookie/info")
        assert (status, json.loads(body)) == (200, {"freeSpace": 111, "totalSpace": 999})
        assert body == '{\n  "freeSpace" : 111,\n  "totalSpace" : 999\n}'  # Jackson's pretty printer
        details = json.loads(call(bookie.url + GC_DETAILS)[1])
        assert len(details) == 1 and set(details[0]) == {
            "forceCompacting", "majorCompacting", "minorCompacting", "lastMajorCompactionTime",
            "lastMinorCompactionTime", "majorCompactionCounter", "minorCompactionCounter",
            "entryLocationCompactionCounter", "lastEntryLocationCompactionTime"}
        assert json.loads(call(bookie.url + GC)[1]) == {"is_in_force_gc": "false"}
        assert json.loads(call(bookie.url + "/api/v1/bookie/gc/suspend_compaction")[1]) == {
            "isMajorGcSuspended": "false", "isMinorGcSuspended": "false"}
        types, values = metrics(bookie.url)
        assert types[METRIC_NAMES["reclaimed_deletion_bytes"]] == "counter"
        assert types[METRIC_NAMES["active_entry_log_bytes"]] == "gauge"
        assert values[(METRIC_NAMES["active_entry_log_bytes"], DEFAULT_LEDGER_DIR)] == 5000
        assert values[(METRIC_NAMES["major_compactions"], DEFAULT_LEDGER_DIR)] == 0
        assert call(bookie.url + "/api/v1/nothing")[0] == 404
        assert call(bookie.url + GC, "POST", b"{}")[0] == 405
        assert call(bookie.url + GC, "PATCH", b"{}")[0] == 405
        assert call(bookie.url + "/metrics", "PUT", b"")[0] == 403
        assert call(bookie.url + GC_DETAILS, "DELETE")[0] == 404


def test_a_triggered_gc_moves_the_counters_and_is_logged() -> None:
    state = BookieState(bookie_id="bk0test", free_space=1000)
    state.active_entry_log_bytes = 10_000
    state.pending_deletion_bytes, state.pending_compaction_bytes = 3000, 2000
    state.pending_compaction_needs_major = True
    state.pending_deleted_ledgers = 4
    with BookieHttpServer(state, gc_duration_s=0.3) as bookie:
        put = json.dumps({"forceMajor": False, "forceMinor": True}).encode()
        assert call(bookie.url + GC, "PUT", put) == (200, '"Triggered GC on BookieServer: bk0test"')
        assert json.loads(call(bookie.url + GC)[1]) == {"is_in_force_gc": "true"}
        assert json.loads(call(bookie.url + GC_DETAILS)[1])[0]["minorCompacting"] is True
        assert call(bookie.url + GC, "PUT", put)[0] == 200  # a no-op while the forced GC runs
        wait_idle(bookie.url)
        _, values = metrics(bookie.url)
        got = {attr: values[(name, DEFAULT_LEDGER_DIR)] for attr, name in METRIC_NAMES.items()}
        # Minor compaction ran but the dead bytes need a major one; the gauge lost every deleted byte at once.
        assert got == {"active_entry_log_bytes": 5000, "reclaimed_deletion_bytes": 3000,
                       "reclaimed_compaction_bytes": 0, "deleted_ledgers": 4, "major_compactions": 0,
                       "minor_compactions": 1}
        assert state.free_space == 4000

        assert call(bookie.url + GC, "PUT", b'{"forceMajor": true, "forceMinor": false}')[0] == 200
        wait_idle(bookie.url)
        _, values = metrics(bookie.url)
        assert values[(METRIC_NAMES["reclaimed_compaction_bytes"], DEFAULT_LEDGER_DIR)] == 2000
        assert values[(METRIC_NAMES["active_entry_log_bytes"], DEFAULT_LEDGER_DIR)] == 5000  # not counted twice
        assert values[(METRIC_NAMES["major_compactions"], DEFAULT_LEDGER_DIR)] == 1
        details = json.loads(call(bookie.url + GC_DETAILS)[1])[0]
        assert details["majorCompactionCounter"] == 1 and details["lastMajorCompactionTime"] > 0
        assert state.free_space == 6000
        assert bookie.gc_runs == [(False, True), (True, False)]
        puts = bookie.gc_puts
        assert len(puts) == 3 and puts[0].json() == {"forceMajor": False, "forceMinor": True}
        assert puts[0].time <= puts[1].time and all(r.status == 200 for r in puts)


def test_omitted_flags_default_to_not_suspended() -> None:
    with BookieHttpServer(gc_duration_s=0.05) as bookie:
        assert call(bookie.url + "/api/v1/bookie/gc/suspend_compaction", "PUT", b'{"suspendMajor": true}')[0] == 200
        assert json.loads(call(bookie.url + "/api/v1/bookie/gc/suspend_compaction")[1])["isMajorGcSuspended"] == "true"
        assert call(bookie.url + GC, "PUT", b"")[0] == 200  # forceGC(): major suspended, so minor
        bookie.wait_gc_idle()
        assert call(bookie.url + GC, "PUT", b'{"forceMinor": false}')[0] == 200  # forceMajor omitted: suspended
        bookie.wait_gc_idle()
        assert call(bookie.url + GC, "PUT", b'{"forceMajor": true}')[0] == 200  # explicit: runs although suspended
        bookie.wait_gc_idle()
        assert bookie.gc_runs == [(False, True), (False, False), (True, True)]
        assert (bookie.state.only.minor_compactions, bookie.state.only.major_compactions) == (1, 1)


def test_auth_faults_stop_and_restart() -> None:
    state = BookieState()
    state.pending_deletion_bytes = 700
    with BookieHttpServer(state, require_header=("Authorization", "Bearer x"), gc_duration_s=0.05) as bookie:
        assert call(bookie.url + "/metrics")[0] == 401
        auth = {"Authorization": "Bearer x"}
        assert call(bookie.url + GC, "PUT", b"{}", auth)[0] == 200
        bookie.wait_gc_idle()
        assert bookie.state.reclaimed_deletion_bytes == 700 and bookie.state.minor_compactions == 0
        assert bookie.state.major_compactions == 1

        bookie.status_for = {GC: 503}
        assert call(bookie.url + GC, "PUT", b"{}", auth)[0] == 503
        bookie.status_for = {}
        bookie.delay_s = 0.3
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            call(bookie.url + "/metrics", headers=auth, timeout=0.1)
        bookie.delay_s = 0

        port = bookie.port
        bookie.stopped = True
        with pytest.raises(urllib.error.URLError):
            call(bookie.url + "/metrics", headers=auth)
        bookie.stopped = False
        assert bookie.port == port

        bookie.restart()
        status, text = call(bookie.url + "/metrics", headers=auth)
        assert status == 200
        assert f'{METRIC_NAMES["reclaimed_deletion_bytes"]}{{indexDir="{DEFAULT_LEDGER_DIR}",' \
               f'ledgerDir="{DEFAULT_LEDGER_DIR}"}} 0\n' in text
        assert bookie.state.reclaimed_deletion_bytes == 0 and bookie.state.major_compactions == 0
        assert [r.status for r in bookie.requests_for("PUT", GC)] == [200, 503]


def test_several_ledger_dirs() -> None:
    dirs = ["/data/bk0/current", "/data/bk1/current"]
    state = BookieState(ledger_dirs=dirs)
    state.dirs[dirs[1]].pending_deletion_bytes = 42
    with BookieHttpServer(state, gc_duration_s=0.05) as bookie:
        with pytest.raises(ValueError):
            state.pending_deletion_bytes = 1
        call(bookie.url + GC, "PUT", b'{"forceMajor": false, "forceMinor": false}')
        bookie.wait_gc_idle()
        _, values = metrics(bookie.url)
        name = METRIC_NAMES["reclaimed_deletion_bytes"]
        assert (values[(name, dirs[0])], values[(name, dirs[1])]) == (0, 42)
        assert len(json.loads(call(bookie.url + GC_DETAILS)[1])) == 2
        assert state.reclaimed_deletion_bytes == 42 and state.minor_compactions == 0


def test_metrics_have_the_real_bookies_shape() -> None:
    """Every line of the recorded 4.17.2 excerpt has a line of the same shape here (name, type, labels in order,
    an integer value): what the real bookie serves, with its ledger dir and its values blanked."""

    def shapes(text: str) -> set[str]:
        return {re.sub(r'"[^"]*"', '""', re.sub(r" -?\d+$", " <int>", line)) for line in text.splitlines() if line}

    with BookieHttpServer() as bookie:
        ours = shapes(call(bookie.url + "/metrics")[1])
    real = shapes(REAL_METRICS.read_text())
    assert real and real <= ours, sorted(real - ours)
