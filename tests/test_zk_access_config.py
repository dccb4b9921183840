"""[bookkeeper] / [pulsar] ZooKeeper access options: validation, secrets from files or the environment
only, and what kazoo and the wire reader are given (no server needed here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.config import OffloadConfig, SweeperConfig, load
from sweeper.errors import ConfigError
from sweeper.zk.security import bookkeeper_security, pulsar_security, security_from_options

REPO = Path(__file__).resolve().parents[1]
NO_OFFLOAD = SweeperConfig(offload=OffloadConfig(enabled=False))  # no [pulsar] cluster_name needed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[bookkeeper]\nsasl_password = 'x'\n", "secrets never go in the config file; name a file "
                                                 "(sasl_password_file) or an environment variable"),
        ("[bookkeeper]\ndigest_auth = 'u:p'\n", "(digest_auth_file)"),
        ("[bookkeeper]\nsasl_mechanism = 'PLAIN'\n", "sasl_mechanism must be one of DIGEST-MD5, GSSAPI"),
        ("[bookkeeper]\nsasl_mechanism = 'DIGEST-MD5'\nsasl_username = 'u'\n", "needs sasl_username and "
                                                                              "sasl_password_file"),
        ("[bookkeeper]\nsasl_mechanism = 'GSSAPI'\n", "needs sasl_principal"),
        ("[bookkeeper]\nsasl_username = 'u'\n", "sasl_mechanism is empty"),
        ("[bookkeeper]\ntls = true\ntls_cert_file = 'c.pem'\n", "tls_cert_file and tls_key_file go together"),
        ("[bookkeeper]\ntls_ca_file = 'ca.pem'\n", "tls = false"),
        ("[bookkeeper]\ndigest_auth_file = 'a'\ndigest_auth_env = 'B'\n", "digest_auth_file or digest_auth_env"),
        ("[pulsar]\ntls = true\n", "[pulsar] TLS / SASL / digest options need [pulsar] zookeeper"),
        ("[scan]\nreads_per_second = -1\n", "reads_per_second must be >= 0"),
        ("[scan]\nmax_sessions = 0\n", "max_sessions positive"),
    ],
)
def test_bad_access_options_name_the_option(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert message in str(caught.value)


def test_cluster_example_is_a_secured_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load(REPO / "conf" / "cluster.example.toml")
    bk = cfg.bookkeeper
    assert bk.tls and bk.tls_ca_file and bk.tls_cert_file and bk.tls_verify_hostname
    assert bk.sasl_mechanism == "DIGEST-MD5" and bk.sasl_password_env and not bk.sasl_password_file
    assert cfg.scan.reads_per_second == SweeperConfig().scan.reads_per_second > 0
    with pytest.raises(ConfigError, match=r"sasl_password_env names \$ZK_SWEEPER_PASSWORD, which is not set"):
        bookkeeper_security(cfg)
    monkeypatch.setenv("ZK_SWEEPER_PASSWORD", "hunter2-zk")
    security = bookkeeper_security(cfg)
    assert security.sasl_password is not None and security.sasl_password.value == "hunter2-zk"
    # Never printed: not in the repr, the description, the config hash input or the config itself.
    for text in (repr(security), str(security), security.describe(), str(cfg.to_dict())):
        assert "hunter2-zk" not in text
    assert pulsar_security(cfg) == security  # [pulsar] zookeeper empty: the same ensemble, the same login


def test_kazoo_is_given_tls_sasl_digest_and_a_private_default_acl(tmp_path: Path) -> None:
    from tests.support.tls_certs import make_mutual_tls

    pki = make_mutual_tls(tmp_path / "pki")
    (tmp_path / "pw").write_text("s3cret\n")
    (tmp_path / "digest").write_text("ops:digest-pw\n")
    cfg = NO_OFFLOAD.replace(bookkeeper={
        "tls": True, "tls_ca_file": str(pki.ca), "tls_cert_file": str(pki.client_cert),
        "tls_key_file": str(pki.client_key), "sasl_mechanism": "DIGEST-MD5", "sasl_username": "sweeper",
        "sasl_password_file": str(tmp_path / "pw"), "digest_auth_file": str(tmp_path / "digest")})
    kwargs = bookkeeper_security(cfg).kazoo_kwargs()
    assert kwargs["use_ssl"] and kwargs["ca"] == str(pki.ca) and kwargs["check_hostname"] and kwargs["verify_certs"]
    assert kwargs["sasl_options"] == {"mechanism": "DIGEST-MD5", "username": "sweeper", "password": "s3cret"}
    assert kwargs["auth_data"] == [("digest", "ops:digest-pw")]
    assert {(acl.id.scheme, acl.perms) for acl in kwargs["default_acl"]} == {("auth", 31), ("world", 1)}


def test_unreadable_secret_and_certificate_files_are_configuration_errors(tmp_path: Path) -> None:
    cfg = NO_OFFLOAD.replace(bookkeeper={"sasl_mechanism": "DIGEST-MD5", "sasl_username": "u",
                                              "sasl_password_file": str(tmp_path / "absent")})
    with pytest.raises(ConfigError, match=r"sasl_password_file .*absent cannot be read"):
        bookkeeper_security(cfg)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"digest_auth_file .* is empty"):
        security_from_options("bookkeeper", NO_OFFLOAD.replace(
            bookkeeper={"digest_auth_file": str(tmp_path / "empty")}).bookkeeper)
    tls = NO_OFFLOAD.replace(bookkeeper={"tls": True, "tls_ca_file": str(tmp_path / "nope.pem")})
    with pytest.raises(ConfigError, match="cannot load tls_ca_file"):
        bookkeeper_security(tls).ssl_context()


def test_pulsar_ensemble_has_its_own_access(tmp_path: Path) -> None:
    (tmp_path / "digest").write_text("pulsar:pw\n")
    cfg = NO_OFFLOAD.replace(pulsar={"zookeeper": "meta1:2181", "digest_auth_file": str(tmp_path / "digest")})
    assert pulsar_security(cfg).digest_user == "pulsar"
    assert bookkeeper_security(cfg).digest is None


def test_gssapi_is_configuration_for_kazoo_with_a_keytab(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KRB5_CLIENT_KTNAME", raising=False)
    cfg = NO_OFFLOAD.replace(bookkeeper={"sasl_mechanism": "GSSAPI", "sasl_principal": "sweeper@EXAMPLE.COM",
                                              "sasl_keytab": "/etc/security/keytabs/sweeper.keytab"})
    security = bookkeeper_security(cfg)
    assert security.describe() == "SASL GSSAPI as 'sweeper@EXAMPLE.COM'"
    try:
        import kerberos  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="needs the `kerberos` Python package"):
            security.kazoo_kwargs()
    else:  # pragma: no cover - only where the Kerberos bindings are installed
        assert security.kazoo_kwargs()["sasl_options"] == {
            "mechanism": "GSSAPI", "service": "zookeeper", "principal": "sweeper@EXAMPLE.COM"}
    import os

    assert os.environ["KRB5_CLIENT_KTNAME"] == "/etc/security/keytabs/sweeper.keytab"
