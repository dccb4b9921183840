"""The rules' one error: a [safety] setting that cannot be applied (a configuration error, exit 2)."""

from __future__ import annotations

from sweeper.errors import ConfigurationError


class SafetyConfigError(ConfigurationError, ValueError):
    """A [safety] setting the rules cannot apply (`sweeper.rules.safety`): the message names it."""
