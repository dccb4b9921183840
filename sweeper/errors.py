"""Errors an operator acts on, by the exit code the CLI gives them (more move here as stages adopt it, issue 22).

`UsageError` (exit 2): the command as typed cannot be run; the message names the fix.
"""

from __future__ import annotations


class UsageError(Exception):
    """The operator's command or its arguments are wrong; nothing was written."""


class RunIdTaken(UsageError):
    """A run id given for a new run already names rows in the tables."""
