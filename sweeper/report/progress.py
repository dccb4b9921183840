"""A long command stays audible: a line whenever nothing was printed for a while (issue 23).

A scheduler's log and a terminal both see a stage's start line, then, whenever the command has printed
nothing for `every_s` seconds, a line naming the stage, its elapsed time and, when Spark is at work, its
tasks done and their rate (read from Spark's status tracker on the driver, so nothing is added to the jobs).
While it runs, standard output goes through a proxy that notes when a line was last written and which
stage a line `[stage] ...` names, so the commands keep using plain `print`; the heartbeat only speaks into
silence.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


class Heartbeat:
    def __init__(self, out: Callable[[str], None] = print, every_s: float = 8.0) -> None:
        self._out = out
        self.every_s = every_s
        self.spark: Any = None  # set once the session exists: its tracker gives the tasks' progress
        self._lock = threading.Lock()
        self._last_said = time.monotonic()
        self._stage = "starting"
        self._stage_started = time.monotonic()
        self._tasks_seen: tuple[float, int] | None = None

    def say(self, text: str) -> None:
        self._noted(text)
        self._out(text)

    def _beat(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last_said < self.every_s:
                return
            stage, elapsed = self._stage, now - self._stage_started
        tasks = self._tasks(now)
        self.say(f"[{stage}] still working, {elapsed:,.0f}s in{tasks}")

    def _tasks(self, now: float) -> str:
        if self.spark is None:
            return ""
        try:
            tracker = self.spark.sparkContext.statusTracker()
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
        except Exception:  # a session stopping under us: the elapsed time still tells the operator it lives
            return ""
        if not total:
            return ": between Spark jobs"
        rate = ""
        if self._tasks_seen is not None and now > self._tasks_seen[0]:
            rate = f", {max(0, done - self._tasks_seen[1]) / (now - self._tasks_seen[0]):.1f} tasks/s"
        self._tasks_seen = (now, done)
        return f": Spark tasks {done:,} of {total:,} done{rate}"

    @contextlib.contextmanager
    def running(self) -> Iterator[Heartbeat]:
        """Beat while the block runs, watching what it prints on standard output."""
        stop = threading.Event()
        original = sys.stdout
        self._out = lambda text: print(text, file=original, flush=True)
        sys.stdout = _Watched(original, self)

        def loop() -> None:
            while not stop.wait(1.0):
                self._beat()

        thread = threading.Thread(target=loop, name="sweeper-heartbeat", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=5)
            sys.stdout = original

    def _noted(self, text: str) -> None:
        with self._lock:
            if text.startswith("[") and "]" in text:
                stage = text[1:text.index("]")]
                if stage != self._stage:
                    self._stage, self._stage_started, self._tasks_seen = stage, time.monotonic(), None
            self._last_said = time.monotonic()


class _Watched:
    """Standard output as the command sees it: everything passes through, and the heartbeat hears of it."""

    def __init__(self, stream: Any, heartbeat: Heartbeat) -> None:
        self._stream = stream
        self._heartbeat = heartbeat

    def write(self, text: str) -> int:
        if text.strip():
            self._heartbeat._noted(text)
        return int(self._stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
