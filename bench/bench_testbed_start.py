"""What the real Pulsar testbed costs to start and to keep running: wall time, CPU seconds and memory per process.

The testbeds share two cores with the whole test suite, so what their JVMs burn starting and idling is time the
suite's other tests do not get. This starts one testbed (`harness.testbed.server.testbed_up`) in a fresh home,
then reads, for every process its state file names (broker, ZooKeeper, each bookie, Oxia, moto; an older state
file's storage JVM), the CPU seconds the kernel charged it (`/proc/<pid>/stat` utime + stime, all threads) and its
resident memory, once when the broker serves and once after `--idle-s` seconds of doing nothing; the one-off
processes the start ran and waited for (BookKeeper's shell initialising the cluster) count as this process's
children (`getrusage(RUSAGE_CHILDREN)`). Then it stops the testbed and removes its home.

It reads state files of the layout before the three bookies too (one `storage_pid`): run it from an older
checkout with `PYTHONPATH=<that checkout>` to measure the testbed before a change.

    .venv/bin/python bench/bench_testbed_start.py --metadata zookeeper --idle-s 60
    .venv/bin/python bench/bench_testbed_start.py --metadata oxia --idle-s 60
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the harness lives beside the package, not in it

from harness.testbed.server import testbed_down, testbed_up

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (every thread of it), in seconds; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of proc(5), after pid and comm


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def processes(state: dict[str, Any]) -> dict[str, int]:
    """Every long-running process the state file names, by role."""
    roles = {"broker": state.get("pid", 0), "moto": state.get("s3_pid", 0), "oxia": state.get("oxia_pid", 0),
             "zookeeper": state.get("zookeeper_pid", 0),
             # Before the three bookies: ZooKeeper and the one bookie in one JVM (the bookie alone on Oxia).
             "storage (standalone --no-broker)": state.get("storage_pid", 0)}
    for bookie in state.get("bookies", ()):
        roles[f"bookie {bookie['index']} ({bookie['bookie_id']})"] = bookie["pid"]
    return {role: pid for role, pid in roles.items() if pid}


def sample(roles: dict[str, int]) -> dict[str, tuple[float, float]]:
    return {role: (cpu_seconds(pid), rss_mib(pid)) for role, pid in roles.items()}


def report(title: str, samples: dict[str, tuple[float, float]], children_cpu: float) -> None:
    print(f"{title}:")
    jvm_total = 0.0
    for role, (cpu, rss) in samples.items():
        print(f"  {role:40s} {cpu:7.1f} s CPU {rss:7.0f} MiB RSS")
        if role != "moto":
            jvm_total += cpu
    print(f"  {'one-off processes (waited for)':40s} {children_cpu:7.1f} s CPU")
    print(f"  {'JVMs and Oxia, total':40s} {jvm_total + children_cpu:7.1f} s CPU, "
          f"{sum(r for role, (_, r) in samples.items() if role != 'moto'):.0f} MiB RSS")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--metadata", choices=["zookeeper", "oxia"], default="zookeeper")
    parser.add_argument("--idle-s", type=float, default=60.0, help="how long to let the testbed idle after start")
    parser.add_argument("--home", help="the testbed home (default: a fresh temporary directory, removed after)")
    args = parser.parse_args()
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="bench-testbed-"))
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    try:
        info = testbed_up(home, metadata=args.metadata)
        up_s = time.monotonic() - started
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        children_cpu = (children.ru_utime - children_before.ru_utime) + (children.ru_stime - children_before.ru_stime)
        roles = processes(json.loads((home / "testbed.json").read_text()))
        at_start = sample(roles)
        print(f"testbed ({args.metadata}) up in {up_s:.1f} s wall; state: "
              f"{json.dumps({k: v for k, v in asdict(info).items() if 'pid' in k or k == 'bookies'})}")
        report("CPU charged when the broker serves", at_start, children_cpu)
        if args.idle_s > 0:
            time.sleep(args.idle_s)
            idle = sample(roles)
            delta = {role: (idle[role][0] - at_start[role][0], idle[role][1]) for role in roles}
            report(f"CPU over {args.idle_s:.0f} s idle", delta, 0.0)
    finally:
        stopping = time.monotonic()
        testbed_down(home)
        print(f"down in {time.monotonic() - stopping:.1f} s")
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
