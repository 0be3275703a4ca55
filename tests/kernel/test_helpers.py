"""The helper kernels' host side (mjolnir_kernel.helpers): where they apply, and what a bad slot does.

Their bits are tested against the spec in tests/numerics/test_fused.py (every path of every helper on a
GPU); here: the checks that run on any machine, and, on a GPU, that an out-of-range slot in an unchecked
write stops the kernel with a device-side error instead of writing out of bounds.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from mjolnir_kernel import helpers
from mjolnir_numerics.formats import FORMATS

from conftest import cuda_only, test_size_name


def test_not_available_on_the_cpu():
    assert not helpers.available("cpu")
    assert not helpers.available(torch.device("cpu"))


def test_write_unsupported_names_what_the_writer_cannot_take():
    pool = torch.empty(4, 16, 2, 64, dtype=torch.uint8)  # 4-bit rows of d = 128
    assert helpers.write_unsupported(pool, None, 128, 4) is None
    assert "multiple of 16" in helpers.write_unsupported(pool, None, 120, 4)
    odd = torch.empty(4, 16, 2, 68, dtype=torch.uint8)[..., :64]  # rows 68 bytes apart: not 8-byte aligned
    assert "8-byte aligned" in helpers.write_unsupported(odd, None, 128, 4)
    assert helpers.write_unsupported(odd, None, 64, 6) is None  # 6-bit chunks need 4 bytes only
    assert "shorter than 256 codes" in helpers.write_unsupported(pool, None, 256, 4)  # 64-byte rows
    scales = torch.empty(4, 16, 8, 2, dtype=torch.uint8).transpose(-1, -2)
    assert "scale rows" in helpers.write_unsupported(pool, scales, 128, 4)

    # the writer's index arithmetic is 32-bit: 2^31 slots, or a page of 2^31 bytes, is too many (meta tensors:
    # the shapes and strides without the memory)
    def meta(shape, strides):
        return torch.empty_strided(shape, strides, dtype=torch.uint8, device="meta")

    assert helpers.write_unsupported(meta((1 << 26, 16, 2, 64), (2048, 128, 64, 1)), None, 128, 4) is None
    assert "2^31 slots" in helpers.write_unsupported(meta((1 << 27, 16, 2, 64), (2048, 128, 64, 1)), None, 128, 4)
    assert "2^31 bytes" in helpers.write_unsupported(meta((4, 16, 2, 64), (1 << 31, 128, 64, 1)), None, 128, 4)
    assert "2^31 bytes" in helpers.write_unsupported(meta((4, 16, 2, 64), (2048, 1 << 28, 64, 1)), None, 128, 4)
    big_scales = meta((4, 16, 2, 8), (1 << 31, 16, 8, 1))
    assert "2^31 bytes" in helpers.write_unsupported(pool, big_scales, 128, 4)


def test_launches_without_tvm_ffi_warn_once_unless_asked_for(monkeypatch):
    """Without apache-tvm-ffi the helper kernels still launch (the DSL's calling path, the same bits) but slower
    per call: the first kernel a process compiles warns, once, naming the kernel extra. ``MJOLNIR_TVM_FFI=0``
    (that path asked for) and an importable apache-tvm-ffi do not warn."""
    import sys
    import types
    import warnings

    def warned(importable: bool, env: str) -> list:
        monkeypatch.setitem(sys.modules, "tvm_ffi", types.ModuleType("tvm_ffi") if importable else None)
        monkeypatch.setenv("MJOLNIR_TVM_FFI", env)
        helpers._tvm_ffi.cache_clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            helpers._tvm_ffi()
            helpers._tvm_ffi()  # a second kernel of the same process
        return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]

    try:
        got = warned(False, "1")
        assert len(got) == 1 and "apache-tvm-ffi is not importable" in got[0] and "kernel extra" in got[0]
        assert warned(False, "0") == []
        assert warned(True, "1") == []
    finally:
        helpers._tvm_ffi.cache_clear()


@cuda_only
def test_unchecked_write_to_a_slot_outside_the_pools_is_a_device_error():
    """Run in a child process: the trap leaves the CUDA context unusable."""
    if not helpers.available("cuda"):
        pytest.skip("the helper kernels do not run here (CuTe DSL missing or compute capability < 9.0)")
    code = textwrap.dedent(
        """
        import torch
        from mjolnir_numerics import PagedKVCache
        k = torch.randn(1, 16, 2, 128)
        cache = PagedKVCache.from_float(k, k, "e2m1", page_size=16, device="cuda")
        rows = torch.randn(1, 2, 128, device="cuda")
        bad = torch.tensor([cache.num_pages * 16], device="cuda")
        cache.write(rows, rows, bad, check=False)
        torch.cuda.synchronize()
        print("NO ERROR")
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "NO ERROR" not in run.stdout and run.returncode != 0, run.stdout + run.stderr
    assert "unspecified launch failure" in run.stderr, run.stderr[-2000:]  # the trap: cudaErrorLaunchFailure


def _helper_kernels():
    """Every helper kernel variant the helpers launch, with its placeholder pointers and scalars."""
    import cutlass

    from mjolnir_kernel import helpers_kernel as hk

    i64, f32 = cutlass.Int64(1), cutlass.Float32(1.0)
    nvfp4_ptrs = (("f32", 16), ("f32", 4), ("u8", 1))
    for name in ("e4m3", "e3m2", "e2m3", "e2m1"):
        yield f"quantize {name}", hk.QuantizeKernel(FORMATS[name]), (("f32", 16), ("u8", 1), ("u8", 4)), (i64,)
    for bits in (4, 6):
        yield f"pack{bits}", hk.PackKernel(bits), (("u8", 16), ("u8", 16)), (i64,)
    for packed, global_divisor in ((False, None), (True, None), (False, 2688.0)):
        ptrs = (*nvfp4_ptrs, ("u8", 8 if packed else 16), ("u8", 1), ("f32", 4))
        kernel = hk.NVFP4EncodeKernel(packed, 6.0, 0.125, global_divisor=global_divisor)
        yield f"nvfp4 packed={packed} global_divisor={global_divisor}", kernel, ptrs, (i64,) * 3 + (f32,)
    for element, nvfp4 in (("e4m3", False), ("e3m2", False), ("e2m3", False), ("e2m1", False), ("e2m1", True)):
        bits = FORMATS[element].bits
        pool = ("u8", helpers._STORE_ALIGN[bits])
        ptrs = (("f32", 16), ("f32", 16), ("u8", 8), ("u8", 8), ("f32", 4), ("f32", 4), ("u8", 1), pool, pool,
                ("u8", 1), ("u8", 1))  # fmt: skip
        for bf16, per_seq in ((True, True), (False, False)):
            kernel = hk.CacheWriteKernel(element, nvfp4, bf16, per_seq, True, 0.125)
            yield f"write {element} nvfp4={nvfp4} bf16={bf16} per_seq={per_seq}", kernel, ptrs, hk.writer_scalars()


@pytest.mark.parametrize("arch", ["sm_90a", "sm_110a"])
def test_helper_kernels_compile_without_spilling(arch):
    """Each helper kernel lowers to a cubin for Hopper and Thor on any machine (no GPU), with no spills."""
    import contextlib
    import io

    from mjolnir_kernel.compile import _file_cache, cutlass_available, parse_ptxas_report

    if cutlass_available() is not None:
        pytest.skip(cutlass_available())
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    for name, kernel, pointers, scalars in _helper_kernels():
        args = [helpers._pointer(kind, 1 << 20, align) for kind, align in pointers]
        log = io.StringIO()
        with _file_cache(False), contextlib.redirect_stderr(log):
            cute.compile(kernel, *args, *scalars, cuda.CUstream(0), options=f"--gpu-arch {arch} remarks{{ptx}}")
        report = parse_ptxas_report(log.getvalue())
        assert report, f"{name}: no ptxas report for {arch}"
        for res in report.values():
            assert res.spill_stores == 0 and res.spill_loads == 0, (name, arch, res)


# -- the writer's arithmetic, checked on any machine ---------------------------------------------------
def test_fast_divmod_constants_divide_exactly():
    """``(n * multiplier) >> shift == n // d`` for the writer's divisors (chunks per row, heads) at the ends of
    its range, n < 2^30, with a multiplier below 2^31 (a 32-bit kernel argument), and refused for d < 1."""
    from mjolnir_kernel.helpers_kernel import fast_divmod_constants

    gen = torch.Generator().manual_seed(0)
    n = torch.cat(
        [
            torch.arange(1 << 16),
            (1 << 30) - 1 - torch.arange(1 << 16),
            torch.randint(0, 1 << 30, (1 << 18,), generator=gen),
        ]
    )
    for d in [*range(1, 70), 96, 127, 128, 129, 255, 256, 1000, 4095, 65535, 1 << 20, (1 << 20) + 1]:
        mult, shift = fast_divmod_constants(d)
        assert 0 < mult < 1 << 31 and (n.max().item() * mult) < 1 << 63
        assert torch.equal((n * mult) >> shift, n // d), d
    with pytest.raises(ValueError, match="^divisor: expected a positive integer"):
        fast_divmod_constants(0)


def _round_to_float32(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """float32 nearest-even rounding of the exact sum ``hi + lo`` (float64, a TwoSum pair: ``hi`` is the sum
    rounded to float64), for sums in float32's normal range: ``hi``'s own rounding is right unless ``hi`` lies
    exactly on a float32 midpoint and ``lo`` pushes the sum off it."""
    on_midpoint = (hi.view(np.uint64) & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)
    nudged = np.nextafter(hi, np.where(lo > 0, np.inf, -np.inf))
    return np.where(on_midpoint & (lo != 0), nudged, hi).astype(np.float32)


def _fast_quotients(a: np.ndarray, b: np.ndarray, scale_exp: int = 0) -> np.ndarray:
    """``helpers_kernel.quotients_fast`` with each float32 operation computed exactly and rounded once (a
    float32 product is exact in float64; an FMA is an exact float64 value, or an exact TwoSum pair, rounded
    once; signed zeros as IEEE arithmetic gives them, which numpy's float64 does too): ``recip = fp32(2^-k /
    b)``, ``q0 = fp32(a * recip)``, ``neg_res = fma(b * 2^k, q0, -a)``, ``q = fma(-neg_res, recip, q0)`` (``k =
    scale_exp``)."""
    recip = (np.float32(2.0**-scale_exp) / b).astype(np.float64)
    a64, b64 = a.astype(np.float64), b.astype(np.float64) * 2.0**scale_exp
    q0 = (a64 * recip).astype(np.float32).astype(np.float64)
    neg_res = (b64 * q0 - a64).astype(np.float32).astype(np.float64)  # b q0 - a is exact in float64 here
    p = -neg_res * recip  # exact: two 24-bit significands
    s = q0 + p
    bb = s - q0
    err = (q0 - (s - bb)) + (p - bb)  # TwoSum: s + err == q0 + p exactly
    return _round_to_float32(s, err)


def _float32_bits(sign, exponent, mantissa) -> np.ndarray:
    return ((sign << 31) | ((exponent + 127) << 23) | mantissa).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("scale_exp", [0, 6, 12])
def test_fast_quotients_are_the_correctly_rounded_ones_where_the_writer_takes_them(scale_exp):
    """The writer's division sequence (one reciprocal, a product, two FMAs; Markstein's theorem) gives IEEE
    float32 division's bits for every ``|x| in [2^-100, 2^100)`` and divisor in ``[2^-20, 2^20)``, the bounds of
    ``fast_division_ok``: random operands, quotients next to rounding midpoints (the hard cases), divisors
    with all-ones significands, and the bounds themselves. With the fp6 writer's scale folded in
    (``scale_exp = k``: divisor ``b * 2^k``, reciprocal ``fp32(2^-k / b)``) it gives the quotient times ``2^-k``
    exactly wherever that is a normal float32."""
    from mjolnir_kernel import helpers_kernel as hk

    rng = np.random.default_rng(7)
    n = 1 << 21

    def bits(lo_exp, hi_exp, size):
        return _float32_bits(
            rng.integers(0, 2, size), rng.integers(lo_exp, hi_exp, size), rng.integers(0, 1 << 23, size)
        )

    low, high = np.array([hk.FAST_DIVISOR_LOW, hk.FAST_DIVISOR_HIGH], dtype=np.uint32).view(np.float32)
    limit = np.array([hk.FAST_ABS_X_LIMIT], dtype=np.uint32).view(np.float32)[0]
    assert (low, high, limit) == (2.0**-20, 2.0**20, 2.0**100)
    b = np.abs(bits(-20, 20, n))
    b[:64] = low
    b[64:128] = np.nextafter(high, np.float32(0))
    b[128:4096] = _float32_bits(0, rng.integers(-20, 20, 3968), np.full(3968, (1 << 23) - 1 - rng.integers(0, 4, 3968)))
    a = bits(-100, 100, n)
    a[:16] = np.nextafter(limit, np.float32(0))
    a[16:32] = -(2.0**-100)
    # quotients within 2^-49 (relative) of a rounding midpoint, the hardest there are: for an odd 24-bit
    # significand B and a small odd t, O = t / B mod 2^25 is a midpoint's significand when odd and >= 2^24,
    # and A = (O B - t) / 2^25 an integer, so A / B = O / 2^25 - t / (2^25 B)
    half = n // 2
    B = rng.integers(1 << 22, 1 << 23, half, dtype=np.int64) * 2 + 1
    inv = B.copy()
    for _ in range(5):  # Newton's iteration for the inverse of B modulo 2^32
        inv = (inv * (2 - B * inv)) & 0xFFFFFFFF
    t = rng.choice(np.array([-5, -3, -1, 1, 3, 5]), half)
    O = (t * (inv & ((1 << 25) - 1))) & ((1 << 25) - 1)
    A = (O * B - t) >> 25
    hard = (O & 1 == 1) & (O >= 1 << 24) & (A > 0) & (A < 1 << 24)
    sign = np.where(rng.integers(0, 2, half), 1.0, -1.0)
    a[half:] = np.where(hard, sign * np.ldexp(A.astype(np.float64), rng.integers(-120, 76, half)), a[half:])
    b[half:] = np.where(hard, np.ldexp(B.astype(np.float64), rng.integers(-43, -3, half)), b[half:])
    assert hard.sum() > half // 4
    keep = (np.abs(a) >= 2.0**-100) & (np.abs(a) < limit) & (np.abs(a / b) >= 2.0 ** (scale_exp - 126))
    a, b = a[keep], b[keep]
    assert a.size > n * 0.9
    want = ((a / b) * np.float32(2.0**-scale_exp)).view(np.uint32)  # exact: normal results
    got = _fast_quotients(a, b, scale_exp).view(np.uint32)
    wrong = np.flatnonzero(got != want)
    assert wrong.size == 0, f"{wrong.size} quotients differ, e.g. {a[wrong[:3]]} / {b[wrong[:3]]}"


def test_fast_quotients_of_tiny_values_round_to_the_zero_code_of_their_sign():
    """Below ``|x| = 2^-100`` (zeros and subnormals included) the sequence is not exact, but with a divisor of at
    least 2^-20 the true quotient and the computed one are both below 2^-77 with ``x``'s sign: every format's
    quantizer gives them the same (zero) code."""
    from mjolnir_numerics import quantize
    from mjolnir_numerics.formats import FORMATS

    rng = np.random.default_rng(8)
    n = 1 << 16
    a = _float32_bits(rng.integers(0, 2, n), rng.integers(-127, -100, n), rng.integers(0, 1 << 23, n))
    a[:4] = [0.0, -0.0, 2.0**-149, -(2.0**-149)]
    b = np.abs(_float32_bits(rng.integers(0, 1, n), rng.integers(-20, 20, n), rng.integers(0, 1 << 23, n)))
    got, want = _fast_quotients(a, b), a / b
    assert (np.abs(got) < 2.0**-77).all() and (np.signbit(got) == np.signbit(a)).all()
    for name in ("e4m3", "e3m2", "e2m3", "e2m1"):
        fmt = FORMATS[name]
        assert torch.equal(quantize(torch.from_numpy(got), fmt), quantize(torch.from_numpy(want), fmt)), name


@pytest.mark.parametrize("scale_exp", [6, 12])
def test_scaled_fast_quotients_below_float32s_normals_give_the_zero_code(scale_exp):
    """Where the scaled quotient ``x / b * 2^-k`` is below ``2^-126`` (a subnormal or zero float32: Markstein's
    argument does not apply) the sequence's result is below ``2^-110`` with ``x``'s sign, as the scaled true
    quotient is: the fp6 conversions at that scale code both as the zero of that sign."""
    from mjolnir_kernel import helpers_kernel as hk
    from mjolnir_numerics import quantize

    rng = np.random.default_rng(9)
    n = 1 << 18
    b = np.abs(_float32_bits(rng.integers(0, 1, n), rng.integers(-20, 20, n), rng.integers(0, 1 << 23, n)))
    # x's exponent: the quotient's scaled exponent from 2^-150 to 2^-124, about 2^-126 and below
    exponent = np.floor(np.log2(b)).astype(np.int64) + scale_exp + rng.integers(-150, -123, n)
    a = _float32_bits(rng.integers(0, 2, n), np.clip(exponent, -126, 99), rng.integers(0, 1 << 23, n))
    a[:4] = [0.0, -0.0, 2.0**-149, -(2.0**-149)]
    scaled_true = (a.astype(np.float64) / b.astype(np.float64)) * 2.0**-scale_exp
    tiny = np.abs(scaled_true) < 2.0**-126
    assert tiny.sum() > n // 4
    a, b = a[tiny], b[tiny]
    got = _fast_quotients(a, b, scale_exp)
    assert (np.abs(got) < 2.0**-110).all() and (np.signbit(got) == np.signbit(a)).all()
    name = next(name for name, (_, k) in hk.FP6_BY_FP8.items() if k == scale_exp)
    codes = _fp6_by_fp8_codes(got, name)
    assert np.array_equal(codes, np.where(np.signbit(a), 0x20, 0).astype(np.uint8)), name
    want = quantize(torch.from_numpy(a / b), FORMATS[name]).numpy()
    assert np.array_equal(codes, want), name


def _fp6_by_fp8_codes(scaled: np.ndarray, name: str) -> np.ndarray:
    """``helpers_kernel.fp6_words``'s codes of float32 values ``scaled`` (already times ``2^-k``), by its steps:
    torch's fp8 cast (nearest-even, as the hardware's conversion rounds; overflow gives NaN or inf where the
    hardware saturates, and ``fp6_words`` saturates every magnitude of 32 or more either way), then the
    byte-parallel saturation and sign move on words of four codes."""
    from mjolnir_kernel import helpers_kernel as hk

    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[hk.FP6_BY_FP8[name][0]]
    pad = -scaled.size % 4
    x = torch.from_numpy(np.concatenate([scaled, np.zeros(pad, np.float32)]))
    w = x.to(fp8).view(torch.uint8).numpy().view(np.uint32).astype(np.int64)  # four codes per word
    mag = w & 0x7F7F7F7F
    over = (mag + 0x60606060) & 0x80808080
    fill = over - ((over >> 7) & 0x01010101)
    out = (mag & ~fill) | (fill & 0x1F1F1F1F) | ((w >> 2) & 0x20202020)
    return out.astype(np.uint32).view(np.uint8)[: scaled.size]


def _float32_around_roundings(rng, lo_exp: int, hi_exp: int, random: int) -> np.ndarray:
    """float32 values of both signs, every exponent in ``[lo_exp, hi_exp]`` and every top-11 fraction pattern, each
    with its low 12 fraction bits at the values that decide an fp6 rounding of any of its alignments (0, the
    half-way point 0x800 and one ulp either side, all ones), plus ``random`` random finite float32."""
    sign, exponent, top, low = np.meshgrid(
        np.arange(2), np.arange(lo_exp, hi_exp + 1), np.arange(1 << 11), np.array([0, 1, 0x7FF, 0x800, 0x801, 0xFFF]),
        indexing="ij",
    )  # fmt: skip
    grid = ((sign << 31) | ((exponent + 127) << 23) | (top << 12) | low).ravel().astype(np.uint32)
    rand = rng.integers(0, 1 << 32, random, dtype=np.uint64).astype(np.uint32)
    rand = rand[(rand & 0x7F800000) != 0x7F800000]  # finite
    return np.concatenate([grid, rand]).view(np.float32)


@pytest.mark.parametrize("name", ["e2m3", "e3m2"])
def test_fp6_codes_through_the_fp8_conversions_are_the_reference_codes(name, sample_size):
    """``fp6_words`` (the writer's fp6 codes: the fp8 conversion of ``x * 2^-k``, saturated, the sign moved)
    gives ``quantize``'s codes for every float32 tested: each sign, each exponent from below the fp6 subnormals
    to far beyond the overflow, each top-11 fraction pattern with its low bits at the ties and one ulp either
    side, and random finite values (every finite float32 at ``MJOLNIR_TEST_SIZE=full``, in chunks)."""
    from mjolnir_kernel import helpers_kernel as hk
    from mjolnir_numerics import quantize

    fmt, scale = FORMATS[name], np.float32(2.0 ** -hk.FP6_BY_FP8[name][1])
    rng = np.random.default_rng(10)
    if test_size_name() == "full":
        chunks = (np.arange(c, c + (1 << 26), dtype=np.uint32) for c in range(0, 1 << 32, 1 << 26))
        chunks = (c[(c & 0x7F800000) != 0x7F800000].view(np.float32) for c in chunks)
    else:
        chunks = [_float32_around_roundings(rng, -12, 12, sample_size)]
    for x in chunks:
        got = _fp6_by_fp8_codes(x * scale, name)  # x * 2^-k: the writer's scaled quotient
        want = quantize(torch.from_numpy(x), fmt).numpy()
        wrong = np.flatnonzero(got != want)
        assert wrong.size == 0, (
            f"{name}: {wrong.size} codes differ, e.g. {x[wrong[:4]]}: {got[wrong[:4]]} != {want[wrong[:4]]}"
        )


def _e2m1_index(x: np.ndarray) -> np.ndarray:
    """``helpers_kernel.round_to_odd_index`` at ``E2M1_INDEX_SHIFT`` of float32 ``x``, in numpy: the 12-bit index
    of the writer's e2m1 lookups (the top 12 bits, the sticky bit of the 20 cut off in bit 0)."""
    from mjolnir_kernel import helpers_kernel as hk

    b, s = x.view(np.uint32).astype(np.int64), hk.E2M1_INDEX_SHIFT
    low = (1 << s) - 1
    return (((b & low) + low) | b) >> s


def test_e2m1_table_gives_every_float32_its_reference_code(sample_size):
    """The NVFP4 encoder's and the cache writer's e2m1 lookups (``e2m1_table`` at the 12-bit round-to-odd
    index) give every float32 the spec's code. Exhaustive through the 65536-entry table, which is exact for
    every float32 (``quantize._round_to_odd_lut``): the 12-bit index is a function of the 16-bit one (its top 12
    bits, the sticky bit set where any of the low 4 is), so equal codes at all 65536 16-bit indices are equal
    codes for every float32. Then directly against the reference rounding (``_exact_codes``, no table) on values
    at every tie, one ulp either side, and random finite float32; and the table's placement: exponents 120-135
    of each sign in one 128-byte line."""
    from mjolnir_kernel import helpers_kernel as hk
    from mjolnir_numerics.formats import E2M1
    from mjolnir_numerics.quantize import _exact_codes, _round_to_odd_lut

    lut = _round_to_odd_lut(E2M1, "cpu")
    table = helpers.e2m1_table(lut)
    assert hk.E2M1_INDEX_SHIFT == 20 and table.shape == (4096,) and table.dtype == torch.uint8
    j = torch.arange(1 << 16)
    assert torch.equal(table[(j >> 4) | ((j & 0xF) != 0).long()], lut)
    x = _float32_around_roundings(np.random.default_rng(11), -10, 10, sample_size)
    lows = np.array([0, 1, (1 << 19) - 1, 1 << 19, (1 << 19) + 1, (1 << 20) - 1], dtype=np.uint32)
    at_index = ((np.arange(4096, dtype=np.uint32)[:, None] << 20) | lows).ravel()
    x = np.concatenate([x, at_index[(at_index & 0x7F800000) != 0x7F800000].view(np.float32)])
    got = table.numpy()[_e2m1_index(x)]
    want = _exact_codes(torch.from_numpy(x), E2M1).numpy()
    wrong = np.flatnonzero(got != want)
    assert wrong.size == 0, f"{wrong.size} codes differ, e.g. {x[wrong[:4]]}: {got[wrong[:4]]} != {want[wrong[:4]]}"
    for sign in (0, 1):
        first, last = (sign << 11) | (120 << 3), (sign << 11) | (135 << 3) | 7
        assert (table.data_ptr() + first) // 128 == (table.data_ptr() + last) // 128
    assert helpers.e2m1_table(lut) is table  # built once


def test_cache_writer_refuses_rows_and_slots_of_the_wrong_shape():
    """The writer's launch indexes the pools by the cache's geometry: rows of another shape, K and V that differ,
    or slots that do not match the rows are refused before any launch (checked on the CPU: nothing launches)."""
    pools = tuple(torch.zeros(8, 16, 2, 128, dtype=torch.uint8) for _ in "kv")
    descales = (torch.ones(2), torch.ones(2))
    lut = torch.zeros(1 << 16, dtype=torch.uint8)
    writer = helpers.CacheWriter(descales, pools, (None, None), element="e4m3", page_size=16, head_dim=128, lut=lut)
    rows, slots = torch.zeros(4, 2, 128), torch.arange(4)
    with pytest.raises(ValueError, match=r"^k, v: expected \(n_tokens, 2, 128\)"):
        writer(torch.zeros(4, 3, 128), torch.zeros(4, 3, 128), slots, None)
    with pytest.raises(ValueError, match=r"^k, v: expected"):
        writer(rows, torch.zeros(5, 2, 128), slots, None)
    with pytest.raises(ValueError, match=r"^slots, seq_ids: expected \(4,\)"):
        writer(rows, rows, torch.arange(3), None)
    with pytest.raises(ValueError, match="^page_size: the writer takes a power of two"):
        helpers.CacheWriter(descales, pools, (None, None), element="e4m3", page_size=24, head_dim=128, lut=lut)
    with pytest.raises(ValueError, match="^page_size: 32, but the pools' pages hold 16 slots"):
        helpers.CacheWriter(descales, pools, (None, None), element="e4m3", page_size=32, head_dim=128, lut=lut)


def test_cache_writer_takes_only_what_its_32_bit_index_arithmetic_reaches():
    """The writer's slots, in-page offsets and descale indices are 32-bit: pools of 2^31 slots and descales
    spanning 2^31 elements are refused at construction; the stride of a dim of size 1 is never used, so it may
    be anything (the kernel gets 0). Meta tensors: the shapes and strides without the memory."""

    def meta(shape, strides, dtype=torch.uint8):
        return torch.empty_strided(shape, strides, dtype=dtype, device="meta")

    lut = torch.zeros(1 << 16, dtype=torch.uint8)
    options = dict(element="e4m3", page_size=16, head_dim=128, lut=lut)
    ones = (torch.ones(2), torch.ones(2))
    huge = tuple(meta((1 << 27, 16, 2, 128), (4096, 256, 128, 1)) for _ in "kv")
    with pytest.raises(ValueError, match="^pools: the writer cannot store into them: the pools hold 2"):
        helpers.CacheWriter(ones, huge, (None, None), **options)
    per_seq = tuple(meta((2, 2), (1 << 31, 1), torch.float32) for _ in "kv")
    pools = tuple(meta((8, 16, 2, 128), (4096, 256, 128, 1)) for _ in "kv")
    with pytest.raises(ValueError, match="^descales: the writer's 32-bit index"):
        helpers.CacheWriter(per_seq, pools, (None, None), **options)
    one_head = tuple(meta((8, 16, 1, 128), (2048, 128, 1 << 40, 1)) for _ in "kv")  # h_k = 1, any head stride
    writer = helpers.CacheWriter((torch.ones(1), torch.ones(1)), one_head, (None, None), **options)
    assert writer.scalars[9:12] == (2048, 128, 0)  # the pool's page, row and head strides in bytes
