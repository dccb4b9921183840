"""One acting run at a time per cluster: an ephemeral znode naming the holder.

Ephemeral, so a crashed driver's lock goes away with its session instead of blocking every later run until
someone deletes it by hand. Held, it also makes an unclosed journal mean a run that stopped: the delete
(`sweeper.delete.lock`) and the retention repair (`sweeper.repair_journal`) each fold a stopped run in under theirs.
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

from kazoo.exceptions import NodeExistsError, NoNodeError

from sweeper.errors import Refused
from sweeper.zk.errors import is_connection_error


def _when(started_ms: Any) -> str:
    try:
        return datetime.fromtimestamp(int(started_ms) / 1000, UTC).isoformat(timespec="seconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"


class RunLockHeld(Refused):
    def __init__(self, path: str, holder: dict[str, Any], what: str = "delete run", command: str = "delete") -> None:
        super().__init__(
            f"another {what} holds {path}: run {holder.get('run_id')!r} on {holder.get('host')!r} "
            f"(pid {holder.get('pid')}, since {_when(holder.get('started_ms'))}). Wait for it to end; if that "
            "process is gone, the lock (an ephemeral znode) goes with its ZooKeeper session within [bookkeeper] "
            f"session_timeout_s, then run the {command} again"
        )
        self.path = path
        self.holder = holder


class RunLock:
    """`what` and `command` name the kind of run in the refusal: "another delete run holds ... run the delete
    again"."""

    what, command = "delete run", "delete"

    def __init__(self, client: Any, path: str, *, run_id: str) -> None:
        self.client = client
        self.path = path
        self.run_id = run_id
        self._version: int | None = None
        self.clock_skew_ms: int | None = None  # ZooKeeper's clock minus this host's, read when acquiring

    def acquire(self) -> None:
        parent = self.path.rsplit("/", 1)[0]
        if parent:
            self.client.ensure_path(parent)
        body = {"run_id": self.run_id, "host": socket.gethostname(), "pid": os.getpid(),
                "started_ms": int(time.time() * 1000)}
        before = time.time() * 1000
        try:
            _, stat = self.client.create(self.path, json.dumps(body).encode(), ephemeral=True, include_data=True)
        except NodeExistsError:
            raise RunLockHeld(self.path, self.holder() or {"run_id": "(released meanwhile)"}, self.what,
                              self.command) from None
        after = time.time() * 1000
        self._version = 0
        # The lock's ctime is ZooKeeper's clock: the delete stage checks this host's against it.
        self.clock_skew_ms = int(stat.ctime - (before + after) / 2)

    def holder(self) -> dict[str, Any] | None:
        try:
            data, _ = self.client.get(self.path)
        except NoNodeError:
            return None
        try:
            return dict(json.loads(data))
        except (ValueError, TypeError):
            return {"run_id": None, "raw": data[:200].decode("utf-8", "replace")}

    def release(self) -> None:
        if self._version is None:
            return
        self._version = None
        try:
            _, stat = self.client.get(self.path)
            # Only our own session's node: after our session expired, the lock may be someone else's.
            session = self.client.client_id
            if session is not None and stat.ephemeralOwner == session[0]:
                self.client.delete(self.path, version=stat.version)
        except NoNodeError:
            pass
        except Exception as exc:
            # The ephemeral node ends with our session anyway; never mask the run's own error with this.
            if not (is_connection_error(exc) or isinstance(exc, ConnectionError | TimeoutError)):
                raise

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
