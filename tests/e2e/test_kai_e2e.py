"""Every KAI a cluster may run (issue 25), through the real kube-apiserver: the shorthands' target as KAI picks it, a
lone pod-level compute mode, a bind writing a compute portion or CDI device names. What is refused (keys that
contradict the container name, a bad compute portion, the pod KAI v0.17's older GPU-sharing admission leaves) are
cases of e2e/denial_corpus.py, sent by test_denials.py."""

from __future__ import annotations

import json

import pytest

from e2e.names import NODE_NAME
from e2e.testing import bind, container, create, env_of, get_pod, pod
from testkit.pods import IMAGE

pytestmark = pytest.mark.e2e

MAIN_HELPER = [{"name": "main", "image": IMAGE}, {"name": "helper", "image": IMAGE}]
NV = "nvidia.com/container.{}."
C = "gpufrac.io/container.{}."
SM_SHARING_PORTION = {"gpu-fraction": "0.5", "nvidia.com/container.app.gpu-compute.mode": "sm-sharing"}


def test_the_memory_shorthand_applies_to_the_container_the_keys_name(alice, ns):
    """The issue's pod: gpu-memory beside a request for helper, on main and helper. KAI runs it with helper's
    fraction; gpufrac admits it with helper as the target."""
    name = "kai-target-helper"
    rc, out, err = create(alice, pod(name, {"gpu-memory": "2000", NV.format("helper") + "gpu-memory.request": "2000Mi"},
                                     MAIN_HELPER, namespace=ns))
    assert rc == 0, err
    stored = json.loads(out)
    annotations = stored["metadata"]["annotations"]
    assert annotations[C.format("helper") + "gpu-memory.request-mib"] == "2000"
    assert not any(k.startswith((C.format("main"), NV.format("main"))) for k in annotations)
    assert env_of(container(stored, "main"))["NVIDIA_VISIBLE_DEVICES"] == {"name": "NVIDIA_VISIBLE_DEVICES",
                                                                          "value": "void"}
    assert "CUDA_MPS_PIPE_DIRECTORY" in env_of(container(stored, "helper"))


def test_a_lone_pod_level_mode_is_left_untouched_with_a_warning(alice, ns):
    """A whole-GPU pod migrating from KAI: the chart's matchConditions send it (it carries a fraction key), the
    webhook allows it as it is and says why the key does nothing."""
    name = "kai-lone-mode"
    whole_gpu = [{"name": "app", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    rc, out, err = create(alice, pod(name, {"kai.scheduler/gpu-compute-sharing-mode": "sm-sharing"}, whole_gpu,
                                     namespace=ns))
    assert rc == 0, err
    assert "Warning:" in err and "kai.scheduler/gpu-compute-sharing-mode: sm-sharing is ignored" in err, err
    stored = json.loads(out)
    assert stored["metadata"]["annotations"] == {"kai.scheduler/gpu-compute-sharing-mode": "sm-sharing"}
    assert "env" not in stored["spec"]["containers"][0]
    assert "gpufrac.io/fractional" not in (stored["metadata"].get("labels") or {})


def test_a_bind_writing_a_compute_portion_reaches_the_sm_sharing_clients_env(alice, binder, ns):
    name = "kai-compute-portion"
    rc, out, err = create(alice, pod(name, SM_SHARING_PORTION, namespace=ns))
    assert rc == 0, err
    stored = json.loads(out)
    ref = env_of(container(stored))["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]["valueFrom"]["fieldRef"]
    assert ref["fieldPath"] == f"metadata.annotations['{C.format('app')}active-thread-percent']"
    bind(binder, name, {NV.format("app") + "gpus.devices": "GPU-a",
                         NV.format("app") + "gpu-memory.request": "1000Mi",
                         NV.format("app") + "gpu-compute.portion": "0.5"}, namespace=ns)
    bound = get_pod(alice, name)
    assert bound["spec"]["nodeName"] == NODE_NAME
    # What the kubelet resolves the fieldRef to when it starts the container, after this bind.
    assert bound["metadata"]["annotations"][C.format("app") + "active-thread-percent"] == "50"


def test_a_bind_writing_cdi_device_names_is_accepted(alice, binder, ns):
    name = "kai-cdi"
    rc, _, err = create(alice, pod(name, {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}, namespace=ns))
    assert rc == 0, err
    devices = "k8s.device-plugin.nvidia.com/gpu=GPU-6f0d3c1e-8a47-4b1e-9a11-0c2d9b2e5f10,nvidia.com/gpu=1"
    bind(binder, name, {NV.format("app") + "gpus.devices": devices, NV.format("app") + "gpu-memory.request": "1000Mi"},
         namespace=ns)
    annotations = get_pod(alice, name)["metadata"]["annotations"]
    assert annotations[NV.format("app") + "gpus.devices"] == devices
    assert annotations[C.format("app") + "mps-pinned-mem-limit"] == "0=1000M,1=1000M"


