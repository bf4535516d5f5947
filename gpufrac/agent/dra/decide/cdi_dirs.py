"""Whether the runtime reads the directory the DRA driver writes its claims' CDI specs to. Pure.

containerd resolves a claim's CDI device (`gpu.gpufrac.io/claim=<uid>-<device>`) only against its CRI
`cdi_spec_dirs`; a spec written anywhere else leaves every claim's container failing with `CDI device injection
failed: unresolvable CDI devices`, after the claim was allocated and prepared. The node says so on its condition
and refuses Prepare before any claim is placed on it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable


def cdi_dir_problem(written: str, runtime_dirs: Iterable[str]) -> str | None:
    """Why the runtime would not find the specs written to host directory `written` (None: it reads it)."""
    read = sorted({posixpath.normpath(d) for d in runtime_dirs if d})
    if posixpath.normpath(written) in read:
        return None
    return (f"the DRA driver writes claims' CDI specs to {written}, which the container runtime does not read (its "
            f"CDI spec directories: {', '.join(read) or 'none'}): set the chart's dra.cdiDir to one of them")
