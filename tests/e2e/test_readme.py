"""The `bash here=<step>` blocks of the README and docs/ (the GPU check), run on this machine: each step below runs
its block's commands as written, or, where a command needs what this machine lacks (a registry, a GPU node over
ssh), the same steps against what it has, as the step says. The other blocks: `test` in tests/e2e/test_docs.py,
`lines` in tests/webhook/test_readme.py, `node` in tests/node/test_readme_cluster.py (testkit/docblocks.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from e2e.buildah import BASE_IMAGE, IMAGE_CACHE, buildah
from e2e.names import REPO_ROOT
from e2e.toolkit.tools import find_kubectl
from testkit.docblocks import Block, blocks, every_block

pytestmark = pytest.mark.e2e

STEPS = ("make-run", "curl", "patch", "gpu-check", "image")


def step(name: str) -> Block:
    (block,) = [b for b in every_block("here") if b.step == name]
    return block


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"CI is set and a README step cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def test_every_here_block_is_a_step_this_file_runs():
    assert sorted(b.step for b in every_block("here")) == sorted(STEPS)
    assert step("gpu-check").doc == "docs/gpu-check.md"


# ---- "Two commands": make run, and the curl that talks to it ---------------------------------------------------

SERVE_AND_CURL = r"""
set -euo pipefail
ip link set lo up
setsid make run > "$LOG" 2>&1 &
server=$!
trap 'kill -TERM -- -$server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -sf --cacert certs/dev/ca.crt https://127.0.0.1:8443/healthz > /dev/null && break
  kill -0 $server 2>/dev/null || { echo "make run exited" >&2; exit 3; }
  sleep 0.2
done
bash -euo pipefail -c "$CURL_BLOCK"
echo "$SEPARATOR"
bash -euo pipefail -c "$PATCH_BLOCK"
"""
SEPARATOR = "==== the patch block ===="


def shown_output(block: Block) -> dict:
    """The JSON the README prints after the command, as `# ` comment lines."""
    text = "".join(line.strip()[2:] for line in block.body.splitlines() if line.strip().startswith("# "))
    return json.loads(text)


def shown_lines(block: Block) -> list[str]:
    """What the README prints after the command, one `# ` comment line per output line."""
    return [line.strip()[2:] for line in block.body.splitlines() if line.strip().startswith("# ")]


def test_make_run_serves_the_review_the_readme_shows(tmp_path):
    """`make run` serves on the README's address, https://127.0.0.1:8443, in a network namespace of the test's own
    (so that port is free whatever else runs here); the README's curl gets exactly the answer it shows, and its
    allowed review's patch, decoded with jq and base64, lists exactly the operations it shows."""
    make_run, curl, patch = step("make-run"), step("curl"), step("patch")
    assert "jq -r .response.patch | base64 -d" in patch.body
    assert make_run.commands() == ["make run", "make test"]
    # `make test` is the command that runs this test: CI's entry point runs it.
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        unavailable("a network namespace of its own needs root, unshare and ip")
    # What `make run` installs first, outside the namespace (it has no network): a no-op when the venv is current.
    prepared = subprocess.run(["make", ".venv/.installed"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=900)
    assert prepared.returncode == 0, prepared.stdout[-2000:] + prepared.stderr[-2000:]
    log = tmp_path / "make-run.log"
    env = {**os.environ, "LOG": str(log), "CURL_BLOCK": curl.body, "PATCH_BLOCK": patch.body, "SEPARATOR": SEPARATOR}
    result = subprocess.run(["unshare", "--net", "bash", "-c", SERVE_AND_CURL], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    served = log.read_text() if log.exists() else ""
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}\n--- make run:\n{served[-3000:]}"
    denied, decoded = result.stdout.split(SEPARATOR + "\n")
    assert json.loads(denied) == shown_output(curl)
    assert decoded.splitlines() == shown_lines(patch), decoded
    assert "127.0.0.1:8443" in served, served[-3000:]


# ---- docs/gpu-check.md ------------------------------------------------------------------------------------


def test_the_gpu_check_runs_from_its_one_file_and_from_make(tmp_path):
    """docs/gpu-check.md builds gpu_check.pyz (the package gpucheck/ as one zipapp file), copies that one file to a GPU
    node and runs it there with the node's python3. No GPU node is reachable here: the build runs as written, the file
    is copied alone into an empty directory and run there with python3, against the fakes the tests use (the fake
    NVML and nvidia-cuda-mps-control, given by the check's own flags); then the comment's other way, `make gpu-check`,
    from the checkout (it picks the fakes where there is no GPU)."""
    block = step("gpu-check")
    assert block.commands() == ["make gpu-check-pyz", "scp .e2e/gpu-check/gpu_check.pyz gpu-node:",
                                "ssh gpu-node sudo python3 gpu_check.pyz"]
    assert "make gpu-check" in block.body
    built = subprocess.run(["make", "gpu-check-pyz"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert built.stdout.strip() == str(REPO_ROOT / ".e2e" / "gpu-check" / "gpu_check.pyz")
    nvml_dir = subprocess.run([sys.executable, "-m", "testkit.fakes.build"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True, timeout=300).stdout.strip()
    node_home = tmp_path / "gpu-node"
    node_home.mkdir()
    shutil.copy(REPO_ROOT / ".e2e" / "gpu-check" / "gpu_check.pyz", node_home)  # scp: the one file
    env = {**os.environ, "GPUFRAC_FAKE_NVML": str(REPO_ROOT / "testkit/fakes/gpu_check_node.json")}
    alone = subprocess.run(
        ["python3", "gpu_check.pyz", "--nvml", f"{nvml_dir}/libnvidia-ml.so.1",
         "--mps-control", str(REPO_ROOT / "testkit/fakes/nvidia-cuda-mps-control"), "--cuda", "none"],
        cwd=node_home, env=env, capture_output=True, text=True, timeout=600)
    assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-3000:]
    assert re.search(r"^7 +MPS daemons start and stop +PASS", alone.stdout, re.MULTILINE), alone.stdout[-3000:]
    assert (node_home / "gpu-check-report.json").is_file()
    report = tmp_path / "make" / "report.json"
    made = subprocess.run(["make", "gpu-check", f"GPU_CHECK_OUT={report}"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "FAKE": "1"})
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    rows = {row["id"]: row["status"] for row in json.loads(report.read_text())["checks"]}
    assert rows["1"] == "PASS" and rows["7"] == "PASS", rows
    assert "FAIL" not in rows.values(), rows


# ---- "The image": build for a real registry, and push ---------------------------------------------------------


def test_the_image_is_pushed_under_the_name_the_readme_installs(tmp_path):
    """The README builds ./Dockerfile as registry.example.com/gpufrac:0.2.0 and pushes it. `make image` builds that
    same Dockerfile with buildah (the README's other way) before the tests; building it again costs minutes on
    buildah's vfs store, so this takes that image, tags it with the README's name and runs the push: no registry
    is reachable here, so its destination is an OCI archive. The README's `helm install` (tests/e2e/test_docs.py)
    then runs that image name."""
    block = step("image")
    build, push = block.commands()
    name = "registry.example.com/gpufrac:0.2.0"
    assert build == f"docker build -t {name} ." and "buildah bud -t ... ." in block.body
    assert push == f"docker push {name}"
    helm_install = " ".join(blocks("README.md", "test")[0].body.split())
    repository, tag = name.rsplit(":", 1)
    assert f"--set image.repository={repository} --set image.tag={tag}" in helm_install
    assert "-f Dockerfile" in (REPO_ROOT / "e2e" / "build-image.sh").read_text()
    if not shutil.which("buildah") or buildah("inspect", "--type", "image", BASE_IMAGE).returncode != 0:
        unavailable(f"no {BASE_IMAGE} in {IMAGE_CACHE}: run `make image`")
    archive = tmp_path / "pushed.oci.tar"
    try:
        tagged = buildah("tag", BASE_IMAGE, name)
        assert tagged.returncode == 0, tagged.stderr
        pushed = buildah("push", "-q", name, f"oci-archive:{archive}:{name}")
        assert pushed.returncode == 0, pushed.stderr
    finally:
        buildah("untag", name)  # the image stays, under make image's own name
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        (manifest_ref,) = index["manifests"]
        assert manifest_ref["annotations"]["org.opencontainers.image.ref.name"] == name
        manifest = json.load(tar.extractfile("blobs/" + manifest_ref["digest"].replace(":", "/")))  # type: ignore[arg-type]
        config = json.load(tar.extractfile("blobs/" + manifest["config"]["digest"].replace(":", "/")))  # type: ignore[arg-type]
    assert config["config"]["Entrypoint"] == ["gpufrac"]
    assert config["config"]["User"] == "65532:65532"


# ---- make targets the docs name in their text (not in a block) ---------------------------------------------------


def make(target: str) -> str:
    done = subprocess.run(["make", target], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"make {target}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def test_the_api_only_cluster_demo_and_agent_demo_the_readme_names_run():
    """docs/development.md: "`make cluster-up-api` keeps the fast API-only control plane ...; `make demo-api` runs
    the admission demo on it. Kubeconfigs: `alice` (`.e2e/kubeconfig`, namespace `team-a`) ...", and docs/agent.md:
    "Try it without a GPU: `make agent-demo`". They use the checkout's own .e2e (the tests' clusters live in
    .e2e/pytest-<pid>)."""
    state = REPO_ROOT / ".e2e" / "state.json"
    assert not state.exists(), "a cluster of `make cluster-up` is up in this checkout: `make cluster-down` first"
    up = make("cluster-up-api")
    try:
        assert "cold start:" in up and state.exists()
        kubectl = find_kubectl()
        assert kubectl, "kubectl from the virtualenv"
        alice = subprocess.run([kubectl, "--kubeconfig", str(REPO_ROOT / ".e2e/kubeconfig"), "auth", "whoami",
                                "-o", "jsonpath={.status.userInfo.username}"],
                               capture_output=True, text=True, timeout=60)
        assert alice.returncode == 0 and alice.stdout == "alice", alice.stderr
    finally:
        down = make("cluster-down")
    assert "stopped" in down and not state.exists()
    demo = make("demo-api")
    assert "DENIED" in demo and "== tearing down" in demo, demo[-3000:]
    assert not state.exists()
    agent = make("agent-demo")
    assert "time-slicing daemon received quit: True" in agent and "sm-sharing daemon received quit: True" in agent
    assert "node condition now Unknown AgentStopped" in agent, agent[-3000:]
