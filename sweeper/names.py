"""Pulsar's names in one canonical form, so every stage compares the same strings.

Pulsar names a topic `persistent://tenant/namespace/local` (or, for old cluster-scoped
namespaces, `persistent://tenant/cluster/namespace/local`) with the local name as the user
wrote it. Its managed ledger is named `tenant/namespace/persistent/<encoded local>`, where the
local name goes through `org.apache.pulsar.common.util.Codec.encode`, i.e. Java's
`URLEncoder.encode(s, UTF-8)` (`TopicName.getPersistenceNamingEncoding`): a space becomes `+`,
`:` becomes `%3A`, `%` becomes `%25`. Ledger custom metadata carries both forms:
`pulsar/managed-ledger` holds the encoded managed-ledger name, while `pulsar/compactedTopic` and
`pulsar/delayedIndexTopic` hold the topic name (`TopicName.toString()`, decoded).

The canonical forms used everywhere in the sweeper:
- a topic name is decoded: `persistent://t/ns/my topic`;
- a managed-ledger name is Pulsar's encoded one: `t/ns/persistent/my+topic`.
A name that does not survive a round trip through both is not one Pulsar wrote: callers treat
it as unknown, never as a match.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from functools import lru_cache

DOMAIN = "persistent"
TOPIC_PREFIX = DOMAIN + "://"
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def encode_local_name(name: str) -> str:
    """Java's URLEncoder.encode(name, UTF-8): letters, digits and `.-*_` kept, space as `+`."""
    return urllib.parse.quote_plus(name, safe="*").replace("~", "%7E")


def decode_local_name(encoded: str) -> str | None:
    """Java's URLDecoder.decode(encoded, UTF-8), or None where Java would throw (a bad `%` escape)."""
    if _BAD_PERCENT.search(encoded):
        return None
    try:
        return urllib.parse.unquote_plus(encoded, errors="strict")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True, slots=True)
class TopicParts:
    tenant: str
    namespace: str  # `ns`, or `cluster/ns` for an old cluster-scoped namespace
    local: str  # decoded local name

    @property
    def topic_name(self) -> str:
        return f"{TOPIC_PREFIX}{self.tenant}/{self.namespace}/{self.local}"

    @property
    def managed_ledger(self) -> str:
        return f"{self.tenant}/{self.namespace}/{DOMAIN}/{encode_local_name(self.local)}"


def _valid_segments(parts: list[str]) -> bool:
    return all(p and p not in (".", "..") for p in parts)


@lru_cache(maxsize=131072)
def parse_managed_ledger(name: str | None) -> TopicParts | None:
    """`t/ns/persistent/enc` or `t/cluster/ns/persistent/enc`; None for anything else or non-canonical."""
    if not name:
        return None
    parts = name.split("/")
    if len(parts) not in (4, 5) or parts[-2] != DOMAIN or not _valid_segments(parts):
        return None
    local = decode_local_name(parts[-1])
    if local is None:
        return None
    topic = TopicParts(parts[0], "/".join(parts[1:-2]), local)
    return topic if topic.managed_ledger == name else None


@lru_cache(maxsize=131072)
def parse_topic(topic_name: str | None) -> TopicParts | None:
    """`persistent://t/ns/local` or `persistent://t/cluster/ns/local`; None for anything else."""
    if not topic_name or not topic_name.startswith(TOPIC_PREFIX):
        return None
    parts = topic_name[len(TOPIC_PREFIX):].split("/", 2)
    if len(parts) != 3 or not _valid_segments(parts[:2]) or not parts[2]:
        return None
    tenant, second, rest = parts
    # The local name may itself hold '/' only in Pulsar's old cluster-scoped form t/cluster/ns/local.
    if "/" in rest:
        ns, local = rest.split("/", 1)
        if "/" in local or not _valid_segments([ns]) or not local:
            return None
        return TopicParts(tenant, f"{second}/{ns}", local)
    return TopicParts(tenant, second, rest)


def managed_ledger_for_topic(topic_name: str | None) -> str | None:
    """`persistent://t/ns/my topic` -> `t/ns/persistent/my+topic` (None when not a persistent topic name)."""
    parts = parse_topic(topic_name)
    return parts.managed_ledger if parts else None


def topic_for_managed_ledger(name: str | None) -> str | None:
    """`t/ns/persistent/my+topic` -> `persistent://t/ns/my topic` (None when not a canonical name)."""
    parts = parse_managed_ledger(name)
    return parts.topic_name if parts else None
