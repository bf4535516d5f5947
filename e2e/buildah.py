"""buildah on the image store `make image` fills (e2e/build-image.sh), for the tests that tag or push its image."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from e2e.names import REPO_ROOT

IMAGE_CACHE = Path(os.environ.get("GPUFRAC_IMAGE_CACHE", Path.home() / ".cache/gpufrac/images"))
BASE_IMAGE = "localhost/gpufrac:dev"  # what `make image` builds from ./Dockerfile


def buildah(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """buildah on that store, under its lock (the timeout counts the wait for the lock too)."""
    argv = ["flock", str(IMAGE_CACHE / ".lock"), "buildah", "--root", str(IMAGE_CACHE / "storage"), "--runroot",
            str(IMAGE_CACHE / "run"), "--storage-driver", "vfs", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def prune_build_cache(timeout: float = 900) -> None:
    """Drop the untagged images a build left in the store, all but `make image`'s layer cache (under vfs each is a
    whole file system: a clean-clone build leaves ~4 GB)."""
    pruned = subprocess.run(["bash", str(REPO_ROOT / "e2e/build-image.sh"), "prune"], capture_output=True, text=True,
                            timeout=timeout)
    if pruned.returncode != 0:
        raise RuntimeError(f"build-image.sh prune failed: {pruned.stderr.strip()[-2000:]}")


def stray_images() -> set[str]:
    """Untagged images outside `make image`'s layer cache: what prune_build_cache drops (none once it ran)."""
    listed = buildah("images", "--filter", "dangling=true", "--no-trunc", "--format", "{{.ID}}")
    keep = IMAGE_CACHE / "layer-cache.ids"
    kept = set(keep.read_text().split()) if keep.is_file() else set()
    return {i for i in listed.stdout.split() if i.removeprefix("sha256:")[:11] not in kept}
