"""The hardware arithmetic models (``mjolnir_numerics.arithmetic``, ``emulator_stages.log_libdevice_f32``):
hand cases that tell the tensor core's block FMA from the ideal dot product, outputs of the H200's own
``mma.sync`` (tests/data/h200_mma_vectors.npz: 6 instructions of each sweep category, recorded by
``python -m benchmarks.probes.arithmetic_sweep --parts mma`` on 2026-12-01), the fast path against the
slow one, the tile walks, the libdevice log, the H200's ex2 (``exp2_sm90_f32`` against the outputs and the
per-binade histogram of a second, independent sweep: reports/hopper/2026-12-01-arithmetic/ex2.json), and
CPU = CUDA."""

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mjolnir_numerics.arithmetic import (
    MMA_MODELS,
    block_fma,
    chain_fma,
    chain_gemm,
    ideal_block,
    kstep_groups,
    round_nearest_f32,
    round_nearest_grid,
    round_toward_zero_f32,
)
from mjolnir_numerics.emulator_stages import (
    div_f32,
    exp2_f32,
    exp2_sm90_f32,
    fma_f32,
    log_f32,
    log_libdevice_f32,
    mul_f32,
    round_bf16,
)
from tests.conftest import DEVICES, cuda_only, random_sample_size, test_size_name

VECTORS = Path(__file__).parents[1] / "data" / "h200_mma_vectors.npz"
EX2_SWEEP = Path(__file__).parents[2] / "reports" / "hopper" / "2026-12-01-arithmetic" / "ex2.json"
SM90 = {"f16": MMA_MODELS["sm90_f16"], "bf16": MMA_MODELS["sm90_bf16"]}
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def _f64(values, dtype=torch.float16):
    t = torch.tensor(values, dtype=torch.float64)
    assert bool(((t.to(dtype).double() == t) | t.isnan()).all()), "operand not representable"
    return t


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


# ------------------------------------------------------------------------------------------------------
# Hand cases
# ------------------------------------------------------------------------------------------------------
def test_block_rounds_toward_zero():
    """1 + 0.75 ulp(1): the ideal dot product rounds up to 1 + 2^-23, the block truncates to 1."""
    a, b, c = _f64([1.5 * 2**-12]), _f64([2.0**-12]), torch.tensor(1.0)
    assert float(ideal_block(a, b, c)) == 1 + 2**-23
    assert float(block_fma(a, b, c, SM90["f16"])) == 1.0


def test_block_truncates_each_term_to_the_alignment_grid():
    """Eight products of 0.75 * 2^-25 under c = 1 (grid 2^-25): each truncates to 0, so the block gives 1;
    their exact sum 1.5 ulp(1) would round toward zero to 1 + 2^-23."""
    a, b, c = _f64([1.5 * 2**-13] * 8), _f64([2.0**-13] * 8), torch.tensor(1.0)
    assert float(round_toward_zero_f32(((a * b).sum() + 1.0).reshape(1))) == 1 + 2**-23
    assert float(block_fma(a, b, c, SM90["f16"])) == 1.0
    assert float(block_fma(a, b, c, SM90["f16"], fast=False)) == 1.0


def test_block_keeps_two_extra_alignment_bits():
    """A product of 2^-25 under c = 1 is on the grid (kept), 2^-26 is below it (dropped): four of each give
    1 + 2^-23 (4 * 2^-25) and never the 1 + 1.5 * 2^-23 of keeping both."""
    a = _f64([2.0**-12] * 4 + [2.0**-13] * 4)
    b = _f64([2.0**-13] * 8)
    assert float(block_fma(a, b, torch.tensor(1.0), SM90["f16"])) == 1 + 2**-23
    a2 = _f64([2.0**-13] * 8)
    assert float(block_fma(a2, b, torch.tensor(1.0), SM90["f16"])) == 1.0


def test_zero_sum_is_positive_zero_and_nan_propagates():
    a, b = _f64([1.0, -1.0]), _f64([1.0, 1.0])
    z = block_fma(a, b, torch.tensor(-0.0), SM90["bf16"])
    assert float(z) == 0 and not math.copysign(1.0, float(z)) < 0
    n = block_fma(_f64([math.nan]), _f64([1.0]), torch.tensor(1.0), SM90["bf16"])
    assert math.isnan(float(n))


def test_block_refuses_more_products_than_the_instruction_adds():
    a = torch.ones(17, dtype=torch.float64)
    with pytest.raises(ValueError, match="a: 17 products per block, the sm90_f16 model takes 16"):
        block_fma(a, a, torch.tensor(0.0), SM90["f16"])


@pytest.mark.parametrize("name", ["sm90_bf16", "sm100_bf16"])
def test_block_model_subnormal_accumulator_and_zero_sign(name):
    """Two rules of the block model that random operands never reach, in its three implementations
    (``block_fma``, the float64 formula, the packed integer chain). A subnormal accumulator's exponent is
    taken as -126: c = 2^-140 beside sixteen products of 2^-152 sets the grid to 2^-151, so the products
    truncate away and the result is c (with -127 they would add 2^-148). A zero sum is +0: c = -0 and one
    product of -2^-152 on a grid of 2^-158 sum to -2^-152, which fp32 truncates toward zero to a zero of
    sign +."""
    from mjolnir_numerics import arithmetic

    model = MMA_MODELS[name]
    emin = arithmetic.OPERAND_FORMATS[model.operand][1]
    tiny = 2.0**-76  # bf16 normal; tiny * tiny = 2^-152
    a = torch.full((2, 1, model.block), tiny, dtype=torch.float64)
    b = torch.full((2, 1, model.block), tiny, dtype=torch.float64)
    a[1, 0, 1:] = 0.0
    a[1, 0, 0] = -tiny
    c = torch.tensor([[[2.0**-140]], [[-0.0]]], dtype=torch.float32)
    want_bits = _bits(torch.tensor([2.0**-140, 0.0], dtype=torch.float32))
    ref = torch.stack([block_fma(a[i, 0], b[i, 0], c[i, 0, 0], model) for i in range(2)]).reshape(2)
    f64 = arithmetic._chain_formula(
        a.float()[:, :, None, :], b.float()[:, :, None, :], c, model.extra_bits, model.min_exponent, emin
    ).reshape(2)
    packed = arithmetic._int_chain(
        arithmetic.pack_operands(a, model.operand)[:, :, None, :],
        arithmetic.pack_operands(b, model.operand)[:, :, None, :],
        c,
        name,
    ).reshape(2)
    for got in (ref, f64, packed):
        assert torch.equal(_bits(got.float()), want_bits), (name, got.tolist())


@pytest.mark.parametrize("sync_free", [False, True], ids=["risky-only", "to-odd-everywhere"])
def test_fp32_sums_round_once_where_the_float64_sum_is_an_fp32_midpoint(sync_free, monkeypatch):
    """``fma_f32`` and ``add_round_f32`` give the correctly rounded fp32 of the exact value where its float64
    rounding lands exactly on an fp32 midpoint, which rounding again would tie to even. Normal range: 1 plus
    a product 2^-24 + 4688 * 2^-70 (above the midpoint: 1 + 2^-23) or 2^-24 - 10000 * 2^-70 (below it, the
    float64 sum rounded away from zero: 1). fp32 subnormals: 2^-140 + 2^-150 + 2^-200 (above the midpoint:
    2^-140 + 2^-149). On the eager path, which re-rounds only the risky elements, and on the one that rounds
    to odd everywhere (no host round trip)."""
    import mjolnir_numerics.emulator_stages as stages

    monkeypatch.setattr(stages, "_sync_free", lambda x: sync_free)
    scale = 2.0**-35  # (2^23 + 2896)(2^23 - 2895) = 2^46 + 4688; (2^23 + 100)(2^23 - 100) = 2^46 - 10^4
    a = torch.tensor([(2**23 + 2896) * scale, (2**23 + 100) * scale], dtype=torch.float32)
    b = torch.tensor([(2**23 - 2895) * scale, (2**23 - 100) * scale], dtype=torch.float32)
    assert stages.fma_f32(a, b, torch.ones(2)).tolist() == [1 + 2**-23, 1.0]
    x = torch.tensor([2.0**-140 + 2.0**-150], dtype=torch.float64)
    y = torch.tensor([2.0**-200], dtype=torch.float64)
    assert stages.add_round_f32(x, y).tolist() == [2.0**-140 + 2.0**-149]
    assert stages.add_round_f32(x, -y).tolist() == [2.0**-140]  # below the midpoint


def test_round_toward_zero_keeps_subnormals_and_overflows_to_inf():
    x = torch.tensor([2.0**-149 * 1.75, -(1 + 2**-30), 2.0**128, 0.0], dtype=torch.float64)
    got = round_toward_zero_f32(x).tolist()
    assert got == [2.0**-149, -1.0, math.inf, 0.0]


# ------------------------------------------------------------------------------------------------------
# The H200's own outputs
# ------------------------------------------------------------------------------------------------------
def _hardware_cases():
    data = np.load(VECTORS)
    names = sorted({k.rsplit("__", 1)[0] for k in data.files})
    for name in names:
        operand = name.split("__")[0]
        dt = DTYPES[operand]
        a = torch.from_numpy(data[name + "__a"]).view(dt).double()  # (T, 16, 16)
        b = torch.from_numpy(data[name + "__b"]).view(dt).double()  # (T, 8, 16)
        yield name, operand, a, b, torch.from_numpy(data[name + "__c"]), torch.from_numpy(data[name + "__d"])


def _same(x, y):
    return (_bits(x) == _bits(y)) | (torch.isnan(x) & torch.isnan(y))


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
def test_model_reproduces_the_h200_mma(fast):
    """Every recorded output, bit for bit; the ideal model misses many (the vectors tell them apart)."""
    ideal_misses = total = 0
    for name, operand, a, b, c, d in _hardware_cases():
        aa, bb = a[:, :, None, :], b[:, None, :, :]
        got = block_fma(aa, bb, c, SM90[operand], fast=fast)
        assert bool(_same(got, d).all()), f"{name}: {int((~_same(got, d)).sum())} outputs differ from the H200"
        ideal_misses += int((~_same(ideal_block(aa, bb, c), d)).sum())
        total += d.numel()
    assert total == 21 * 6 * 128 and ideal_misses > total // 10


def test_fast_path_equals_slow_path():
    gen = torch.Generator().manual_seed(7)
    for operand, (lo, hi) in (("f16", (-24, 15)), ("bf16", (-130, 120))):
        dt = DTYPES[operand]
        e = torch.randint(lo, hi, (4096, 16), generator=gen).double()
        a = ((1 + torch.rand(4096, 16, generator=gen).double()) * torch.exp2(e)).to(dt).double()
        b = torch.randn(4096, 16, generator=gen, dtype=torch.float64).to(dt).double()
        c = (torch.randn(4096, generator=gen) * torch.exp2(torch.randint(-20, 20, (4096,), generator=gen))).float()
        fast, slow = (block_fma(a, b, c, SM90[operand], fast=f) for f in (True, False))
        assert torch.equal(_bits(fast), _bits(slow)), operand


# ------------------------------------------------------------------------------------------------------
# Tile walks and chains
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("walk", ["mma_sync_sm90", "tcgen05"])
@pytest.mark.parametrize("kv_format", ["e4m3", "e2m1", "e3m2", "e2m3", "nvfp4"])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("q_dtype", ["e4m3", "bf16"])
def test_kstep_groups_partition_the_tile(walk, kv_format, head_dim, q_dtype):
    s, pv = kstep_groups(walk, kv_format, q_dtype, head_dim)
    assert torch.equal(s.reshape(-1).sort().values, torch.arange(head_dim))
    assert torch.equal(pv.reshape(-1).sort().values, torch.arange(128))
    assert s.shape[1] == (32 if walk == "tcgen05" and q_dtype == "e4m3" else 16)


def test_kstep_groups_register_walk_of_the_hopper_kernel():
    """K converted into the fragments: lane c of a quad holds head dims c d / 4 .. (c + 1) d / 4 - 1."""
    s, _ = kstep_groups("mma_sync_sm90", "e3m2", "bf16", 256)
    assert s[0].tolist() == [0, 1, 2, 3, 64, 65, 66, 67, 128, 129, 130, 131, 192, 193, 194, 195]
    s, _ = kstep_groups("mma_sync_sm90", "e2m1", "bf16", 128)
    assert s[1].tolist()[:4] == [1, 3, 5, 7]
    s, _ = kstep_groups("mma_sync_sm90", "e4m3", "bf16", 128)
    assert s[1].tolist() == list(range(16, 32))
    with pytest.raises(ValueError, match="walk: 'wgmma' is not one of"):
        kstep_groups("wgmma", "e4m3", "bf16", 128)


@pytest.mark.parametrize("kv_format", ["e2m1", "e3m2", "e2m3", "nvfp4"])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_kstep_groups_hopper_walk_by_who_converts_k(kv_format, head_dim):
    """Where the converter warps write K's e4m3 tile (fp6 at d = 128, NVFP4), S adds consecutive head dims as
    e4m3 KV's walk does; where K goes to registers (e2m1, fp6 at d = 256) it does not. P.V never changes."""
    walk = kstep_groups("mma_sync_sm90", kv_format, "e4m3", head_dim)
    e4m3 = kstep_groups("mma_sync_sm90", "e4m3", "e4m3", head_dim)
    from_a_tile = kv_format == "nvfp4" or (kv_format != "e2m1" and head_dim == 128)
    assert torch.equal(walk[0], e4m3[0]) == from_a_tile
    assert torch.equal(walk[1], e4m3[1])


def test_chain_order_matters_and_ideal_is_one_rounding():
    """Two instructions: the second block's exponent comes from the first's result, so the walk changes
    bits that the ideal model (one rounding of the whole contraction) never shows."""
    a = _f64([2.0**-12] * 16 + [1.0] + [0.0] * 15)
    b = _f64([2.0**-13] * 16 + [1.0] + [0.0] * 15)
    c = torch.tensor(0.0)
    fwd = torch.arange(32).view(2, 16)
    got = chain_fma(a, b, c, fwd, SM90["f16"])
    back = chain_fma(a, b, c, fwd.flip(0), SM90["f16"])
    # forward: 16 * 2^-25 = 2^-21 exact, then 1 + 2^-21 (on the grid 2^-25 of E = 0): exact
    # backward: 1 first, then sixteen 2^-25 terms under c = 1: kept, the same sum
    assert float(got) == float(back) == 1 + 2**-21
    fine = _f64([2.0**-13] * 16 + [1.0] + [0.0] * 15)
    f1 = chain_fma(fine, b, c, fwd, SM90["f16"])  # 16 * 2^-26 = 2^-22 first: exact, then + 1
    f2 = chain_fma(fine, b, c, fwd.flip(0), SM90["f16"])  # 1 first: each 2^-26 drops under c = 1
    assert (float(f1), float(f2)) == (1 + 2**-22, 1.0)
    assert float(chain_fma(fine, b, c, fwd, MMA_MODELS["ideal_f16"])) == 1 + 2**-22


def test_fused_chain_formula_equals_the_block_chain():
    """``chain_gemm``'s fused formula (run eagerly here; CUDA compiles it) against ``chain_fma`` of
    ``block_fma``: random operands over wide exponent ranges, zeros, a permuted walk, subnormal and zero
    accumulators, a NaN operand; f16 and bf16 models."""
    gen = torch.Generator().manual_seed(3)
    for operand, (lo, hi) in (("f16", (-24, 15)), ("bf16", (-60, 40))):
        dt = DTYPES[operand]

        def rnd(*shape, lo=lo, hi=hi, dt=dt):
            e = torch.randint(lo, hi, shape, generator=gen).double()
            x = (1 + torch.rand(shape, generator=gen, dtype=torch.float64)) * torch.exp2(e)
            x = (x * torch.randn(shape, generator=gen, dtype=torch.float64).sign()).to(dt).double()
            return torch.where(torch.rand(shape, generator=gen) < 0.1, 0.0, x)

        a, b = rnd(3, 6, 64), rnd(3, 40, 64)
        a[0, 0, 5] = math.nan
        c = (
            torch.randn(3, 6, 40, generator=gen) * torch.exp2(torch.randint(-30, 30, (3, 6, 40), generator=gen))
        ).float()
        c[1, :, :4] = 2.0**-140  # subnormal accumulators
        c[2, :, :4] = 0.0
        walk = torch.randperm(64, generator=gen).view(4, 16)
        want = chain_gemm(a, b, c, walk, SM90[operand], fused=False)
        import mjolnir_numerics.arithmetic as arithmetic

        saved = arithmetic._fused
        arithmetic._fused = lambda fn, tune=False: fn  # the formula itself, uncompiled
        try:
            got = chain_gemm(a, b, c, walk, SM90[operand], fused=True)
        finally:
            arithmetic._fused = saved
        assert bool(_same(got, want).all()), f"{operand}: {int((~_same(got, want)).sum())} differ"
        assert bool(torch.isnan(got[0, 0]).all()) and not bool(torch.isnan(got[1:]).any())
    with pytest.raises(ValueError, match="model: ideal_f16 is an ideal model"):
        chain_gemm(a, b, c, walk, MMA_MODELS["ideal_f16"])


@pytest.mark.parametrize("name", ["sm90_f16", "sm90_bf16", "sm100_e4m3", "sm100_bf16"])
def test_packed_integer_chain_equals_the_block_chain(name):
    """``arithmetic._int_chain`` on packed operands (what CUDA compiles for S) against ``chain_fma`` of
    ``block_fma`` and against the float64 formula (what CUDA compiles for P.V): operands over the operand
    format's exponent range (its subnormals included), zeros, a NaN operand, and zero, subnormal and NaN
    accumulators; tcgen05's K = 32 e4m3 steps sum in int64."""
    from mjolnir_numerics import arithmetic

    model = MMA_MODELS[name]
    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}[model.operand]
    # bf16 up to 2^60: every chain stays finite (infinities are not modelled)
    lo, hi = {"f16": (-26, 16), "bf16": (-134, 60), "e4m3": (-10, 9)}[model.operand]
    gen = torch.Generator().manual_seed(5)
    steps, k = 4, model.block

    def rnd(*shape):
        e = torch.randint(lo, hi, shape, generator=gen).double()
        x = (1 + torch.rand(shape, generator=gen, dtype=torch.float64)) * torch.exp2(e)
        x = (x * torch.randn(shape, generator=gen, dtype=torch.float64).sign()).to(dt).double()
        return torch.where(torch.rand(shape, generator=gen) < 0.1, 0.0, x)

    a, b = rnd(3, 6, steps * k), rnd(3, 40, steps * k)
    a[0, 0, 5] = math.nan
    # the largest sums: every product the largest significands at one exponent (int32 overflows for K = 32)
    top = {"f16": 2047 / 1024, "bf16": 255 / 128, "e4m3": 1.75}[model.operand] * 16
    a[1, 1], b[1, 1] = top, top
    # a zero operand's exponent must sit below every product's: tiny products beside a zero times the largest
    # operand (bf16 catches a zero-exponent sentinel as high as -100)
    a[2, 2], b[2, 3] = 2.0 ** (lo // 3), 2.0 ** (lo // 3)
    a[2, 2, 5], b[2, 3, 5] = 0.0, 2.0 ** (hi - 1)
    c = (torch.randn(3, 6, 40, generator=gen) * torch.exp2(torch.randint(-30, 30, (3, 6, 40), generator=gen))).float()
    c[1, :, :4] = 2.0**-140
    c[1, 1, 1] = 0.0
    c[2, :, :4] = 0.0
    c[2, 0, 4] = math.nan
    walk = torch.arange(steps * k).view(steps, k)
    want = chain_fma(a[..., :, None, :], b[..., None, :, :], c, walk, model)
    pa = arithmetic.pack_operands(a, model.operand).unflatten(-1, (steps, k))
    pb = arithmetic.pack_operands(b, model.operand).unflatten(-1, (steps, k))
    got = arithmetic._int_chain(pa, pb, c, name)
    emin = arithmetic.OPERAND_FORMATS[model.operand][1]
    f64 = arithmetic._chain_formula(
        a.float().unflatten(-1, (steps, k)), b.float().unflatten(-1, (steps, k)), c, model.extra_bits,
        model.min_exponent, emin,
    )  # fmt: skip
    assert bool(_same(got, want).all()), f"{name}: {int((~_same(got, want)).sum())} of {got.numel()} differ"
    assert bool(_same(f64, want).all())
    assert (
        bool(torch.isnan(got[0, 0]).all()) and bool(torch.isnan(got[2, 0, 4])) and not bool(torch.isnan(got[1]).any())
    )
    with pytest.raises(ValueError, match="products per step"):
        arithmetic._int_chain(pa[..., :-1], pb[..., :-1], c, name)


def test_e4m3_codes_pack_through_their_table():
    """``pack_fused`` packs float8 operands through a 256-entry table (Triton cannot compile float8): every
    code, NaN codes included, gives what packing its value gives."""
    from mjolnir_numerics import arithmetic

    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    for operand in ("f16", "bf16", "e4m3"):
        table = arithmetic.pack_fused(codes, operand)
        assert torch.equal(table, arithmetic.pack_operands(codes.float(), operand))
        assert int((table >> 16 == arithmetic._NAN_E).sum()) == 2  # 0x7F and 0xFF


@pytest.mark.parametrize("name", ["sm90_f16", "sm90_bf16", "sm100_e4m3"])
@pytest.mark.parametrize("device", DEVICES)
def test_s_chain_from_codes_gives_the_packed_chain(device, name, monkeypatch):
    """A float8 e4m3 ``b_rows`` (the cache's K on the fused path) takes the codes route: its uint8 codes in
    the walk's order and the 256-entry table of the model's operand format go into the chain's graph, which
    packs them there. Every code (NaN codes included; half the rest subnormal, and keys wholly subnormal,
    where the operand formats' exponent floors differ) against the chain on the same values packed apart, and
    against ``chain_fma``, on a shuffled walk, with K as the emulator hands it over (a transposed view, its
    leading dims broadcast). On the
    CPU the formula runs eagerly (inductor's C++ code for the integer chain does not compile, with or without
    the codes: torch 2.13); on CUDA compiled, as the emulator runs it."""
    from mjolnir_numerics import arithmetic

    gen = torch.Generator().manual_seed(8)
    model = MMA_MODELS[name]
    steps, k = 4, model.block
    a = torch.randint(0, 256, (2, 3, 5, steps * k), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
    a = torch.where(a.float().isnan(), 0.0, a.double())  # e4m3 values: exact in every operand format
    a[0, 0, 0, :4] = 0.0
    codes = torch.randint(0, 256, (1, 3, steps * k, 64), generator=gen, dtype=torch.uint8)
    sub = torch.rand(codes.shape, generator=gen) < 0.5
    sub[..., 2:10] = True  # keys 2-9 wholly subnormal: their blocks' exponent comes from the operand floor
    codes = torch.where(sub, codes & 0x87, codes)  # exponent field 0: subnormals and signed zeros
    codes[0, 0, :, :2] = torch.arange(256, dtype=torch.uint8).view(2, 128).T[: steps * k]  # codes 0 .. 255
    if steps * k < 128:
        codes[0, 1, :, :2] = torch.arange(256, dtype=torch.uint8).view(2, 128).T[-steps * k :]
    b8 = codes.view(torch.float8_e4m3fn).transpose(-1, -2)  # (1, 3, 64, steps * k), not contiguous
    c = torch.zeros(2, 3, 5, 64)
    c[1] = torch.randn(3, 5, 64, generator=gen)
    walk = torch.randperm(steps * k, generator=gen).view(steps, k)
    seen = []
    real = arithmetic._int_chain_codes
    monkeypatch.setattr(arithmetic, "_int_chain_codes", lambda *args: seen.append(1) or real(*args))
    if device == "cpu":
        monkeypatch.setattr(arithmetic, "_fused", lambda fn, tune=False: fn)
    got = chain_gemm(a.to(device), b8.to(device), c.to(device), walk, model, fused=True).cpu()
    assert seen, "the float8 operand did not take the codes route"
    apart = chain_gemm(a.to(device), b8.float().to(device), c.to(device), walk, model, fused=True).cpu()
    want = chain_fma(a[..., :, None, :], b8.double()[..., None, :, :], c, walk, model)
    assert bool(_same(got, apart).all()), f"{int((~_same(got, apart)).sum())} differ from the packed chain"
    assert bool(_same(got, want).all())
    nan_cols = torch.isnan(b8[0].float()).any(-1)  # keys holding a NaN code
    assert bool(nan_cols.any()) and bool(torch.isnan(got.transpose(-1, -2)[:, nan_cols]).all())


# ------------------------------------------------------------------------------------------------------
# The libdevice log
# ------------------------------------------------------------------------------------------------------
def test_log_libdevice_is_within_one_ulp_and_not_always_correctly_rounded():
    x = torch.arange(0x3F800000, 0x3F800000 + (1 << 18), 7, dtype=torch.int32).view(torch.float32)
    x = torch.cat([x, x * 1000.0, x * 2.0**-140, x * 2.0**100])
    d = (_bits(log_libdevice_f32(x)).long() - _bits(log_f32(x)).long()).abs()
    assert int(d.max()) == 1 and int((d == 1).sum()) > 0


def test_log_libdevice_special_values():
    x = torch.tensor([0.0, -0.0, -1.0, math.inf, math.nan, 1.0, 2.0**-149], dtype=torch.float32)
    got = log_libdevice_f32(x)
    assert got[:2].tolist() == [-math.inf, -math.inf] and math.isnan(got[2]) and got[3] == math.inf
    assert math.isnan(got[4]) and got[5] == 0.0
    assert float(got[6]) == pytest.approx(-149 * math.log(2), rel=1e-7)
    with pytest.raises(ValueError, match="x: expected float32"):
        log_libdevice_f32(torch.ones(2, dtype=torch.float64))


# ------------------------------------------------------------------------------------------------------
# The H200's ex2 (the table was written by the ex2_raw sweep of 2026-12-02; ex2.json by the ex2 sweep of
# 2026-12-01, a different run over every input)
# ------------------------------------------------------------------------------------------------------
def _binade_inputs(k: int) -> torch.Tensor:
    start = 0x80000000 | ((126 - k) << 23)  # |x| in [2^-(k+1), 2^-k), in bit order
    return torch.arange(start, start + (1 << 23), dtype=torch.int64).to(torch.int32).view(torch.float32)


def test_ex2_model_gives_the_outputs_the_h200_gave():
    """The 40 (x, hw) pairs that the 2026-12-01 sweep kept where the H200 was not correctly rounded,
    including x < -1 (the shift structure)."""
    pairs = json.loads(EX2_SWEEP.read_text())["hw_not_model"]
    x = torch.tensor([a for a, _ in pairs], dtype=torch.float32)
    hw = torch.tensor([b for _, b in pairs], dtype=torch.float32)
    assert len(pairs) == 40 and bool((x < -1).any())
    assert torch.equal(_bits(exp2_sm90_f32(x)), _bits(hw))
    assert not bool((_bits(exp2_f32(x)) == _bits(hw)).any())


@pytest.mark.slow
def test_ex2_model_has_the_h200s_histogram_in_every_binade():
    """Per binade of [-1, -2^-25): the model's ulp differences from correct rounding are those the
    2026-12-01 sweep counted on the H200, value by value; the model is monotone and within -2..+1 ulp."""
    per_binade = json.loads(EX2_SWEEP.read_text())["per_binade"]
    last = prev = None
    binades = range(25) if test_size_name() == "full" else (0, 1, 7, 8, 21, 22, 23, 24)  # small: CI's
    for k in binades:
        x = _binade_inputs(k)
        y = exp2_sm90_f32(x)
        d = _bits(y).long() - _bits(exp2_f32(x)).long()
        vals, counts = torch.unique(d, return_counts=True)
        assert {str(v): c for v, c in zip(vals.tolist(), counts.tolist())} == per_binade[str(k)], k
        assert bool((y[1:] <= y[:-1]).all()), k  # bit order runs away from 0: ex2 falls
        if last is not None and k == prev + 1:
            assert float(y[0]) >= last  # the binade nearer 0 ends at or above this one's start
        last, prev = float(y[-1]), k


def test_ex2_model_shift_special_values_and_domain():
    x = -torch.tensor([19661, 45875, 1, 65535], dtype=torch.float32) * 2.0**-16  # x - n exact for n < 128
    for n in (1, 5, 60, 125):
        assert torch.equal(exp2_sm90_f32(x - n).double(), exp2_sm90_f32(x).double() * 2.0**-n), n
    special = [0.0, -0.0, -1.0, -3.0, -126.0, -126.5, -127.0, -150.0, -1e30, -3e38, -math.inf]
    got = exp2_sm90_f32(torch.tensor(special, dtype=torch.float32))
    assert got.tolist() == [1.0, 1.0, 0.5, 0.125, 2.0**-126, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert math.isnan(float(exp2_sm90_f32(torch.tensor([math.nan]))[0]))
    with pytest.raises(ValueError, match="x: the sm_90 ex2 model covers x <= 0"):
        exp2_sm90_f32(torch.tensor([-1.0, 1e-30]))
    with pytest.raises(TypeError, match="x: expected float32"):
        exp2_sm90_f32(torch.zeros(2, dtype=torch.float64))
    # unchecked (the emulator's: its inputs are never positive, and a check would ask the device)
    x = torch.tensor([-0.75, -3.5, -0.0], dtype=torch.float32)
    assert torch.equal(exp2_sm90_f32(x, check=False), exp2_sm90_f32(x))
    assert exp2_sm90_f32(torch.tensor([1e-30]), check=False).tolist() == [1.0]


def test_round_nearest_is_the_float32_and_e5m2_conversion():
    """The integer rounding of float64 to fp32 against torch's conversion: random bit patterns of every
    exponent, values on and next to fp32 midpoints from the subnormal range to past the overflow threshold
    (both signs), and the special values."""
    gen = torch.Generator().manual_seed(11)
    n = random_sample_size()
    rand = torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen, dtype=torch.int64)
    e = torch.randint(850, 1160, (n,), generator=gen)
    frac = torch.randint(0, 2**52, (n,), generator=gen)
    near = ((frac >> 29) << 29) | (1 << 28)  # an fp32 midpoint's fraction, then one float64 ulp either side
    near = near + torch.randint(-1, 2, (n,), generator=gen)
    frac = torch.where(torch.rand(n, generator=gen) < 0.5, near, frac)
    sign = torch.randint(0, 2, (n,), generator=gen) << 63
    special = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, math.nan, 2.0**-149, 2.0**-150, 3 * 2.0**-151, -(2.0**-150) * 1.5,
         2.0**128, 2.0**128 - 2.0**103, 2.0**128 - 2.0**104, -(2.0**128 - 2.0**103), 1e-320,
         2.0**-126 * (1 - 2.0**-25)],
        dtype=torch.float64,
    )  # fmt: skip
    x = torch.cat([rand.view(torch.float64), (sign | (e << 52) | frac).view(torch.float64), special])
    assert bool(_same(round_nearest_f32(x), x.float()).all())
    # the same rounding on e5m2's grid (P's e5m2 knob) against torch's cast, from every binade of fp32
    y = torch.cat([x.float(), (torch.rand(n, generator=gen) * 2.0 ** torch.randint(-30, 18, (n,), generator=gen))])
    y = torch.cat([y, torch.tensor([57344.0, 61440.0, 61439.996, 2.0**-16, 2.0**-17, 3 * 2.0**-18, -(2.0**-17)])])
    assert bool(_same(round_nearest_grid(y.double(), 2, -14, 16).float(), y.to(torch.float8_e5m2).float()).all())
    with pytest.raises(TypeError, match="x: expected float64"):  # float32 bits read as float64 would be garbage
        round_nearest_f32(torch.ones(4))


def _chains(a, b, c):
    """Emulated fp32 operations chained in one graph, each rounded by the forms the compiled stages use."""
    for _ in range(4):
        c = fma_f32(a, b, c)
        c = div_f32(c, b)
        a = round_bf16(mul_f32(a, c))
    return a, c


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_chains_keep_every_float32_rounding(device, monkeypatch):
    """Chains of emulated fp32 fma, division, product and bf16 rounding compiled into one graph give the eager
    bits: the compiler (inductor; on CUDA Triton, torch 2.11 with its ``pointless_convert`` pass) must keep
    every rounding. Also the exp2, sm_90 ex2 and libdevice log models compiled."""
    import mjolnir_numerics.emulator_stages as stages

    monkeypatch.setattr(stages, "_sync_free", lambda x: True)  # the branch-free forms the compiled stages take
    gen = torch.Generator().manual_seed(12)
    a, b, c = (torch.randn(1 << 16, generator=gen) * 2.0 ** torch.randint(-60, 60, (1 << 16,), generator=gen)
               for _ in range(3))  # fmt: skip
    want = _chains(a, b, c)
    got = torch.compile(_chains, fullgraph=True, dynamic=True)(a.to(device), b.to(device), c.to(device))
    for w, g in zip(want, got):
        assert bool(_same(w, g.cpu()).all())
    stages.load_tables(torch.device(device), True)
    x = torch.cat([-torch.rand(1 << 16, generator=gen) * 150, torch.randn(1 << 10, generator=gen) * 200])
    x = torch.cat([x, stages._exp2_hard_table(torch.device("cpu"))[0].view(torch.float32) - 7])
    sm90 = functools.partial(exp2_sm90_f32, check=False)
    for fn, arg in ((exp2_f32, x), (sm90, -x.abs()), (log_libdevice_f32, x.abs())):
        got = torch.compile(fn, fullgraph=True, dynamic=True)(arg.to(device)).cpu()
        assert bool(_same(fn(arg), got).all()), fn


# ------------------------------------------------------------------------------------------------------
# CPU = CUDA
# ------------------------------------------------------------------------------------------------------
@cuda_only
def test_models_identical_on_cpu_and_cuda():
    for name, operand, a, b, c, _ in _hardware_cases():
        aa, bb = a[:, :, None, :], b[:, None, :, :]
        cpu = block_fma(aa, bb, c, SM90[operand])
        gpu = block_fma(aa.cuda(), bb.cuda(), c.cuda(), SM90[operand]).cpu()
        assert bool(_same(cpu, gpu).all()), name
    x = torch.arange(0, 1 << 31, 4099, dtype=torch.int64).to(torch.int32).view(torch.float32)
    assert torch.equal(_bits(log_libdevice_f32(x)), _bits(log_libdevice_f32(x.cuda()).cpu()))
    x = -torch.arange(0, 1 << 30, 1021, dtype=torch.int64).to(torch.int32).view(torch.float32)  # [-2, 0]
    x = torch.cat([x, x * 37.0])
    assert torch.equal(_bits(exp2_sm90_f32(x)), _bits(exp2_sm90_f32(x.cuda()).cpu()))
