"""Metadata-store addresses in Pulsar's and BookKeeper's own spellings, so an operator copies them from broker.conf
and bookkeeper.conf rather than translating them.

- BookKeeper's `metadataServiceUri`: `zk+hierarchical://zk1:2181;zk2:2181/ledgers` (any `zk+<manager>` scheme;
  hosts separated by `;`, the path is the ledgers root), `metadata-store:zk:zk1:2181/chroot` and
  `metadata-store:oxia://host:6648/namespace`. Through `metadata-store:` the ledgers root is always `/ledgers`:
  `AbstractMetadataDriver.resolveLedgersRootPath` takes `URI.getPath()`, which is null for that opaque URI, and
  falls back to `BookKeeperConstants.DEFAULT_ZK_LEDGERS_ROOT_PATH`.
- Pulsar's `metadataStoreUrl` / `configurationMetadataStoreUrl`: `zk:zk1:2181,zk2:2181/chroot`, a bare ZooKeeper
  connect string, or `oxia://host:6648/namespace` (`OxiaMetadataStoreProvider.getServiceAddressAndNamespace`:
  one path segment at most, the namespace; none means `default`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.metastore.errors import StoreUrlError

ZOOKEEPER, OXIA = "zookeeper", "oxia"
DEFAULT_LEDGERS_ROOT = "/ledgers"
DEFAULT_OXIA_NAMESPACE = "default"


@dataclass(frozen=True)
class StoreUrl:
    kind: str  # ZOOKEEPER | OXIA
    hosts: str  # ZooKeeper: a kazoo connect string, chroot included; Oxia: host:port
    namespace: str = ""  # Oxia only
    ledgers_root: str = DEFAULT_LEDGERS_ROOT  # BookKeeper's, when the URI says it

    @property
    def is_oxia(self) -> bool:
        return self.kind == OXIA

    def __str__(self) -> str:
        return f"oxia://{self.hosts}/{self.namespace}" if self.is_oxia else self.hosts


def _oxia(rest: str, original: str) -> StoreUrl:
    address, _, namespace = rest.partition("/")
    if not address or ":" not in address or "/" in namespace:
        raise StoreUrlError(f"{original!r}: an Oxia address is oxia://host:port/namespace (one namespace, no path)")
    return StoreUrl(OXIA, address, namespace or DEFAULT_OXIA_NAMESPACE)


def _zookeeper_hosts(text: str, original: str) -> str:
    hosts = text.replace(";", ",")
    if not hosts or hosts.startswith("/") or "://" in hosts:
        raise StoreUrlError(f"{original!r}: expected ZooKeeper hosts such as zk1:2181,zk2:2181[/chroot]")
    return hosts


def parse_pulsar_store_url(text: str) -> StoreUrl:
    """broker.conf's `metadataStoreUrl` (or `configurationMetadataStoreUrl`)."""
    url = text.strip()
    if url.startswith("oxia://"):
        return _oxia(url[len("oxia://"):], text)
    if url.startswith("zk://"):  # never valid for Pulsar; named so the fix is obvious
        raise StoreUrlError(f"{text!r}: Pulsar spells ZooKeeper as zk:host:2181[/chroot] (no //)")
    if url.startswith("zk:"):
        url = url[len("zk:"):]
    return StoreUrl(ZOOKEEPER, _zookeeper_hosts(url, text))


def parse_bookkeeper_service_uri(text: str) -> StoreUrl:
    """bookkeeper.conf's `metadataServiceUri` (and the broker's `bookkeeperMetadataServiceUri`)."""
    uri = text.strip()
    if uri.startswith("metadata-store:"):
        inner = parse_pulsar_store_url(uri[len("metadata-store:"):])
        return StoreUrl(inner.kind, inner.hosts, inner.namespace, DEFAULT_LEDGERS_ROOT)
    scheme, sep, rest = uri.partition("://")
    if not sep or not (scheme == "zk" or scheme.startswith("zk+")):
        raise StoreUrlError(f"{text!r}: expected zk+hierarchical://zk1:2181;zk2:2181/ledgers or "
                            "metadata-store:oxia://host:6648/namespace")
    hosts, slash, path = rest.partition("/")
    if not slash or not path:
        raise StoreUrlError(f"{text!r}: the URI's path is the ledgers root (zk+hierarchical://zk1:2181/ledgers)")
    return StoreUrl(ZOOKEEPER, _zookeeper_hosts(hosts, text), ledgers_root="/" + path.rstrip("/"))
