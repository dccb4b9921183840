"""The delete decision rules, one test per rule: each fails if its rule is removed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sweeper.codecs.bookkeeper import LedgerMetadata
from sweeper.codecs.errors import MetadataDecodeError
from sweeper.delete import decide as decide_module
from sweeper.delete.decide import (
    ALREADY_GONE,
    DELETE,
    IN_USE,
    INVALID,
    MISMATCH,
    NOT_FOUND,
    LiveLedger,
    LiveObject,
    ReferrerState,
    check_ledger,
    decide_ledger,
    managed_ledger_name,
)
from sweeper.vocabulary import DAY_MS

NOW = 1_700_000_000_000 + 10 * DAY_MS
MIN_AGE = 7 * DAY_MS
PATH = "/ledgers/00/0000/L0042"
FREE = ReferrerState()
UUID = "123e4567-e89b-12d3-a456-426614174000"


def live(**custom: str) -> LiveLedger:
    base = {"application": "pulsar", "component": "managed-ledger", "pulsar/managed-ledger": "t/ns/persistent/a"}
    base.update(custom)
    return LiveLedger(PATH, 3, NOW - 9 * DAY_MS, None, "CLOSED", {k: v for k, v in base.items() if v != "-"})


def rec(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"topicName": "persistent://t/ns/a", "ledgerComponent": "MANAGED_LEDGER",
                            "ledgerType": "LEDGER", "ledgerId": 42, "cursorName": None, "schemaId": None,
                            "offloadContext": None, "properties": {}}
    base.update(fields)
    return base


def decide(record: dict[str, Any], ledger: LiveLedger | None, referrer: ReferrerState = FREE) -> str:
    return decide_ledger(record, ledger, referrer, NOW, MIN_AGE, PATH).outcome


def test_an_unreferenced_old_closed_pulsar_ledger_is_deleted() -> None:
    assert decide(rec(), live()) == DELETE


def test_gone_znode_is_already_gone() -> None:
    assert decide(rec(), None) == ALREADY_GONE


def test_a_gone_znode_no_snapshot_ever_listed_is_not_found_and_a_live_one_is_judged_as_usual() -> None:
    gone = check_ledger(rec(), None, NOW, MIN_AGE, PATH, ever_seen=False)
    assert gone is not None and gone.outcome == NOT_FOUND and "check the id" in gone.detail
    assert check_ledger(rec(), live(), NOW, MIN_AGE, PATH, ever_seen=False) is None  # on to the referrer


def test_non_pulsar_ledger_is_mismatch() -> None:
    assert decide(rec(), live(application="-")) == MISMATCH
    assert decide(rec(), live(application="other")) == MISMATCH


@pytest.mark.parametrize(("record", "ledger"), [
    (rec(topicName="persistent://t/ns/b"), live()),  # topic
    (rec(topicName="persistent://t2/ns/a"), live()),
    (rec(), live(**{"pulsar/managed-ledger": "-"})),
    (rec(ledgerComponent="MANAGED_CURSOR", cursorName="c"), live()),  # component: data ledger claimed as cursor
    (rec(), live(**{"pulsar/cursor": "c"})),  # cursor ledger claimed as data ledger
    (rec(ledgerComponent="MANAGED_CURSOR", cursorName="c"), live(**{"pulsar/cursor": "d"})),  # cursor name
    (rec(ledgerComponent="SCHEMA_STORAGE", topicName=None, schemaId="t/ns/a"), live()),
    (rec(ledgerComponent="SCHEMA_STORAGE", topicName=None, schemaId="t/ns/b"),
     live(component="schema", **{"pulsar/schemaId": "t/ns/a"})),  # schema id
    (rec(ledgerComponent="COMPACTED_LEDGER"),
     live(component="compacted-ledger", **{"pulsar/compactedTopic": "persistent://t/ns/b"})),
    (rec(ledgerComponent="DELAYED_INDEX_BUCKET", properties={"bucket_key": "#b_1_2"}),
     live(component="delayed-index-bucket", **{"pulsar/delayedIndexBucketKey": "#b_1_3",
                                               "pulsar/delayedIndexTopic": "persistent://t/ns/a"})),
    (rec(ledgerComponent="DELAYED_INDEX_BUCKET", properties={"bucket_key": "#b_1_2"}),
     live(component="delayed-index-bucket", **{"pulsar/delayedIndexBucketKey": "#b_1_2",
                                               "pulsar/delayedIndexTopic": "persistent://t/ns/z"})),
    (rec(), live(component="schema")),
])
def test_ownership_must_match_the_record(record: dict[str, Any], ledger: LiveLedger) -> None:
    assert decide(record, ledger) == MISMATCH


@pytest.mark.parametrize(("record", "ledger"), [
    (rec(ledgerComponent="MANAGED_CURSOR", cursorName="c"), live(**{"pulsar/cursor": "c"})),
    (rec(ledgerComponent="SCHEMA_STORAGE", topicName=None, schemaId="t/ns/a"),
     live(component="schema", **{"pulsar/schemaId": "t/ns/a"})),
    (rec(ledgerComponent="COMPACTED_LEDGER"),
     live(component="compacted-ledger", **{"pulsar/compactedTopic": "persistent://t/ns/a"})),
    (rec(ledgerComponent="DELAYED_INDEX_BUCKET", properties={"bucket_key": "#b_1_2"}),
     live(component="delayed-index-bucket", **{"pulsar/delayedIndexBucketKey": "#b_1_2",
                                               "pulsar/delayedIndexTopic": "persistent://t/ns/a"})),
    (rec(topicName="persistent://t/cluster/ns/a"), live(**{"pulsar/managed-ledger": "t/cluster/ns/persistent/a"})),
])
def test_matching_ownership_of_each_component_is_deleted(record: dict[str, Any], ledger: LiveLedger) -> None:
    assert decide(record, ledger) == DELETE


def test_path_is_computed_and_a_different_claimed_path_is_mismatch() -> None:
    assert decide(rec(properties={"zk_path": PATH}), live()) == DELETE
    for claimed in ("/managed-ledgers/t/ns/persistent/a", "/ledgers/LAYOUT", "/ledgers/00/0000/L0043"):
        assert decide(rec(properties={"zk_path": claimed}), live()) == MISMATCH
        assert decide(rec(properties={"zk_path": claimed}), None) == MISMATCH
    assert decide(rec(), dataclasses.replace(live(), path="/ledgers/00/0000/L0043")) == MISMATCH


def test_planned_version_must_still_hold() -> None:
    assert decide(rec(properties={"zk_version": "3"}), live()) == DELETE
    result = decide_ledger(rec(properties={"zk_version": "2"}), live(), FREE, NOW, MIN_AGE, PATH)
    assert result.outcome == IN_USE and "changed since the plan" in result.detail


def test_grace_period_from_the_later_of_metadata_and_znode_ctime() -> None:
    young_znode = dataclasses.replace(live(), znode_ctime_ms=NOW - DAY_MS)
    assert decide(rec(), young_znode) == IN_USE
    # The later of the two clocks: either one saying "young" keeps the ledger.
    assert decide(rec(), dataclasses.replace(live(), metadata_ctime_ms=NOW - DAY_MS)) == IN_USE
    assert decide(rec(), dataclasses.replace(young_znode, metadata_ctime_ms=NOW - 8 * DAY_MS)) == IN_USE
    assert decide(rec(), dataclasses.replace(live(), metadata_ctime_ms=NOW - 8 * DAY_MS)) == DELETE
    assert decide(rec(), dataclasses.replace(live(), znode_ctime_ms=0)) == IN_USE  # unknown age


def test_recovering_ledgers_are_in_use_but_old_unlisted_open_ones_are_orphans() -> None:
    assert decide(rec(), dataclasses.replace(live(), state="IN_RECOVERY")) == IN_USE
    # Created, never listed, writer gone: OPEN forever. The grace period, not the state, protects new ones.
    assert decide(rec(), dataclasses.replace(live(), state="OPEN")) == DELETE


def test_referenced_or_unverifiable_referrer_is_in_use() -> None:
    held = decide_ledger(rec(), live(), ReferrerState(("listed in t/ns/persistent/a",)), NOW, MIN_AGE, PATH)
    assert held.outcome == IN_USE and "listed" in held.detail
    unknown = decide_ledger(rec(), live(), ReferrerState(unverifiable="cursor c: truncated"), NOW, MIN_AGE, PATH)
    assert unknown.outcome == IN_USE and "cannot be verified" in unknown.detail


@pytest.mark.parametrize("record", [
    rec(ledgerType="OFFLOAD_LEDGER"),
    rec(ledgerId=-1),
    rec(ledgerComponent="MANAGED_CURSOR"),  # no cursor name
    rec(ledgerComponent="SOMETHING_ELSE"),
    rec(topicName="non-persistent://t/ns/a"),
    rec(topicName="persistent://t/../a"),
])
def test_malformed_records_are_invalid(record: dict[str, Any]) -> None:
    assert decide(record, live()) == INVALID


def test_binary_ownership_values_cannot_be_read() -> None:
    md = LedgerMetadata(3, 1, 1, 1, "CLOSED", 1, 1, (), None, None, None, None,
                        {"application": b"pulsar", "pulsar/managed-ledger": b"\xff\xfe"})
    with pytest.raises(MetadataDecodeError):
        LiveLedger.of(PATH, md, 0, 1)


def test_managed_ledger_names() -> None:
    # Codec.encode (java.net.URLEncoder) of the local name: what Pulsar names the managed ledger.
    assert managed_ledger_name("persistent://t/ns/a b:c%d~") == "t/ns/persistent/a+b%3Ac%25d%7E"
    assert managed_ledger_name("persistent://t/ns/a%20b") == "t/ns/persistent/a%2520b"
    assert managed_ledger_name("persistent://t/c/ns/a") == "t/c/ns/persistent/a"
    for bad in (None, "", "t/ns/a", "persistent://t/a", "persistent://t//a", "persistent://a/b/c/d/e"):
        assert managed_ledger_name(bad) is None


def orec(keys: list[str] | None = None, bucket: str = "b1", uuid: str = UUID, **fields: Any) -> dict[str, Any]:
    keys = [f"{uuid}-ledger-42", f"{uuid}-ledger-42-index"] if keys is None else keys
    context = {"uuid": uuid, "bucket": bucket, "region": None, "endpoint": None, "keys": keys}
    return rec(**{"ledgerType": "OFFLOAD_LEDGER", "offloadContext": context, **fields})


PULSAR_OBJECT = {"pulsarclustername": "east", "managedledgername": "t/ns/persistent/a", "role": "data"}


def objects(keys: list[str], age_ms: int = 8 * DAY_MS, **metadata: str) -> list[LiveObject]:
    return [LiveObject(k, NOW - age_ms, {**PULSAR_OBJECT, **metadata}) for k in keys]


def decide_object(record: dict[str, Any], live_objects: Any, referrer: ReferrerState,
                  buckets: set[str]) -> Any:
    if live_objects and isinstance(live_objects[0], str):
        live_objects = objects(live_objects)
    return decide_module.decide_object(record, live_objects, referrer, buckets, "east", NOW, 7 * DAY_MS)


def test_object_decisions() -> None:
    both = [f"{UUID}-ledger-42", f"{UUID}-ledger-42-index"]
    assert decide_object(orec(), both, FREE, {"b1"}).outcome == DELETE
    assert decide_object(orec(keys=both[:1]), both[:1], FREE, {"b1"}).outcome == DELETE
    assert decide_object(orec(bucket="b2"), both, FREE, {"b1"}).outcome == INVALID
    assert decide_object(orec(), [], FREE, {"b1"}).outcome == ALREADY_GONE
    assert decide_object(orec(), both, ReferrerState(("listed",)), {"b1"}).outcome == IN_USE
    assert decide_object(orec(), both, ReferrerState(unverifiable="x"), {"b1"}).outcome == IN_USE


@pytest.mark.parametrize(("live_objects", "outcome"), [
    (objects([f"{UUID}-ledger-42"], pulsarclustername="west"), MISMATCH),  # a geo-replicated peer's
    (objects([f"{UUID}-ledger-42"], managedledgername="t/ns/persistent/other"), MISMATCH),  # forged topic
    ([LiveObject(f"{UUID}-ledger-42", NOW - 8 * DAY_MS, {"role": "data"})], MISMATCH),  # no owner metadata
    (objects([f"{UUID}-ledger-42"], age_ms=DAY_MS), IN_USE),  # the object itself is young
])
def test_an_object_must_name_this_cluster_and_the_records_managed_ledger(live_objects: list[LiveObject],
                                                                         outcome: str) -> None:
    assert decide_object(orec(keys=[f"{UUID}-ledger-42"]), live_objects, FREE, {"b1"}).outcome == outcome


@pytest.mark.parametrize("keys", [
    [f"{UUID}-ledger-43"],
    [f"{UUID}-ledger-42", f"{UUID}-ledger-42"],
    [f"{UUID}-ledger-42-index", "notes.txt"],
    [],
])
def test_object_keys_must_be_the_ledgers_own(keys: list[str]) -> None:
    assert decide_object(orec(keys=keys), keys, FREE, {"b1"}).outcome == INVALID


def test_object_uuid_must_be_a_uuid() -> None:
    uuid = "../../etc"
    record = orec(uuid=uuid)
    assert decide_object(record, record["offloadContext"]["keys"], FREE, {"b1"}).outcome == INVALID
    assert decide_object(orec(ledgerType="LEDGER"), [], FREE, {"b1"}).outcome == INVALID
