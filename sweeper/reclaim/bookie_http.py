"""The bookies' HTTP API, as the reclaim step uses it: paced, time-limited, read-only except `PUT /gc`.

Endpoints (BookKeeper's `HttpRouter`, 4.17): GET /metrics, GET /api/v1/bookie/info, GET /api/v1/bookie/gc_details,
GET /api/v1/bookie/gc/suspend_compaction, GET /api/v1/bookie/state, GET /api/v1/config/server_config, GET and PUT
/api/v1/bookie/gc. Nothing else is ever called: a GC is the only thing this tool asks a bookie to do (never
/api/v1/bookie/sanity, which writes and deletes a ledger). No redirect is followed (a bookie never sends one).

A bookie is one of many and never the run's problem: every call has a deadline for the whole answer (a bookie that
drips its answer a byte at a time is cut off, not only one that stops), a cap on its size, and any failure of the
transport or the HTTP framing (`http.client`'s BadStatusLine, IncompleteRead, LineTooLong are not OSErrors) is that
bookie's `BookieUnreachable`. The registration always names the HTTP endpoint's protocol "http", even with
`httpServerTlsEnable` (BookKeeper's `HttpService.publishInfo`): `[reclaim] http_scheme = "https"` reaches
registered bookies over HTTPS.
"""

from __future__ import annotations

import http.client
import ssl
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sweeper.config import ReclaimConfig
from sweeper.ratelimit import TokenBucket
from sweeper.reclaim.discovery import BookieTarget
from sweeper.reclaim.errors import BookieAnswerError, BookieUnreachable
from sweeper.reclaim.samples import (
    BookieSample,
    missing_counters,
    parse_gc_details,
    parse_gc_state,
    parse_gc_wait_ms,
    parse_info,
    parse_metrics,
    parse_state,
    parse_suspended,
)

METRICS = "/metrics"
INFO = "/api/v1/bookie/info"
GC = "/api/v1/bookie/gc"
GC_DETAILS = "/api/v1/bookie/gc_details"
SUSPENDED = "/api/v1/bookie/gc/suspend_compaction"
STATE = "/api/v1/bookie/state"
SERVER_CONFIG = "/api/v1/config/server_config"
READ_CHUNK = 64 * 1024


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        return None


class BookieHttp:
    """One client for every bookie of a run: one pacer (`[reclaim] calls_per_second` over all of them)."""

    def __init__(self, cfg: ReclaimConfig, pacer: TokenBucket | None = None) -> None:
        self.cfg = cfg
        self.pacer = pacer or TokenBucket(cfg.calls_per_second, burst=1.0)
        self.token = Path(cfg.auth_token_file).read_text().strip() if cfg.auth_token_file else ""
        context = ssl.create_default_context(cafile=cfg.tls_ca_file or None)
        if not cfg.tls_verify_hostname:
            context.check_hostname = False
        if cfg.tls_cert_file:
            context.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file or None)
        self._opener = urllib.request.build_opener(_NoRedirects(), urllib.request.HTTPSHandler(context=context))
        self.calls = 0

    def call(self, base: str, path: str, method: str = "GET", body: bytes | None = None,
             limit: int | None = None) -> bytes:
        """One call, its whole answer within `[reclaim] timeout_s` and at most `limit` bytes (`max_body_bytes`)."""
        self.pacer.acquire(1)
        self.calls += 1
        limit = limit or self.cfg.max_body_bytes
        request = urllib.request.Request(base.rstrip("/") + path, data=body, method=method)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header(self.cfg.auth_header, f"Bearer {self.token}")
        deadline = time.monotonic() + self.cfg.timeout_s
        try:
            with self._opener.open(request, timeout=self.cfg.timeout_s) as response:
                return _read_within(response, limit, deadline, f"{method} {path}")
        except urllib.error.HTTPError as exc:
            raise BookieUnreachable(f"{method} {path} answered HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            # HTTPException: a malformed status line, a truncated body, a header too long: the answer is unusable.
            reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
            raise BookieUnreachable(f"{method} {path}: {reason}") from exc

    def sample(self, target: BookieTarget, with_config: bool = False) -> BookieSample:
        """The bookie's counters, free space, state and GC state now; `error` says why not. Never raises: whatever
        one bookie answers (or fails to) is that bookie's sample. `with_config` also reads its gcWaitTime."""
        sample = BookieSample(target.bookie_id, datetime.now(UTC), url=target.url, found_by=target.found_by,
                              readonly=target.readonly)
        if not target.reachable:
            return sample.failed(target.why)
        try:
            return self._sample(target, sample, with_config)
        except (BookieUnreachable, BookieAnswerError) as exc:
            return sample.failed(f"{target.url}: {exc}")
        except Exception as exc:  # anything else a bookie's answer provokes: this bookie unmeasured, never the run
            return sample.failed(f"{target.url}: unreadable answer ({type(exc).__name__}: {exc})")

    def _sample(self, target: BookieTarget, sample: BookieSample, with_config: bool) -> BookieSample:
        parsed = parse_metrics(self.call(target.url, METRICS).decode("utf-8", "replace"))
        missing = missing_counters(parsed)
        if "RECLAIMED_DELETION_SPACE_BYTES" in missing or "RECLAIMED_COMPACTION_SPACE_BYTES" in missing:
            return sample.failed("its /metrics has no RECLAIMED_*_SPACE_BYTES counters: set statsProviderClass="
                                 "org.apache.bookkeeper.stats.prometheus.PrometheusMetricsProvider on the bookie")
        free, total = parse_info(self.call(target.url, INFO))
        compacting = parse_gc_details(self.call(target.url, GC_DETAILS))
        in_force_gc = parse_gc_state(self.call(target.url, GC))
        major_suspended, minor_suspended = parse_suspended(self.call(target.url, SUSPENDED))
        notes = [f"no {name}" for name in missing]
        readonly = target.readonly
        try:
            readonly = parse_state(self.call(target.url, STATE)) or readonly
        except (BookieUnreachable, BookieAnswerError) as exc:  # older bookies: the registration's word stands
            notes.append(f"state unread ({exc})")
        gc_wait_ms = None
        if with_config:
            try:
                gc_wait_ms = parse_gc_wait_ms(self.call(target.url, SERVER_CONFIG))
            except (BookieUnreachable, BookieAnswerError) as exc:
                notes.append(f"gcWaitTime unread ({exc})")
        return BookieSample(
            target.bookie_id, datetime.now(UTC), url=target.url, found_by=target.found_by, readonly=readonly,
            deletion_bytes=parsed.get("deletion_bytes"), compaction_bytes=parsed.get("compaction_bytes"),
            active_log_bytes=parsed.get("active_log_bytes"), deleted_ledgers=parsed.get("deleted_ledgers"),
            major_compactions=parsed.get("major_compactions"), minor_compactions=parsed.get("minor_compactions"),
            ledger_dirs=int(parsed.get("ledger_dirs", 0)), free_bytes=free, total_bytes=total,
            in_force_gc=in_force_gc, compacting=compacting, major_suspended=major_suspended,
            minor_suspended=minor_suspended, notes=tuple(notes), started_at_s=parsed.get("started_at_s"),
            gc_wait_ms=gc_wait_ms)

    def trigger_gc(self, target: BookieTarget, body: str) -> None:
        """PUT /api/v1/bookie/gc with `body` exactly as planned (decide.GcPlan.body: it decides what the bookie's own
        protection still governs)."""
        self.call(target.url, GC, "PUT", body.encode())

    def in_force_gc(self, target: BookieTarget) -> bool:
        return parse_gc_state(self.call(target.url, GC))

    def busy(self, target: BookieTarget) -> bool:
        """A forced GC or a compaction still runs. The force flag drops when the forced run ends, compaction
        included (`GarbageCollectorThread.runWithFlags`' finally); gc_details also covers the collector's own runs."""
        return self.in_force_gc(target) or parse_gc_details(self.call(target.url, GC_DETAILS))


def _read_within(response: Any, limit: int, deadline: float, what: str) -> bytes:
    """The answer's body, refused when longer than `limit` or not all in before `deadline` (each read may wait up to
    the socket timeout; a bookie that drips bytes would otherwise hold the run forever)."""
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BookieUnreachable(f"{what} answered {int(declared):,} bytes, more than [reclaim] max_body_bytes "
                                f"({limit:,})")
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise BookieUnreachable(f"{what}: the answer was not complete within [reclaim] timeout_s")
        # read1: one read of the socket at most (read(n) would block until n bytes came, one slow byte at a time)
        chunk = response.read1(READ_CHUNK)
        if not chunk:
            if declared is not None and declared.isdigit() and size < int(declared):
                raise BookieUnreachable(f"{what}: the answer was cut off ({size:,} of {int(declared):,} bytes)")
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise BookieUnreachable(f"{what} answered more than [reclaim] max_body_bytes ({limit:,} bytes)")
        chunks.append(chunk)
