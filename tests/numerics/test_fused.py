"""The fused helper paths give the reference's bits.

On the CPU the fused formulas run eagerly against the reference functions (the formulas are right); on a
GPU the helpers themselves run compiled (the compiler keeps the bits): every float32 bit pattern for the
element quantizers, every code for packing, the NVFP4 recipes, every format and layout for the cache
writer, and a decode-step write captured in a CUDA graph.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from mjolnir_numerics import fused
from mjolnir_numerics.cache import LAYOUTS, PagedKVCache
from mjolnir_numerics.formats import E2M1, E2M3, E3M2, E4M3, FORMATS
from mjolnir_numerics.nvfp4 import nvfp4_quantize
from mjolnir_numerics.packing import pack
from mjolnir_numerics.quantize import _exact_codes, _round_to_odd_lut, quantize

from conftest import cuda_only

ELEMENT_FORMATS = (E4M3, E3M2, E2M3, E2M1)
NVFP4_RECIPES = (
    {},
    {"four_over_six": True},
    {"scale_floor": None},
    {"scale_floor": 2.0**-6},
    {"global_scale": "flashinfer"},
)


def _probe_bits(n_random: int, seed: int = 0) -> torch.Tensor:
    """float32 patterns: every bfloat16 pattern with each low half that matters for rounding (0, 1, the
    half-way 0x8000 and its neighbours, all ones), then random patterns. int32 ``(m,)``."""
    high = torch.arange(1 << 16, dtype=torch.int64) << 16
    lows = torch.tensor([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int64)
    grid = (high[:, None] | lows[None, :]).reshape(-1)
    rand = torch.randint(0, 1 << 32, (n_random,), generator=torch.Generator().manual_seed(seed))
    p = torch.cat([grid, rand])
    return torch.where(p >= 1 << 31, p - (1 << 32), p).to(torch.int32)  # the same 32 bits as int32


def _rows(n: int, heads: int, d: int, seed: int, spread: float = 6.0) -> torch.Tensor:
    """Rows with magnitudes over ``spread`` binades either side of 1 and exact zeros."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, heads, d, generator=gen) * torch.exp2(
        torch.empty(n, heads, d).uniform_(-spread, spread, generator=gen)
    )
    x[torch.rand(n, heads, d, generator=gen) < 0.02] = 0.0
    return x


# -- the formulas, eagerly, against the reference (CPU) ----------------------------------------------
def test_probe_bits_cover_both_signs_and_the_rounding_cases():
    bits = _probe_bits(0)
    assert bits.numel() == 6 << 16 and torch.unique(bits).numel() == bits.numel()
    assert (bits < 0).any() and (bits > 0).any()


@pytest.mark.parametrize("fmt", ELEMENT_FORMATS, ids=lambda f: f.name)
def test_quantize_formula_is_the_direct_rounding(fmt):
    x = _probe_bits(1 << 18).view(torch.float32)
    got = fused.quantize_f32(x, _round_to_odd_lut(fmt, "cpu"))
    assert torch.equal(got, _exact_codes(x, fmt))
    halves = x[:4096].to(torch.bfloat16)
    assert torch.equal(fused.quantize_f32(halves, _round_to_odd_lut(fmt, "cpu")), _exact_codes(halves.float(), fmt))


def test_div_rn_is_float32_division():
    gen = torch.Generator().manual_seed(3)
    a = _probe_bits(1 << 18, seed=1).view(torch.float32)
    b = torch.randint(1, 0x7F800000, a.shape, generator=gen, dtype=torch.int32).view(torch.float32)  # positive, finite
    want, got = a / b, fused.div_rn(a, b)
    same = (want.view(torch.int32) == got.view(torch.int32)) | (torch.isnan(want) & torch.isnan(got))
    assert bool(same.all()), f"{int((~same).sum())} quotients differ, e.g. {a[~same][:3]} / {b[~same][:3]}"
    assert (want.abs() < 2.0**-126).any() and torch.isinf(want).any()  # subnormal and overflowing quotients tried


@pytest.mark.parametrize("bits", [8, 6, 4])
def test_pack_formula_is_pack(bits):
    codes = torch.randint(0, 1 << bits, (5, 3, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(bits))
    assert torch.equal(fused.pack_codes(codes, bits=bits), pack(codes, bits))


@pytest.mark.parametrize("fmt", ELEMENT_FORMATS, ids=lambda f: f.name)
def test_element_row_encoding_is_quantize_then_pack(fmt):
    x = _rows(64, 4, 32, seed=7)
    x[0, 0, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e30])
    descale = torch.tensor([0.5, 3.0, 1e-3, 7.0]).reshape(1, 4, 1)
    want = pack(quantize(x / descale, fmt), fmt.bits)
    assert torch.equal(fused.encode_elements(x, descale, _round_to_odd_lut(fmt, "cpu"), bits=fmt.bits), want)


def _nvfp4_oracle(x: torch.Tensor, g: torch.Tensor, floor):
    """NVFP4's default recipe in float32 eager arithmetic, step by step (the recipe as published)."""
    xg = x.reshape(*x.shape[:-1], -1, 16)
    scaled = (xg.abs().amax(-1) / torch.tensor(6.0)) / g
    if floor is not None:
        scaled = torch.clamp(scaled, min=floor)
    scales = quantize(scaled, E4M3)
    total = E4M3.values()[scales.long()].unsqueeze(-1) * g.unsqueeze(-1)
    ratio = torch.where(total > 0, xg / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(xg))
    return quantize(ratio, E2M1).reshape(x.shape), scales


@pytest.mark.parametrize("floor", [2.0**-9, 2.0**-6, None])
def test_nvfp4_encoder_is_the_published_recipe(floor):
    x = _rows(32, 4, 64, seed=11, spread=10.0).reshape(128, 64)
    x[3] = 0.0
    x[5, :16] = 1e-38  # a block whose scale hits the floor (or underflows without one)
    g = (torch.rand(128, 1, generator=torch.Generator().manual_seed(2)) + 0.5) * x.abs().amax() / 2688
    want_codes, want_scales = _nvfp4_oracle(x, g, floor)
    t = nvfp4_quantize(x, global_value=g, scale_floor=floor)
    assert torch.equal(t.codes, want_codes) and torch.equal(t.scales, want_scales)


# A block whose scale (amax / 6) / g is 136.0000051 with each division rounded to float32 (136.0 in float32:
# e4m3's tie between 128 and 144, to even: 128) but 136.0000078 with one rounding (float32 136.0000153:
# 144). Compiled for CUDA, the encoder once rounded once (the H200, 2026-12-03).
TIE_AMAX, TIE_G = 1.490891695022583, 0.0018270730506628752  # both float32 values


def _tie_block() -> torch.Tensor:
    x = torch.zeros(1, 1, 16)
    x[0, 0, 0], x[0, 0, 3] = TIE_AMAX, -0.5
    return x


def test_nvfp4_block_scale_rounds_each_division_to_float32():
    twice = float(torch.tensor(float(torch.tensor(TIE_AMAX / 6.0)) / TIE_G))
    once = float(torch.tensor(TIE_AMAX / 6.0 / TIE_G))
    assert (twice, once) == (136.0, 136.00001525878906)  # the case tells the two apart
    t = nvfp4_quantize(_tie_block()[0], global_value=TIE_G)
    assert t.scale_values().flatten().tolist() == [128.0]


def _tie_cache(device) -> PagedKVCache:
    g = torch.tensor(TIE_G)
    x = _tie_block()
    return PagedKVCache.from_float(
        [x], [x], "nvfp4", page_size=16, granularity="per_tensor", k_descale=g, v_descale=g, shuffle=False,
        poison=False, spare_pages=0, device=device,
    )  # fmt: skip


# -- on the GPU: the directly launched kernels and the compiled formulas ----------------------------
@pytest.fixture(params=["kernel", "compiled"])
def cuda_path(request, monkeypatch):
    """Run a CUDA test through the helper kernels (mjolnir_kernel.helpers) and through the compiled
    formulas (``MJOLNIR_KERNELS=0``), asserting that the path asked for is the one the helpers take."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    if request.param == "compiled":
        monkeypatch.setenv("MJOLNIR_KERNELS", "0")
        assert fused.helper_kernels("cuda") is None and fused.available("cuda")
    elif fused.helper_kernels("cuda") is None:
        from mjolnir_kernel.compile import cutlass_available

        pytest.skip(f"the helper kernels do not run here: {cutlass_available() or 'compute capability < 9.0'}")
    return request.param


@cuda_only
@pytest.mark.parametrize("fmt", ELEMENT_FORMATS, ids=lambda f: f.name)
def test_cuda_quantize_is_exact_on_every_float32(fmt):
    """All 2^32 float32 bit patterns, in chunks: the helpers' CUDA path (the helper kernel where it runs)
    against the direct integer rounding."""
    assert fused.available("cuda"), "the fused path must be on for this test to mean anything"
    chunk = 1 << 28
    for start in range(-(1 << 31), 1 << 31, chunk):
        x = torch.arange(start, start + chunk, dtype=torch.int64, device="cuda").to(torch.int32).view(torch.float32)
        got, want = quantize(x, fmt), _exact_codes(x, fmt)
        assert torch.equal(got, want), f"{fmt.name}: bit patterns from {start:#x} differ"


@cuda_only
def test_cuda_quantize_of_half_inputs_is_the_cpu_one(cuda_path):
    x = _probe_bits(0).view(torch.float32)
    for dtype in (torch.float16, torch.bfloat16):
        h = x.to(dtype)
        for fmt in ELEMENT_FORMATS:
            assert torch.equal(quantize(h.cuda(), fmt).cpu(), quantize(h, fmt)), f"{fmt.name} from {dtype}"


@cuda_only
@pytest.mark.parametrize("bits", [8, 6, 4])
def test_cuda_pack_is_the_cpu_pack_on_every_code(bits, cuda_path):
    n = 1 << bits
    pairs = torch.cartesian_prod(torch.arange(n), torch.arange(n)).reshape(-1, 4)  # every code in every position
    codes = torch.cat([pairs, torch.randint(0, n, (1 << 18, 4))]).to(torch.uint8)
    assert torch.equal(pack(codes.cuda(), bits).cpu(), pack(codes, bits))
    assert torch.equal(pack(codes.cuda(), bits, check=False).cpu(), pack(codes, bits))
    with pytest.raises(ValueError, match=r"^codes: values must be in"):
        pack(codes.cuda().int() + n, bits)


@cuda_only
def test_cuda_nvfp4_is_the_cpu_nvfp4(cuda_path):
    x = _rows(64, 8, 128, seed=13, spread=12.0)
    x[1] = 0.0
    for kw in NVFP4_RECIPES:
        a = nvfp4_quantize(x, **kw)
        for check in (True, False):
            b = nvfp4_quantize(x.cuda(), **kw, check=check)
            for name in ("codes", "scales", "global_scale", "values", "kernel_values"):
                assert torch.equal(getattr(a, name), getattr(b, name).cpu()), f"{name} on CUDA with {kw}, {check=}"
    g = x.abs().amax(-1, keepdim=True) / 2688 * 1.3
    g[1] = 1.0
    a, b = nvfp4_quantize(x, global_value=g), nvfp4_quantize(x.cuda(), global_value=g.cuda())
    assert torch.equal(a.codes, b.codes.cpu()) and torch.equal(a.scales, b.scales.cpu())


@cuda_only
def test_cuda_nvfp4_rounds_each_division_of_the_block_scale(cuda_path):
    t = nvfp4_quantize(_tie_block()[0].cuda(), global_value=TIE_G)
    assert t.scale_values().flatten().tolist() == [128.0]
    want, got = _tie_cache("cpu"), _tie_cache("cuda")
    assert torch.equal(got.k_scales.view(torch.uint8).cpu(), want.k_scales.view(torch.uint8))
    assert torch.equal(got.k_pool.cpu(), want.k_pool)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 1023, 4097])
def test_cuda_quantize_tails_and_unaligned_inputs(n, cuda_path):
    """Sizes that leave a partial vector, and inputs that start off a 16-byte boundary."""
    x = _probe_bits(4096, seed=n).view(torch.float32)
    for fmt in ELEMENT_FORMATS:
        for t in (x[:n], x[1 : 1 + n], x[3 : 3 + n]):
            assert torch.equal(quantize(t.cuda(), fmt).cpu(), quantize(t, fmt)), f"{fmt.name}, {n} values"


@pytest.mark.parametrize("bits,rows,d", [(4, 3, 2), (4, 7, 6), (4, 5, 34), (6, 3, 4), (6, 5, 12), (6, 9, 132)])
def test_cuda_pack_tails_and_unaligned_codes(bits, rows, d, cuda_path):
    """Row counts and widths that leave a partial group of 16 codes, and codes off a 16-byte boundary."""
    flat = torch.randint(0, 1 << bits, (rows * d + 3,), generator=torch.Generator().manual_seed(d)).to(torch.uint8)
    for offset in (0, 1, 3):
        codes = flat[offset : offset + rows * d].view(rows, d)
        assert torch.equal(pack(codes.cuda(), bits, check=False).cpu(), pack(codes, bits)), (bits, rows, d, offset)


@pytest.mark.parametrize("shape", [(1, 16), (3, 5, 32), (7, 48)])
def test_cuda_nvfp4_odd_shapes_and_broadcast_scales(shape, cuda_path):
    """Few blocks (a partial thread block), any rank, one global value and per-row global values."""
    x = _rows(1, 1, math.prod(shape), seed=len(shape), spread=10.0).view(shape)
    g = x.abs().amax(-1, keepdim=True) / 2688
    for kw in ({}, {"global_value": 0.01}, {"global_value": g}, {"scale_floor": None}):
        gpu_kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        a, b = nvfp4_quantize(x, **kw), nvfp4_quantize(x.cuda(), **gpu_kw)
        assert torch.equal(a.codes, b.codes.cpu()) and torch.equal(a.scales, b.scales.cpu()), (shape, kw)


def _pool_bytes(cache: PagedKVCache) -> list[torch.Tensor]:
    return [t.view(torch.uint8).cpu() for t in cache.storage]


def _caches(fmt: str, layout: str, granularity: str, device: str) -> PagedKVCache:
    gen = torch.Generator().manual_seed(5)
    k = [torch.randn(40, 8, 128, generator=gen) * 3 for _ in range(4)]
    v = [torch.randn(40, 8, 128, generator=gen) for _ in range(4)]
    return PagedKVCache.from_float(k, v, fmt, page_size=16, layout=layout, granularity=granularity, device=device)


def _decode_step(cache: PagedKVCache, n: int, seed: int):
    """New K/V rows for ``n`` tokens of a decode step, their free slots (the spare pages) and sequences."""
    gen = torch.Generator().manual_seed(seed)
    k, v = torch.randn(n, 8, 128, generator=gen) * 3, torch.randn(n, 8, 128, generator=gen)
    used = set(cache.block_table[:, :3].reshape(-1).tolist())
    free = [p for p in range(cache.num_pages) if p not in used]
    slots = torch.tensor([free[i % len(free)] * 16 + i // len(free) for i in range(n)])
    return k, v, slots, torch.arange(n) % cache.num_seqs


@cuda_only
@pytest.mark.parametrize("fmt,layout", list(itertools.product(FORMATS, LAYOUTS)))
def test_cuda_decode_write_in_a_cuda_graph_stores_the_spec_bytes(fmt, layout, cuda_path):
    """A decode-step write captured in a CUDA graph (no host synchronisation may happen inside), replayed
    with new tokens: the pools hold exactly the bytes of the eager CPU writer's."""
    granularity = "per_seq_head" if layout == "hnd" else "per_head"
    cpu, gpu = _caches(fmt, layout, granularity, "cpu"), _caches(fmt, layout, granularity, "cuda")
    k, v, slots, seqs = _decode_step(cpu, 32, seed=1)
    static = [t.cuda() for t in (k, v, slots, seqs)]
    gpu.write(*static[:3], seq_ids=static[3], check=False)  # warm-up: compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gpu.write(*static[:3], seq_ids=static[3], check=False)
    k2, v2, _, _ = _decode_step(cpu, 32, seed=2)
    static[0].copy_(k2)
    static[1].copy_(v2)
    graph.replay()
    cpu.write(k2, v2, slots, seq_ids=seqs)
    for a, b in zip(_pool_bytes(cpu), _pool_bytes(gpu)):
        assert torch.equal(a, b), f"{fmt} {layout}: the replayed write differs from the CPU writer's"


@cuda_only
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_cuda_checked_write_is_the_cpu_write_and_refuses_like_it(fmt, cuda_path):
    cpu, gpu = _caches(fmt, "nhd", "per_tensor", "cpu"), _caches(fmt, "nhd", "per_tensor", "cuda")
    k, v, slots, _ = _decode_step(cpu, 48, seed=3)  # every spare slot
    cpu.write(k, v, slots)
    gpu.write(k.cuda(), v.cuda(), slots.cuda())
    assert all(torch.equal(a, b) for a, b in zip(_pool_bytes(cpu), _pool_bytes(gpu)))
    before = _pool_bytes(gpu)
    with pytest.raises(ValueError, match=r"^slot_mapping: slot"):
        gpu.write(k[:2].cuda(), v[:2].cuda(), slots[:1].repeat(2).cuda())
    assert all(torch.equal(a, b) for a, b in zip(before, _pool_bytes(gpu)))


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_cuda_write_of_bfloat16_rows_with_per_sequence_descales(fmt, cuda_path):
    """bfloat16 K/V (read as they are by the one-launch writer) under per-(sequence, head) descales, every
    spare slot of the cache: the CPU writer's bytes."""
    cpu, gpu = _caches(fmt, "nhd", "per_seq_head", "cpu"), _caches(fmt, "nhd", "per_seq_head", "cuda")
    k, v, slots, seqs = _decode_step(cpu, 48, seed=4)
    k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    cpu.write(k, v, slots, seq_ids=seqs)
    gpu.write(k.cuda(), v.cuda(), slots.cuda(), seq_ids=seqs.cuda(), check=False)
    assert all(torch.equal(a, b) for a, b in zip(_pool_bytes(cpu), _pool_bytes(gpu))), fmt


@pytest.mark.parametrize("head_dim", [16, 32, 48, 64])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_cuda_write_of_narrow_heads(fmt, head_dim, cuda_path):
    """Head dims whose rows hold 1, 2, 3 and 4 chunks of 16 values (the writer's chunks per thread)."""
    gen = torch.Generator().manual_seed(head_dim)
    k = [torch.randn(20, 2, head_dim, generator=gen) * 3 for _ in range(2)]
    caches = [
        PagedKVCache.from_float(k, k, fmt, page_size=16, granularity="per_head", device=dev) for dev in ("cpu", "cuda")
    ]
    used = set(caches[0].block_table.reshape(-1).tolist())
    free = [p for p in range(caches[0].num_pages) if p not in used]
    slots = torch.tensor([free[0] * 16 + i for i in range(16)])
    new = torch.randn(16, 2, head_dim, generator=gen)
    caches[0].write(new, new * 0.5, slots)
    caches[1].write(new.cuda(), new.cuda() * 0.5, slots.cuda(), check=False)
    assert all(torch.equal(a, b) for a, b in zip(_pool_bytes(caches[0]), _pool_bytes(caches[1]))), (fmt, head_dim)


@pytest.mark.parametrize("fmt", ["e3m2", "nvfp4"])
def test_write_hands_the_one_launch_writer_the_caches_rows(fmt, monkeypatch):
    """What ``PagedKVCache.write`` passes to the helper kernels' writer (run on the CPU with a recording
    stand-in; the kernel's bits are the CUDA tests'): a writer made once per cache with both pools, their
    descales, the element format and tables, NVFP4's floor and kernel shift; K, V, the slots and sequences in
    one call per write; and nothing else is written."""
    from mjolnir_kernel import helpers
    from mjolnir_numerics.nvfp4 import DEFAULT_SCALE_FLOOR, KERNEL_SHIFT

    made, calls = [], []

    class Recorder:
        write_unsupported = staticmethod(helpers.write_unsupported)

        class CacheWriter:
            def __init__(self, descales, pools, scales, **kw):
                made.append((descales, pools, scales, kw))

            def __call__(self, k, v, slots, seq_ids):
                calls.append((k, v, slots, seq_ids))

    cache = _caches(fmt, "nhd", "per_seq_head", "cpu")
    before = _pool_bytes(cache)
    monkeypatch.setattr(fused, "helper_kernels", lambda device: Recorder)
    k, v, slots, seqs = _decode_step(cache, 8, seed=6)
    cache.write(k, v, slots, seq_ids=seqs, check=False)
    cache.write(v, k, slots, seq_ids=seqs, check=False)
    assert len(made) == 1 and len(calls) == 2  # one writer per cache, one call per write
    descales, pools, scales, kw = made[0]
    assert pools[0] is cache.k_pool and pools[1] is cache.v_pool
    for (ck, cv, cslots, cseqs), (want_k, want_v) in zip(calls, ((k, v), (v, k))):
        assert torch.equal(ck, want_k) and torch.equal(cv, want_v)
        assert torch.equal(cslots, slots) and torch.equal(cseqs, seqs)
    assert torch.equal(descales[0], cache.k_descale) and torch.equal(descales[1], cache.v_descale)
    assert kw["page_size"] == 16 and kw["head_dim"] == 128 and kw["element"] == ("e2m1" if fmt == "nvfp4" else fmt)
    if fmt == "nvfp4":
        assert scales[0] is cache.k_scales and scales[1] is cache.v_scales
        assert kw["nvfp4"] and kw["floor"] == DEFAULT_SCALE_FLOOR and kw["g_scale"] == KERNEL_SHIFT
        assert torch.equal(kw["lut"], _round_to_odd_lut(E2M1, "cpu"))
    else:
        assert scales == (None, None) and not kw.get("nvfp4") and torch.equal(kw["lut"], _round_to_odd_lut(E3M2, "cpu"))
    assert all(torch.equal(a, b) for a, b in zip(before, _pool_bytes(cache)))  # the stand-in wrote nothing


# Descales at and beyond the ends of the writer kernel's fast division (quotients from a reciprocal where
# 2^-20 <= descale < 2^20, div.rn.f32 elsewhere), and between them.
WRITER_DESCALES = (2.0**-20, 2.0**-20 * (1 - 2.0**-24), 2.0**20 * (1 - 2.0**-24), 2.0**20, 0.37, 1e-3, 1e6, 3e-9, 3e10)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_cuda_write_of_every_bfloat16_under_any_descale_is_the_cpu_write(fmt, cuda_path):
    """Every finite bfloat16 value as K (and reversed as V), written with ``check=False`` under each of
    :data:`WRITER_DESCALES`: the CPU writer's bytes (saturated quotients, tiny ones and zeros of both signs)."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    vals = bits.view(torch.bfloat16)
    vals = vals[torch.isfinite(vals.float())]  # 65280 values: 255 tokens x 2 heads x 128
    k = vals.view(-1, 2, 128)
    v = k.flip(0)
    for descale in WRITER_DESCALES:
        ds = torch.tensor(descale)
        caches = [
            PagedKVCache.from_float(
                torch.zeros(1, 16, 2, 128),
                torch.zeros(1, 16, 2, 128),
                fmt,
                page_size=16,
                granularity="per_tensor",
                k_descale=ds,
                v_descale=ds,
                spare_pages=16,
                shuffle=False,
                device=dev,
            )  # fmt: skip
            for dev in ("cpu", "cuda")
        ]
        slots = torch.arange(16, 16 + k.shape[0])
        caches[0].write(k, v, slots, check=False)
        caches[1].write(k.cuda(), v.cuda(), slots.cuda(), check=False)
        assert all(torch.equal(a, b) for a, b in zip(_pool_bytes(caches[0]), _pool_bytes(caches[1]))), (fmt, descale)


def test_a_cache_with_a_writer_pickles_and_copies_without_it(monkeypatch):
    """The writer a cache keeps (compiled kernels, not picklable) stays behind when the cache is pickled or
    deep-copied; the copy makes its own on its first write."""
    import copy
    import pickle

    made = []

    class Kernels:
        write_unsupported = staticmethod(lambda *a: None)

        class CacheWriter:
            def __init__(self, *args, **kw):
                self.launch = lambda: None  # like a compiled kernel: cannot be pickled
                made.append(self)

            def __call__(self, k, v, slots, seq_ids):
                pass

    cache = _caches("e2m1", "nhd", "per_head", "cpu")
    monkeypatch.setattr(fused, "helper_kernels", lambda device: Kernels)
    k, v, slots, _ = _decode_step(cache, 4, seed=7)
    cache.write(k, v, slots, check=False)
    assert len(made) == 1 and cache._writers
    for twin in (pickle.loads(pickle.dumps(cache)), copy.deepcopy(cache)):
        assert twin._writers == {} and all(torch.equal(a, b) for a, b in zip(_pool_bytes(twin), _pool_bytes(cache)))
        twin.write(k, v, slots, check=False)
    assert len(made) == 3 and cache._writers


def test_compiled_many_raises_the_recompile_limits_for_its_calls_only(monkeypatch):
    """The emulator's graphs run with recompile limits of at least 512 / 8192 (its shapes and formats make many
    variants), and the caller's limits are back after each call, also when the call raises."""
    cfg = torch._dynamo.config
    monkeypatch.setattr(cfg, "recompile_limit", 8)
    monkeypatch.setattr(cfg, "accumulated_recompile_limit", 256)
    seen = []

    def graph(x):
        seen.append((cfg.recompile_limit, cfg.accumulated_recompile_limit))
        if x is None:
            raise RuntimeError("boom")
        return x

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: graph)
    monkeypatch.setattr(fused, "_compiled", {})
    call = fused.compiled_many(lambda x: x)
    assert call(3) == 3
    with pytest.raises(RuntimeError, match="boom"):
        call(None)
    assert seen == [(512, 8192), (512, 8192)]
    assert (cfg.recompile_limit, cfg.accumulated_recompile_limit) == (8, 256)
