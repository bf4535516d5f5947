#!/usr/bin/env bash
# Builds NVIDIA's own node components from the Go module proxy, once, into the tools cache (beside the Kubernetes
# tools of build-tools.sh). Reruns find the binaries and return at once; nothing here is committed.
#   nvidia-ctk, nvidia-cdi-hook, nvidia-container-runtime, nvidia-container-runtime-hook
#                          github.com/NVIDIA/nvidia-container-toolkit (CDI spec generation, the runtime and its hooks)
#   nvidia-device-plugin   github.com/NVIDIA/k8s-device-plugin (allocates nvidia.com/gpu to the kubelet)
# Both load libnvidia-ml.so.1 with dlopen (cgo): against testkit/fakes' fake NVML on the harness's node.
set -euo pipefail

TOOLKIT_VERSION=${NVIDIA_TOOLKIT_VERSION:-v1.20.2}
DEVICE_PLUGIN_VERSION=${NVIDIA_DEVICE_PLUGIN_VERSION:-v0.18.0}
CACHE=${GPUFRAC_TOOLS_CACHE:-$HOME/.cache/gpufrac/tools}
BIN=$CACHE/bin
mkdir -p "$BIN"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

TOOLKIT_MODULE=github.com/NVIDIA/nvidia-container-toolkit
DEVICE_PLUGIN_MODULE=github.com/NVIDIA/k8s-device-plugin
TOOLKIT_COMMANDS="nvidia-ctk nvidia-cdi-hook nvidia-container-runtime nvidia-container-runtime-hook"

log() { echo "[build-nvidia] $*" >&2; }

all_built() {
  local c
  for c in $TOOLKIT_COMMANDS; do [[ -x $BIN/$c-$TOOLKIT_VERSION ]] || return 1; done
  [[ -x $BIN/nvidia-device-plugin-$DEVICE_PLUGIN_VERSION ]]
}

link_all() {
  local c
  # nvidia-ctk looks nvidia-cdi-hook up on PATH and writes that path into the specs' hooks: the harness puts $BIN
  # first on its PATH, so the unversioned names are what it finds.
  for c in $TOOLKIT_COMMANDS; do ln -sf "$c-$TOOLKIT_VERSION" "$BIN/$c"; done
  ln -sf "nvidia-device-plugin-$DEVICE_PLUGIN_VERSION" "$BIN/nvidia-device-plugin"
}

if all_built; then
  link_all
  echo "$BIN"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  log "Go is needed to build NVIDIA's container toolkit $TOOLKIT_VERSION and device plugin $DEVICE_PLUGIN_VERSION"
  log "(GOTOOLCHAIN=local is set, so an older Go fails instead of downloading a toolchain). Install Go, or copy"
  log " the binaries to $BIN."
  exit 1
fi
if ! command -v "${CC:-cc}" >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
  log "a C compiler is needed (go-nvml, which both components use, is cgo): install gcc"
  exit 1
fi
# One build at a time per cache (a lock of its own: it may run beside build-tools.sh); a second run waits, then
# finds the binaries.
exec 9>"$CACHE/.build-nvidia.lock"
if ! flock -n 9; then
  log "another build-nvidia.sh is running; waiting for it"
  flock 9
fi

# Reads `go build -v` (one line per package compiled) and prints every tenth percent of <total>, and errors. go-nvml's
# cgo prints a deprecation warning per deprecated NVML call it wraps: noise, dropped.
progress() {
  awk -v total="$2" -v name="$1" '
    /deprecated|declared here|^cgo-gcc-prolog|^# github.com\/NVIDIA\/go-nvml/ { next }
    /^[^ :#]+$/ { n++; p = int(100 * n / total); if (p > 100) p = 100
      if (p >= due) { printf "[build-nvidia] %s: %d/%d packages compiled (%d%%)\n", name, n, total, p > "/dev/stderr"; due = p + 10 }
      next }
    { print > "/dev/stderr" }'
}

# The toolkit's four commands from one throwaway module, in one `go build` (they share most packages).
build_toolkit() {
  local c missing=
  for c in $TOOLKIT_COMMANDS; do [[ -x $BIN/$c-$TOOLKIT_VERSION ]] || missing=1; done
  [[ -z $missing ]] && return 0
  local work=$CACHE/src/nvidia-container-toolkit-$TOOLKIT_VERSION pkgs=() total start=$SECONDS
  for c in $TOOLKIT_COMMANDS; do pkgs+=("$TOOLKIT_MODULE/cmd/$c"); done
  rm -rf "$work"; mkdir -p "$work/out"; cd "$work"
  go mod init example.invalid/nvidia-toolkit-build >/dev/null 2>&1
  # Each command's packages, so that go.sum covers everything they import.
  go get "${pkgs[@]/%/@$TOOLKIT_VERSION}" >/dev/null 2>&1 || go get "${pkgs[@]/%/@$TOOLKIT_VERSION}"
  total=$(go list -deps -f '{{if not .Standard}}x{{end}}' "${pkgs[@]}" | grep -c x)
  log "building NVIDIA container toolkit $TOOLKIT_VERSION: $TOOLKIT_COMMANDS ($total packages, cgo, once)"
  # The toolkit's release build stamps its version the same way (internal/info).
  CGO_ENABLED=1 go build -v -o "$work/out/" \
    -ldflags "-s -w -X $TOOLKIT_MODULE/internal/info.version=${TOOLKIT_VERSION#v}" \
    "${pkgs[@]}" 2>&1 | progress nvidia-container-toolkit "$total"
  for c in $TOOLKIT_COMMANDS; do
    [[ -x $work/out/$c ]] || { log "building the container toolkit failed ($c missing)"; exit 1; }
    mv "$work/out/$c" "$BIN/$c-$TOOLKIT_VERSION"
  done
  log "built NVIDIA container toolkit $TOOLKIT_VERSION in $((SECONDS - start)) s"
}

# The proxy serves v0.18.0 but lists no versions of the module, so `go install …@version` fails on its deprecation
# lookup: require it from a throwaway module and let -mod=mod resolve the rest.
build_device_plugin() {
  local out=$BIN/nvidia-device-plugin-$DEVICE_PLUGIN_VERSION
  [[ -x $out ]] && return 0
  local work=$CACHE/src/k8s-device-plugin-$DEVICE_PLUGIN_VERSION pkg=$DEVICE_PLUGIN_MODULE/cmd/nvidia-device-plugin
  local total start=$SECONDS
  rm -rf "$work"; mkdir -p "$work"; cd "$work"
  go mod init example.invalid/nvidia-device-plugin-build >/dev/null 2>&1
  go mod edit -require="$DEVICE_PLUGIN_MODULE@$DEVICE_PLUGIN_VERSION"
  total=$(GOFLAGS="$GOFLAGS -mod=mod" go list -deps -f '{{if not .Standard}}x{{end}}' "$pkg" | grep -c x)
  log "building NVIDIA device plugin $DEVICE_PLUGIN_VERSION ($total packages, cgo, once)"
  rm -f "$out.tmp"
  CGO_ENABLED=1 GOFLAGS="$GOFLAGS -mod=mod" go build -v -o "$out.tmp" \
    -ldflags "-s -w -X $DEVICE_PLUGIN_MODULE/internal/info.version=$DEVICE_PLUGIN_VERSION" \
    "$pkg" 2>&1 | progress nvidia-device-plugin "$total"
  [[ -x $out.tmp ]] || { log "building the device plugin failed"; exit 1; }
  mv "$out.tmp" "$out"
  log "built NVIDIA device plugin $DEVICE_PLUGIN_VERSION in $((SECONDS - start)) s"
}

build_toolkit
build_device_plugin
link_all
log "NVIDIA components ready in $BIN"
echo "$BIN"
