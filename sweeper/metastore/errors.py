"""How the metadata stores fail as a whole: an unreachable Oxia (a refusal, exit 3), a store address the config cannot
use (a configuration error, exit 2), a migration that makes the store the wrong one to act on (a refusal)."""

from __future__ import annotations

from sweeper.errors import ConfigurationError, Refused


class OxiaUnavailableError(Refused, ConnectionError):
    """The Oxia server cannot be reached, or answers in a way this client cannot use."""


class MigrationRefused(Refused):
    """A metadata migration makes this store the wrong one to act on now (exit 3)."""


class StoreUrlError(ConfigurationError, ValueError):
    """An address neither Pulsar nor BookKeeper would accept; the message names the accepted spellings."""
