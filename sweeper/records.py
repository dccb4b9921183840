"""Small records several layers share, with no dependency above the standard library and kazoo's stat:

- `Secret`: a credential read from a file or an environment variable (a broker token, a SASL password), never
  printed;
- `ZnodeRead`, `ChildrenRead`: what a metadata-store read returns, the same from kazoo, from the ZooKeeper wire
  reader and from Oxia's reader, so no store's module imports another's for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kazoo.protocol.states import ZnodeStat


@dataclass(frozen=True)
class Secret:
    """A value that must not be printed: repr and str show only that it is set."""

    value: str = field(repr=False)

    def __str__(self) -> str:
        return "***"


@dataclass(frozen=True, slots=True)
class ZnodeRead:
    path: str
    data: bytes | None  # None: the znode vanished (NoNode) between listing and reading
    stat: ZnodeStat | None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class ChildrenRead:
    path: str
    children: list[str] | None  # None: the znode vanished
    error: BaseException | None = None
