"""Self-managed webhook certificates: keep a CA and a serving certificate in a Secret, renew them before they
expire, and keep the caBundle of the webhook configurations in sync (`gpufrac certs rotate`).

The Secret holds `ca.crt`/`ca.key` (the CA that signs new serving certificates), `tls.crt`/`tls.key`
(the serving certificate the webhook mounts) and `ca-bundle.crt` (every CA the API server must trust,
written to the configurations' `caBundle`).

Rollover of the CA, one step per run, each step waiting `overlap` after the previous one so the API server has
the new caBundle and the kubelet has the new files before the next step depends on them:

1. the CA nears its expiry: a new CA becomes `ca.crt`; the bundle is old CA + new CA; the serving certificate,
   still signed by the old CA, stays;
2. `overlap` after the new CA was issued: the serving certificate is reissued by the new CA;
3. `overlap` after that: the old CA leaves the bundle.

Within a run, the configurations are patched before the Secret is written, so the API server trusts a CA
before any serving certificate it signed can be mounted. `decide()` is pure: it looks at the certificates and
the clock and says what to do; `reconcile()` does it against a cluster.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from gpufrac.certs.cluster import WEBHOOK_CONFIGURATION_KINDS, Cluster
from gpufrac.certs.generate import KeyPair, issue_ca, issue_serving_cert
from gpufrac.core.argtypes import non_negative_int, positive_int
from gpufrac.core.jsonlog import add_log_arguments, setup_logging
from gpufrac.kube.errors import ConflictError, KubeError, NotFoundError

log = logging.getLogger("gpufrac.certs.rotation")

CA_CRT = "ca.crt"
CA_KEY = "ca.key"
TLS_CRT = "tls.crt"
TLS_KEY = "tls.key"
BUNDLE = "ca-bundle.crt"


# ------------------------------------------------------------------------------------------------------------
# State and decision (pure)


@dataclass(frozen=True)
class Settings:
    ca_validity_days: int = 3650
    ca_renew_before: dt.timedelta = dt.timedelta(days=365)
    cert_validity_days: int = 365
    renew_before: dt.timedelta = dt.timedelta(days=30)
    overlap: dt.timedelta = dt.timedelta(minutes=60)


@dataclass(frozen=True)
class CertState:
    """What the Secret holds (PEM bytes; any of them may be missing or garbage)."""

    ca_crt: bytes | None = None
    ca_key: bytes | None = None
    tls_crt: bytes | None = None
    tls_key: bytes | None = None
    bundle: bytes | None = None

    @classmethod
    def from_secret_data(cls, data: dict[str, str] | None) -> CertState:
        data = data or {}

        def get(key: str) -> bytes | None:
            value = data.get(key)
            if not value:
                return None
            try:
                return base64.b64decode(value, validate=True)
            except ValueError:
                return None

        return cls(get(CA_CRT), get(CA_KEY), get(TLS_CRT), get(TLS_KEY), get(BUNDLE))

    def to_secret_data(self) -> dict[str, str]:
        pairs = {CA_CRT: self.ca_crt, CA_KEY: self.ca_key, TLS_CRT: self.tls_crt, TLS_KEY: self.tls_key,
                 BUNDLE: self.bundle}
        return {k: base64.b64encode(v).decode() for k, v in pairs.items() if v is not None}

    @property
    def bundle_certs(self) -> list[x509.Certificate]:
        return _load_certs(self.bundle)


@dataclass(frozen=True)
class Plan:
    """What one run does. The new bundle is `[kept certs of the old bundle..., new CA]`."""

    issue_ca: bool = False
    issue_serving: bool = False
    # PEM of the certificates of the current bundle that stay in it, in order, and of those that leave it.
    keep_in_bundle: tuple[bytes, ...] = ()
    drop_from_bundle: tuple[bytes, ...] = ()
    # The current CA is missing from the bundle: append it (before a new CA, if one is issued).
    add_current_ca: bool = False
    reasons: tuple[str, ...] = field(default=())

    @property
    def changes_secret(self) -> bool:
        return bool(self.issue_ca or self.issue_serving or self.add_current_ca or self.drop_from_bundle)


def _load_certs(pem: bytes | None) -> list[x509.Certificate]:
    if not pem:
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _load_cert(pem: bytes | None) -> x509.Certificate | None:
    certs = _load_certs(pem)
    return certs[0] if certs else None


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_matches(cert: x509.Certificate, key_pem: bytes | None) -> bool:
    if not key_pem:
        return False
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return False
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _dns_names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName))


def _same(a: x509.Certificate, b: x509.Certificate) -> bool:
    return _pem(a) == _pem(b)


def service_dns_names(service: str, namespace: str, cluster_domain: str = "cluster.local") -> list[str]:
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.{cluster_domain}"]


def decide(state: CertState, now: dt.datetime, dns_names: Sequence[str], settings: Settings) -> Plan:
    """What to do with the certificates in `state` at `now`. Pure: no I/O, no key generation."""
    ca = _load_cert(state.ca_crt)
    bundle = state.bundle_certs
    if ca is None or not _usable_ca(ca, state.ca_key, now):
        # Nothing worth keeping: a fresh CA and serving certificate, the bundle is just the new CA.
        return Plan(issue_ca=True, issue_serving=True, drop_from_bundle=tuple(_pem(c) for c in bundle),
                    reasons=(f"{_why_not_usable(ca, now)}: new CA and serving certificate",))

    serving = _load_cert(state.tls_crt)
    issue_ca = ca.not_valid_after_utc - now < settings.ca_renew_before
    reasons = [f"CA expires {ca.not_valid_after_utc:%Y-%m-%d}: new CA, old one stays trusted"] if issue_ca else []
    issue_serving, serving_reasons = _serving_step(state, serving, ca, bundle, issue_ca, now, dns_names, settings)
    settled = not issue_ca and not issue_serving and _serving_settled(serving, ca, now, settings)
    keep, drop, bundle_reasons = _bundle_step(bundle, ca, settled, now)
    return Plan(
        issue_ca=issue_ca, issue_serving=issue_serving, keep_in_bundle=keep, drop_from_bundle=drop,
        add_current_ca=not any(_same(c, ca) for c in bundle),
        reasons=(*reasons, *serving_reasons, *bundle_reasons),
    )


def _usable_ca(ca: x509.Certificate, ca_key: bytes | None, now: dt.datetime) -> bool:
    return _key_matches(ca, ca_key) and ca.not_valid_after_utc > now


def _why_not_usable(ca: x509.Certificate | None, now: dt.datetime) -> str:
    if ca is None:
        return "no CA"
    return "CA expired" if ca.not_valid_after_utc <= now else "CA key mismatch"


def _serving_problem(
    state: CertState, serving: x509.Certificate | None, trusted: list[x509.Certificate], now: dt.datetime,
    dns_names: Sequence[str], settings: Settings,
) -> str | None:
    """Why the serving certificate must be replaced now (`trusted`: the CAs the API server trusts), or None."""
    if serving is None:
        return "no serving certificate"
    if not _key_matches(serving, state.tls_key):
        return "serving key mismatch"
    if serving.not_valid_after_utc - now < settings.renew_before:
        return f"serving certificate expires {serving.not_valid_after_utc:%Y-%m-%d}"
    missing = set(dns_names) - _dns_names(serving)
    if missing:
        return "serving certificate lacks " + ", ".join(sorted(missing))
    if not any(_signed_by(serving, c) for c in trusted):
        return "serving certificate not signed by a trusted CA"
    return None


def _serving_step(
    state: CertState, serving: x509.Certificate | None, ca: x509.Certificate, bundle: list[x509.Certificate],
    issue_ca: bool, now: dt.datetime, dns_names: Sequence[str], settings: Settings,
) -> tuple[bool, list[str]]:
    """(reissue the serving certificate?, why): replaced when it must be, else moved to the current CA once that
    has been trusted for `overlap` (rollover step 2)."""
    # Certificates the API server trusts (per our Secret): unexpired bundle entries, plus the current CA.
    trusted = [*(c for c in bundle if c.not_valid_after_utc > now), ca]
    problem = _serving_problem(state, serving, trusted, now, dns_names, settings)
    if problem:
        return True, [f"{problem}: new serving certificate"]
    if issue_ca or serving is None or _signed_by(serving, ca):
        return False, []
    if ca.not_valid_before_utc <= now - settings.overlap:
        return True, ["serving certificate signed by the previous CA: reissued by the current CA"]
    return False, ["waiting for the overlap period to move the serving certificate to the new CA"]


def _serving_settled(
    serving: x509.Certificate | None, ca: x509.Certificate, now: dt.datetime, settings: Settings
) -> bool:
    """The serving certificate has been signed by the current CA for `overlap`: other CAs may leave the bundle."""
    return serving is not None and _signed_by(serving, ca) and serving.not_valid_before_utc <= now - settings.overlap


def _bundle_step(
    bundle: list[x509.Certificate], ca: x509.Certificate, serving_settled: bool, now: dt.datetime
) -> tuple[tuple[bytes, ...], tuple[bytes, ...], list[str]]:
    """(kept, dropped, why): expired CAs leave the bundle; CAs other than the current one leave once the serving
    certificate has settled on it (rollover step 3); duplicates leave."""
    keep: list[bytes] = []
    drop: list[bytes] = []
    reasons: list[str] = []
    for cert in bundle:
        if cert.not_valid_after_utc <= now:
            drop.append(_pem(cert))
            reasons.append(f"drop expired CA (serial {cert.serial_number:x}) from the bundle")
        elif _same(cert, ca) or not serving_settled:
            keep.append(_pem(cert))
        else:
            drop.append(_pem(cert))
            reasons.append(f"drop previous CA (serial {cert.serial_number:x}) from the bundle")
    if len(set(keep)) != len(keep):
        reasons.append("drop duplicate bundle entries")
        drop.extend(k for i, k in enumerate(keep) if k in keep[:i])
    return tuple(dict.fromkeys(keep)), tuple(drop), reasons


def _days_left(cert: x509.Certificate, now: dt.datetime) -> int:
    return int((cert.not_valid_after_utc - now) / dt.timedelta(days=1))


def execute(
    state: CertState, plan: Plan, now: dt.datetime, dns_names: Sequence[str], settings: Settings,
    new_ca: Callable[[int], KeyPair] = lambda days: issue_ca(days=days),
) -> CertState:
    """Apply `plan` to `state`: issue what it asks for and assemble the new bundle."""
    ca_pair = KeyPair(state.ca_crt, state.ca_key) if state.ca_crt and state.ca_key else None
    bundle: list[bytes] = list(plan.keep_in_bundle)
    if plan.add_current_ca and ca_pair is not None:
        bundle.append(_pem(ca_pair.certificate))
    if plan.issue_ca:
        ca_pair = new_ca(settings.ca_validity_days)
        bundle.append(_pem(ca_pair.certificate))
    if ca_pair is None:
        raise ValueError("plan keeps a CA the state does not have")
    tls_crt, tls_key = state.tls_crt, state.tls_key
    if plan.issue_serving:
        days = max(1, min(settings.cert_validity_days, _days_left(ca_pair.certificate, now)))
        serving = issue_serving_cert(ca_pair, list(dns_names), days=days)
        tls_crt, tls_key = serving.cert_pem, serving.key_pem
    return CertState(
        ca_crt=ca_pair.cert_pem, ca_key=ca_pair.key_pem, tls_crt=tls_crt, tls_key=tls_key,
        bundle=b"".join(dict.fromkeys(bundle)),
    )


# ------------------------------------------------------------------------------------------------------------
# The cluster side


@dataclass
class RotationOutcome:
    secret_written: bool = False
    patched: list[str] = field(default_factory=list)
    reasons: tuple[str, ...] = ()


def reconcile(
    cluster: Cluster, namespace: str, secret: str, dns_names: Sequence[str], webhook_configs: Sequence[str],
    settings: Settings, now: dt.datetime | None = None, ignore_missing_configs: bool = False,
) -> RotationOutcome:
    now = now or dt.datetime.now(dt.UTC)
    current = cluster.read_secret(namespace, secret)
    state = CertState.from_secret_data(current[0] if current else None)
    plan = decide(state, now, dns_names, settings)
    new_state = execute(state, plan, now, dns_names, settings) if plan.changes_secret else state
    outcome = RotationOutcome(reasons=plan.reasons)
    ca_bundle = base64.b64encode(new_state.bundle or b"").decode()

    # Read every configuration first, so a missing one fails the run before anything is written.
    configs: list[tuple[str, str, list[tuple[str, str]]]] = []
    for name in webhook_configs:
        found = 0
        for kind in WEBHOOK_CONFIGURATION_KINDS:
            try:
                configs.append((kind, name, cluster.read_webhooks(kind, name)))
                found += 1
            except NotFoundError:
                continue
        if not found and not ignore_missing_configs:
            raise NotFoundError(f"no Mutating/ValidatingWebhookConfiguration named {name}")

    # Trust first: patch the configurations before the Secret that the webhook pods mount.
    for kind, name, webhooks in configs:
        for index, (webhook, current_bundle) in enumerate(webhooks):
            if current_bundle != ca_bundle:
                cluster.set_ca_bundle(kind, name, index, webhook, ca_bundle)
                outcome.patched.append(f"{kind}/{name}/{webhook}")

    if plan.changes_secret or current is None:
        data = new_state.to_secret_data()
        if current is None:
            cluster.create_secret(namespace, secret, data)
        else:
            cluster.replace_secret(namespace, secret, data, current[1])
        outcome.secret_written = True
    return outcome


# ------------------------------------------------------------------------------------------------------------
# CLI (`gpufrac certs rotate`)


def add_rotate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", required=True, help="namespace of the Secret and the Service")
    parser.add_argument("--secret", required=True, help="Secret holding ca.crt, ca.key, tls.crt, tls.key")
    parser.add_argument("--service", required=True, help="webhook Service (the serving certificate's names)")
    parser.add_argument(
        "--webhook-config", dest="webhook_configs", action="extend", nargs="+", default=[], metavar="NAME",
        help="Mutating/ValidatingWebhookConfiguration whose webhooks' caBundle is kept in sync (repeatable)",
    )
    parser.add_argument("--cluster-domain", default="cluster.local",
                        help="the cluster's DNS domain, in the serving certificate's names")
    defaults = Settings()  # the defaults are Settings'; the flags only name them
    parser.add_argument("--ca-validity-days", type=positive_int, default=defaults.ca_validity_days,
                        help="validity of a new CA")
    parser.add_argument("--ca-renew-before-days", type=non_negative_int, default=defaults.ca_renew_before.days,
                        help="start a new CA when the current one has less than this left")
    parser.add_argument("--cert-validity-days", type=positive_int, default=defaults.cert_validity_days,
                        help="validity of a new serving certificate")
    parser.add_argument("--renew-before-days", type=non_negative_int, default=defaults.renew_before.days,
                        help="renew the serving certificate when less than this is left")
    parser.add_argument("--overlap-minutes", type=non_negative_int,
                        default=defaults.overlap // dt.timedelta(minutes=1),
                        help="wait between the steps of a CA rollover")
    parser.add_argument("--ignore-missing-webhook-configs", action="store_true",
                        help="skip configurations that do not exist yet (pre-install)")
    parser.add_argument("--attempts", type=positive_int, default=5, help="tries on write conflicts")
    add_log_arguments(parser)


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(
        ca_validity_days=args.ca_validity_days,
        ca_renew_before=dt.timedelta(days=args.ca_renew_before_days),
        cert_validity_days=args.cert_validity_days,
        renew_before=dt.timedelta(days=args.renew_before_days),
        overlap=dt.timedelta(minutes=args.overlap_minutes),
    )


def run_rotate(
    args: argparse.Namespace, cluster: Cluster | None = None, now: dt.datetime | None = None
) -> int:
    setup_logging(args.log_level, fmt=args.log_format)
    settings = settings_from_args(args)
    if settings.ca_validity_days <= settings.ca_renew_before.days:
        log.error("--ca-validity-days must be greater than --ca-renew-before-days")
        return 2
    if settings.cert_validity_days <= settings.renew_before.days:
        log.error("--cert-validity-days must be greater than --renew-before-days")
        return 2
    dns_names = service_dns_names(args.service, args.namespace, args.cluster_domain)
    try:
        if cluster is None:
            from gpufrac.certs.kube import KubeCluster  # the kubernetes client only where a real cluster is used
            cluster = KubeCluster()
    except Exception as e:  # no kubeconfig / in-cluster config
        log.error("cannot reach the cluster: %s", e)
        return 1
    for attempt in range(1, args.attempts + 1):
        try:
            outcome = reconcile(
                cluster, args.namespace, args.secret, dns_names, args.webhook_configs, settings,
                now=now, ignore_missing_configs=args.ignore_missing_webhook_configs,
            )
        except ConflictError as e:
            log.warning("conflict (attempt %d): %s; starting over", attempt, e)
            time.sleep(min(2 ** attempt, 10) / 10)
            continue
        except KubeError as e:  # a configuration that is not there, the API server refusing or unreachable
            log.error("%s", e)
            return 1
        for reason in outcome.reasons:
            log.info("%s", reason)
        log.info("secret %s/%s %s; caBundle patched in: %s", args.namespace, args.secret,
                 "written" if outcome.secret_written else "unchanged", ", ".join(outcome.patched) or "none")
        return 0
    log.error("gave up after %d conflicting attempts", args.attempts)
    return 1
