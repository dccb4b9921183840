"""BookKeeper ledger-metadata formats, against upstream's own test vectors and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.codecs.bookkeeper import (
    LedgerMetadata,
    Segment,
    decode_ledger_metadata,
    encode_ledger_metadata,
    pulsar_custom_metadata,
)
from sweeper.codecs.errors import MetadataDecodeError

BOOKIES_1234 = ("192.0.2.1:1234", "192.0.2.2:1234", "192.0.2.3:1234")


def _fixture(shared_fixtures: Path, name: str) -> bytes:
    return (shared_fixtures / "bookkeeper" / name).read_bytes()


def test_version3_fixture(shared_fixtures: Path) -> None:
    md = decode_ledger_metadata(_fixture(shared_fixtures, "version3.bin"))
    assert md == LedgerMetadata(
        format_version=3, ensemble_size=3, write_quorum_size=2, ack_quorum_size=1, state="OPEN", last_entry_id=-1,
        length=0, segments=(Segment(0, ("192.0.2.1:3181", "192.0.2.2:3181", "192.0.2.3:3181")),),
        digest_type="CRC32C", password=b"foobar", ctime=-1, ctoken=0, custom_metadata={},
    )


@pytest.mark.parametrize(("name", "ctime"), [("version2.bin", None), ("version2ctime.bin", 1544002383075)])
def test_version2_fixtures(shared_fixtures: Path, name: str, ctime: int | None) -> None:
    md = decode_ledger_metadata(_fixture(shared_fixtures, name))
    assert md == LedgerMetadata(
        format_version=2, ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, state="IN_RECOVERY",
        last_entry_id=-1, length=0, segments=(Segment(0, BOOKIES_1234),), digest_type="CRC32",
        password=b"passwd", ctime=ctime, ctoken=None, custom_metadata={},
    )


def test_version1_fixture(shared_fixtures: Path) -> None:
    md = decode_ledger_metadata(_fixture(shared_fixtures, "version1.bin"))
    assert md == LedgerMetadata(
        format_version=1, ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, state="IN_RECOVERY",
        last_entry_id=-1, length=0, segments=(Segment(0, BOOKIES_1234),), digest_type=None, password=None,
        ctime=None, ctoken=None, custom_metadata={},
    )


def _pulsar_ledger(**changes: object) -> LedgerMetadata:
    base = LedgerMetadata(
        format_version=3, ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, state="CLOSED",
        last_entry_id=4711, length=123_456, segments=(Segment(0, BOOKIES_1234), Segment(100, BOOKIES_1234[::-1])),
        digest_type="CRC32C", password=b"", ctime=1_700_000_000_000, ctoken=0,
        custom_metadata={"application": b"pulsar", "component": b"managed-ledger",
                         "pulsar/managed-ledger": b"t/ns/persistent/x", "pulsar/compactedTo": b"\x00\xff\x01"},
    )
    return LedgerMetadata(**{**{f: getattr(base, f) for f in base.__slots__}, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_round_trip(version: int) -> None:
    md = _pulsar_ledger(format_version=version)
    decoded = decode_ledger_metadata(encode_ledger_metadata(md, version))
    if version == 1:  # v1 carries no digest, password, ctime or custom metadata
        assert (decoded.state, decoded.last_entry_id, decoded.segments) == (md.state, md.last_entry_id, md.segments)
    else:
        assert decoded == md


@pytest.mark.parametrize("state", ["OPEN", "IN_RECOVERY"])
def test_v1_states(state: str) -> None:
    md = decode_ledger_metadata(encode_ledger_metadata(_pulsar_ledger(state=state, last_entry_id=-1), 1))
    assert (md.state, md.last_entry_id) == (state, -1)


def test_absent_ack_quorum_means_write_quorum() -> None:
    text = (b"BookieMetadataFormatVersion\t2\nquorumSize: 3\nensembleSize: 5\nlength: 0\nstate: OPEN\n")
    md = decode_ledger_metadata(text)
    assert (md.write_quorum_size, md.ack_quorum_size, md.ctime, md.digest_type) == (3, 3, None, None)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"", "bad_header"),
        (b"\x00\x01garbage", "bad_header"),
        (b"BookieMetadataFormatVersion\t9\nwhatever", "unknown_format_version"),
        (b"BookieMetadataFormatVersion\tx\n", "bad_header"),
        (b"BookieMetadataFormatVersion\t3", "truncated"),
        (b"BookieMetadataFormatVersion\t3\n\x80", "truncated"),
        (b"BookieMetadataFormatVersion\t3\n\x05\x08\x02", "truncated"),
        (b"BookieMetadataFormatVersion\t3\n\x04\xff\xff\xff\xff", "invalid_protobuf"),
        (b"BookieMetadataFormatVersion\t3\n\x02\x08\x02", "invalid_protobuf"),  # required fields missing
        (b"BookieMetadataFormatVersion\t2\nquorumSize: two\n", "invalid_text"),
        (b"BookieMetadataFormatVersion\t2\nquorumSize: 2\n", "invalid_text"),  # required fields missing
        (b"BookieMetadataFormatVersion\t2\n\xff\xfe", "invalid_text"),
        (b"BookieMetadataFormatVersion\t1\n2\n", "truncated"),
        (b"BookieMetadataFormatVersion\t1\n2\nthree\n0\n", "invalid_text"),
    ],
)
def test_bad_input_is_refused_with_a_kind(data: bytes, kind: str) -> None:
    with pytest.raises(MetadataDecodeError) as info:
        decode_ledger_metadata(data)
    assert info.value.kind == kind
    assert str(info.value)


def test_truncated_real_ledger() -> None:
    data = encode_ledger_metadata(_pulsar_ledger())
    for cut in (len(data) - 1, len(data) - 20, 40):
        with pytest.raises(MetadataDecodeError):
            decode_ledger_metadata(data[:cut])


def test_pulsar_custom_metadata_skips_binary_and_refuses_non_utf8() -> None:
    md = _pulsar_ledger()
    assert pulsar_custom_metadata(md) == {"application": "pulsar", "component": "managed-ledger",
                                          "pulsar/managed-ledger": "t/ns/persistent/x"}
    bad = _pulsar_ledger(custom_metadata={"application": b"pulsar", "pulsar/managed-ledger": b"\xff\xfe"})
    with pytest.raises(MetadataDecodeError, match="pulsar/managed-ledger") as info:
        pulsar_custom_metadata(bad)
    assert info.value.kind == "invalid_utf8"
