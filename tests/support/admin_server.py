"""A loopback HTTP server standing in for a broker's admin REST API in tests (the harness, not product code)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[str, str], tuple[int, dict[str, str], bytes]]


class AdminServer:
    """A loopback HTTP server standing in for one broker's admin API: records every request it receives (method,
    path, Authorization) and answers with `answer(method, path)`."""

    def __init__(self, answer: Answer) -> None:
        server_self, self.requests = self, []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                server_self.requests.append((self.command, self.path, self.headers.get("Authorization")))
                status, headers, body = answer(self.command, self.path)
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
