"""Where each bookie's HTTP server is, from the registrations BookKeeper keeps in the metadata store.

A bookie registers under `<ledgers root>/available/<bookie id>` (writable) or `.../available/readonly/<bookie id>`,
on ZooKeeper and Oxia alike, with a `BookieServiceInfoFormat` (BookKeeper's DataFormats.proto; written by
`ZKRegistrationManager.serializeBookieServiceInfo`, and by Pulsar's `BookieServiceInfoSerde` on Oxia). Its endpoint
`httpserver` (published by BookKeeper's `HttpService.publishInfo` when `httpServerEnabled`) carries the HTTP server's
`httpServerHost`, which is 0.0.0.0 unless set: the host of the `bookie` endpoint (or of the bookie id) then. The
`[reclaim] http_urls` entries override or complete this (a legacy registration has no service info; a proxy).
Pure functions, plus `read_registrations` over a kazoo-shaped client (kazoo or sweeper.metastore.oxia.OxiaStore).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from sweeper._proto.bookkeeper_metadata_pb2 import BookieServiceInfoFormat

WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")
READONLY = "readonly"

FOUND_IN_REGISTRATION = "registration"
FOUND_VIA_BOOKIE_HOST = "registration, 0.0.0.0 -> bookie host"
FOUND_IN_CONFIG = "config"
FOUND_BY_PORT = "http_port"


@dataclass(frozen=True)
class Registration:
    bookie_id: str
    readonly: bool
    endpoints: tuple[tuple[str, str, int, str], ...]  # (id, host, port, protocol)
    error: str = ""  # service info we could not decode (kept, never guessed from)

    def endpoint(self, endpoint_id: str) -> tuple[str, str, int, str] | None:
        return next((e for e in self.endpoints if e[0] == endpoint_id), None)


@dataclass(frozen=True)
class BookieTarget:
    bookie_id: str
    url: str  # base URL of its HTTP server; "" when none was found
    found_by: str  # which path found it (FOUND_*), "" when none
    registered: bool
    readonly: bool
    why: str = ""  # why there is no URL

    @property
    def reachable(self) -> bool:
        return bool(self.url)


def decode_registration(bookie_id: str, data: bytes | None, readonly: bool) -> Registration:
    """A registration's value. Empty (bookies before BookKeeper 4.11 wrote none): no endpoints."""
    if not data:
        return Registration(bookie_id, readonly, ())
    info = BookieServiceInfoFormat()
    try:
        info.ParseFromString(bytes(data))
    except DecodeError as exc:
        return Registration(bookie_id, readonly, (), error=f"service info is not a BookieServiceInfoFormat: {exc}")
    return Registration(bookie_id, readonly, tuple((e.id, e.host, e.port, e.protocol) for e in info.endpoints))


def bookie_host(bookie_id: str, registration: Registration | None) -> str:
    """The host the bookie is reached at: its `bookie` endpoint's, else the host of a `host:port` bookie id."""
    if registration is not None:
        rpc = registration.endpoint("bookie")
        if rpc is not None and rpc[1] not in WILDCARD_HOSTS:
            return rpc[1]
    host, sep, port = bookie_id.rpartition(":")
    return host if sep and port.isdigit() and host else ""


def _url(scheme: str, host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{scheme}://{shown}:{port}"


def parse_overrides(entries: tuple[str, ...]) -> dict[str, str]:
    """`[reclaim] http_urls`: "<bookie id>=<url>" (config validation already checked the shape)."""
    out: dict[str, str] = {}
    for entry in entries:
        bookie, _, url = entry.partition("=")
        out[bookie.strip()] = url.strip().rstrip("/")
    return out


def locate(bookie_id: str, registration: Registration | None, overrides: dict[str, str], http_port: int = 0,
           http_scheme: str = "http") -> BookieTarget:
    """The HTTP base URL of one bookie, and which path found it."""
    registered = registration is not None
    readonly = bool(registration and registration.readonly)
    if bookie_id in overrides:
        return BookieTarget(bookie_id, overrides[bookie_id], FOUND_IN_CONFIG, registered, readonly)
    host = bookie_host(bookie_id, registration)
    if "*" in overrides and host:
        return BookieTarget(bookie_id, overrides["*"].replace("{host}", host), FOUND_IN_CONFIG, registered, readonly)
    http = registration.endpoint("httpserver") if registration is not None else None
    if http is not None:
        _, http_host, port, protocol = http
        # BookKeeper 4.17 registers "http" even when httpServerTlsEnable serves TLS (HttpService.publishInfo): the
        # operator's `[reclaim] http_scheme = "https"` says what the registration cannot.
        scheme = "https" if protocol.lower() == "https" or http_scheme == "https" else "http"
        if http_host not in WILDCARD_HOSTS:
            return BookieTarget(bookie_id, _url(scheme, http_host, port), FOUND_IN_REGISTRATION, registered, readonly)
        if host:
            return BookieTarget(bookie_id, _url(scheme, host, port), FOUND_VIA_BOOKIE_HOST, registered, readonly)
        return BookieTarget(bookie_id, "", "", registered, readonly,
                            why="its httpserver endpoint listens on 0.0.0.0 and no bookie host is known: name it "
                                "in [reclaim] http_urls")
    if http_port and host:
        return BookieTarget(bookie_id, _url(http_scheme, host, http_port), FOUND_BY_PORT, registered, readonly)
    if not registered:
        why = "not registered now (down, or decommissioned): its disk cannot be measured"
    elif registration is not None and registration.error:
        why = f"{registration.error}; name its URL in [reclaim] http_urls"
    else:
        why = ("its registration names no HTTP server (httpServerEnabled=false, or a bookie before 4.11): enable "
               "it, or name its URL in [reclaim] http_urls")
    return BookieTarget(bookie_id, "", "", registered, readonly, why=why)


def read_registrations(client: Any, ledgers_root: str) -> dict[str, Registration]:
    """Every bookie registered now, writable and read-only (a read-only registration wins: it is the newer)."""
    from kazoo.exceptions import NoNodeError

    available = f"{ledgers_root.rstrip('/')}/available"
    out: dict[str, Registration] = {}
    for readonly, parent in ((False, available), (True, f"{available}/{READONLY}")):
        try:
            children = client.get_children(parent)
        except NoNodeError:
            continue
        for child in children:
            if child == READONLY and not readonly:
                continue
            try:
                data, _ = client.get(f"{parent}/{child}")
            except NoNodeError:
                continue  # unregistered while we listed
            out[child] = decode_registration(child, data, readonly)
    return out
