"""PendingDeleteLedgerInfo: built from orphans, Avro round trip, and refusal of bad records."""

from __future__ import annotations

from typing import Any

import pytest

from sweeper.codecs.errors import InvalidPendingDelete
from sweeper.codecs.pending_delete import decode, encode, records_for_orphans

UUID = "123e4567-e89b-12d3-a456-426614174000"


def _orphans() -> list[dict[str, Any]]:
    base = {"run_id": "r1", "status": "candidate", "reason": "dropped_from_list"}
    return [
        {**base, "object_type": "ledger", "ledger_id": 7, "component": "managed-ledger",
         "managed_ledger": "t/ns/persistent/orders", "zk_path": "/ledgers/00/0000/L0007", "zk_version": 0},
        {**base, "object_type": "ledger", "ledger_id": 8, "component": "managed-ledger", "cursor": "sub",
         "managed_ledger": "t/ns/persistent/orders", "reason": "cursor_deleted"},
        {**base, "object_type": "ledger", "ledger_id": 9, "component": "schema", "schema_id": "t/ns/orders"},
        {**base, "object_type": "ledger", "ledger_id": 10, "component": "managed-ledger", "status": "young",
         "managed_ledger": "t/ns/persistent/orders"},
        {**base, "object_type": "offload_object", "ledger_id": 7, "s3_bucket": "b", "offload_uuid": UUID,
         "s3_key": f"{UUID}-ledger-7-index", "managed_ledger": "t/ns/persistent/orders"},
        {**base, "object_type": "offload_object", "ledger_id": 7, "s3_bucket": "b", "offload_uuid": UUID,
         "s3_key": f"{UUID}-ledger-7", "managed_ledger": "t/ns/persistent/orders"},
    ]


def test_records_from_orphans_round_trip() -> None:
    records = records_for_orphans(_orphans(), {"b": ("us-east-1", "")})
    kinds = sorted((r["ledgerId"], r["ledgerComponent"], r["ledgerType"]) for r in records)
    # Ledger 7 is on BookKeeper and in tiered storage: two records. Young ledger 10: none.
    assert kinds == [(7, "MANAGED_LEDGER", "LEDGER"), (7, "MANAGED_LEDGER", "OFFLOAD_LEDGER"),
                     (8, "MANAGED_CURSOR", "LEDGER"), (9, "SCHEMA_STORAGE", "LEDGER")]
    offload = next(r for r in records if r["ledgerType"] == "OFFLOAD_LEDGER")
    assert offload["offloadContext"]["keys"] == [f"{UUID}-ledger-7", f"{UUID}-ledger-7-index"]
    assert offload["topicName"] == "persistent://t/ns/orders"
    for record in records:
        assert decode(encode(record)) == record


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({"ledgerComponent": "MANAGED_CURSOR", "cursorName": None}, "missing_field"),
        ({"ledgerComponent": "SCHEMA_STORAGE", "schemaId": None}, "missing_field"),
        ({"topicName": None}, "missing_field"),
        ({"ledgerId": -1}, "invalid_field"),
        ({"ledgerType": "OFFLOAD_LEDGER"}, "missing_field"),
        ({"offloadContext": {"uuid": UUID, "bucket": "b", "region": None, "endpoint": None,
                             "keys": [f"{UUID}-ledger-7"]}}, "invalid_field"),
    ],
)
def test_invalid_records_are_refused(change: dict[str, Any], kind: str) -> None:
    record = {**records_for_orphans(_orphans())[0], **change}
    with pytest.raises(InvalidPendingDelete) as info:
        decode(encode(record))
    assert info.value.kind == kind


def test_forged_offload_keys_are_a_mismatch() -> None:
    record = next(r for r in records_for_orphans(_orphans()) if r["ledgerType"] == "OFFLOAD_LEDGER")
    record["offloadContext"]["keys"].append("some-other-tenant/important-object")
    with pytest.raises(InvalidPendingDelete) as info:
        decode(encode(record))
    assert info.value.kind == "mismatch"


@pytest.mark.parametrize("payload", [b"", b"\x00", b"\xff" * 20, b"not avro at all"])
def test_garbage_is_malformed(payload: bytes) -> None:
    with pytest.raises(InvalidPendingDelete):
        decode(payload)


def test_trailing_bytes_are_refused() -> None:
    data = encode(records_for_orphans(_orphans())[0])
    with pytest.raises(InvalidPendingDelete, match="trailing"):
        decode(data + b"\x00")
