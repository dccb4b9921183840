"""The fast reader of plain v2 ledger metadata agrees with protobuf's text parser, or defers to it."""

from __future__ import annotations

import random

from google.protobuf import text_format

from sweeper._proto import bookkeeper_metadata_pb2 as pb
from sweeper.codecs.bookkeeper import LedgerMetadata, Segment, _fast_v2, encode_ledger_metadata

PLAIN = LedgerMetadata(
    format_version=2, ensemble_size=3, write_quorum_size=2, ack_quorum_size=2, state="CLOSED", last_entry_id=41,
    length=4242,
    segments=(Segment(0, ("b1:3181", "b2:3181", "b3:3181")), Segment(10, ("b4:3181", "b2:3181", "b3:3181"))),
    digest_type="CRC32C", password=b"", ctime=1777107325128, ctoken=None,
    custom_metadata={"application": b"pulsar", "component": b"managed-ledger",
                     "pulsar/managed-ledger": b"t/n/persistent/x"})


def _slow(text: str) -> pb.LedgerMetadataFormat | None:
    msg = pb.LedgerMetadataFormat()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError:
        return None
    return msg if msg.IsInitialized() else None


def test_plain_text_is_read_as_text_format_reads_it() -> None:
    text = encode_ledger_metadata(PLAIN, 2).split(b"\n", 1)[1].decode()
    fast, slow = _fast_v2(text), _slow(text)
    assert fast is not None and slow is not None
    assert fast.SerializeToString() == slow.SerializeToString()


def test_anything_else_is_left_to_text_format() -> None:
    base = "quorumSize: 2\nensembleSize: 3\nlength: 0\nstate: OPEN\n"
    for text in (base + "quorumSize: 2\n",  # a second singular value: text_format's error
                 base + "noSuchField: 1\n", base.replace("2", "010"), base.replace("OPEN", "1"),
                 base + "password: \"\\001\"\n", base + "# a comment\n", "quorumSize: 2\n",
                 base + "segment {\n  ensembleMember: \"a\"\n}\n", base + "segment {\n", base + "}\n",
                 base + "ackQuorumSize: 2147483648\n", base + "segment: \"x\"\n"):
        assert _fast_v2(text) is None, text


def test_mutated_text_is_never_read_differently() -> None:
    rng = random.Random(1)
    lines = encode_ledger_metadata(PLAIN, 2).split(b"\n", 1)[1].decode().split("\n")
    pieces = [*' \n\t:{}"#-0123456789abOPENCLOSED_', "segment {", "}", "firstEntryId: 1", "state: OPEN"]
    accepted = 0
    for _ in range(3000):
        mutant = list(lines)
        j = rng.randrange(len(mutant))
        k = rng.randrange(len(mutant[j]) + 1)
        if rng.random() < 0.3:
            del mutant[j]
        elif rng.random() < 0.5:
            mutant[j] = mutant[j][:k] + mutant[j][k + 1:]
        else:
            mutant[j] = mutant[j][:k] + rng.choice(pieces) + mutant[j][k:]
        text = "\n".join(mutant)
        fast = _fast_v2(text)
        if fast is not None:
            accepted += 1
            slow = _slow(text)
            assert slow is not None and fast.SerializeToString() == slow.SerializeToString(), text
    assert accepted > 100
