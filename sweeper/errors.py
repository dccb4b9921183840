"""Every error of the sweeper, by the exit code the CLI gives it (issue 22, one hierarchy since issue 36, every class
under it since issue 46). This module holds the hierarchy and the root modules' errors (the config's, the run
lock's); each package holds its own in its `errors` module (`sweeper.tables.errors`, `sweeper.zk.errors`, ...),
which imports nothing of the sweeper but this one. This module imports nothing of the sweeper.

- `UsageError` (exit 2): the command as typed cannot be run (flags, config, input files); the message names the fix.
  `ConfigurationError` is the part of it that is the config or the machine's setup: a bad setting, a store URL,
  a missing jar, a table root Spark cannot reach (`ConfigError`, `tables.errors.DeltaSparkUnavailableError`,
  `tables.errors.TableStorageUnavailableError`, `metastore.errors.StoreUrlError`, `rules.errors.SafetyConfigError`).
- `Refused` (exit 3): the run stopped on purpose before doing harm: a gate, a safety rule, a lock, an unreachable
  or unreadable store. Each stage's refusal is a subclass, so callers may still catch the narrow one.
- `InternalError` (exit 1): raised and caught inside the sweeper, where it becomes a recorded outcome (a quarantined
  znode, a bookie `not_measured`, a warning line) or one of the errors above. One that reaches the CLI is a bug or
  an outage nobody foresaw, like any other exception: exit 1, its trace in the log file, no terminal line.
- An interrupt (SIGINT, SIGTERM) is Python's KeyboardInterrupt: exit 130.
- Anything else is a bug or an outage nobody foresaw: exit 1, its trace in the log file.
`exit_code` and `terminal_line` are the one mapping (the CLI's `_run` and `main` use nothing else).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_REFUSED, EXIT_PARTIAL = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130  # SIGINT or SIGTERM: stopped, what was done is on record


class SweeperError(Exception):
    """The root of the errors an operator acts on: each class says its exit code and how its line starts."""

    exit_code = EXIT_ERROR
    label = "error"


class UsageError(SweeperError):
    """The operator's command or its arguments are wrong; nothing was written."""

    exit_code = EXIT_USAGE
    label = "usage error"


class ConfigurationError(UsageError):
    """The config, or the machine's setup (jars, storage), is wrong: the message names the setting or the fix."""

    label = "configuration error"


class Refused(SweeperError, RuntimeError):
    """The run stopped on purpose, nothing unsafe done; the message says why and what to do."""

    exit_code = EXIT_REFUSED
    label = "refused"
    # True for a run that may no longer write its own final status (it lost its run lock, DESIGN.md invariant 22):
    # `runs.stage` records nothing for it, and the next holder of the lock folds it in from its journal.
    leaves_run_to_next_holder = False


class StageRefused(Refused):
    """A stage stopped on purpose (gate, breaker, bad input): exit code 3, nothing planned. `runs.stage` raises it
    for the refusals a stage names, with the narrow one as its cause."""


class InternalError(SweeperError):
    """Raised and caught inside the sweeper: it becomes a recorded outcome or one of the operator-facing errors
    (`UsageError`, `Refused`). Reaching the CLI it is a bug or an outage nobody foresaw: exit 1, its trace in the
    log file (the CLI's `_run` raises it again, as any error of exit code 1)."""

    exit_code = EXIT_ERROR
    label = "internal error"


class RunIdTaken(UsageError):
    """A run id given for a new run already names rows in the tables."""


class ConfigError(ConfigurationError, ValueError):
    """A config file or setting the sweeper cannot use (`sweeper.config` raises it): the message names the setting."""


class RunLockHeld(Refused):
    """Another run holds the lock (`sweeper.run_lock`): who, where and since when, and what to do."""

    def __init__(self, path: str, holder: dict[str, Any], what: str = "delete run", command: str = "delete") -> None:
        super().__init__(
            f"another {what} holds {path}: run {holder.get('run_id')!r} on {holder.get('host')!r} "
            f"(pid {holder.get('pid')}, since {_since(holder.get('started_ms'))}). Wait for it to end; if that "
            "process is gone, the lock (an ephemeral znode) goes with its ZooKeeper session within [bookkeeper] "
            f"session_timeout_s, then run the {command} again"
        )
        self.path = path
        self.holder = holder


class LockLost(Refused):
    """The run's lock is no longer its own (its session expired, or another run took the lock): it stopped acting.

    Such a run writes no final `runs` row and leaves its journal open: the run that takes the lock next folds in
    what it did, as it folds in a killed run, so each of its actions is recorded once and the run has one status."""

    leaves_run_to_next_holder = True


def _since(started_ms: Any) -> str:
    """A lock holder's start (epoch ms) as an ISO time, for RunLockHeld's message."""
    try:
        return datetime.fromtimestamp(int(started_ms) / 1000, UTC).isoformat(timespec="seconds")
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"


def exit_code(exc: BaseException) -> int:
    """The exit code of a command that ended with `exc`."""
    if isinstance(exc, KeyboardInterrupt) or caused_by_interrupt(exc):
        return EXIT_INTERRUPTED
    return exc.exit_code if isinstance(exc, SweeperError) else EXIT_ERROR


def terminal_line(exc: SweeperError) -> str:
    """The one line an operator's mistake or a refusal gets on the terminal (never a traceback)."""
    return f"{exc.label}: {exc}"


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

