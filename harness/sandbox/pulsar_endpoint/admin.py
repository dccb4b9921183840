"""The sliver of Pulsar's admin REST API the sweeper uses, served for the local endpoint.

GET and PUT `/admin/v2/persistent/<tenant>/<namespace>/<topic>/partitions`, with an optional
bearer token and TLS so the tests can exercise the client's settings. Tests and the sandbox only.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .server import PulsarEndpoint, server_tls_context

_PREFIX = "/admin/v2/persistent/"
_SUFFIX = "/partitions"


class AdminServer:
    def __init__(self, endpoint: PulsarEndpoint, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, tls_cert_file: str | None = None, tls_key_file: str | None = None) -> None:
        self.endpoint = endpoint
        self.token = token
        self.tls = bool(tls_cert_file)
        admin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _topic(self) -> str | None:
                path = urllib.parse.urlparse(self.path).path
                if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
                    return None
                parts = [urllib.parse.unquote(p) for p in path[len(_PREFIX):-len(_SUFFIX)].split("/")]
                return "persistent://" + "/".join(parts) if len(parts) == 3 else None

            def _reply(self, status: int, body: Any = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                if admin.token is None or self.headers.get("Authorization") == f"Bearer {admin.token}":
                    return True
                self._reply(401, {"reason": "Authentication required"})
                return False

            def do_GET(self) -> None:
                topic = self._topic()
                if topic is None:
                    self._reply(404, {"reason": "not found"})
                elif self._authorized():
                    self._reply(200, {"partitions": admin.endpoint.partitions(topic)})

            def do_PUT(self) -> None:
                topic = self._topic()
                if topic is None:
                    self._reply(404, {"reason": "not found"})
                    return
                if not self._authorized():
                    return
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    count = int(json.loads(self.rfile.read(length) or b"0"))
                except ValueError:
                    self._reply(400, {"reason": "body must be the partition count"})
                    return
                if count < 1:
                    self._reply(412, {"reason": "partition count must be positive"})
                elif admin.endpoint.partitions(topic):
                    self._reply(409, {"reason": "Partitioned topic already exists"})
                else:
                    admin.endpoint.create_partitioned_topic(topic, count)
                    self._reply(204)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        if tls_cert_file:
            context = server_tls_context(tls_cert_file, tls_key_file)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def start(self) -> AdminServer:
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="pulsar-admin", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> AdminServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
