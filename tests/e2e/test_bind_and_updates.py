"""The scheduler's bind (annotations, then pods/binding), and what may still change afterwards; what may not (the
devices, a limit, the mode, a user's request) are cases of e2e/denial_corpus.py, sent by test_denials.py."""

from __future__ import annotations

import pytest

from e2e.names import NODE_NAME
from e2e.testing import bind, create, example, get_pod, pod

pytestmark = pytest.mark.e2e

NV = "nvidia.com/container.app."
C = "gpufrac.io/container.app."



UUIDS = "GPU-6f0d3c1e-8a47-4b1e-9a11-0c2d9b2e5f10,GPU-7a1e2b3c-4d5e-6f70-8192-a3b4c5d6e7f8"


def bind_a_notebook(alice, binder, ns: str, devices: str = "GPU-a,GPU-b") -> str:
    """alice creates the seed notebook; the binder binds it to two GPUs of 143770 MiB."""
    name = "notebook-bound"
    rc, _, err = create(alice, example("notebook-time-slicing.yaml", name, namespace=ns))
    assert rc == 0, err
    bind(
        binder,
        name,
        {
            NV + "gpus.devices": devices,
            NV + "gpu-memory.request": "71885Mi",  # 143770 MiB × 0.5
            NV + "gpu-memory.limit": "115016Mi",  # 143770 MiB × 0.8
        },
        namespace=ns,
    )
    return name


def test_bind_flow_writes_canonical_annotations(alice, binder, ns):
    p = get_pod(alice, bind_a_notebook(alice, binder, ns))
    ann = p["metadata"]["annotations"]
    assert p["spec"].get("nodeName") == NODE_NAME
    assert ann[NV + "gpus.devices"] == "GPU-a,GPU-b"
    assert ann[C + "gpu-memory.request-mib"] == "71885"
    assert ann[C + "gpu-memory.limit-mib"] == "115016"
    assert ann[C + "mps-pinned-mem-limit"] == "0=115016M,1=115016M"
    assert ann[C + "compute-mode"] == "time-slicing"


def test_bind_flow_with_full_gpu_uuids(alice, binder, ns):
    """The same bind with device ids as NVML reports them (GPU-<uuid>)."""
    p = get_pod(alice, bind_a_notebook(alice, binder, ns, UUIDS))
    ann = p["metadata"]["annotations"]
    assert p["spec"].get("nodeName") == NODE_NAME
    assert ann[C + "gpu-memory.request-mib"] == "71885"
    assert ann[C + "gpu-memory.limit-mib"] == "115016"
    assert ann[C + "mps-pinned-mem-limit"] == "0=115016M,1=115016M"


def test_alice_may_edit_an_unrelated_label(alice, ns):
    name = "label-edit"
    rc, _, err = create(alice, pod(name, {"gpu-fraction": "0.5"}, namespace=ns))
    assert rc == 0, err
    rc, _, err = alice("label", "pod", name, "team=research")
    assert rc == 0, err
    p = get_pod(alice, name)
    assert p["metadata"]["labels"]["team"] == "research"
    assert p["metadata"]["labels"]["gpufrac.io/fractional"] == "true"
    assert p["metadata"]["annotations"]["gpu-fraction"] == "0.5"
