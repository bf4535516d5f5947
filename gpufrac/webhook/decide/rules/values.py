"""The CEL of each value rule: one function per annotation value, the denial text when the value is wrong
("" when fine), as the webhook's readers in `fractions.read` judge it; and how CEL names a key and its container."""

from __future__ import annotations

from collections.abc import Callable

from gpufrac.core import annotations as ann
from gpufrac.core.annotations import ComputeMode, Field
from gpufrac.core.contract import (
    MIB,
)
from gpufrac.core.quantity import DECIMAL_NUMBER_PATTERN
from gpufrac.webhook.decide import fractions as fr
from gpufrac.webhook.decide.cel import ann as a
from gpufrac.webhook.decide.cel import annotation_message, has_ann, lit, one, regex, str_list, when

MODES = [str(m) for m in ComputeMode]
NV, KAI, OURS = ann.NVIDIA_PREFIX, ann.KAI_PREFIX, ann.CANONICAL_PREFIX
REQ, LIM, MODE, DEV = Field.MEMORY_REQUEST, Field.MEMORY_LIMIT, Field.COMPUTE_MODE, Field.DEVICES
PORTION = fr.PORTION_LIMIT
CPORTION = Field.COMPUTE_PORTION
_BIG_EXPONENT = r"[eE]\+?[0-9]{3,}$"  # 1e300 and up: never in (0, 1), and too large for CEL's double()
_HAS_UNIT = r"(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])$"


def well_formed(prefix: str) -> str:
    suffixes = "|".join(s.replace(".", r"\.") for s in ann.key_suffixes()[prefix])
    return "^" + prefix.replace(".", r"\.") + ann.CONTAINER_NAME_PATTERN.strip("^$") + r"\.(" + suffixes + ")$"


def field_key(container: str, field: str) -> str:
    """CEL: the key of `field` (a Python string) for the container named by CEL expression `container`."""
    prefix = KAI if field == PORTION else NV
    return f"{lit(prefix)} + {container} + {lit('.' + field)}"


def container_of(key: str) -> str:
    """CEL: the container a well-formed per-container key names."""
    return (f"({key}.startsWith({lit(NV)}) ? {key}.substring({len(NV)}, {key}.indexOf('.', {len(NV)})) : "
            f"{key}.substring({len(KAI)}, {key}.indexOf('.', {len(KAI)})))")


def number_ok(v: str) -> str:
    """A decimal number CEL's double() reads as the webhook does (quantity.parse_decimal's grammar)."""
    return f"(size({v}) <= 64 && {v}.matches({regex(DECIMAL_NUMBER_PATTERN)}) && !{v}.matches({regex(_BIG_EXPONENT)}))"


def quantity_ok(v: str) -> str:
    return f"(size({v}) <= 64 && isQuantity({v}))"


def amount_problem(v: str) -> str:
    """`fractions.read_amount` in CEL: "" when fine."""
    q = f"quantity({v})"
    return (f"(!{quantity_ok(v)} ? {lit(fr.MEMORY_QUANTITY)} : "
            f"{q}.compareTo(quantity('0')) <= 0 ? {lit('must be greater than 0; use a quantity such as 40Gi')} : "
            f"{q}.isLessThan(quantity('1Mi')) ? "
            f"{lit('is below 1Mi, the smallest GPU memory gpufrac sets; use a quantity such as 40Gi')} : "
            f"{q}.isGreaterThan(quantity('1Ei')) ? "
            f"{lit('is larger than any GPU (at most 1Ei); use a quantity such as 40Gi')} : '')")


def amount_ok(v: str) -> str:
    q = f"quantity({v})"
    return (f"({quantity_ok(v)} && !{q}.isLessThan(quantity('1Mi')) && "
            f"!{q}.isGreaterThan(quantity('1Ei')))")


def mib_ceil(v: str) -> str:
    """`contract.mib_ceil` of a valid amount, in CEL (a non-whole number of bytes rounds up)."""
    q = f"quantity({v})"
    return (f"({q}.isInteger() ? ({q}.asInteger() + {MIB - 1}) / {MIB} : "
            f"int({q}.asApproximateFloat()) / {MIB} + 1)")


def mebibytes(n: str) -> str:
    """`quantity.mebibytes` (the canonical quantity of `<n>Mi`): the largest binary suffix that divides it."""
    out = f"string({n} / {1 << 40}) + 'Ei'"
    for power, suffix in ((30, "Pi"), (20, "Ti"), (10, "Gi"), (0, "Mi")):
        out = f"({n} % {1 << (power + 10)} != 0 ? string({n} / {1 << power}) + '{suffix}' : {out})"
    return out


def fraction_problem(v: str) -> str:
    """`fractions.read_fraction`; a number that is in (0, 1) only before binary64 rounding gets FRACTION_RANGE."""
    zero = ("is sent by KAI's scheduler to its binder with two decimals, as 0.00, and a portion of 0.00 is never "
            "bound; use 0.005 or more")
    return (f"(!{number_ok(v)} || !(double({v}) > 0.0 && double({v}) < 1.0) ? {lit(fr.FRACTION_RANGE)} : "
            f"double({v}) < 0.005 ? {lit(zero)} : '')")


def portion_limit_problem(v: str) -> str:
    """`fractions.read_portion_limit` without its last check (digits of the number written plainly)."""
    f = a(ann.FRACTION)
    bounds = (f"(variables.fractionOk ? {lit(f'must be greater than {ann.FRACTION} (')} + {f} + "
              f"{lit(') and less than 1')} : "
              f"{lit(f'must be a decimal number less than 1 and greater than {ann.FRACTION}')})")
    after_point = f"({v}.indexOf('.') < 0 ? 0 : size({v}) - {v}.indexOf('.') - 1)"
    return (f"(!{has_ann(ann.FRACTION)} ? {lit(f'can only be used together with the {ann.FRACTION} annotation')} : "
            f"!{number_ok(v)} || !variables.fractionOk || !(double({v}) > double({f}) && double({v}) < 1.0) "
            f"? {bounds} : {after_point} > {fr.PORTION_DIGITS} ? "
            f"{lit(f'must have at most {fr.PORTION_DIGITS} digits after the decimal point')} : '')")


def memory_mib_problem(v: str) -> str:
    big = (f"is more than {fr.MAX_MIB} MiB (1 EiB), the most gpufrac accepts for one device; use a whole number of "
           "MiB such as 20480")
    return (f"(!(size({v}) <= 64 && {v}.matches(r'^[0-9]+$')) || {v}.matches(r'^0+$') ? {lit(fr.WHOLE_MIB)} : "
            f"!{v}.matches(r'^0*[0-9]{{1,13}}$') || int({v}) > {fr.MAX_MIB} ? {lit(big)} : '')")


def memory_limit_problem(v: str) -> str:
    m = a(ann.MEMORY)
    return (f"(!{has_ann(ann.MEMORY)} ? {lit(f'can only be used together with the {ann.MEMORY} annotation')} : "
            f"!variables.memoryOk ? '' : "
            f"!({quantity_ok(v)} && {v}.matches({regex(_HAS_UNIT)})) ? "
            f"{lit('must be a memory quantity with a unit, such as 60Gi')} : "
            f"{amount_problem(v)} != '' ? {amount_problem(v)} : "
            f"quantity({v}).isLessThan(quantity(string(int({m})) + 'Mi')) ? "
            f"{lit(f'must not be smaller than {ann.MEMORY} (')} + string(int({m})) + ' MiB)' : '')")


def num_devices_problem(v: str) -> str:
    accepted = f"must be a whole number of devices from 1 to {fr.MAX_DEVICES}"
    big = (f"{accepted} (gpufrac sets one MPS memory limit per device, for at most {fr.MAX_DEVICES})")
    return (f"(!(size({v}) <= 64 && {v}.matches(r'^[+-]?[0-9]+$')) ? {lit(accepted)} : "
            f"!{v}.matches(r'^[+-]?0*[0-9]{{1,3}}$') ? ({v}.startsWith('-') ? {lit(accepted)} : {lit(big)}) : "
            f"int({v}) > {fr.MAX_DEVICES} ? {lit(big)} : int({v}) <= 0 ? {lit(accepted)} : '')")


def compute_portion_problem(v: str) -> str:
    """`fractions.read_compute_portion`."""
    return (f"(!{number_ok(v)} || !(double({v}) > 0.0 && double({v}) <= 1.0) ? "
            f"{lit(fr.COMPUTE_PORTION_RANGE)} : '')")


def mode_value_problem(v: str) -> str:
    return f"({v} in {str_list(MODES)} ? '' : {lit('must be ' + ' or '.join(MODES))})"


def devices_problem(v: str) -> str:
    listed = f"{v}.split(',').map(d, d.trim())"
    bad = f"{listed}.filter(d, !d.matches({regex(ann.DEVICE_ID_PATTERN)}))"
    twice = f"{listed}.exists(d, {listed}.filter(e, e == d).size() > 1)"
    accepted = f"{fr.DEVICES_LIST} (bad entry: "
    return (f"(size({bad}) > 0 ? {lit(accepted)} + ({bad}[0] == '' ? '(empty entry)' : {bad}[0]) + ')' : "
            f"{twice} ? {lit(accepted + 'a device listed twice)')} : '')")


def shorthand_rule(key: str, problem: Callable[[str], str], ok: str | None = None) -> str:
    """The one-message list of a pod-level shorthand's value rule. `ok`: the variable that already holds
    `has && problem == ''` (variables.fractionOk, ...), so that the value is judged once per request."""
    v = a(key)
    wrong = f"!{ok}" if ok else f"{problem(v)} != ''"
    return when(f"{has_ann(key)} && {wrong}", one(annotation_message(lit(key), v, problem(v))))
