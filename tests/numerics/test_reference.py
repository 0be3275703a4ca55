"""The exact reference and the error attribution table."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mjolnir_numerics.cases import get_case
from mjolnir_numerics.reference import ERROR_SOURCES, attribute_errors, error_metrics, reference_decode


def test_reference_matches_a_direct_softmax():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, generator=gen)
    k = torch.randn(2, 10, 2, 16, generator=gen)
    v = torch.randn(2, 10, 2, 16, generator=gen)
    o, lse = reference_decode(q, k, v, softmax_scale=0.3, scale_o=2.0)
    for b in range(2):
        for h in range(4):
            g = h // 2
            s = (k[b, :, g].double() @ q[b, h].double()) * 0.3
            assert torch.allclose(o[b, h], 2.0 * torch.softmax(s, 0) @ v[b, :, g].double(), rtol=1e-12, atol=1e-12)
            assert math.isclose(lse[b, g, h % 2].item(), torch.logsumexp(s, 0).item(), rel_tol=1e-12)


def test_reference_causal_tail_and_empty_sequence():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2 * 3, 2, 8, generator=gen)  # 2 seqs, q_len 3, h_q = h_k = 2
    ks = [torch.zeros(0, 2, 8), torch.randn(5, 2, 8, generator=gen)]
    vs = [torch.zeros(0, 2, 8), torch.randn(5, 2, 8, generator=gen)]
    o, lse = reference_decode(q, ks, vs, q_len=3, causal=True)
    assert torch.equal(o[:3], torch.zeros_like(o[:3])) and bool((lse[0] == -math.inf).all())
    # query 0 of sequence 1 sees keys 0..2 only: its output equals attention over those 3 keys
    o3, _ = reference_decode(q[3:4], [ks[1][:3]], [vs[1][:3]], q_len=1)
    assert torch.allclose(o[3], o3[0], rtol=1e-12, atol=1e-12)
    o_nc, _ = reference_decode(q, ks, vs, q_len=3, causal=False)
    assert torch.allclose(o_nc[5], o[5], rtol=1e-12, atol=1e-12)  # the last query sees every key either way
    assert not torch.allclose(o_nc[3], o[3])


def test_reference_on_a_cache_uses_its_kernel_view():
    x = get_case("varlen").build()
    o_c, lse_c = reference_decode(x.q_float, x.cache)
    kq, vq = zip(*(x.cache.gather(s) for s in range(x.cache.num_seqs)))
    o_l, lse_l = reference_decode(x.q_float, list(kq), list(vq))
    assert torch.equal(o_c, o_l) and torch.equal(lse_c, lse_l)


def test_error_metrics():
    a = torch.tensor([1.0, 0.0])
    row = error_metrics("x", a * 1.1, a, torch.zeros(1), torch.full((1,), -0.5))
    assert math.isclose(row.rel_l2, 0.1, rel_tol=1e-6) and math.isclose(row.cosine, 1.0)
    assert math.isclose(row.max_abs, 0.1, rel_tol=1e-6) and row.lse_max_abs == 0.5


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_attribution_isolates_each_source(fmt):
    x = dataclasses.replace(get_case("forced_splits"), seq_lens=(600, 200)).build()
    rows = attribute_errors(x.q_float, x.k_float, x.v_float, fmt, q_path="e4m3", plan=x.plan)
    by = {r.source: r for r in rows}
    assert tuple(by) == ERROR_SOURCES
    for r in rows:
        assert 0 <= r.rel_l2 < 1 and r.cosine > 0.9, r
    # every source is present and smaller than the total; KV quantization dominates fp8 Q / P rounding
    assert by["k_quantization"].rel_l2 > 0 and by["v_quantization"].rel_l2 > 0 and by["q_quantization"].rel_l2 > 0
    assert by["p_rounding"].rel_l2 > 0 and by["split_merging"].rel_l2 > 0
    # a split re-references P to each chunk's own max, so it re-rounds P (same size as P rounding);
    # the merge itself only reorders fp32 sums: the LSE moves by fp32 noise
    assert by["split_merging"].rel_l2 <= 1.5 * by["p_rounding"].rel_l2
    assert by["split_merging"].lse_max_abs <= 2.0**-16
    assert by["total"].rel_l2 >= 0.5 * max(by["k_quantization"].rel_l2, by["v_quantization"].rel_l2)
    if fmt == "e2m1":
        assert by["v_quantization"].rel_l2 > by["q_quantization"].rel_l2


def test_attribution_bad_q_path():
    x = get_case("one_tile").build()
    with pytest.raises(ValueError, match="q_path"):
        attribute_errors(x.q_float, x.k_float, x.v_float, q_path="fp16")


def test_attribution_research_switch_reaches_the_emulator():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 6, 64, generator=g)
    k, v = [torch.randn(150, 2, 64, generator=g)], [torch.randn(150, 2, 64, generator=g)]
    with pytest.raises(ValueError, match="head_dim: 64"):
        attribute_errors(q, k, v, "e4m3")
    rows = attribute_errors(q, k, v, "e4m3", allow_unsupported=True)
    assert [r.source for r in rows] == list(ERROR_SOURCES)
    assert 0 < rows[-1].rel_l2 < 0.2  # the total: e4m3 KV, Q and P


def test_reference_refuses_what_the_emulator_refuses():
    """No silent NaN or descale 1: the checks emulate_decode makes, on the reference."""
    from mjolnir_numerics import quantize_q

    g = torch.Generator().manual_seed(0)
    k = [torch.randn(L, 2, 64, generator=g) for L in (5, 9)]
    v = [torch.randn(L, 2, 64, generator=g) for L in (5, 9)]
    q = torch.randn(2 * 8, 4, 64, generator=g)
    with pytest.raises(ValueError, match="q_len: 8 exceeds seq_len 5 of sequence 0"):
        reference_decode(q, k, v, q_len=8)
    q8, _ = quantize_q(q[:2], 2, 1, 2)
    with pytest.raises(ValueError, match="q_descale: e4m3 Q needs"):
        reference_decode(q8, k, v)
    for bad in (float("nan"), 0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="softmax_scale"):
            reference_decode(q[:2], k, v, softmax_scale=bad)
    with pytest.raises(TypeError, match="q_len: expected an int, got 1.0"):
        reference_decode(q[:2], k, v, q_len=1.0)
    with pytest.raises(TypeError, match="k: expected a float"):
        reference_decode(q[:2], "k", v)
    with pytest.raises(ValueError, match="k\\[1\\]: \\(h_k, d\\)"):
        reference_decode(q[:2], [k[0], torch.randn(9, 4, 64)], [v[0], torch.randn(9, 4, 64)])
    with pytest.raises(ValueError, match="scale_o"):
        reference_decode(q[:2], k, v, scale_o=float("nan"))
