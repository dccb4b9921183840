"""The bookies' HTTP API, as the reclaim step uses it: paced, time-limited, read-only except `PUT /gc`.

Endpoints (BookKeeper's `HttpRouter`, 4.17): GET /metrics, GET /api/v1/bookie/info, GET /api/v1/bookie/gc_details,
GET /api/v1/bookie/gc/suspend_compaction, GET and PUT /api/v1/bookie/gc. Nothing else is ever called: a GC is the
only thing this tool asks a bookie to do. No redirect is followed (a bookie never sends one).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sweeper.config import ReclaimConfig
from sweeper.ratelimit import TokenBucket
from sweeper.reclaim.discovery import BookieTarget
from sweeper.reclaim.samples import (
    BookieAnswerError,
    BookieSample,
    missing_counters,
    parse_gc_details,
    parse_gc_state,
    parse_info,
    parse_metrics,
    parse_suspended,
)

METRICS = "/metrics"
INFO = "/api/v1/bookie/info"
GC = "/api/v1/bookie/gc"
GC_DETAILS = "/api/v1/bookie/gc_details"
SUSPENDED = "/api/v1/bookie/gc/suspend_compaction"


class BookieUnreachable(RuntimeError):
    """No answer, or an HTTP error: the bookie is not measured (never a failed run)."""


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

    def call(self, base: str, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> bytes:
        self.pacer.acquire(1)
        self.calls += 1
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(base.rstrip("/") + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header(self.cfg.auth_header, f"Bearer {self.token}")
        try:
            with self._opener.open(request, timeout=self.cfg.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            raise BookieUnreachable(f"{method} {path} answered HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise BookieUnreachable(f"{method} {path}: {getattr(exc, 'reason', exc)}") from exc

    def sample(self, target: BookieTarget) -> BookieSample:
        """The bookie's counters, free space and GC state now; `error` says why not."""
        sample = BookieSample(target.bookie_id, datetime.now(UTC), url=target.url, found_by=target.found_by,
                              readonly=target.readonly)
        if not target.reachable:
            return sample.failed(target.why)
        try:
            parsed = parse_metrics(self.call(target.url, METRICS).decode("utf-8", "replace"))
            missing = missing_counters(parsed)
            if "RECLAIMED_DELETION_SPACE_BYTES" in missing or "RECLAIMED_COMPACTION_SPACE_BYTES" in missing:
                return sample.failed("its /metrics has no RECLAIMED_*_SPACE_BYTES counters: set statsProviderClass="
                                     "org.apache.bookkeeper.stats.prometheus.PrometheusMetricsProvider on the bookie")
            free, total = parse_info(self.call(target.url, INFO))
            compacting = parse_gc_details(self.call(target.url, GC_DETAILS))
            in_force_gc = parse_gc_state(self.call(target.url, GC))
            major_suspended, minor_suspended = parse_suspended(self.call(target.url, SUSPENDED))
        except (BookieUnreachable, BookieAnswerError) as exc:
            return sample.failed(f"{target.url}: {exc}")
        notes = tuple(f"no {name}" for name in missing)
        return BookieSample(
            target.bookie_id, datetime.now(UTC), url=target.url, found_by=target.found_by, readonly=target.readonly,
            deletion_bytes=parsed.get("deletion_bytes"), compaction_bytes=parsed.get("compaction_bytes"),
            active_log_bytes=parsed.get("active_log_bytes"), deleted_ledgers=parsed.get("deleted_ledgers"),
            major_compactions=parsed.get("major_compactions"), minor_compactions=parsed.get("minor_compactions"),
            ledger_dirs=int(parsed.get("ledger_dirs", 0)), free_bytes=free, total_bytes=total,
            in_force_gc=in_force_gc, compacting=compacting, major_suspended=major_suspended,
            minor_suspended=minor_suspended, notes=notes)

    def trigger_gc(self, target: BookieTarget, force_major: bool, force_minor: bool) -> None:
        # Both keys always: TriggerGCService defaults a missing one to true (unless that compaction is suspended).
        self.call(target.url, GC, "PUT", {"forceMajor": force_major, "forceMinor": force_minor})

    def in_force_gc(self, target: BookieTarget) -> bool:
        return parse_gc_state(self.call(target.url, GC))

    def busy(self, target: BookieTarget) -> bool:
        """A forced GC or a compaction still runs. The force flag drops when the forced run ends, compaction
        included (`GarbageCollectorThread.runWithFlags`' finally); gc_details also covers the collector's own runs."""
        return self.in_force_gc(target) or parse_gc_details(self.call(target.url, GC_DETAILS))
