"""What one ZooKeeper leader election costs the snapshot's scan and the delete (issue 45), on a real three-node
ensemble (harness.zkensemble: Debian's QuorumPeerMain, tickTime 200 ms, syncLimit 10).

    .venv/bin/python bench/bench_election.py --topics 1000 --rounds 3

Stall: how long the stage's own client is without an answer across one election, from the leader's SIGKILL to the
first successful request after it, `--rounds` times each:
- scan: the snapshot's bulk reader (sweeper.zk.wire.WireReader with the scan's settings: multiRead of 100, a window
  of 2,000, paced at the default [scan] reads_per_second) reads the seeded cluster's ledger znodes over and over for
  about three seconds; the leader is killed a third of the way in. The first read after it is the first one
  answered on the reconnected session.
- delete: the delete's executor (sweeper.delete.LedgerDeleter in the product's in-task retry loop, a kazoo client
  and a bulk reader as a Spark task opens them) deletes the orphans one record per call, paced; the leader is killed
  a third of the way in. The first delete after it is the first one whose compare-and-set multi is answered after
  kazoo has reconnected the session.
Whole run: the snapshot stage and `delete --execute` (from an operator's list of the orphans, paced at
`--delete-rate` a task) in this process's Spark session, alternately without an election and with the leader killed
a third of the way in (the snapshot: a third of the requests a run without one sends, counted on the members; the
delete: once a third of its records have journalled outcomes), `--rounds` pairs of each; the ratio of the medians.
Each delete round seeds a chroot of its own.

Results go to docs/benchmarks.md by hand, with this command.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deltalake import DeltaTable
from kazoo.protocol.states import KazooState

from harness import zkensemble as ens
from harness.sandbox.model import OrphanKind, SandboxCluster, SandboxSpec, Status, build_cluster
from harness.sandbox.seed import seed_zookeeper
from sweeper.codecs import pending_delete
from sweeper.codecs.layout import ledger_path
from sweeper.config import PulsarMetadataConfig, SafetyConfig, ScanConfig, SweeperConfig
from sweeper.delete import DELETED, LedgerDeleter
from sweeper.delete.inputs import records_from_json
from sweeper.delete.retry import RetryPolicy, run_with_retries
from sweeper.delete.stage import run_delete
from sweeper.pipeline import snapshot_stage
from sweeper.ratelimit import TokenBucket
from sweeper.scan.bookkeeper import read_layout
from sweeper.spark import get_spark
from sweeper.tables import open_table_store
from sweeper.vocabulary import HOUR_MS
from sweeper.zk import client as zkutil
from sweeper.zk.wire import WireReader


def orphans_of(cluster: SandboxCluster) -> list[int]:
    return sorted(i for i, x in cluster.ledgers.items() if x.status is Status.ORPHAN
                  and x.orphan_kind is not OrphanKind.BOOKKEEPER_DELETED_BUT_PRESENT)


def seeded_chroot(info: ens.EnsembleInfo, chroot: str, spec: SandboxSpec) -> tuple[SandboxCluster, Any]:
    """The sandbox seeded into `chroot`, with a live broker registered (kept by the returned client's session)."""
    admin = zkutil.connect(info.connect_string)
    admin.ensure_path(chroot)
    zkutil.close(admin)
    client = zkutil.connect(info.hosts(chroot))
    cluster = build_cluster(spec)
    seed_zookeeper(client, cluster)
    client.create("/loadbalance/brokers/127.0.0.1:8080", b"{}", ephemeral=True, makepath=True)
    return cluster, client


class Striker:
    """Kills the leader from a thread once `ready()` holds; when, and how long the others took to elect the next."""

    def __init__(self, info: ens.EnsembleInfo, ready: Callable[[], bool]) -> None:
        self.info, self.ready = info, ready
        self.killed_at: float | None = None
        self.elected_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.ready():
                leader = ens.leader(self.info)
                self.killed_at = time.monotonic()
                ens.kill(self.info, leader)
                ens.leader(self.info, timeout=60)
                self.elected_s = time.monotonic() - self.killed_at
                return
            time.sleep(0.05)  # each look is a `mntr` to every member: keep it light

    def __enter__(self) -> Striker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ---- stalls, measured on the stages' own clients ------------------------------------------------------------------

def scan_stall(info: ens.EnsembleInfo, hosts: str, paths: list[str], rate: float) -> tuple[float, float]:
    """(seconds from the kill to the first read answered on the reconnected session, the election's seconds).
    The ledger znodes are read over and over for about three seconds at `rate`, so the kill lands mid-stream."""
    paths = paths * max(1, int(3 * rate) // len(paths))
    with WireReader(hosts, multi_read=100, limiter=TokenBucket(rate)) as reader:
        first_after: float | None = None
        striker: Striker | None = None
        for done, _ in enumerate(reader.get_many(paths, window=2000), start=1):
            if done == len(paths) // 3:
                striker = Striker(info, lambda: True).__enter__()
                while striker.killed_at is None:
                    time.sleep(0.001)
            if striker is not None and first_after is None and reader.reconnects:
                first_after = time.monotonic()
        assert striker is not None and striker.killed_at is not None and first_after is not None, "no reconnect"
        striker.__exit__()
        return first_after - striker.killed_at, striker.elected_s or 0.0


def delete_stall(info: ens.EnsembleInfo, hosts: str, cluster: SandboxCluster, per_second: float
                 ) -> tuple[float, float, int]:
    """(seconds from the kill to the first delete answered after kazoo reconnected, the election's seconds, the
    records whose first attempt failed)."""
    client = zkutil.connect(hosts)
    reconnected: list[float] = []
    suspended: list[float] = []

    def listen(state: str) -> None:
        if state == KazooState.SUSPENDED:
            suspended.append(time.monotonic())
        elif state == KazooState.CONNECTED and suspended:
            reconnected.append(time.monotonic())

    client.add_listener(listen)
    reader = WireReader(hosts, multi_read=100)
    try:
        layout = read_layout(client, cluster.spec.ledgers_root, False)
        items = records_from_json([{"ledgerId": i} for i in orphans_of(cluster)], client, cluster.spec.ledgers_root,
                                  layout)
        records = [pending_delete.decode(item.payload, check=False) for item in items]
        deleter = LedgerDeleter(client, ledgers_root=cluster.spec.ledgers_root, layout=layout,
                                min_age_ms=168 * HOUR_MS, execute=True, batch_size=1, op_timeout_s=10.0,
                                reader=reader)
        policy = RetryPolicy()
        striker: Striker | None = None
        first_after: float | None = None
        retried = 0
        pace = TokenBucket(per_second, burst=1, start_full=False)
        for n, record in enumerate(records):
            if n == len(records) // 3:
                striker = Striker(info, lambda: True).__enter__()
                while striker.killed_at is None:
                    time.sleep(0.001)
            [result] = run_with_retries(deleter.process, [record], policy)
            done = time.monotonic()
            retried += result.attempt > 1
            if result.outcome == DELETED and reconnected and first_after is None:
                first_after = done
            pace.acquire(1)
        assert striker is not None and striker.killed_at is not None and first_after is not None, "no reconnect"
        striker.__exit__()
        return first_after - striker.killed_at, striker.elected_s or 0.0, retried
    finally:
        reader.close()
        zkutil.close(client)


# ---- whole runs, with one election and without -----------------------------------------------------------------

def timed(run: Callable[[], Any], info: ens.EnsembleInfo,
          ready: Callable[[Callable[[], int]], bool] | None) -> tuple[float, int, float | None]:
    """(seconds, requests the members received, the election's seconds or None) of `run()`; with `ready`, the
    leader is killed once `ready(requests so far)` holds."""
    counter = ens.RequestCounter(info)
    started = time.monotonic()
    if ready is None:
        run()
        return time.monotonic() - started, counter(), None
    with Striker(info, lambda: ready(counter)) as striker:
        run()
    took = time.monotonic() - started
    assert striker.killed_at is not None, "the run ended before the moment to kill the leader"
    ens.heal(info)
    return took, 0, striker.elected_s


def journalled_outcomes(tables: Path) -> int:
    """Outcome rows in the delete's journal: how far its deletes have gone (each task commits one per chunk)."""
    path = tables / "delete_journal"
    if not (path / "_delta_log").exists():
        return 0
    try:
        phases = DeltaTable(str(path)).to_pyarrow_table(columns=["phase"]).column("phase").to_pylist()
    except Exception:  # a commit being written: look again
        return 0
    return sum(1 for phase in phases if phase == "outcome")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scan-rate", type=float, default=ScanConfig.reads_per_second)
    parser.add_argument("--delete-rate", type=float, default=50.0, help="deletes per second per task")
    parser.add_argument("--delete-topics", type=int, default=300, help="topics (one orphan each) per delete round")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-election-"))
    info = ens.start_ensemble(root / "ensemble")
    spark = get_spark("bench-election", master="local[2]")
    out: dict[str, Any] = {"ensemble": f"3 x QuorumPeerMain, tickTime {ens.TICK_MS} ms, syncLimit {ens.SYNC_LIMIT}"}
    try:
        spec = SandboxSpec(seed=7, topics=args.topics)
        cluster, keeper = seeded_chroot(info, "/scan", spec)
        hosts = info.hosts("/scan")
        paths = [ledger_path(spec.ledgers_root, i, spec.layout) for i in cluster.ledgers]
        print(f"seeded {len(cluster.ledgers):,} ledgers ({args.topics:,} topics)", flush=True)

        stalls = []
        for _ in range(args.rounds):
            stalls.append(scan_stall(info, hosts, paths, args.scan_rate))
            ens.heal(info)
            print(f"scan stall {stalls[-1][0]:.2f} s (election {stalls[-1][1]:.2f} s)", flush=True)
        out["scan_stall_s"] = [round(s, 2) for s, _ in stalls]
        out["scan_election_s"] = [round(e, 2) for _, e in stalls]

        stalls_d = []
        for n in range(args.rounds):
            small = SandboxSpec(seed=100 + n, topics=args.delete_topics, orphan_fraction=1.0)
            chroot_cluster, client = seeded_chroot(info, f"/stall-{n}", small)
            stalls_d.append(delete_stall(info, info.hosts(f"/stall-{n}"), chroot_cluster, args.delete_rate))
            zkutil.close(client)
            ens.heal(info)
            print(f"delete stall {stalls_d[-1][0]:.2f} s (election {stalls_d[-1][1]:.2f} s, "
                  f"{stalls_d[-1][2]} records retried)", flush=True)
        out["delete_stall_s"] = [round(s, 2) for s, _, _ in stalls_d]
        out["delete_election_s"] = [round(e, 2) for _, e, _ in stalls_d]

        # Whole snapshot runs, alternately without and with an election.
        base = SweeperConfig(pulsar=PulsarMetadataConfig(cluster_name="sandbox"),
                             safety=SafetyConfig(bookkeeper_dedicated=True))
        cfg = base.replace(bookkeeper={"zookeeper": hosts}, tables={"root": str(root / "tables"), "engine": "delta-rs"},
                           offload={"enabled": False}, scan={"reads_per_second": args.scan_rate})
        store = open_table_store(cfg.tables.root, spark, engine="delta-rs")
        snapshot_stage(spark, cfg, store)  # warm-up: JVM, Python workers
        calm, struck, requests = [], [], 0
        for _ in range(args.rounds):
            took, requests, _ = timed(lambda: snapshot_stage(spark, cfg, store), info, None)
            calm.append(took)
            took, _, elected = timed(lambda: snapshot_stage(spark, cfg, store), info,
                                     lambda seen, third=requests // 3: seen() >= third)
            struck.append(took)
            print(f"snapshot {calm[-1]:.1f} s without, {struck[-1]:.1f} s with an election ({elected:.2f} s)",
                  flush=True)
        out["snapshot_s"] = {"without": [round(t, 1) for t in calm], "with": [round(t, 1) for t in struck],
                             "ratio": round(statistics.median(struck) / statistics.median(calm), 2)}
        zkutil.close(keeper)

        # Whole delete runs (an operator's list of the orphans), alternately without and with an election.
        calm, struck, counts = [], [], []
        for n in range(-1, 2 * args.rounds):  # round -1 warms up the delete's Python workers; it is not timed
            chroot = f"/delete-{n + 1}"
            small = SandboxSpec(seed=200, topics=args.delete_topics, orphan_fraction=1.0)  # the same orphans each
            chroot_cluster, client = seeded_chroot(info, chroot, small)
            tables = root / f"tables-{n}"
            dcfg = base.replace(bookkeeper={"zookeeper": info.hosts(chroot)},
                                tables={"root": str(tables), "engine": "delta-rs"}, offload={"enabled": False},
                                delete={"deletes_per_second": args.delete_rate, "tasks": 2})
            dstore = open_table_store(dcfg.tables.root, spark, engine="delta-rs")
            snapshot_stage(spark, dcfg, dstore)  # the delete refuses without one (shadow topics)
            listing = tables / "orphans.json"
            listing.write_text(json.dumps(orphans_of(chroot_cluster)))

            def run(dcfg: SweeperConfig = dcfg, dstore: Any = dstore, listing: Path = listing, n: int = n) -> None:
                result = run_delete(spark, dcfg, dstore, f"manual-{n + 1}", execute=True, from_json=listing)
                counts.append(result.counts.deleted)

            if n < 0:
                run()
                counts.clear()
            elif n % 2 == 0:
                took, requests, _ = timed(run, info, None)
                calm.append(took)
                print(f"delete {took:.1f} s without an election ({counts[-1]} deleted)", flush=True)
            else:
                # A third of the way into its deletes (not its lock or permission check: see docs/benchmarks.md).
                third = len(orphans_of(chroot_cluster)) // 3
                took, _, elected = timed(run, info, lambda _, tables=tables, third=third:
                                         journalled_outcomes(tables) >= third)
                struck.append(took)
                print(f"delete {took:.1f} s with an election ({elected:.2f} s; {counts[-1]} deleted)", flush=True)
            zkutil.close(client)
        out["delete_s"] = {"without": [round(t, 1) for t in calm], "with": [round(t, 1) for t in struck],
                           "ratio": round(statistics.median(struck) / statistics.median(calm), 2),
                           "deleted": counts}
    finally:
        spark.stop()
        ens.stop_ensemble(info)
        shutil.rmtree(root, ignore_errors=True)  # the members' data and the tables: a few hundred MB
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
