"""The reclaim step's pure rules: where a bookie's HTTP server is, what its /metrics say, each bookie's expected
share, when to trigger a GC and how, and the verdict (issue 35). No server, no Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sweeper._proto.bookkeeper_metadata_pb2 import BookieServiceInfoFormat
from sweeper.config import from_dict
from sweeper.errors import ConfigError
from sweeper.reclaim.decide import (
    FREED,
    GC_DELETION_ONLY,
    GC_MAJOR,
    GC_MINOR,
    MAJOR,
    NOT_MEASURED,
    PENDING_COMPACTION,
    PENDING_GC,
    RESTARTED,
    SHARED_WINDOW,
    UNKNOWN,
    DeletedLedger,
    Expected,
    collection_seen,
    expected_shares,
    gc_confirmed,
    gc_level,
    gc_plan,
    verdict,
)
from sweeper.reclaim.discovery import (
    FOUND_BY_PORT,
    FOUND_IN_CONFIG,
    FOUND_IN_REGISTRATION,
    FOUND_VIA_BOOKIE_HOST,
    decode_registration,
    locate,
    parse_overrides,
)
from sweeper.reclaim.errors import BookieAnswerError
from sweeper.reclaim.samples import BookieSample, parse_gc_state, parse_metrics

DATA = Path(__file__).parent / "data"

# What the real testbed bookies registered (harness/testbed/bookie.py records how it was read): the ZooKeeper
# flavour's standalone bookie (`bk0test`, httpServerHost unset) and the Oxia flavour's (httpServerHost=127.0.0.1).
ZK_FLAVOUR_REGISTRATION = (b'2\x1f\n\nhttpserver\x10\xf8\x9c\x01\x1a\x070.0.0.0"\x04http2#\n\x06bookie\x10\xf4\x9c'
                           b'\x01\x1a\t127.0.0.1"\nbookie-rpc')
OXIA_FLAVOUR_REGISTRATION = (b'2!\n\nhttpserver\x10\x8f\xef\x01\x1a\t127.0.0.1"\x04http2#\n\x06bookie\x10\x8b\xef'
                             b'\x01\x1a\t127.0.0.1"\nbookie-rpc')


def _registration(*endpoints: tuple[str, str, int, str]) -> bytes:
    info = BookieServiceInfoFormat()
    for endpoint_id, host, port, protocol in endpoints:
        info.endpoints.add(id=endpoint_id, host=host, port=port, protocol=protocol)
    return info.SerializeToString()


def test_a_real_registration_with_0_0_0_0_is_reached_at_the_bookie_host() -> None:
    registration = decode_registration("bk0test", ZK_FLAVOUR_REGISTRATION, readonly=False)
    assert registration.endpoint("httpserver") == ("httpserver", "0.0.0.0", 20088, "http")
    target = locate("bk0test", registration, {})
    assert (target.url, target.found_by) == ("http://127.0.0.1:20088", FOUND_VIA_BOOKIE_HOST)


def test_a_real_registration_with_its_own_host_is_taken_as_it_is() -> None:
    target = locate("127.0.0.1:30603", decode_registration("127.0.0.1:30603", OXIA_FLAVOUR_REGISTRATION, False), {})
    assert (target.url, target.found_by) == ("http://127.0.0.1:30607", FOUND_IN_REGISTRATION)


def test_the_config_overrides_and_completes_registrations() -> None:
    overrides = parse_overrides(("bk-1=https://proxy:8443/bk1/", "*=http://{host}:8000"))
    registered = decode_registration("bk-1", _registration(("httpserver", "10.0.0.1", 8000, "http")), False)
    assert locate("bk-1", registered, overrides).url == "https://proxy:8443/bk1"
    legacy = decode_registration("10.0.0.2:3181", b"", False)  # BookKeeper before 4.11 wrote no service info
    target = locate("10.0.0.2:3181", legacy, overrides)
    assert (target.url, target.found_by) == ("http://10.0.0.2:8000", FOUND_IN_CONFIG)
    by_port = locate("10.0.0.2:3181", legacy, {}, http_port=8000)
    assert (by_port.url, by_port.found_by) == ("http://10.0.0.2:8000", FOUND_BY_PORT)


def test_no_http_server_no_registration_or_garbage_is_said_not_guessed() -> None:
    no_http = locate("bk-1", decode_registration("bk-1", _registration(("bookie", "10.0.0.1", 3181, "bookie-rpc")),
                                                   False), {})
    assert not no_http.reachable and "httpServerEnabled" in no_http.why
    gone = locate("bk-2", None, {})
    assert not gone.reachable and "not registered" in gone.why
    garbage = locate("bk-3", decode_registration("bk-3", b"\xff\xff\xff", False), {})
    assert not garbage.reachable and "BookieServiceInfoFormat" in garbage.why
    only_wildcard = locate("bk-4", decode_registration("bk-4", _registration(("httpserver", "0.0.0.0", 8000, "http")),
                                                       False), {})
    assert not only_wildcard.reachable and "0.0.0.0" in only_wildcard.why


def test_the_real_bookies_metrics_are_read_and_summed_over_ledger_dirs() -> None:
    text = (DATA / "bookie_metrics_4.17.2.txt").read_text()
    parsed = parse_metrics(text)
    assert parsed["deletion_bytes"] == 24593432 and parsed["deleted_ledgers"] == 30
    assert parsed["compaction_bytes"] == 0 and parsed["active_log_bytes"] == 2061402
    second_dir = text.replace("bookkeeper0/current", "bookkeeper1/current")
    doubled = parse_metrics(text + second_dir)
    assert doubled["deletion_bytes"] == 2 * 24593432 and doubled["ledger_dirs"] == 2
    with pytest.raises(BookieAnswerError):
        parse_gc_state(b"<html>")


def test_the_process_start_is_read_and_a_counter_that_is_not_a_number_is_refused() -> None:
    text = (DATA / "bookie_metrics_4.17.2.txt").read_text()
    started = "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds{} 1.764650000123E9\n"
    assert parse_metrics(text + started)["started_at_s"] == pytest.approx(1_764_650_000.123)
    for bad in ("+Inf", "NaN", "-5"):
        broken = text.replace("bookie_DELETED_LEDGER_TOTAL{", "bookie_DELETED_LEDGER_TOTAL{x=\"1\",", 1)
        broken = broken.rsplit(" ", 1)[0] + f" {bad}\n"
        with pytest.raises(BookieAnswerError, match="non-negative whole numbers"):
            parse_metrics(broken)
    # Other families' NaN (an empty latency summary, as BookKeeper writes one) are none of our business.
    assert parse_metrics(text + 'bookie_journal_sync{quantile="0.5"} NaN\n')["deleted_ledgers"] == 30


def test_each_bookie_expects_its_striped_share() -> None:
    shares = expected_shares([
        # 30 entries over a, b, c with two copies each: 20 entries per bookie (RoundRobinDistributionSchedule).
        DeletedLedger(1, 3000, 3, 2, ("a", "b", "c"), last_entry_id=29, segments=((0, ("a", "b", "c")),)),
        # An ensemble change at entry 10: entries 0-9 on (a, d), 10-19 on (a, b), two copies of each.
        DeletedLedger(2, 2000, 2, 2, ("a", "b", "d"), last_entry_id=19, segments=((0, ("a", "d")), (10, ("a", "b")))),
        DeletedLedger(3, 0, 1, 1, ("c",), last_entry_id=-1, segments=((0, ("c",)),)),  # closed empty
    ])
    assert (shares["a"].bytes, shares["b"].bytes, shares["c"].bytes, shares["d"].bytes) == (4000, 3000, 2000, 1000)
    assert (shares["a"].with_data, shares["c"].with_data, shares["c"].empty, shares["c"].ledgers) == (2, 1, 1, 2)
    assert shares["a"].estimated == 2  # bytes per entry are the ledger's mean


def test_a_one_entry_ledger_is_on_write_quorum_bookies_only() -> None:
    # The schema ledgers Pulsar leaks in a new namespace: one entry, ensemble 3, write quorum 2 (the real testbed's).
    shares = expected_shares([DeletedLedger(206, 782, 3, 2, ("a", "b", "c"), last_entry_id=0,
                                            segments=((0, ("c", "b", "a")),))])
    assert {b: (e.bytes, e.with_data) for b, e in shares.items()} == {"c": (782, 1), "b": (782, 1)}


def test_the_share_follows_the_entries_each_ensemble_position_was_sent() -> None:
    # Five entries over an ensemble of three, one copy each: positions get entries 0,3 / 1,4 / 2.
    shares = expected_shares([DeletedLedger(7, 500, 3, 1, ("x", "y", "z"), last_entry_id=4,
                                            segments=((0, ("x", "y", "z")),))])
    assert {b: e.bytes for b, e in shares.items()} == {"x": 200, "y": 200, "z": 100}
    # Without the layout (a snapshot an older version took) the bytes are spread evenly, as an estimate.
    old = expected_shares([DeletedLedger(8, 300, 3, 1, ("x", "y", "z"), last_entry_id=2)])
    assert {b: e.bytes for b, e in old.items()} == {"x": 100, "y": 100, "z": 100}


def test_a_never_closed_ledger_has_unknown_bytes_never_zero() -> None:
    open_ledger = DeletedLedger(9, 0, 2, 2, ("a", "b"), closed=False, last_entry_id=-1, segments=((0, ("a", "b")),))
    shares = expected_shares([open_ledger])
    assert shares["a"].bytes == 0 and shares["a"].unknown == 1 and shares["a"].with_data == 0
    before = _sample(deleted_ledgers=3)
    after = _sample(deleted_ledgers=4, deletion_bytes=4_000_000)  # the bookie collected one ledger, its logs went
    judged, _ = verdict(shares["a"], before, after, 0.9, pass_seen=True)
    assert judged.verdict == UNKNOWN and "never closed" in judged.why and judged.verdict != FREED
    # Before its collection pass: nothing is claimed either.
    assert verdict(shares["a"], before, before, 0.9, pass_seen=False)[0].verdict != FREED


def _sample(**counters: object) -> BookieSample:
    base: dict[str, object] = {"deletion_bytes": 0, "compaction_bytes": 0, "deleted_ledgers": 0,
                               "active_log_bytes": 0, "free_bytes": 0, "in_force_gc": False, "compacting": False,
                               "major_suspended": False, "minor_suspended": False, "ledger_dirs": 1,
                               "started_at_s": 1_764_650_000.0}
    return BookieSample("bk", datetime.now(UTC), url="http://b", **{**base, **counters})  # type: ignore[arg-type]


def test_the_verdicts_claim_only_a_window_of_this_runs_ledgers() -> None:
    expected = Expected(bytes=20_000_000, ledgers=4, with_data=4)
    before = _sample(deletion_bytes=1_000, deleted_ledgers=10)
    ours = _sample(deletion_bytes=19_001_000, deleted_ledgers=14)  # exactly our four collected
    freed_all, got = verdict(expected, before, ours, 0.9, pass_seen=True)
    assert freed_all.verdict == FREED and got is not None and got.total == 19_000_000
    assert (freed_all.lower_bytes, freed_all.upper_bytes, freed_all.pending_bytes) == (19_000_000, 19_000_000, 0)
    # The same counters without a collection pass known to have run after the deletes: not proven.
    assert verdict(expected, before, ours, 0.9, pass_seen=False)[0].verdict == PENDING_GC
    waiting, _ = verdict(expected, before, before, 0.9, pass_seen=True)
    assert waiting.verdict == PENDING_GC and waiting.pending_bytes == 20_000_000
    part = _sample(deletion_bytes=12_001_000, deleted_ledgers=14)
    compaction, _ = verdict(expected, before, part, 0.9, pass_seen=True)
    assert compaction.verdict == PENDING_COMPACTION and compaction.pending_bytes == 8_000_000
    unmeasured, none = verdict(expected, before, _sample().failed("connection refused"), 0.9)
    assert unmeasured.verdict == NOT_MEASURED and "connection refused" in unmeasured.why and none is None
    no_baseline, _ = verdict(expected, None, before, 0.9)
    assert no_baseline.verdict == NOT_MEASURED and "before the delete" in no_baseline.why


def test_others_collected_in_the_same_window_make_the_bytes_a_bound_never_freed() -> None:
    # The case: Pulsar deleted a topic of its own (its logs went whole) while our orphan's bytes stayed in logs
    # shared with live data. The counters moved by about what we expected, but by one more ledger than ours.
    expected = Expected(bytes=8_300_000, ledgers=1, with_data=1)
    before = _sample(deletion_bytes=0, deleted_ledgers=0)
    after = _sample(deletion_bytes=9_800_000, deleted_ledgers=2)
    judged, got = verdict(expected, before, after, 0.9, pass_seen=True)
    assert judged.verdict == SHARED_WINDOW and judged.verdict != FREED
    assert (judged.lower_bytes, judged.upper_bytes, judged.others_collected) == (0, 8_300_000, 1)
    assert judged.pending_bytes == 8_300_000 and got is not None and got.total == 9_800_000
    # A closed empty ledger of ours may or may not have been indexed: one more collected is then not proven ours.
    maybe = Expected(bytes=8_300_000, ledgers=2, with_data=1, empty=1)
    assert verdict(maybe, before, after, 0.9, pass_seen=True)[0].verdict == SHARED_WINDOW


def test_a_restarted_bookie_never_reports_a_negative_or_freed() -> None:
    before = _sample(deletion_bytes=50_000_000, compaction_bytes=7_000, deleted_ledgers=100)
    after = _sample(deletion_bytes=3_000_000, compaction_bytes=0, deleted_ledgers=2)  # counters back from zero
    judged, got = verdict(Expected(bytes=4_000_000, ledgers=2, with_data=2), before, after, 0.9, pass_seen=True)
    assert got is not None and got.counter_reset and got.deletion == 3_000_000 and got.compaction == 0
    assert judged.verdict == RESTARTED and "restarted" in judged.why and judged.lower_bytes == 0
    # Restarted and grown past the old values: only the process start time tells, and it does.
    grown = _sample(deletion_bytes=60_000_000, compaction_bytes=9_000, deleted_ledgers=140,
                    started_at_s=1_764_650_900.0)
    judged, got = verdict(Expected(bytes=4_000_000, ledgers=2, with_data=2), before, grown, 0.9, pass_seen=True)
    assert got is not None and got.counter_reset and got.deletion == 60_000_000  # since the restart: a lower bound
    assert judged.verdict == RESTARTED and judged.pending_bytes == 4_000_000


def test_a_gc_is_asked_only_with_bodies_that_cannot_override_the_bookies_protection() -> None:
    share = Expected(bytes=10, ledgers=1, with_data=1)
    idle = _sample()
    assert not gc_plan(idle, share, asked=False, compaction="major", already_triggered=None).trigger
    assert not gc_plan(idle, Expected(), asked=True, compaction="minor", already_triggered=None).trigger
    assert not gc_plan(_sample(in_force_gc=True), share, True, "minor", None).trigger
    assert not gc_plan(_sample(compacting=True), share, True, "minor", None).trigger
    assert not gc_plan(idle.failed("down"), share, True, "minor", None).trigger
    minor = gc_plan(idle, share, True, "minor", None)
    assert (minor.trigger, json.loads(minor.body), minor.action) == (True, {"forceMajor": False}, GC_MINOR)
    major = gc_plan(idle, share, True, "major", None)
    assert (major.body, major.level, major.action) == ("", MAJOR, GC_MAJOR)  # forceGC(): each dir's own flags
    several_dirs = gc_plan(_sample(ledger_dirs=2), share, True, "minor", None)
    assert (json.loads(several_dirs.body), several_dirs.action) == ({"forceMajor": False, "forceMinor": False},
                                                                    GC_DELETION_ONLY)
    for plan in (minor, major, several_dirs):  # no body ever forces a compaction past a suspension
        assert "true" not in plan.body
    # Once per bookie per run for each kind: the same GC never twice, a stronger one when an operator asks.
    assert not gc_plan(idle, share, True, "minor", gc_level(False, True)).trigger
    assert not gc_plan(idle, share, True, "minor", gc_level(True, True)).trigger
    assert gc_plan(idle, share, True, "major", gc_level(False, True)).trigger
    assert not gc_plan(idle, share, True, "none", gc_level(False, False)).trigger
    for quiet in (_sample(readonly=True), _sample(major_suspended=True), _sample(minor_suspended=True)):
        plan = gc_plan(quiet, share, True, "major", None)
        assert (plan.trigger, json.loads(plan.body), plan.action) == (
            True, {"forceMajor": False, "forceMinor": False}, GC_DELETION_ONLY)


def test_a_put_the_bookie_ignored_is_told_from_a_gc_that_ran() -> None:
    before = _sample(deleted_ledgers=5, minor_compactions=2)
    assert gc_confirmed(before, _sample(deleted_ledgers=7, minor_compactions=2), seen_running=False)
    assert gc_confirmed(before, _sample(deleted_ledgers=5, minor_compactions=3), seen_running=False)
    assert gc_confirmed(before, before, seen_running=True)
    assert not gc_confirmed(before, _sample(deleted_ledgers=5, minor_compactions=2), seen_running=False)


def test_a_collection_pass_is_seen_from_a_triggered_gc_or_twice_the_bookies_gc_wait() -> None:
    from datetime import timedelta

    ended = datetime.now(UTC) - timedelta(minutes=40)
    before = _sample(gc_wait_ms=900_000)
    assert collection_seen(True, before, _sample(), None)
    assert collection_seen(False, before, _sample(), ended)  # 40 minutes, twice 15 passed
    assert not collection_seen(False, before, _sample(), datetime.now(UTC) - timedelta(minutes=20))
    assert not collection_seen(False, _sample(), _sample(), ended)  # the bookie's pace unknown


@pytest.mark.parametrize("section", [{"compaction": "full"}, {"http_urls": ["bk0test"]},
                                     {"http_urls": ["bk0test=ftp://x"]}, {"freed_fraction": 0.0},
                                     {"tls_cert_file": "c.pem"}, {"calls_per_second": 0.0}])
def test_a_wrong_reclaim_setting_is_named(section: dict[str, object]) -> None:
    from sweeper.config import validate

    with pytest.raises(ConfigError, match=r"\[reclaim\]"):
        validate(from_dict({"reclaim": section}))
