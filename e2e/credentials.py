"""Who may talk to a cluster, fresh for every cluster: its PKI, one throwaway bearer token per user (the
apiserver's token file), a kubeconfig per user, and the webhook's own CA and serving certificate."""

from __future__ import annotations

from pathlib import Path

from e2e.names import RELEASE_NAMESPACE, SCHEDULER_USER
from e2e.toolkit import pki

# name -> (Kubernetes user, groups): the users every cluster has, each with a kubeconfig `<workdir>/...`.
USERS: dict[str, tuple[str, list[str]]] = {
    "alice": ("alice", ["system:authenticated"]),
    "binder": (SCHEDULER_USER,
               ["system:serviceaccounts", "system:serviceaccounts:kai-scheduler", "system:authenticated"]),
    "admin": ("admin", ["system:masters", "system:authenticated"]),
}


def make_credentials(pki_dir: Path, users: dict[str, tuple[str, list[str]]],
                     ip_sans: list[str] | None = None) -> tuple[object, dict[str, str]]:
    """The cluster's PKI in `pki_dir` (the apiserver's certificate also for `ip_sans`) and a token for each of
    `users`, written to `pki_dir/tokens.csv`. Returns (the cluster CA's key pair, {name: token})."""
    ca = pki.make_cluster_pki(pki_dir, ip_sans=ip_sans)
    tokens = {name: pki.new_token() for name in users}
    pki.write_token_file(pki_dir / "tokens.csv", [
        (tokens[name], user, f"uid-{name}", groups) for name, (user, groups) in users.items()])
    return ca, tokens


def write_webhook_certs(out: Path) -> None:
    """The webhook's own CA and serving certificate (for its Service name; 127.0.0.1 is among the SANs), once:
    a restarted webhook reuses them, so the caBundle registered with the API server stays valid."""
    if (out / "tls.crt").exists():
        return
    from gpufrac.certs.generate import issue_ca, issue_serving_cert, write_serving_files

    ca = issue_ca("gpufrac-e2e-webhook-ca")
    write_serving_files(out, ca, issue_serving_cert(ca, [f"gpufrac-webhook.{RELEASE_NAMESPACE}.svc"]))
