"""One way to connect (issue 22): every client a stage opens, built from one config.

ZooKeeper sessions (kazoo and the wire reader), S3 clients, the broker's admin REST client and the
system-topic client each carry the TLS/SASL/token settings of the store they reach, read once here, so no
stage can open a client without them (the retention repair once reached a secured ensemble without them).

The descriptions are small, frozen and picklable: the driver builds them, an executor task opens its own
clients from them. Secrets travel as `Secret`, which never prints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sweeper.broker.system_topic import AdminClient, BrokerSettings, open_client
from sweeper.config import SweeperConfig, SystemTopicConfig
from sweeper.metastore.urls import StoreUrl, parse_pulsar_store_url
from sweeper.objectstore.s3 import S3Target, s3_client
from sweeper.zk import client as zkutil
from sweeper.zk.security import ZkSecurity, bookkeeper_security, pulsar_security

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from sweeper.metastore.oxia import OxiaReader, OxiaStore
    from sweeper.ratelimit import TokenBucket
    from sweeper.zk.wire import WireReader


@dataclass(frozen=True)
class ZooKeeperEndpoint:
    """One ensemble (its connect string may carry a chroot) and how to reach it."""

    hosts: str
    timeout_s: float
    security: ZkSecurity | None = None

    def connect(self) -> KazooClient:
        return zkutil.connect(self.hosts, timeout=self.timeout_s, security=self.security)

    @contextlib.contextmanager
    def session(self) -> Iterator[KazooClient]:
        client = self.connect()
        try:
            yield client
        finally:
            zkutil.close(client)

    def elsewhere(self, hosts: str) -> MetadataEndpoint:
        """Another store reached with the same settings (a peer cluster's store, with [pulsar]'s access)."""
        return endpoint_of(parse_pulsar_store_url(hosts), self.timeout_s, self.security)

    def wire_reader(self, multi_read: int = 1, limiter: TokenBucket | None = None) -> WireReader:
        """The bulk reader (pipelined, multiRead where the server has it) on a session of its own."""
        from sweeper.zk.wire import WireReader

        return WireReader(self.hosts, timeout=self.timeout_s, multi_read=max(1, multi_read),
                          security=self.security, limiter=limiter)


@dataclass(frozen=True)
class OxiaEndpoint:
    """One Oxia namespace (issue 24): the same three ways in as a ZooKeeper ensemble, so a stage never asks which
    store it reads. Oxia has no TLS/SASL settings here: the PyPI client and our read client speak plaintext gRPC."""

    address: str  # host:port
    namespace: str
    timeout_s: float
    security: None = None  # no ZooKeeper ACL identity: the delete's ACL check does not apply

    @property
    def hosts(self) -> str:
        return f"oxia://{self.address}/{self.namespace}"

    def connect(self) -> OxiaStore:
        from sweeper.metastore.oxia import OxiaStore

        return OxiaStore(self.address, self.namespace, self.timeout_s)

    @contextlib.contextmanager
    def session(self) -> Iterator[OxiaStore]:
        client = self.connect()
        try:
            yield client
        finally:
            client.close()

    def elsewhere(self, hosts: str) -> MetadataEndpoint:
        return endpoint_of(parse_pulsar_store_url(hosts), self.timeout_s, None)

    def wire_reader(self, multi_read: int = 1, limiter: TokenBucket | None = None) -> OxiaReader:
        """The bulk reader: a directory's children with their values in one range scan, over gRPC of its own."""
        from sweeper.metastore.oxia import OxiaReader
        from sweeper.metastore.oxia_grpc import OxiaReadClient

        return OxiaReader(OxiaReadClient(self.address, self.namespace, self.timeout_s))


MetadataEndpoint = ZooKeeperEndpoint | OxiaEndpoint


def endpoint_of(url: StoreUrl, timeout_s: float, security: ZkSecurity | None) -> MetadataEndpoint:
    """The endpoint an address names; ZooKeeper's carries `security` (TLS/SASL/digest), Oxia's none."""
    if url.is_oxia:
        return OxiaEndpoint(url.hosts, url.namespace, timeout_s)
    return ZooKeeperEndpoint(url.hosts, timeout_s, security)


@dataclass(frozen=True)
class Connections:
    """Every store of one cluster, as the config names them."""

    bookkeeper: MetadataEndpoint
    pulsar: MetadataEndpoint
    configuration_store: MetadataEndpoint | None  # None: policies live in `pulsar`'s store
    peers: tuple[MetadataEndpoint, ...]  # [safety] peer_metadata, reached with [pulsar]'s access settings
    brokers_path: str  # where this cluster's brokers register (liveness, and the hosts a redirect may reach)
    s3_endpoint_override: str
    system_topic: SystemTopicConfig
    # [safety] migration_source_store, reached with [pulsar]'s access settings: its PIP-454 flag must read COMPLETED
    # for [safety] acknowledge_migration_completed to hold (sweeper.metastore.migration)
    migration_source: MetadataEndpoint | None = None

    @classmethod
    def from_config(cls, config: SweeperConfig) -> Connections:
        timeout = config.bookkeeper.session_timeout_s
        # The configuration store and the peers are Pulsar stores: [pulsar]'s access options (or
        # [bookkeeper]'s, which pulsar_security falls back to) reach them.
        access = pulsar_security(config)
        store = config.configuration_store_url()
        return cls(
            bookkeeper=endpoint_of(config.bookkeeper_store(), timeout, bookkeeper_security(config)),
            pulsar=endpoint_of(config.pulsar_store(), timeout, access),
            configuration_store=endpoint_of(store, timeout, access) if store is not None else None,
            peers=tuple(endpoint_of(parse_pulsar_store_url(peer), timeout, access)
                        for peer in config.safety.peer_metadata),
            brokers_path=config.pulsar.brokers_path,
            s3_endpoint_override=config.offload.endpoint_override,
            system_topic=config.system_topic,
            migration_source=endpoint_of(parse_pulsar_store_url(config.safety.migration_source_store), timeout,
                                         access) if config.safety.migration_source_store else None,
        )

    @property
    def policies(self) -> MetadataEndpoint:
        """Where namespace policies live: the configuration store when there is one."""
        return self.configuration_store or self.pulsar

    def s3(self, target: S3Target) -> Any:
        return s3_client(target, self.s3_endpoint_override)

    def broker(self) -> BrokerSettings:
        """What a task needs to open its own system-topic client (refuses when no service_url is set)."""
        return BrokerSettings.from_config(self.system_topic)

    def topic_client(self) -> Any:
        return open_client(self.broker())

    def admin(self) -> AdminClient:
        """The admin REST client at [system_topic] admin_url; redirects are followed to admin_url only."""
        return AdminClient(self.system_topic)

    def cluster_admin(self) -> AdminClient:
        """An admin client that may also follow a redirect to any broker of this cluster registered now (the
        owner of a topic is often another broker), never to a host outside it."""
        from sweeper.broker.liveness import registered_web_origins

        admin = self.admin()
        with self.pulsar.session() as client:
            admin.allow_brokers(registered_web_origins(client, self.brokers_path))
        return admin
