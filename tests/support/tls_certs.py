"""A throwaway certificate authority and a server certificate for 127.0.0.1, for TLS tests."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # trust this to accept the server
    cert: Path
    key: Path


def make_tls_files(directory: Path, host_names: tuple[str, ...] = ("localhost",)) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = {"not_valid_before": now - datetime.timedelta(hours=1), "not_valid_after": now + datetime.timedelta(days=1)}
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ledger-sweeper test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in host_names]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host_names[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(valid["not_valid_before"]).not_valid_after(valid["not_valid_after"])
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    return files


@dataclass(frozen=True)
class MutualTls:
    """A CA, a server certificate and client certificates, as files, for mutual-TLS tests."""

    ca: Path  # trusted by both sides
    server_keystore: Path  # PEM: the server's key and certificate, one file (ZooKeeper's PEM keystore)
    client_cert: Path
    client_key: Path
    rogue_ca: Path  # a CA nobody trusts
    rogue_client_cert: Path  # a client certificate the server must refuse (signed by rogue_ca)
    rogue_client_key: Path
    other_client_cert: Path  # another trusted identity (another x509 id: a bookie's, say)
    other_client_key: Path


# Valid long before now: the sandbox ZooKeeper's clock is set back (up to years) while it is seeded.
LONG_AGO = datetime.timedelta(days=3650)


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - LONG_AGO).not_valid_after(now + LONG_AGO)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, common_name: str,
          names: list[x509.GeneralName], usage: x509.ObjectIdentifier) -> tuple[ec.EllipticCurvePrivateKey,
                                                                                 x509.Certificate]:
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ledger-sweeper tests"),
                                        x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
               .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - LONG_AGO).not_valid_after(now + LONG_AGO)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_mutual_tls(directory: Path, host_names: tuple[str, ...] = ("localhost",), ip_san: bool = True) -> MutualTls:
    """`ip_san=False`: the server certificate names only `host_names`, so 127.0.0.1 fails hostname checks."""
    from cryptography.x509.oid import ExtendedKeyUsageOID

    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = _ca("ledger-sweeper test CA")
    rogue_key, rogue = _ca("rogue CA")
    server_names: list[x509.GeneralName] = [x509.DNSName(n) for n in host_names]
    if ip_san:
        server_names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    server_key, server = _leaf(ca_key, ca, host_names[0], server_names, ExtendedKeyUsageOID.SERVER_AUTH)
    client_key, client = _leaf(ca_key, ca, "ledger-sweeper", [], ExtendedKeyUsageOID.CLIENT_AUTH)
    bad_key, bad = _leaf(rogue_key, rogue, "ledger-sweeper", [], ExtendedKeyUsageOID.CLIENT_AUTH)
    other_key, other = _leaf(ca_key, ca, "bookie", [], ExtendedKeyUsageOID.CLIENT_AUTH)
    files = MutualTls(directory / "ca.pem", directory / "server-keystore.pem", directory / "client.pem",
                      directory / "client.key", directory / "rogue-ca.pem", directory / "rogue-client.pem",
                      directory / "rogue-client.key", directory / "other-client.pem", directory / "other-client.key")
    files.ca.write_bytes(_pem(ca))
    files.server_keystore.write_bytes(_key_pem(server_key) + _pem(server))
    files.client_cert.write_bytes(_pem(client))
    files.client_key.write_bytes(_key_pem(client_key))
    files.rogue_ca.write_bytes(_pem(rogue))
    files.rogue_client_cert.write_bytes(_pem(bad))
    files.rogue_client_key.write_bytes(_key_pem(bad_key))
    files.other_client_cert.write_bytes(_pem(other))
    files.other_client_key.write_bytes(_key_pem(other_key))
    for path in (files.server_keystore, files.client_key, files.rogue_client_key, files.other_client_key):
        path.chmod(0o600)
    return files
