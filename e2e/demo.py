"""`make demo`: bring up a control plane, apply the examples as alice, show what admission did, tear down."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from e2e.cluster import ControlPlane
from e2e.names import REPO_ROOT
from e2e.toolkit.errors import ClusterError

EXAMPLES = REPO_ROOT / "examples"
ACCEPTED = ("inference-sm-sharing.yaml", "notebook-time-slicing.yaml")
SHORTHANDS = (
    "gpu-fraction",
    "gpu-fraction.limit",
    "gpu-memory",
    "gpu-memory.limit",
    "gpu-fraction-num-devices",
    "gpu-fraction-container-name",
)
OURS = ("gpufrac.io/", "nvidia.com/container.", "kai.scheduler/container.")


def _show_pod(cp: ControlPlane, name: str) -> None:
    rc, out, err = cp.kubectl("get", "pod", name, "-o", "json")
    if rc != 0:
        print(f"    (could not read it back: {err.strip()})")
        return
    pod = json.loads(out)
    meta = pod["metadata"]
    if pod["spec"].get("nodeName"):
        print(f"    spec.nodeName: {pod['spec']['nodeName']}")
    print("    annotations:")
    for key, value in sorted(meta.get("annotations", {}).items()):
        if key.startswith(OURS) or key in SHORTHANDS:
            print(f"      {key}: {value!r}")
    for key, value in sorted(meta.get("labels", {}).items()):
        if key.startswith("gpufrac.io/"):
            print(f"    label {key}: {value!r}")
    for ctr in pod["spec"]["containers"]:
        print(f"    container {ctr['name']}:")
        for env in ctr.get("env", []):
            if "valueFrom" in env:
                src = env["valueFrom"].get("fieldRef", {}).get("fieldPath", env["valueFrom"])
                print(f"      env {env['name']} <- {src}")
            else:
                print(f"      env {env['name']} = {env.get('value')!r}")
        for mount in ctr.get("volumeMounts", []):
            if "kube-api-access" not in mount["name"]:
                sub = f" (subPath {mount['subPath']})" if "subPath" in mount else ""
                print(f"      mount {mount['name']} at {mount['mountPath']}{sub}")
    for vol in pod["spec"].get("volumes", []):
        if "hostPath" in vol:
            print(f"    volume {vol['name']}: hostPath {vol['hostPath'].get('path')}")
        elif "csi" in vol:
            csi = vol["csi"]
            print(f"    volume {vol['name']}: CSI driver {csi['driver']} {csi.get('volumeAttributes', {})}")


def run_demo(workdir: Path) -> int:
    print(
        "== starting etcd, kube-apiserver and the gpufrac webhook (registered through the chart) ...",
        flush=True,
    )
    t0 = time.monotonic()
    try:
        cp = ControlPlane(workdir).start()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failures = 0
    try:
        print(
            f"== up in {time.monotonic() - t0:.1f} s ({cp.server_version}); applying examples/ as alice "
            "(namespace team-a)\n"
        )
        wrong = sorted(p.name for p in EXAMPLES.glob("wrong-*.yaml"))
        for name in (*ACCEPTED, *wrong):
            path = EXAMPLES / name
            header = [line[2:] for line in path.read_text().splitlines() if line.startswith("# ")]
            print(f"--- kubectl apply -f examples/{name}")
            if header:
                print("    # " + " ".join(header))
            rc, out, err = cp.kubectl("apply", "-f", str(path.relative_to(REPO_ROOT)))
            expected_ok = name in ACCEPTED
            if rc == 0:
                print(f"    ACCEPTED: {out.strip()}")
                for line in err.strip().splitlines():
                    print(f"    {line}")
                _show_pod(cp, _pod_name(path))
            else:
                print("    DENIED:")
                for line in err.strip().splitlines():
                    print(f"      {line}")
            if (rc == 0) != expected_ok:
                failures += 1
                print(f"    !! expected {'acceptance' if expected_ok else 'a denial'}")
            print()
        failures += _demo_bind(cp)
    finally:
        print("== tearing down")
        cp.stop(remove_workdir=True)
    if failures:
        print(f"== {failures} example(s) did not behave as expected", file=sys.stderr)
    return 1 if failures else 0


# What KAI's binder would write for the notebook on a node whose GPUs have 143770 MiB (0.5 and 0.8 of it).
BIND_ANNOTATIONS = {
    "nvidia.com/container.app.gpus.devices": "GPU-6f0d3c1e-8a47-4b1e-9a11-0c2d9b2e5f10,"
    "GPU-7a1e2b3c-4d5e-6f70-8192-a3b4c5d6e7f8",
    "nvidia.com/container.app.gpu-memory.request": "71885Mi",
    "nvidia.com/container.app.gpu-memory.limit": "115016Mi",
}


def _demo_bind(cp: ControlPlane) -> int:
    """The scheduler binds the notebook; then alice tries to widen its limit."""
    print("--- the scheduler (system:serviceaccount:kai-scheduler:binder) binds pod/notebook to gpu-node-1:")
    patch = json.dumps({"metadata": {"annotations": BIND_ANNOTATIONS}})
    rc, out, err = cp.kubectl("patch", "pod", "notebook", "--type=merge", "-p", patch, user="binder")
    print(f"    kubectl patch (annotations): {(out or err).strip()}")
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "notebook"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"},
    }
    rc2, _, err2 = cp.kubectl(
        "create",
        "--raw",
        "/api/v1/namespaces/team-a/pods/notebook/binding",
        "-f",
        "-",
        user="binder",
        input=json.dumps(binding),
    )
    print(f"    POST pods/binding: {'ok' if rc2 == 0 else err2.strip()}")
    _show_pod(cp, "notebook")
    print("--- alice: kubectl annotate --overwrite pod notebook nvidia.com/container.app.gpu-memory.limit=140Gi")
    rc3, out3, err3 = cp.kubectl(
        "annotate", "--overwrite", "pod", "notebook", "nvidia.com/container.app.gpu-memory.limit=140Gi"
    )
    print(f"    {'ACCEPTED' if rc3 == 0 else 'DENIED'}: {(out3 or err3).strip()}")
    print()
    return int(rc != 0) + int(rc2 != 0) + int(rc3 == 0)


def _pod_name(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.strip().startswith("name:"):
            return line.split(":", 1)[1].strip()
    return path.stem
