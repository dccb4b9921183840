"""Whether a local server process recorded in a marker file still runs (the sandbox, testbed and test servers).

A process killed with SIGKILL stays a zombie until its parent reaps it, and `kill(pid, 0)` succeeds on a
zombie: a server started by this very process (the CLI in a test, a notebook) and then killed would look alive
forever, and `up` would keep a dead endpoint instead of starting a new one (issue 27).
"""

from __future__ import annotations

import contextlib
import os


def pid_alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie; a zombie child of this process is reaped on the way."""
    if pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]  # the name in parentheses may hold spaces
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc here: existence is all we can tell
    return state != "Z"
