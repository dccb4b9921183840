"""One delete run at a time per cluster: the run lock (`sweeper.run_lock`) at `[delete] lock_path`.

Ephemeral, so a crashed driver's lock goes away with its session instead of blocking every
later run until someone deletes it by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sweeper.run_lock import LOCKS_DIR, RunLock

DEFAULT_LOCK_PATH = f"{LOCKS_DIR}/delete"


class DeleteRunLock(RunLock):
    what, command = "delete run", "delete"

    def __init__(self, client: Any, path: str = DEFAULT_LOCK_PATH, *, run_id: str,
                 wait_for_dead_local_holder_s: float = 0.0, log: Callable[[str], None] | None = None) -> None:
        super().__init__(client, path, run_id=run_id, wait_for_dead_local_holder_s=wait_for_dead_local_holder_s,
                         log=log)


__all__ = ["DEFAULT_LOCK_PATH", "DeleteRunLock"]
