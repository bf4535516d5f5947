"""Pod Security and the two deliveries, through the real kube-apiserver (its PodSecurity admission runs after the
webhooks, on the final pod): the seed pods are admitted in a `baseline` namespace with the CSI delivery (the
default), and refused there with Pod Security's own message with the hostPath delivery."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from e2e.testing import unique
from testkit.pods import EXAMPLES

pytestmark = pytest.mark.e2e

SEEDS = ("inference-sm-sharing.yaml", "notebook-time-slicing.yaml")


def mode_of(seed: str) -> str:
    return "sm-sharing" if "sm-sharing" in seed else "time-slicing"


@pytest.fixture
def baseline_namespace(admin) -> Iterator[str]:
    name = unique("psa-baseline")
    manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
        "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/enforce-version": "latest"}}}
    rc, _, err = admin("create", "-f", "-", input=json.dumps(manifest))
    assert rc == 0, err
    # no controller-manager on the API-only control plane: the ServiceAccount admission wants its account
    rc, _, err = admin("create", "serviceaccount", "default", "-n", name)
    assert rc == 0, err
    yield name
    admin("delete", "namespace", name, "--wait=false")


@pytest.fixture
def hostpath_webhook(cluster) -> Iterator[None]:
    cluster.stop_webhook()
    cluster.start_webhook(extra_args=("--delivery", "hostPath"))
    try:
        yield
    finally:
        cluster.stop_webhook()
        cluster.start_webhook()


@pytest.mark.parametrize("seed", SEEDS)
def test_seed_pods_are_admitted_in_a_baseline_namespace_with_the_csi_delivery(admin, baseline_namespace, seed):
    rc, out, err = admin("create", "-n", baseline_namespace, "-f", str(EXAMPLES / seed), "-o", "json")
    assert rc == 0, err
    volumes = json.loads(out)["spec"]["volumes"]
    mode = mode_of(seed)
    assert [v for v in volumes if "csi" in v] == [{"name": f"gpufrac-mps-{mode}", "csi": {
        "driver": "mps.gpufrac.io", "volumeAttributes": {"mode": mode}}}]
    assert not [v for v in volumes if "hostPath" in v]


@pytest.mark.parametrize("seed", SEEDS)
def test_seed_pods_are_refused_by_pod_security_with_the_hostpath_delivery(admin, baseline_namespace,
                                                                          hostpath_webhook, seed):
    rc, _, err = admin("create", "-n", baseline_namespace, "-f", str(EXAMPLES / seed))
    assert rc != 0
    mode = mode_of(seed)
    print(err)  # the message the README quotes
    assert f'violates PodSecurity "baseline:latest": hostPath volumes (volumes "gpufrac-mps-{mode}", ' \
           '"gpufrac-mps-shm")' in err, err
