"""The seed's two examples, applied by alice with kubectl, come back mutated (docs/architecture.md, "One review")."""

from __future__ import annotations

import pytest

from e2e.testing import container, env_of, get_pod
from testkit.pods import EXAMPLES

pytestmark = pytest.mark.e2e

C = "gpufrac.io/container.app."


def _assert_injected(pod: dict, mode: str) -> None:
    """Env from the downward API on the annotations that hold each value, the MPS pipe directory of `mode`, mounted
    from the mode's CSI inline volume (no hostPath: Pod Security baseline allows it), and the fractional label."""
    assert pod["metadata"]["labels"].get("gpufrac.io/fractional") == "true"
    app = container(pod)
    env = env_of(app)
    ann = "metadata.annotations"
    field_refs = {
        "NVIDIA_VISIBLE_DEVICES": f"{ann}['nvidia.com/container.app.gpus.devices']",
        "NVIDIA_GPU_MEMORY_REQUEST": f"{ann}['gpufrac.io/container.app.gpu-memory.request-mib']",
        "NVIDIA_GPU_MEMORY_LIMIT": f"{ann}['gpufrac.io/container.app.gpu-memory.limit-mib']",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{ann}['gpufrac.io/container.app.mps-pinned-mem-limit']",
    }
    for name, path in field_refs.items():
        assert name in env, f"env {name} missing: {app.get('env')}"
        assert env[name].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == path, env[name]
    pipe_dir = f"/run/gpufrac/mps/{mode}"
    assert env["CUDA_MPS_PIPE_DIRECTORY"].get("value") == pipe_dir
    mounts = [m for m in app.get("volumeMounts", []) if m["mountPath"] == pipe_dir]
    assert len(mounts) == 1 and mounts[0].get("subPath") == "pipe", app.get("volumeMounts")
    shm = [m for m in app.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
    assert len(shm) == 1 and shm[0] == {**mounts[0], "mountPath": "/dev/shm", "subPath": "shm"}, shm
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    vol = volumes[mounts[0]["name"]]
    assert vol.get("csi") == {"driver": "mps.gpufrac.io", "volumeAttributes": {"mode": mode}}, vol
    assert not [v for v in volumes.values() if "hostPath" in v], volumes
    # The ServiceAccount admission plugin's token mount survives our patch.
    assert any(m["name"].startswith("kube-api-access-") for m in app["volumeMounts"])


def test_inference_sm_sharing_example(alice):
    rc, out, err = alice("apply", "-f", str(EXAMPLES / "inference-sm-sharing.yaml"))
    assert rc == 0, err
    assert "pod/inference created" in out
    pod = get_pod(alice, "inference")
    ann = pod["metadata"]["annotations"]
    assert ann[C + "gpu-memory.request-mib"] == "40960"
    assert ann[C + "gpu-memory.limit-mib"] == "61440"
    assert ann[C + "mps-pinned-mem-limit"] == "0=61440M,1=61440M,2=61440M,3=61440M"
    assert ann[C + "compute-mode"] == "sm-sharing"
    # What the user wrote is kept.
    assert ann["nvidia.com/container.app.gpu-memory.request"] == "40Gi"
    assert ann["nvidia.com/container.app.gpu-memory.limit"] == "60Gi"
    _assert_injected(pod, "sm-sharing")


def test_notebook_time_slicing_example(alice):
    rc, out, err = alice("apply", "-f", str(EXAMPLES / "notebook-time-slicing.yaml"))
    assert rc == 0, err
    assert "pod/notebook created" in out
    pod = get_pod(alice, "notebook")
    ann = pod["metadata"]["annotations"]
    assert ann[C + "compute-mode"] == "time-slicing"
    assert ann["kai.scheduler/container.app.gpu-memory.portion.limit"] == "0.8"
    # A portion has no MiB value until the scheduler picks GPUs (see test_bind_flow).
    assert C + "gpu-memory.limit-mib" not in ann
    _assert_injected(pod, "time-slicing")


def test_mutation_is_stable_on_reapply(alice):
    """Applying the same manifest again changes nothing (the patch is idempotent; nothing is re-added)."""
    rc, out, err = alice("apply", "-f", str(EXAMPLES / "inference-sm-sharing.yaml"))
    if "created" in out:  # running alone
        rc, out, err = alice("apply", "-f", str(EXAMPLES / "inference-sm-sharing.yaml"))
    assert rc == 0, err
    assert "unchanged" in out or "configured" in out, out
    app = container(get_pod(alice, "inference"))
    names = [e["name"] for e in app["env"]]
    assert len(names) == len(set(names)), names
    paths = [m["mountPath"] for m in app["volumeMounts"]]
    assert len(paths) == len(set(paths)), paths
