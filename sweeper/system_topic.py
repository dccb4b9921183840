"""Reaching PIP-186's pending-delete topic: client options from config, the admin API, routing.

Everything here runs against a real broker in production and against the local endpoint
(`sweeper.sandbox.pulsar_endpoint`) in tests and the sandbox. Secrets (the auth token) are read from a
file or an environment variable at the last moment and never appear in a repr, a log or a table.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeper.config import SystemTopicConfig


class SystemTopicError(RuntimeError):
    """The broker or its admin API cannot be used as configured: unreachable, refusing, or mismatched."""


@dataclass(frozen=True)
class Secret:
    """A value that must not be printed: repr and str show only that it is set."""

    value: str = field(repr=False)

    def __str__(self) -> str:
        return "***"


@dataclass(frozen=True)
class BrokerSettings:
    """What a Spark task needs to open its own client: small, picklable, secret-safe in logs."""

    service_url: str
    token: Secret | None
    tls_trust_certs_file: str
    tls_allow_insecure: bool
    tls_validate_hostname: bool
    tls_cert_file: str
    tls_key_file: str
    operation_timeout_s: int

    @classmethod
    def from_config(cls, cfg: SystemTopicConfig) -> BrokerSettings:
        if not cfg.service_url:
            raise SystemTopicError("[system_topic] service_url is not set: there is no broker to talk to")
        return cls(cfg.service_url, read_token(cfg), cfg.tls_trust_certs_file, cfg.tls_allow_insecure,
                   cfg.tls_validate_hostname, cfg.tls_cert_file, cfg.tls_key_file, cfg.operation_timeout_s)


def read_token(cfg: SystemTopicConfig) -> Secret | None:
    if cfg.auth_token_file:
        path = Path(cfg.auth_token_file)
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise SystemTopicError(f"[system_topic] auth_token_file {path} cannot be read: {exc.strerror}") from exc
        if not token:
            raise SystemTopicError(f"[system_topic] auth_token_file {path} is empty")
        return Secret(token)
    if cfg.auth_token_env:
        token = os.environ.get(cfg.auth_token_env, "").strip()
        if not token:
            raise SystemTopicError(f"[system_topic] auth_token_env names ${cfg.auth_token_env}, which is not set")
        return Secret(token)
    return None


def open_client(settings: BrokerSettings) -> Any:
    import pulsar

    kwargs: dict[str, Any] = {
        "operation_timeout_seconds": settings.operation_timeout_s,
        "connection_timeout_ms": min(settings.operation_timeout_s, 10) * 1000,
        "logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    }
    if settings.token is not None:
        kwargs["authentication"] = pulsar.AuthenticationToken(settings.token.value)
    if settings.tls_trust_certs_file:
        kwargs["tls_trust_certs_file_path"] = settings.tls_trust_certs_file
    if settings.service_url.startswith("pulsar+ssl://"):
        kwargs["tls_allow_insecure_connection"] = settings.tls_allow_insecure
        kwargs["tls_validate_hostname"] = settings.tls_validate_hostname
    if settings.tls_cert_file:
        kwargs["tls_certificate_file_path"] = settings.tls_cert_file
        kwargs["tls_private_key_file_path"] = settings.tls_key_file
    return pulsar.Client(settings.service_url, **kwargs)


def partition_topic(topic: str, partition: int) -> str:
    return f"{topic}-partition-{partition}"


def java_string_hash(text: str) -> int:
    """Java's String.hashCode, so our routing agrees with a Java producer's default (JavaStringHash)."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(message_key: str, partitions: int) -> int:
    return (java_string_hash(message_key) & 0x7FFFFFFF) % partitions


class AdminClient:
    """The two admin REST calls we need: read and create a partitioned topic's metadata."""

    def __init__(self, cfg: SystemTopicConfig) -> None:
        if not cfg.admin_url:
            raise SystemTopicError("[system_topic] admin_url is not set")
        self.base = cfg.admin_url.rstrip("/")
        self.token = read_token(cfg)
        self.timeout = cfg.operation_timeout_s
        self.context: ssl.SSLContext | None = None
        if self.base.startswith("https://"):
            self.context = ssl.create_default_context(cafile=cfg.tls_trust_certs_file or None)
            if cfg.tls_allow_insecure:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE
            if cfg.tls_cert_file:
                self.context.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file or None)

    def _url(self, topic: str) -> str:
        if not topic.startswith("persistent://"):
            raise SystemTopicError(f"not a persistent topic: {topic}")
        path = "/".join(urllib.parse.quote(p, safe="") for p in topic.removeprefix("persistent://").split("/"))
        return f"{self.base}/admin/v2/persistent/{path}/partitions"

    def _call(self, method: str, url: str, body: bytes | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(url, data=body, method=method)
        request.add_header("Accept", "application/json")
        if body is not None:
            request.add_header("Content-Type", "application/json")
        if self.token is not None:
            request.add_header("Authorization", f"Bearer {self.token.value}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise SystemTopicError(f"admin API at {self.base} refused our credentials (HTTP {exc.code}): "
                                       "check [system_topic] auth_token_file / auth_token_env") from exc
            return exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise SystemTopicError(f"admin API at {self.base} unreachable: {reason}") from exc

    def partitions(self, topic: str) -> int:
        """Partition count; 0 for a topic that is missing or not partitioned."""
        status, body = self._call("GET", self._url(topic))
        if status == 404:
            return 0
        if status != 200:
            raise SystemTopicError(f"admin API: reading {topic} partitions answered HTTP {status}: {body[:200]!r}")
        try:
            return int(json.loads(body)["partitions"])
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemTopicError(f"admin API: unexpected partitions answer {body[:200]!r}") from exc

    def create_partitioned_topic(self, topic: str, partitions: int) -> None:
        status, body = self._call("PUT", self._url(topic), json.dumps(partitions).encode())
        if status not in (200, 204):
            raise SystemTopicError(f"admin API: creating {topic} with {partitions} partitions answered HTTP "
                                   f"{status}: {body[:200]!r}")


def broker_partitions(settings: BrokerSettings, topic: str) -> int:
    """Partition count as the broker reports it to a client (0: not partitioned)."""
    import pulsar

    client = open_client(settings)
    try:
        names = client.get_topic_partitions(topic)
    except pulsar.PulsarException as exc:
        raise SystemTopicError(describe_client_error(exc, settings)) from exc
    finally:
        client.close()
    return 0 if names == [topic] else len(names)


def describe_client_error(exc: BaseException, settings: BrokerSettings) -> str:
    """One line an operator can act on, naming the likely setting and never the credentials."""
    kind, url = type(exc).__name__, settings.service_url
    if kind in ("AuthenticationError", "AuthorizationError"):
        return f"broker {url} refused our credentials ({kind}): check [system_topic] auth settings"
    if kind in ("ConnectError", "Timeout", "ServiceUnitNotReady", "TooManyLookupRequestException"):
        hints = []
        if url.startswith("pulsar+ssl://") and kind == "ConnectError":
            hints.append("a TLS handshake failure also looks like this: check tls_trust_certs_file, "
                         "tls_validate_hostname and the client certificate")
        if settings.token is not None and kind == "Timeout":
            # The C++ client answers a broker's AuthenticationError during CONNECT by dropping the
            # connection and retrying until the operation times out, so a rejected token surfaces here.
            hints.append("a rejected token also looks like this: check auth_token_file / auth_token_env")
        hint = f"; {'; '.join(hints)}" if hints else ""
        return f"broker {url} unreachable or not ready ({kind}: {exc}){hint}"
    return f"broker {url} failed the request ({kind}: {exc})"


def ensure_topic(cfg: SystemTopicConfig, settings: BrokerSettings, create: bool = True) -> int:
    """The topic's partition count, checked against the config; created when missing and allowed."""
    admin = AdminClient(cfg) if cfg.admin_url else None
    count = admin.partitions(cfg.topic) if admin else broker_partitions(settings, cfg.topic)
    if count == 0:
        if not (create and cfg.create_if_missing):
            raise SystemTopicError(f"{cfg.topic} is not a partitioned topic and creating it is not allowed "
                                   f"([system_topic] create_if_missing); create it with `pulsar-admin topics "
                                   f"create-partitioned-topic {cfg.topic} -p {cfg.partitions}`")
        if admin is None:
            raise SystemTopicError(f"{cfg.topic} is not a partitioned topic and [system_topic] admin_url is not "
                                   "set, so it cannot be created")
        admin.create_partitioned_topic(cfg.topic, cfg.partitions)
        return cfg.partitions
    if count != cfg.partitions:
        raise SystemTopicError(f"{cfg.topic} has {count} partitions but [system_topic] partitions = "
                               f"{cfg.partitions}: records would be routed differently from what the consumers "
                               "expect; fix the config or the topic")
    return count
