"""NVFP4 against an independent numpy / ml_dtypes computation of the recipe (docs/numerics.md, "NVFP4").

The reference below is written from the recipe, not from :mod:`mjolnir_numerics.nvfp4`: every step is
float32 numpy arithmetic in the order the recipe states, and the roundings are ml_dtypes casts
(``float8_e4m3fn`` for the scales, which never exceed 464 here; ``float4_e2m1fn`` for the elements).
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import DEVICES, cuda_only

from mjolnir_numerics import E2M1, E4M3, NVFP4Tensor, dequantize, nvfp4_quantize, pack, quantize

F32 = np.float32
E4M3_MAX = F32(448.0)
E2M1_MAX = F32(6.0)
KERNEL_VALUE_MAX = 6.0 * 448.0 / 8  # largest code * scale * 2^-3 (docs/numerics.md, "NVFP4"): 336
# 336 is not an e4m3 value: it ties between 320 (even mantissa) and 352, so the largest kernel value is 320.
KERNEL_VALUE_TOP = 320.0
# kernel_values * kernel_descale vs values: the only rounding between them is the e4m3 rounding of
# code * scale / 8, i.e. half an e4m3 ulp: 2^-4 relative for normals, 2^-10 absolute below 2^-6.
E4M3_HALF_ULP_REL = 2.0**-4
E4M3_HALF_SUBNORMAL_SPACING = 2.0**-10
# 4 over 6: two blocks' squared errors within this relative distance are a near-tie (a float32 sum of 16
# terms, ~2^-21 relative error, can decide them either way) ...
NEAR_TIE_REL = 2.0**-20
# ... and within this one, closer than the float64 pairwise sum's own error (16 squares rounded, 4 levels of
# additions: about 2^-50 relative)
FLOAT64_SUM_REL = 2.0**-45


def ref_nvfp4(x: np.ndarray, scale_floor=2.0**-9, convention="amax", group=16):
    """(codes, scale codes, g, values) of the NVFP4 recipe, float32 numpy + ml_dtypes."""
    x = x.astype(F32)
    amax = F32(np.abs(x).max()) if x.size else F32(0)
    g = amax / (E2M1_MAX * E4M3_MAX if convention == "amax" else E4M3_MAX)  # float32 / float32
    g = F32(g) if g > 0 else F32(1)
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // group, group)
    block_amax = np.abs(xb).max(-1)
    scaled = (block_amax / E2M1_MAX) / g
    if scale_floor is not None:
        scaled = np.maximum(scaled, F32(scale_floor))
    assert scaled.dtype == F32 and (scaled <= 464).all(), "ml_dtypes e4m3 is only trusted to 464"
    s = scaled.astype(ml_dtypes.float8_e4m3fn)
    s_f32 = s.astype(F32)[..., None]
    total = s_f32 * g
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(total > 0, xb / total, F32(0)).astype(F32)
    q = ratio.astype(ml_dtypes.float4_e2m1fn)
    values = q.astype(F32) * s_f32 * g
    return q.view(np.uint8).reshape(x.shape), s.view(np.uint8), g, values.reshape(x.shape)


def kv_input(rng, shape=(3, 5, 64), spread=6.0):
    """Blocks whose magnitudes differ by up to 2^spread, so scales span many e4m3 binades."""
    x = rng.standard_normal(shape).astype(F32)
    block_gain = np.exp2(rng.uniform(-spread, spread, size=(*shape[:-1], shape[-1] // 16, 1))).astype(F32)
    return (x.reshape(*shape[:-1], -1, 16) * block_gain).reshape(shape)


def exact_block_sse(values: torch.Tensor, x: torch.Tensor, group: int = 16) -> list[Fraction]:
    """Each block's sum of squared errors of ``values`` against ``x`` in exact rational arithmetic."""
    v, xs = (t.double().reshape(-1, group).tolist() for t in (values, x))
    return [sum((Fraction(a) - Fraction(b)) ** 2 for a, b in zip(rv, rx)) for rv, rx in zip(v, xs)]


def run(x: np.ndarray, **kw) -> NVFP4Tensor:
    return nvfp4_quantize(torch.from_numpy(x), **kw)


def assert_matches_reference(t: NVFP4Tensor, x: np.ndarray, **ref_kw):
    codes, scales, g, values = ref_nvfp4(x, **ref_kw)
    np.testing.assert_array_equal(t.scales.numpy(), scales, err_msg="block scale codes")
    np.testing.assert_array_equal(t.codes.numpy(), codes, err_msg="e2m1 codes")
    assert float(t.global_scale.flatten()[0]) == float(g)
    np.testing.assert_array_equal(t.values.numpy(), values, err_msg="dequantized values")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale_floor", [2.0**-9, 2.0**-6, None], ids=["floor2^-9", "floor2^-6", "no_floor"])
def test_default_recipe_matches_independent_computation(seed, scale_floor):
    x = kv_input(np.random.default_rng(seed), spread=10.0)
    assert_matches_reference(run(x, scale_floor=scale_floor), x, scale_floor=scale_floor)


def test_flashinfer_convention_matches_independent_computation():
    x = kv_input(np.random.default_rng(3))
    t = run(x, global_scale="flashinfer")
    assert_matches_reference(t, x, convention="flashinfer")
    assert float(t.global_scale.flatten()[0]) == float(F32(np.abs(x).max()) / E4M3_MAX)
    # with g = amax / 448 the block scales stop at 448 / 6 = 74.7: e4m3 code of 72 at most
    assert t.scale_values().max() <= 448.0 / 6 + 4


def test_global_scale_is_amax_over_6_times_448():
    x = kv_input(np.random.default_rng(4))
    t = run(x)
    g = F32(np.abs(x).max()) / F32(2688.0)
    assert t.global_scale.dtype == torch.float32
    assert t.global_scale.shape == (3, 5, 1)
    assert (t.global_scale == float(g)).all()
    assert torch.equal(t.kernel_descale, t.global_scale * 8)
    # the block holding amax uses the top of the e4m3 scale range
    assert t.scale_values().max() == 448.0


def test_shapes_and_dtypes():
    x = kv_input(np.random.default_rng(5), shape=(2, 3, 128))
    t = run(x)
    assert t.codes.shape == (2, 3, 128) and t.codes.dtype == torch.uint8
    assert t.scales.shape == (2, 3, 8) and t.scales.dtype == torch.uint8
    for a in (t.values, t.kernel_values):
        assert a.shape == (2, 3, 128) and a.dtype == torch.float32
    assert int(t.codes.max()) < 16
    assert t.group == 16
    assert torch.equal(t.packed_codes(), pack(t.codes, 4))
    assert torch.equal(t.scale_values(), dequantize(t.scales, E4M3))


def test_values_decode_as_code_times_scale_times_global():
    x = kv_input(np.random.default_rng(6))
    t = run(x)
    s = t.scale_values().repeat_interleave(16, dim=-1)
    assert torch.equal(t.values, dequantize(t.codes, E2M1) * s * t.global_scale)


# ---------------------------------------------------------------------------------------------------
# kernel values
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 7])
def test_kernel_values_are_finite_e4m3_values_at_most_336(seed):
    x = kv_input(np.random.default_rng(seed), spread=12.0)
    kv = run(x).kernel_values
    assert torch.isfinite(kv).all()
    assert float(kv.abs().max()) <= KERNEL_VALUE_MAX
    # every one is an e4m3 value: it round-trips through the e4m3 codes
    assert torch.equal(dequantize(quantize(kv, E4M3), E4M3), kv)
    # the largest block reaches the top: code 6 at scale 448 gives e4m3(336) = 320
    assert float(kv.abs().max()) == KERNEL_VALUE_TOP


def test_kernel_values_match_independent_e4m3_of_code_times_scale_over_8():
    x = kv_input(np.random.default_rng(8), spread=12.0)
    t = run(x)
    codes, scales, _, _ = ref_nvfp4(x)
    code_val = codes.view(ml_dtypes.float4_e2m1fn).astype(F32)
    s = np.repeat(scales.view(ml_dtypes.float8_e4m3fn).astype(F32), 16, axis=-1)
    want = ((code_val * s) * F32(0.125)).astype(ml_dtypes.float8_e4m3fn).astype(F32)
    np.testing.assert_array_equal(t.kernel_values.numpy(), want)


def test_kernel_values_times_descale_approximate_values():
    x = kv_input(np.random.default_rng(9), spread=12.0)
    t = run(x)
    approx = t.kernel_values * t.kernel_descale
    err = (approx - t.values).abs()
    bound = t.values.abs() * E4M3_HALF_ULP_REL + E4M3_HALF_SUBNORMAL_SPACING * t.kernel_descale
    assert (err <= bound).all(), f"max excess {float((err - bound).max())}"
    # exact where code * scale / 8 is already an e4m3 value, inexact somewhere else (the bound is not idle)
    product = dequantize(t.codes, E2M1) * t.scale_values().repeat_interleave(16, -1) * 0.125
    representable = dequantize(quantize(product, E4M3), E4M3) == product
    assert representable.any() and not representable.all()
    assert torch.equal(approx[representable], t.values[representable])
    assert (approx[~representable] != t.values[~representable]).all()


# ---------------------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------------------
def tiny_block_input():
    """One block at 1e3 and one at 1e-6: the tiny block's fp32 scale is ~1e-9 / (1e3 / 2688) << 2^-9."""
    x = np.zeros((1, 32), dtype=F32)
    x[0, :16] = np.linspace(-1e3, 1e3, 16, dtype=F32)
    x[0, 16:] = np.linspace(-1e-6, 1e-6, 16, dtype=F32)
    return x


@pytest.mark.parametrize(
    "scale_floor, scale_code",
    [(None, 0x00), (2.0**-9, 0x01), (2.0**-6, 0x08)],
    ids=["none_underflows_to_0", "modelopt_2^-9", "torchao_2^-6"],
)
def test_scale_floor_conventions_for_a_tiny_block(scale_floor, scale_code):
    x = tiny_block_input()
    t = run(x, scale_floor=scale_floor)
    assert int(t.scales[0, 1]) == scale_code
    assert_matches_reference(t, x, scale_floor=scale_floor)
    if scale_floor is None:
        assert (t.values[0, 16:] == 0).all(), "a block whose scale underflows to 0 decodes to 0"
        assert (t.kernel_values[0, 16:] == 0).all()
    else:
        assert float(t.scale_values()[0, 1]) == scale_floor


def _candidates(x: torch.Tensor, g: torch.Tensor):
    """The amax / 6 and amax / 4 encodings of ``x (n, 16)``: their float64 values and scale codes."""
    from mjolnir_numerics.nvfp4 import DEFAULT_SCALE_FLOOR, _encode

    out = []
    for divisor in (6.0, 4.0):
        codes, scales = _encode(x, g, DEFAULT_SCALE_FLOOR, 16, divisor)
        out.append((NVFP4Tensor(codes, scales, g, 16).values.double(), scales))
    return out


def near_tie_blocks(n: int = 2048, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, g)``: float32 ``(n, 16)`` blocks where the amax / 6 and amax / 4 encodings' squared errors
    nearly tie (one element, not the block's max, moved to where they meet, then rounded to float32), and
    a global scale ``(1, 1)``."""
    x = torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))
    g = torch.tensor([[float(x.abs().max()) / (6 * 448)]])
    (v6, _), (v4, _) = _candidates(x, g)
    e6, e4 = (((v - x.double()) ** 2).sum(-1) for v in (v6, v4))
    gap = (v6 - v4).abs().masked_fill(x.abs() == x.abs().amax(-1, keepdim=True), 0)
    rows, j = torch.arange(n), gap.argmax(-1)
    dv, xj = (v6 - v4)[rows, j], x.double()[rows, j]
    # e6 - e4 as a function of x_j is c + dv * (v6_j + v4_j - 2 t): zero at t below
    c = (e6 - e4) - dv * (v6[rows, j] + v4[rows, j] - 2 * xj)
    t = (v6[rows, j] + v4[rows, j]) / 2 + c / (2 * dv)
    ok = (dv != 0) & (t.abs() < x.abs().amax(-1))
    x[rows[ok], j[ok]] = t[ok].float()
    return x, g


def test_four_over_six_decides_near_ties_as_exact_arithmetic_does():
    """The choice between the amax / 6 and amax / 4 encodings of a block is the exact comparison of their
    squared errors, also on near-ties (:func:`near_tie_blocks`). A float32 sum decides some of them by its
    rounding, and its order is the device's own (one such block went the other way on the H200)."""
    x, g = near_tie_blocks()
    (v6, s6), (v4, s4) = _candidates(x, g)
    exact6, exact4 = exact_block_sse(v6, x), exact_block_sse(v4, x)
    near = [abs(a - b) <= NEAR_TIE_REL * a for a, b in zip(exact6, exact4)]
    assert sum(near) >= 500, f"only {sum(near)} near-ties built"
    chosen = nvfp4_quantize(x, global_value=g, four_over_six=True).scales.flatten()
    closer_than_float64 = 0  # ties closer than the float64 sum's own rounding: either choice is the spec's
    for i, (a, b) in enumerate(zip(exact6, exact4)):
        if abs(a - b) <= FLOAT64_SUM_REL * a and a != b:
            closer_than_float64 += 1
            continue
        want = s4[i, 0] if b < a else s6[i, 0]
        assert chosen[i] == want, (i, float(a), float(b))
    assert closer_than_float64 <= sum(near) // 10, closer_than_float64


@cuda_only
def test_cuda_four_over_six_near_ties_give_the_cpu_bits():
    x, g = near_tie_blocks(8192, seed=6)
    cpu = nvfp4_quantize(x, global_value=g, four_over_six=True)
    gpu = nvfp4_quantize(x.cuda(), global_value=g.cuda(), four_over_six=True)
    assert torch.equal(gpu.codes.cpu(), cpu.codes) and torch.equal(gpu.scales.cpu(), cpu.scales)


def test_scale_floor_must_be_positive():
    with pytest.raises(ValueError, match=r"^scale_floor: "):
        run(tiny_block_input(), scale_floor=0.0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_four_over_six_never_has_larger_block_error(seed):
    x = kv_input(np.random.default_rng(seed), shape=(8, 4, 128))
    base = run(x)
    fos = run(x, four_over_six=True)
    xb = torch.from_numpy(x).reshape(8, 4, 8, 16)

    def sse(t):
        return torch.tensor(exact_block_sse(t.values, xb), dtype=torch.float64).reshape(8, 4, 8)

    assert (sse(fos) <= sse(base)).all()
    assert (sse(fos) < sse(base)).any(), "4-over-6 should improve at least one of 256 normal blocks"
    # where it changed a block, it used the amax / 4 scale: e4m3(block_amax / 4 / g)
    changed = fos.scales != base.scales
    g = base.global_scale
    scale4 = quantize(((xb.abs().amax(-1) / 4) / g).clamp(min=2.0**-9), E4M3)
    assert torch.equal(fos.scales[changed], scale4[changed])
    assert torch.equal(fos.global_scale, base.global_scale)


def test_explicit_global_value_scalar_and_per_row():
    x = kv_input(np.random.default_rng(10), shape=(2, 3, 32))
    g = float(np.abs(x).max()) / 2688 * 2  # a looser global scale, as an exported k_scale / 6 would be
    t = run(x, global_value=g)
    assert (t.global_scale == F32(g)).all()
    per_row = torch.rand(2, 3, 1) + 0.5
    t2 = run(x, global_value=per_row)
    assert torch.equal(t2.global_scale, per_row)
    s = t2.scale_values().repeat_interleave(16, -1)
    assert torch.equal(t2.values, dequantize(t2.codes, E2M1) * s * per_row)


def test_all_zero_input_encodes_exactly():
    t = nvfp4_quantize(torch.zeros(2, 32))
    assert (t.values == 0).all() and (t.kernel_values == 0).all()
    assert float(t.global_scale.flatten()[0]) == 1.0


# ---------------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------------
def test_last_dim_not_a_multiple_of_group_raises_naming_x():
    with pytest.raises(ValueError, match=r"^x: last dim .*24.* group=16"):
        nvfp4_quantize(torch.zeros(2, 24))


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_input_raises_naming_x(bad):
    x = torch.zeros(1, 16)
    x[0, 3] = bad
    with pytest.raises(ValueError, match=r"^x: .*inf or NaN"):
        nvfp4_quantize(x)


def test_integer_input_raises_naming_x():
    with pytest.raises(ValueError, match=r"^x: .*floating"):
        nvfp4_quantize(torch.zeros(1, 16, dtype=torch.int32))


def test_unknown_global_scale_convention_lists_the_allowed():
    with pytest.raises(ValueError, match=r"^global_scale: .*amax.*flashinfer"):
        nvfp4_quantize(torch.ones(1, 16), global_scale="torchao")


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf")])
def test_bad_global_value_raises_naming_it(bad):
    with pytest.raises(ValueError, match=r"^global_value: "):
        nvfp4_quantize(torch.ones(1, 16), global_value=bad)


def test_global_value_of_wrong_shape_raises_naming_it():
    with pytest.raises(ValueError, match=r"^global_value: shape"):
        nvfp4_quantize(torch.ones(2, 3, 16), global_value=torch.ones(4, 1))


def test_bad_group_raises_naming_it():
    with pytest.raises(ValueError, match=r"^group: "):
        nvfp4_quantize(torch.ones(1, 16), group=0)


@cuda_only
def test_cuda_gives_the_cpu_result():
    x = kv_input(np.random.default_rng(11), shape=(4, 8, 128), spread=12.0)
    for kw in ({}, {"four_over_six": True}, {"scale_floor": None}, {"global_scale": "flashinfer"}):
        a = run(x, **kw)
        b = nvfp4_quantize(torch.from_numpy(x).cuda(), **kw)
        for name in ("codes", "scales", "global_scale", "values", "kernel_values", "kernel_descale"):
            assert torch.equal(getattr(a, name), getattr(b, name).cpu()), f"{name} differs on CUDA with {kw}"


@pytest.mark.parametrize("device", DEVICES)
def test_unchecked_quantize_gives_the_checked_bits(device):
    """``check=False`` (on CUDA: the global scale computed inside the encoder's one launch) gives the checked
    path's bits, the CPU's, also where amax is 0 or ``amax / 2688`` underflows."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 64, generator=gen) * torch.exp2(torch.empty(6, 64).uniform_(-8, 8, generator=gen))
    for kw in ({}, {"global_scale": "flashinfer"}, {"global_value": 0.02}, {"scale_floor": None}):
        a, b = nvfp4_quantize(x, **kw), nvfp4_quantize(x.to(device), **kw, check=False)
        for name in ("codes", "scales", "global_scale"):
            assert torch.equal(getattr(a, name), getattr(b, name).cpu()), (name, kw)
    zero = nvfp4_quantize(torch.zeros(2, 16, device=device), check=False)
    assert torch.equal(zero.global_scale.cpu(), torch.ones(2, 1)) and not zero.codes.any()
    # amax > 0 whose amax / 2688 underflows to 0 (2^-149 / 2688) or not (2^-137): both paths agree
    for tiny in (2.0**-149, 2.0**-140, 2.0**-137):
        x = torch.zeros(2, 16)
        x[1, 3] = tiny
        a, b = nvfp4_quantize(x), nvfp4_quantize(x.to(device), check=False)
        for name in ("codes", "scales", "global_scale"):
            assert torch.equal(getattr(a, name), getattr(b, name).cpu()), (name, tiny)


def test_check_false_skips_the_value_checks_only():
    x = torch.ones(2, 16)
    x[0, 0] = float("inf")
    with pytest.raises(ValueError, match="^x: holds inf or NaN"):
        nvfp4_quantize(x)
    nvfp4_quantize(x, check=False)  # no wait for the device: the caller guarantees finite values
    with pytest.raises(ValueError, match="^check:"):
        nvfp4_quantize(x, check=1)
    with pytest.raises(ValueError, match="last dim"):
        nvfp4_quantize(torch.ones(2, 15), check=False)
