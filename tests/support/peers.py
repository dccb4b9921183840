"""A peer Pulsar cluster's metadata on the tests' ZooKeeper, for the shared-BookKeeper tests."""

from __future__ import annotations

from typing import Any

from sweeper.codecs import pulsar as codec


def seed_peer(zk: Any, lists: dict[str, list[int]], live: bool = True) -> None:
    """A peer cluster's Pulsar metadata under /peer: managed ledgers (by name) listing ledger ids, and with `live` a
    broker registration (an ephemeral znode, as a running broker keeps)."""
    for ml, ids in lists.items():
        info = codec.decode_managed_ledger_info(b"")
        for ledger_id in ids:
            info.ledgerInfo.add(ledgerId=ledger_id, entries=1, size=10, timestamp=1)
        zk.create(f"/peer/managed-ledgers/{ml}", codec.encode_managed_ledger_info(info), makepath=True)
    zk.ensure_path("/peer/schemas")
    if live:
        zk.create("/peer/loadbalance/brokers/peer-broker:8080", b"{}", ephemeral=True, makepath=True)
