"""Self-managed certificate rotation (gpufrac/certs/rotation.py): the pure decision, its execution on a simulated
clock, and the reconcile loop against an in-memory cluster. No cluster needed."""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json

import pytest
from cryptography import x509

from gpufrac.certs import generate
from gpufrac.certs.cluster import MUTATING, VALIDATING
from gpufrac.certs.rotation import (
    BUNDLE,
    CA_CRT,
    TLS_CRT,
    CertState,
    Plan,
    Settings,
    add_rotate_arguments,
    decide,
    execute,
    reconcile,
    run_rotate,
    service_dns_names,
)
from gpufrac.kube.errors import ConflictError, NotFoundError

T0 = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
DNS = service_dns_names("gpufrac-webhook", "gpufrac-system")
SETTINGS = Settings()  # CA 10 y, renewed 1 y before; serving 1 y, renewed 30 d before; overlap 60 min


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def advance(self, **kw: float) -> dt.datetime:
        self.now += dt.timedelta(**kw)
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Certificates are issued at the simulated time, so a run years ahead sees what it would see then."""
    c = Clock(T0)
    monkeypatch.setattr(generate, "_now", lambda: c.now)
    return c


def run(state: CertState, clock: Clock, settings: Settings = SETTINGS) -> tuple[Plan, CertState]:
    plan = decide(state, clock.now, DNS, settings)
    return plan, (execute(state, plan, clock.now, DNS, settings) if plan.changes_secret else state)


def certs_of(pem: bytes | None) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem) if pem else []


def cert(pem: bytes | None) -> x509.Certificate:
    return certs_of(pem)[0]


def signed_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
    except Exception:
        return False
    return True


def is_noop(plan: Plan) -> bool:
    return not plan.changes_secret


def fresh(clock: Clock) -> CertState:
    plan, state = run(CertState(), clock)
    assert plan.issue_ca and plan.issue_serving
    return state


# --- the decision -------------------------------------------------------------------------------------------


def test_fresh_install_issues_ca_and_serving_cert(clock: Clock) -> None:
    plan = decide(CertState(), clock.now, DNS, SETTINGS)
    assert plan.issue_ca and plan.issue_serving and plan.keep_in_bundle == ()
    state = execute(CertState(), plan, clock.now, DNS, SETTINGS)
    ca, serving = cert(state.ca_crt), cert(state.tls_crt)
    assert signed_by(serving, ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(DNS) <= set(sans.get_values_for_type(x509.DNSName))
    assert "gpufrac-webhook.gpufrac-system.svc" in DNS
    assert certs_of(state.bundle) == [ca]
    assert state.ca_key and state.tls_key
    # Round trip through Secret data.
    assert CertState.from_secret_data(state.to_secret_data()) == state


def test_nothing_to_do_on_a_healthy_secret(clock: Clock) -> None:
    state = fresh(clock)
    for days in (0, 1, 100, 300):
        clock.now = T0 + dt.timedelta(days=days)
        plan = decide(state, clock.now, DNS, SETTINGS)
        assert is_noop(plan), plan.reasons
        assert plan.reasons == ()


def test_serving_cert_near_expiry_is_renewed_by_the_same_ca(clock: Clock) -> None:
    state = fresh(clock)
    clock.advance(days=365 - 30 + 1)  # 29 days left < 30
    plan, new = run(state, clock)
    assert plan.issue_serving and not plan.issue_ca and not plan.drop_from_bundle
    assert new.ca_crt == state.ca_crt and new.bundle == state.bundle
    assert new.tls_crt != state.tls_crt and new.tls_key != state.tls_key
    assert signed_by(cert(new.tls_crt), cert(state.ca_crt))
    assert cert(new.tls_crt).not_valid_after_utc > clock.now + dt.timedelta(days=300)
    assert any("serving certificate expires" in r for r in plan.reasons)
    assert is_noop(decide(new, clock.now, DNS, SETTINGS))


def test_serving_cert_renewal_threshold_is_configurable(clock: Clock) -> None:
    state = fresh(clock)
    clock.advance(days=300)  # 65 days left
    assert is_noop(decide(state, clock.now, DNS, SETTINGS))
    assert decide(state, clock.now, DNS, Settings(renew_before=dt.timedelta(days=90))).issue_serving


def test_serving_cert_is_reissued_when_the_service_name_changes(clock: Clock) -> None:
    state = fresh(clock)
    plan = decide(state, clock.now, service_dns_names("other", "gpufrac-system"), SETTINGS)
    assert plan.issue_serving and not plan.issue_ca
    assert any("lacks" in r for r in plan.reasons)


def test_broken_secret_starts_over(clock: Clock) -> None:
    state = fresh(clock)
    other = fresh(clock)
    # CA key does not belong to the CA certificate.
    plan = decide(CertState(state.ca_crt, other.ca_key, state.tls_crt, state.tls_key, state.bundle),
                  clock.now, DNS, SETTINGS)
    assert plan.issue_ca and plan.issue_serving and plan.keep_in_bundle == ()
    # Garbage everywhere.
    plan = decide(CertState(b"x", b"y", b"z", b"w", b"v"), clock.now, DNS, SETTINGS)
    assert plan.issue_ca and plan.issue_serving
    # Serving key mismatch: only the serving certificate.
    plan = decide(CertState(state.ca_crt, state.ca_key, state.tls_crt, other.tls_key, state.bundle),
                  clock.now, DNS, SETTINGS)
    assert plan.issue_serving and not plan.issue_ca
    # Serving certificate from a CA nobody trusts.
    plan = decide(CertState(state.ca_crt, state.ca_key, other.tls_crt, other.tls_key, state.bundle),
                  clock.now, DNS, SETTINGS)
    assert plan.issue_serving and not plan.issue_ca


def test_expired_ca_starts_over(clock: Clock) -> None:
    state = fresh(clock)
    clock.advance(days=3651)
    plan, new = run(state, clock)
    assert plan.issue_ca and plan.issue_serving
    assert certs_of(new.bundle) == [cert(new.ca_crt)]  # the expired CA is gone
    assert signed_by(cert(new.tls_crt), cert(new.ca_crt))


def test_ca_near_expiry_rolls_over_with_overlap(clock: Clock) -> None:
    state = fresh(clock)
    old_ca = cert(state.ca_crt)
    # Keep the serving certificate fresh so the rollover steps are not forced by its own expiry.
    clock.now = old_ca.not_valid_after_utc - dt.timedelta(days=375)
    plan, state = run(state, clock)
    assert plan.issue_serving and not plan.issue_ca
    serving_before = state.tls_crt

    # Step 1: the CA has less than a year left: new CA, trusted next to the old one; serving cert unchanged.
    clock.now = old_ca.not_valid_after_utc - dt.timedelta(days=364)
    plan, state = run(state, clock)
    assert plan.issue_ca and not plan.issue_serving
    new_ca = cert(state.ca_crt)
    assert new_ca != old_ca
    assert certs_of(state.bundle) == [old_ca, new_ca]  # old + new
    assert state.tls_crt == serving_before and signed_by(cert(state.tls_crt), old_ca)

    # Within the overlap period nothing moves.
    clock.advance(minutes=30)
    plan, same = run(state, clock)
    assert is_noop(plan) and same == state
    assert any("waiting" in r for r in plan.reasons)

    # Step 2: after the overlap the serving certificate moves to the new CA; both CAs stay trusted.
    clock.advance(minutes=31)
    plan, state = run(state, clock)
    assert plan.issue_serving and not plan.issue_ca and not plan.drop_from_bundle
    assert signed_by(cert(state.tls_crt), new_ca)
    assert certs_of(state.bundle) == [old_ca, new_ca]

    # Until the overlap has passed again, the old CA stays.
    clock.advance(minutes=10)
    plan, _ = run(state, clock)
    assert is_noop(plan)

    # Step 3: a later run drops the old CA.
    clock.advance(days=1)
    plan, state = run(state, clock)
    assert not plan.issue_ca and not plan.issue_serving
    assert plan.drop_from_bundle == (old_ca.public_bytes(generate.serialization.Encoding.PEM),)
    assert certs_of(state.bundle) == [new_ca]

    # And then it is quiet until the next renewal.
    clock.advance(days=1)
    assert is_noop(decide(state, clock.now, DNS, SETTINGS))


def test_ca_rollover_when_the_serving_cert_must_be_renewed_in_the_same_run(clock: Clock) -> None:
    state = fresh(clock)
    old_ca = cert(state.ca_crt)
    clock.now = old_ca.not_valid_after_utc - dt.timedelta(days=300)  # serving cert long expired
    plan, state = run(state, clock)
    assert plan.issue_ca and plan.issue_serving
    new_ca = cert(state.ca_crt)
    # The old CA stays trusted for connections still using the old certificate; the new one signs.
    assert certs_of(state.bundle) == [old_ca, new_ca]
    assert signed_by(cert(state.tls_crt), new_ca)
    clock.advance(hours=2)
    plan, state = run(state, clock)
    assert certs_of(state.bundle) == [new_ca]


def test_bundle_cleanup(clock: Clock) -> None:
    state = fresh(clock)
    ca = cert(state.ca_crt)
    ca_pem = state.ca_crt
    assert ca_pem is not None
    short = generate.issue_ca("short-lived", days=10).cert_pem
    def with_bundle(bundle: bytes | None) -> CertState:
        return CertState(state.ca_crt, state.ca_key, state.tls_crt, state.tls_key, bundle)

    # A stray CA left by an earlier rollover is dropped once the serving certificate is settled.
    clock.advance(days=2)
    plan, new = run(with_bundle(short + ca_pem), clock)
    assert plan.drop_from_bundle == (short,) and certs_of(new.bundle) == [ca]
    # An expired one is dropped in any case.
    clock.advance(days=20)
    plan, new = run(with_bundle(ca_pem + short), clock)
    assert plan.drop_from_bundle == (short,) and any("expired" in r for r in plan.reasons)
    # Duplicates collapse.
    plan, new = run(with_bundle(ca_pem + ca_pem), clock)
    assert plan.changes_secret and certs_of(new.bundle) == [ca]
    # A bundle that lost the current CA gets it back.
    plan, new = run(with_bundle(None), clock)
    assert plan.add_current_ca and certs_of(new.bundle) == [ca]


def test_25_years_of_daily_runs_never_serve_an_untrusted_cert(clock: Clock) -> None:
    """Simulate the daily CronJob for 25 years. After every run, the serving certificate is valid and signed
    by a CA in the bundle that the API server had before the run, or got in the same run (patched first)."""
    settings = Settings(overlap=dt.timedelta(hours=1))
    state = fresh(clock)
    renewals = cas = 0
    for _ in range(25 * 365):
        before = state
        clock.advance(days=1)
        plan, state = run(state, clock, settings)
        renewals += plan.issue_serving
        cas += plan.issue_ca
        serving = cert(state.tls_crt)
        bundle = certs_of(state.bundle)
        assert serving.not_valid_after_utc > clock.now + dt.timedelta(days=1)
        assert any(signed_by(serving, c) for c in bundle)
        if state.tls_crt != before.tls_crt and not plan.issue_ca:
            # Moved without a new CA: its CA was trusted already before this run.
            assert any(signed_by(serving, c) for c in certs_of(before.bundle))
        assert len(bundle) <= 2
        assert cert(state.ca_crt).not_valid_after_utc - clock.now > dt.timedelta(days=300)
    assert cas == 2
    assert renewals >= 25


# --- reconcile against an in-memory cluster -----------------------------------------------------------------


class FakeCluster:
    def __init__(self, configs: dict[tuple[str, str], list[str]]) -> None:
        self.secrets: dict[tuple[str, str], tuple[dict[str, str], str]] = {}
        self.configs = {k: [[name, ""] for name in v] for k, v in configs.items()}
        self.calls: list[str] = []
        self.version = 0
        self.conflicts = 0

    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        return self.secrets.get((namespace, name))

    def _store(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.version += 1
        self.secrets[(namespace, name)] = (dict(data), str(self.version))

    def create_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.calls.append("create_secret")
        if (namespace, name) in self.secrets:
            raise ConflictError("exists")
        self._store(namespace, name, data)

    def replace_secret(self, namespace: str, name: str, data: dict[str, str], resource_version: str) -> None:
        self.calls.append("replace_secret")
        if self.conflicts:
            self.conflicts -= 1
            raise ConflictError("changed")
        assert self.secrets[(namespace, name)][1] == resource_version
        self._store(namespace, name, data)

    def read_webhooks(self, kind: str, name: str) -> list[tuple[str, str]]:
        if (kind, name) not in self.configs:
            raise NotFoundError(name)
        return [(w, b) for w, b in self.configs[(kind, name)]]

    def set_ca_bundle(self, kind: str, name: str, index: int, webhook: str, ca_bundle: str) -> None:
        self.calls.append(f"patch {kind}/{webhook}")
        assert self.configs[(kind, name)][index][0] == webhook
        self.configs[(kind, name)][index][1] = ca_bundle


def two_configs() -> FakeCluster:
    return FakeCluster(
        {(MUTATING, "gpufrac"): ["mutate.gpufrac.io"], (VALIDATING, "gpufrac"): ["validate.gpufrac.io"]}
    )


def test_reconcile_creates_secret_and_syncs_ca_bundle_then_is_idempotent(clock: Clock) -> None:
    cluster = two_configs()
    out = reconcile(cluster, "ns", "tls", DNS, ["gpufrac"], SETTINGS, now=clock.now)
    assert out.secret_written
    # Trust before use: both configurations are patched before the Secret is created.
    assert cluster.calls == [f"patch {MUTATING}/mutate.gpufrac.io", f"patch {VALIDATING}/validate.gpufrac.io",
                             "create_secret"]
    data = cluster.secrets[("ns", "tls")][0]
    assert {CA_CRT, "ca.key", TLS_CRT, "tls.key", BUNDLE} <= set(data)
    for hooks in cluster.configs.values():
        assert [b for _, b in hooks] == [data[BUNDLE]]
    cluster.calls.clear()
    out = reconcile(cluster, "ns", "tls", DNS, ["gpufrac"], SETTINGS, now=clock.now)
    assert not out.secret_written and out.patched == [] and cluster.calls == []


def test_reconcile_repairs_a_ca_bundle_reset_by_an_upgrade(clock: Clock) -> None:
    cluster = two_configs()
    reconcile(cluster, "ns", "tls", DNS, ["gpufrac"], SETTINGS, now=clock.now)
    cluster.configs[(VALIDATING, "gpufrac")][0][1] = ""
    cluster.calls.clear()
    out = reconcile(cluster, "ns", "tls", DNS, ["gpufrac"], SETTINGS, now=clock.now)
    assert out.patched == [f"{VALIDATING}/gpufrac/validate.gpufrac.io"] and not out.secret_written


def test_reconcile_missing_configs(clock: Clock) -> None:
    cluster = FakeCluster({})
    with pytest.raises(NotFoundError):
        reconcile(cluster, "ns", "tls", DNS, ["gpufrac"], SETTINGS, now=clock.now)
    assert cluster.secrets == {}
    out = reconcile(
        cluster, "ns", "tls", DNS, ["gpufrac"], SETTINGS, now=clock.now, ignore_missing_configs=True
    )
    assert out.secret_written and ("ns", "tls") in cluster.secrets
    # One missing among several: nothing is patched before the run fails.
    cluster = two_configs()
    with pytest.raises(NotFoundError):
        reconcile(cluster, "ns", "tls", DNS, ["gpufrac", "missing"], SETTINGS, now=clock.now)
    assert cluster.calls == []


def test_rollover_through_reconcile_keeps_ca_bundle_ahead_of_the_secret(clock: Clock) -> None:
    cluster = two_configs()
    reconcile(cluster, "ns", "tls", DNS, ["gpufrac"], SETTINGS, now=clock.now)
    ca = cert(base64.b64decode(cluster.secrets[("ns", "tls")][0][CA_CRT]))
    clock.now = ca.not_valid_after_utc - dt.timedelta(days=300)
    reconcile(cluster, "ns", "tls", DNS, ["gpufrac"], SETTINGS, now=clock.now)
    bundle = base64.b64decode(cluster.configs[(MUTATING, "gpufrac")][0][1])
    assert len(certs_of(bundle)) == 2
    serving = cert(base64.b64decode(cluster.secrets[("ns", "tls")][0][TLS_CRT]))
    assert any(signed_by(serving, c) for c in certs_of(bundle))


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_rotate_arguments(parser)
    return parser.parse_args(
        ["--namespace", "ns", "--secret", "tls", "--service", "gpufrac-webhook",
         "--webhook-config", "gpufrac", *extra]
    )


def test_cli_arguments_and_run(clock: Clock) -> None:
    args = _args("--webhook-config", "other", "--renew-before-days", "10", "--overlap-minutes", "5",
                 "--ignore-missing-webhook-configs")
    assert args.webhook_configs == ["gpufrac", "other"]
    assert args.renew_before_days == 10 and args.overlap_minutes == 5 and args.ignore_missing_webhook_configs
    cluster = two_configs()
    assert run_rotate(args, cluster=cluster) == 0
    data = cluster.secrets[("ns", "tls")][0]
    sans = cert(base64.b64decode(data[TLS_CRT])).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "gpufrac-webhook.ns.svc" in sans


def test_cli_retries_conflicts_and_fails_on_missing_config(clock: Clock) -> None:
    cluster = two_configs()
    assert run_rotate(_args(), cluster=cluster, now=clock.now) == 0
    clock.advance(days=340)  # serving renewal -> replace_secret
    cluster.conflicts = 1
    assert run_rotate(_args(), cluster=cluster, now=clock.now) == 0
    assert cluster.calls.count("replace_secret") == 2
    assert run_rotate(_args(), cluster=FakeCluster({})) == 1
    assert run_rotate(_args("--ca-validity-days", "10", "--ca-renew-before-days", "20"), cluster=cluster) == 2


def test_the_rotation_job_logs_json_lines_like_the_other_programs(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_rotate(_args(), cluster=two_configs()) == 0
    assert run_rotate(_args(), cluster=FakeCluster({})) == 1
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert lines[-1]["level"] == "error" and "no Mutating/ValidatingWebhookConfiguration" in lines[-1]["message"]
