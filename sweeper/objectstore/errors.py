"""The object stores' errors: a store that cannot be reached or answers what we cannot read."""

from __future__ import annotations

from sweeper.errors import InternalError


class ObjectStoreError(InternalError):
    """A store call failed (refused, unreachable, an answer we cannot read); the caller turns it into a quarantine
    row (a listing slice) or a `failed` result (a delete), never a crash of the run."""
