"""Errors an operator acts on, by the exit code the CLI gives them (more move here as stages adopt it, issue 22).

`UsageError` (exit 2): the command as typed cannot be run; the message names the fix.
"""

from __future__ import annotations


class UsageError(Exception):
    """The operator's command or its arguments are wrong; nothing was written."""


class RunIdTaken(UsageError):
    """A run id given for a new run already names rows in the tables."""


def one_line(exc: BaseException, limit: int = 500) -> str:
    """An exception as a `runs` message or a terminal line: its type and the first line of its text. A py4j
    error's text is a Java stack trace many KB long; that belongs in the log file, not in a table."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:limit]
