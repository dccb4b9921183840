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
and the operator confirms it (`[safety] acknowledge_migration_completed`). That confirmation holds only while the
source's own flag reads COMPLETED with this store as its target (`[safety] migration_source_store` names the source):
`startMigration` sets FAILED on any error of the copy and the brokers' `DualMetadataStore` goes back to the source
for reads and writes alike, so a FAILED migration leaves the target a partial copy nobody updates.

The flag is read when a snapshot or a delete starts, and again during a delete (`MigrationWatch`, before every
executor call of every chunk, and once more on the driver after the tasks): a migration that starts while a long
delete runs stops it within a chunk. DualMetadataStore refuses the brokers' writes in PREPARATION and COPYING, but
the sweeper writes to the source directly, and `MigrationCoordinator.copyPersistentData` walks the tree while it
changes: a ledger deleted after its znode was copied stays listed in the target.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from kazoo.exceptions import NoNodeError

from sweeper.metastore.errors import MigrationRefused, StoreUrlError
from sweeper.metastore.urls import StoreUrl, parse_pulsar_store_url

MIGRATION_FLAG_PATH = "/pulsar/migration-coordinator/migration"
NOT_STARTED, PREPARATION, COPYING, COMPLETED, FAILED = "NOT_STARTED", "PREPARATION", "COPYING", "COMPLETED", "FAILED"
PHASES = (NOT_STARTED, PREPARATION, COPYING, COMPLETED, FAILED)


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


def read_migration(client: Any, timeout_s: float | None = None) -> MigrationState:
    """The flag in the store `client` reads (kazoo, `OxiaStore` or `SplitStore`); no record is NOT_STARTED.
    `timeout_s`: wait at most this long (kazoo's plain `get` waits forever while its session reconnects)."""
    try:
        if timeout_s is None:
            data, _ = client.get(MIGRATION_FLAG_PATH)
        else:
            data, _ = client.get_async(MIGRATION_FLAG_PATH).get(timeout=timeout_s)
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
                "flag says COMPLETED, set [safety] acknowledge_migration_completed = true and name the source in "
                "[safety] migration_source_store")
    return (f"{state.describe()}: metadata writes are blocked and the copy is in flight, so nothing is deleted. "
            f"Run again once it has COMPLETED, against {state.target_url or 'the target store'}")


def acknowledgement_refusal(source_state: MigrationState | None, source: str, store: StoreUrl) -> str | None:
    """Why `[safety] acknowledge_migration_completed` does not hold now, or None: it holds only while the source
    store's own flag (`source_state`, read from `source`; None: no source store configured) reads COMPLETED with a
    targetUrl naming `store`. `MigrationCoordinator.startMigration` writes FAILED on any error of the copy, and
    `DualMetadataStore` then routes every read and write back to the source: the target keeps the partial copy."""
    fix = "set [safety] acknowledge_migration_completed = false until the source's flag reads COMPLETED"
    if source_state is None:
        return ("[safety] acknowledge_migration_completed = true needs [safety] migration_source_store, the store the "
                "migration copied from, whose flag must read COMPLETED")
    if source_state.phase == COMPLETED and source_state.target_url and _same_store(store, source_state.target_url):
        return None
    if source_state.phase == COMPLETED:
        return (f"the source store {source} was migrated to {source_state.target_url or 'another store'}, not to "
                f"{store}: the acknowledgement does not apply to this store")
    if source_state.phase == FAILED:
        return (f"the source store {source} holds a {source_state.describe()}: the brokers went back to the source "
                f"and {store} holds a partial copy nobody updates; {fix}")
    if source_state.phase in (PREPARATION, COPYING):
        return (f"the source store {source} holds a {source_state.describe()}: the copy to {store} is not complete; "
                f"{fix}")
    return (f"the source store {source} shows no migration ({source_state.phase}): {store} is not the completed "
            f"target of a migration from it (after a failed one the target keeps its partial copy); {fix}")


def check_migration(client: Any, store: StoreUrl, deleting: bool, acknowledged_completed: bool = False,
                    source: Any = None, source_name: str = "") -> None:
    """MigrationRefused unless `store` (read through `client`) may be acted on now. With the acknowledgement,
    `source` (a client on `source_name`, [safety] migration_source_store) must show the migration COMPLETED."""
    refusal = migration_refusal(read_migration(client), store, deleting, acknowledged_completed)
    if refusal is None and acknowledged_completed:
        refusal = acknowledgement_refusal(None if source is None else read_migration(source), source_name, store)
    if refusal:
        raise MigrationRefused(refusal)


class _Endpoint(Protocol):
    """`sweeper.connections.MetadataEndpoint`, as far as this module uses it (no import: connections is above)."""

    @property
    def hosts(self) -> str: ...

    def session(self) -> contextlib.AbstractContextManager[Any]: ...


def check_stores(pulsar: _Endpoint, store: StoreUrl, deleting: bool, acknowledged_completed: bool = False,
                 source: _Endpoint | None = None) -> None:
    """`check_migration` on sessions of their own: Pulsar's store, and with the acknowledgement the source store."""
    with pulsar.session() as client, _source_session(source if acknowledged_completed else None) as source_client:
        check_migration(client, store, deleting, acknowledged_completed, source_client,
                        source.hosts if source is not None else "")


@contextlib.contextmanager
def _source_session(source: _Endpoint | None) -> Iterator[Any]:
    if source is None:
        yield None
        return
    with source.session() as client:
        yield client


# ---- during a delete ---------------------------------------------------------------------------------------------

# The detail of a record a delete left alone because a migration began while it ran; the driver raises
# MigrationRefused (exit 3) for it once every outcome is committed.
MIGRATION_NOT_ATTEMPTED = "not attempted: a PIP-454 metadata migration stopped the run"
# The detail when the flag could not be read during the delete: the rest is queued for retry, not refused.
FLAG_UNREADABLE = "not attempted: PIP-454's migration flag could not be re-read"


@dataclass(frozen=True)
class MigrationGuard:
    """What a delete task needs to re-read the flag: small and picklable."""

    store: StoreUrl  # Pulsar's store, as migration_refusal judges it
    acknowledged_completed: bool = False
    timeout_s: float = 10.0

    def watch(self, client: Any) -> MigrationWatch:
        return MigrationWatch(client, self)


class MigrationWatch:
    """The flag re-read through a task's own client before each call that may delete. Once a read says stop (or
    cannot be read), the task stops for good: a migration never goes back to NOT_STARTED by itself."""

    def __init__(self, client: Any, guard: MigrationGuard) -> None:
        self.client, self.guard = client, guard
        self.detail: str | None = None  # MIGRATION_NOT_ATTEMPTED or FLAG_UNREADABLE, once stopped
        self.error: str | None = None  # why, for the record's `error`

    def stop(self) -> bool:
        """Read the flag (unless stopped already): True when nothing more may be deleted."""
        if self.detail is not None:
            return True
        try:
            state = read_migration(self.client, self.guard.timeout_s)
        except MigrationRefused as exc:
            self.detail, self.error = MIGRATION_NOT_ATTEMPTED, str(exc)
            return True
        except Exception as exc:  # a flag we cannot read is never taken as absent
            self.detail, self.error = FLAG_UNREADABLE, f"{MIGRATION_FLAG_PATH}: {type(exc).__name__}: {exc}"
            return True
        refusal = migration_refusal(state, self.guard.store, True, self.guard.acknowledged_completed)
        if refusal is not None:
            self.detail, self.error = MIGRATION_NOT_ATTEMPTED, refusal
        return refusal is not None
