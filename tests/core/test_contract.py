"""The webhook-agent contract: what the webhook writes is what the agent reads, and nothing unreadable is lost."""

from __future__ import annotations

import logging
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.core.annotations import ComputeMode, max_container_name_length
from gpufrac.core.contract import (
    MIB,
    CanonicalFraction,
    active_thread_percent,
    format_pinned_mem_limit,
    mib_ceil,
    mps_pipe_dir,
    parse_pinned_mem_limit,
    pipe_dir_mode,
    read_canonical,
    write_canonical,
)

_NAME = st.from_regex(rf"\A[a-z0-9]([-a-z0-9]{{0,{max_container_name_length() - 2}}}[a-z0-9])?\Z")
_MIB = st.integers(min_value=1, max_value=10**9 - 1)
_DEVICE = st.one_of(
    st.builds(lambda s: f"GPU-{s}", st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=36)),
    st.integers(min_value=0, max_value=999).map(str),
    st.builds(lambda kind, s: f"{kind}={s}", st.sampled_from(["k8s.device-plugin.nvidia.com/gpu", "nvidia.com/gpu"]),
              st.from_regex(r"\A(GPU-[0-9a-f-]{1,36}|[0-9]{1,2})\Z")),
)


@st.composite
def fractions(draw: st.DrawFn) -> CanonicalFraction:
    # Each part on its own: a portion pod before its bind has a mode and nothing else.
    return CanonicalFraction(
        draw(_NAME), draw(st.sampled_from(ComputeMode)), draw(st.none() | _MIB), draw(st.none() | _MIB),
        draw(st.dictionaries(st.integers(0, 999), _MIB, max_size=8)),
        tuple(draw(st.lists(_DEVICE, max_size=8, unique=True))), draw(st.none() | st.integers(1, 100)))


@given(st.lists(fractions(), max_size=4, unique_by=lambda f: f.container))
def test_reading_what_was_written_gives_it_back(written: list[CanonicalFraction]) -> None:
    read = read_canonical(write_canonical(written))
    assert read.unreadable == ()
    assert read.fractions == {f.container: f for f in written}


@given(st.dictionaries(st.integers(0, 999), _MIB, min_size=1, max_size=16))
def test_pinned_limits_round_trip(limits: dict[int, int]) -> None:
    assert parse_pinned_mem_limit(format_pinned_mem_limit(limits)) == limits


def test_the_pinned_limit_format_is_cudas() -> None:
    assert format_pinned_mem_limit({1: 61440, 0: 61440}) == "0=61440M,1=61440M"


@pytest.mark.parametrize(("key", "value"), [
    ("gpufrac.io/container.app.gpu-memory.limit-mib", "4Gi"),
    ("gpufrac.io/container.app.gpu-memory.request-mib", ""),
    ("gpufrac.io/container.app.compute-mode", "mps"),
    ("gpufrac.io/container.app.mps-pinned-mem-limit", "0=4096"),
    ("nvidia.com/container.app.gpus.devices", "GPU-a,,GPU-b"),
    ("gpufrac.io/container.app.active-thread-percent", "0"),
    ("gpufrac.io/container.app.active-thread-percent", "101"),
    ("gpufrac.io/container.app.active-thread-percent", "0.5"),
])
def test_a_container_whose_value_does_not_parse_is_logged_and_listed(key: str, value: str,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    good = CanonicalFraction("good", ComputeMode.SM_SHARING, 1024, 2048, {0: 2048}, ("GPU-b",))
    annotations = write_canonical([CanonicalFraction("app", ComputeMode.TIME_SLICING, 1024, 4096, {0: 4096},
                                                     ("GPU-a",)), good])
    annotations[key] = value
    with caplog.at_level(logging.WARNING, "gpufrac.core.contract"):
        read = read_canonical(annotations)
    assert read.fractions == {"good": good}
    [unreadable] = read.unreadable
    assert (unreadable.key, unreadable.value, unreadable.container) == (key, value, "app")
    assert key in caplog.text and "container app is not audited" in caplog.text


def test_a_malformed_canonical_key_is_listed_without_a_container() -> None:
    read = read_canonical({"gpufrac.io/container.app.gpu-memory": "1"})
    assert read.fractions == {}
    assert [(u.key, u.container) for u in read.unreadable] == [("gpufrac.io/container.app.gpu-memory", None)]


def test_mib_round_up_and_never_tighten() -> None:
    assert mib_ceil(1000 * 1000 * 1000) == 954
    assert mib_ceil(4 * MIB) == 4
    assert mib_ceil(4 * MIB + 1) == 5


@pytest.mark.parametrize("root", ["/run/gpufrac/mps", "/run/gpufrac/mps/"])
def test_each_mode_has_its_pipe_directory_under_the_root(root: str) -> None:
    for mode in ComputeMode:
        assert mps_pipe_dir(root, mode) == f"/run/gpufrac/mps/{mode}"
        assert pipe_dir_mode(mps_pipe_dir(root, mode)) is mode
    assert pipe_dir_mode("/run/gpufrac/mps") is None


def test_the_architecture_document_states_the_contract_the_code_has() -> None:
    from pathlib import Path

    from gpufrac.core import contract
    from gpufrac.core.annotations import CANONICAL_PREFIX, CanonicalField

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "architecture.md").read_text()
    assert "docs/architecture.md" in (root / "README.md").read_text()
    for value in (*contract.LimitEnv, *contract.Enforcement, *CanonicalField, contract.DEFAULT_MPS_ROOT,
                  contract.ENFORCEMENT_LABEL_PREFIX, contract.FRACTIONAL_LABEL, contract.DEFAULT_SCHEDULER_USER,
                  contract.NO_GPU, CANONICAL_PREFIX, contract.format_pinned_mem_limit({0: 4096, 1: 4096})):
        assert str(value) in doc, f"docs/architecture.md does not mention {value}"


@pytest.mark.parametrize(("portion", "percent"), [
    (1.0, 100), (0.5, 50), (0.333, 33), (0.336, 33), (0.125, 12), (0.29, 28), (0.07, 7), (0.005, 1), (1e-7, 1),
])
def test_the_active_thread_percentage_is_kais_floored_percent(portion: float, percent: int) -> None:
    """KAI's node agent's table (kai-gpu-fractioning annotations_test.go, TestParseComputePortion): floored so that
    portions that fit a GPU never ask for more than 100 %, never 0 (MPS reads it as no limit), never above the
    portion (0.29 is 28.999... in binary64)."""
    assert active_thread_percent(portion) == percent


@given(st.lists(st.integers(1, 1000), min_size=1, max_size=16))
def test_percentages_of_portions_that_fit_a_gpu_fit_it(parts: list[int]) -> None:
    total = sum(parts)
    assert sum(active_thread_percent(p / total) for p in parts) <= 100 or any(p / total < 0.01 for p in parts)


@pytest.mark.parametrize("portion", [0.0, -0.5, 1.0000001, 50.0, float("nan"), float("inf")])
def test_a_portion_outside_0_to_1_has_no_percentage(portion: float) -> None:
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        active_thread_percent(portion)
