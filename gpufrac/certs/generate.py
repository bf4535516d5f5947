"""Issue a CA and a TLS serving certificate signed by it (with `cryptography`), and write them as PEM files."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ALWAYS_SANS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256: fast to generate (tests make many) and accepted by every TLS stack the apiserver uses.
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def issue_ca(common_name: str = "gpufrac-ca", days: int = 3650) -> KeyPair:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue_serving_cert(ca: KeyPair, dns_names: list[str] | tuple[str, ...] = (), days: int = 365) -> KeyPair:
    """A serving certificate for `dns_names` plus localhost and 127.0.0.1, signed by `ca`."""
    names = list(dict.fromkeys([*dns_names, *ALWAYS_SANS]))
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    ca_cert = ca.certificate
    key = _new_key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    # Write then rename, so a server reading the file for a new connection never sees half a certificate.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_serving_files(out_dir: Path, ca: KeyPair, serving: KeyPair) -> None:
    """Write ca.crt, tls.crt and tls.key. tls.key goes before tls.crt so no reader pairs a new cert with an old key
    for longer than one rename."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_atomically(out_dir / "ca.crt", ca.cert_pem, 0o644)
    _write_atomically(out_dir / "tls.key", serving.key_pem, 0o600)
    _write_atomically(out_dir / "tls.crt", serving.cert_pem, 0o644)


def write_dev_certs(out_dir: Path, dns_names: list[str] | tuple[str, ...] = (), days: int = 365) -> KeyPair:
    """Fresh CA and serving cert in `out_dir`; returns the CA."""
    ca = issue_ca()
    write_serving_files(out_dir, ca, issue_serving_cert(ca, dns_names, days))
    return ca
