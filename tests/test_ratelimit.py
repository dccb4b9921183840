"""The scan's read pacing: a token bucket (fake clock) and the wire reader under it (real ZooKeeper)."""

from __future__ import annotations

import time

from kazoo.client import KazooClient

from sweeper.ratelimit import TokenBucket
from sweeper.zk.wire import WireReader
from tests.support.config import ZkTarget


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_bucket_paces_to_its_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, clock=clock, sleep=clock.sleep)
    started = clock.now
    for _ in range(100):
        bucket.acquire(50)
    # 5,000 tokens at 1,000/s, less the small initial burst (20 ms worth).
    assert 4.97 <= clock.now - started <= 5.0
    assert bucket.acquired == 5000 and abs(bucket.waited_s - (clock.now - started)) < 1e-9


def test_bucket_allows_a_debt_and_refills_only_to_a_slice() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100.0, clock=clock, sleep=clock.sleep)
    assert bucket.acquire(500) > 4.9  # larger than the bucket: paced, not refused
    clock.now += 60  # a long pause banks at most one slice (20 ms), never a burst of a minute
    before = clock.now
    bucket.acquire(2)
    bucket.acquire(50)
    assert clock.now - before >= 0.49


def test_slices_are_whole_requests() -> None:
    bucket = TokenBucket(20000.0 / 8)
    assert bucket.slice(1) == 50
    assert bucket.slice(100) == 100  # one multiRead of 100 at a time
    assert TokenBucket(100000.0).slice(100) == 2000


def test_wire_reader_keeps_to_its_limiter(zk: KazooClient, zk_target: ZkTarget) -> None:
    paths = [f"/n{i}" for i in range(600)]
    for path in paths:
        zk.create(path, b"x")
    limiter = TokenBucket(3000.0)
    with WireReader(zk_target.hosts, multi_read=20, limiter=limiter) as reader:
        started = time.monotonic()
        reads = list(reader.get_many(paths))
        elapsed = time.monotonic() - started
    assert [r.data for r in reads] == [b"x"] * 600
    assert elapsed >= 0.17  # 600 reads at 3,000/s, less one 20 ms slice
    assert limiter.acquired >= 600
