"""Property tests (hypothesis, bounded examples: under a minute together on the 2-core CPU): NVFP4, descales,
the cache's write / gather round trip, and the emulator's metamorphic relations."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mjolnir_numerics import E4M3, PagedKVCache, dequantize, emulate_decode, nvfp4_quantize, quantize_q
from mjolnir_numerics.cache import LAYOUTS, PAGE_SIZES
from mjolnir_numerics.emulator import EmulatorKnobs
from mjolnir_numerics.formats import E2M1, get_format
from mjolnir_numerics.scales import GRANULARITIES, compute_descale

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
IDEAL = EmulatorKnobs(
    mma="ideal", log="correctly_rounded", ex2="correctly_rounded"
)  # the relations hold for any arithmetic


def _randn(seed: int, *shape, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


# ------------------------------------------------------------------------------------------------------
# NVFP4
# ------------------------------------------------------------------------------------------------------
@FAST
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-20, 20), blocks=st.integers(1, 8),
       four_over_six=st.booleans())  # fmt: skip
def test_nvfp4_values_lie_on_the_grid_and_scales_in_range(seed, log_scale, blocks, four_over_six):
    x = _randn(seed, 3, 16 * blocks, scale=2.0**log_scale)
    t = nvfp4_quantize(x, four_over_six=four_over_six)
    g = t.global_scale.float()
    code_vals = dequantize(t.codes, E2M1)
    scale_vals = dequantize(t.scales, E4M3)
    # every value is an e2m1 value times an e4m3 scale times g, exactly
    want = (code_vals.view(3, blocks, 16) * scale_vals.view(3, blocks, 1)).view(3, -1) * g
    assert torch.equal(t.values, want)
    assert bool((scale_vals >= 0).all()) and bool((scale_vals <= E4M3.max_normal).all())
    assert bool((t.kernel_values.abs() <= 336).all())
    # the global scale maps the largest |x| to the top of the (element, scale) range
    assert bool((g == g.flatten()[0]).all())  # one global scale for the tensor, broadcast per row
    assert math.isclose(float(g.flatten()[0]), float(x.abs().max()) / (6 * 448), rel_tol=2**-22)


@FAST
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-10, 10))
def test_nvfp4_four_over_six_never_increases_a_blocks_error(seed, log_scale):
    x = _randn(seed, 4, 64, scale=2.0**log_scale)
    base = nvfp4_quantize(x)
    fos = nvfp4_quantize(x, four_over_six=True)
    err = lambda t: ((t.values - x) ** 2).view(4, 4, 16).sum(-1)  # noqa: E731
    assert bool((err(fos) <= err(base)).all())


# ------------------------------------------------------------------------------------------------------
# Descales
# ------------------------------------------------------------------------------------------------------
@FAST
@given(seed=st.integers(0, 2**31 - 1), fmt=st.sampled_from(["e4m3", "e3m2", "e2m3", "e2m1"]),
       granularity=st.sampled_from(GRANULARITIES), log_scale=st.floats(-30, 30))  # fmt: skip
def test_descales_map_each_groups_amax_onto_the_formats_top(seed, fmt, granularity, log_scale):
    f = get_format(fmt)
    xs = [_randn(seed + i, n, 2, 16, scale=2.0**log_scale) for i, n in enumerate((5, 0, 9))]
    d = compute_descale(xs, fmt, granularity)
    assert bool(torch.isfinite(d).all()) and bool((d > 0).all())
    table = d.expand(3, 2) if d.dim() < 2 else d
    for s, x in enumerate(xs):
        if x.numel():
            scaled = x.abs().amax(dim=(0, 2)) / table[s]
            assert bool((scaled <= f.max_normal * (1 + 2**-23)).all())  # nothing saturates beyond amax


# ------------------------------------------------------------------------------------------------------
# The cache
# ------------------------------------------------------------------------------------------------------
@FAST
@given(seed=st.integers(0, 2**31 - 1), fmt=st.sampled_from(["e4m3", "e3m2", "e2m3", "e2m1", "nvfp4"]),
       page_size=st.sampled_from(PAGE_SIZES), layout=st.sampled_from(LAYOUTS),
       lens=st.lists(st.integers(0, 70), min_size=1, max_size=3))  # fmt: skip
def test_write_then_gather_returns_what_was_written(seed, fmt, page_size, layout, lens):
    """Tokens written at random free slots (one write per call, any order) read back as the format's
    rounding of what was written, for every layout and page size."""
    k = [_randn(seed + i, n, 2, 32) for i, n in enumerate(lens)]
    v = [_randn(seed + 7 + i, n, 2, 32) for i, n in enumerate(lens)]
    c = PagedKVCache.from_float(k, v, fmt, page_size=page_size, layout=layout, seed=seed % 1000)
    new_k, new_v = _randn(seed + 99, 5, 2, 32), _randn(seed + 98, 5, 2, 32) * 0.5
    used = set()
    for s, n in enumerate(lens):
        for p in c.block_table[s, : -(-n // page_size)].tolist():
            used.update(range(p * page_size, (p + 1) * page_size))
    free = [x for x in range(c.num_pages * page_size) if x not in used]
    slots = torch.tensor(free[:5])[torch.randperm(5, generator=torch.Generator().manual_seed(seed))]
    c.write(new_k, new_v, slots)
    page, off = slots // page_size, slots % page_size
    for which, x in (("k", new_k), ("v", new_v)):
        got = c.page_values(which, page)  # (5, page_size, h_k, d), kernel values
        got = got[torch.arange(5), off] * c.descale_table(which)[0][None, :, None]
        ref = PagedKVCache.from_float([x], [x], fmt, page_size=page_size, k_descale=_desc(c, which),
                                      v_descale=_desc(c, which)).gather(0)[0]  # fmt: skip
        assert torch.equal(got, ref)
    for s in range(len(lens)):  # the sequences already there are untouched
        assert torch.equal(c.gather(s)[0], PagedKVCache.from_float(k, v, fmt, page_size=page_size).gather(s)[0])


def _desc(c, which):
    d = c.k_descale if which == "k" else c.v_descale
    return d * 0.125 if c.is_block_scaled else d  # the cache keeps 8 g for NVFP4; from_float takes g


# ------------------------------------------------------------------------------------------------------
# The emulator's metamorphic relations
# ------------------------------------------------------------------------------------------------------
def _problem(seed, lens, fmt="e4m3", q_len=1, **cache_kw):
    k = [_randn(seed + i, n, 2, 128) for i, n in enumerate(lens)]
    v = [_randn(seed + 50 + i, n, 2, 128) for i, n in enumerate(lens)]
    q = _randn(seed + 100, len(lens) * q_len, 8, 128).to(torch.bfloat16)
    q8, qd = quantize_q(q, len(lens), q_len, 2)
    return k, v, q8, qd, lambda **kw: PagedKVCache.from_float(k, v, fmt, page_size=64, **{**cache_kw, **kw})


def _same(a, b):
    view = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


@SLOW
@given(seed=st.integers(0, 2**31 - 1), lens=st.lists(st.integers(0, 900), min_size=1, max_size=3),
       fmt=st.sampled_from(["e4m3", "e2m1", "nvfp4"]))  # fmt: skip
def test_page_order_poison_and_threads_change_no_bit(seed, lens, fmt):
    _, _, q, qd, build = _problem(seed, lens, fmt)
    o1, l1 = emulate_decode(q, build(shuffle=False, poison=False), q_descale=qd, knobs=IDEAL)
    o2, l2 = emulate_decode(q, build(shuffle=True, seed=seed % 97, poison=True), q_descale=qd, knobs=IDEAL,
                            cpu_threads=2)  # fmt: skip
    assert _same(o1, o2) and _same(l1, l2)


@SLOW
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(4, 700), q_len=st.integers(2, 4))
def test_causal_q_len_k_equals_k_prefix_calls(seed, length, q_len):
    """Query qi of a causal q_len call sees keys 0 .. L - q_len + qi: exactly a q_len = 1 call on that
    prefix (same cache pages, the sequence length cut), unsplit plans on both sides."""
    k, v, _, _, _ = _problem(seed, [length], q_len=q_len)
    q = _randn(seed + 100, q_len, 8, 128).to(torch.bfloat16)
    cache = PagedKVCache.from_float(k, v, "e4m3", page_size=64)
    o, lse = emulate_decode(q, cache, q_len=q_len, causal=True, chunk_tiles=0, knobs=IDEAL)
    for qi in range(q_len):
        n = length - q_len + 1 + qi
        prefix = PagedKVCache.from_float([k[0][:n]], [v[0][:n]], "e4m3", page_size=64, k_descale=cache.k_descale,
                                         v_descale=cache.v_descale)  # fmt: skip
        o1, lse1 = emulate_decode(q[qi : qi + 1], prefix, chunk_tiles=0, knobs=IDEAL)
        assert _same(o[qi : qi + 1], o1)
        h_r = 4
        assert _same(lse[0, :, qi * h_r : (qi + 1) * h_r], lse1[0])


@SLOW
@given(seed=st.integers(0, 2**31 - 1), lens=st.lists(st.integers(1, 6000), min_size=2, max_size=4))
def test_batch_invariant_plan_makes_each_sequence_independent_of_the_batch(seed, lens):
    k, v, _, _, _ = _problem(seed, lens)
    q = _randn(seed + 100, len(lens), 8, 128).to(torch.bfloat16)
    full = PagedKVCache.from_float(k, v, "e4m3", page_size=64, granularity="per_seq_head")
    o, lse = emulate_decode(q, full, plan="batch_invariant", knobs=IDEAL)
    alone = PagedKVCache.from_float(k[:1], v[:1], "e4m3", page_size=64, granularity="per_seq_head")
    o1, lse1 = emulate_decode(q[:1], alone, plan="batch_invariant", knobs=IDEAL)
    assert _same(o[:1], o1) and _same(lse[:1], lse1)
