"""The delete stage's refusal (exit 3): nothing emitted, the lock taken by another run, or an unsafe setup."""

from __future__ import annotations

from sweeper.errors import Refused


class DeleteRefused(Refused):
    """The delete stage will not start: nothing emitted, another run holds the lock, or an unsafe setup."""
