"""Where the JVM's and the libraries' chatter goes (DESIGN: an operator's terminal shows the run's own lines; Spark,
py4j and the workers write to a log file): descriptor 2 moved to the log file for the command's lifetime."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

LOG_FILE_ENV = "SWEEPER_LOG_FILE"
DEFAULT_LOG_FILE = "var/log/sweeper.log"


def chatter_to_log_file(verbose: bool) -> tuple[Path | None, Any]:
    """Everything written to file descriptor 2 from now on (the JVM's log4j and its stack traces, Python workers,
    py4j's complaints, library warnings) goes to the log file; this process's own lines keep the terminal.

    Only when stderr is the process's real descriptor 2 (a terminal, a scheduler's pipe): inside a test's or a
    notebook's captured stderr nothing is moved. With --verbose nothing is moved either."""
    try:
        real = not verbose and sys.stderr is sys.__stderr__ and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        real = False
    if not real:
        return None, None
    path = Path(os.environ.get(LOG_FILE_ENV) or DEFAULT_LOG_FILE).resolve()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return None, None  # an unwritable log location must not stop the command
    terminal_fd = os.dup(2)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stderr = os.fdopen(terminal_fd, "w", buffering=1)
    return path, terminal_fd


def restore_stderr(terminal_fd: Any) -> None:
    if terminal_fd is None:
        return
    sys.stderr.flush()
    os.dup2(terminal_fd, 2)
    sys.stderr = sys.__stderr__
