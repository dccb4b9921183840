"""The sandbox's Pulsar endpoint and its admin REST sliver as one broker a test starts, stops and restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.sandbox.pulsar_endpoint import PulsarEndpoint
from harness.sandbox.pulsar_endpoint.admin import AdminServer
from harness.zkserver import free_port
from sweeper.broker.system_topic import partition_topic

TOPIC = "persistent://pulsar/system/__ledger_deletion"


class Broker:
    """The local endpoint plus its admin REST sliver, restartable on the same ports and data."""

    def __init__(self, data_dir: Path, token: str | None = None, tls: tuple[Path, Path] | None = None) -> None:
        self.data_dir, self.token = data_dir, token
        self.tls = (str(tls[0]), str(tls[1])) if tls else (None, None)
        self.port, self.admin_port = free_port(), free_port()
        self.endpoint: PulsarEndpoint | None = None
        self.admin: AdminServer | None = None

    def start(self) -> Broker:
        self.endpoint = PulsarEndpoint(self.data_dir, port=self.port, token=self.token, tls_cert_file=self.tls[0],
                                       tls_key_file=self.tls[1]).start()
        self.admin = AdminServer(self.endpoint, port=self.admin_port, token=self.token, tls_cert_file=self.tls[0],
                                 tls_key_file=self.tls[1]).start()
        return self

    def stop(self) -> None:
        assert self.endpoint and self.admin
        self.admin.stop()
        self.endpoint.stop()

    def messages(self, partitions: int = 4) -> list[Any]:
        assert self.endpoint
        return [m for p in range(partitions) for m in self.endpoint.messages(partition_topic(TOPIC, p))]

    def config(self, **overrides: Any) -> dict[str, Any]:
        assert self.endpoint and self.admin
        return {"service_url": self.endpoint.service_url, "admin_url": self.admin.url, "operation_timeout_s": 5,
                **overrides}
