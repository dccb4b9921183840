"""PIP-454's live ZooKeeper-to-Oxia migration, as the sweeper must see it: which store is authoritative now.

The coordinator (`org.apache.pulsar.metadata.coordination.impl.MigrationCoordinator`, Pulsar 5.0) keeps one
record in the source store, `MigrationState.MIGRATION_FLAG_PATH`, written by Jackson from
`MigrationState(phase, targetUrl)`: `{"phase":"COPYING","targetUrl":"oxia://oxia1:6648/default"}`, with
`targetUrl` left out when null. Its phases (`MigrationPhase`):
- NOT_STARTED (also: no record) and FAILED: the source is authoritative, as before;
- PREPARATION and COPYING: `DualMetadataStore` refuses every write and the copy is in flight, so a delete now
  could race the copy (a ledger deleted in the source after it was copied stays listed in the target);
- COMPLETED: every broker reads and writes the target; the source is a stale copy whose references stop moving,
  so acting on it would delete what the target still uses.
The copy walks every record of the source, so the target may hold a copy of the flag frozen in the phase it
was copied in; a store that is the flag's own target therefore cannot tell an ongoing migration from that copy,
and the operator confirms it (`[safety] acknowledge_migration_completed`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import NoNodeError

from sweeper.errors import Refused
from sweeper.metastore.urls import StoreUrl, StoreUrlError, parse_pulsar_store_url

MIGRATION_FLAG_PATH = "/pulsar/migration-coordinator/migration"
NOT_STARTED, PREPARATION, COPYING, COMPLETED, FAILED = "NOT_STARTED", "PREPARATION", "COPYING", "COMPLETED", "FAILED"
PHASES = (NOT_STARTED, PREPARATION, COPYING, COMPLETED, FAILED)


class MigrationRefused(Refused):
    """A metadata migration makes this store the wrong one to act on now (exit 3)."""


@dataclass(frozen=True)
class MigrationState:
    phase: str = NOT_STARTED
    target_url: str = ""

    def describe(self) -> str:
        target = f" to {self.target_url}" if self.target_url else ""
        return f"PIP-454 migration{target} in phase {self.phase}"


def parse_migration_flag(data: bytes) -> MigrationState:
    """The record as Jackson wrote it; anything else refuses (a flag we cannot read is never taken as absent)."""
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MigrationRefused(f"{MIGRATION_FLAG_PATH} is not the JSON a migration coordinator writes ({exc}): "
                               "check the migration's status with pulsar-admin before running the sweeper") from None
    if not isinstance(body, dict) or body.get("phase") not in PHASES or not isinstance(body.get("targetUrl", ""), str):
        raise MigrationRefused(f"{MIGRATION_FLAG_PATH} holds {data[:200]!r}, not a migration phase this version "
                               f"knows ({', '.join(PHASES)}): refusing rather than guessing")
    return MigrationState(body["phase"], body.get("targetUrl") or "")


def read_migration(client: Any) -> MigrationState:
    """The flag in the store `client` reads (kazoo or `OxiaStore`); no record is NOT_STARTED."""
    try:
        data, _ = client.get(MIGRATION_FLAG_PATH)
    except NoNodeError:
        return MigrationState()
    return parse_migration_flag(data)


def _same_store(a: StoreUrl, target_url: str) -> bool:
    try:
        b = parse_pulsar_store_url(target_url)
    except StoreUrlError:
        return False
    return (a.kind, a.hosts, a.namespace) == (b.kind, b.hosts, b.namespace)


def migration_refusal(state: MigrationState, store: StoreUrl, deleting: bool,
                      acknowledged_completed: bool = False) -> str | None:
    """Why the sweeper must not act on `store` now, or None. `deleting`: the delete stage (reads are refused
    only where the store is stale)."""
    if state.phase in (NOT_STARTED, FAILED):
        return None
    on_target = bool(state.target_url) and _same_store(store, state.target_url)
    if state.phase == COMPLETED:
        if on_target:
            return None
        return (f"{store} was migrated to {state.target_url or 'another store'} ({state.describe()}): it is a stale "
                f"copy nobody updates. Point the sweeper at the target ([pulsar] metadata_store_url = "
                f"\"{state.target_url}\", and [bookkeeper] metadata_service_uri likewise)")
    if on_target and acknowledged_completed:
        return None
    if not deleting and not on_target:
        return None  # the source is still authoritative while the copy runs; only its writes are blocked
    if on_target:
        return (f"{store} holds a {state.describe()}: this is the migration's target, and the migration may "
                "still be running, or this may be the copy of the flag the migration made. If the source store's "
                "flag says COMPLETED, set [safety] acknowledge_migration_completed = true")
    return (f"{state.describe()}: metadata writes are blocked and the copy is in flight, so nothing is deleted. "
            f"Run again once it has COMPLETED, against {state.target_url or 'the target store'}")


def check_migration(client: Any, store: StoreUrl, deleting: bool, acknowledged_completed: bool = False) -> None:
    refusal = migration_refusal(read_migration(client), store, deleting, acknowledged_completed)
    if refusal:
        raise MigrationRefused(refusal)
