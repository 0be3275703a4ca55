"""Architecture gating by family (compute capability 10.x and 11.x)."""

import pytest

from mjolnir_kernel.arch import check_tcgen05_arch, is_tcgen05_arch, is_tcgen05_capability, parse_arch


@pytest.mark.parametrize(
    "cc, ok", [((10, 0), True), ((10, 3), True), ((11, 0), True), ((9, 0), False), ((12, 0), False), ((8, 9), False)]
)
def test_capability_family(cc, ok):
    assert is_tcgen05_capability(*cc) is ok


@pytest.mark.parametrize(
    "arch, ok", [("sm_100a", True), ("sm_103a", True), ("sm_110a", True), ("sm_90a", False), ("sm_120a", False)]
)
def test_arch_family(arch, ok):
    assert is_tcgen05_arch(arch) is ok


def test_arch_errors_name_the_argument():
    with pytest.raises(ValueError, match="arch='sm_90a'"):
        check_tcgen05_arch("sm_90a")
    with pytest.raises(ValueError, match="arch='sm_110'"):
        check_tcgen05_arch("sm_110")  # tcgen05 needs the arch-specific 'a' target
    with pytest.raises(ValueError, match="arch='thor'"):
        parse_arch("thor")
