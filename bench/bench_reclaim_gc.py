"""What a triggered bookie GC costs (issue 35): its time, and a concurrent producer's send latency, in one run.

On a real testbed (harness.testbed: Pulsar 4.0.8, three bookies with their HTTP servers on, 4 MiB entry
logs, GC only when triggered), in its own home so no test's testbed is touched:

1. a latency probe starts: one producer sending 1 KiB synchronously every `--interval-ms` to a live topic, each
   send timed;
2. `--orphan-mib` of 100 KiB messages go to a topic, interleaved with live data (a third of the bytes) so that
   freeing it takes a compaction, plus a burst of orphan-only data; the orphan topic is then deleted through the
   admin API (its ledgers' metadata goes, their bytes stay on the bookie, as after the sweeper's delete);
3. the probe runs a quiet baseline window; then the product's own client (`sweeper.reclaim.bookie_http`) asks the
   bookie for one GC (`--compaction`: minor or major) and polls until it is done, the probe still sending.

Reported: the GC's wall time, the bytes the bookie's counters say it reclaimed (and the entry logs on disk), and
the probe's p50 / p99 / max send latency during the GC against the baseline window of the same length: the ratio
is the number to read (these machines are noisy).

    .venv/bin/python bench/bench_reclaim_gc.py --orphan-mib 48 --compaction major
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness lives beside the package, not in it

from harness.testbed import bookie
from harness.testbed.server import testbed_down, testbed_up
from harness.testbed.workload import admin_for, client_for
from sweeper.config import ReclaimConfig
from sweeper.reclaim.bookie_http import BookieHttp
from sweeper.reclaim.discovery import BookieTarget

TENANT_NS = "public/default"


class Probe(threading.Thread):
    """Sends 1 KiB synchronously every `interval_s`, recording (start time, latency in ms)."""

    def __init__(self, client: object, topic: str, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.producer = client.create_producer(topic, batching_enabled=False)  # type: ignore[attr-defined]
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        payload = b"p" * 1024
        while not self.stop_event.is_set():
            t0 = time.monotonic()
            self.producer.send(payload)
            self.samples.append((t0, (time.monotonic() - t0) * 1000.0))
            self.stop_event.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def window(self, start: float, end: float) -> list[float]:
        return [ms for t, ms in self.samples if start <= t <= end]


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(values)
    return {"n": len(ordered), "p50": statistics.median(ordered),
            "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], "max": ordered[-1]}


def produce(client: object, topic: str, total: int, size: int, live_topic: str | None = None,
            live_share: float = 0.0) -> None:
    producer = client.create_producer(topic, batching_enabled=False)  # type: ignore[attr-defined]
    live = client.create_producer(live_topic, batching_enabled=False) if live_topic else None  # type: ignore
    sent, owed = 0, 0.0
    while sent < total:
        producer.send(b"o" * size)
        sent += size
        if live is not None:
            owed += size * live_share / (1 - live_share)
            while owed >= size:
                live.send(b"l" * size)
                owed -= size
    producer.close()
    if live is not None:
        live.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", default="var/bench-reclaim-testbed")
    parser.add_argument("--orphan-mib", type=int, default=48)
    parser.add_argument("--compaction", choices=["minor", "major"], default="major")
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--baseline-s", type=float, default=20.0)
    parser.add_argument("--keep", action="store_true", help="leave the testbed running")
    args = parser.parse_args()

    home = Path(args.home)
    testbed_down(home, wipe=True)
    t_up = time.monotonic()
    info = testbed_up(home)
    print(f"testbed up in {time.monotonic() - t_up:.0f}s")
    client = client_for(info)
    admin = admin_for(info)
    try:
        probe = Probe(client, f"persistent://{TENANT_NS}/latency-probe", args.interval_ms / 1000.0)
        probe.start()
        orphan = f"persistent://{TENANT_NS}/bench-orphan"
        size = 100 * 1024
        total = args.orphan_mib << 20
        t0 = time.monotonic()
        produce(client, orphan, total // 2, size)  # logs of their own: the GC deletes them whole
        produce(client, orphan, total // 2, size, f"persistent://{TENANT_NS}/bench-live", live_share=1 / 3)
        produce(client, f"persistent://{TENANT_NS}/bench-filler", 12 << 20, size)  # rotate and flush the logs
        print(f"wrote {args.orphan_mib} MiB of orphans (+ live, + filler) in {time.monotonic() - t0:.0f}s")
        admin.delete_topic(orphan)
        time.sleep(3.0)  # flushInterval: the rotated logs are flushed
        # One bookie's GC, as the sweeper asks them one at a time: bookie 0 of the three (each holds about two thirds
        # of every ledger's bytes).
        measured = bookie.bookies(info)[0]
        disk_before = bookie.entry_log_bytes(info, measured)
        http = BookieHttp(ReclaimConfig(calls_per_second=20.0, timeout_s=30.0))
        target = BookieTarget(measured.bookie_id, measured.http_url, "bench", True, False)
        before = http.sample(target)
        base_start = time.monotonic()
        time.sleep(args.baseline_s)
        base_end = time.monotonic()
        major = args.compaction == "major"
        gc_start = time.monotonic()
        http.trigger_gc(target, force_major=major, force_minor=True)
        time.sleep(0.2)
        while http.in_force_gc(target):
            time.sleep(0.2)
        gc_end = time.monotonic()
        after = http.sample(target)
        disk_after = bookie.entry_log_bytes(info, measured)
        # The baseline is the same length as the GC, right before it: the ratio compares like with like.
        gc_s = gc_end - gc_start
        baseline = stats(probe.window(max(base_start, base_end - max(gc_s, 1.0)), base_end))
        during = stats(probe.window(gc_start, gc_end + 0.5))
        probe.stop_event.set()
        probe.join(timeout=10)
        deletion = (after.deletion_bytes or 0) - (before.deletion_bytes or 0)
        compaction = (after.compaction_bytes or 0) - (before.compaction_bytes or 0)
        mib = 1 << 20
        print(f"GC ({args.compaction}): {gc_s:.2f}s; reclaimed by deletion {deletion / mib:.1f} MiB, by compaction "
              f"{compaction / mib:.1f} MiB; entry logs on disk {disk_before / mib:.1f} -> {disk_after / mib:.1f} MiB")
        print(f"probe baseline: n={baseline['n']} p50={baseline['p50']:.1f}ms p99={baseline['p99']:.1f}ms "
              f"max={baseline['max']:.1f}ms")
        print(f"probe during GC: n={during['n']} p50={during['p50']:.1f}ms p99={during['p99']:.1f}ms "
              f"max={during['max']:.1f}ms")
        if baseline["p50"] and baseline["p99"]:
            print(f"ratio during/baseline: p50 {during['p50'] / baseline['p50']:.2f}x, "
                  f"p99 {during['p99'] / baseline['p99']:.2f}x")
    finally:
        client.close()
        if not args.keep:
            testbed_down(home, wipe=True)


if __name__ == "__main__":
    main()
