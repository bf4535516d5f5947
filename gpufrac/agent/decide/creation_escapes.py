"""Escapes the NRI plugin closes when the runtime creates a container (docs/security.md, rows 4 and 8). Pure.

- An sm-sharing fraction whose MPS pipe directory is not in the container: CUDA finds no control socket there and,
  in the GPU's DEFAULT compute mode, runs the process as an ordinary CUDA client with the whole GPU and no MPS
  limit. Its `CUDA_MPS_PIPE_DIRECTORY` must be a mount of the container (the webhook's CSI or hostPath volume).
- An env name the plugin edits, written twice: the runtime keeps both entries (an image's `ENV` and the pod's
  `env`), and NRI's env edit replaces the first and writes the second back, so a `void` would be followed by the
  grant it was meant to cancel. Refused rather than edited.
- A fraction's env carrying a name gpufrac owns that gpufrac did not set for it (`envFrom` a ConfigMap or Secret,
  or the image: the webhook cannot read either), a `CUDA_VISIBLE_DEVICES` naming a GPU by a UUID it was not given:
  refused (row 1 and 8). (A `gpus.devices` entry naming every GPU, `nvidia.com/gpu=all`, does not read as a fraction
  at all: core.annotations.parse_devices takes one GPU per entry, so the plugin refuses it as unreadable.)
- A legacy CUDA image (`CUDA_VERSION` set, no `NVIDIA_VISIBLE_DEVICES`), which NVIDIA's runtime reads as asking for
  every GPU: refused rather than blanked, so its owner sees why and says `void` (or asks for a GPU) in the pod.
- A fraction whose user is not the one its mode's MPS daemon serves now (row 5): a daemon without `-m` (time-slicing,
  and sm-sharing on a pre-r615 driver) runs one server at a time, as the UID of its first client, and holds the
  clients of any other UID until every client of that one has exited. Refused, naming both, where the runtime tells
  the container's user (containerd 2: NRI's `user`); a multi-user daemon serves every UID.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from gpufrac.core.annotations import ComputeMode
from gpufrac.core.contract import LIMIT_ENV_PREFIXES, LimitEnv, is_gpu_uuid

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
LEGACY_IMAGE_ENV = "CUDA_VERSION"  # set by NVIDIA's CUDA base images; with no NVIDIA_VISIBLE_DEVICES: every GPU


def pipe_dir_problem(mode: ComputeMode, env: Mapping[str, str], mounts: Sequence[str]) -> str | None:
    """Why an sm-sharing fraction would run outside its MPS daemon (None: its pipe directory is a mount).

    `mounts` are the container's mount destinations; a runtime always reports some (`/proc` at least), so an empty
    list is a caller that did not say, not a container without mounts, and is not judged here. The webhook mounts
    the directory at exactly that path (CSI and hostPath delivery alike); a volume above it (an emptyDir at
    /run) would hold no daemon's socket, so only the path itself counts."""
    if mode is not ComputeMode.SM_SHARING or not mounts:
        return None
    pipe = env.get(LimitEnv.PIPE_DIRECTORY)
    if pipe is None or not pipe.strip():
        return f"it has no {LimitEnv.PIPE_DIRECTORY}"
    wanted = posixpath.normpath(pipe.strip())
    if any(posixpath.normpath(m) == wanted for m in mounts if m):
        return None
    return (f"its {LimitEnv.PIPE_DIRECTORY}={pipe} is not a mount of the container (mounts: "
            f"{', '.join(sorted(mounts))})")


def duplicated(entries: Iterable[str], names: Iterable[str]) -> list[str]:
    """Which of `names` the container's env (`K=V` strings as the runtime holds them) carries more than once."""
    counts = Counter(entry.partition("=")[0] for entry in entries)
    return sorted({name for name in names if counts[name] > 1})


def legacy_cuda_image(env: Mapping[str, str]) -> bool:
    """NVIDIA's runtime gives this container every GPU when it honours env: a CUDA image that names none."""
    return LEGACY_IMAGE_ENV in env and LimitEnv.VISIBLE_DEVICES not in env


def foreign_owned_env(env: Mapping[str, str], expected: Iterable[str]) -> list[str]:
    """Names under gpufrac's prefixes (CUDA_MPS_*, NVIDIA_GPU_MEMORY_*) in a fraction's env that gpufrac did not
    set for it: `NVIDIA_GPU_MEMORY_LIMITS` (the toolkit hook reads the plural too), a thread percentage on a
    time-slicing fraction, an MPS client priority. The webhook replaces its own names in `env`; these came from
    elsewhere (`envFrom`, the image)."""
    wanted = set(expected)
    # empty: a webhook fieldRef on an annotation not written yet (the kubelet resolves it to ""), which asks nothing
    return sorted(name for name, value in env.items()
                  if name.startswith(LIMIT_ENV_PREFIXES) and name not in wanted and value.strip())


def foreign_visible_gpus(env: Mapping[str, str], gpus: Iterable[str]) -> list[str]:
    """The GPUs a `CUDA_VISIBLE_DEVICES` names by UUID that the container was not given (indexes narrow its own view:
    the daemon side and the UUID-keyed env hold that, row 3)."""
    given = set(gpus)
    named = (entry.strip() for entry in env.get(CUDA_VISIBLE_DEVICES, "").split(","))
    return sorted({entry for entry in named if is_gpu_uuid(entry) and entry not in given})



def mps_user_conflict(uid: int | None, served: Iterable[tuple[int | None, str]]) -> str | None:
    """Who holds a single-user MPS daemon for another UID than `uid` (`served`: each live fraction of the mode, as
    its UID and a description), None when no one does or a UID is not known."""
    if uid is None:
        return None
    return next((f"UID {other} ({who})" for other, who in served if other is not None and other != uid), None)
