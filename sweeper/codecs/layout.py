"""BookKeeper's ledger-metadata znode layouts: ledger id <-> path, and the `LAYOUT` znode.

hierarchical (ids below 2^31-1): zero-pad to 10 digits, split 2/4/4  -> 00/0000/L0001
long hierarchical:                zero-pad to 19 digits, split 3/4/4/4/4 -> 000/0000/0000/0000/L0001
flat (deprecated):                L%010d directly under the root
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from sweeper.codecs.errors import LayoutError

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1

_SHORT_TOP = re.compile(r"^\d{2}$")
_LONG_TOP = re.compile(r"^\d{3}$")
_MIDDLE = re.compile(r"^\d{4}$")
_HIER_LEAF = re.compile(r"^L\d{4}$")
_FLAT_LEAF = re.compile(r"^L\d{10}$")


class LedgerLayout(StrEnum):
    FLAT = "flat"
    HIERARCHICAL = "hierarchical"  # short ids in the 2/4/4 tree, long ids in the 3/4/4/4/4 tree
    LONG_HIERARCHICAL = "long_hierarchical"  # every id in the 3/4/4/4/4 tree


_FACTORIES = {
    "org.apache.bookkeeper.meta.FlatLedgerManagerFactory": LedgerLayout.FLAT,
    "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory": LedgerLayout.HIERARCHICAL,
    "org.apache.bookkeeper.meta.LegacyHierarchicalLedgerManagerFactory": LedgerLayout.HIERARCHICAL,
    "org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory": LedgerLayout.LONG_HIERARCHICAL,
}
_LEGACY_NAMES = {"flat": LedgerLayout.FLAT, "hierarchical": LedgerLayout.HIERARCHICAL}
_LAYOUT_TEXT = {
    LedgerLayout.FLAT: "org.apache.bookkeeper.meta.FlatLedgerManagerFactory:1",
    LedgerLayout.HIERARCHICAL: "org.apache.bookkeeper.meta.HierarchicalLedgerManagerFactory:1",
    LedgerLayout.LONG_HIERARCHICAL: "org.apache.bookkeeper.meta.LongHierarchicalLedgerManagerFactory:1",
}


def parse_layout_znode(data: bytes) -> LedgerLayout:
    """Parse the `LAYOUT` znode: `<format version>\\n<factory class>:<factory version>`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LayoutError(f"LAYOUT znode is not UTF-8: {data[:40]!r}") from exc
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2 or not lines[0].isdigit():
        raise LayoutError(f"LAYOUT znode not understood: {text[:120]!r}")
    manager = lines[1].split(":", 1)[0].strip()
    if manager in _FACTORIES:
        return _FACTORIES[manager]
    if manager in _LEGACY_NAMES:
        return _LEGACY_NAMES[manager]
    raise LayoutError(
        f"unsupported ledger manager {manager!r} in LAYOUT: only ZooKeeper flat, hierarchical and "
        "long-hierarchical layouts can be scanned"
    )


def layout_znode(layout: LedgerLayout) -> bytes:
    return f"2\n{_LAYOUT_TEXT[layout]}\n".encode()


def ledger_relative_path(ledger_id: int, layout: LedgerLayout) -> str:
    """Path of a ledger's metadata znode relative to the ledgers root (no leading slash)."""
    if ledger_id < 0 or ledger_id > LONG_MAX:
        raise LayoutError(f"ledger id out of range: {ledger_id}")
    if layout is LedgerLayout.FLAT:
        if ledger_id > INT_MAX:
            raise LayoutError(f"flat layout cannot hold ledger {ledger_id} (above 2^31-1)")
        return f"L{ledger_id:010d}"
    if layout is LedgerLayout.HIERARCHICAL and ledger_id < INT_MAX:
        digits = f"{ledger_id:010d}"
        return f"{digits[0:2]}/{digits[2:6]}/L{digits[6:10]}"
    digits = f"{ledger_id:019d}"
    return f"{digits[0:3]}/{digits[3:7]}/{digits[7:11]}/{digits[11:15]}/L{digits[15:19]}"


def ledger_path(root: str, ledger_id: int, layout: LedgerLayout) -> str:
    return f"{root.rstrip('/')}/{ledger_relative_path(ledger_id, layout)}"


@dataclass(frozen=True)
class ParsedLedgerPath:
    ledger_id: int
    tree: str  # "short", "long" or "flat"


def parse_ledger_relative_path(relative: str) -> ParsedLedgerPath | None:
    """Ledger id for a leaf path below the root, or None when the path is not a ledger znode."""
    parts = relative.strip("/").split("/")
    if len(parts) == 1 and _FLAT_LEAF.match(parts[0]):
        return ParsedLedgerPath(int(parts[0][1:]), "flat")
    if (
        len(parts) == 3
        and _SHORT_TOP.match(parts[0])
        and _MIDDLE.match(parts[1])
        and _HIER_LEAF.match(parts[2])
    ):
        return ParsedLedgerPath(int(parts[0] + parts[1] + parts[2][1:]), "short")
    if (
        len(parts) == 5
        and _LONG_TOP.match(parts[0])
        and all(_MIDDLE.match(p) for p in parts[1:4])
        and _HIER_LEAF.match(parts[4])
    ):
        ledger_id = int("".join(parts[:4]) + parts[4][1:])
        if ledger_id <= LONG_MAX:
            return ParsedLedgerPath(ledger_id, "long")
    return None


def is_tree_top(name: str) -> bool:
    """Top-level children worth descending into: 2 digits (short tree) or 3 digits (long tree).

    Everything else under the root (available, cookies, LAYOUT, INSTANCEID, underreplication,
    idgen, idgen-long, ID-*) is BookKeeper's own bookkeeping, never a ledger.
    """
    return bool(_SHORT_TOP.match(name) or _LONG_TOP.match(name))


def is_middle(name: str) -> bool:
    return bool(_MIDDLE.match(name))


def is_hierarchical_leaf(name: str) -> bool:
    return bool(_HIER_LEAF.match(name))


def is_flat_leaf(name: str) -> bool:
    return bool(_FLAT_LEAF.match(name))


def tree_depth(top: str) -> int:
    """Number of directory levels (top included) above the leaves in the tree starting at `top`."""
    return 2 if _SHORT_TOP.match(top) else 4
