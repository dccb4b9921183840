"""ZooKeeper bulk-read speed: kazoo sequential vs kazoo pipelined vs WireReader, in one run.

    .venv/bin/python bench/zk_read_compare.py [--znodes 20000] [--payload 250] [--rounds 3]

WireReader runs twice: one getData per request (pipelined), and 100 reads per multiRead request.

Starts its own ZooKeeper (sharing the machine's CPUs with this client, as on a small worker),
creates the znodes under /bench, then reads all of them with each client. Rounds are
interleaved so drift (JIT warm-up, GC) hits every client alike; the median round is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.zkserver import start_zookeeper, stop_zookeeper
from sweeper.zk import client as zkutil
from sweeper.zk.wire import WireReader


def seed(hosts: str, count: int, payload: int) -> list[str]:
    client = zkutil.connect(hosts)
    try:
        client.ensure_path("/bench")
        paths = [f"/bench/n-{i:07d}" for i in range(count)]
        pending = []
        for i, path in enumerate(paths):
            pending.append(client.create_async(path, os.urandom(payload // 2).hex().encode()[:payload]))
            if len(pending) >= 1000:
                for p in pending:
                    p.get()
                pending.clear()
            if i % 5000 == 4999:
                print(f"  created {i + 1:,}", flush=True)
        for p in pending:
            p.get()
        return paths
    finally:
        zkutil.close(client)


def kazoo_sequential(hosts: str, paths: list[str]) -> int:
    client = zkutil.connect(hosts)
    try:
        total = 0
        for path in paths:
            data, _ = client.get(path)
            total += len(data)
        return total
    finally:
        zkutil.close(client)


def kazoo_pipelined(hosts: str, paths: list[str]) -> int:
    client = zkutil.connect(hosts)
    try:
        return sum(len(r.data or b"") for r in zkutil.get_many(client, paths))
    finally:
        zkutil.close(client)


def wire(hosts: str, paths: list[str]) -> int:
    with WireReader(hosts) as reader:
        return sum(len(r.data or b"") for r in reader.get_many(paths))


def wire_multi_read(hosts: str, paths: list[str]) -> int:
    with WireReader(hosts, multi_read=100) as reader:
        return sum(len(r.data or b"") for r in reader.get_many(paths))


def timed(fn: Callable[[str, list[str]], int], hosts: str, paths: list[str]) -> tuple[float, int]:
    started = time.perf_counter()
    total = fn(hosts, paths)  # connect + close included: a scan task pays them too
    return time.perf_counter() - started, total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--znodes", type=int, default=20_000)
    parser.add_argument("--payload", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    server = start_zookeeper(Path(tempfile.mkdtemp(prefix="bench-zkread-")) / "zookeeper")
    try:
        hosts = server.connect_string
        t = time.perf_counter()
        paths = seed(hosts, args.znodes, args.payload)
        print(f"seeded {len(paths):,} znodes of {args.payload} B in {time.perf_counter() - t:.1f}s", flush=True)

        # Results must agree before speed means anything.
        client = zkutil.connect(hosts)
        sample = paths[:: max(1, len(paths) // 500)]
        expected = [client.get(p) for p in sample]
        zkutil.close(client)
        for multi_read in (1, 100):
            with WireReader(hosts, multi_read=multi_read) as reader:
                got = [(r.data, r.stat) for r in reader.get_many(sample)]
            assert got == expected, f"WireReader(multi_read={multi_read}) disagrees with kazoo"

        clients = {
            "kazoo sequential get": kazoo_sequential,
            "kazoo get_async pipelined (window 1000)": kazoo_pipelined,
            "WireReader.get_many (window 2000)": wire,
            "WireReader.get_many multi_read=100 (window 2000)": wire_multi_read,
        }
        kazoo_sequential(hosts, paths[:2000])  # warm the server's JIT before the first timed round
        seconds: dict[str, list[float]] = {name: [] for name in clients}
        for round_no in range(args.rounds):
            for name, fn in clients.items():
                elapsed, total = timed(fn, hosts, paths)
                assert total == len(paths) * args.payload, (name, total)
                seconds[name].append(elapsed)
            print(
                f"round {round_no + 1}: " + ", ".join(f"{len(paths) / s[-1]:,.0f}/s" for s in seconds.values()),
                flush=True,
            )

        print(
            f"\n{len(paths):,} znodes x {args.payload} B, {os.cpu_count()} CPUs shared with the server, "
            f"median of {args.rounds} rounds:"
        )
        baseline = statistics.median(seconds["kazoo sequential get"])
        for name, runs in seconds.items():
            median = statistics.median(runs)
            print(f"  {name:48s} {median:6.2f}s {len(paths) / median:9,.0f}/s  {baseline / median:5.1f}x")
    finally:
        stop_zookeeper(server)


if __name__ == "__main__":
    main()
