"""The scan's per-directory ledger path parser reads every path as the layout's own parser does."""

from __future__ import annotations

from sweeper.codecs.layout import LONG_MAX, LedgerLayout, ledger_relative_path, parse_ledger_relative_path
from sweeper.scan.bookkeeper import _LeafParser


def _whole(relative: str) -> tuple[int, str] | None:
    parsed = parse_ledger_relative_path(relative)
    return None if parsed is None else (parsed.ledger_id, parsed.tree)


def test_the_leaf_parser_agrees_with_the_whole_parse() -> None:
    ids = [0, 1, 9_999, 10_000, 2**31 - 2, 2**31 - 1, 2**31, 2**40 + 7, LONG_MAX - 1, LONG_MAX]
    paths = [ledger_relative_path(i, layout) for i in ids for layout in LedgerLayout
             if not (layout is LedgerLayout.FLAT and i > 2**31 - 1)]
    # The edges of the whole parse: beyond a long id, odd digits, trailing newlines, wrong depths and names.
    top = str(LONG_MAX).zfill(19)
    paths += [f"{top[:3]}/{top[3:7]}/{top[7:11]}/{top[11:15]}/L9999", "922/3372/0368/5477/L5808",
              "00/0000/L000", "00/0000/L00000", "00/0000/X0001", "00/0000/L0001\n", "/00/0000/L0001",
              "00/0000/L\u0660\u0660\u0660\u0661",
              "00/0000/", "0/0000/L0001", "00/000/L0001", "00/0000/0000/L0001", "L0000000001", "L000000001",
              "000/0000/0000/0000/L0001", "000/0000/0000/L0001", "", "/", "00/0000/L0001/"]
    parse = _LeafParser()
    for relative in paths * 2:  # twice: the second time from the parser's memory of each directory
        assert parse(relative) == _whole(relative), relative
