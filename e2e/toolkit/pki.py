"""The cluster's credentials: a CA with the apiserver's serving certificate, the service-account signing key,
throwaway bearer tokens (a token file), client certificates, and kubeconfigs.

cryptography and gpufrac.certs are imported here only, so `python -m e2e down` needs nothing but the standard
library.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

APISERVER_NAMES = ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local"]


def write_private(path: Path, data: bytes | str) -> None:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chmod(path, 0o600)


def make_cluster_pki(pki: Path, ip_sans: list[str] | None = None):
    """ca.crt/ca.key, the apiserver's tls.crt/tls.key (for its service names and `ip_sans`), sa.key/sa.pub.
    Returns the CA key pair for further certificates."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from gpufrac.certs.generate import issue_ca, issue_serving_cert, write_serving_files

    pki.mkdir(parents=True, exist_ok=True)
    ca = issue_ca("gpufrac-e2e-cluster-ca")
    serving = issue_serving_cert(ca, APISERVER_NAMES + list(ip_sans or []))
    write_serving_files(pki, ca, serving)
    write_private(pki / "ca.key", ca.key_pem)
    # Service-account token signing key (RSA: every apiserver version and JWT consumer takes RS256).
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    write_private(pki / "sa.key", sa_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (pki / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return ca


def new_token() -> str:
    return base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")


def write_token_file(path: Path, rows: list[tuple[str, str, str, list[str]]]) -> None:
    """The apiserver's --token-auth-file: (token, user, uid, groups) per line."""
    write_private(path, "".join(f'{tok},{user},{uid},"{",".join(groups)}"\n' for tok, user, uid, groups in rows))


def write_kubeconfig(path: Path, server: str, ca_file: Path, user: str, *, token: str | None = None,
                     cert: Path | None = None, key: Path | None = None, namespace: str = "default") -> None:
    """A kubeconfig for `user` with a bearer token or a client certificate."""
    credentials: dict[str, str] = {}
    if token:
        credentials["token"] = token
    if cert and key:
        credentials["client-certificate"] = str(cert)
        credentials["client-key"] = str(key)
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpufrac-e2e", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_file.read_bytes()).decode()}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": f"{user}@gpufrac-e2e",
                      "context": {"cluster": "gpufrac-e2e", "user": user, "namespace": namespace}}],
        "current-context": f"{user}@gpufrac-e2e",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps(cfg, indent=2))  # JSON is YAML; kubectl reads either


def write_client_cert(ca, out: Path, name: str, common_name: str, organizations: list[str]) -> None:
    """`<name>.crt`/`<name>.key` in `out`: a client certificate from `ca` (a gpufrac.certs KeyPair) for
    `common_name` in groups `organizations`."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations),
                         x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    (out / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_private(out / f"{name}.key", key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
