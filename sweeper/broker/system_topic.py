"""Reaching PIP-186's pending-delete topic: client options from config, the admin API, routing.

Everything here runs against a real broker in production and against the local endpoint
(`harness.sandbox.pulsar_endpoint`) in tests and the sandbox. Secrets (the auth token) are read from a
file or an environment variable at the last moment and never appear in a repr, a log or a table.
"""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper import names
from sweeper.broker.errors import RedirectRefused, SystemTopicError
from sweeper.config import SystemTopicConfig
from sweeper.records import Secret
from sweeper.vocabulary import NOT_SET, SET, UNREAD

log = logging.getLogger(__name__)


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


Origin = tuple[str, str, int]  # scheme, lower-cased host, port: what a redirect may be compared by
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> Origin | None:
    """scheme://host:port of an http(s) URL, with the default port filled in; None for anything else."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port if port is not None else _DEFAULT_PORTS[scheme]


def show_origin(origin: Origin | None, fallback: str) -> str:
    return f"{origin[0]}://{origin[1]}:{origin[2]}" if origin else repr(fallback[:200])


def broker_web_origins(data: bytes) -> set[Origin]:
    """The admin endpoints one broker registration names: `webServiceUrl` / `webServiceUrlTls` in the JSON
    each broker writes under /loadbalance/brokers, `LocalBrokerData` (modular load manager,
    org.apache.pulsar.policies.data.loadbalancer) or `BrokerLookupData` (extensible load manager,
    `BrokerRegistryImpl.LOOKUP_DATA_PATH`). Undecodable data names nobody: an unreadable broker is never trusted."""
    try:
        doc = json.loads(data or b"{}")
    except (ValueError, UnicodeDecodeError):
        return set()
    if not isinstance(doc, dict):
        return set()
    found = set()
    for key in ("webServiceUrl", "webServiceUrlTls"):
        value = doc.get(key)
        origin = origin_of(value) if isinstance(value, str) else None
        if origin is not None:
            found.add(origin)
    return found


def redirect_target(url: str, location: str, allowed: frozenset[Origin], method: str) -> str:
    """Where a 307/308 from `url` may take us: the absolute URL when its scheme, host and port are one of this
    cluster's brokers, else RedirectRefused. The only place a redirect is judged (invariant 14): a broker
    redirects a request for a global namespace owned elsewhere to the owning cluster, and our token must not
    follow it there."""
    target = urllib.parse.urljoin(url, location)
    origin = origin_of(target)
    if origin is None or origin not in allowed:
        raise RedirectRefused(show_origin(origin, target), method, urllib.parse.urlsplit(url).path)
    return target


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # urllib would follow a GET's redirect to any host with every header, Authorization included: every
    # redirect comes back to AdminClient._call instead, which judges it with redirect_target.
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


class AdminClient:
    """The one admin REST client: a partitioned topic's metadata, and the retention repair's topic calls.

    A redirect is followed only to `admin_url` itself or to a broker `allow_brokers` was given (read once per
    run from this cluster's /loadbalance/brokers), whatever the call.
    """

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
        self._opener = urllib.request.build_opener(_NoRedirects(), urllib.request.HTTPSHandler(context=self.context))
        base = origin_of(self.base)
        self.allowed: frozenset[Origin] = frozenset({base} if base else ())

    def allow_brokers(self, origins: set[Origin] | frozenset[Origin]) -> None:
        """This cluster's registered brokers, which redirects may lead to besides `admin_url`."""
        self.allowed = self.allowed | frozenset(origins)

    def _url(self, topic: str) -> str:
        if not topic.startswith("persistent://"):
            raise SystemTopicError(f"not a persistent topic: {topic}")
        path = "/".join(urllib.parse.quote(p, safe="") for p in topic.removeprefix("persistent://").split("/"))
        return f"{self.base}/admin/v2/persistent/{path}/partitions"

    def _call(self, method: str, url: str, body: bytes | None = None, hops: int = 3) -> tuple[int, bytes]:
        """One admin call; a 307/308 (a broker sending us to the one that owns the topic) is followed for every
        method, through redirect_target, so a refused target receives no request at all."""
        for _ in range(hops):
            request = urllib.request.Request(url, data=body, method=method)
            request.add_header("Accept", "application/json")
            if body:
                request.add_header("Content-Type", "application/json")
            if self.token is not None:
                request.add_header("Authorization", f"Bearer {self.token.value}")
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    return response.status, response.read()
            except urllib.error.HTTPError as exc:
                location = exc.headers.get("Location") if exc.code in (307, 308) else None
                if location:
                    url = redirect_target(url, location, self.allowed, method)
                    continue
                if exc.code in (401, 403):
                    raise SystemTopicError(f"admin API at {self.base} refused our credentials (HTTP {exc.code}): "
                                           "check [system_topic] auth_token_file / auth_token_env") from exc
                return exc.code, exc.read()
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise SystemTopicError(f"admin API at {self.base} unreachable: {reason}") from exc
        raise SystemTopicError(f"admin API: more than {hops} redirects for {method} {url}")

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

    def deduplication(self, topic: str) -> bool | None:
        """Whether the broker deduplicates what producers send to `topic` (the policy it applies: topic, namespace
        or broker default; PersistentTopics.getDeduplication with `applied`), None when it does not say (topic-level
        policies off: 405; an older broker: 404)."""
        status, body = self._call("GET", self._url(topic).removesuffix("/partitions") + "/deduplicationEnabled"
                                  "?applied=true")
        if status != 200:
            return None
        text = body.strip().lower()
        return True if text == b"true" else False if text == b"false" else None

    def enable_deduplication(self, topic: str) -> None:
        """The topic-level policy `deduplicationEnabled = true` (PersistentTopics.setDeduplication)."""
        status, body = self._call("POST", self._url(topic).removesuffix("/partitions") + "/deduplicationEnabled",
                                  b"true")
        if status not in (200, 204):
            raise SystemTopicError(f"admin API: enabling deduplication on {topic} answered HTTP {status}: "
                                   f"{body[:200]!r}")


    # ---- the retention repair's calls (topics, subscriptions), through the same redirect rule ----

    def topic_url(self, topic_name: str, suffix: str = "") -> str:
        parts = names.parse_topic(topic_name)
        if parts is None:
            raise SystemTopicError(f"not a persistent topic name: {topic_name!r}")
        # The topic path parameter is @Encoded: Pulsar decodes it once itself (Codec.decode).
        local = urllib.parse.quote(parts.local, safe="")
        version = "v2/" if "/" not in parts.namespace else ""  # old cluster-scoped names: the v1 API
        return f"{self.base}/admin/{version}persistent/{parts.tenant}/{parts.namespace}/{local}{suffix}"

    def call(self, method: str, url: str) -> tuple[int, bytes]:
        """One admin call through the base client, whose redirect rule keeps it (and our token) in this cluster."""
        return self._call(method, url, b"" if method in ("POST", "PUT") else None)

    def topic_policy(self, topic_name: str) -> tuple[str, str]:
        """Whether the topic sets its own retention or TTL, locally or globally (the raw topic-level values,
        `applied=false`): not_set | set | unread.

        `GET .../retention` and `.../messageTTL` (admin v2 `PersistentTopics`) answer the stored
        `TopicPolicies` value, or 204 when none is set; a broker with topicLevelPoliciesEnabled=false answers
        405. Local and global topic policies are separate records (`isGlobal`), and the broker applies either,
        so both are asked. Topic policies belong to the partitioned topic, not its partitions. Call this only
        for topics whose bundle a live broker owns: the ownership check behind it would otherwise make a
        broker acquire the bundle.
        """
        base = re.sub(r"-partition-\d+$", "", topic_name)
        for suffix in ("/retention", "/messageTTL"):
            for scope in ("false", "true"):
                status, body = self.call("GET", self.topic_url(base, f"{suffix}?isGlobal={scope}"))
                text = body.strip()
                if status == 204 or (status == 200 and text in (b"", b"null")):
                    continue
                where = "global" if scope == "true" else "local"
                if status == 200:
                    shown = text[:120].decode("utf-8", "replace")
                    return SET, f"{base} sets its own {where} {suffix[1:]} ({shown}): not evaluated"
                return UNREAD, f"reading {base}'s {where} topic-level {suffix[1:]} answered HTTP {status}"
        return NOT_SET, "the broker says the topic sets no retention or TTL of its own"

    def trim(self, topic_name: str) -> tuple[int, bytes]:
        return self.call("POST", self.topic_url(topic_name, "/trim"))

    def internal_stats(self, topic_name: str) -> tuple[int, bytes]:
        return self.call("GET", self.topic_url(topic_name, "/internalStats"))

    def stats(self, topic_name: str) -> tuple[int, bytes]:
        return self.call("GET", self.topic_url(topic_name, "/stats"))

    def delete_subscription(self, topic_name: str, subscription: str) -> tuple[int, bytes]:
        # The subscription parameter is decoded by the server and then again by Pulsar (Codec.decode).
        sub = urllib.parse.quote(names.encode_local_name(subscription), safe="")
        return self.call("DELETE", self.topic_url(topic_name, f"/subscription/{sub}"))


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
        count = cfg.partitions
    elif count != cfg.partitions:
        raise SystemTopicError(f"{cfg.topic} has {count} partitions but [system_topic] partitions = "
                               f"{cfg.partitions}: records would be routed differently from what the consumers "
                               "expect; fix the config or the topic")
    if admin is not None and create:
        _deduplicated(cfg, admin)
    return count


def _deduplicated(cfg: SystemTopicConfig, admin: AdminClient) -> None:
    """The emit keeps every record once across a retried producer, a killed emit and a broker restart only where the
    broker drops what a producer sends again under its name and sequence ids (MessageDeduplication), which Pulsar
    leaves off unless a broker, namespace or topic turns it on. Turned on for the topic where creating it is allowed;
    otherwise, or where the broker cannot say, a warning: a resent record is then on the topic twice (harmless to a
    consumer, which re-verifies each, but `emitted` and the topic no longer agree one to one)."""
    try:
        enabled = admin.deduplication(cfg.topic)
        if enabled is False and cfg.create_if_missing:
            admin.enable_deduplication(cfg.topic)
            enabled = admin.deduplication(cfg.topic)
    except SystemTopicError as exc:
        log.warning("emit: deduplication of %s could not be read or set: %s", cfg.topic, exc)
        return
    if not enabled:
        log.warning("emit: the broker does not deduplicate %s (%s): a producer sending again after a broker restart "
                    "may put a record on it twice; `pulsar-admin topics enable-deduplication %s`", cfg.topic,
                    "off" if enabled is False else "cannot tell", cfg.topic)
