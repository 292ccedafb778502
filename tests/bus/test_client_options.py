"""TLS and SASL settings reach the Kafka clients untouched (no cluster with TLS runs here)."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from relay_bus import clients
from relay_bus.config import KafkaSettings


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "relay-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_sasl_ssl_options_are_passed_through(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    settings = KafkaSettings(
        bootstrap_servers="k1:9093,k2:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="relay",
        sasl_password="s3cret",  # type: ignore[arg-type]
        ssl_cafile=cert,
        ssl_certfile=cert,
        ssl_keyfile=key,
    )
    options = clients._common(settings, "relay-test")
    assert options["bootstrap_servers"] == ["k1:9093", "k2:9093"]
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "relay"
    assert options["sasl_plain_password"] == "s3cret"
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert options["ssl_context"].verify_mode == ssl.CERT_REQUIRED


def test_plaintext_has_no_tls_or_sasl() -> None:
    options = clients._common(KafkaSettings(), "relay-test")
    assert "ssl_context" not in options
    assert "sasl_mechanism" not in options
