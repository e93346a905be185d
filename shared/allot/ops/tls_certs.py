"""A throwaway CA and a server certificate for NATS over TLS on loopback (``allot up
--secure``): the CA signs one certificate for ``localhost``, ``127.0.0.1`` and ``::1``;
clients trust the CA file. EC P-256 keys, valid for ``days`` days. Keys are written 0600.

Needs the ``cryptography`` package (imported lazily, so the rest of Allot does not).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
from pathlib import Path
from typing import Any

from allot.core.errors import ValidationError
from allot.ops.auth_gen import TlsFiles

DEFAULT_DAYS = 30


def make_loopback_certs(out_dir: Path | str, *, days: int = DEFAULT_DAYS) -> TlsFiles:
    """Write ``ca.pem``, ``server.pem`` and ``server-key.pem`` into ``out_dir``."""
    try:
        from cryptography import x509  # noqa: PLC0415  (optional dependency)
        from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415
    except ImportError:  # pragma: no cover - depends on the environment
        raise ValidationError(
            "tls", "the `cryptography` package is needed for TLS certificates"
        ) from None
    if days < 1:
        raise ValidationError("days", f"must be >= 1, got {days}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = dt.datetime.now(dt.UTC)
    # A minute of slack: a client whose clock is slightly behind still accepts it.
    start, end = now - dt.timedelta(minutes=1), now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Allot loopback CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[Any] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    files = TlsFiles(
        cert_file=out / "server.pem", key_file=out / "server-key.pem", ca_file=out / "ca.pem"
    )
    files.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(files.key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_pem)
    # The CA key is not kept: nothing else is ever signed with it.
    return files


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """An SSL context that trusts only the generated CA (pass as ``tls=`` to nats-py)."""
    return ssl.create_default_context(cafile=str(files.ca_file))
