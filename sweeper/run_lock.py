"""One acting run at a time per cluster: an ephemeral znode naming the holder, and a fence every action checks.

Ephemeral, so a crashed driver's lock goes away with its session instead of blocking every later run until
someone deletes it by hand. Held, it also makes an unclosed journal mean a run that stopped: the delete
(`sweeper.delete.lock`), the emit (`sweeper.emit.stage`) and the retention repair (`sweeper.retention.journal`) each
fold a stopped run in under theirs.

Holding the lock is not enough to act (DESIGN.md invariant 22). ZooKeeper's session semantics (the upstream fact
this rests on, from ZooKeeper's programmer's guide, "ZooKeeper Sessions", and `ZooKeeperServer.expire` /
`SessionTrackerImpl`): the ensemble, not the client, decides when a session expires, after `session timeout` without
a heartbeat; on expiry the leader deletes every ephemeral node of the session and rejects every later request of
that session, and the client learns of it only when it reconnects (kazoo's `KazooState.LOST`). A driver frozen past
its timeout (a GC pause, SIGSTOP, a partition) therefore wakes up believing it still holds a lock that another
run may already hold, and its executor tasks, other processes with sessions of their own, never learn of the
driver's session at all.

So every action carries a fence, chosen here and checked where the action happens:
- Taking the lock bumps the data version of a persistent epoch znode beside it (`<lock>-epoch`) in the same
  ZooKeeper multi that creates the lock node: each holder gets a version no earlier holder had.
- Every delete multi (`sweeper.delete.zk_executor`) checks the lock node at its version and the epoch at the
  holder's version, in the same atomic multi as the deletes. A lock gone with its session fails the first check
  (NoNode); a lock another run took since fails the second (BadVersion, even though the new lock node again has
  version 0). Nothing is deleted then, and the task stops.
- Actions that are not ZooKeeper writes (an admin call, a publish, an S3 DeleteObjects) are preceded by
  `Fence.verify`, a read of the lock node that must still exist with the holder's session as its
  `ephemeralOwner`. The window left is that read's round trip plus the action's own; it is written down where
  each such action is made.
On Oxia (no multi), the multi's checks are the re-read `OxiaTransaction` does before each compare-and-set delete;
an Oxia version id is never reused by a new record, so the lock's own version check already tells holders apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from kazoo.exceptions import NodeExistsError, NoNodeError

from sweeper.errors import LockLost, RunLockHeld
from sweeper.metastore.oxia import capabilities_of
from sweeper.zk.errors import is_connection_error

EPOCH_SUFFIX = "-epoch"
LOCKS_DIR = "/ledger-sweeper/locks"  # where each acting stage's lock lives by default ([delete] lock_path's parent)


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError, OverflowError):
        return True  # another user's process, or a pid we cannot read: assume it lives
    return True


@dataclass(frozen=True)
class Fence:
    """What an action checks to know that its run still holds the lock (picklable: tasks carry it)."""

    lock_path: str
    lock_version: int
    epoch_path: str
    epoch_version: int
    owner_session: int  # the lock node's ephemeralOwner: the holder's session id
    run_id: str

    def checks(self) -> tuple[tuple[str, int], ...]:
        """(path, version) pairs for a compare-and-set multi: both must hold for anything in it to apply."""
        return (self.lock_path, self.lock_version), (self.epoch_path, self.epoch_version)

    def lost_because(self, lock_stat: Any, epoch_stat: Any) -> str | None:
        """Why the lock is not this run's any more, from the two znodes' stats (None: a znode is missing), or None.
        Pure: `verify` reads, this judges."""
        if lock_stat is None:
            return (f"its lock {self.lock_path} is gone: the run's ZooKeeper session expired (a pause or a partition "
                    "longer than [bookkeeper] session_timeout_s)")
        if lock_stat.ephemeralOwner != self.owner_session or lock_stat.version != self.lock_version:
            return f"its lock {self.lock_path} now belongs to another session: another run took it"
        if epoch_stat is None or epoch_stat.version != self.epoch_version:
            return f"its lock's epoch {self.epoch_path} moved on: another run took the lock since"
        return None

    def verify(self, client: Any, deadline_s: float = 10.0) -> str | None:
        """Read the lock and its epoch now: why the run lost it, or None while it holds it. A store that does not
        answer within `deadline_s` (a leader election outlasting it) counts as lost: holding cannot be shown."""
        stop = time.monotonic() + deadline_s
        while True:
            try:
                return self.lost_because(client.exists(self.lock_path), client.exists(self.epoch_path))
            except Exception as exc:
                if not (is_connection_error(exc) or isinstance(exc, ConnectionError | TimeoutError)):
                    return f"its lock {self.lock_path} could not be read: {type(exc).__name__}: {exc}"
                if time.monotonic() >= stop:
                    return (f"its lock {self.lock_path} could not be read for {deadline_s:.0f}s "
                            f"({type(exc).__name__}): holding it cannot be shown")
                time.sleep(0.2)


class LockWatch:
    """A fence re-read through a task's own client before each call that may act (the MigrationWatch shape: `stop`,
    then `detail` and `error` for what is left alone). Once lost, lost for good: a lock never comes back."""

    detail_when_lost = "not attempted: the run lost its lock"

    def __init__(self, client: Any, fence: Fence, timeout_s: float = 10.0) -> None:
        self.client, self.fence, self.timeout_s = client, fence, timeout_s
        self.detail: str | None = None
        self.error: str | None = None

    def lost(self, why: str) -> None:
        """What an action found (a multi's fence check failed): the same as a read saying so."""
        if self.detail is None:
            self.detail, self.error = self.detail_when_lost, why

    def stop(self) -> bool:
        if self.detail is not None:
            return True
        why = self.fence.verify(self.client, self.timeout_s)
        if why is not None:
            self.lost(why)
        return why is not None


class RunLock:
    """`what` and `command` name the kind of run in the refusal: "another delete run holds ... run the delete
    again". `wait_for_dead_local_holder_s` > 0: a lock whose holder names this host and a pid that is gone (a
    killed run) is waited for, up to that long, while its session expires, instead of refused."""

    what, command = "delete run", "delete"

    def __init__(self, client: Any, path: str, *, run_id: str, wait_for_dead_local_holder_s: float = 0.0,
                 log: Callable[[str], None] | None = None) -> None:
        self.client = client
        self.path = path
        self.epoch_path = path + EPOCH_SUFFIX
        self.run_id = run_id
        self.wait_s = wait_for_dead_local_holder_s
        self.log = log or (lambda line: None)
        self._version: int | None = None
        self.fence: Fence | None = None
        self.clock_skew_ms: int | None = None  # ZooKeeper's clock minus this host's, read when acquiring

    def acquire(self) -> None:
        parent = self.path.rsplit("/", 1)[0]
        if parent:
            self._retrying(lambda: self.client.ensure_path(parent))
        self._retrying(self._ensure_epoch)
        body = json.dumps({"run_id": self.run_id, "host": socket.gethostname(), "pid": os.getpid(),
                           "started_ms": int(time.time() * 1000)}).encode()
        before = time.time() * 1000
        try:
            epoch_version = self._create(body)
        except NodeExistsError:
            if not self._wait_for_dead_holder():
                raise RunLockHeld(self.path, self.holder() or {"run_id": "(released meanwhile)"}, self.what,
                                  self.command) from None
            before = time.time() * 1000
            try:
                epoch_version = self._create(body)
            except NodeExistsError:
                raise RunLockHeld(self.path, self.holder() or {"run_id": "(released meanwhile)"}, self.what,
                                  self.command) from None
        after = time.time() * 1000
        stat = self.client.exists(self.path)
        if stat is None:  # our session ended between the create and this read: nothing is ours
            raise LockLost(f"the {self.what}'s lock {self.path} vanished as it was taken: its session ended")
        self._version = stat.version
        self.fence = Fence(self.path, stat.version, self.epoch_path, epoch_version, stat.ephemeralOwner, self.run_id)
        # The lock's ctime is ZooKeeper's clock: the delete stage checks this host's against it.
        self.clock_skew_ms = int(stat.ctime - (before + after) / 2)

    def _ensure_epoch(self) -> None:
        with contextlib.suppress(NodeExistsError):
            self.client.create(self.epoch_path, b"")

    def _retrying(self, action: Callable[[], Any], deadline_s: float = 30.0) -> Any:
        """`action` again after a connection error (a leader election drops every session's connection for a few
        seconds), until `deadline_s`. Only for idempotent steps; the lock's own create is `_create`'s."""
        stop = time.monotonic() + deadline_s
        while True:
            try:
                return action()
            except Exception as exc:
                if not is_connection_error(exc) or time.monotonic() >= stop:
                    raise
                time.sleep(0.25)

    def _create(self, body: bytes) -> int:
        """Create the lock node and bump the epoch (one multi where the store has them); the epoch's version. A create
        whose answer was lost (ConnectionLoss: sent, maybe applied, DESIGN.md invariant 18) is settled by reading the
        lock: a node of this session is ours (with the epoch the multi set), another session's is held, none is
        created again."""
        stop = time.monotonic() + 30.0
        while True:
            try:
                return self._create_once(body)
            except NodeExistsError:
                raise
            except Exception as exc:
                if not is_connection_error(exc) or time.monotonic() >= stop:
                    raise
            time.sleep(0.25)
            try:
                stat = self.client.exists(self.path)
                session = self.client.client_id
            except Exception as exc:
                if not is_connection_error(exc) or time.monotonic() >= stop:
                    raise
                continue
            if stat is None:
                continue  # not applied: send it again
            if session is not None and stat.ephemeralOwner == session[0]:
                epoch = self.client.exists(self.epoch_path)
                if epoch is None:
                    raise LockLost(f"the epoch beside {self.path} vanished as the lock was taken")
                return int(epoch.version)
            raise NodeExistsError(self.path)

    def _create_once(self, body: bytes) -> int:
        if capabilities_of(self.client).atomic_multi:
            tx = self.client.transaction()
            tx.create(self.path, body, ephemeral=True)
            tx.set_data(self.epoch_path, self.run_id.encode())
            created, bumped = tx.commit()
            if isinstance(created, NodeExistsError):
                raise NodeExistsError(self.path)
            for outcome in (created, bumped):
                if isinstance(outcome, Exception):
                    raise outcome
            return int(bumped.version)
        # Oxia: no multi. A new lock record's version id is one no earlier record had (Oxia never reuses one), so a
        # stale holder's check of the lock already fails; the epoch only adds a second look.
        self.client.create(self.path, body, ephemeral=True)
        return int(self.client.set(self.epoch_path, self.run_id.encode()).version)

    def _wait_for_dead_holder(self) -> bool:
        """True once the lock of a holder killed on this host is gone (its session expired), within `wait_s`."""
        holder = self.holder()
        if (self.wait_s <= 0 or holder is None or holder.get("host") != socket.gethostname()
                or _pid_alive(holder.get("pid"))):
            return holder is None  # released while we looked: try again
        self.log(f"the lock {self.path} is held by run {holder.get('run_id')!r}, whose process (pid "
                 f"{holder.get('pid')} on this host) is gone: waiting up to {self.wait_s:.0f}s for its ZooKeeper "
                 "session to expire")
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            if self.client.exists(self.path) is None:
                return True
            time.sleep(0.25)
        return False

    def holder(self) -> dict[str, Any] | None:
        try:
            data, _ = self.client.get(self.path)
        except NoNodeError:
            return None
        try:
            return dict(json.loads(data))
        except (ValueError, TypeError):
            return {"run_id": None, "raw": data[:200].decode("utf-8", "replace")}

    def check(self) -> None:
        """Raise LockLost unless this run still holds its lock (a read: see the module doc for the window)."""
        if self.fence is None:
            return
        why = self.fence.verify(self.client)
        if why is not None:
            raise LockLost(f"the {self.what} {self.run_id} stopped acting: {why}")

    def release(self) -> None:
        if self._version is None:
            return
        self._version = None
        try:
            _, stat = self.client.get(self.path)
            # Only our own session's node: after our session expired, the lock may be someone else's.
            owner = self.fence.owner_session if self.fence is not None else None
            if owner is not None and stat.ephemeralOwner == owner:
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
