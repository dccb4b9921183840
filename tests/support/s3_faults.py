"""A fault-injecting HTTP proxy in front of the test S3 endpoint (moto's server), like toxiproxy.

boto3 talks real HTTP to it and it forwards every request unchanged, except DeleteObjects: keys
listed in `faults` are answered with a per-key <Error> (S3's partial failure: 200 OK, some keys
refused) and are not deleted; the other keys are deleted by the upstream as usual. moto itself
never returns per-key errors, so this is how the tests meet them. Listings of the prefixes in
`list_faults` are refused (403), as a bucket policy denying part of a bucket would. The next
`lose_delete_answers` DeleteObjects requests are forwarded, so the upstream deletes their keys, and then
answered 500 InternalError, as S3 behind a failing front end or a cut connection leaves a client that cannot
know whether its delete was applied (boto3 retries a 500: each retry counts as one more request).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit
from xml.etree import ElementTree

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
# Set again for the upstream connection and body.
_HOP_HEADERS = {"host", "content-length", "transfer-encoding"}
# Headers that describe the body boto3 sent: dropped when the body is rewritten (it gets a fresh Content-MD5).
_CHECKSUM_HEADERS = {"content-md5", "x-amz-checksum-crc32", "x-amz-checksum-crc32c", "x-amz-checksum-sha1",
                     "x-amz-checksum-sha256", "x-amz-sdk-checksum-algorithm", "x-amz-content-sha256"}


@dataclass
class KeyFault:
    code: str  # e.g. SlowDown, InternalError, AccessDenied
    times: int = 1_000_000  # how many DeleteObjects requests it fails before the key deletes normally


@dataclass
class S3FaultProxy:
    upstream: str  # http://127.0.0.1:port of the real endpoint
    faults: dict[str, KeyFault] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)  # keys answered with an error, in order
    # ListObjectsV2 requests for these prefixes are answered 403 AccessDenied (a slice of a bucket unlistable).
    list_faults: set[str] = field(default_factory=set)
    lose_delete_answers: int = 0  # DeleteObjects requests to forward, then answer 500 (the upstream deleted)
    lost: list[list[str]] = field(default_factory=list)  # the keys of each such request
    server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> S3FaultProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                body: bytes | None = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                query = parse_qs(urlsplit(self.path).query)
                if self.command == "GET" and "list-type" in query and query.get("prefix", [""])[0] in proxy.list_faults:
                    reply = (b'<?xml version="1.0"?><Error><Code>AccessDenied</Code>'
                             b"<Message>injected: listing refused</Message></Error>")
                    self.send_response(403)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
                extra = b""
                deleting = self.command == "POST" and urlsplit(self.path).query.split("&")[0] in ("delete", "delete=")
                if deleting:
                    body, extra = proxy._split_delete(body)
                    headers = {k: v for k, v in headers.items() if k.lower() not in _CHECKSUM_HEADERS}
                    if body is not None:
                        headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
                if extra and body is None:  # every key faulted: answer without asking upstream
                    status, reply_headers = 200, [("Content-Type", "application/xml")]
                    reply = f'<?xml version="1.0"?><DeleteResult xmlns="{S3_NS}"></DeleteResult>'.encode()
                else:
                    status, reply_headers, reply = proxy._send(self.command, self.path, body or b"", headers)
                    if deleting and not extra and body is not None and proxy._lose_this_answer(body, status):
                        status, reply_headers = 500, [("Content-Type", "application/xml")]
                        reply = (b'<?xml version="1.0"?><Error><Code>InternalError</Code>'
                                 b"<Message>injected: the delete was applied, its answer lost</Message></Error>")
                if extra:
                    reply = reply.replace(b"</DeleteResult>", extra + b"</DeleteResult>")
                self.send_response(status)
                for name, value in reply_headers:
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                # A HEAD answer has no body but tells the object's size, as S3's does.
                upstream_length = next((v for n, v in reply_headers if n.lower() == "content-length"), None)
                self.send_header("Content-Length", upstream_length if self.command == "HEAD" and upstream_length
                                 else str(len(reply)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(reply)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def _send(self, method: str, path: str, body: bytes, headers: dict[str, str]
              ) -> tuple[int, list[tuple[str, str]], bytes]:
        target = urlsplit(self.upstream)
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        try:
            conn.request(method, path, body=body or None, headers={**headers, "Content-Length": str(len(body))})
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()

    def _lose_this_answer(self, body: bytes, status: int) -> bool:
        """Whether this forwarded DeleteObjects (answered `status` upstream) is one whose answer is lost."""
        if status != 200 or self.lose_delete_answers <= 0:
            return False
        self.lose_delete_answers -= 1
        root = ElementTree.fromstring(body)
        self.lost.append([c.text or "" for obj in root if obj.tag.split("}")[-1] == "Object"
                          for c in obj if c.tag.split("}")[-1] == "Key"])
        return True

    def _split_delete(self, body: bytes | None) -> tuple[bytes | None, bytes]:
        """The request without faulted keys (None if none is left), and the <Error> elements to answer them with."""
        root = ElementTree.fromstring(body or b"")
        errors: list[str] = []
        for obj in list(root):
            if obj.tag.split("}")[-1] != "Object":
                continue
            key = next(c.text or "" for c in obj if c.tag.split("}")[-1] == "Key")
            fault = self.faults.get(key)
            if fault is None or fault.times <= 0:
                continue
            fault.times -= 1
            self.refused.append(key)
            root.remove(obj)
            errors.append(f"<Error><Key>{key}</Key><Code>{fault.code}</Code>"
                          f"<Message>injected {fault.code}</Message></Error>")
        if not any(obj.tag.split("}")[-1] == "Object" for obj in root):
            return None, "".join(errors).encode()
        ElementTree.register_namespace("", S3_NS)
        return ElementTree.tostring(root), "".join(errors).encode()
