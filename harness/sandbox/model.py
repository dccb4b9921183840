"""A synthetic Pulsar cluster, as plain records, with the ground truth of every ledger.

`build_cluster(spec)` is deterministic in `spec` (same seed, same cluster), pure, and knows
for each BookKeeper ledger what a correct sweeper must conclude about it. Seeding writes it
to ZooKeeper (`harness.sandbox.seed`); tests compare snapshots and plans against it.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from harness.sandbox.entities import (  # noqa: F401 - re-exported: the model's records are imported from here
    BUCKET_PREFIX,
    COMPACTED_TOPIC_LEDGER,
    COMPACTION_CURSOR,
    DAY_MS,
    GRACE_MS,
    HOUR_MS,
    SPECIAL_TOPIC,
    BkLedger,
    Cursor,
    ManagedLedger,
    MlLedger,
    Offload,
    OffloadObject,
    OrphanKind,
    SandboxSpec,
    SchemaEntry,
    SchemaLocatorModel,
    Status,
    _now_ms,
    bucket_custom,
    compacted_custom,
    cursor_custom,
    encode_name,
    ml_custom,
    pulsar_protects_cursor,
    schema_custom,
)
from harness.sandbox.retention_scenarios import RetentionExpectation, add_retention_scenarios, namespace_policies
from sweeper.codecs.layout import INT_MAX, LedgerLayout
from sweeper.codecs.pulsar import offload_uuid


@dataclass
class SandboxCluster:
    spec: SandboxSpec
    ledgers: dict[int, BkLedger]
    managed_ledgers: list[ManagedLedger]
    schemas: list[SchemaLocatorModel]
    missing_ledgers: list[int]  # referenced, never created in BookKeeper
    offload_objects: list[OffloadObject] = field(default_factory=list)
    # Compaction pointers ZooKeeper holds while the cursor ledger has a newer one, naming a deleted ledger:
    # reported as possibly stale, never as lost data.
    stale_pointers: list[int] = field(default_factory=list)
    # Retention debt (issue 15): each namespace's Policies JSON (None: no znode), and what a sweeper must report.
    namespace_policies: dict[str, bytes | None] = field(default_factory=dict)
    retention: list[RetentionExpectation] = field(default_factory=list)

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of the cluster (with policies in the configuration store, or topics), topics or not."""
        spec = self.spec
        regular = [f"tenant-{t}/ns-{n}" for t in range(spec.tenants) for n in range(spec.namespaces_per_tenant)]
        return regular + [ns for ns in self.namespace_policies if ns not in regular]

    def deletable(self, offloads_verified: bool) -> set[int]:
        """The ledgers a correct sweeper must delete (no more, no fewer), with or without the offload buckets listed
        (`[offload] enabled`): every `ORPHAN`, less those `kept` names.

        The statuses hold what does not depend on the sweeper's config; this is the one ground truth that does."""
        kept = self.kept(offloads_verified)
        return {i for i, x in self.ledgers.items() if x.status is Status.ORPHAN and i not in kept}

    def kept(self, offloads_verified: bool) -> dict[int, str]:
        """Orphans a correct sweeper keeps with this config, each with why (the bench prints them by cause).

        A ledger its managed ledger lists offloaded with `bookkeeperDeleted=true` is garbage to Pulsar: its trim
        writes that flag for a complete offload, commits the list, and only then deletes the BookKeeper copy,
        giving up after a few retries (ManagedLedgerImpl.internalTrimLedgers, offloadedLedgersToDelete ->
        asyncDeleteLedgerFromBookKeeper). But that copy may be the only one left if the offloaded objects were
        lost, so a sweeper that cannot see the bucket keeps it (`unknown`, offloaded_copy_not_verified:
        sweeper.rules.classify._managed_ledger, DESIGN invariant 13)."""
        if offloads_verified:
            return {}
        return {i: "offloaded copy not verifiable: no bucket listed ([offload] enabled = false)"
                for i, x in self.ledgers.items()
                if x.status is Status.ORPHAN and x.orphan_kind is OrphanKind.BOOKKEEPER_DELETED_BUT_PRESENT}

    def counts(self) -> dict[str, int]:
        by_status = Counter(ledger.status.value for ledger in self.ledgers.values())
        by_kind = Counter(
            ledger.orphan_kind.value for ledger in self.ledgers.values() if ledger.orphan_kind is not None
        )
        return {
            "bk_ledgers": len(self.ledgers),
            "managed_ledgers": len(self.managed_ledgers),
            "ml_ledgers": sum(len(ml.ledgers) for ml in self.managed_ledgers),
            "ml_cursors": sum(len(ml.cursors) for ml in self.managed_ledgers),
            "schema_ledgers": sum(len(s.entries) for s in self.schemas),
            "missing_ledgers": len(self.missing_ledgers),
            "stale_pointers": len(self.stale_pointers),
            "offload_objects": len(self.offload_objects),
            "offload_objects.orphan": sum(1 for o in self.offload_objects if o.status == "orphan"),
            **{f"status.{k}": v for k, v in sorted(by_status.items())},
            **{f"orphan.{k}": v for k, v in sorted(by_kind.items())},
        }


class _Builder:
    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.next_short = 1
        self.next_long = INT_MAX + 1 + self.rng.randrange(1_000)
        self.ledgers: dict[int, BkLedger] = {}
        self.managed_ledgers: list[ManagedLedger] = []
        self.schemas: list[SchemaLocatorModel] = []
        self.schema_index: dict[str, SchemaLocatorModel] = {}
        self.missing: list[int] = []
        self.compaction_mode: dict[str, str] = {}  # managed ledger -> closed | lagging | unrecorded
        self.compaction_spare: dict[str, int] = {}  # an id below a lagging pointer, for a leaked older compaction
        self.stale_pointers: dict[int, str] = {}  # compaction pointers naming a deleted ledger -> managed ledger
        self.bookies = [f"bookie-{i}.bookkeeper.pulsar.svc:3181" for i in range(6)]

    # -- ids and ledgers -------------------------------------------------------------------
    def new_id(self, long_ids: bool) -> int:
        if self.spec.layout is LedgerLayout.LONG_HIERARCHICAL or (
            long_ids and self.spec.layout is LedgerLayout.HIERARCHICAL
        ):
            ledger_id = self.next_long
            self.next_long += 1 + self.rng.randrange(3)
            return ledger_id
        ledger_id = self.next_short
        self.next_short += 1
        return ledger_id

    def add_ledger(
        self,
        ledger_id: int,
        custom: dict[str, bytes],
        age_ms: int,
        status: Status,
        orphan_kind: OrphanKind | None = None,
        open_ledger: bool = False,
        referrer: str | None = None,
    ) -> BkLedger:
        rng = self.rng
        # One ledger in ten carries no metadata ctime: its age must come from the znode.
        ctime = None if rng.random() < 0.1 else self.spec.now_ms - age_ms
        if status in (Status.ORPHAN, Status.YOUNG_ORPHAN, Status.PROTECTED):
            ctime = self.spec.now_ms - age_ms  # orphans' ages are part of the ground truth
        entries = 0 if open_ledger else rng.randrange(1, 50_000)
        ledger = BkLedger(
            ledger_id=ledger_id,
            custom=custom,
            ctime_ms=ctime,
            state="OPEN" if open_ledger else "CLOSED",
            last_entry_id=-1 if open_ledger else entries - 1,
            length=0 if open_ledger else entries * rng.randrange(100, 2_000),
            ensemble=tuple(rng.sample(self.bookies, 3)),
            format_version=2 if rng.random() < 0.05 else 3,
            status=status,
            orphan_kind=orphan_kind,
            referrers=[referrer] if referrer else [],
        )
        self.ledgers[ledger_id] = ledger
        return ledger

    def old_age(self) -> int:
        return self.rng.randrange(8 * DAY_MS, 400 * DAY_MS)

    # -- topics ----------------------------------------------------------------------------
    def topic_names(self) -> list[tuple[str, str, str]]:
        spec, rng = self.spec, self.rng
        namespaces = [
            (f"tenant-{t}", f"ns-{n}") for t in range(spec.tenants) for n in range(spec.namespaces_per_tenant)
        ]
        names: list[tuple[str, str, str]] = []
        base = 0
        while len(names) < spec.topics:
            tenant, ns = namespaces[base % len(namespaces)]
            # Topic 1 exercises URL-encoded managed-ledger names.
            local = SPECIAL_TOPIC if base == 1 else f"topic-{base}"
            partitions = rng.choice([0, 0, 0, 2, 3]) if base > 1 else 0
            if partitions:
                for p in range(partitions):
                    names.append((tenant, ns, f"{local}-partition-{p}"))
            else:
                names.append((tenant, ns, local))
            base += 1
        return names[: spec.topics]

    def build_topic(self, tenant: str, ns: str, topic: str, long_ids: bool) -> ManagedLedger:
        rng, now = self.rng, self.spec.now_ms
        ml = ManagedLedger(
            tenant=tenant,
            namespace=ns,
            topic=topic,
            ledgers=[],
            cursors=[],
            properties={},
            compression=rng.choice(["NONE", "NONE", "NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"]),
        )
        name = ml.name
        rollovers = rng.randrange(1, self.spec.max_rollovers + 1)
        offload_upto = rng.randrange(0, rollovers) if rng.random() < 0.2 else 0
        age = self.old_age()
        for i in range(rollovers):
            ledger_id = self.new_id(long_ids)
            current = i == rollovers - 1
            offload = None
            bookkeeper_deleted = False
            if i < offload_upto:
                if rng.random() < 0.1:
                    # Being offloaded right now: not complete yet, started an hour ago.
                    offload = self.offload(complete=False, bookkeeper_deleted=False)
                    offload.timestamp_ms = now - HOUR_MS
                else:
                    offload = self.offload(complete=True, bookkeeper_deleted=rng.random() < 0.5)
                bookkeeper_deleted = offload.bookkeeper_deleted
            entries = rng.randrange(1, 50_000)
            ml.ledgers.append(
                MlLedger(ledger_id, 0 if current else entries, 0 if current else entries * 700, now - age, offload)
            )
            if not bookkeeper_deleted:
                self.add_ledger(
                    ledger_id, ml_custom(name), age, Status.IN_USE, open_ledger=current, referrer=f"ml:{name}"
                )
            age = max(HOUR_MS, age - rng.randrange(HOUR_MS, 10 * DAY_MS))
        for c in range(rng.randrange(0, 3)):
            self.add_cursor(ml, f"sub-{c}" if c else "my sub/ä", long_ids)
        return ml

    def offload(self, complete: bool, bookkeeper_deleted: bool) -> Offload:
        rng, spec = self.rng, self.spec
        return Offload(
            uuid_msb=rng.randrange(-(2**63), 2**63),
            uuid_lsb=rng.randrange(-(2**63), 2**63),
            complete=complete,
            bookkeeper_deleted=bookkeeper_deleted,
            timestamp_ms=spec.now_ms - rng.randrange(DAY_MS, 30 * DAY_MS),
            bucket=spec.offload_bucket,
            region=spec.offload_region,
            endpoint=spec.offload_endpoint,
            driver=spec.offload_driver,
        )

    def add_cursor(self, ml: ManagedLedger, name: str, long_ids: bool) -> Cursor:
        rng = self.rng
        first = ml.ledgers[0].ledger_id
        cursor = Cursor(name=name, cursors_ledger_id=-1, mark_delete=(first, rng.randrange(0, 100)))
        if rng.random() < 0.6:
            ledger_id = self.new_id(long_ids)
            cursor.cursors_ledger_id = ledger_id
            self.add_ledger(
                ledger_id,
                cursor_custom(ml.name, cursor.znode_name),
                self.old_age(),
                Status.IN_USE,
                open_ledger=True,
                referrer=f"cursor:{ml.name}/{cursor.znode_name}",
            )
        if rng.random() < 0.15:
            for b in range(2):
                start = 1_000 * (b + 1)
                key = f"{BUCKET_PREFIX}_{start}_{start + 999}"
                ledger_id = self.new_id(long_ids)
                cursor.string_properties[key] = str(ledger_id)
                self.add_ledger(
                    ledger_id,
                    bucket_custom(key, ml.topic_name, cursor.name),
                    self.old_age(),
                    Status.IN_USE,
                    referrer=f"bucket:{ml.name}/{cursor.znode_name}/{key}",
                )
        ml.cursors.append(cursor)
        return cursor

    def add_compaction(self, ml: ManagedLedger, long_ids: bool, mode: str | None = None) -> None:
        """A compacted topic's `__compaction` cursor, in one of the three states ZooKeeper can show.

        Pulsar writes the cursor's properties (with CompactedTopicLedger) to its znode only when the
        cursor ledger is switched or the cursor closes; each compaction's pointer goes to the cursor
        ledger (ManagedCursorImpl.persistPositionMetaStore). So:
        - closed: no cursor ledger, ZooKeeper's pointer is authoritative;
        - lagging: a cursor ledger is active and ZooKeeper names an older compaction (whose ledger a
          newer compaction already deleted): the current compacted ledger is unreferenced in ZooKeeper
          and must stay `unknown`;
        - unrecorded: a cursor ledger is active and ZooKeeper holds no pointer yet.
        """
        mode = mode or self.rng.choice(["closed", "closed", "lagging", "lagging", "unrecorded"])
        self.compaction_mode[ml.name] = mode
        cursor = Cursor(name=COMPACTION_CURSOR, cursors_ledger_id=-1, mark_delete=(ml.ledgers[0].ledger_id, 0))
        ml.cursors.append(cursor)
        if mode == "closed":
            ledger_id = self.new_id(long_ids)
            cursor.long_properties[COMPACTED_TOPIC_LEDGER] = ledger_id
            self.add_ledger(ledger_id, compacted_custom(ml.topic_name, ledger_id), self.old_age(), Status.IN_USE,
                            referrer=f"compacted:{ml.name}")
            return
        if mode == "lagging":
            # Ids only grow: one kept below ZooKeeper's pointer for an older compaction left behind.
            self.compaction_spare[ml.name] = self.new_id(long_ids)
            stale = self.new_id(long_ids)
            cursor.long_properties[COMPACTED_TOPIC_LEDGER] = stale
            self.stale_pointers[stale] = ml.name
        current = self.new_id(long_ids)
        cursor.cursors_ledger_id = self.new_id(long_ids)
        self.add_ledger(cursor.cursors_ledger_id, cursor_custom(ml.name, cursor.znode_name), self.old_age(),
                        Status.IN_USE, open_ledger=True, referrer=f"cursor:{ml.name}/{cursor.znode_name}")
        # The current compacted ledger: named only in the cursor ledger's last entry.
        self.add_ledger(current, compacted_custom(ml.topic_name, current), self.old_age(), Status.UNKNOWN)

    def lagging_pointer(self, ml: ManagedLedger) -> int:
        return next(c.long_properties[COMPACTED_TOPIC_LEDGER] for c in ml.cursors if c.name == COMPACTION_CURSOR)

    def add_schema(self, ml: ManagedLedger, long_ids: bool) -> SchemaLocatorModel:
        schema_id = schema_id_of(ml)
        existing = self.schema_index.get(schema_id)
        if existing is not None:
            return existing
        locator = SchemaLocatorModel(schema_id=schema_id, entries=[])
        self.schema_index[schema_id] = locator
        for version in range(self.rng.randrange(1, 4)):
            ledger_id = self.new_id(long_ids)
            locator.entries.append(SchemaEntry(version, ledger_id, 0, self.rng.randbytes(32)))
            self.add_ledger(
                ledger_id, schema_custom(schema_id), self.old_age(), Status.IN_USE, referrer=f"schema:{schema_id}"
            )
        self.schemas.append(locator)
        return locator

    # -- injected orphans ------------------------------------------------------------------
    def inject_orphan(self, ml: ManagedLedger, long_ids: bool, kind: OrphanKind, young: bool = False) -> None:
        status = Status.YOUNG_ORPHAN if young else Status.ORPHAN
        age = self.rng.randrange(HOUR_MS, 20 * HOUR_MS) if young else self.old_age()
        ledger_id = self.new_id(long_ids)
        if kind is OrphanKind.DROPPED_FROM_LIST:
            self.add_ledger(ledger_id, ml_custom(ml.name), age, status, kind)
        elif kind is OrphanKind.CURSOR_LEDGER_REPLACED:
            cursor = ml.cursors[0] if ml.cursors else self.add_cursor(ml, "replaced-sub", long_ids)
            # A topic whose only cursor is `__compaction` leaves a replaced cursor ledger of a cursor Pulsar
            # protects: kept by rule while the topic lives (Status.PROTECTED); a deleted topic's is an orphan.
            if status is Status.ORPHAN and pulsar_protects_cursor(cursor.name):
                status = Status.PROTECTED
            self.add_ledger(ledger_id, cursor_custom(ml.name, cursor.znode_name), age, status, kind)
        elif kind is OrphanKind.CURSOR_DELETED:
            self.add_ledger(ledger_id, cursor_custom(ml.name, "deleted-sub"), age, status, kind)
        elif kind is OrphanKind.SCHEMA_VERSION_DELETED:
            locator = self.add_schema(ml, long_ids)
            self.add_ledger(ledger_id, schema_custom(locator.schema_id), age, status, kind)
        elif kind is OrphanKind.SCHEMA_DELETED:
            self.add_ledger(ledger_id, schema_custom(f"{ml.tenant}/{ml.namespace}/gone-schema-{ledger_id}"), age,
                            status, kind)
        elif kind is OrphanKind.BUCKET_SNAPSHOT_LEAKED:
            key = f"{BUCKET_PREFIX}_{ledger_id}_{ledger_id + 999}"
            self.add_ledger(ledger_id, bucket_custom(key, ml.topic_name, "sub-0"), age, status, kind)
        elif kind is OrphanKind.COMPACTED_LEDGER_LEAKED:
            if not any(c.name == COMPACTION_CURSOR for c in ml.cursors):
                # Both states in which a leaked older compaction is provably garbage.
                self.add_compaction(ml, long_ids, mode=self.rng.choice(["closed", "lagging"]))
            mode = self.compaction_mode[ml.name]
            if mode == "lagging" and ml.name in self.compaction_spare:
                # An older compaction's ledger: its id is below ZooKeeper's (lagging) pointer.
                ledger_id = self.compaction_spare.pop(ml.name)
            if mode == "unrecorded" or (mode == "lagging" and ledger_id > self.lagging_pointer(ml)):
                self.add_ledger(ledger_id, compacted_custom(ml.topic_name, ledger_id), age, Status.UNKNOWN)
            else:
                self.add_ledger(ledger_id, compacted_custom(ml.topic_name, ledger_id), age, status, kind)
        elif kind is OrphanKind.BOOKKEEPER_DELETED_BUT_PRESENT:
            offload = self.offload(complete=True, bookkeeper_deleted=True)
            ml.ledgers.insert(0, MlLedger(ledger_id, 10, 7_000, self.spec.now_ms - age, offload))
            ledger = self.add_ledger(ledger_id, ml_custom(ml.name), age, status, kind)
            ledger.referrers.append(f"ml:{ml.name}")
        else:  # pragma: no cover - TOPIC_DELETED is built by delete_topic
            raise ValueError(kind)

    def delete_topic(self, ml: ManagedLedger) -> None:
        """A topic whose managed ledger is gone but whose BookKeeper ledgers were never deleted."""
        owned_ml, owned_topic = ml.name.encode(), ml.topic_name.encode()
        for ledger in self.ledgers.values():
            owner = ledger.custom.get("pulsar/managed-ledger") or ledger.custom.get(
                "pulsar/delayedIndexTopic") or ledger.custom.get("pulsar/compactedTopic")
            if owner not in (owned_ml, owned_topic) or ledger.status is Status.YOUNG_ORPHAN:
                continue
            # Another topic (a shadow) may still list it: then it stays in use.
            ledger.referrers = [r for r in ledger.referrers if not r.endswith(ml.name) and ml.name + "/" not in r]
            if ledger.referrers:
                continue
            if ledger.ctime_ms is None:
                ledger.ctime_ms = self.spec.now_ms - self.old_age()
            # A ledger the topic created in its last days is inside the grace period: never a candidate.
            young = self.spec.now_ms - ledger.ctime_ms < GRACE_MS
            ledger.status = Status.YOUNG_ORPHAN if young else Status.ORPHAN
            ledger.orphan_kind = OrphanKind.TOPIC_DELETED

    # -- everything ------------------------------------------------------------------------
    def build(self) -> SandboxCluster:
        spec, rng = self.spec, self.rng
        names = self.topic_names()
        long_topics = {i for i in range(len(names)) if rng.random() < spec.long_id_fraction}
        if spec.layout is LedgerLayout.FLAT:
            long_topics = set()
        mls: list[tuple[ManagedLedger, bool]] = []
        for i, (tenant, ns, topic) in enumerate(names):
            long_ids = i in long_topics
            ml = self.build_topic(tenant, ns, topic, long_ids)
            if rng.random() < 0.3:
                self.add_schema(ml, long_ids)
            if rng.random() < 0.08:
                self.add_compaction(ml, long_ids)
            mls.append((ml, long_ids))

        self.add_shadow_topics(mls)
        kinds = [k for k in OrphanKind if k is not OrphanKind.TOPIC_DELETED]
        injected = 0
        for i, (ml, long_ids) in enumerate(mls):
            # Round-robin first so every kind appears even in a small sandbox, then at random.
            if injected < len(kinds) or rng.random() < spec.orphan_fraction:
                self.inject_orphan(ml, long_ids, kinds[injected % len(kinds)] if injected < len(kinds)
                                   else rng.choice(kinds))
                injected += 1
            if i < spec.young_orphans:
                self.inject_orphan(ml, long_ids, OrphanKind.DROPPED_FROM_LIST, young=True)
            if ml.topic.startswith(SPECIAL_TOPIC) and not ml.properties.get("PULSAR.SHADOW_SOURCE"):
                # Ledgers naming their topic (not their managed ledger) under a name that encodes differently.
                for kind in (OrphanKind.BUCKET_SNAPSHOT_LEAKED, OrphanKind.COMPACTED_LEDGER_LEAKED):
                    self.inject_orphan(ml, long_ids, kind)

        for _ in range(spec.missing_ledgers):
            ml = rng.choice(mls)[0]
            ledger_id = self.new_id(False)
            ml.ledgers.insert(0, MlLedger(ledger_id, 5, 500, spec.now_ms - self.old_age()))
            self.missing.append(ledger_id)

        for _ in range(spec.non_pulsar_ledgers):
            custom = {} if rng.random() < 0.5 else {"application": b"bk-bench", "owner": b"ops"}
            self.add_ledger(self.new_id(False), custom, self.old_age(), Status.NON_PULSAR)
        # A ledger of a namespace this cluster does not know. The sandbox declares its bookies dedicated
        # (conf/local.toml), so it is a deleted namespace's orphan; with bookkeeper_dedicated = false it would be
        # `unknown` (namespace_unknown, shared_bookkeeper_unverified): tests/test_reconcile.py checks both.
        foreign_ml = f"{spec.cluster_name}-peer-tenant/ns-0/persistent/elsewhere"
        self.add_ledger(self.new_id(False), ml_custom(foreign_ml), self.old_age(), Status.ORPHAN,
                        OrphanKind.TOPIC_DELETED)
        for u in range(spec.unknown_ledgers):
            partial: dict[str, bytes] = {"application": b"pulsar"}
            if u % 3 == 1:
                partial["component"] = b"managed-ledger"  # owner name missing
            elif u % 3 == 2:
                partial["component"] = b"future-component"
            self.add_ledger(self.new_id(False), partial, self.old_age(), Status.UNKNOWN)

        # Deleted topics come last, so no later step re-references their ledgers.
        deletable = [pair for pair in mls if not pair[0].properties.get("PULSAR.SHADOW_SOURCE")]
        shadowed = {ml.properties.get("PULSAR.SHADOW_SOURCE") for ml, _ in mls}
        deletable = [pair for pair in deletable if pair[0].topic_name not in shadowed]
        doomed = rng.sample(deletable, min(spec.deleted_topics, max(0, len(deletable) - 1)))
        for ml, _ in doomed:
            self.delete_topic(ml)
        doomed_names = {ml.name for ml, _ in doomed}
        self.managed_ledgers = [ml for ml, _ in mls if ml.name not in doomed_names]
        # A missing ledger listed only by a deleted topic is no longer referenced at all.
        listed = {x.ledger_id for ml in self.managed_ledgers for x in ml.ledgers}
        self.missing = [i for i in self.missing if i in listed]
        # A schema goes with its topic, unless another partition of the same topic survives.
        surviving = {schema_id_of(ml) for ml in self.managed_ledgers}
        doomed_schemas = {schema_id_of(ml) for ml, _ in doomed} - surviving
        self.schemas = [s for s in self.schemas if s.schema_id not in doomed_schemas]
        for ledger in self.ledgers.values():
            schema_id = ledger.custom.get("pulsar/schemaId", b"").decode()
            if schema_id in doomed_schemas and ledger.status in (Status.IN_USE, Status.ORPHAN):
                ledger.status, ledger.orphan_kind, ledger.referrers = Status.ORPHAN, OrphanKind.SCHEMA_DELETED, []
                if ledger.ctime_ms is None:
                    ledger.ctime_ms = spec.now_ms - self.old_age()
        objects = self.offload_objects([ml for ml, _ in mls if ml.name not in doomed_names],
                                       [ml for ml, _ in doomed])
        stale = sorted(i for i, owner in self.stale_pointers.items() if owner not in doomed_names)
        regular = [f"tenant-{t}/ns-{n}" for t in range(spec.tenants) for n in range(spec.namespaces_per_tenant)]
        policies = namespace_policies(spec.cluster_name, regular, spec.regular_retention)
        # Last, from its own random stream: the ground truth above stays as it was.
        retention = add_retention_scenarios(self)
        return SandboxCluster(spec, self.ledgers, self.managed_ledgers, self.schemas, self.missing, objects, stale,
                              policies, retention)

    def offload_objects(self, alive: list[ManagedLedger], doomed: list[ManagedLedger]) -> list[OffloadObject]:
        """What tiered storage holds: live offloads, offloads of deleted topics, superseded attempts."""
        objects: list[OffloadObject] = []
        first = True

        def add(ml: ManagedLedger, entry: MlLedger, offload: Offload, status: str, kind: str | None,
                cluster: str | None = self.spec.cluster_name, owner: str | None = None) -> None:
            uuid = offload_uuid(offload.uuid_msb, offload.uuid_lsb)
            for suffix in ("", "-index"):
                objects.append(OffloadObject(offload.bucket, f"{uuid}-ledger-{entry.ledger_id}{suffix}", uuid,
                                             entry.ledger_id, owner or ml.name, status, kind, cluster))

        for ml in alive:
            if ml.properties.get("PULSAR.SHADOW_SOURCE"):
                continue  # a shadow topic reads its source's offloads
            for entry in ml.ledgers:
                if entry.offload is None:
                    continue
                add(ml, entry, entry.offload, "in_use" if entry.offload.complete else "in_flight", None)
                if first or self.rng.random() < 0.3:
                    first = False
                    # An earlier attempt whose cleanup failed: same ledger, another uuid.
                    add(ml, entry, self.offload(complete=True, bookkeeper_deleted=False), "orphan",
                        "superseded_offload")
        for ml in doomed:
            for entry in ml.ledgers:
                if entry.offload is not None:
                    add(ml, entry, entry.offload, "orphan", "topic_deleted")
        if alive and alive[0].ledgers:
            # A geo-replicated peer offloading into the same bucket (same namespace policies): its
            # objects are unreferenced here, and never ours. And an object with no owner metadata.
            ml, entry = alive[0], alive[0].ledgers[0]
            add(ml, entry, self.offload(complete=True, bookkeeper_deleted=False), "other_cluster", None,
                cluster=f"{self.spec.cluster_name}-peer")
            unowned = self.offload(complete=True, bookkeeper_deleted=False)
            uuid = offload_uuid(unowned.uuid_msb, unowned.uuid_lsb)
            objects.append(OffloadObject(unowned.bucket, f"{uuid}-ledger-{entry.ledger_id}", uuid, entry.ledger_id,
                                         None, "unknown", None, None))
        return objects

    def add_shadow_topics(self, mls: list[tuple[ManagedLedger, bool]]) -> None:
        """Shadow topics list their source's ledgers: one ledger, two referrers."""
        sources = [pair for pair in mls if len(pair[0].ledgers) > 1][:max(1, len(mls) // 50)]
        for source, _long_ids in sources:
            shadow = ManagedLedger(
                tenant=source.tenant,
                namespace=source.namespace,
                topic=f"{source.topic}-shadow",
                ledgers=[MlLedger(x.ledger_id, x.entries, x.size, x.timestamp_ms, None) for x in source.ledgers
                         if x.offload is None or not x.offload.bookkeeper_deleted],
                cursors=[],
                properties={"PULSAR.SHADOW_SOURCE": source.topic_name},
                compression="NONE",
            )
            for entry in shadow.ledgers:
                ledger = self.ledgers.get(entry.ledger_id)
                if ledger is not None:
                    ledger.referrers.append(f"ml:{shadow.name}")
            mls.append((shadow, False))


def schema_id_of(ml: ManagedLedger) -> str:
    """Schemas belong to the base topic: every partition shares one."""
    return f"{ml.tenant}/{ml.namespace}/{ml.topic.split('-partition-')[0]}"


def build_cluster(spec: SandboxSpec) -> SandboxCluster:
    return _Builder(spec).build()
