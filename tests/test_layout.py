import pytest

from sweeper.codecs.errors import LayoutError
from sweeper.codecs.layout import (
    INT_MAX,
    LedgerLayout,
    is_tree_top,
    layout_znode,
    ledger_relative_path,
    parse_layout_znode,
    parse_ledger_relative_path,
)


@pytest.mark.parametrize(
    ("ledger_id", "layout", "path"),
    [
        (1, LedgerLayout.HIERARCHICAL, "00/0000/L0001"),
        (1234567890, LedgerLayout.HIERARCHICAL, "12/3456/L7890"),
        (INT_MAX - 1, LedgerLayout.HIERARCHICAL, "21/4748/L3646"),
        # 2^31-1 itself is the first id on the long tree (BookKeeper: id < Integer.MAX_VALUE).
        (INT_MAX, LedgerLayout.HIERARCHICAL, "000/0000/0021/4748/L3647"),
        (2**63 - 1, LedgerLayout.HIERARCHICAL, "922/3372/0368/5477/L5807"),
        (1, LedgerLayout.LONG_HIERARCHICAL, "000/0000/0000/0000/L0001"),
        (42, LedgerLayout.FLAT, "L0000000042"),
    ],
)
def test_paths_round_trip(ledger_id: int, layout: LedgerLayout, path: str) -> None:
    assert ledger_relative_path(ledger_id, layout) == path
    parsed = parse_ledger_relative_path(path)
    assert parsed is not None and parsed.ledger_id == ledger_id


def test_flat_cannot_hold_long_ids() -> None:
    with pytest.raises(LayoutError):
        ledger_relative_path(INT_MAX + 5, LedgerLayout.FLAT)


@pytest.mark.parametrize(
    "path",
    ["available/L0001", "00/000/L0001", "00/0000/0001", "00/0000/L001", "idgen/ID-0001", "LAYOUT",
     "999/9999/9999/9999/L9999"],  # the last is beyond 2^63-1
)
def test_non_ledger_paths_are_rejected(path: str) -> None:
    assert parse_ledger_relative_path(path) is None


def test_only_numeric_tops_are_trees() -> None:
    assert [n for n in ["00", "000", "available", "cookies", "LAYOUT", "INSTANCEID", "underreplication",
                        "idgen", "idgen-long", "ID-1", "0", "0000"] if is_tree_top(n)] == ["00", "000"]


@pytest.mark.parametrize("layout", list(LedgerLayout))
def test_layout_znode_round_trip(layout: LedgerLayout) -> None:
    assert parse_layout_znode(layout_znode(layout)) is layout


def test_layout_znode_as_bookkeeper_writes_it() -> None:
    data = b"2\norg.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1"
    assert parse_layout_znode(data) is LedgerLayout.HIERARCHICAL


@pytest.mark.parametrize(
    "data",
    [b"", b"garbage", b"2\norg.apache.bookkeeper.meta.MSLedgerManagerFactory:1", b"\xff\xfe"],
)
def test_bad_layout_znode_is_a_clear_error(data: bytes) -> None:
    with pytest.raises(LayoutError):
        parse_layout_znode(data)
