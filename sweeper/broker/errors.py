"""How the broker fails us: unreachable, refusing, mismatched, or redirecting outside the cluster (each a refusal)."""

from __future__ import annotations

from sweeper.errors import Refused


class SystemTopicError(Refused):
    """The broker or its admin API cannot be used as configured: unreachable, refusing, or mismatched."""


class RedirectRefused(SystemTopicError):
    """A redirect to a host that is not a broker of this cluster: not followed, and our token not sent there."""

    def __init__(self, target: str, method: str, url: str) -> None:
        self.target = target
        super().__init__(f"redirect_outside_cluster: {target} is not a broker registered in this cluster's "
                         f"metadata; {method} {url} was not sent there")
