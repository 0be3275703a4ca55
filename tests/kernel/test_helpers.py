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

from conftest import cuda_only


def test_not_available_on_the_cpu():
    assert not helpers.available("cpu")
    assert not helpers.available(torch.device("cpu"))


def test_write_unsupported_names_what_the_writer_cannot_take():
    pool = torch.empty(4, 16, 2, 64, dtype=torch.uint8)  # 4-bit rows of d = 128
    assert helpers.write_unsupported(pool, None, 128, 4) is None
    assert "multiple of 16" in helpers.write_unsupported(pool, None, 120, 4)
    odd = torch.empty(4, 16, 2, 68, dtype=torch.uint8)[..., :64]  # rows 68 bytes apart: not 8-byte aligned
    assert "8-byte aligned" in helpers.write_unsupported(odd, None, 128, 4)
    assert helpers.write_unsupported(odd, None, 128, 6) is None  # 6-bit chunks need 4 bytes only
    scales = torch.empty(4, 16, 8, 2, dtype=torch.uint8).transpose(-1, -2)
    assert "scale rows" in helpers.write_unsupported(pool, scales, 128, 4)


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
            yield f"write {element} nvfp4={nvfp4} bf16={bf16} per_seq={per_seq}", kernel, ptrs, (i64,) * 18 + (f32,)


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
    its range, n < 2^30, and refused for d < 1."""
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
        assert mult < 1 << 33 and (n.max().item() * mult) < 1 << 63
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


def _fast_quotients(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``helpers_kernel.quotient_fast`` with each float32 operation computed exactly and rounded once (a
    float32 product is exact in float64; an FMA is an exact float64 value, or an exact TwoSum pair, rounded
    once): ``recip = fp32(1 / b)``, ``q0 = fp32(a * recip)``, ``res = fma(-b, q0, a)``, ``q = fma(res, recip, q0)``
    with the sign of ``a``."""
    recip = (np.float32(1.0) / b).astype(np.float64)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    q0 = (a64 * recip).astype(np.float32).astype(np.float64)
    res = (a64 - b64 * q0).astype(np.float32).astype(np.float64)  # a - b q0 is exact in float64 here
    p = res * recip  # exact: two 24-bit significands
    s = q0 + p
    bb = s - q0
    err = (q0 - (s - bb)) + (p - bb)  # TwoSum: s + err == q0 + p exactly
    q = _round_to_float32(s, err).view(np.uint32)
    return ((q & np.uint32(0x7FFFFFFF)) | (a.view(np.uint32) & np.uint32(0x80000000))).view(np.float32)


def _float32_bits(sign, exponent, mantissa) -> np.ndarray:
    return ((sign << 31) | ((exponent + 127) << 23) | mantissa).astype(np.uint32).view(np.float32)


def test_fast_quotients_are_the_correctly_rounded_ones_where_the_writer_takes_them():
    """The writer's division sequence (one reciprocal, a product, two FMAs; Markstein's theorem) gives IEEE
    float32 division's bits for every ``|x| in [2^-100, 2^100)`` and divisor in ``[2^-20, 2^20)``, the bounds of
    ``fast_division_ok``: random operands, quotients next to rounding midpoints (the hard cases), divisors
    with all-ones significands, and the bounds themselves."""
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
    keep = (np.abs(a) >= 2.0**-100) & (np.abs(a) < limit)
    a, b = a[keep], b[keep]
    assert a.size > n * 0.9
    want = (a / b).view(np.uint32)
    got = _fast_quotients(a, b).view(np.uint32)
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
