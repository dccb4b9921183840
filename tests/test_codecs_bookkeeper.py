"""BookKeeper ledger-metadata formats, against upstream's own test vectors and bad input."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from sweeper._proto import bookkeeper_metadata_pb2 as pb
from sweeper.codecs.bookkeeper import (
    LedgerMetadata,
    Segment,
    decode_ledger_metadata,
    encode_ledger_metadata,
    pulsar_custom_metadata,
)
from sweeper.codecs.errors import MetadataDecodeError

BOOKIES_1234 = ("192.0.2.1:1234", "192.0.2.2:1234", "192.0.2.3:1234")
FIXTURES = ("version1.bin", "version2.bin", "version2ctime.bin", "version3.bin")


def _fixture(shared_fixtures: Path, name: str) -> bytes:
    return (shared_fixtures / "bookkeeper" / name).read_bytes()


# Expected values: the metadata upstream's TestLedgerMetadataSerDe encodes in its vectors.


def test_version3_fixture(shared_fixtures: Path) -> None:
    md = decode_ledger_metadata(_fixture(shared_fixtures, "version3.bin"))
    assert md == LedgerMetadata(
        format_version=3,
        ensemble_size=3,
        write_quorum_size=2,
        ack_quorum_size=1,
        state="OPEN",
        last_entry_id=-1,
        length=0,
        segments=(Segment(0, ("192.0.2.1:3181", "192.0.2.2:3181", "192.0.2.3:3181")),),
        digest_type="CRC32C",
        password=b"foobar",
        ctime=-1,
        ctoken=0,
        custom_metadata={},
    )


@pytest.mark.parametrize(("name", "ctime"), [("version2.bin", None), ("version2ctime.bin", 1544002383075)])
def test_version2_fixtures(shared_fixtures: Path, name: str, ctime: int | None) -> None:
    md = decode_ledger_metadata(_fixture(shared_fixtures, name))
    assert md == LedgerMetadata(
        format_version=2,
        ensemble_size=3,
        write_quorum_size=2,
        ack_quorum_size=2,
        state="IN_RECOVERY",
        last_entry_id=-1,
        length=0,
        segments=(Segment(0, BOOKIES_1234),),
        digest_type="CRC32",
        password=b"passwd",
        ctime=ctime,
        ctoken=None,
        custom_metadata={},
    )


def test_version1_fixture(shared_fixtures: Path) -> None:
    md = decode_ledger_metadata(_fixture(shared_fixtures, "version1.bin"))
    assert md == LedgerMetadata(
        format_version=1,
        ensemble_size=3,
        write_quorum_size=2,
        ack_quorum_size=2,  # v1 has no ack quorum: BookKeeper uses the write quorum
        state="IN_RECOVERY",  # written as "-102\tCLOSED"
        last_entry_id=-1,
        length=0,
        segments=(Segment(0, BOOKIES_1234),),
        digest_type=None,
        password=None,
        ctime=None,
        ctoken=None,
        custom_metadata={},
    )


@pytest.mark.parametrize("name", FIXTURES)
def test_fixtures_reencode_byte_for_byte(shared_fixtures: Path, name: str) -> None:
    # Upstream's own check on these vectors: decode, encode in the same version, same bytes.
    data = _fixture(shared_fixtures, name)
    md = decode_ledger_metadata(data)
    assert encode_ledger_metadata(md, md.format_version) == data


def _pulsar_ledger() -> LedgerMetadata:
    return LedgerMetadata(
        format_version=3,
        ensemble_size=3,
        write_quorum_size=2,
        ack_quorum_size=2,
        state="CLOSED",
        last_entry_id=4711,
        length=123_456,
        segments=(Segment(0, BOOKIES_1234), Segment(100, BOOKIES_1234[::-1])),
        digest_type="CRC32C",
        password=b"",
        ctime=1_700_000_000_000,
        ctoken=0,
        custom_metadata={
            "application": b"pulsar",
            "component": b"managed-ledger",
            "pulsar/managed-ledger": b"t/ns/persistent/x",
            "pulsar/compactedTo": b"\x00\xff\x01",
        },
    )


def test_round_trip_v3() -> None:
    md = _pulsar_ledger()
    data = encode_ledger_metadata(md)
    assert data.startswith(b"BookieMetadataFormatVersion\t3\n")
    assert decode_ledger_metadata(data) == md


def test_round_trip_v2_is_text_without_ctoken() -> None:
    md = replace(_pulsar_ledger(), format_version=2)
    data = encode_ledger_metadata(md, 2)
    assert b'key: "pulsar/managed-ledger"' in data and b"cToken" not in data
    assert decode_ledger_metadata(data) == replace(md, ctoken=None)


def test_round_trip_v1_keeps_what_v1_can_hold() -> None:
    md = replace(_pulsar_ledger(), format_version=1)
    assert decode_ledger_metadata(encode_ledger_metadata(md, 1)) == replace(
        md, digest_type=None, password=None, ctime=None, ctoken=None, custom_metadata={}
    )


@pytest.mark.parametrize("state", ["OPEN", "IN_RECOVERY"])
def test_v1_states(state: str) -> None:
    md = replace(_pulsar_ledger(), state=state, last_entry_id=-1)
    decoded = decode_ledger_metadata(encode_ledger_metadata(md, 1))
    assert (decoded.state, decoded.last_entry_id) == (state, -1)


def test_v1_stops_at_the_state_line() -> None:
    data = b"BookieMetadataFormatVersion\t1\n2\n2\n10\n0\ta:1\tb:1\n7\tCLOSED\n9\tc:1\td:1\n"
    md = decode_ledger_metadata(data)
    assert (md.state, md.last_entry_id, md.segments) == ("CLOSED", 7, (Segment(0, ("a:1", "b:1")),))


def test_v2_may_omit_optional_fields() -> None:
    text = b"BookieMetadataFormatVersion\t2\nquorumSize: 3\nensembleSize: 5\nlength: 0\nstate: OPEN\n"
    md = decode_ledger_metadata(text)
    assert (md.write_quorum_size, md.ack_quorum_size, md.last_entry_id) == (3, 3, -1)
    assert (md.digest_type, md.password, md.ctime, md.ctoken, md.segments) == (None, None, None, None, ())


def test_v3_under_an_unusually_spelled_header() -> None:
    data = encode_ledger_metadata(_pulsar_ledger()).replace(b"\t3\n", b"\t03\n", 1)
    assert decode_ledger_metadata(data) == _pulsar_ledger()


def test_v3_ignores_bytes_after_the_delimited_message() -> None:
    assert decode_ledger_metadata(encode_ledger_metadata(_pulsar_ledger()) + b"\x00junk") == _pulsar_ledger()


def test_invalid_utf8_in_string_fields_becomes_replacement_characters() -> None:
    # BookKeeper (Java) reads such bytes as U+FFFD; upb would hand us bytes in a str field.
    msg = pb.LedgerMetadataFormat(quorumSize=1, ensembleSize=1, length=0, state=pb.LedgerMetadataFormat.OPEN)
    msg.segment.add(firstEntryId=0, ensembleMember=["BOOKIE"])
    msg.customMetadata.add(key="KEY", value=b"\xff")
    payload = msg.SerializeToString().replace(b"BOOKIE", b"bk\xff:11").replace(b"KEY", b"k\xfe\xff")
    data = b"BookieMetadataFormatVersion\t3\n" + bytes([len(payload)]) + payload
    md = decode_ledger_metadata(data)
    assert md.segments == (Segment(0, ("bk\ufffd:11",)),)
    assert md.custom_metadata == {"k\ufffd\ufffd": b"\xff"}


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"", "bad_header"),
        (b"\x00\x01garbage", "bad_header"),
        (b"BookieMetadataFormatVersio", "bad_header"),
        (b"BookieMetadataFormatVersion\t9\nwhatever", "unknown_format_version"),
        (b"BookieMetadataFormatVersion\t0\n", "unknown_format_version"),
        (b"BookieMetadataFormatVersion\tfoobar\nblahblah", "bad_header"),
        (b"BookieMetadataFormatVersion\t-3\n", "bad_header"),
        (b"BookieMetadataFormatVersion\t3", "truncated"),
        (b"BookieMetadataFormatVersion\t3\n", "truncated"),
        (b"BookieMetadataFormatVersion\t3\n\x80", "truncated"),
        (b"BookieMetadataFormatVersion\t3\n\x05\x08\x02", "truncated"),
        (b"BookieMetadataFormatVersion\t3\n\xff\xff\xff\xff\xff\xff", "invalid_protobuf"),  # 6-byte varint32
        (b"BookieMetadataFormatVersion\t3\n\x04\xff\xff\xff\xff", "invalid_protobuf"),
        (b"BookieMetadataFormatVersion\t3\n\x02\x08\x02", "invalid_protobuf"),  # required fields missing
        (b"BookieMetadataFormatVersion\t3\n\x08\x08\x01\x10\x01\x18\x00\x28\x07", "invalid_protobuf"),  # state 7
        (b"BookieMetadataFormatVersion\t2\nquorumSize: two\n", "invalid_text"),
        (b"BookieMetadataFormatVersion\t2\nquorumSize: 2\n", "invalid_text"),  # required fields missing
        (b"BookieMetadataFormatVersion\t2\nnoSuchField: 1\n", "invalid_text"),
        (b"BookieMetadataFormatVersion\t2\n\xff\xfe", "invalid_text"),
        (b"BookieMetadataFormatVersion\t1\n2\n", "truncated"),
        (b"BookieMetadataFormatVersion\t1\n2\nthree\n0\n", "invalid_text"),
        (b"BookieMetadataFormatVersion\t1\n2\n3\n0\nx\ta:1\n", "invalid_text"),
        (b"BookieMetadataFormatVersion\t1\n\xff\n", "invalid_text"),
    ],
)
def test_bad_input_is_refused_with_a_kind(data: bytes, kind: str) -> None:
    with pytest.raises(MetadataDecodeError) as info:
        decode_ledger_metadata(data)
    assert info.value.kind == kind
    assert str(info.value)


def test_every_truncation_of_a_real_ledger_is_refused() -> None:
    data = encode_ledger_metadata(_pulsar_ledger())
    for cut in range(len(data)):
        with pytest.raises(MetadataDecodeError):
            decode_ledger_metadata(data[:cut])


def test_error_keeps_its_kind_through_pickle() -> None:
    # Spark ships exceptions between processes by pickling them.
    error = pickle.loads(pickle.dumps(MetadataDecodeError("cut short", kind="truncated")))
    assert (error.kind, str(error)) == ("truncated", "cut short")
    with pytest.raises(ValueError):
        MetadataDecodeError("x", kind="no_such_kind")


def test_encoding_an_unknown_version_is_refused() -> None:
    with pytest.raises(ValueError):
        encode_ledger_metadata(_pulsar_ledger(), 4)


def test_pulsar_custom_metadata_skips_binary_and_refuses_non_utf8() -> None:
    assert pulsar_custom_metadata(_pulsar_ledger()) == {
        "application": "pulsar",
        "component": "managed-ledger",
        "pulsar/managed-ledger": "t/ns/persistent/x",
    }
    bad = replace(_pulsar_ledger(), custom_metadata={"application": b"pulsar", "pulsar/managed-ledger": b"\xff\xfe"})
    with pytest.raises(MetadataDecodeError, match="pulsar/managed-ledger") as info:
        pulsar_custom_metadata(bad)
    assert info.value.kind == "invalid_utf8"
