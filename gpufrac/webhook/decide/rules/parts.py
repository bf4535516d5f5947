"""What several rules share: CEL parts (their containers, the MPS directories, who wrote which key), and the Python
twin of those the webhook's checks use too."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpufrac.core import annotations as ann
from gpufrac.core.contract import (
    FRACTIONAL_LABEL,
    NO_COMPUTE_CAP,
)
from gpufrac.webhook.decide.cel import lit
from gpufrac.webhook.decide.rules.values import (
    CPORTION,
    KAI,
    NV,
    compute_portion_problem,
    field_key,
)


def same_label(before: str, after: str) -> str:
    """CEL: the fractional label is the same in two label maps (absent in both, or equal)."""
    key = lit(FRACTIONAL_LABEL)
    return f"(({key} in {before}) == ({key} in {after}) && (!({key} in {before}) || {before}[{key}] == {after}[{key}]))"


def user_fraction_keys(annotations: Mapping[str, str]) -> dict[str, str]:
    """The fraction annotations users and the scheduler write (everything but the webhook's own)."""
    return {k: v for k, v in annotations.items() if ann.is_fraction_key(k) and not k.startswith(ann.GPUFRAC_DOMAIN)}


def user_keys(anns: str) -> str:
    """`user_fraction_keys` in CEL: the fraction annotations but the webhook's own, as a list of keys."""
    shorthand = " || ".join(f"k == {lit(s)}" for s in ann.SHORTHAND_KEYS)  # no list made per key
    return f"{anns}.filter(k, (k.startsWith({lit(NV)}) || k.startsWith({lit(KAI)}) || {shorthand}))"


def is_bind_only(key: str) -> bool:
    """Keys only the scheduler ever writes (devices, compute portion), whoever creates the pod."""
    return key.startswith(ann.NVIDIA_PREFIX) and key.endswith(tuple(f".{f}" for f in ann.BIND_ONLY_FIELDS))


def bind_only(k: str) -> str:
    """`is_bind_only` in CEL: keys only the scheduler ever writes."""
    ends = " || ".join(f"{k}.endsWith({lit('.' + f)})" for f in ann.BIND_ONLY_FIELDS)
    return f"({k}.startsWith({lit(NV)}) && ({ends}))"


def active_thread_percent(c: str) -> str:
    """`mutation._active_thread_percent` of an sm-sharing container: its compute portion as a floored percentage,
    at least 1; 100 (`NO_COMPUTE_CAP`) until the scheduler writes one."""
    v = f"variables.anns[{field_key(c, CPORTION)}]"
    percent = f"int(double({v}) * 100.0)"
    return (f"(({field_key(c, CPORTION)}) in variables.anns && {compute_portion_problem(v)} == '' ? "
            f"string({percent} < 1 ? 1 : {percent}) : {lit(str(NO_COMPUTE_CAP))})")


REGULAR = "(object.spec.containers + object.spec.?initContainers.orValue([]))"


EPHEMERAL = "object.spec.?ephemeralContainers.orValue([])"


def mode_dir(mode: str) -> str:
    """`contract.mps_pipe_dir` in CEL, from the setting mpsRoot."""
    return f"((variables.mpsRoot.endsWith('/') ? variables.mpsRoot : variables.mpsRoot + '/') + {lit(mode)})"


def per_container(check: Callable[[str, str], tuple[str, str]]) -> str:
    """`check(c, where)` (a CEL condition-and-message pair builder) over the regular and init containers, then the
    ephemeral ones, each list of messages in the pod's order."""
    return (f"{REGULAR}.filter(c, {check('c', 'false')[0]}).map(c, 'container ' + c.name + ': ' + "
            f"{check('c', 'false')[1]}) + {EPHEMERAL}.filter(c, {check('c', 'true')[0]})"
            f".map(c, 'ephemeral container ' + c.name + ': ' + {check('c', 'true')[1]})")


def is_fraction(c: str, ephemeral: str) -> str:
    return f"(!{ephemeral} && {c}.name in variables.fractional)"


CSI_USED = ": uses gpufrac's CSI driver "


CSI_WRITES = "; gpufrac writes the one volume each fractional container's mode needs (gpufrac-mps-<mode>)"


MPS_REACHED = ", the node's MPS directories; gpufrac mounts the right one into each fractional container"


GRANTS_SYS_ADMIN = ", which grants SYS_ADMIN and lets it leave the GPU fraction of its pod; remove it"
