"""A loopback HTTP server standing in for a broker's admin REST API in tests (the harness, not product code)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[str, str], tuple[int, dict[str, str], bytes]]


class AdminServer:
    """A loopback HTTP server standing in for one broker's admin API: records every request it receives (method,
    path, Authorization) and answers with `answer(method, path)`. `kill_after(n, pgid)` makes it SIGKILL a process
    group right after it has sent its answer to the n-th call from then on: the caller dies with the broker's
    answer on the wire, as a host lost at that instant would."""

    def __init__(self, answer: Answer, after_answer: Callable[[str, str], None] | None = None) -> None:
        server_self, self.requests = self, []
        # Called with (method, path) once an answer is on the wire: where a fault test strikes something else (the
        # metadata store's leader) at the instant the caller reads the answer.
        self.after_answer = after_answer
        self.answered: list[tuple[str, str]] = []  # since the last kill_after
        self.killed_after: tuple[str, str] | None = None
        self._kill: tuple[int, int] | None = None
        self._lost = False  # the killed caller's later calls are dropped unanswered and unapplied
        self._lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                server_self.requests.append((self.command, self.path, self.headers.get("Authorization")))
                last = server_self._admit(self.command, self.path)
                if last is None:
                    # The caller was lost right after an earlier answer: nothing it sent since reaches the broker,
                    # however fast it sent it before the kill landed.
                    self.close_connection = True
                    return
                status, headers, body = answer(self.command, self.path)
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
                if server_self.after_answer is not None:
                    server_self.after_answer(self.command, self.path)
                if last:
                    server_self._kill_now()

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def kill_after(self, calls: int, pgid: int) -> None:
        with self._lock:
            self.answered, self.killed_after, self._kill, self._lost = [], None, (calls, pgid), False

    def _admit(self, method: str, path: str) -> bool | None:
        """Whether to answer this call (None: its caller is being killed), and whether it is the last one: the
        n-th call since `kill_after` is counted before it is answered, so that a call its caller makes in the
        instant between that answer and the kill is never applied."""
        with self._lock:
            if self._lost:
                return None
            self.answered.append((method, path))
            if self._kill is not None and len(self.answered) == self._kill[0]:
                self._lost, self.killed_after = True, (method, path)
                return True
            return False

    def _kill_now(self) -> None:
        with self._lock:
            pgid, self._kill = self._kill[1] if self._kill else None, None
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def pulsar_like_answers(zk: Any, managed_ledgers_root: str = "/managed-ledgers", first_new_ledger: int = 1000,
                        stats: dict[str, Any] | None = None) -> Answer:
    """Answers as a broker that owns every topic and does to the metadata what Pulsar does, so that a fold-in has
    something true to read: the first call on a topic loads it (a new ledger appended to its managed ledger,
    `ManagedLedgerImpl.initializeBookKeeper`); a subscription delete removes the cursor's znode before answering
    (`PersistentSubscription.delete` -> `MetaStoreImpl.asyncRemoveCursor`); a trim drops every ledger but the one
    being written (nothing retained, nothing unconsumed: `ManagedLedgerImpl.internalTrimLedgers`). Subscriptions
    are idle in the stats."""
    from urllib.parse import unquote

    from sweeper.codecs import pulsar as codec

    loaded: set[str] = set()
    next_ledger = [first_new_ledger]
    lock = threading.Lock()

    def rewrite(ml_path: str, change: Callable[[Any], None]) -> None:
        data, stat = zk.get(ml_path)
        info = codec.decode_managed_ledger_info(data)
        change(info)
        zk.set(ml_path, codec.encode_managed_ledger_info(info), version=stat.version)

    def load(info: Any) -> None:
        ledger = info.ledgerInfo.add()
        ledger.ledgerId, ledger.timestamp = next_ledger[0], 1
        next_ledger[0] += 1

    def trim(info: Any) -> None:
        keep = info.ledgerInfo[-1]
        kept = type(keep)()
        kept.CopyFrom(keep)
        del info.ledgerInfo[:]
        info.ledgerInfo.add().CopyFrom(kept)

    def answer(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        parts = path.split("?", 1)[0].split("/")  # /admin/v2/persistent/<tenant>/<ns>/<topic>/<what>[/<sub>]
        tenant, namespace, local = parts[4], parts[5], unquote(parts[6])
        ml_path = f"{managed_ledgers_root}/{tenant}/{namespace}/persistent/{local}"
        with lock:
            if ml_path not in loaded and zk.exists(ml_path):
                rewrite(ml_path, load)
                loaded.add(ml_path)
            if method == "GET" and parts[7] == "stats":
                subscriptions = stats or {"idle-sub": {"consumers": []}}
                return 200, {}, json.dumps({"subscriptions": subscriptions}).encode()
            if method == "DELETE" and parts[7] == "subscription":
                cursor = f"{ml_path}/{unquote(parts[8])}"
                if not zk.exists(cursor):
                    return 404, {}, b'{"reason": "Subscription not found"}'
                zk.delete(cursor)
                return 204, {}, b""
            if method == "POST" and parts[7] == "trim":
                rewrite(ml_path, trim)
                return 204, {}, b""
        return 404, {}, b'{"reason": "no such endpoint here"}'

    return answer
