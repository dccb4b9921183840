"""One delete run at a time per cluster: the run lock (`sweeper.run_lock`) at `[delete] lock_path`.

Ephemeral, so a crashed driver's lock goes away with its session instead of blocking every
later run until someone deletes it by hand.
"""

from __future__ import annotations

from typing import Any

from sweeper.run_lock import RunLock, RunLockHeld

DEFAULT_LOCK_PATH = "/ledger-sweeper/locks/delete"


class DeleteRunLock(RunLock):
    what, command = "delete run", "delete"

    def __init__(self, client: Any, path: str = DEFAULT_LOCK_PATH, *, run_id: str) -> None:
        super().__init__(client, path, run_id=run_id)


__all__ = ["DEFAULT_LOCK_PATH", "DeleteRunLock", "RunLockHeld"]
