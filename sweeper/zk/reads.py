"""What a ZooKeeper read returns, the same records from the kazoo client and from the wire reader."""

from __future__ import annotations

from dataclasses import dataclass

from kazoo.protocol.states import ZnodeStat


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
