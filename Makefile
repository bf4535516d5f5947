# gpufrac: `make run` starts the webhook with fresh dev certificates, `make test` runs every test.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BIND ?= 127.0.0.1:8443
CERTS ?= certs/dev
TOOLS_CACHE ?= $(HOME)/.cache/gpufrac/tools
export GPUFRAC_TOOLS_CACHE := $(TOOLS_CACHE)
# The Kubernetes version of the control plane and the real node: 1.37.2, or 1.36.3 (`make test-api KUBE_VERSION=1.36.3`,
# `make cluster-up KUBE_VERSION=1.36.3`); each version's binaries are cached side by side (e2e/toolkit/tools.py).
KUBE_VERSION ?= 1.37.2
export KUBE_VERSION

.PHONY: venv run certs test unit lint tools clean stubs

# Two stamps: `make run` installs what the programs need; `make test` and `make lint` add the test tools.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $@

# The gRPC stubs (CSI, kubelet plugin registration) and NRI's messages with ttrpc's envelope (the agent's NRI
# plugin), generated from the protos vendored in proto/ (no Go needed; `bash hack/grpc-stubs.sh vendor` refreshes
# proto/ from the Go module proxy). Never committed.
STUBS := gpufrac/agent/csi/generated/__init__.py gpufrac/agent/dra/generated/__init__.py \
	gpufrac/agent/kubelet_plugin/generated/__init__.py gpufrac/agent/nri/generated/__init__.py
$(STUBS) &: hack/grpc-stubs.sh $(shell find proto -type f 2>/dev/null) $(VENV)/.installed-test
	PYTHON=$(PY) bash hack/grpc-stubs.sh generate

stubs: $(STUBS)

venv: $(VENV)/.installed-test $(STUBS)

certs: $(VENV)/.installed
	$(PY) -m gpufrac certs --out $(CERTS) --dns gpufrac-webhook.gpufrac-system.svc

run: certs
	$(PY) -m gpufrac webhook --certs $(CERTS) --bind $(BIND)

# The control plane (kube-apiserver, etcd, helm) and the real node (kubelet, kube-controller-manager,
# kube-scheduler, kube-proxy, containerd 2 with its shim and ctr, runc), and NVIDIA's node components (container
# toolkit, device plugin), built once from the Go module proxy into $(TOOLS_CACHE).
tools:
	bash e2e/build-tools.sh node
	bash e2e/build-nvidia.sh

# The gpufrac image from ./Dockerfile (and the local cluster's app, pause and NVIDIA device plugin images) as OCI
# archives in .e2e/images, built with buildah on a base made from Debian packages: no registry involved. See
# e2e/build-image.sh.
# Built again only when what goes into it changed (`make cluster-up` and `make demo` after `make image` reuse it).
IMAGES := .e2e/images/gpufrac.oci.tar .e2e/images/app.oci.tar .e2e/images/pause.oci.tar \
	.e2e/images/nvidia-device-plugin.oci.tar
IMAGE_INPUTS := Dockerfile .dockerignore constraints.txt pyproject.toml README.md LICENSE e2e/build-image.sh \
	hack/grpc-stubs.sh hack/sbom.py $(shell find proto -type f 2>/dev/null) \
	$(shell find gpufrac -type f -not -name '*.pyc' -not -path 'gpufrac/agent/*/generated/*' 2>/dev/null)
image: $(IMAGES)

$(IMAGES) &: $(IMAGE_INPUTS)
	bash e2e/build-image.sh
	touch $(IMAGES)

# The versions the image and the virtualenv install (-c constraints.txt): what the tests ran with.
constraints: venv
	{ sed -n '1,2p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -v '^gpufrac'; } > constraints.tmp
	mv constraints.tmp constraints.txt

# ruff (with C901 at 15; at 10 in gpufrac/ and bench/), the layering contracts (.importlinter; .importlinter-tests:
# how tests, testkit, e2e, bench and gpufrac depend on each other), no import circle anywhere in the repo (the same two
# configurations: acyclic_siblings at every depth, the layers between the root packages, hack/package_cycles.py for a
# package's __init__ and its own modules), the types (mypy, strict: pyproject.toml), and no file above 500 lines in
# gpufrac/ and gpucheck/ (hack/file_lines.py).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff check --select C901 --config 'lint.mccabe.max-complexity = 10' gpufrac bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/lint-imports .importlinter-tests
	$(VENV)/bin/mypy
	$(PY) hack/file_lines.py --max 500 gpufrac gpucheck

unit: venv
	$(PY) -m pytest -q -m 'not e2e'

# Mutation testing of the guarantee: mutmut ([tool.mutmut] in pyproject.toml) over the pure decisions behind reclaim,
# who is owed, attribution, gangs, usable memory and the over-limit action, against the tests that cover them; then
# the hand-made mutations of the edges that act on them (hack/hand_mutations.py). Fails on any surviving mutant (a
# timeout is a mutant caught looping for ever); docs/operations.md says what was found. About 3 min on 2 cores.
mutation: venv
	rm -rf mutants
	$(VENV)/bin/mutmut run --max-children 2
	@! $(VENV)/bin/mutmut results | grep -v ': timeout$$' | grep . || { echo "mutmut: surviving mutants above"; exit 1; }
	$(PY) hack/hand_mutations.py

test: venv tools image lint
	$(PY) -m pytest -q

# The API-server suites (admission through the webhook and the policies, denials, the binder's updates, Pod Security,
# the DRA driver against the resource API) on the control plane of KUBE_VERSION alone: CI runs them on 1.36.3 beside
# `make test` on the default. Builds only that version's kube-apiserver (etcd and helm are shared).
API_SUITES := tests/e2e/test_admission_paths.py tests/e2e/test_admission_policies.py tests/e2e/test_denials.py \
	tests/e2e/test_bind_and_updates.py tests/e2e/test_pod_security.py tests/agent/test_dra_driver.py
.PHONY: test-api
test-api: venv
	bash e2e/build-tools.sh
	$(PY) -m pytest -q $(API_SUITES)

clean:
	rm -rf $(VENV) .e2e certs/dev .build gpufrac/agent/csi/generated gpufrac/agent/dra/generated gpufrac/agent/nri/generated gpufrac/agent/kubelet_plugin/generated

# A real one-node cluster (e2e/node.py): etcd, kube-apiserver, containerd 2 + runc + CNI bridge, kubelet,
# controller-manager, scheduler, kube-proxy; then `helm install ... -f charts/gpufrac/values-local.yaml`.
# cluster-up-api: the API-only control plane (etcd + kube-apiserver + the webhook on the host, pods never run).
.PHONY: cluster-up cluster-up-api cluster-down demo image constraints
cluster-up: venv tools image
	$(PY) -m e2e up

cluster-up-api: venv
	bash e2e/build-tools.sh
	$(PY) -m e2e up --api-only

cluster-down:
	@if [ -x $(PY) ]; then $(PY) -m e2e down; else python3 -m e2e down; fi

demo: venv tools image
	$(PY) -m e2e demo

demo-api: venv tools
	$(PY) -m e2e demo --api-only

.PHONY: agent-demo
# The node agent on fake GPUs (testkit/fakes) against a local control plane: node labels, events, metrics.
agent-demo: venv tools
	$(PY) -m e2e.agent_demo

# Benchmarks (bench/): gpufrac beside a do-nothing webhook, through kube-apiserver, in process, the agent, and
# container creation with the agent's NRI plugin and without (containerd 2 alone, as root).
# Prints one Markdown report and writes it to bench/results.md. QUICK=1: the short run (about 3 minutes).
.PHONY: bench
bench: venv tools
	$(PY) -m bench $(if $(QUICK),--quick,)

# Hardening (tests/hardening): property tests with 10,000 examples each, and a soak under load and faults.
.PHONY: fuzz soak
fuzz: venv
	GPUFRAC_FUZZ_EXAMPLES=$${GPUFRAC_FUZZ_EXAMPLES:-10000} $(PY) -m pytest -q -p no:cacheprovider --timeout 7200 \
		--hypothesis-show-statistics tests/hardening/test_properties.py

soak: venv
	$(PY) -m e2e.hardening.soak --seconds $${SOAK_SECONDS:-60}
	GPUFRAC_LOAD_SECONDS=$${SOAK_SECONDS:-60} $(PY) -m pytest -q -p no:cacheprovider tests/hardening/test_load.py

# The hardware check (the package gpucheck/; docs/gpu-check.md), built into the one file a person copies to a GPU
# node: $(GPU_CHECK_PYZ), a zipapp (`make gpu-check-pyz`, gpucheck/build.py). `make gpu-check` builds it and runs it:
# on a GPU node (/dev/nvidiactl) the real checks; elsewhere, or with FAKE=1, against the fakes the tests use (the fake
# NVML and the fake nvidia-cuda-mps-control; no CUDA, so the CUDA checks say SKIPPED), still ending with the table.
# GPU_CHECK_FLAGS go to the check (e.g. GPU_CHECK_FLAGS='--only 2,4'). Needs no venv: python3 and its stdlib.
GPU_CHECK_OUT ?= .e2e/gpu-check/report.json
GPU_CHECK_PYZ ?= .e2e/gpu-check/gpu_check.pyz
.PHONY: gpu-check gpu-check-pyz
gpu-check-pyz:
	@$(PYTHON) -m gpucheck.build --out $(GPU_CHECK_PYZ)

gpu-check:
	@$(PYTHON) -m gpucheck.build --out $(GPU_CHECK_PYZ) > /dev/null
	@if [ -z "$(FAKE)" ] && [ -e /dev/nvidiactl ]; then \
		$(PYTHON) $(GPU_CHECK_PYZ) --out $(GPU_CHECK_OUT) $(GPU_CHECK_FLAGS); \
	else \
		echo "gpu-check: no GPU here (or FAKE=1): running against the fakes in testkit/fakes"; \
		nvml_dir=$$($(PYTHON) -m testkit.fakes.build) && \
		GPUFRAC_FAKE_NVML=testkit/fakes/gpu_check_node.json $(PYTHON) $(GPU_CHECK_PYZ) \
			--nvml $$nvml_dir/libnvidia-ml.so.1 --mps-control testkit/fakes/nvidia-cuda-mps-control \
			--out $(GPU_CHECK_OUT) $(GPU_CHECK_FLAGS); \
	fi
