"""Issue 23 on the real node: the image a clean clone builds with plain `buildah bud` (no `make venv` before: the
stubs come from the vendored protos inside the build) runs the agent Ready with its CSI driver; and after `helm
upgrade` to a new image tag, the documented MPS procedure (`gpufrac mps-roll`, docs/operations.md) leaves the MPS
pods on the new image, an sm-sharing pod started after it reaches the new daemon, and the skew metric is 0 again.

Runs against the session's real node and release (tests/node/conftest.py), after test_csi_real_node.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from e2e.agent_on_node import (
    DRIVER,
    agent_ready,
    both_ready,
    condition,
    daemon_pids,
    delete,
    registered_drivers,
    start_seed,
)
from e2e.agent_world import metric_value
from e2e.buildah import BASE_IMAGE, buildah, prune_build_cache, stray_images
from e2e.install import Helm
from e2e.names import NODE_NAME, RELEASE_NAMESPACE, REPO_ROOT
from e2e.node import RealCluster
from e2e.pods import SEED_ENV, agent_metrics, exec_in, release_pods
from e2e.testing import unique
from e2e.toolkit.wait import wait_until

# a clean-clone image build (several minutes on a loaded machine) and two helm rollouts: past the suite's 300 s
pytestmark = [pytest.mark.e2e, pytest.mark.real_node, pytest.mark.timeout(2400)]

REPOSITORY = "localhost/gpufrac"
BASE = "docker.io/library/python:3.11-slim-bookworm"  # the base `make image` made from Debian's packages
MODES = ("time-slicing", "sm-sharing")


def import_tag(node: RealCluster, tmp_path: Path, tag: str) -> None:
    """The image under `tag`, pushed to an OCI archive (no registry here) and imported into the node's containerd."""
    archive = tmp_path / f"{tag}.oci.tar"
    pushed = buildah("push", "-q", f"{REPOSITORY}:{tag}", f"oci-archive:{archive}:{REPOSITORY}:{tag}")
    assert pushed.returncode == 0, pushed.stderr
    node.containerd.import_image(archive)


def image_config(tmp_path: Path, tag: str) -> dict:
    archive = tmp_path / f"{tag}.oci.tar"
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = json.load(tar.extractfile("blobs/" + index["manifests"][0]["digest"].replace(":", "/")))  # type: ignore[arg-type]
        return json.load(tar.extractfile("blobs/" + manifest["config"]["digest"].replace(":", "/")))  # type: ignore[arg-type]


def set_image(helm: Helm, tag: str) -> None:
    values = (f"image.repository={REPOSITORY}", f"image.tag={tag}")
    if helm.installed():
        helm.upgrade(*values)
    else:
        helm.install(*values)


def mps_images(node: RealCluster) -> set[str]:
    return {c["image"] for p in release_pods(node, "mps") for c in p["spec"]["containers"]}


def skew(node: RealCluster) -> dict[str, float | None]:
    text = agent_metrics(node)
    return {mode: metric_value(text, "gpufrac_mps_version_skew", mode=mode) for mode in MODES}


def test_a_clean_clone_built_with_plain_buildah_bud_runs_the_agent_ready_with_csi(node: RealCluster, tmp_path: Path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True, timeout=300)
    assert not (clone / "gpufrac/agent/csi/generated").exists() and not (clone / ".venv").exists()
    # No registry is reachable here: the base goes by the name `make image` gave the one it made (BASE), instead
    # of the Dockerfile's digest pin. Everything else is the Dockerfile as a clean clone has it.
    if buildah("inspect", "--type", "image", BASE).returncode != 0:
        pytest.skip(f"no {BASE} in the image store: run `make image`")
    # Behind a TLS-inspecting proxy pip needs the host's CA bundle, as `make image` passes it (a build secret).
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    secret = ["--secret", f"id=pip-ca,src={ca}"] if ca.is_file() else []
    built = buildah("bud", "-q", "--isolation", "chroot", "--pull=never", "--layers", *secret,
                    "--build-arg", f"BASE={BASE}", "-t", f"{REPOSITORY}:clean", str(clone),
                    timeout=1800)  # a full build with pip: over 10 min on a loaded machine
    prune_build_cache()  # its step images: under vfs ~4 GB a build, which once filled the disk
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert not stray_images()
    import_tag(node, tmp_path, "clean")
    config = image_config(tmp_path, "clean")
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.version"] == "0.2.0"
    set_image(Helm(node), "clean")
    ready = wait_until(lambda: agent_ready(node), 300, "the agent of the clean clone's image Ready", interval=2)
    assert ready["spec"]["containers"][0]["image"] == f"{REPOSITORY}:clean"
    wait_until(lambda: DRIVER in registered_drivers(node), 120, "the CSI driver registered", interval=1)
    wait_until(lambda: both_ready(node), 120, "the node's conditions True", interval=1)
    # The stubs were generated in the build: the agent serves CSI (it would exit "the CSI gRPC stubs are missing").
    name = unique("clean-clone")
    start_seed(node, "notebook", name)
    delete(node, name)


def test_after_an_upgrade_mps_roll_moves_the_mps_pods_and_a_new_client_reaches_the_new_daemon(
        node: RealCluster, tmp_path: Path):
    helm = Helm(node)
    current = wait_until(lambda: agent_ready(node), 300, "a Ready agent", interval=2)
    old_image = current["spec"]["containers"][0]["image"]
    tagged = buildah("tag", old_image if old_image.startswith("localhost/") else BASE_IMAGE, f"{REPOSITORY}:next")
    assert tagged.returncode == 0, tagged.stderr
    import_tag(node, tmp_path, "next")
    client = unique("roll-client")
    start_seed(node, "inference", client)  # an sm-sharing client of the old daemon
    before, (mps_image,) = daemon_pids(), mps_images(node)
    set_image(helm, "next")
    wait_until(lambda: (p := agent_ready(node)) and p["spec"]["containers"][0]["image"] == f"{REPOSITORY}:next",
               300, "the agent on the new tag", interval=2)
    assert mps_images(node) == {mps_image}, "helm upgrade left the MPS pods alone (OnDelete)"
    assert daemon_pids() == before
    wait_until(lambda: skew(node) == {"time-slicing": 1.0, "sm-sharing": 1.0}, 60, "the skew reported", interval=1)
    reason = condition(node, "gpufrac.io/Ready")
    assert (reason["status"], reason["reason"]) == ("True", "MpsVersionSkew"), reason
    assert f"({REPOSITORY}:next)" in reason["message"] and f"({mps_image})" in reason["message"], reason

    roll = [sys.executable, "-m", "gpufrac", "mps-roll", "--kubeconfig", str(node.kubeconfigs["admin"]),
            "--namespace", RELEASE_NAMESPACE, "--daemonset", "gpufrac-mps"]
    listed = subprocess.run([*roll, "--dry-run"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert f"node {NODE_NAME}: would replace MPS pod" in listed.stdout and client in listed.stdout
    kept = subprocess.run(roll, capture_output=True, text=True, timeout=120)  # the client is still running
    assert kept.returncode == 1 and "fractional pods still running" in kept.stdout, kept.stdout + kept.stderr
    assert mps_images(node) == {mps_image} and not node_unschedulable(node)
    rolled = subprocess.run([*roll, "--evict", "--timeout", "240"], capture_output=True, text=True, timeout=600)
    print(rolled.stdout, rolled.stderr)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert f"node {NODE_NAME}: MPS pod" in rolled.stdout and "replaced by" in rolled.stdout
    assert mps_images(node) == {f"{REPOSITORY}:next"}
    assert not node_unschedulable(node)
    after = daemon_pids()
    assert all(len(after[m]) == 1 and after[m] != before[m] for m in MODES), (before, after)
    wait_until(lambda: skew(node) == {"time-slicing": 0.0, "sm-sharing": 0.0}, 60, "the skew back to 0", interval=1)
    wait_until(lambda: condition(node, "gpufrac.io/Ready").get("reason") == "FractionsEnforced", 60,
               "the condition's reason FractionsEnforced", interval=1)
    # A new sm-sharing client: mounted by the CSI driver (which checks the node enforces sm-sharing now) and
    # reaching the new daemon's control socket through the mount.
    reconnected = unique("roll-client")
    start_seed(node, "inference", reconnected)
    pipe_dir = SEED_ENV["inference"]["CUDA_MPS_PIPE_DIRECTORY"]
    assert exec_in(node, reconnected, f"test -S {pipe_dir}/control && echo socket").strip() == "socket"
    delete(node, reconnected, client)


def node_unschedulable(node: RealCluster) -> bool:
    res = node.kubectl("get", "node", NODE_NAME, "-o", "jsonpath={.spec.unschedulable}", user="admin")
    return res.stdout.strip() == "true"
