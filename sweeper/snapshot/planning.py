"""The snapshot's plan, made on the driver: the stores' roots checked readable, the directories listed down to the
scan units (ours and each peer's), their estimated cost, and how many sessions share them (dealt by cost)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import NoAuthError, NoNodeError
from pyspark.sql import SparkSession

from sweeper.broker.liveness import ClockReading, live_brokers, probe_clock
from sweeper.connections import MetadataEndpoint
from sweeper.metastore.migration import check_stores
from sweeper.rules.retention import parse_namespace_policies
from sweeper.scan import bookkeeper as bk_scan
from sweeper.scan import pulsar as pulsar_scan
from sweeper.scan.ownership import scan_bundle_owners
from sweeper.snapshot.settings import TASK_BK, TASK_ML, TASK_SCHEMA, SnapshotSettings
from sweeper.zk import client as zkutil
from sweeper.zk.errors import ZooKeeperPermissionError

log = logging.getLogger(__name__)


def _require_readable(client: Any, *paths: str) -> None:
    """The roots first, so that a missing READ is named as such rather than as a missing tree."""
    for path in paths:
        try:
            client.get(path)
        except NoNodeError:
            continue  # the planning says what is missing
        except NoAuthError as exc:
            raise ZooKeeperPermissionError(path, "READ", "the snapshot reads the whole tree") from exc


@contextlib.contextmanager
def _readable(root: str) -> Iterator[None]:
    """kazoo's NoAuth names no znode; listings below the root name theirs (sweeper.zk.client.children_many)."""
    try:
        yield
    except NoAuthError as exc:
        raise ZooKeeperPermissionError(root, "READ", "the snapshot lists and reads the whole tree") from exc


# Znodes one scan session reads before another one pays for itself: a session (and its Spark task and Python
# worker) costs about as much as reading this many, so a cluster of a few thousand znodes is one task and one
# session, and a large one as many as the cores can use.
ZNODES_PER_SESSION = 25_000


def scan_sessions(spark: SparkSession, settings: SnapshotSettings, units: int, znodes: int | None = None) -> int:
    """Scan partitions, each one ZooKeeper session per ensemble at a time: at most [scan] max_sessions, and no
    more than the estimated `znodes` keep busy ([spark] scan_partitions, when set, decides alone)."""
    return session_count(spark.sparkContext.defaultParallelism, settings.spark.scan_partitions,
                         settings.scan.max_sessions, units, znodes)


def session_count(parallelism: int, scan_partitions: int, max_sessions: int, units: int,
                  znodes: int | None = None) -> int:
    """scan_sessions' rule as a plain function: 4 per core, at most one per ZNODES_PER_SESSION estimated znodes,
    never more than the units or [scan] max_sessions; [spark] scan_partitions replaces the first two."""
    if scan_partitions:
        return max(1, min(scan_partitions, units, max_sessions))
    wanted = 4 * parallelism
    if znodes is not None:
        wanted = min(wanted, -(-znodes // ZNODES_PER_SESSION))
    return max(1, min(wanted, units, max_sessions))


def concurrent_scan_tasks(spark: SparkSession, sessions: int) -> int:
    """How many scan tasks can run at once: the task slots, when the cluster cannot grow or run a task twice; else
    every session (dynamic allocation may add executors mid-scan, speculation may start a second copy of a task)."""
    conf = spark.sparkContext.getConf()
    may_grow = any(conf.get(key, "false").lower() == "true"
                   for key in ("spark.dynamicAllocation.enabled", "spark.speculation"))
    return share_divisor(sessions, spark.sparkContext.defaultParallelism, may_grow)


def share_divisor(sessions: int, slots: int, may_grow: bool) -> int:
    """The rate limit's divisor: on 2 cores only 2 of 8 sessions run at once, and an 8-way split held the scan
    to a quarter of [scan] reads_per_second; tasks beyond the slots wait for one, so they never add load."""
    return max(1, sessions if may_grow else min(sessions, slots))


def estimated_znodes(plan: SnapshotPlan) -> int:
    """The znodes the scan will read, from what planning saw: the managed ledgers and schemas it counted, and
    each ledger directory's children as its stat says (a full directory when the store gives no count)."""
    return (sum(n for _, n in plan.pulsar.managed_ledger_domains) + sum(n for _, n in plan.pulsar.schema_namespaces)
            + sum(plan.ledger_children))


def _shard_payload(parent: str, shard: int, shards: int) -> str:
    return f"{parent}\n{shard}\n{shards}"


def _shard(payload: str) -> tuple[str, int, int]:
    parent, shard, shards = payload.split("\n")
    return parent, int(shard), int(shards)


@dataclass
class PeerPlan:
    """One peer cluster's metadata store ([safety] peer_metadata): its scan units, or why it cannot be read."""

    cluster: str
    tasks: list[tuple[str, str]] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    problem: str | None = None


@dataclass
class SnapshotPlan:
    tasks: list[tuple[str, str]]
    ledgers: bk_scan.LedgerScanPlan
    pulsar: pulsar_scan.PulsarScanPlan
    live_brokers: int
    clock: ClockReading
    # Retention debt (issue 15): namespace retention/TTL policies and bundle ownership, read on the driver.
    policy_rows: list[dict[str, Any]] = field(default_factory=list)
    owner_rows: list[dict[str, Any]] = field(default_factory=list)
    owners_problem: str | None = None
    peers: list[PeerPlan] = field(default_factory=list)
    ledger_children: list[int] = field(default_factory=list)  # per ledger unit, its leaves (an estimate)

    def task_weights(self) -> list[float]:
        """Each task's estimated cost, in ledger znodes read, aligned with `tasks` (see deal_tasks)."""
        weights: dict[tuple[str, str], float] = dict(zip(((TASK_BK, u) for u in self.ledgers.units),
                                                         self.ledger_children, strict=False))
        children = {TASK_ML: dict(self.pulsar.managed_ledger_domains), TASK_SCHEMA: dict(self.pulsar.schema_namespaces)}
        for task in self.tasks:
            if task[0] in children:
                parent, _, shards = _shard(task[1])
                scale = MANAGED_LEDGER_WEIGHT if task[0] == TASK_ML else 1.0
                weights[task] = scale * children[task[0]].get(parent, 0) / shards
        return [weights.get(task, float(LEAVES_PER_DIRECTORY)) for task in self.tasks]


LEAVES_PER_DIRECTORY = 10_000  # a tree layout's leaf directory holds at most this many ledgers
# A managed ledger costs a scan task about what four ledger znodes do (its znode, its cursors' listing and znodes,
# its ledger list's rows): the 225k bench's task CPU, split by unit kind.
MANAGED_LEDGER_WEIGHT = 4.0


def deal_tasks(tasks: list[tuple[str, str]], weights: list[float], partitions: int) -> list[list[tuple[str, str]]]:
    """The tasks in `partitions` of about equal estimated cost: the heaviest first, each to the lightest partition
    so far. Dealt round-robin, one partition of a 225k scan ran 0.6 s past the other core's last one."""
    loads = [0.0] * partitions
    dealt: list[list[tuple[str, str]]] = [[] for _ in range(partitions)]
    for weight, index in sorted(((w, i) for i, w in enumerate(weights)), key=lambda p: (-p[0], p[1])):
        lightest = min(range(partitions), key=loads.__getitem__)
        loads[lightest] += weight
        dealt[lightest].append(tasks[index])
    return dealt


def _ledger_children(client: Any, root: str, units: list[str]) -> list[int]:
    """Each ledger unit's leaf count: a flat unit names its leaves; a tree unit's directory stat counts them (one
    pipelined read per unit). A store whose stat has no count is taken as full (a tree directory holds at most
    10,000 leaves): more sessions than needed, never fewer."""
    sizes = {u: u.count(",") + 1 for u in units if u.startswith(bk_scan.LEAVES_PREFIX)}
    trees = [u for u in units if not u.startswith(bk_scan.LEAVES_PREFIX)]
    try:
        if hasattr(client, "exists_async"):  # kazoo: pipelined
            pending = [client.exists_async(zkutil.join(root, u)) for u in trees]
            stats = [r.get(timeout=30) for r in pending]
        else:  # an Oxia store: its stat counts a directory's children too
            stats = [client.exists(zkutil.join(root, u)) for u in trees]
        sizes.update((unit, _leaves(stat)) for unit, stat in zip(trees, stats, strict=True))
    except Exception as exc:  # an estimate only: never a reason to fail the snapshot
        log.debug("cannot size the ledger units: %s", exc)
        sizes.update((unit, LEAVES_PER_DIRECTORY) for unit in trees)
    return [sizes[u] for u in units]


def _leaves(stat: Any) -> int:
    if stat is None:  # gone since planning listed it
        return 0
    children = getattr(stat, "numChildren", None)
    return LEAVES_PER_DIRECTORY if children is None else int(children)


def plan_tasks(settings: SnapshotSettings) -> SnapshotPlan:
    connections = settings.connections
    # A store PIP-454 migrated away from is a stale copy: refused before anything is read (issue 24).
    check_stores(connections.pulsar, settings.pulsar_store, deleting=False,
                 acknowledged_completed=settings.safety.acknowledge_migration_completed,
                 source=connections.migration_source)
    bk_client = connections.bookkeeper.connect()
    try:
        root = settings.bookkeeper.ledgers_root
        _require_readable(bk_client, root, zkutil.join(root, "LAYOUT"))
        with _readable(root):
            ledger_plan = bk_scan.plan_ledger_units(
                bk_client, root, driver_writes_layout=settings.bookkeeper.writes_layout_record)
        ledger_children = _ledger_children(bk_client, root, ledger_plan.units)
        clock = probe_clock(bk_client, settings.safety.clock_probe_path)
    finally:
        zkutil.close(bk_client)
    pulsar_client = connections.pulsar.connect()
    try:
        _require_readable(pulsar_client, settings.pulsar.managed_ledgers_root, settings.pulsar.schemas_root)
        with _readable(f"{settings.pulsar.managed_ledgers_root} or {settings.pulsar.schemas_root}"):
            pulsar_plan = pulsar_scan.plan_pulsar(
                pulsar_client, settings.pulsar.managed_ledgers_root, settings.pulsar.schemas_root
            )
        brokers = len(live_brokers(pulsar_client, settings.pulsar.brokers_path))
        owner_rows, owners_problem = scan_bundle_owners(pulsar_client, settings.retention.bundle_owners_root)
        contents: dict[str, tuple[bytes, int]] = {}
        if not settings.pulsar.configuration_store:
            policies = pulsar_scan.plan_namespace_policies(pulsar_client, settings.pulsar.policies_root, contents)
    finally:
        zkutil.close(pulsar_client)
    if connections.configuration_store is not None:
        with connections.configuration_store.session() as store_client:
            policies = pulsar_scan.plan_namespace_policies(store_client, settings.pulsar.policies_root, contents)
    for namespace in policies:
        pulsar_plan.namespaces.setdefault(namespace, set()).add("policies")
    tasks = [(TASK_BK, unit) for unit in ledger_plan.units] + _pulsar_tasks(pulsar_plan, settings.scan.chunk)
    return SnapshotPlan(tasks, ledger_plan, pulsar_plan, brokers, clock,
                        [namespace_policy_row(ns, data, version) for ns, (data, version) in sorted(contents.items())],
                        owner_rows, owners_problem, [plan_peer(settings, peer) for peer in connections.peers],
                        ledger_children)


def _pulsar_tasks(plan: pulsar_scan.PulsarScanPlan, chunk: int) -> list[tuple[str, str]]:
    # Directories and their sizes only: each task lists its shard of a directory itself.
    return ([(TASK_ML, _shard_payload(*s)) for s in pulsar_scan.shards(plan.managed_ledger_domains, chunk)]
            + [(TASK_SCHEMA, _shard_payload(*s)) for s in pulsar_scan.shards(plan.schema_namespaces, chunk)])


def plan_peer(settings: SnapshotSettings, peer: MetadataEndpoint) -> PeerPlan:
    """A peer's scan, planned like ours (same roots, [pulsar]'s TLS/SASL settings), or why it cannot be trusted.

    A peer store without a live broker may be a stale copy (a cluster moved elsewhere, a backup): its
    references would be incomplete, so it counts as unread, the way our own liveness gate refuses such a store.
    """
    cluster = peer.hosts
    try:
        client = peer.connect()
    except Exception as exc:
        return PeerPlan(cluster, problem=f"cannot connect: {type(exc).__name__}: {exc}")
    try:
        _require_readable(client, settings.pulsar.managed_ledgers_root, settings.pulsar.schemas_root)
        if client.exists(settings.pulsar.managed_ledgers_root) is None:
            return PeerPlan(cluster, problem=f"no {settings.pulsar.managed_ledgers_root} there: not a Pulsar metadata "
                                             "store (check the chroot)")
        plan = pulsar_scan.plan_pulsar(client, settings.pulsar.managed_ledgers_root, settings.pulsar.schemas_root)
        if not live_brokers(client, settings.pulsar.brokers_path):
            return PeerPlan(cluster, problem=f"no live broker registered under {settings.pulsar.brokers_path}: a stale "
                                             "copy cannot vouch for what the peer references")
        return PeerPlan(cluster, _pulsar_tasks(plan, settings.scan.chunk), sorted(plan.namespaces))
    except Exception as exc:
        return PeerPlan(cluster, problem=f"{type(exc).__name__}: {exc}")
    finally:
        zkutil.close(client)


def namespace_policy_row(namespace: str, data: bytes, version: int) -> dict[str, Any]:
    """The retention fields of a namespace's Policies JSON, parsed here so the JSON itself (which may hold
    offload credentials) never reaches a table."""
    read = parse_namespace_policies(data)
    return {"record_type": "namespace_policies", "namespace": namespace, "readable": read.readable,
            "error": read.error, "retention_minutes": read.retention_minutes,
            "retention_size_mb": read.retention_size_mb, "ttl_seconds": read.ttl_seconds, "deleted": read.deleted,
            "zk_version": version}

