"""Safety rules as pure functions over plain values: no Spark, no I/O, each one tested.

They are the reasons a ledger is *not* deleted, so each returns a verdict with the reason
spelled out for the audit trail.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from sweeper.rules.errors import SafetyConfigError
from sweeper.vocabulary import DAY_MS, HOUR_MS

MIN_AGE_FLOOR_MS = DAY_MS
DEFAULT_MIN_AGE_MS = 7 * DAY_MS


@dataclass(frozen=True)
class GracePeriod:
    min_age_ms: int = DEFAULT_MIN_AGE_MS

    @classmethod
    def of(cls, min_age_ms: int, force: bool = False) -> GracePeriod:
        """A grace period; under 24 hours only when forced (a fresh ledger may not be listed yet)."""
        if min_age_ms < 0:
            raise SafetyConfigError(f"min_age must not be negative, got {min_age_ms} ms")
        if min_age_ms < MIN_AGE_FLOOR_MS and not force:
            raise SafetyConfigError(
                f"min_age {min_age_ms / HOUR_MS:.1f}h is under the 24h floor: a ledger that young may be "
                "in the middle of being added to its topic. Pass force to override."
            )
        return cls(min_age_ms)

    def is_old_enough(self, created_ms: int | None, now_ms: int) -> bool:
        """Unknown age is never old enough: we cannot prove it is past the grace period."""
        if created_ms is None or created_ms <= 0:
            return False
        return now_ms - created_ms >= self.min_age_ms


def ledger_created_ms(metadata_ctime_ms: int | None, znode_ctime_ms: int | None) -> int | None:
    """When a ledger was created, by the later of two clocks: the broker's (the metadata's ctime, when
    recorded) and ZooKeeper's (the znode's ctime). One clock running behind would make a young ledger
    look old; the later reading can only make it look younger, which errs on the side of keeping it."""
    readings = [t for t in (metadata_ctime_ms, znode_ctime_ms) if t is not None and t > 0]
    return max(readings) if readings else None


def ledger_age_ms(metadata_ctime_ms: int | None, znode_ctime_ms: int | None, now_ms: int) -> int | None:
    created = ledger_created_ms(metadata_ctime_ms, znode_ctime_ms)
    return None if created is None else now_ms - created


def offload_in_flight(complete: bool | None, offload_timestamp_ms: int | None, now_ms: int,
                      grace: GracePeriod) -> bool:
    """An offload not marked complete, and recent, may still be written: never an orphan."""
    if complete:
        return False
    if offload_timestamp_ms is None or offload_timestamp_ms <= 0:
        return True
    return now_ms - offload_timestamp_ms < grace.min_age_ms


@dataclass(frozen=True)
class CircuitBreaker:
    max_orphan_fraction: float = 0.10

    def __post_init__(self) -> None:
        if not 0.0 < self.max_orphan_fraction <= 1.0:
            raise SafetyConfigError(f"max_orphan_fraction must be in (0, 1], got {self.max_orphan_fraction}")

    def tripped(self, orphans: int, pulsar_ledgers: int) -> str | None:
        """Why the run must stop, or None. Many orphans at once smells of a bad snapshot."""
        if orphans == 0:
            return None
        if pulsar_ledgers <= 0:
            return f"{orphans} orphan candidates but no Pulsar ledgers in the snapshot"
        fraction = orphans / pulsar_ledgers
        if fraction > self.max_orphan_fraction:
            return (
                f"circuit breaker: {orphans} of {pulsar_ledgers} Pulsar ledgers ({fraction:.1%}) would be "
                f"orphans, above max_orphan_fraction {self.max_orphan_fraction:.1%}"
            )
        return None

    def tripped_objects(self, orphans: int, objects: int, orphan_bytes: int, object_bytes: int) -> str | None:
        """The same for tiered storage: by object count and by bytes (a few huge objects count too)."""
        if orphans == 0:
            return None
        if objects <= 0:
            return f"{orphans} orphan offloaded objects but no objects in the snapshot"
        for what, part, whole in (("objects", orphans, objects), ("bytes", orphan_bytes, object_bytes)):
            if whole > 0 and part / whole > self.max_orphan_fraction:
                return (f"circuit breaker: {part:,} of {whole:,} offloaded {what} ({part / whole:.1%}) would be "
                        f"orphans, above max_orphan_fraction {self.max_orphan_fraction:.1%}")
        return None


def globs(text: str) -> tuple[str, ...]:
    """A config option's comma-separated glob list: `"team-a, team-b/ns-*"` -> ("team-a", "team-b/ns-*")."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


@dataclass(frozen=True)
class Scope:
    """Tenant/namespace allow and deny lists (glob patterns, `tenant` or `tenant/namespace`).

    Deny wins over allow; an empty allow list allows everything not denied.
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = field(default=())

    @classmethod
    def of(cls, allow: str, deny: str) -> Scope:
        """From [safety] allow / deny as written in the config."""
        return cls(globs(allow), globs(deny))

    def permits(self, tenant: str | None, namespace: str | None) -> bool:
        if tenant is None:
            return not self.allow  # unknown owner: only when nothing is restricted
        names = [tenant] + ([f"{tenant}/{namespace}"] if namespace else [])
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.deny for name in names):
            return False
        if not self.allow:
            return True
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.allow for name in names)


def retention_scope(retention_allow: list[str] | tuple[str, ...], retention_deny: list[str] | tuple[str, ...],
                    safety_allow: list[str] | tuple[str, ...], safety_deny: list[str] | tuple[str, ...]) -> Scope:
    """The namespaces the retention step and its repair may act on: `[retention] allow` (else `[safety] allow`),
    minus `[safety] deny` and `[retention] deny`. One function, so the repair cannot drift from the plan."""
    return Scope(allow=globs(retention_allow) or globs(safety_allow), deny=globs(safety_deny) + globs(retention_deny))
