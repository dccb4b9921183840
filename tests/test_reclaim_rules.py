"""The reclaim step's pure rules: where a bookie's HTTP server is, what its /metrics say, each bookie's expected
share, when to trigger a GC and how, and the verdict (issue 35). No server, no Spark."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from sweeper._proto.bookkeeper_metadata_pb2 import BookieServiceInfoFormat
from sweeper.config import ConfigError, from_dict
from sweeper.reclaim.decide import (
    FREED,
    GC_DELETION_ONLY,
    GC_MAJOR,
    GC_MINOR,
    NOT_MEASURED,
    PENDING_COMPACTION,
    PENDING_GC,
    DeletedLedger,
    Expected,
    expected_shares,
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
from sweeper.reclaim.samples import BookieAnswerError, BookieSample, parse_gc_state, parse_metrics

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


def test_each_bookie_expects_its_striped_share() -> None:
    shares = expected_shares([
        DeletedLedger(1, 3000, ensemble_size=3, write_quorum=2, bookies=("a", "b", "c")),  # 2 copies over 3
        DeletedLedger(2, 1000, ensemble_size=2, write_quorum=2, bookies=("a", "d", "b")),  # ensemble changed
        DeletedLedger(3, 0, ensemble_size=1, write_quorum=1, bookies=("c",)),  # empty
    ])
    assert shares["a"].bytes == 2000 + 666 and shares["b"].bytes == 2000 + 666 and shares["d"].bytes == 666
    assert shares["c"].bytes == 2000 and shares["c"].ledgers == 2 and shares["a"].estimated == 1
    assert shares["c"].with_data == 1  # an empty ledger may have nothing on the bookie for its collector to count


def _sample(**counters: object) -> BookieSample:
    base: dict[str, object] = {"deletion_bytes": 0, "compaction_bytes": 0, "deleted_ledgers": 0,
                               "active_log_bytes": 0, "free_bytes": 0, "in_force_gc": False, "compacting": False,
                               "major_suspended": False, "minor_suspended": False}
    return BookieSample("bk", datetime.now(UTC), url="http://b", **{**base, **counters})  # type: ignore[arg-type]


def test_the_verdicts() -> None:
    expected = Expected(bytes=20_000_000, ledgers=5, with_data=4)  # one of them empty: never on the bookie
    before = _sample(deletion_bytes=1_000, deleted_ledgers=10)
    freed_all, got = verdict(expected, before, _sample(deletion_bytes=19_001_000, deleted_ledgers=14), 0.9)
    assert freed_all.verdict == FREED and got is not None and got.total == 19_000_000
    waiting, _ = verdict(expected, before, before, 0.9)
    assert waiting.verdict == PENDING_GC and waiting.pending_bytes == 20_000_000
    shared, _ = verdict(expected, before, _sample(deletion_bytes=12_001_000, deleted_ledgers=14), 0.9)
    assert shared.verdict == PENDING_COMPACTION and shared.pending_bytes == 8_000_000
    unmeasured, none = verdict(expected, before, _sample().failed("connection refused"), 0.9)
    assert unmeasured.verdict == NOT_MEASURED and "connection refused" in unmeasured.why and none is None
    no_baseline, _ = verdict(expected, None, before, 0.9)
    assert no_baseline.verdict == NOT_MEASURED and "before the delete" in no_baseline.why


def test_a_restarted_bookie_never_reports_a_negative() -> None:
    before = _sample(deletion_bytes=50_000_000, compaction_bytes=7_000, deleted_ledgers=100)
    after = _sample(deletion_bytes=3_000_000, compaction_bytes=0, deleted_ledgers=2)  # counters back from zero
    judged, got = verdict(Expected(bytes=4_000_000, ledgers=2, with_data=2), before, after, 0.9)
    assert got is not None and got.counter_reset and got.deletion == 3_000_000 and got.compaction == 0
    assert judged.verdict == PENDING_COMPACTION and "restarted" in judged.why


def test_a_gc_is_triggered_only_when_asked_once_and_never_on_a_busy_bookie() -> None:
    share = Expected(bytes=10, ledgers=1)
    idle = _sample()
    assert not gc_plan(idle, share, asked=False, compaction="major", already_triggered=None).trigger
    assert not gc_plan(idle, Expected(), asked=True, compaction="minor", already_triggered=None).trigger
    assert not gc_plan(_sample(in_force_gc=True), share, True, "minor", None).trigger
    assert not gc_plan(_sample(compacting=True), share, True, "minor", None).trigger
    assert not gc_plan(idle.failed("down"), share, True, "minor", None).trigger
    minor = gc_plan(idle, share, True, "minor", None)
    assert (minor.trigger, minor.force_major, minor.force_minor, minor.action) == (True, False, True, GC_MINOR)
    major = gc_plan(idle, share, True, "major", None)
    assert (major.force_major, major.action) == (True, GC_MAJOR)
    # Once per bookie per run for each kind: the same GC never twice, a stronger one when an operator asks.
    assert not gc_plan(idle, share, True, "minor", gc_level(False, True)).trigger
    assert not gc_plan(idle, share, True, "minor", gc_level(True, True)).trigger
    assert gc_plan(idle, share, True, "major", gc_level(False, True)).trigger
    assert not gc_plan(idle, share, True, "none", gc_level(False, False)).trigger
    for quiet in (_sample(readonly=True), _sample(major_suspended=True), _sample(minor_suspended=True)):
        plan = gc_plan(quiet, share, True, "major", None)
        assert (plan.trigger, plan.force_major, plan.force_minor, plan.action) == (True, False, False,
                                                                                   GC_DELETION_ONLY)


@pytest.mark.parametrize("section", [{"compaction": "full"}, {"http_urls": ["bk0test"]},
                                     {"http_urls": ["bk0test=ftp://x"]}, {"freed_fraction": 0.0},
                                     {"tls_cert_file": "c.pem"}, {"calls_per_second": 0.0}])
def test_a_wrong_reclaim_setting_is_named(section: dict[str, object]) -> None:
    from sweeper.config import validate

    with pytest.raises(ConfigError, match=r"\[reclaim\]"):
        validate(from_dict({"reclaim": section}))
