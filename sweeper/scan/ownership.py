"""Which namespace bundles a live broker owns, from ZooKeeper (the modular load manager's view).

With the modular load manager (Pulsar 4.0's default, `ModularLoadManagerImpl`) a broker that owns
a bundle holds an ephemeral znode `/namespace/<tenant>/<namespace>/<0xlower_0xupper>`
(`OwnershipCache`, `ServiceUnitUtils.OWNER_INFO_ROOT`), and acquiring a bundle loads every
persistent topic in it (`NamespaceService.searchForCandidateBroker` -> `PulsarService.loadNamespaceTopics`).
A topic whose bundle nobody owns is loaded nowhere. The extensible load manager keeps ownership in a
system topic instead: then this tree is empty and ownership is simply not known (never "unowned").
"""

from __future__ import annotations

import json
from typing import Any

from kazoo.client import KazooClient

from sweeper.rules.retention import parse_bundle_range
from sweeper.zk import client as zkutil

MAX_DEPTH = 4  # <tenant>/<namespace>/<bundle>, or <tenant>/<cluster>/<namespace>/<bundle> for old names


def scan_bundle_owners(client: KazooClient, root: str) -> tuple[list[dict[str, Any]], str | None]:
    """(`bundle_owners` rows, why ownership could not be read or None). Reads only: never acquires anything."""
    try:
        if client.exists(root) is None:
            return [], f"{root} does not exist (extensible load manager, or no bundle ever owned)"
        level = [""]
        bundles: list[str] = []
        for _ in range(MAX_DEPTH):
            paths = [zkutil.join(root, rel) if rel else root for rel in level]
            deeper: list[str] = []
            for rel, listing in zip(level, zkutil.children_many(client, paths), strict=True):
                if listing.error is not None:
                    return [], f"cannot list {zkutil.join(root, rel)}: {listing.error!r}"
                for child in listing.children or []:
                    name = f"{rel}/{child}" if rel else child
                    (bundles if parse_bundle_range(child) is not None and "/" in name else deeper).append(name)
            level = deeper
            if not level:
                break
        rows = []
        for rel, read in zip(bundles, zkutil.get_many(client, (zkutil.join(root, b) for b in bundles)), strict=True):
            if read.error is not None or read.stat is None:
                continue  # released between listing and reading
            namespace, bundle = rel.rsplit("/", 1)
            lower, upper = parse_bundle_range(bundle) or (0, 0)
            rows.append({"record_type": "bundle_owners", "namespace": namespace, "bundle": bundle, "lower": lower,
                         "upper": upper, "ephemeral": bool(read.stat.ephemeralOwner),
                         "owner": _owner_url(read.data)})
        return rows, None
    except Exception as exc:  # evidence only: an unreadable tree must not fail the snapshot
        return [], f"cannot read {root}: {type(exc).__name__}: {exc}"


def _owner_url(data: bytes | None) -> str | None:
    """The owning broker's `nativeUrl` (NamespaceEphemeralData), when the znode holds one."""
    try:
        value = json.loads(data or b"").get("nativeUrl")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None
