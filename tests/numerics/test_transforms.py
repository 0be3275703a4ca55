"""Hadamard rotation and K smoothing (``mjolnir_numerics.transforms``): attention-preserving in exact
arithmetic; here, S is unchanged to the stated bound (rotation) or bit for bit (smoothing), O rotates back,
and bad arguments are named."""

import math

import pytest
import torch

from mjolnir_numerics.reference import reference_decode
from mjolnir_numerics.transforms import (
    apply_smoothing,
    hadamard_matrix,
    rotate,
    rotation_score_bound,
    smoothing_factors,
)


def _qk(seed=0, d=128):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(64, 8, d, generator=gen)
    k = torch.randn(300, 2, d, generator=gen)
    k[..., 5] *= 40.0  # an outlier channel, the case rotations and smoothing are for
    q[..., 9] *= 0.01
    return q, k


def _scores(q, k):
    """float64 S (kv head, query row, key) of float32 rows; query heads grouped on their kv head."""
    h_k = k.shape[1]
    qg = q.double().unflatten(1, (h_k, -1)).permute(1, 0, 2, 3).flatten(1, 2)  # (h_k, T_q * h_r, d)
    return qg @ k.double().permute(1, 2, 0)


def test_hadamard_matrix_is_symmetric_orthogonal_and_checked():
    for n in (1, 2, 16, 32, 128):
        h = hadamard_matrix(n)
        assert torch.equal(h, h.T) and torch.allclose(h @ h, torch.eye(n, dtype=torch.float64), atol=1e-15)
        assert bool((h.abs() == 1 / math.sqrt(n)).all())
    for bad in (0, 3, 12, 2.0, True):
        with pytest.raises(ValueError, match="n: expected a power of two"):
            hadamard_matrix(bad)


@pytest.mark.parametrize("block", [16, 32, "d"])
def test_rotation_leaves_scores_within_the_bound(block):
    q, k = _qk()
    s = _scores(q, k)
    s_rot = _scores(rotate(q, block), rotate(k, block))
    h_k = k.shape[1]
    qg = q.unflatten(1, (h_k, -1)).permute(1, 0, 2, 3).flatten(1, 2)
    bound = rotation_score_bound(qg, k.permute(1, 0, 2))
    assert bool(((s_rot - s).abs() <= bound).all())
    assert bool((s_rot != s).any())  # float32 rounding of the rotated rows does show, inside the bound
    assert float(bound.max()) < 1e-5 * float(s.abs().max())  # and the bound is tight enough to mean something


def test_rotation_spreads_an_outlier_channel_and_rotates_back():
    q, k = _qk()
    r = rotate(k, 16)
    assert float(r.abs().amax()) < 0.5 * float(k.abs().amax())  # channel 5's range spread over its block
    back = rotate(r, 16)
    assert float((back - k).abs().max()) <= 2.0**-22 * float(k.abs().max())
    x = torch.randn(7, 64, dtype=torch.float64)
    assert torch.allclose(rotate(rotate(x, "d"), "d"), x, rtol=0, atol=1e-14)


def test_attention_of_rotated_inputs_rotates_back_to_the_attention():
    """Exact attention (float64 reference) on rotated Q, K and V, its O rotated back: the attention of the
    unrotated inputs, up to float32 rounding of the rotated rows."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(3, 8, 64, generator=gen)
    ks = [torch.randn(n, 2, 64, generator=gen) for n in (40, 200, 129)]
    vs = [torch.randn(n, 2, 64, generator=gen) for n in (40, 200, 129)]
    o, lse = reference_decode(q, ks, vs)
    o_r, lse_r = reference_decode(rotate(q, 32), [rotate(k, 32) for k in ks], [rotate(v, 32) for v in vs])
    back = rotate(o_r.float(), 32)
    assert float((back.double() - o.double()).abs().max()) < 1e-5 * float(o.abs().max())
    assert float((lse_r - lse).abs().max()) < 1e-5


def test_smoothing_is_exact_and_balances_the_channels():
    q, k = _qk()
    s = smoothing_factors(q, k)
    assert s.shape == (2, 128) and bool((torch.log2(s) == torch.round(torch.log2(s))).all())
    q2, k2 = apply_smoothing(q, k, s)
    h_k = k.shape[1]
    for g in range(h_k):  # every product q_c k_c is bit for bit the same: powers of two scale exactly
        qa = q.unflatten(1, (h_k, -1))[:, g].reshape(-1, 128).double()
        qb = q2.unflatten(1, (h_k, -1))[:, g].reshape(-1, 128).double()
        pa = qa[:, None, :] * k[:, g].double()[None]
        pb = qb[:, None, :] * k2[:, g].double()[None]
        assert torch.equal(pa, pb)
    assert float(s[:, 5].min()) > 1.0 and float(k2[..., 5].abs().max()) < float(k[..., 5].abs().max())
    zero = k.clone()
    zero[..., 7] = 0
    assert bool((smoothing_factors(q, zero)[:, 7] == 1).all())  # a dead channel keeps factor 1


def test_smoothing_exponent_is_exact_at_odd_power_of_two_ratios():
    """n = round(log2(amax_k / amax_q) / 2), ties up, decided exactly: amax ratios that are odd powers of two
    (common in bfloat16, where the float64 logs are off by an ulp) and random ones, against fractions."""
    from fractions import Fraction

    gen = torch.Generator().manual_seed(5)
    mant = torch.cat(
        [torch.tensor([1.0, 1.1, 1.3, 3.0, 5.0, 7.0, 11.0, 1.0078125]), torch.rand(120, generator=gen) + 1]
    )
    mant = mant.to(torch.bfloat16).float()  # bfloat16 values, as the study's real-model inputs
    gaps = torch.arange(-9, 10)
    q_amax = mant.repeat(len(gaps)) * 0.75
    k_amax = q_amax * torch.exp2(gaps.repeat_interleave(len(mant)).float())  # exact ratios 2^gap
    k_amax[-200:] *= torch.rand(200, generator=gen) + 0.5  # and ratios that are not powers of two
    n_cols = k_amax.numel()
    q = torch.zeros(2, 1, n_cols)
    q[0, 0] = q_amax
    k = torch.zeros(3, 1, n_cols)
    k[1, 0] = -k_amax
    got = torch.log2(smoothing_factors(q, k)[0]).tolist()
    for j in range(n_cols):
        r = Fraction(float(k_amax[j])) / Fraction(float(q_amax[j]))
        n = 0
        while r >= Fraction(2) ** (2 * n + 1):
            n += 1
        while r < Fraction(2) ** (2 * n - 1):
            n -= 1
        assert got[j] == n, f"column {j}: ratio {float(r)} gives n = {got[j]}, exactly {n}"


def test_transform_arguments_are_checked():
    x = torch.randn(4, 96)
    for block, msg in ((8, "block: expected 16, 32 or 'd'"), ("d", "block: 96 is not a power of two")):
        with pytest.raises(ValueError, match=msg):
            rotate(x, block)
    with pytest.raises(ValueError, match="x: expected a floating-point tensor"):
        rotate(torch.ones(4, 16, dtype=torch.int32))
    q, k = _qk()
    with pytest.raises(ValueError, match=r"alpha: expected a number in \[0, 1\]"):
        smoothing_factors(q, k, alpha=1.5)
    with pytest.raises(ValueError, match="q, k: expected"):
        smoothing_factors(q[0], k)
    with pytest.raises(ValueError, match="s: shape"):
        apply_smoothing(q, k, torch.ones(3, 128))
