#!/usr/bin/env bash
# `make image`: builds the top-level Dockerfile on this machine with no registry at all, plus the two small
# images the local cluster needs, as OCI archives that `ctr images import` takes:
#   gpufrac.oci.tar   the gpufrac image (every component), from ./Dockerfile
#   app.oci.tar       the tests' stand-in for the seed examples' CUDA base image: busybox (Debian's static one)
#                     with that image's env, which NVIDIA's runtime reads (NVIDIA_VISIBLE_DEVICES=all, CUDA_VERSION)
#   pause.oci.tar     the pod sandbox image: catatonit -P (Debian's static init, waits for SIGTERM, reaps)
#   nvidia-device-plugin.oci.tar
#                     NVIDIA's device plugin image as its deployments/container/Dockerfile makes it (the binary
#                     e2e/build-nvidia.sh built, busybox, the image's ENV), on the Debian base below
# The Dockerfile's base (a slim Python 3.11 on bookworm) cannot be pulled here: it is made once from Debian's
# packages with mmdebstrap and imported into buildah under the base's own name; Python packages come from PyPI
# during the build. mmdebstrap, buildah, busybox-static and catatonit are Debian packages, installed when
# missing. Caches live outside the repository ($GPUFRAC_IMAGE_CACHE, default ~/.cache/gpufrac/images).
#   build-image.sh prune   only drops the build cache's stale layers (see prune_layers), for builds made outside
#                          this script on the same store (the clean-clone test)
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${GPUFRAC_IMAGE_OUT:-.e2e/images}
CACHE=${GPUFRAC_IMAGE_CACHE:-$HOME/.cache/gpufrac/images}
BASE=docker.io/library/python:3.11-slim-bookworm
IMAGE=${GPUFRAC_IMAGE:-localhost/gpufrac:dev}
APP_IMAGE=nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04
PAUSE_IMAGE=localhost/gpufrac-e2e/pause:catatonit
DEVICE_PLUGIN_IMAGE=nvcr.io/nvidia/k8s-device-plugin:v0.18.0
mkdir -p "$OUT" "$CACHE"

log() { echo "[build-image] $*" >&2; }

missing=()
for pair in mmdebstrap:mmdebstrap buildah:buildah busybox-static:/bin/busybox catatonit:/usr/bin/catatonit; do
  command -v "${pair#*:}" >/dev/null 2>&1 || missing+=("${pair%%:*}")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# One buildah store for these builds, in the cache; vfs works on any filesystem, chroot isolation needs no runc.
bah() { buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs "$@"; }
exec 9>"$CACHE/.lock"
flock 9

# buildah --layers keeps every step's image, and under vfs each is a whole copy of the file system (~450 MB): a
# few dozen builds grew this store to 52 GB, and a CI disk came near the test kubelet's DiskPressure floor. Keep
# the layers the last `make image` built or reused (the next build reuses its dependency layers; their ids are in
# $KEEP) and drop every other untagged image, and the working containers a killed build left.
KEEP=$CACHE/layer-cache.ids
prune_layers() {
  local id
  bah rm --all >/dev/null 2>&1 || true
  bah images --filter dangling=true --no-trunc --format '{{.ID}}' | sed 's/^sha256://' | while read -r id; do
    grep -qx "${id:0:11}" "$KEEP" 2>/dev/null || bah rmi "$id" >/dev/null 2>&1 || true
  done
}
if [[ ${1:-} == prune ]]; then
  prune_layers
  exit 0
fi

has_image() { bah inspect --type image "$1" >/dev/null 2>&1; }

if ! has_image "$BASE"; then
  rootfs=$CACHE/bookworm-python.tar
  if [[ ! -s $rootfs ]]; then
    log "making the base $BASE from Debian bookworm packages (mmdebstrap, a few minutes, once)"
    mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      bookworm "$CACHE/bookworm-python.partial.tar" http://deb.debian.org/debian >&2
    mv "$CACHE/bookworm-python.partial.tar" "$rootfs"
  fi
  log "importing the base into buildah as $BASE"
  ctr=$(bah from scratch)
  bah add "$ctr" "$rootfs" / >/dev/null
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 "$ctr"
  bah commit -q "$ctr" "$BASE" >/dev/null
  bah rm "$ctr" >/dev/null
fi

log "building $IMAGE from ./Dockerfile"
# The host's CA bundle for pip reaches the build when it has one (a TLS-inspecting proxy in front of PyPI).
build_args=()
pip_ca=${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}
[[ -n $pip_ca && -s $pip_ca ]] && build_args+=(--secret "id=pip-ca,src=$pip_ca")
# The Dockerfile pins its base by digest; the base made here has a digest of its own, so it goes by name.
build_args+=(--build-arg "BASE=$BASE" --build-arg "REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)")
build_log=$CACHE/last-build.log
if ! bah bud --isolation chroot --pull=never --layers "${build_args[@]}" -f Dockerfile -t "$IMAGE" . \
    >"$build_log" 2>&1; then
  tail -n 40 "$build_log" >&2
  log "the build of $IMAGE failed (the whole log: $build_log)"
  exit 1
fi
# Each step's image is printed as '--> <id>' or '--> Using cache <id>'.
sed -nE 's/^--> (Using cache )?([0-9a-f]{11}).*/\2/p' "$build_log" | sort -u >"$KEEP"
prune_layers
rm -f "$OUT/gpufrac.oci.tar"
bah push -q "$IMAGE" "oci-archive:$OUT/gpufrac.oci.tar:$IMAGE" >&2

# A static binary in an empty image, named `name`, with `config` for buildah config. The recipe (the config
# function's text) is kept as a label: an image an older recipe made is made again.
static_image() {
  local name=$1 out=$2 binary=$3; shift 3
  binary_image scratch "$name" "$out" "$binary" "/bin/$(basename "$binary")" "" "$@"
}

# `binary` at `dest` in an image made from `from`; `extra` goes into the recipe (a binary's digest: a new build of
# it makes the image again).
binary_image() {
  local from=$1 name=$2 out=$3 binary=$4 dest=$5 extra=$6; shift 6
  local recipe
  recipe=$({ declare -f "$1"; printf %s "$extra"; } | sha256sum | cut -c1-16)
  if has_image "$name" && [[ $(bah inspect --type image --format '{{index .OCIv1.Config.Labels "io.gpufrac.recipe"}}' \
      "$name" 2>/dev/null) != "$recipe" ]]; then
    log "$name was made by an older recipe: making it again"
    bah rmi "$name" >/dev/null
    rm -f "$out"
  fi
  if ! has_image "$name"; then
    log "making $name from $binary"
    local ctr
    ctr=$(bah from --pull=never "$from")
    bah copy "$ctr" "$binary" "$dest" >/dev/null
    "$@" "$ctr"
    bah config --label "io.gpufrac.recipe=$recipe" "$ctr"
    bah commit -q "$ctr" "$name" >/dev/null
    bah rm "$ctr" >/dev/null
  fi
  [[ -s $out ]] || bah push -q "$name" "oci-archive:$out:$name" >&2
}

app_config() {
  # busybox answers to the name it is called by: the usual commands as links to it.
  local ctr=$1 mnt
  mnt=$(bah mount "$ctr")
  for cmd in sh sleep cat ls env echo id ps grep test true; do ln -sf busybox "$mnt/bin/$cmd"; done
  mkdir -p "$mnt/tmp" "$mnt/proc" "$mnt/sys" "$mnt/dev" "$mnt/etc"
  echo "root:x:0:0:root:/:/bin/sh" > "$mnt/etc/passwd"
  bah umount "$ctr" >/dev/null
  # The env of NVIDIA's nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04, which NVIDIA's runtime acts on: every GPU
  # asked for (NVIDIA_VISIBLE_DEVICES=all; CUDA_VERSION alone marks a legacy CUDA image, which gets all GPUs too)
  # unless someone voids it, and the driver capabilities and CUDA requirement the image declares.
  bah config --env PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/bin \
    --env LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64 \
    --env NVARCH=x86_64 --env CUDA_VERSION=13.0.2 --env 'NVIDIA_REQUIRE_CUDA=cuda>=13.0' \
    --env NVIDIA_VISIBLE_DEVICES=all --env NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    --cmd /bin/sh "$ctr"
}
pause_config() { bah config --entrypoint '["/bin/catatonit", "-P"]' --cmd '' "$1"; }

# NVIDIA's deployments/container/Dockerfile (k8s-device-plugin v0.18): the plugin at /usr/bin, busybox on PATH as
# the image's shell, the image's own env (every GPU asked for, as NVIDIA's runtime reads it) and its entrypoint. On
# the Debian base above instead of NVIDIA's distroless one: the binary is linked against glibc.
device_plugin_config() {
  local ctr=$1 mnt
  mnt=$(bah mount "$ctr")
  mkdir -p "$mnt/busybox"
  cp /bin/busybox "$mnt/busybox/busybox"
  for cmd in sh ls cat env grep sleep; do ln -sf busybox "$mnt/busybox/$cmd"; done
  bah umount "$ctr" >/dev/null
  bah config --cmd '' "$ctr"  # the base's `python3` first: no argument to the entrypoint
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox \
    --env NVIDIA_DISABLE_REQUIRE=true --env NVIDIA_VISIBLE_DEVICES=all \
    --env NVIDIA_DRIVER_CAPABILITIES=compute,utility --entrypoint '["nvidia-device-plugin"]' \
    --label 'io.k8s.display-name=NVIDIA Device Plugin' "$ctr"
}
device_plugin=$(bash e2e/build-nvidia.sh)/nvidia-device-plugin  # the cache's binary (built once, if missing)

static_image "$APP_IMAGE" "$OUT/app.oci.tar" /bin/busybox app_config
static_image "$PAUSE_IMAGE" "$OUT/pause.oci.tar" /usr/bin/catatonit pause_config
binary_image "$BASE" "$DEVICE_PLUGIN_IMAGE" "$OUT/nvidia-device-plugin.oci.tar" "$device_plugin" \
  /usr/bin/nvidia-device-plugin "$(sha256sum "$(readlink -f "$device_plugin")" | cut -c1-16)" device_plugin_config
log "images in $OUT: gpufrac.oci.tar ($IMAGE), app.oci.tar ($APP_IMAGE), pause.oci.tar ($PAUSE_IMAGE)," \
  "nvidia-device-plugin.oci.tar ($DEVICE_PLUGIN_IMAGE)"
