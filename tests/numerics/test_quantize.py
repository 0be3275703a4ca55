"""``quantize`` is bit exact: codes identical to gfloat and ml_dtypes on every probe.

Oracles (docs/numerics.md, "Oracles the tests trust"): ``gfloat.round_ndarray(fi, x, TiesToEven, sat=True)``
for all four element formats; ml_dtypes ``float6_e3m2fn`` / ``float6_e2m3fn`` / ``float4_e2m1fn`` for
fp6 / fp4 (non-NaN inputs: ml_dtypes maps NaN to +-0, our spec to +max) and ``float8_e4m3fn`` for
|x| <= 464 only (it is not saturating). CODES are compared, so the sign of zero counts.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import cuda_only, random_sample_size
from gfloat import RoundMode, encode_ndarray, round_ndarray
from gfloat.formats import format_info_ocp_e2m1, format_info_ocp_e2m3, format_info_ocp_e3m2, format_info_ocp_e4m3
from hypothesis import given, settings
from hypothesis import strategies as st

from mjolnir_numerics import E2M1, E2M3, E3M2, E4M3, dequantize, quantize, round_to_format

ELEMENT_FORMATS = [E4M3, E3M2, E2M3, E2M1]
FP6_FP4 = [E3M2, E2M3, E2M1]
GFLOAT_INFO = {
    "e4m3": format_info_ocp_e4m3,
    "e3m2": format_info_ocp_e3m2,
    "e2m3": format_info_ocp_e2m3,
    "e2m1": format_info_ocp_e2m1,
}
ML_DTYPE = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e3m2": ml_dtypes.float6_e3m2fn,
    "e2m3": ml_dtypes.float6_e2m3fn,
    "e2m1": ml_dtypes.float4_e2m1fn,
}
# ml_dtypes.float8_e4m3fn is not saturating: |x| > 464 (448 + half an ulp) gives NaN (docs/numerics.md).
ML_DTYPES_E4M3_TRUSTED_ABS = 464.0
fmt_params = pytest.mark.parametrize("fmt", ELEMENT_FORMATS, ids=lambda f: f.name)


# ---------------------------------------------------------------------------------------------------
# oracles and probes
# ---------------------------------------------------------------------------------------------------
def gfloat_codes(x: np.ndarray, fmt) -> np.ndarray:
    """gfloat's saturating ties-to-even codes of non-NaN ``x`` (float32 or float64), uint8."""
    assert not np.isnan(x).any(), "gfloat rounds NaN to NaN for fp6/fp4; filter NaN first"
    fi = GFLOAT_INFO[fmt.name]
    rounded = round_ndarray(fi, x.astype(np.float64), RoundMode.TiesToEven, sat=True)
    return encode_ndarray(fi, rounded).astype(np.uint8)


def ml_dtypes_codes(x: np.ndarray, fmt) -> np.ndarray:
    """ml_dtypes' codes of float32 ``x`` (uint8, the code in the low ``fmt.bits`` bits)."""
    return x.astype(np.float32).astype(ML_DTYPE[fmt.name]).view(np.uint8)


def ours(x: np.ndarray, fmt, device="cpu") -> np.ndarray:
    return quantize(torch.from_numpy(np.ascontiguousarray(x)).to(device), fmt).cpu().numpy()


def assert_codes_equal(got: np.ndarray, want: np.ndarray, x: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {x.size} codes differ; first inputs {x.flat[bad[:8]].tolist()} "
        f"(bits {[hex(b) for b in x.view(np.uint32 if x.dtype == np.float32 else np.uint64).flat[bad[:8]]]}) "
        f"got {got.flat[bad[:8]].tolist()} want {want.flat[bad[:8]].tolist()}"
    )


def midpoints(fmt) -> np.ndarray:
    """Every midpoint between adjacent finite values, both signs, plus the overflow midpoints +-(max + ulp/2).

    All are exact in float32 (at most man_bits + 2 significant bits)."""
    fv = np.array(fmt.finite_values, dtype=np.float64)
    mids = (fv[1:] + fv[:-1]) / 2
    top_ulp = fmt.max_normal - fv[-2]
    over = fmt.max_normal + top_ulp / 2
    out = np.concatenate([mids, [over, -over]])
    assert np.array_equal(out.astype(np.float32).astype(np.float64), out)
    return out.astype(np.float32)


def neighbours(x: np.ndarray) -> np.ndarray:
    """The nearest float32 on either side of each value (torch.nextafter)."""
    t = torch.from_numpy(x)
    up = torch.nextafter(t, torch.full_like(t, math.inf))
    down = torch.nextafter(t, torch.full_like(t, -math.inf))
    return torch.cat([down, up]).numpy()


def special_values() -> np.ndarray:
    """Zeros, float32 extremes, every power of two float32 holds (subnormals too), and their neighbours."""
    f = np.finfo(np.float32)
    pow2 = np.ldexp(np.float32(1), np.arange(-149, 128)).astype(np.float32)
    base = np.concatenate([[0.0, f.max, f.tiny, f.smallest_subnormal, f.eps], pow2, pow2 * np.float32(1.5)])
    base = np.concatenate([base, -base]).astype(np.float32)
    return np.concatenate([base, neighbours(base[np.isfinite(base)])]).astype(np.float32)


def random_float32(n: int, seed: int) -> np.ndarray:
    """``n`` random float32 over the whole exponent range: half uniform bit patterns (NaNs, infs and
    subnormals included), half log-uniform over [2^-20, 2^12] with random signs (the formats' range)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 2**32, size=n // 2, dtype=np.uint64).astype(np.uint32).view(np.float32)
    mag = np.exp2(rng.uniform(-20, 12, size=n - n // 2)).astype(np.float32)
    sign = np.where(rng.random(n - n // 2) < 0.5, -1, 1).astype(np.float32)
    return np.concatenate([raw, sign * mag])


def probe_set(fmt) -> np.ndarray:
    m = midpoints(fmt)
    v = np.array([x for x in fmt.value_list if not math.isnan(x)], dtype=np.float32)
    return np.concatenate([m, neighbours(m), v, neighbours(v), special_values()])


# ---------------------------------------------------------------------------------------------------
# bit exactness against the oracles
# ---------------------------------------------------------------------------------------------------
@fmt_params
def test_midpoints_round_ties_to_even(fmt):
    """Independent of the libraries: a tie goes to the neighbour whose magnitude code is even."""
    fv = [v for v in fmt.finite_values]
    table = fmt.values()
    m = midpoints(fmt)[:-2]  # the overflow midpoints saturate instead; checked below
    codes = quantize(torch.from_numpy(m), fmt)
    for i, (x, c) in enumerate(zip(m.tolist(), codes.tolist())):
        lo, hi = fv[i], fv[i + 1]
        assert float(table[c]) in (lo, hi), f"{fmt.name}: midpoint {x} went to {float(table[c])}, not {lo} or {hi}"
        assert (c & (fmt.sign_mask - 1)) % 2 == 0, f"{fmt.name}: midpoint {x} went to odd code {c:#x}"
        assert bool(c & fmt.sign_mask) == (x < 0), f"{fmt.name}: midpoint {x} code {c:#x} has the wrong sign"


@fmt_params
def test_midpoints_and_their_neighbours_match_gfloat(fmt):
    x = np.concatenate([midpoints(fmt), neighbours(midpoints(fmt))])
    assert_codes_equal(ours(x, fmt), gfloat_codes(x, fmt), x, f"{fmt.name} midpoints vs gfloat")


@fmt_params
def test_probe_set_matches_gfloat(fmt):
    x = probe_set(fmt)
    x = x[~np.isnan(x)]
    assert_codes_equal(ours(x, fmt), gfloat_codes(x, fmt), x, f"{fmt.name} probes vs gfloat")


@pytest.mark.parametrize("fmt", FP6_FP4, ids=lambda f: f.name)
def test_probe_set_matches_ml_dtypes_fp6_fp4(fmt):
    x = probe_set(fmt)
    x = x[~np.isnan(x)]
    assert_codes_equal(ours(x, fmt), ml_dtypes_codes(x, fmt), x, f"{fmt.name} probes vs ml_dtypes")


def test_probe_set_matches_ml_dtypes_e4m3_where_it_is_trusted():
    x = probe_set(E4M3)
    x = x[np.abs(x) <= ML_DTYPES_E4M3_TRUSTED_ABS]  # also drops NaN
    assert x.size > 1000
    assert_codes_equal(ours(x, E4M3), ml_dtypes_codes(x, E4M3), x, "e4m3 probes vs ml_dtypes")


@fmt_params
def test_random_float32_match_gfloat(fmt):
    x = random_float32(random_sample_size(), seed=1 + fmt.bits + fmt.man_bits)
    x = x[~np.isnan(x)]
    assert_codes_equal(ours(x, fmt), gfloat_codes(x, fmt), x, f"{fmt.name} random vs gfloat")


@fmt_params
def test_random_float32_match_ml_dtypes(fmt):
    x = random_float32(random_sample_size(), seed=100 + fmt.bits + fmt.man_bits)
    keep = ~np.isnan(x)
    if fmt is E4M3:
        keep &= np.abs(x) <= ML_DTYPES_E4M3_TRUSTED_ABS
    x = x[keep]
    assert_codes_equal(ours(x, fmt), ml_dtypes_codes(x, fmt), x, f"{fmt.name} random vs ml_dtypes")


@fmt_params
def test_float32_subnormal_inputs_round_to_signed_zero(fmt):
    """Every float32 subnormal is far below half the format's smallest subnormal: +-0 with its sign."""
    rng = np.random.default_rng(7)
    bits = np.concatenate([[1, 0x7FFFFF], rng.integers(1, 0x800000, size=10_000)]).astype(np.uint32)
    x = np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)
    got = ours(x, fmt)
    want = np.where(np.signbit(x), fmt.sign_mask, 0).astype(np.uint8)
    assert_codes_equal(got, want, x, f"{fmt.name} float32 subnormals")


@fmt_params
def test_format_subnormal_range_matches_gfloat(fmt):
    """A dense float32 grid across the format's subnormal binade and the one above it."""
    step = fmt.min_subnormal / 64
    grid = np.arange(0, 2 * fmt.min_normal, step, dtype=np.float64).astype(np.float32)
    x = np.concatenate([grid, -grid])
    assert_codes_equal(ours(x, fmt), gfloat_codes(x, fmt), x, f"{fmt.name} subnormal range")


@fmt_params
def test_overflow_and_infinities_saturate_to_max(fmt):
    over = np.array(
        [fmt.max_normal * 1.01, 2 * fmt.max_normal, 1e30, np.finfo(np.float32).max, np.inf], dtype=np.float32
    )
    x = np.concatenate([over, -over])
    want = np.array([fmt.max_code] * over.size + [fmt.max_code | fmt.sign_mask] * over.size, dtype=np.uint8)
    assert_codes_equal(ours(x, fmt), want, x, f"{fmt.name} overflow")


# NaN bit patterns: quiet, signalling, negative, and payloads only in the low 16 bits (which the
# round-to-odd bfloat16 table path must keep NaN through its sticky bit).
NAN_BITS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7F808000, 0x7FFFFFFF, 0xFFFFFFFF, 0x7F80FFFF]


def test_nan_converts_to_0x7f_in_e4m3():
    x = np.array(NAN_BITS, dtype=np.uint32).view(np.float32)
    np.testing.assert_array_equal(ours(x, E4M3), np.full(x.size, 0x7F, dtype=np.uint8))
    assert ours(np.array([np.nan], dtype=np.float64), E4M3).tolist() == [0x7F]


@pytest.mark.parametrize("fmt", FP6_FP4, ids=lambda f: f.name)
def test_nan_converts_to_positive_max_in_fp6_fp4(fmt):
    """CUDA cuda_fp6.hpp / cuda_fp4.hpp: "NaN converts to positive MAXNORM", whatever the NaN's sign."""
    x = np.array(NAN_BITS, dtype=np.uint32).view(np.float32)
    np.testing.assert_array_equal(ours(x, fmt), np.full(x.size, fmt.max_code, dtype=np.uint8))
    assert ours(np.array([-np.nan], dtype=np.float64), fmt).tolist() == [fmt.max_code]


# ---------------------------------------------------------------------------------------------------
# other input dtypes
# ---------------------------------------------------------------------------------------------------
@fmt_params
def test_float64_inputs_are_rounded_once(fmt):
    """Just off a midpoint by far less than a float32 ulp: a float32 detour would land on the midpoint
    and tie to even; rounding float64 directly goes to the nearer side."""
    m = midpoints(fmt)[:-2].astype(np.float64)
    m = m[m != 0]
    tiny = np.abs(m) * 2.0**-40
    above, below = m + tiny, m - tiny  # above/below in value, both signs
    fv = np.array(fmt.finite_values)
    idx = np.searchsorted(fv, m)  # fv[idx - 1] < m < fv[idx]
    # the neighbour, carrying the input's sign (a negative value rounding up to zero gives -0)
    want_above = quantize(torch.from_numpy(np.copysign(fv[idx], m).astype(np.float32)), fmt).numpy()
    want_below = quantize(torch.from_numpy(np.copysign(fv[idx - 1], m).astype(np.float32)), fmt).numpy()
    assert_codes_equal(ours(above, fmt), want_above, above, f"{fmt.name} float64 just above midpoints")
    assert_codes_equal(ours(below, fmt), want_below, below, f"{fmt.name} float64 just below midpoints")
    # and a float32 detour really would have tied there (so the test can tell the two apart)
    assert np.array_equal(above.astype(np.float32), m.astype(np.float32))


@fmt_params
def test_random_float64_match_gfloat(fmt):
    rng = np.random.default_rng(11)
    n = random_sample_size() // 4
    x = np.concatenate(
        [
            rng.standard_normal(n) * fmt.max_normal / 3,
            np.exp2(rng.uniform(-40, 20, size=n)) * np.where(rng.random(n) < 0.5, -1.0, 1.0),
            np.array([0.0, -0.0, np.inf, -np.inf, 1e300, -1e300, 5e-324, -5e-324]),
        ]
    )
    assert_codes_equal(ours(x, fmt), gfloat_codes(x, fmt), x, f"{fmt.name} float64 vs gfloat")


@fmt_params
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_16_bit_input_matches_its_float32_widening_and_gfloat(fmt, dtype):
    x16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    got = quantize(x16, fmt)
    x32 = x16.float()
    assert got.dtype == torch.uint8 and got.shape == x16.shape
    assert torch.equal(got, quantize(x32, fmt))
    xn = x32.numpy()
    keep = ~np.isnan(xn)
    assert_codes_equal(got.numpy()[keep], gfloat_codes(xn[keep], fmt), xn[keep], f"{fmt.name} from {dtype}")


# ---------------------------------------------------------------------------------------------------
# the seed's quantizer (why we differ)
# ---------------------------------------------------------------------------------------------------
# Ties the seed's minifloat_quantize breaks toward the smaller magnitude: at every midpoint whose lower
# neighbour has an odd code, i.e. 15 of 31 per sign for fp6 and 3 of 7 per sign for fp4 (docs/numerics.md).
SEED_WRONG_MIDPOINT_VALUES = {"e3m2": (30, 62), "e2m3": (30, 62), "e2m1": (6, 14)}


@pytest.mark.parametrize("fmt", FP6_FP4, ids=lambda f: f.name)
def test_seed_minifloat_quantize_breaks_ties_to_smaller_magnitude_where_we_do_not(fmt, seed_module):
    fv = np.array(fmt.finite_values, dtype=np.float64)
    m = ((fv[1:] + fv[:-1]) / 2).astype(np.float32)
    want_wrong, total = SEED_WRONG_MIDPOINT_VALUES[fmt.name]
    assert m.size == total
    oracle = ml_dtypes_codes(m, fmt)
    x = torch.from_numpy(m)
    assert_codes_equal(quantize(x, fmt).numpy(), oracle, m, f"{fmt.name} midpoints (ours)")
    seed_codes, seed_values = seed_module.minifloat_quantize(x, fmt.name)
    oracle_values = torch.from_numpy(oracle.view(ML_DTYPE[fmt.name]).astype(np.float32))
    wrong = seed_values != oracle_values
    assert int(wrong.sum()) == want_wrong, f"seed got {int(wrong.sum())} of {total} {fmt.name} midpoints wrong"
    # every one of them went to the smaller magnitude
    assert bool((seed_values[wrong].abs() < oracle_values[wrong].abs()).all())
    # its codes also lose the sign of zero at -min_subnormal / 2 (one more code mismatch than values)
    assert int((seed_codes != torch.from_numpy(oracle)).sum()) == want_wrong + 1


# ---------------------------------------------------------------------------------------------------
# invariants (hypothesis)
# ---------------------------------------------------------------------------------------------------
finite_f32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
any_f32 = st.floats(allow_nan=False, allow_infinity=True, width=32)
HYP = settings(max_examples=150, deadline=None)


def q1(x: float, fmt) -> int:
    return int(quantize(torch.tensor([x], dtype=torch.float32), fmt))


def v1(x: float, fmt) -> float:
    return float(round_to_format(torch.tensor([x], dtype=torch.float32), fmt))


@fmt_params
@HYP
@given(x=any_f32, y=any_f32)
def test_rounding_is_monotone(fmt, x, y):
    lo, hi = min(x, y), max(x, y)
    assert v1(lo, fmt) <= v1(hi, fmt)


@fmt_params
@HYP
@given(x=any_f32)
def test_rounding_is_odd_including_the_sign_bit(fmt, x):
    assert q1(-x, fmt) == q1(x, fmt) ^ fmt.sign_mask


@fmt_params
@HYP
@given(data=st.data())
def test_rounding_is_idempotent_on_representable_values(fmt, data):
    code = data.draw(st.integers(0, fmt.num_codes - 1).filter(lambda c: not math.isnan(fmt.code_value(c))))
    v = fmt.code_value(code)
    assert q1(v, fmt) == code
    r = v1(data.draw(finite_f32), fmt)
    assert v1(r, fmt) == r


@fmt_params
@HYP
@given(x=finite_f32)
def test_error_is_at_most_half_an_ulp_in_range(fmt, x):
    if abs(x) > fmt.max_normal:
        x = math.fmod(x, fmt.max_normal)
    r = v1(x, fmt)
    if x == 0:
        assert r == 0
        return
    binade = max(math.frexp(abs(x))[1] - 1, fmt.min_exponent)  # below min_normal: subnormal spacing
    ulp = 2.0 ** (binade - fmt.man_bits)
    assert abs(r - x) <= ulp / 2, f"{fmt.name}: {x} -> {r}, error {abs(r - x)} > half ulp {ulp / 2}"


# ---------------------------------------------------------------------------------------------------
# shapes, devices, bad input
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)])
def test_shape_and_dtype_are_kept(shape):
    x = torch.randn(shape)
    c = quantize(x, "e3m2")
    assert c.shape == x.shape and c.dtype == torch.uint8
    assert round_to_format(x, "e3m2").shape == x.shape


def test_non_contiguous_input_gives_the_same_codes():
    x = torch.randn(64, 48) * 10
    t = x.t()
    assert not t.is_contiguous()
    assert torch.equal(quantize(t, E4M3), quantize(t.contiguous(), E4M3))


def test_large_input_crosses_the_chunk_boundary():
    """More than one 2^20 chunk of the table path, with a distinct value at each chunk edge."""
    n = (1 << 20) * 2 + 5
    x = torch.linspace(-500, 500, n)
    assert_codes_equal(quantize(x, E4M3).numpy(), quantize(x.double(), E4M3).numpy(), x.numpy(), "chunked vs float64")


def test_round_to_format_is_dequantize_of_quantize():
    x = torch.randn(1000) * 5
    for fmt in ELEMENT_FORMATS:
        assert torch.equal(round_to_format(x, fmt), dequantize(quantize(x, fmt), fmt))


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.int64, torch.bool])
def test_integer_input_raises_naming_x(dtype):
    with pytest.raises(ValueError, match=r"^x: .*float"):
        quantize(torch.zeros(4, dtype=dtype), "e4m3")


def test_non_tensor_and_float8_inputs_raise_naming_x():
    with pytest.raises(ValueError, match=r"^x: "):
        quantize([1.0, 2.0], "e4m3")
    with pytest.raises(ValueError, match=r"^x: .*float8"):
        quantize(torch.zeros(4).to(torch.float8_e4m3fn), "e4m3")


def test_unknown_or_block_scaled_format_raises_naming_fmt():
    with pytest.raises(ValueError, match=r"^fmt: .*e4m3.*e3m2.*e2m3.*e2m1"):
        quantize(torch.zeros(4), "fp8")
    with pytest.raises(ValueError, match=r"^fmt: .*nvfp4"):
        quantize(torch.zeros(4), "nvfp4")


def test_dequantize_rejects_codes_outside_the_format():
    with pytest.raises(ValueError, match=r"^codes: .*0\.\.15"):
        dequantize(torch.tensor([16], dtype=torch.uint8), E2M1)
    with pytest.raises(ValueError, match=r"^codes: "):
        dequantize(torch.tensor([-1], dtype=torch.int8), E2M1)
    with pytest.raises(ValueError, match=r"^codes: "):
        dequantize(torch.tensor([1.0]), E2M1)


@cuda_only
@fmt_params
def test_cuda_gives_the_cpu_codes(fmt):
    x = np.concatenate([probe_set(fmt), random_float32(random_sample_size(), seed=5)])
    assert_codes_equal(ours(x, fmt, "cuda"), ours(x, fmt), x, f"{fmt.name} cuda vs cpu")
    with np.errstate(invalid="ignore"):
        x64 = x.astype(np.float64)
    assert_codes_equal(ours(x64, fmt, "cuda"), ours(x64, fmt), x64, f"{fmt.name} float64 cuda vs cpu")


@cuda_only
def test_cuda_dequantize_matches_cpu():
    for fmt in ELEMENT_FORMATS:
        codes = torch.arange(fmt.num_codes, dtype=torch.uint8)
        a, b = dequantize(codes, fmt), dequantize(codes.cuda(), fmt).cpu()
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
