"""The scheduler's bind (annotations, then pods/binding) and who may change fraction annotations
afterwards."""

from __future__ import annotations

import json

import pytest

from e2e.names import NODE_NAME
from e2e.testing import assert_denied, bind, create, example, get_pod, pod, unique

pytestmark = pytest.mark.e2e

NV = "nvidia.com/container.app."
C = "gpufrac.io/container.app."



UUIDS = "GPU-6f0d3c1e-8a47-4b1e-9a11-0c2d9b2e5f10,GPU-7a1e2b3c-4d5e-6f70-8192-a3b4c5d6e7f8"


def bind_a_notebook(alice, binder, devices: str = "GPU-a,GPU-b") -> str:
    """alice creates the seed notebook; the binder binds it to two GPUs of 143770 MiB."""
    name = unique("notebook-bound")
    rc, _, err = create(alice, example("notebook-time-slicing.yaml", name))
    assert rc == 0, err
    bind(
        binder,
        name,
        {
            NV + "gpus.devices": devices,
            NV + "gpu-memory.request": "71885Mi",  # 143770 MiB × 0.5
            NV + "gpu-memory.limit": "115016Mi",  # 143770 MiB × 0.8
        },
    )
    return name


def test_bind_flow_writes_canonical_annotations(alice, binder):
    p = get_pod(alice, bind_a_notebook(alice, binder))
    ann = p["metadata"]["annotations"]
    assert p["spec"].get("nodeName") == NODE_NAME
    assert ann[NV + "gpus.devices"] == "GPU-a,GPU-b"
    assert ann[C + "gpu-memory.request-mib"] == "71885"
    assert ann[C + "gpu-memory.limit-mib"] == "115016"
    assert ann[C + "mps-pinned-mem-limit"] == "0=115016M,1=115016M"
    assert ann[C + "compute-mode"] == "time-slicing"


def test_bind_flow_with_full_gpu_uuids(alice, binder):
    """The same bind with device ids as NVML reports them (GPU-<uuid>)."""
    p = get_pod(alice, bind_a_notebook(alice, binder, UUIDS))
    ann = p["metadata"]["annotations"]
    assert p["spec"].get("nodeName") == NODE_NAME
    assert ann[C + "gpu-memory.request-mib"] == "71885"
    assert ann[C + "gpu-memory.limit-mib"] == "115016"
    assert ann[C + "mps-pinned-mem-limit"] == "0=115016M,1=115016M"


def test_binder_cannot_change_a_users_memory_request(alice, binder):
    """The scheduler adds bind-time values; it may not rewrite the request the user asked for."""
    rc, _, err = alice("apply", "-f", "-", input=json.dumps(example("inference-sm-sharing.yaml", "binder-edit")))
    assert rc == 0, err
    res = binder("annotate", "--overwrite", "pod", "binder-edit", NV + "gpu-memory.request=50Gi")
    assert_denied(res, NV + "gpu-memory.request")
    assert get_pod(alice, "binder-edit")["metadata"]["annotations"][NV + "gpu-memory.request"] == "40Gi"


def test_alice_cannot_set_devices_on_an_existing_pod(alice):
    name = unique("devices-edit")
    rc, _, err = create(alice, pod(name, {"gpu-fraction": "0.5"}))
    assert rc == 0, err
    res = alice("annotate", "pod", name, NV + "gpus.devices=GPU-evil")
    assert_denied(res, NV + "gpus.devices")


def test_alice_cannot_change_devices_after_bind(alice, binder):
    bound_notebook = bind_a_notebook(alice, binder)
    res = alice("annotate", "--overwrite", "pod", bound_notebook, NV + "gpus.devices=GPU-c,GPU-d")
    assert_denied(res, NV + "gpus.devices")
    assert get_pod(alice, bound_notebook)["metadata"]["annotations"][NV + "gpus.devices"] == "GPU-a,GPU-b"


def test_alice_cannot_change_a_limit(alice):
    name = unique("limit-edit")
    rc, _, err = create(alice, pod(name, {NV + "gpu-memory.request": "8Gi", NV + "gpu-memory.limit": "16Gi"}))
    assert rc == 0, err
    res = alice("annotate", "--overwrite", "pod", name, NV + "gpu-memory.limit=32Gi")
    assert_denied(res, NV + "gpu-memory.limit")
    assert get_pod(alice, name)["metadata"]["annotations"][NV + "gpu-memory.limit"] == "16Gi"


def test_alice_cannot_change_the_mode(alice):
    name = unique("mode-edit")
    rc, _, err = create(alice, pod(name, {NV + "gpu-memory.request": "8Gi", NV + "gpu-compute.mode": "time-slicing"}))
    assert rc == 0, err
    res = alice("annotate", "--overwrite", "pod", name, NV + "gpu-compute.mode=sm-sharing")
    assert_denied(res, NV + "gpu-compute.mode")


def test_alice_may_edit_an_unrelated_label(alice):
    name = unique("label-edit")
    rc, _, err = create(alice, pod(name, {"gpu-fraction": "0.5"}))
    assert rc == 0, err
    rc, _, err = alice("label", "pod", name, "team=research")
    assert rc == 0, err
    p = get_pod(alice, name)
    assert p["metadata"]["labels"]["team"] == "research"
    assert p["metadata"]["labels"]["gpufrac.io/fractional"] == "true"
    assert p["metadata"]["annotations"]["gpu-fraction"] == "0.5"
