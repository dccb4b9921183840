"""The wire reader's connection to one member (sweeper.zk.wire): the ZooKeeper handshake, new or resumed session,
and on a secured ensemble the TLS session and the login before it (the module doc of sweeper.zk.wire says how).
"""

from __future__ import annotations

import socket
import ssl
import struct
from typing import TYPE_CHECKING

from sweeper.zk.errors import HandshakeRefused, ZooKeeperSecurityError, ZooKeeperUnavailableError
from sweeper.zk.jute import (
    _AUTH_XID,
    _CONNECT_REQUEST,
    _CONNECT_RESPONSE_HEAD,
    _INT,
    _OP_AUTH,
    _OP_SASL,
    _REPLY_HEADER,
    _buffer,
    _code_name,
)

if TYPE_CHECKING:
    from sweeper.zk.security import ZkSecurity


# X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH (OpenSSL x509_vfy.h)
_NAME_MISMATCH = (62, 64)


def _handshake(hosts: str, addresses: list[tuple[str, int]], timeout: float, security: ZkSecurity | None,
               resume: tuple[int, bytes] = (0, bytes(16)), last_zxid: int = 0
               ) -> tuple[socket.socket, float, int, bytes, int, tuple[str, int]]:
    """Socket, negotiated session timeout (s), session id, its password, the last xid used and the (host, port)
    reached, from the first host that completes the handshake (and, with `security`, the TLS session and the login).

    `resume` (session id, password) asks for an existing session, `last_zxid` says the newest zxid seen: a member
    behind it refuses us, as it refuses ZooKeeper's own clients (ZooKeeperServer.processConnectRequest). A session
    the ensemble expired meanwhile is answered with a zero timeout: then a new one is asked for."""
    per_host = timeout / max(1, len(addresses))  # like kazoo: the whole attempt stays within timeout
    context = security.ssl_context() if security is not None and security.tls else None
    errors, refused = [], []
    todo = list(addresses)
    while todo:
        host, port = todo.pop(0)
        try:
            sock = socket.create_connection((host, port), timeout=per_host)
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc}")
            continue
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if context is not None:
                sock = _start_tls(context, sock, host)
            body = _CONNECT_REQUEST.pack(0, last_zxid, int(timeout * 1000), resume[0], 16, resume[1], False)
            try:
                sock.sendall(_INT.pack(len(body)) + body)
                (length,) = _INT.unpack(_recv_exactly(sock, 4))
                response = _recv_exactly(sock, length)
                _, negotiated_ms, session_id = _CONNECT_RESPONSE_HEAD.unpack_from(response)
                (size,) = _INT.unpack_from(response, _CONNECT_RESPONSE_HEAD.size)
                passwd = response[_CONNECT_RESPONSE_HEAD.size + 4 : _CONNECT_RESPONSE_HEAD.size + 4 + max(size, 0)]
            except OSError as exc:
                raise _session_refused(exc, tls=context is not None) from exc
            if negotiated_ms <= 0 and resume[0]:
                sock.close()
                resume = (0, bytes(16))  # expired: nothing of it to keep (a reader holds no watches, no ephemerals)
                todo.insert(0, (host, port))
                continue
            if negotiated_ms <= 0:
                raise ConnectionError("server refused the session")
            xid = _login(sock, host, security) if security is not None else 0
        except HandshakeRefused as exc:
            sock.close()
            refused.append(f"{host}:{port}: {exc}")
            continue
        except (OSError, struct.error) as exc:
            sock.close()
            errors.append(f"{host}:{port}: handshake failed: {exc}")
            continue
        negotiated = negotiated_ms / 1000.0
        # From here a silent server means a dead session: give up after one session timeout.
        sock.settimeout(negotiated)
        return sock, negotiated, session_id, passwd, xid, (host, port)
    if refused:
        assert security is not None
        raise ZooKeeperSecurityError(
            f"ZooKeeper at {hosts!r} refused the connection ({security.describe()}): {'; '.join(refused + errors)}")
    raise ZooKeeperUnavailableError(
        f"cannot connect to ZooKeeper at {hosts!r} within {timeout:.0f}s: is the server up and the "
        f"connect string right? ({'; '.join(errors)})"
    )


def _start_tls(context: ssl.SSLContext, sock: socket.socket, host: str) -> ssl.SSLSocket:
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        hint = (f"the certificate does not name {host} (or set tls_verify_hostname = false)"
                if exc.verify_code in _NAME_MISMATCH
                else "is tls_ca_file the CA that signed the servers' certificates?")
        raise HandshakeRefused(f"the server's TLS certificate is not trusted: {exc.verify_message}; {hint}") from exc
    except ssl.SSLError as exc:
        raise HandshakeRefused(_tls_failure("TLS handshake failed", exc)) from exc


# TLS alerts with which a server refuses the client's certificate (or its absence).
_CLIENT_CERTIFICATE_ALERTS = ("BAD_CERTIFICATE", "CERTIFICATE_REQUIRED", "CERTIFICATE_UNKNOWN", "UNKNOWN_CA",
                              "HANDSHAKE_FAILURE")


def _tls_failure(what: str, exc: ssl.SSLError) -> str:
    reason = exc.reason or str(exc)
    if "WRONG_VERSION" in reason:
        return f"{what}: {reason} (is this a TLS port, the servers' secureClientPort?)"
    if any(alert in reason for alert in _CLIENT_CERTIFICATE_ALERTS):
        return (f"{what}: {reason}: the server refused our client certificate; is tls_cert_file signed by a CA in "
                "the servers' ssl.trustStore, with its key in tls_key_file?")
    return f"{what}: {reason}"


def _session_refused(exc: OSError, tls: bool) -> BaseException:
    """What a failure between connecting and the ZooKeeper session means."""
    if isinstance(exc, ssl.SSLError):
        # TLS 1.3 servers check the client's certificate after the client has finished its handshake.
        return HandshakeRefused(_tls_failure("the server ended the TLS session", exc))
    if tls and isinstance(exc, ConnectionError):
        return HandshakeRefused(f"the server closed the TLS connection before the ZooKeeper handshake ({exc}): was our "
                                "client certificate refused (tls_cert_file, tls_key_file)?")
    if isinstance(exc, ConnectionError):
        return ConnectionError(f"{exc} (a TLS port? then set tls = true)")
    return exc


def _login(sock: socket.socket, host: str, security: ZkSecurity) -> int:
    """SASL, then digest credentials, on a fresh session; returns the last xid used."""
    xid = 0
    if security.sasl_mechanism:
        who = f"SASL {security.sasl_mechanism} login as " + repr(
            security.sasl_username if security.sasl_mechanism == "DIGEST-MD5" else security.sasl_principal)
        client = security.sasl_client(host)
        challenge: bytes | None = None
        while not client.complete:
            try:
                response = client.process(challenge)
            except Exception as exc:  # pure-sasl's errors: a bad challenge, a missing library
                raise HandshakeRefused(f"{who} failed: {exc}") from exc
            if client.complete and not response:
                break
            xid += 1
            err, body = _exchange(sock, xid, _OP_SASL, _buffer(response or b""), f"{who} refused")
            if err:
                raise HandshakeRefused(f"{who} refused ({_code_name(err)}): wrong user name or password?")
            (length,) = _INT.unpack_from(body, 0)
            challenge = bytes(body[4 : 4 + length]) if length >= 0 else None
    if security.digest is not None:
        packet = _INT.pack(0) + _buffer(b"digest") + _buffer(security.digest.value.encode())
        err, _ = _exchange(sock, _AUTH_XID, _OP_AUTH, packet, "digest credentials refused")
        if err:
            raise HandshakeRefused(f"digest credentials of {security.digest_user!r} refused ({_code_name(err)})")
    return xid


def _exchange(sock: socket.socket, xid: int, opcode: int, body: bytes, refused: str) -> tuple[int, bytes]:
    """One request and its reply during the login: (error code, reply body)."""
    frame = struct.pack("!ii", xid, opcode) + body
    try:
        sock.sendall(_INT.pack(len(frame)) + frame)
        (length,) = _INT.unpack(_recv_exactly(sock, 4))
        reply = _recv_exactly(sock, length)
    except OSError as exc:
        # ZooKeeper hangs up on a failed login, sometimes before its error reply reaches us.
        raise HandshakeRefused(f"{refused}: the server closed the connection (wrong user name or password?)") from exc
    reply_xid, _, err = _REPLY_HEADER.unpack_from(reply, 0)
    if reply_xid != xid:
        raise ConnectionError(f"unexpected reply xid {reply_xid} during the login (expected {xid})")
    return err, reply[_REPLY_HEADER.size :]


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed during the handshake")
        chunks += chunk
    return bytes(chunks)
