"""Every code of every element format: its value, its properties and its round trip.

Oracles: ml_dtypes' value tables and gfloat's ``decode_ndarray`` (docs/numerics.md, "Oracles the tests
trust"); both are independent of :mod:`mjolnir_numerics.formats`. Values are compared as float32 bit
patterns, so the sign of zero and NaN codes count.
"""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import DEVICES
from gfloat import decode_ndarray
from gfloat.formats import format_info_ocp_e2m1, format_info_ocp_e2m3, format_info_ocp_e3m2, format_info_ocp_e4m3

from mjolnir_numerics import E2M1, E2M3, E3M2, E4M3, FORMATS, NVFP4, BlockScaledFormat, Format, get_format
from mjolnir_numerics.quantize import dequantize, quantize

ELEMENT_FORMATS = [E4M3, E3M2, E2M3, E2M1]
ML_DTYPE = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
}
GFLOAT_INFO = {
    "e4m3": format_info_ocp_e4m3,
    "e3m2": format_info_ocp_e3m2,
    "e2m3": format_info_ocp_e2m3,
    "e2m1": format_info_ocp_e2m1,
}
# (bits, max normal, min normal, min subnormal, number of finite non-negative distinct values), from
# the OCP MX spec v1.0 tables (e4m3: OCP 8-bit FP spec) -- written out, not derived from the module.
SPEC = {
    "e4m3": (8, 448.0, 2.0**-6, 2.0**-9, 127),
    "e3m2": (6, 28.0, 2.0**-2, 2.0**-4, 32),
    "e2m3": (6, 7.5, 1.0, 2.0**-3, 32),
    "e2m1": (4, 6.0, 1.0, 0.5, 8),
}
fmt_params = pytest.mark.parametrize("fmt", ELEMENT_FORMATS, ids=lambda f: f.name)


def f32_bits(a) -> np.ndarray:
    """float32 bit patterns (uint32) of an array-like, so -0.0 != 0.0 and NaN payloads compare."""
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def ml_dtypes_table(fmt: Format) -> np.ndarray:
    """Value of every code according to ml_dtypes (float32, indexed by code)."""
    return np.arange(fmt.num_codes, dtype=np.uint8).view(ML_DTYPE[fmt.name]).astype(np.float32)


@fmt_params
def test_every_code_value_matches_ml_dtypes(fmt):
    ours = fmt.values().numpy()
    theirs = ml_dtypes_table(fmt)
    assert ours.shape == (fmt.num_codes,)
    assert ours.dtype == np.float32
    nan_ours, nan_theirs = np.isnan(ours), np.isnan(theirs)
    np.testing.assert_array_equal(nan_ours, nan_theirs)
    bad = np.flatnonzero(~nan_ours & (f32_bits(ours) != f32_bits(theirs)))
    assert bad.size == 0, f"{fmt.name}: codes {bad.tolist()} decode to {ours[bad]} but ml_dtypes says {theirs[bad]}"


@fmt_params
def test_every_code_value_matches_gfloat(fmt):
    ours = fmt.values().numpy()
    theirs = decode_ndarray(GFLOAT_INFO[fmt.name], np.arange(fmt.num_codes)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    finite = ~np.isnan(ours)
    np.testing.assert_array_equal(f32_bits(ours[finite]), f32_bits(theirs[finite]))


@fmt_params
def test_code_value_agrees_with_values_table(fmt):
    table = fmt.values().tolist()
    for code in range(fmt.num_codes):
        v = fmt.code_value(code)
        assert (math.isnan(v) and math.isnan(table[code])) or (
            v == table[code] and math.copysign(1, v) == math.copysign(1, table[code])
        ), f"{fmt.name} code {code:#x}: code_value {v} vs values() {table[code]}"


@fmt_params
def test_format_properties_match_the_spec_tables(fmt):
    bits, max_normal, min_normal, min_subnormal, n_nonneg = SPEC[fmt.name]
    assert fmt.bits == bits
    assert fmt.num_codes == 2**bits
    assert fmt.sign_mask == 1 << (bits - 1)
    assert fmt.max_normal == max_normal
    assert fmt.min_normal == min_normal
    assert fmt.min_subnormal == min_subnormal
    assert fmt.code_value(fmt.max_code) == max_normal
    assert fmt.code_value(fmt.max_code | fmt.sign_mask) == -max_normal
    assert fmt.code_value(1) == min_subnormal
    # finite_values: ascending, both signs, one zero
    fv = fmt.finite_values
    assert list(fv) == sorted(fv)
    assert len(fv) == 2 * n_nonneg - 1
    assert fv[0] == -max_normal and fv[-1] == max_normal
    gi = GFLOAT_INFO[fmt.name]
    assert (fmt.max_normal, fmt.min_normal, fmt.min_subnormal) == (gi.max, gi.smallest_normal, gi.smallest_subnormal)


def test_nan_codes_are_e4m3_only():
    assert E4M3.nan_code == 0x7F
    assert math.isnan(E4M3.code_value(0x7F)) and math.isnan(E4M3.code_value(0xFF))
    assert E4M3.max_code == 0x7E
    for fmt in (E3M2, E2M3, E2M1):
        assert fmt.nan_code is None, f"{fmt.name} has no NaN"
        assert not any(math.isnan(v) for v in fmt.value_list)
        assert fmt.max_code == fmt.sign_mask - 1


@fmt_params
@pytest.mark.parametrize("device", DEVICES)
def test_every_non_nan_code_round_trips(fmt, device):
    codes = torch.arange(fmt.num_codes, dtype=torch.uint8, device=device)
    values = dequantize(codes, fmt)
    keep = ~torch.isnan(values)
    back = quantize(values[keep], fmt)
    bad = (back != codes[keep]).nonzero().flatten()
    assert bad.numel() == 0, f"{fmt.name}: codes {codes[keep][bad].tolist()} come back as {back[bad].tolist()}"
    # -0.0 is one of them and keeps its sign bit
    assert int(quantize(torch.tensor([-0.0], device=device), fmt)) == fmt.sign_mask
    assert torch.signbit(values[fmt.sign_mask]), "code sign_mask decodes to -0.0"


@fmt_params
def test_values_are_cached_per_device_and_float32(fmt):
    a, b = fmt.values(), fmt.values("cpu")
    assert a.dtype == torch.float32 and a.device.type == "cpu"
    assert a is b


def test_registry_holds_the_five_formats():
    assert set(FORMATS) == {"e4m3", "e3m2", "e2m3", "e2m1", "nvfp4"}
    for name, fmt in FORMATS.items():
        assert fmt.name == name
        assert get_format(name) is fmt
        assert get_format(fmt) is fmt
        assert str(fmt) == name


def test_unknown_format_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="fmt") as info:
        get_format("e5m2")
    msg = str(info.value)
    assert "'e5m2'" in msg
    for name in FORMATS:
        assert name in msg, f"valid format {name} missing from: {msg}"


def test_non_string_format_is_rejected():
    with pytest.raises(ValueError, match="fmt"):
        get_format(8)


def test_nvfp4_is_block_scaled_e2m1_with_e4m3_scales_per_16():
    assert isinstance(NVFP4, BlockScaledFormat)
    assert NVFP4.element is E2M1 and NVFP4.scale is E4M3 and NVFP4.group == 16
    assert NVFP4.bits == 4
    assert NVFP4.bits_per_value == 4.5
    assert NVFP4.max_normal == 6.0 * 448.0


def test_element_formats_cost_their_bits():
    for fmt in ELEMENT_FORMATS:
        assert fmt.bits_per_value == float(SPEC[fmt.name][0])


@pytest.mark.parametrize("code", [-1, 256])
def test_code_value_rejects_codes_outside_the_format(code):
    with pytest.raises(ValueError, match="code"):
        E4M3.code_value(code)
    with pytest.raises(ValueError, match="code"):
        E2M1.code_value(16)


def test_formats_are_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        E4M3.bias = 8  # type: ignore[misc]
    assert len({E4M3, E3M2, E2M3, E2M1}) == 4
    assert Format("e4m3", 4, 3, 7, nan_at_max_code=True) == E4M3
