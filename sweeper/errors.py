"""Errors an operator acts on, by the exit code the CLI gives them (issue 22). The CLI maps them in one place.

- `UsageError` (exit 2): the command as typed cannot be run (flags, config, input files); the message names the fix.
- `Refused` (exit 3): the run stopped on purpose before doing harm: a gate, a safety rule, a lock, an unreachable
  or unreadable store. Each stage's refusal is a subclass, so callers may still catch the narrow one.
- An interrupt (SIGINT, SIGTERM) is Python's KeyboardInterrupt: exit 130.
"""

from __future__ import annotations


class UsageError(Exception):
    """The operator's command or its arguments are wrong; nothing was written."""


class Refused(RuntimeError):
    """The run stopped on purpose, nothing unsafe done; the message says why and what to do."""


class StageRefused(Refused):
    """A stage stopped on purpose (gate, breaker, bad input): exit code 3, nothing planned. `runs.stage` raises it
    for the refusals a stage names, with the narrow one as its cause."""


class RunIdTaken(UsageError):
    """A run id given for a new run already names rows in the tables."""


def one_line(exc: BaseException, limit: int = 500) -> str:
    """An exception as a `runs` message or a terminal line: its type and the first line of its text. A py4j
    error's text is a Java stack trace many KB long; that belongs in the log file, not in a table."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:limit]


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether `exc` is, or was raised while handling, an interrupt. PySpark's own SIGINT handler (SparkContext)
    raises KeyboardInterrupt and cancels every running job; the call that was waiting on a job then fails with a
    py4j error (SPARK_JOB_CANCELLED) raised during the handling of that interrupt: still an interrupt (exit 130,
    `interrupted` in runs), never a failure with a Java trace."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False

