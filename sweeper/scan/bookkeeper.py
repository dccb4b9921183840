"""Scan BookKeeper's ledger metadata in ZooKeeper.

The driver plans (`plan_ledger_units`): it lists the top of the tree down to the directories
that hold ledger znodes. Each Spark task then takes some of those directories, opens its own
ZooKeeper session and reads them with pipelined requests (`scan_ledger_units`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from sweeper._proto import bookkeeper_metadata_pb2 as pb
from sweeper.codecs.bookkeeper import (
    DIGEST_NAMES,
    INVALID_ENTRY_ID,
    STATE_NAMES,
    LedgerMetadata,
    all_text,
    as_text,
    custom_metadata_of,
    decode_ledger_message,
    decode_ledger_metadata,
    ledger_message,
)
from sweeper.codecs.errors import LayoutError, MetadataDecodeError
from sweeper.codecs.layout import (
    LONG_MAX,
    LedgerLayout,
    is_flat_leaf,
    is_hierarchical_leaf,
    is_middle,
    is_tree_top,
    parse_layout_znode,
    parse_ledger_relative_path,
    tree_depth,
)
from sweeper.metastore.oxia import capabilities_of
from sweeper.rules.safety import ledger_created_ms
from sweeper.scan import Row, RowChunk, quarantine_row
from sweeper.zk import client as zkutil

# Keys whose values decide ownership: if one of them is not text we cannot trust the ledger.
OWNERSHIP_KEYS = frozenset(
    {
        "application",
        "component",
        "pulsar/managed-ledger",
        "pulsar/cursor",
        "pulsar/schemaId",
        "pulsar/compactedTopic",
        "pulsar/delayedIndexBucketKey",
        "pulsar/delayedIndexTopic",
        "pulsar/delayedIndexCursor",
    }
)

LEAVES_PREFIX = "leaves:"  # a unit that is an explicit list of flat-layout leaves


@dataclass
class LedgerScanPlan:
    root: str
    layout: LedgerLayout
    units: list[str]  # directories holding leaves (relative to root), or "leaves:a,b,c"
    quarantine: list[Row] = field(default_factory=list)  # unexpected znodes met while planning


def read_layout(client: KazooClient, root: str, driver_writes_layout: bool = True) -> LedgerLayout:
    """The layout `<root>/LAYOUT` records. Where none is written (an Oxia store; bookies on Pulsar's
    `metadata-store:` driver, `driver_writes_layout=False`) a missing record means hierarchical; elsewhere a
    root without one is no ledgers root and is refused."""
    zkutil.require_node(client, root, "BookKeeper ledgers")
    try:
        data, _ = client.get(zkutil.join(root, "LAYOUT"))
    except NoNodeError as exc:
        if not (driver_writes_layout and capabilities_of(client).layout_record):
            # Pulsar's metadata-store driver writes no LAYOUT and keeps every ledger at the hybrid hierarchical
            # path (PulsarLedgerManager: StringUtils.getHybridHierarchicalLedgerPath), which HIERARCHICAL is.
            return LedgerLayout.HIERARCHICAL
        raise LayoutError(
            f"no LAYOUT znode under {root!r}: is this a BookKeeper ledgers root? If the bookies use Pulsar's "
            "metadata-store: driver (which writes none), copy bookkeeper.conf's metadataServiceUri into [bookkeeper] "
            "metadata_service_uri"
        ) from exc
    except Exception as exc:
        raise LayoutError(
            f"no LAYOUT znode under {root!r}: is this a BookKeeper ledgers root? ({exc.__class__.__name__})"
        ) from exc
    return parse_layout_znode(data)


def plan_ledger_units(client: KazooClient, root: str, flat_chunk: int = 5000,
                      driver_writes_layout: bool = True) -> LedgerScanPlan:
    layout = read_layout(client, root, driver_writes_layout)
    top_children = sorted(client.get_children(root))
    plan = LedgerScanPlan(root=root, layout=layout, units=[])
    if layout is LedgerLayout.FLAT:
        leaves = [name for name in top_children if is_flat_leaf(name)]
        for i in range(0, len(leaves), flat_chunk):
            plan.units.append(LEAVES_PREFIX + ",".join(leaves[i : i + flat_chunk]))
        for name in top_children:
            if is_tree_top(name):
                plan.quarantine.append(_unexpected(root, name, "hierarchical tree under a flat layout"))
        return plan

    for name in top_children:
        if is_flat_leaf(name):
            plan.quarantine.append(_unexpected(root, name, f"flat ledger znode under a {layout.value} layout"))
    # Walk each tree down to the directories that hold leaves, one level at a time, pipelined.
    frontier = [(name, tree_depth(name) - 1) for name in top_children if is_tree_top(name)]
    while frontier:
        leaf_parents = [rel for rel, remaining in frontier if remaining == 0]
        plan.units.extend(leaf_parents)
        descend = [(rel, remaining) for rel, remaining in frontier if remaining > 0]
        frontier = []
        depth_of = dict(descend)
        listing = zkutil.children_many(client, (zkutil.join(root, rel) for rel, _ in descend))
        for (rel, _), result in zip(descend, listing, strict=True):
            if result.error is not None:
                raise result.error
            for child in result.children or []:
                child_rel = f"{rel}/{child}"
                if is_middle(child):
                    frontier.append((child_rel, depth_of[rel] - 1))
                else:
                    plan.quarantine.append(_unexpected(root, child_rel, "not part of the ledger tree"))
    plan.units.sort()
    return plan


def _unexpected(root: str, relative: str, why: str) -> Row:
    return quarantine_row("layout", zkutil.join(root, relative), "unexpected_znode",
                          f"unexpected znode {relative!r} under the ledgers root: {why}")


def _bad_ledger(path: str, error_kind: str, error: str, raw: bytes | None = None, zk_version: int | None = None,
                ledger_id: int | None = None) -> Row:
    return quarantine_row("bookkeeper", path, error_kind, error, raw=raw, zk_version=zk_version, ledger_id=ledger_id)


def split_custom_metadata(custom: dict[str, bytes]) -> tuple[dict[str, str], dict[str, bytes]]:
    """Text values and binary values apart; raises when an ownership value is not text."""
    text: dict[str, str] = {}
    binary: dict[str, bytes] = {}
    for key, value in custom.items():
        try:
            text[key] = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            if key in OWNERSHIP_KEYS:
                raise MetadataDecodeError(
                    f"custom metadata {key!r} is not UTF-8: ownership cannot be read", kind="invalid_utf8"
                ) from exc
            binary[key] = value
    return text, binary


# The `bk_ledgers` columns a scan fills, in the table's order (run_id and captured_at are the packer's; a test holds
# this to sweeper.table_schemas). The scan hands its ledgers over as tuples in this order, ten thousand at a time: a
# dict a row, read back a column at a time, was a fifth of a scan task's CPU.
LEDGER_COLUMNS = (
    "ledger_id", "path", "tree", "zk_version", "zk_ctime_ms", "zk_mtime_ms", "format_version", "state",
    "ensemble_size", "write_quorum", "ack_quorum", "last_entry_id", "length", "metadata_ctime_ms", "created_ms",
    "created_source", "digest_type", "segments", "bookies", "custom_metadata", "custom_metadata_binary", "is_pulsar",
    "component", "managed_ledger", "cursor", "schema_id", "compacted_topic", "bucket_key", "bucket_topic",
    "bucket_cursor", "segment_first_entries", "segment_ensembles",
)
LEDGER_CHUNK_ROWS = 10_000


def ledger_values(path: str, ledger_id: int, tree: str, msg: pb.LedgerMetadataFormat, format_version: int,
                  zk_version: int, zk_ctime_ms: int, zk_mtime_ms: int) -> tuple[Any, ...]:
    """One `bk_ledgers` row in LEDGER_COLUMNS' order, from the znode's decoded message. The fields are read as
    decode_ledger_metadata reads them, after BookKeeper's LedgerMetadataSerDe.decodeFormat: the write quorum when
    the ack quorum is absent, a repeated custom-metadata key's last value; INVALID_ENTRY_ID when the last entry is
    absent, and text that is not UTF-8 decoded with replacement characters, as Java does."""
    bookies: set[str] = set()
    firsts: list[int] = []
    ensembles: list[list[str]] = []
    for segment in msg.segment:
        members = list(segment.ensembleMember)
        bookies.update(members)
        firsts.append(segment.firstEntryId)
        ensembles.append(members)
    if not all_text(bookies):
        bookies = set(map(as_text, bookies))
        ensembles = [[as_text(m) for m in members] for members in ensembles]
    text, binary = split_custom_metadata(custom_metadata_of(msg))
    has = msg.HasField
    stored_ctime = msg.ctime if has("ctime") else None
    metadata_ctime = stored_ctime if stored_ctime is not None and stored_ctime > 0 else None
    value_of = text.get
    return (
        ledger_id, path, tree, zk_version, zk_ctime_ms, zk_mtime_ms, format_version, STATE_NAMES[msg.state],
        msg.ensembleSize, msg.quorumSize, msg.ackQuorumSize if has("ackQuorumSize") else msg.quorumSize,
        msg.lastEntryId if has("lastEntryId") else INVALID_ENTRY_ID, msg.length, metadata_ctime,
        # The later of the broker's and ZooKeeper's clocks (sweeper.rules.safety.ledger_created_ms).
        ledger_created_ms(metadata_ctime, zk_ctime_ms),
        "metadata" if metadata_ctime is not None and metadata_ctime >= zk_ctime_ms else "znode",
        DIGEST_NAMES[msg.digestType] if has("digestType") else None, len(msg.segment), sorted(bookies), text,
        binary or None, value_of("application") == "pulsar", value_of("component"),
        value_of("pulsar/managed-ledger"), value_of("pulsar/cursor"), value_of("pulsar/schemaId"),
        value_of("pulsar/compactedTopic"), value_of("pulsar/delayedIndexBucketKey"),
        value_of("pulsar/delayedIndexTopic"), value_of("pulsar/delayedIndexCursor"), firsts, ensembles,
    )


def ledger_row(
    path: str, ledger_id: int, tree: str, md: LedgerMetadata, zk_version: int, zk_ctime_ms: int, zk_mtime_ms: int
) -> Row:
    """One `bk_ledgers` row as a dict (with its record_type), from decoded metadata of any format."""
    values = ledger_values(path, ledger_id, tree, ledger_message(md), md.format_version, zk_version, zk_ctime_ms,
                           zk_mtime_ms)
    return {"record_type": "bk_ledgers", **dict(zip(LEDGER_COLUMNS, values, strict=True))}


def _leaf_paths(
    reader: zkutil.ZnodeReader, root: str, units: list[str], window: int
) -> Iterator[tuple[str, str] | Row]:
    """(relative path, absolute path) of every ledger znode in `units`, or quarantine rows."""
    dirs = [u for u in units if not u.startswith(LEAVES_PREFIX)]
    for unit in units:
        if unit.startswith(LEAVES_PREFIX):
            for leaf in unit[len(LEAVES_PREFIX) :].split(","):
                yield leaf, zkutil.join(root, leaf)
    for unit, result in zip(dirs, reader.children_many((zkutil.join(root, d) for d in dirs), window),
                            strict=True):
        if result.error is not None:
            yield _bad_ledger(result.path, "read_error", repr(result.error))
            continue
        for child in result.children or []:  # None: the directory vanished, its ledgers with it
            relative = f"{unit}/{child}"
            if is_hierarchical_leaf(child):
                yield relative, zkutil.join(root, relative)
            else:
                yield _unexpected(root, relative, "not a ledger znode")


def scan_ledger_units(
    reader: zkutil.ZnodeReader, root: str, units: list[str], window: int = 1000
) -> Iterator[Row | RowChunk]:
    """`quarantine` rows, and the `bk_ledgers` rows in chunks; znodes that vanish mid-scan are skipped."""
    pending: list[tuple[str, str]] = []
    for item in _leaf_paths(reader, root, units, window):
        if isinstance(item, dict):
            yield item
        else:
            pending.append(item)
    relative_of = dict((absolute, relative) for relative, absolute in pending)
    parse = _LeafParser()
    ledgers: list[tuple[Any, ...]] = []
    for read in reader.get_many((absolute for _, absolute in pending), window):
        if read.error is not None:
            yield _bad_ledger(read.path, "read_error", repr(read.error))
            continue
        if read.data is None or read.stat is None:
            continue  # deleted since listing: normal while Pulsar works
        parsed = parse(relative_of[read.path])
        if parsed is None:
            yield _bad_ledger(read.path, "bad_path", "not a ledger path", read.data, read.stat.version)
            continue
        ledger_id, tree = parsed
        stat = read.stat
        try:
            decoded = decode_ledger_message(read.data)
            if decoded is None:  # v1: not protobuf
                md = decode_ledger_metadata(read.data)
                decoded = ledger_message(md), md.format_version
            ledgers.append(ledger_values(read.path, ledger_id, tree, *decoded, stat.version, stat.ctime, stat.mtime))
        except MetadataDecodeError as exc:
            yield _bad_ledger(read.path, exc.kind, str(exc), read.data, stat.version, ledger_id)
            continue
        if len(ledgers) >= LEDGER_CHUNK_ROWS:
            yield RowChunk("bk_ledgers", LEDGER_COLUMNS, ledgers)
            ledgers = []
    if ledgers:
        yield RowChunk("bk_ledgers", LEDGER_COLUMNS, ledgers)


class _LeafParser:
    """parse_ledger_relative_path for the many leaves of a few directories: each directory is parsed once (its
    digits and tree), each leaf then costs one match and one int() (a fifth of the whole parse, which was ~5% of
    a scan task's CPU). The result is parse_ledger_relative_path's, as (ledger id, tree), or None."""

    def __init__(self) -> None:
        self.directories: dict[str, tuple[str, str] | None] = {}

    def __call__(self, relative: str) -> tuple[int, str] | None:
        directory, _, leaf = relative.rpartition("/")
        if directory not in self.directories:
            # The directory as the whole parse reads it: a leaf of its own tree, with the lowest id in it.
            probe = parse_ledger_relative_path(f"{directory}/L0000") if directory else None
            self.directories[directory] = (
                None if probe is None else ("".join(directory.strip("/").split("/")), probe.tree))
        known = self.directories[directory]
        if known is None or not is_hierarchical_leaf(leaf):
            parsed = parse_ledger_relative_path(relative)
            return None if parsed is None else (parsed.ledger_id, parsed.tree)
        digits, tree = known
        ledger_id = int(digits + leaf[1:])
        if tree == "long" and ledger_id > LONG_MAX:
            return None
        return ledger_id, tree
