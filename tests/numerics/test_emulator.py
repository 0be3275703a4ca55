"""The decode emulator: invariants, hand-computed cases, agreement with the seed, bad input."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import warnings
from decimal import Decimal

import numpy as np
import pytest
import torch

from benchmarks.seed import SEED_PATH, load_seed
from mjolnir_numerics.cache import PagedKVCache
from mjolnir_numerics.cases import CASES, get_case
from mjolnir_numerics.emulator import EmulatorKnobs, emulate_decode
from mjolnir_numerics.emulator_stages import exp2_f32, fma_f32, log_f32, reduce_row_sum
from mjolnir_numerics.formats import FORMATS
from mjolnir_numerics.plan import SplitPlan, chunked_plan, plan_split_kv
from mjolnir_numerics.reference import reference_decode
from mjolnir_numerics.scales import pack_q
from mjolnir_numerics.targets import get_target
from tests.conftest import DEVICES, FusedOnTheCpu

FULL = os.environ.get("MJOLNIR_TEST_SIZE", "small") == "full"
HAS_CUDA = torch.cuda.is_available()

# Seed agreement: the seed sums S and V.P in fp32 in torch's order, adds l = l * corr + sum(p), merges
# every sequence through exp/natural-log weights and divides at the end; we round each dot product
# once and follow the kernel's fma / butterfly / epilogue order. Those are fp32 rounding differences
# of a few ulps per step over at most a few dozen tiles: 2^-18 relative to max |O| (measured <= 1e-6).
SEED_O_REL_TOL = 2.0**-18
SEED_LSE_ABS_TOL = 2.0**-18 * 16  # LSE ~ 1..16 here: a few fp32 ulps


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, NaN == NaN."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(
            a.contiguous().view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a.float().nan_to_num(7.0),
            b.contiguous().view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b.float().nan_to_num(7.0),
        )
    )


def _run(inputs, **kw):
    args = inputs.emulator_kwargs()
    args.update(kw)
    return emulate_decode(inputs.q, inputs.cache, **args)


# ------------------------------------------------------------------------------------------------
# Arithmetic models
# ------------------------------------------------------------------------------------------------
def test_exp2_is_correctly_rounded_and_flushes_subnormals():
    x = torch.tensor([0.0, -1.0, 3.0, -126.0, -126.5, -150.0, -math.inf, math.inf, 0.5, -0.3], dtype=torch.float32)
    y = exp2_f32(x)
    assert y[:4].tolist() == [1.0, 0.5, 8.0, 2.0**-126]
    assert y[4] == 0 and y[5] == 0 and y[6] == 0 and math.isinf(y[7])
    # correct rounding against float64 (no hard cases among these)
    assert y[8] == torch.tensor(2**0.5, dtype=torch.float32) and y[9] == torch.tensor(2**-0.3, dtype=torch.float32)


def _exp2_decimal(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded fp32 exp2 with flush to zero, the slow way: float64 exp2, and every value near an
    fp32 midpoint redone in decimal (what ``exp2_f32`` did until 2026-12-06)."""
    from mjolnir_numerics.emulator_stages import _correct_round

    x64 = x.double()
    z = _correct_round(torch.exp2(x64), x64, lambda d: (d * Decimal(2).ln()).exp())
    return torch.where(z < 2.0**-126, torch.zeros_like(z), z)


def test_exp2_is_the_decimal_correct_rounding_with_no_branch():
    """exp2_f32 (float64 exp2 rounded once, the hard-case table looked up) against the float64 exp2 with its
    near-midpoint values decided in decimal: on every hard input, the hard inputs shifted by whole numbers where
    the sum is exact (the reduction x = n + r gives a negative hard r back), random inputs of every binade and
    bit pattern, and the special values."""
    from mjolnir_numerics.emulator_stages import _exp2_hard_table

    keys, _ = _exp2_hard_table(torch.device("cpu"))
    hard = keys.view(torch.float32)
    gen = torch.Generator().manual_seed(5)
    n = 400_000 if FULL else 100_000
    shifts = (-127.0, -126.0, -100.0, -3.0, -2.0, -1.0, 1.0, 2.0, 5.0, 126.0, 127.0)
    shifted = [(hard + s)[(hard + s) - s == hard] for s in shifts]  # x = s + r exact in fp32
    assert sum(x.numel() for x in shifted) >= 30
    x = torch.cat(
        [hard]
        + shifted
        + [
            (torch.rand(n, generator=gen) * 300 - 150).float(),
            torch.randint(-(2**31), 2**31 - 1, (n,), generator=gen).to(torch.int32).view(torch.float32),
            torch.tensor(
                [0.0, -0.0, math.inf, -math.inf, math.nan, -126.0, -149.0, -150.0, 128.0, 127.99999, 2.0**-30]
            ),
        ]
    )
    assert _equal(exp2_f32(x), _exp2_decimal(x).float())
    with pytest.raises(TypeError, match="x: expected float32"):
        exp2_f32(torch.tensor([-0.3, 0.4], dtype=torch.bfloat16))  # two bf16 would read as one float32 key


def test_exp2_hard_case_table_is_exact_and_complete():
    """Every listed input's value is the correctly rounded 2^r (decimal) and lies within EXP2_HARD_ULP64 float64
    ulps of a midpoint; a fresh scan of some binades (all at MJOLNIR_TEST_SIZE=full) finds exactly the listed
    inputs there."""
    from benchmarks.probes.exp2_hard_cases import exact_cr, scan
    from mjolnir_numerics.emulator_stages import EXP2_HARD_BINADES, EXP2_HARD_ULP64, _exp2_hard_table

    keys, values = _exp2_hard_table(torch.device("cpu"))
    assert bool((keys[1:] > keys[:-1]).all()) and keys.numel() > 100
    for r, v in zip(keys.view(torch.float32).tolist(), values.tolist()):
        bits, dist = exact_cr(r)
        assert bits == v and dist < EXP2_HARD_ULP64, r
    binades = range(EXP2_HARD_BINADES) if FULL else (0, 11, 24)
    found = scan(binades, log=lambda *_: None)
    k = 126 - ((keys >> 23) & 0xFF)
    listed = [(int(a), int(b)) for a, b, kk in zip(keys, values, k) if int(kk) in binades]
    assert found == listed and len(found) > 0


def test_correct_round_decides_hard_cases_in_decimal():
    """A float64 approximation sitting exactly on an fp32 midpoint is decided by the exact value (the logs'
    correct rounding)."""
    from mjolnir_numerics.emulator_stages import _correct_round

    x = torch.tensor([0.3, -5.7, 11.1], dtype=torch.float32)
    correct = exp2_f32(x).double()  # no hard case among these: plain correct rounding
    for c, xv in zip(correct.tolist(), x.tolist()):
        c32 = np.float32(c)
        for nb in (np.nextafter(c32, np.float32(-np.inf)), np.nextafter(c32, np.float32(np.inf))):
            mid = (float(c32) + float(nb)) / 2  # exact in float64
            got = _correct_round(
                torch.tensor([mid], dtype=torch.float64),
                torch.tensor([xv], dtype=torch.float64),
                lambda d: (d * Decimal(2).ln()).exp(),
            )
            assert got.item() == float(c32), (xv, mid)
    # and random inputs agree with float64 exp2 rounded once, except (rarely) near midpoints
    gen = torch.Generator().manual_seed(0)
    xr = (torch.rand(200_000 if FULL else 50_000, generator=gen) * -40).float()
    ref = np.exp2(xr.double().numpy()).astype(np.float32)
    assert (exp2_f32(xr).numpy() != ref).sum() <= 2


def test_fma_rounds_once():
    a = torch.tensor([1.0 + 2.0**-12], dtype=torch.float32)
    c = torch.tensor([-(1.0 + 2.0**-11)], dtype=torch.float32)
    # a*a = 1 + 2^-11 + 2^-24 exactly; fma leaves 2^-24, a mul-then-add leaves 0
    assert fma_f32(a, a, c).item() == 2.0**-24
    assert (a * a + c).item() == 0.0


def _fp32_of_fraction(x) -> float:
    """Correctly rounded fp32 of an exact rational (ties to even)."""
    from fractions import Fraction

    c = np.float32(float(x))
    lo, hi = np.nextafter(c, np.float32(-np.inf)), np.nextafter(c, np.float32(np.inf))
    best = min((abs(Fraction(float(v)) - x), int(np.float32(v).view(np.int32)) & 1, float(v)) for v in (lo, c, hi))
    return best[2]


def _exact_fp32(terms) -> float:
    from fractions import Fraction

    return _fp32_of_fraction(sum((Fraction(float(t)) for t in terms), Fraction(0)))


def test_score_tile_is_correctly_rounded_for_wide_bf16_q():
    """bf16 Q spanning 72 binades (the float64 GEMM is not exact there) times e4m3 K: every S element is
    the exact dot product rounded once to fp32, whichever tier of settle_f32 decided it."""
    from mjolnir_numerics.emulator_stages import score_tile

    gen = torch.Generator().manual_seed(3)
    d = 256
    q = torch.randn(1, 1, 6, d, generator=gen) * torch.exp2(torch.randint(-60, 12, (1, 1, 6, d), generator=gen).float())
    q[0, 0, 5] = torch.randn(d, generator=gen)  # a plain row: the exact tier
    q = q.to(torch.bfloat16).float()
    k = (torch.randn(1, 1, 8, d, generator=gen) * 30).to(torch.float8_e4m3fn).float()
    k[0, 0, 7] = 0.0  # a zero key row
    got = score_tile(q.double(), k, 8)
    assert got.dtype == torch.float32
    for i in range(6):
        for j in range(8):
            want = _exact_fp32(q[0, 0, i].double() * k[0, 0, j].double())
            assert got[0, 0, i, j].item() == want, (i, j)


def test_accumulate_pv_rounds_o_plus_the_exact_contraction_once():
    """O + V.P with bf16 P spanning 140 binades: one rounding of the exact sum. Row 0 is built so that
    float64 alone gets it wrong: O = 2^15, P.V = 2^-9 + 2^-133 (the fp32 midpoint of 2^15 and 2^15 + 2^-8,
    plus a tail float64 drops): the exact sum is above the midpoint and rounds up."""
    from mjolnir_numerics.emulator_stages import accumulate_pv

    gen = torch.Generator().manual_seed(5)
    t, d = 128, 16
    p = torch.rand(1, 1, 4, t, generator=gen) * torch.exp2(-torch.randint(0, 133, (1, 1, 4, t), generator=gen).float())
    p[0, 0, 0] = 0.0
    p[0, 0, 0, 0], p[0, 0, 0, 1] = 1.0, 2.0**-133
    p = p.to(torch.bfloat16).float()
    v = (torch.randn(1, 1, t, d, generator=gen) * 8).to(torch.float8_e4m3fn).float()
    v[0, 0, 0, 0], v[0, 0, 1, 0] = 2.0**-9, 1.0
    o = torch.randn(1, 1, 4, d, generator=gen)
    o[0, 0, 0, 0] = 2.0**15
    got = accumulate_pv(o, p, v, 8)
    assert got[0, 0, 0, 0].item() == 2.0**15 + 2.0**-8
    assert (o[0, 0, 0, 0].double() + (p[0, 0, 0].double() @ v[0, 0, :, 0].double())).float().item() == 2.0**15
    for i in range(4):
        for j in range(d):
            terms = list(p[0, 0, i].double() * v[0, 0, :, j].double()) + [o[0, 0, i, j].double()]
            assert got[0, 0, i, j].item() == _exact_fp32(terms), (i, j)


def test_settle_tiers_hold_their_claims():
    """The two facts settle_f32 rests on, checked against exact rational sums of float64 GEMMs:
    where its tier-1 test passes (the grid and the norms fit 53 bits) the float64 GEMM IS exact, and
    everywhere the GEMM's error stays within gemm_error_bound."""
    from fractions import Fraction

    from mjolnir_numerics.emulator_stages import (
        NARROW_GRID_EXP,
        NORM_MARGIN,
        gemm_error_bound,
        grid_exponent,
        row_norm,
    )

    gen = torch.Generator().manual_seed(11)
    k = 64
    spread = torch.randint(-40, 4, (6, k), generator=gen).float()
    a = (torch.randn(6, k, generator=gen) * torch.exp2(spread)).to(torch.bfloat16).double()
    a[0] = torch.randn(k, generator=gen).to(torch.bfloat16).double()  # narrow in range: the exact tier
    b = (torch.randn(k, 5, generator=gen) * 40).to(torch.float8_e4m3fn).double()
    z = a @ b
    grid = grid_exponent(a, 8)[:, None] + NARROW_GRID_EXP
    a_norm, b_norm = row_norm(a, -1)[:, None], row_norm(b, -2)[None, :]
    exact_tier = a_norm * b_norm * (1.0 + NORM_MARGIN) < torch.exp2(grid + 53.0)
    bound = gemm_error_bound(k, a_norm, b_norm)
    assert exact_tier[0].all() and not exact_tier.all()  # both tiers are exercised
    for i in range(6):
        for j in range(5):
            exact = sum((Fraction(float(a[i, t])) * Fraction(float(b[t, j])) for t in range(k)), Fraction(0))
            err = abs(Fraction(float(z[i, j])) - exact)
            assert err <= Fraction(float(bound[i, j])), (i, j)
            if exact_tier[i, j]:
                assert err == 0, (i, j)


def test_exact_dot_rounds_ties_to_even_and_subnormals():
    from mjolnir_numerics.emulator_stages import exact_dot_f32, verified_f32

    one_ulp = 2.0**-23
    # 1 + half an ulp: a tie, to even (1); 1 + 3/2 ulp: a tie, to even (1 + 2 ulp); and past the tie
    a = torch.tensor(
        [[1.0, one_ulp / 2, 0.0], [1.0, 1.5 * one_ulp, 0.0], [1.0, one_ulp / 2, 2.0**-80]], dtype=torch.float64
    )
    b = torch.ones_like(a)
    r = exact_dot_f32(a, b)
    assert r.tolist() == [1.0, 1.0 + 2 * one_ulp, 1.0 + one_ulp]
    # fp32 subnormals: 3 * 2^-150 is a tie between 2^-149 and 2^-148: to even (2^-148)
    r = exact_dot_f32(
        torch.tensor([[2.0**-149, 2.0**-150]], dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64)
    )
    assert r.item() == 2.0**-148
    # a float64 value on an fp32 midpoint with any error bound is in doubt; far from one it is not
    _, doubt = verified_f32(
        torch.tensor([1.0 + one_ulp / 2, 1.0 + one_ulp / 4], dtype=torch.float64), torch.tensor(1e-30)
    )
    assert doubt.tolist() == [True, False]


def test_log_is_correctly_rounded():
    x = torch.tensor([1.0, 2.875, 33.125, 0.0], dtype=torch.float32)
    y = log_f32(x)
    assert y[0] == 0 and y[3] == -math.inf
    assert y[1] == torch.tensor(math.log(2.875), dtype=torch.float32)


def test_row_sum_butterfly_order():
    """Inside a warp the butterfly pairs lane i with lane i ^ 16 first; across warps the sum is
    ((w0 + w1) + w2) + w3. Both orders are visible with values 1 and 2^-24 (ties to even)."""
    l = torch.zeros(128)
    l[0], l[1], l[17] = 1.0, 2.0**-24, 2.0**-24
    # tree: lanes 1 and 17 meet first (2^-23), then join 1 exactly; a sequential sum would lose both
    assert reduce_row_sum(l).item() == 1.0 + 2.0**-23
    l = torch.zeros(128)
    l[0], l[32], l[64] = 1.0, 2.0**-24, 2.0**-24
    # warps left to right: (1 + 2^-24) rounds to 1 twice; w0 + (w1 + w2) would give 1 + 2^-23
    assert reduce_row_sum(l).item() == 1.0
    l = torch.zeros(128)
    l[96], l[32], l[64] = 1.0, 2.0**-24, 2.0**-24
    assert reduce_row_sum(l).item() == 1.0 + 2.0**-23  # (0 + 2^-24) + 2^-24 first, then + 1


# ------------------------------------------------------------------------------------------------
# Hand-computed tiny cases: softmax_scale = ln 2 makes c = fp32(fp32(ln 2) * fp32(log2 e)) = 1 exactly,
# and integer scores make every p a power of two, so each step can be written down.
# ------------------------------------------------------------------------------------------------
LN2 = math.log(2)
F32 = np.float32


def _tiny(scores_per_seq, q_len=1, page_size=16):
    """h_q = h_k = 1, d = 128; K row j = scores[j] * e_0, Q = e_0 (every query token), so S_j = scores[j];
    V[j, i] = ((j + i) % 5) - 2. Descales 1. Returns (q e4m3, q_descale, cache, V lists)."""
    d = 128
    ks, vs = [], []
    for scores in scores_per_seq:
        L = len(scores)
        k = torch.zeros(L, 1, d)
        k[:, 0, 0] = torch.tensor(scores, dtype=torch.float32)
        v = ((torch.arange(L)[:, None] + torch.arange(d)[None, :]) % 5 - 2).float()[:, None, :]
        ks.append(k)
        vs.append(v)
    one = torch.tensor(1.0)
    cache = PagedKVCache.from_float(ks, vs, "e4m3", page_size=page_size, k_descale=one, v_descale=one)
    b = len(scores_per_seq)
    q = torch.zeros(b * q_len, 1, d)
    q[:, 0, 0] = 1.0
    return q.to(torch.float8_e4m3fn), torch.ones(b, 1), cache, vs


def _expected_unsplit(scores, v, visible):
    """The kernel's steps for one unsplit sequence with c = 1 (every p a power of two, all sums exact)."""
    s = np.array(scores, dtype=np.float64)[:visible]
    m = s.max()
    p = 2.0 ** (s - m)  # exact; p * 448 is an e4m3 value for the exponents used here
    l = F32(p.sum())  # dyadic: exact in any order
    O = (448.0 * p[:, None] * v[:visible, 0].numpy()).sum(0).astype(np.float32)  # exact
    out_scale = F32(F32(1.0) * F32(1.0)) * F32(1 / 448)
    inv_l = out_scale / (l + F32(1e-30))
    o = torch.from_numpy((O * inv_l).astype(np.float32)).to(torch.bfloat16)
    lse = F32(F32(m) * F32(LN2)) + F32(math.log(float(l)))
    return o, lse


def test_hand_one_tile():
    scores = [0, 1, 3, 2, 3]
    q, qd, cache, vs = _tiny([scores])
    o, lse = emulate_decode(q, cache, q_descale=qd, softmax_scale=LN2, chunk_tiles=0)
    eo, e_lse = _expected_unsplit(scores, vs[0], 5)
    assert torch.equal(o[0, 0], eo)
    assert lse[0, 0, 0].item() == e_lse


def test_hand_two_tiles_max_moves():
    # tile 0: 128 scores 0 (m = 0, l_i = 1); tile 1: scores 2 and -1 -> m = 2, corr = 1/4,
    # l_0 = fma(1/4, 1, 1) = 1.25, l_1 = 1/4 + 1/8, l_i = 1/4 -> l = 33.125; O rescaled by 1/4.
    scores = [0] * 128 + [2, -1]
    q, qd, cache, vs = _tiny([scores])
    o, lse = emulate_decode(q, cache, q_descale=qd, softmax_scale=LN2, chunk_tiles=0)
    v = vs[0][:, 0].numpy()
    O = (448.0 * v[:128].sum(0) * 0.25 + 448.0 * (v[128] + 0.125 * v[129])).astype(np.float32)
    inv_l = (F32(1.0) * F32(1 / 448)) / (F32(33.125) + F32(1e-30))
    assert torch.equal(o[0, 0], torch.from_numpy((O * inv_l).astype(np.float32)).to(torch.bfloat16))
    assert lse[0, 0, 0].item() == F32(F32(2.0) * F32(LN2)) + F32(math.log(33.125))


def test_hand_sink_token_loses_the_tail_in_p_rounding():
    # key 0 scores 20, 199 keys score 0: their p = 2^-20 rounds to e4m3(448 * 2^-20) = 0 in P, but the
    # row sum keeps it (unrounded p): o = V0 / (1 + 199 * 2^-20) exactly as the kernel does.
    scores = [20] + [0] * 199
    q, qd, cache, vs = _tiny([scores])
    o, lse = emulate_decode(q, cache, q_descale=qd, softmax_scale=LN2, chunk_tiles=0)
    l = F32(1.0)
    # row sums per thread: tile 0 thread 0: 1 + ... each thread i accumulates p = 2^-20 (tile 0, i > 0)
    # and tile 1 (keys 128..199 -> threads 0..71): exact dyadics, so the total is exact
    l = F32(1.0 + 199 * 2.0**-20)
    O = (448.0 * vs[0][0, 0].numpy()).astype(np.float32)
    inv_l = (F32(1.0) * F32(1 / 448)) / (l + F32(1e-30))
    assert torch.equal(o[0, 0], torch.from_numpy((O * inv_l).astype(np.float32)).to(torch.bfloat16))
    # exact attention would give V0 * (1 - 199 * 2^-20) + 2^-20 * sum(V_j): the P-rounding bias
    assert lse[0, 0, 0].item() == F32(F32(20.0) * F32(LN2)) + F32(math.log(float(l)))


def test_hand_empty_sequence():
    q, qd, cache, vs = _tiny([[], [1, 0, 2]])
    for plan_kw in (dict(chunk_tiles=0), dict()):
        o, lse = emulate_decode(q, cache, q_descale=qd, softmax_scale=LN2, **plan_kw)
        assert torch.equal(o[0], torch.zeros_like(o[0]))
        assert lse[0].item() == -math.inf
        assert not torch.isnan(o.float()).any() and not torch.isnan(lse).any()
        eo, e_lse = _expected_unsplit([1, 0, 2], vs[1], 3)
        assert torch.equal(o[1, 0], eo) and lse[1, 0, 0].item() == e_lse


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_hand_q_len_4(causal):
    scores = [0, 3, 1, 2, 4, -1]  # seq_len 6; causal query qi sees keys 0 .. 2 + qi
    q, qd, cache, vs = _tiny([scores], q_len=4)
    o, lse = emulate_decode(q, cache, q_descale=qd, softmax_scale=LN2, q_len=4, causal=causal, chunk_tiles=0)
    for qi in range(4):
        visible = 3 + qi if causal else 6
        eo, e_lse = _expected_unsplit(scores, vs[0], visible)
        assert torch.equal(o[qi, 0], eo), f"query {qi}"
        assert lse[0, 0, qi].item() == e_lse, f"query {qi}"


# ------------------------------------------------------------------------------------------------
# Invariants
# ------------------------------------------------------------------------------------------------
def test_batch_composition_does_not_change_a_sequence():
    """With a fixed chunk size (the plan's chunking is per sequence), a sequence's O and LSE are
    bit-identical alone or next to others."""
    case = get_case("varlen")
    x = case.build()
    o_all, lse_all = _run(x, plan=None, chunk_tiles=2)
    for s in (0, 3, 4):
        one = dataclasses.replace(case, seq_lens=(case.seq_lens[s],))
        # rebuild sequence s alone with the same values
        cache = PagedKVCache.from_float(
            [x.k_float[s]],
            [x.v_float[s]],
            case.fmt,
            page_size=case.page_size,
            k_descale=x.cache.k_descale,
            v_descale=x.cache.v_descale,
            seed=5,
        )
        o1, lse1 = emulate_decode(x.q[s : s + 1], cache, q_descale=x.q_descale[s : s + 1], chunk_tiles=2)
        assert _equal(o1[0], o_all[s]) and _equal(lse1[0], lse_all[s]), f"sequence {s} ({one.seq_lens})"


PAGING_LENS = (1, 17, 129, 300) if not FULL else (1, 17, 128, 129, 700)  # page and tile edges
PAGING_FORMATS = ["e4m3", "nvfp4"] + (["e2m1", "e3m2"] if FULL else [])


def _rebuilt(x, fmt, **kw):
    """The case's K/V in a new cache with the same descales (``from_float`` takes g, not 8 g, for NVFP4)."""
    shift = 8 if fmt == "nvfp4" else 1
    return PagedKVCache.from_float(
        x.k_float, x.v_float, fmt, k_descale=x.cache.k_descale / shift, v_descale=x.cache.v_descale / shift, **kw
    )


@pytest.mark.parametrize("fmt", PAGING_FORMATS)
def test_page_assignment_does_not_matter(fmt):
    """Shuffled (two seeds) vs contiguous pages, same page size: bit-identical."""
    x = dataclasses.replace(get_case("varlen"), fmt=fmt, granularity="per_tensor", seq_lens=PAGING_LENS).build()
    base = _run(x, chunk_tiles=2, plan=None)
    for kw in (dict(shuffle=False), dict(seed=11, spare_pages=40)):
        got = emulate_decode(x.q, _rebuilt(x, fmt, page_size=16, **kw), q_descale=x.q_descale, chunk_tiles=2)
        assert _equal(got[0], base[0]) and _equal(got[1], base[1]), str(kw)


@pytest.mark.parametrize("fmt", PAGING_FORMATS)
def test_paged_equals_dense(fmt):
    """One 128-key page per tile in order (a dense cache) vs every page size and layout: bit-identical."""
    x = dataclasses.replace(get_case("varlen"), fmt=fmt, granularity="per_tensor", seq_lens=PAGING_LENS).build()
    dense = emulate_decode(x.q, _rebuilt(x, fmt, page_size=128, shuffle=False), q_descale=x.q_descale, chunk_tiles=2)
    variants = [dict(page_size=16), dict(page_size=64, layout="interleaved")]
    if FULL:
        variants += [dict(page_size=32, layout="flashinfer"), dict(page_size=16, layout="hnd")]
    for kw in variants:
        got = emulate_decode(x.q, _rebuilt(x, fmt, **kw), q_descale=x.q_descale, chunk_tiles=2)
        assert _equal(got[0], dense[0]) and _equal(got[1], dense[1]), str(kw)


def _poison_unused_pages(cache) -> torch.Tensor:
    """e4m3 NaN in every page of ``cache``'s pools that no sequence's keys use (in place); returns those pages'
    indices (int64, at least one)."""
    used = set()
    for s in range(cache.num_seqs):
        n = math.ceil(int(cache.seq_lens[s]) / cache.page_size)
        used |= set(cache.block_table[s, :n].tolist())
    unused = torch.tensor(sorted(set(range(cache.num_pages)) - used))
    assert unused.numel() > 0
    for pool in (cache.k_pool, cache.v_pool):
        pool.view(torch.uint8)[unused.to(pool.device)] = 0x7F
    return unused


def test_poisoned_pages_are_never_read():
    x = get_case("poisoned_pages").build()
    base = _run(x)
    cache = x.cache
    unused = _poison_unused_pages(cache)
    cache.block_table[1, 1:] = int(unused[0])  # sequence 1 (5 keys) uses one page: its padding entries
    got = _run(x)
    assert _equal(got[0], base[0]) and _equal(got[1], base[1])
    assert not torch.isnan(got[0].float()).any()


@pytest.mark.parametrize("window", [2, 5])
def test_poisoned_pages_are_never_read_on_the_cuda_code_path(window, monkeypatch):
    """The CUDA code path zeroes the keys of pages past a sequence's end unless the host knows that a window's
    tiles hold none (``_TileSource(inside=True)``): NaN in every unused page, and sequences that end inside
    a window, give the CPU path's bits; the host's claim holds wherever it is made, and is made."""
    import mjolnir_numerics.emulator as emulator

    x = dataclasses.replace(get_case("varlen"), seq_lens=(1536, 1000, 1280, 5)).build()
    cache = x.cache
    unused = _poison_unused_pages(cache)
    cache.block_table[3, 1:] = int(unused[0])  # sequence 3 (5 keys): its padding entries point at NaN
    kw = dict(q_descale=x.q_descale, target="h200", chunk_tiles=12)
    want = emulate_decode(x.q, cache, **kw)
    _take_the_cuda_code_path(monkeypatch, window)
    claims = []
    tile_source = emulator._TileSource

    def spy(cache, which, seqs, tiles, seq_lens, bt, inside=False):
        if inside:
            claims.append(bool(((tiles + 1) * emulator.TILE_KEYS <= seq_lens[seqs]).all()))
        return tile_source(cache, which, seqs, tiles, seq_lens, bt, inside)

    monkeypatch.setattr(emulator, "_TileSource", spy)
    got = emulate_decode(x.q, cache, **kw)
    assert _equal(got[0], want[0]) and _equal(got[1], want[1]) and not torch.isnan(got[0].float()).any()
    assert claims and all(claims)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.gpu
@pytest.mark.parametrize("target", ["h200", "thor"])
@pytest.mark.parametrize("name", ["varlen", "bf16_q", "forced_splits", "q_len4_causal", "nvfp4", "fp6_e3m2"])
def test_cpu_and_cuda_are_bit_identical(name, target):
    """The same target on both devices (the default target follows the device: Thor on the CPU), with
    its hardware models: the H200's MMA, ex2 table and log; Thor's predicted MMA."""
    case = get_case(name)
    cpu, gpu = case.build("cpu"), case.build("cuda")
    o_c, l_c = _run(cpu, target=target)
    o_g, l_g = _run(gpu, target=target)
    assert _equal(o_c, o_g.cpu()) and _equal(l_c, l_g.cpu()), name


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.gpu
@pytest.mark.parametrize(
    "knobs",
    [
        EmulatorKnobs(ex2="correctly_rounded", log="correctly_rounded"),  # the logs' decimal redo: eager stages
        EmulatorKnobs(mma="ideal", row_sum="rounded", lse_base="2"),
    ],
    ids=["correctly_rounded", "ideal_rounded_sum_base2"],
)
def test_cpu_and_cuda_are_bit_identical_with_research_knobs(knobs):
    """Knobs that change which stages CUDA compiles (the correctly rounded logs stay eager) give the CPU's bits,
    on a case whose sequences are split (the merge)."""
    case = get_case("forced_splits")
    cpu, gpu = case.build("cpu"), case.build("cuda")
    o_c, l_c = _run(cpu, target="h200", knobs=knobs)
    o_g, l_g = _run(gpu, target="h200", knobs=knobs)
    assert _equal(o_c, o_g.cpu()) and _equal(l_c, l_g.cpu())


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["random_e4m3", "random_bf16"])
def test_cuda_window_graphs_give_the_cpu_bits(name, monkeypatch):
    """Windows of one tile on CUDA, so that a call captures one as a CUDA graph and replays it for the
    later ones (unsplit sequences of 6 tiles): the CPU's bits, and a capture did happen."""
    import mjolnir_numerics.emulator as emulator

    q, cache, kw = _random_pinned_inputs(e4m3_q=name == "random_e4m3")
    o_c, l_c = emulate_decode(q, cache, **kw, chunk_tiles=6, target="h200")
    captured = []

    class Spy(emulator._WindowGraph):
        def __init__(self, *args):
            super().__init__(*args)
            captured.append(1)  # only once the capture succeeded

    monkeypatch.setattr(emulator, "_window", lambda *args: 1)
    monkeypatch.setattr(emulator, "_WindowGraph", Spy)
    monkeypatch.setattr(emulator, "_REPLAYS", {})  # no window graphs kept from another test
    from benchmarks.bench_emulator import random_e4m3_cache

    cache_g = random_e4m3_cache(3, 700, 2, 128, 16, "cuda")  # _random_pinned_inputs' cache, built on CUDA
    kw_g = {k: v.cuda() for k, v in kw.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="emulate_decode: capturing")  # a failed capture fails the test
        o_g, l_g = emulate_decode(q.cuda(), cache_g, **kw_g, chunk_tiles=6, target="h200")
    assert captured == [1], "no window was captured"
    assert _equal(o_c, o_g.cpu()) and _equal(l_c, l_g.cpu()), name


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.gpu
def test_cuda_window_graphs_capture_after_a_first_window_of_their_shape(monkeypatch):
    """Windows of two tiles over unsplit sequences of 6 whole tiles. Once the process has compiled the shape's
    graphs, the first window (eager) is enough to capture the second, which is replayed, and the third replays
    it; before, the second ran eagerly and the third alone was too few to capture. The first call of a shape
    compiles as it goes, so its early capture may not happen: it must neither warn nor change a bit. The
    graphs are kept for the later calls, which replay every window."""
    import mjolnir_numerics.emulator as emulator
    from benchmarks.bench_emulator import random_e4m3_cache

    q, _, kw = _random_pinned_inputs(e4m3_q=True)
    cache = random_e4m3_cache(3, 768, 2, 128, 16, "cpu")  # 6 whole tiles: every later window is inside
    o_c, l_c = emulate_decode(q, cache, **kw, chunk_tiles=6, target="h200")
    replays = []

    class Spy(emulator._WindowGraph):
        def replay(self, s0, *state):
            replays.append(s0)
            return super().replay(s0, *state)

    monkeypatch.setattr(emulator, "_window", lambda *args: 2)
    monkeypatch.setattr(emulator, "_WindowGraph", Spy)
    monkeypatch.setattr(emulator, "_REPLAYS", {})  # no window graphs kept from another test
    cache_g = random_e4m3_cache(3, 768, 2, 128, 16, "cuda")
    kw_g = {k: v.cuda() for k, v in kw.items()}
    per_call = []
    for call in range(3):
        replays.clear()
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="emulate_decode: capturing")  # a failed capture fails the test
            o_g, l_g = emulate_decode(q.cuda(), cache_g, **kw_g, chunk_tiles=6, target="h200")
        assert _equal(o_c, o_g.cpu()) and _equal(l_c, l_g.cpu()), call
        per_call.append(list(replays))
    # the graphs are kept: the second call replays the kept one for windows 2 and 4 (and captures the first
    # window's), the third replays every window
    assert per_call[1:] == [[0, 2, 4], [0, 2, 4]], per_call


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.gpu
def test_cuda_window_graphs_read_no_poisoned_page(monkeypatch):
    """A captured window skips the zeroing of keys past a sequence's end: NaN in every unused page, and
    sequences whose last tile is partial (so that later windows need the zeroing), captured and replayed on
    CUDA, give the CPU's bits with no NaN."""
    import mjolnir_numerics.emulator as emulator

    def poisoned(device):
        x = dataclasses.replace(get_case("varlen"), seq_lens=(1536, 1000, 1280)).build(device)
        _poison_unused_pages(x.cache)
        return x

    x_c, x_g = poisoned("cpu"), poisoned("cuda")
    o_c, l_c = emulate_decode(x_c.q, x_c.cache, q_descale=x_c.q_descale, target="h200", chunk_tiles=12)
    captured = []

    class Spy(emulator._WindowGraph):
        def __init__(self, *args):
            super().__init__(*args)
            captured.append(1)

    monkeypatch.setattr(emulator, "_window", lambda *args: 1)
    monkeypatch.setattr(emulator, "_WindowGraph", Spy)
    monkeypatch.setattr(emulator, "_REPLAYS", {})  # no window graphs kept from another test
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="emulate_decode: capturing")
        o_g, l_g = emulate_decode(x_g.q, x_g.cache, q_descale=x_g.q_descale, target="h200", chunk_tiles=12)
    assert captured == [1], "no window was captured"
    assert not torch.isnan(o_g.float()).any()
    assert _equal(o_c, o_g.cpu()) and _equal(l_c, l_g.cpu())


def _stage_inputs(gen, n_w=3, a=5, g=2, n=4, t=128, d=64):
    """Random inputs of the stages CUDA compiles: scores with masked keys and whole masked tiles, running maxes
    from -inf, row sums, partials of split sequences with absent splits."""
    s_t = torch.randn(n_w * a, g, n, t, generator=gen) * 30
    keys = torch.arange(t)[None, :] + 128 * torch.arange(n_w).repeat_interleave(a)[:, None]
    last = torch.randint(-1, n_w * 128, (n_w * a, n), generator=gen)
    m_in = torch.where(torch.rand(a, g, n, generator=gen) < 0.3, -math.inf, torch.randn(a, g, n, generator=gen) * 20)
    c_w = (torch.rand(n_w * a, g, generator=gen) + 0.01) * 0.2
    l = torch.rand(a, g, n, t, generator=gen) * 3
    o = torch.randn(a, g, n, d, generator=gen)
    scales = [torch.rand(a, g, generator=gen) + 0.1 for _ in range(3)]
    b, j = 3, 4
    o_p = torch.randn(b, j, g, n, d, generator=gen)
    m_p = torch.where(
        torch.rand(b, j, g, n, generator=gen) < 0.25, -math.inf, torch.randn(b, j, g, n, generator=gen) * 9
    )
    l_p = torch.where(m_p == -math.inf, 0.0, torch.rand(b, j, g, n, generator=gen) * 5)
    return (s_t, keys, last, m_in, c_w), (l, o, m_in, *scales), (o_p, m_p, l_p)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_stages_give_the_eager_bits(device, monkeypatch):
    """The stages CUDA compiles (steps 4-8's factors per window, the epilogue, the split merge), compiled by
    inductor for ``device``, against their eager bits on the CPU (both in their branch-free forms), with the
    kernels' P formats (e4m3, bf16) and e5m2, both ex2 models and the rounded row sum."""
    import functools

    import mjolnir_numerics.emulator as emulator
    import mjolnir_numerics.emulator_stages as stages

    monkeypatch.setattr(stages, "_sync_free", lambda x: True)
    stages.load_tables(torch.device(device), True)
    stages.load_tables(torch.device("cpu"), True)
    window, final, merge = _stage_inputs(torch.Generator().manual_seed(21))
    sm90 = functools.partial(stages.exp2_sm90_f32, check=False)

    def check(fn, args, *static):
        want = fn(*args, *static)
        got = torch.compile(fn, fullgraph=True, dynamic=True)(*(x.to(device) for x in args), *static)
        for w, g in zip(want, got):
            assert _equal(w, g.cpu()), fn.__name__

    for p_format, rounded, ex2 in (("e4m3", False, sm90), ("bf16", True, stages.exp2_f32), ("e5m2", False, sm90)):
        check(emulator._window_softmax, window, 3, 448.0 if p_format == "e4m3" else 1.0, p_format, rounded, ex2)
    check(emulator._final, final, None, stages.log_libdevice_f32)
    check(stages.reduction, merge, 1.0, stages.LOG2E_F32, stages.log_libdevice_f32, sm90)


def test_split_equals_unsplit_within_merge_rounding():
    x = get_case("forced_splits").build()
    o_s, l_s = _run(x)
    o_u, l_u = _run(x, plan=None, chunk_tiles=0)
    # merging reorders fp32 sums and rounds the partials: a few bf16 ulps at most
    assert (o_s.float() - o_u.float()).abs().max() <= 4 * 2.0**-8 * o_u.float().abs().max()
    assert (l_s - l_u).abs().max() <= 2.0**-16 * l_u.abs().max()


def _streams_as_chunks(cache, plan, streams: int):
    """The cache and plan that walk, front to back, what ``tile_streams=streams`` walks in interleaved streams:
    each chunk's tiles reordered stream by stream (tiles t0 + s, t0 + s + S, ...; the block table permuted
    128 keys at a time), each stream a chunk of its own at split slot ``j * S + s``."""
    per_tile = 128 // cache.page_size
    table = cache.block_table.clone()
    work, n_splits = [], [n * streams for n in plan.n_splits]
    for b, t0, t1, j in plan.chunks():
        order = [t for s in range(streams) for t in range(t0 + s, t1, streams)]
        for i, t in enumerate(order):
            src = cache.block_table[b, t * per_tile : (t + 1) * per_tile]
            table[b, (t0 + i) * per_tile : (t0 + i + 1) * per_tile] = src
        at = t0
        for s in range(streams):
            n = len(range(t0 + s, t1, streams))
            assert n > 0, "every stream needs a tile here (an empty one is not a chunk)"
            work.append((b, at, at + n, j * streams + s))
            at += n
    return dataclasses.replace(cache, block_table=table), SplitPlan(tuple(work), tuple(n_splits), 0, len(work))


@pytest.mark.parametrize("target", ["thor", "h200"])
@pytest.mark.parametrize("chunk_tiles", [0, 3], ids=["unsplit", "split"])
@pytest.mark.parametrize("fmt,q_dtype", [("e4m3", "e4m3"), ("e4m3", "bf16"), ("nvfp4", "e4m3")])
def test_tile_streams_walk_each_stream_as_a_chunk_merged_by_the_reduction(fmt, q_dtype, chunk_tiles, target):
    """``tile_streams=2`` against the front-to-back walk of the same tiles reordered stream by stream, every
    stream a split of its own: bit-identical. Lengths whose last tile is partial end their last chunk on an
    even tile count, so that the partial tile stays the last one walked (its mask is by key position)."""
    case = dataclasses.replace(
        get_case("varlen"), fmt=fmt, q_dtype=q_dtype, pattern="moving_max", seq_lens=(640, 200, 1000, 256, 768)
    )
    x = case.build()
    plan = chunked_plan(x.cache.seq_lens, chunk_tiles)
    kw = dict(q_descale=x.q_descale, target=target)
    got = emulate_decode(x.q, x.cache, plan=plan, knobs=EmulatorKnobs(tile_streams=2), **kw)
    cache2, plan2 = _streams_as_chunks(x.cache, plan, 2)
    want = emulate_decode(x.q, cache2, plan=plan2, **kw)
    assert _equal(got[0], want[0]) and _equal(got[1], want[1])
    one = emulate_decode(x.q, x.cache, plan=plan, **kw)  # the knob changes the walk (the merge re-rounds)
    assert not _equal(got[0], one[0])


def _take_the_cuda_code_path(monkeypatch, window: int) -> None:
    """Run the emulator's CUDA code path on the CPU: ``window`` tiles per window, the MMA chains as the fused
    formula (eager: no compile), the stages' branch-free forms."""
    import mjolnir_numerics.arithmetic as arithmetic
    import mjolnir_numerics.emulator as emulator
    import mjolnir_numerics.emulator_stages as stages

    monkeypatch.setattr(emulator, "_window", lambda *args: window)
    monkeypatch.setattr(emulator, "fused_chain_available", lambda device: True)
    monkeypatch.setattr(arithmetic, "fused_chain_available", lambda device: True)
    monkeypatch.setattr(arithmetic, "_fused", lambda fn, tune=False: fn)
    monkeypatch.setattr(emulator, "_fused", lambda fn, tune=False: fn)
    monkeypatch.setattr(stages, "_sync_free", lambda x: True)
    monkeypatch.setattr(emulator, "_REPLAYS", {})  # no window graphs kept from another test


@pytest.mark.parametrize("window", [1, 3])
def test_tile_streams_on_the_cuda_code_path(window, monkeypatch):
    """The CUDA code path (windows of tiles, the fused chains; run here on the CPU) walks the streams as the
    CPU path does: bit-identical, with sequences that end inside a window."""
    x = dataclasses.replace(get_case("varlen"), pattern="moving_max", seq_lens=(900, 130, 1500, 0, 300)).build()
    kw = dict(q_descale=x.q_descale, target="h200", chunk_tiles=4, knobs=EmulatorKnobs(tile_streams=2))
    want = emulate_decode(x.q, x.cache, **kw)
    _take_the_cuda_code_path(monkeypatch, window)
    got = emulate_decode(x.q, x.cache, **kw)
    assert _equal(got[0], want[0]) and _equal(got[1], want[1])


def test_tile_streams_come_from_the_target_unless_the_knob_says():
    x = get_case("forced_splits").build()
    two = dataclasses.replace(get_target("h200"), tile_streams=2)
    by_target = _run(x, target=two)
    by_knob = _run(x, target="h200", knobs=EmulatorKnobs(tile_streams=2))
    assert _equal(by_target[0], by_knob[0]) and _equal(by_target[1], by_knob[1])
    back = _run(x, target=two, knobs=EmulatorKnobs(tile_streams=1))
    front = _run(x, target="h200")
    assert _equal(back[0], front[0]) and not _equal(by_knob[0], front[0])
    with pytest.raises(ValueError, match="tile_streams: expected an int in 1..32, got 0"):
        EmulatorKnobs(tile_streams=0)
    with pytest.raises(TypeError, match="tile_streams: expected an int"):
        EmulatorKnobs(tile_streams=2.0)
    with pytest.raises(ValueError, match="tile_streams: expected an int in 1..32, got 33"):
        EmulatorKnobs(tile_streams=33)


def test_tile_streams_with_empty_streams():
    """A one-tile sequence in two streams: its second stream is empty (max -inf, weight 0), so the reduction of
    its one partial gives the front-to-back LSE bit for bit and O within the merge's rounding; an empty
    sequence still gives O = 0 and LSE = -inf."""
    q, qd, cache, vs = _tiny([[], [1, 0, 2], [0.5] * 100])
    base = emulate_decode(q, cache, q_descale=qd, softmax_scale=LN2, chunk_tiles=0)
    for streams in (2, 3):
        o, lse = emulate_decode(
            q, cache, q_descale=qd, softmax_scale=LN2, chunk_tiles=0, knobs=EmulatorKnobs(tile_streams=streams)
        )
        assert torch.equal(o[0], torch.zeros_like(o[0])) and lse[0].item() == -math.inf
        assert not torch.isnan(o.float()).any() and not torch.isnan(lse).any()
        assert torch.equal(lse[1:], base[1][1:])
        assert (o[1:].float() - base[0][1:].float()).abs().max() <= 2.0**-7 * base[0][1:].float().abs().max()


# ------------------------------------------------------------------------------------------------
# Against the exact reference and the seed
# ------------------------------------------------------------------------------------------------
def _unit_roundoff(fmt_name: str) -> float:
    f = FORMATS[fmt_name]
    element = f.element if hasattr(f, "element") else f
    return 2.0 ** -(element.man_bits + 1)


SMALL_CASES = ("sink_token", "varlen", "q_len4_causal", "bf16_q", "fp4_e2m1", "nvfp4", "empty_sequence")


@pytest.mark.parametrize("streams", [1, 2], ids=["front_to_back", "two_streams"])
@pytest.mark.parametrize("case", [c for c in CASES if FULL or c.name in SMALL_CASES], ids=lambda c: c.name)
def test_spec_vs_exact_reference(case, streams):
    """Relative L2 error of O within 2 u (u: the KV element format's unit roundoff): the K error moves
    each logit by about u |q||k| scale (~u for unit-variance logits) and the V error adds about u. The
    same bound holds for the walk in two tile streams."""
    x = case.build()
    o, lse = _run(x, knobs=EmulatorKnobs(tile_streams=streams))
    ro, rl = reference_decode(x.q_float, x.k_float, x.v_float, q_len=x.q_len, causal=x.causal)
    bound = 2 * _unit_roundoff(case.fmt)
    rel = float((o.double() - ro).norm() / ro.norm())
    assert rel <= bound, f"{case.name}: rel L2 {rel:.4f} > {bound}"
    fin = torch.isfinite(rl)
    assert torch.equal(fin, torch.isfinite(lse)), f"{case.name}: -inf LSE exactly where the reference has one"
    assert float((lse.double()[fin] - rl[fin]).abs().max()) <= 4 * bound


def _seed_emulator():
    if not SEED_PATH.exists():
        pytest.skip(f"seed file {SEED_PATH} is absent")
    return load_seed("emulate_decode", "FP8_P_SCALE", "log2_e", "tile_s_rows").emulate_decode


SEED_CASES = ("two_tiles_moving_max", "varlen", "q_len4_noncausal", "split_causal_tail", "bf16_q", "nvfp4")


@pytest.mark.parametrize(
    "case", [c for c in CASES if 0 not in c.seq_lens and (FULL or c.name in SEED_CASES)], ids=lambda c: c.name
)
def test_agrees_with_the_seed_emulator(case):
    """Same inputs through the seed's emulate_decode (fp32 torch ops): equal within fp32 noise.
    Deliberate differences (all fp32-ulp level): exact dot products, fma row sums and the butterfly
    order, the O-rescale skip, the 1e-30 / exp2 / fp32-constant epilogue, and unsplit sequences
    written directly (the seed merges them through exp(0) = 1)."""
    seed_emulate = _seed_emulator()
    x = case.build()
    r = emulate_decode(x.q, x.cache, **x.emulator_kwargs(), return_details=True)
    c = x.cache
    pages = torch.arange(c.num_pages)
    fp8 = x.q.dtype == torch.float8_e4m3fn
    qd = x.q_descale if fp8 else torch.ones(c.num_seqs, c.heads_k)
    so, sl, _ = seed_emulate(
        pack_q(x.q.float(), c.num_seqs, x.q_len, c.heads_k),
        c.page_values("k", pages),
        c.page_values("v", pages),
        c.block_table,
        c.seq_lens,
        qd,
        c.descale_table("k"),
        c.descale_table("v"),
        1 / math.sqrt(c.head_dim),
        1.0,
        x.q_len,
        r.plan.chunk_tiles,
        fp8,
        x.causal,
    )
    if r.plan.chunk_tiles and any(n > 1 for n in r.plan.n_splits):
        assert len(set(n for n in r.plan.n_splits)) >= 1  # the seed chunks every sequence by chunk_tiles too
    err = float((r.o_fp32 - so).abs().max() / so.abs().max())
    assert err <= SEED_O_REL_TOL, f"{case.name}: max |O - O_seed| / max |O_seed| = {err:.2e}"
    assert float((r.lse - sl).abs().max()) <= SEED_LSE_ABS_TOL


# ------------------------------------------------------------------------------------------------
# Knobs and capability rules
# ------------------------------------------------------------------------------------------------
def test_knobs_change_what_they_say():
    x = get_case("varlen").build()
    base_o, base_l = _run(x)
    o256, l256 = _run(x, knobs=EmulatorKnobs(p_scale=256.0))
    assert not _equal(o256, base_o) and _equal(l256, base_l)  # p_scale only moves P's rounding
    o2, l2 = _run(x, knobs=EmulatorKnobs(lse_base="2"))
    fin = torch.isfinite(base_l)
    assert torch.allclose(l2[fin].double(), base_l[fin].double() / math.log(2), rtol=2.0**-20)
    ofp32, _ = _run(x, knobs=EmulatorKnobs(p_format="fp32", p_scale=1.0))
    orr, _ = _run(x, knobs=EmulatorKnobs(row_sum="rounded"))
    ovo, _ = _run(x, knobs=EmulatorKnobs(v_descale_at="output"))
    for name, o in (("fp32 P", ofp32), ("rounded row sum", orr), ("v descale at output", ovo)):
        assert not _equal(o, base_o), name
        assert (o.float() - base_o.float()).norm() <= 0.05 * base_o.float().norm(), name
    for fmt in ("e5m2", "bf16"):
        o, _ = _run(x, knobs=EmulatorKnobs(p_format=fmt))
        assert torch.isfinite(o.float()).all()


def test_arithmetic_knobs_default_to_the_targets_hardware_models():
    """The default is the target's hardware arithmetic where the kernel runs the configuration; the ideal
    models are knobs. page_size_32 on the H200 target: one O element moves with the MMA model (the H200's
    kernel matched the hardware model there, not the ideal one), and LSE bits move with the ex2 and log
    models."""
    from mjolnir_kernel.conformance import KERNEL_CASES

    x = next(c for c in KERNEL_CASES if c.name == "page_size_32").build()
    kw = dict(x.emulator_kwargs(), target="h200")
    o, lse = emulate_decode(x.q, x.cache, **kw)
    o_hw, lse_hw = emulate_decode(
        x.q, x.cache, **kw, knobs=EmulatorKnobs(mma="hardware", log="hardware", ex2="hardware")
    )
    assert _equal(o, o_hw) and _equal(lse, lse_hw)
    o_i, lse_i = emulate_decode(x.q, x.cache, **kw, knobs=EmulatorKnobs(mma="ideal"))
    assert int((o.view(torch.int16) != o_i.view(torch.int16)).sum()) == 1
    o_c, lse_c = emulate_decode(x.q, x.cache, **kw, knobs=EmulatorKnobs(ex2="correctly_rounded"))
    assert _equal(o, o_c) and not _equal(lse, lse_c)  # the SFU's ulps reach the row sums, hence LSE
    y = get_case("varlen").build()
    _, lse_h = _run(y)
    _, lse_c = _run(y, knobs=EmulatorKnobs(log="correctly_rounded"))
    assert not _equal(lse_h, lse_c)
    assert float((lse_h - lse_c).abs().max()) <= 2.0**-20 * float(lse_c[torch.isfinite(lse_c)].abs().max())


def test_arithmetic_knobs_reject_what_no_kernel_runs():
    x = get_case("varlen").build()
    with pytest.raises(ValueError, match="log: 'fast' is not one of hardware, correctly_rounded, None"):
        EmulatorKnobs(log="fast")
    with pytest.raises(ValueError, match="knobs: mma='hardware' models the kernels' own MMAs"):
        _run(x, knobs=EmulatorKnobs(p_format="fp32", p_scale=1.0, mma="hardware"))
    with pytest.raises(ValueError, match="knobs: log='hardware' models the kernels' natural-log LSE"):
        _run(x, knobs=EmulatorKnobs(lse_base="2", log="hardware"))
    y = get_case("fp4_e2m1").build()  # bf16 Q on e2m1: beyond the kernels, so the default is the ideal
    q = y.q_float.to(torch.bfloat16)
    o, lse = emulate_decode(q, y.cache, allow_unsupported=True)
    o_i, lse_i = emulate_decode(q, y.cache, allow_unsupported=True, knobs=IDEAL)
    assert _equal(o, o_i) and _equal(lse, lse_i)


def test_research_switch_runs_beyond_the_capability_rules():
    x = get_case("fp4_e2m1").build()
    q_bf16 = x.q_float.to(torch.bfloat16)
    with pytest.raises(ValueError, match="q"):
        emulate_decode(q_bf16, x.cache)
    o, lse = emulate_decode(q_bf16, x.cache, allow_unsupported=True)
    assert torch.isfinite(o.float()).all()


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------
def _bad_inputs():
    x = get_case("varlen").build()
    return x


def test_bad_h_q_and_d_and_dtype():
    x = _bad_inputs()
    with pytest.raises(ValueError, match="q: h_q=7"):
        emulate_decode(x.q[:, :7], x.cache, q_descale=x.q_descale)
    with pytest.raises(ValueError, match="q: head dim"):
        emulate_decode(torch.cat([x.q, x.q], -1), x.cache, q_descale=x.q_descale)
    with pytest.raises(ValueError, match="q: dtype"):
        emulate_decode(x.q_float, x.cache)
    with pytest.raises(ValueError, match="q_descale"):
        emulate_decode(x.q, x.cache)


@pytest.mark.parametrize("bad", [torch.zeros(()), -torch.ones(()), torch.tensor(float("nan")), torch.ones(3, 3)])
@pytest.mark.parametrize("which", ["q_descale", "k_descale", "v_descale"])
def test_bad_descales(which, bad):
    x = _bad_inputs()
    if which == "q_descale":
        with pytest.raises(ValueError, match="q_descale"):
            emulate_decode(x.q, x.cache, q_descale=bad)
        return
    cache = dataclasses.replace(x.cache, **{which: torch.ones(())})  # a valid cache to edit in place
    getattr(cache, which).resize_(bad.shape).copy_(bad) if bad.dim() else getattr(cache, which).copy_(bad)
    with pytest.raises(ValueError, match=which):
        emulate_decode(x.q, cache, q_descale=x.q_descale)


def test_bad_block_table_and_seq_lens():
    x = _bad_inputs()
    c = x.cache
    c.seq_lens[0] = c.block_table.shape[1] * c.page_size + 1
    with pytest.raises(ValueError, match="seq_lens"):
        emulate_decode(x.q, c, q_descale=x.q_descale)
    x = _bad_inputs()
    x.cache.block_table[4, 0] = x.cache.num_pages
    with pytest.raises(ValueError, match="block_table"):
        emulate_decode(x.q, x.cache, q_descale=x.q_descale)


def test_q_len_beyond_seq_len():
    x = get_case("varlen").build()  # seq_lens (1, 17, ...)
    q4 = x.q.repeat_interleave(4, dim=0)
    with pytest.raises(ValueError, match="q_len"):
        emulate_decode(q4, x.cache, q_descale=x.q_descale, q_len=4)


def test_bad_plan():
    x = _bad_inputs()
    wrong = plan_split_kv([5, 5], 2)
    with pytest.raises(ValueError, match="plan"):
        emulate_decode(x.q, x.cache, q_descale=x.q_descale, plan=wrong)


# ------------------------------------------------------------------------------------------------
# Bits pinned across the CPU speed work
# ------------------------------------------------------------------------------------------------
# sha256 (first 16 hex digits) of O's bf16 bits then LSE's fp32 bits, recorded with the emulator as
# committed before the speed work (25886d8): blocking of the GEMMs, one band split / combine per
# step, padded GEMM rows and the cheaper rounding paths must leave every bit as it was. The inputs
# are exactly representable and the model is exact, so the digests hold on any machine.
# forced_splits/kernel was re-recorded when the reduction's weighted sums became one fma per term (the
# reduction kernel's FFMA; it was a multiply then an add): 1 of its 16 LSE values moved, no O bit. They pin
# the ideal arithmetic (EmulatorKnobs(mma="ideal", log="correctly_rounded", ex2="correctly_rounded")); the
# hardware models have their own tests.
PINNED_DIGESTS = {
    "varlen/kernel": "e6a57cddb2e71432",
    "forced_splits/kernel": "4a3d28569cd22988",
    "bf16_q/kernel": "d3e30fdcddf8f455",
    "q_len4_causal/kernel": "1497788a960e77f6",
    "poisoned_pages/kernel": "2a72b707bc577c3c",
    "nvfp4/kernel": "1823f213b8b0926f",
    "fp6_e3m2/kernel": "cdec5996618b8b3b",
    "varlen/bf16": "f2d9b3f78aa75bc3",
    "varlen/e5m2": "7c643c7dcb8f0b6c",
    "varlen/fp32": "746ca3d85a79b7f7",
    "random/bf16": "64cc459674be5aac",
    "random/e4m3": "c99f90ca7d3a55ce",
}


IDEAL = EmulatorKnobs(mma="ideal", log="correctly_rounded", ex2="correctly_rounded")


def _digest(o: torch.Tensor, lse: torch.Tensor) -> str:
    h = hashlib.sha256()
    h.update(o.contiguous().view(torch.int16).cpu().numpy().tobytes())
    h.update(lse.contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def _random_pinned_inputs(e4m3_q: bool):
    """The pinned digests' random case: wide bf16 Q (or its e4m3 quantization) and many P bands; 16-key
    pages, 3 sequences of 700 keys. Returns (q, cache, emulate_decode keyword arguments)."""
    from benchmarks.bench_emulator import random_e4m3_cache
    from mjolnir_numerics.scales import quantize_q

    cache = random_e4m3_cache(3, 700, 2, 128, 16, "cpu")
    q = (torch.randn(3, 12, 128, generator=torch.Generator().manual_seed(1)) * 3).to(torch.bfloat16)
    kw = {}
    if e4m3_q:
        q, kw["q_descale"] = quantize_q(q, 3, 1, 2)
    return q, cache, kw


# O and LSE digests of every named case and two random caches under each target's default (hardware)
# arithmetic, recorded with the emulator of commit ff79b6d (the one the H200 conformance run matched on
# 343 of 343 cases): speed work on the hardware models must leave every bit where it was.
PINNED_HW_DIGESTS = {
    "bf16_q/h200": "fab4f38e33a6e54a",
    "bf16_q/thor": "9ce7190b9c891b40",
    "empty_sequence/h200": "7e81f8a2c651eaea",
    "empty_sequence/thor": "7e81f8a2c651eaea",
    "forced_splits/h200": "db307d24c0823cfa",
    "forced_splits/thor": "4a3d28569cd22988",
    "fp4_e2m1/h200": "398080bf14c71af6",
    "fp4_e2m1/thor": "398080bf14c71af6",
    "fp6_e2m3/h200": "9b9e60494f6246c0",
    "fp6_e2m3/thor": "9b9e60494f6246c0",
    "fp6_e3m2/h200": "cdec5996618b8b3b",
    "fp6_e3m2/thor": "cdec5996618b8b3b",
    "gqa_h_r_6_d256/h200": "acdd9eaa4591fe66",
    "gqa_h_r_6_d256/thor": "99c470ec181a4055",
    "layout_hnd/h200": "6b080c0285f40f01",
    "layout_hnd/thor": "78b29707c209082f",
    "nvfp4/h200": "1823f213b8b0926f",
    "nvfp4/thor": "48f35eb7c592915d",
    "one_tile/h200": "9daf9a9f93f527a1",
    "one_tile/thor": "e9ae80c74e11cab5",
    "page_size_128/h200": "11f8a69a148c8c7a",
    "page_size_128/thor": "afb8173780b50466",
    "per_seq_head_descale/h200": "a29855e8b324d5ac",
    "per_seq_head_descale/thor": "a29855e8b324d5ac",
    "poisoned_pages/h200": "407c4d668e4cb652",
    "poisoned_pages/thor": "4b68226d91eb7c4d",
    "q_len4_causal/h200": "3b5cbb8c5dcc83f0",
    "q_len4_causal/thor": "33519e2449e9f2b5",
    "q_len4_noncausal/h200": "f63b5712b2a604f3",
    "q_len4_noncausal/thor": "bce8a1d68c041e37",
    "random_bf16/h200": "7d97fcf920ead36b",
    "random_bf16/thor": "7d97fcf920ead36b",
    "random_e4m3/h200": "52cfbb42cc3189aa",
    "random_e4m3/thor": "52cfbb42cc3189aa",
    "sink_token/h200": "77d28060f1227eee",
    "sink_token/thor": "77d28060f1227eee",
    "split_causal_tail/h200": "110c32d193e52e3d",
    "split_causal_tail/thor": "2465ae030b248695",
    "two_tiles_moving_max/h200": "91b693e9593106c5",
    "two_tiles_moving_max/thor": "91b693e9593106c5",
    "uniform_logits/h200": "4fe11c411e405780",
    "uniform_logits/thor": "4fe11c411e405780",
    "varlen/h200": "60cbc59bd1ef3e53",
    "varlen/thor": "746cdad3e33b1887",
}


@pytest.mark.parametrize("key", sorted(PINNED_HW_DIGESTS))
def test_hardware_arithmetic_bits_pinned_across_speed_work(key):
    name, target = key.split("/")
    if name.startswith("random_"):
        q, cache, kw = _random_pinned_inputs(e4m3_q=name == "random_e4m3")
        got = emulate_decode(q, cache, **kw, target=target)
    else:
        x = get_case(name).build()
        got = emulate_decode(x.q, x.cache, **x.emulator_kwargs(), target=target)
    assert _digest(*got) == PINNED_HW_DIGESTS[key], f"{key}: O / LSE bits changed"


@pytest.mark.parametrize("key", sorted(PINNED_DIGESTS))
def test_bits_pinned_across_speed_work(key):
    name, variant = key.split("/")
    if name == "random":
        q, cache, kw = _random_pinned_inputs(e4m3_q=variant == "e4m3")
        got = emulate_decode(q, cache, **kw, knobs=IDEAL)
    else:
        x = get_case(name).build()
        kw = x.emulator_kwargs()
        kw.update(knobs=IDEAL)
        if variant != "kernel":
            knobs = EmulatorKnobs(p_format=variant, mma="ideal", log="correctly_rounded", ex2="correctly_rounded")
            kw.update(knobs=knobs, allow_unsupported=True)
        got = emulate_decode(x.q, x.cache, **kw)
    assert _digest(*got) == PINNED_DIGESTS[key], f"{key}: O / LSE bits changed"


class _EagerWindowGraph:
    """``emulator._WindowGraph`` without CUDA: the same state kept in its own tensors and the same device
    scalar for the window's first tile, the body run again at each replay instead of a captured graph.
    Counts replays per instance (class attribute ``replays``)."""

    replays: list = []
    closed = 0
    log: list = []  # ("capture", None) and ("replay", s0), in order

    def __init__(self, body, m, l, o):
        self.body, self.state = body, (m.clone(), l.clone(), o.clone())
        self.base = torch.zeros((), dtype=torch.long)
        _EagerWindowGraph.replays.append(0)
        _EagerWindowGraph.log.append(("capture", None))

    def replay(self, s0, m, l, o):
        if m is not self.state[0]:
            for x, y in zip(self.state, (m, l, o)):
                x.copy_(y)
        self.base.fill_(s0)
        for x, y in zip(self.state, self.body(self.base, *self.state)):
            x.copy_(y)
        _EagerWindowGraph.replays[-1] += 1
        _EagerWindowGraph.log.append(("replay", s0))
        return self.state

    def close(self):
        _EagerWindowGraph.closed += 1


@pytest.mark.parametrize("window", [1, 2])
@pytest.mark.parametrize("key", ["random_e4m3/h200", "random_bf16/thor", "fp4_e2m1/h200", "forced_splits/h200"])
def test_replayed_windows_give_the_cpu_bits(key, window, monkeypatch):
    """The CUDA path's window graphs (one full window captured, replayed for the later ones with the state
    in the graph's tensors and the first tile read from a device scalar), their plumbing run on the CPU:
    the bits must be the CPU path's, and the random cases (unsplit: 3 sequences of 6 tiles) must replay."""
    import mjolnir_numerics.emulator as emulator

    name, target = key.split("/")
    if name.startswith("random_"):
        q, cache, kw = _random_pinned_inputs(e4m3_q=name == "random_e4m3")
        kw["chunk_tiles"] = 6
    else:
        x = get_case(name).build()
        q, cache, kw = x.q, x.cache, x.emulator_kwargs()
    want = _digest(*emulate_decode(q, cache, **kw, target=target))
    _take_the_cuda_code_path(monkeypatch, window)
    monkeypatch.setattr(emulator, "_window_graphs_available", lambda device: True)
    monkeypatch.setattr(emulator, "_WindowGraph", _EagerWindowGraph)
    _EagerWindowGraph.replays, _EagerWindowGraph.closed = [], 0
    views = []  # whether each call's running max was a view: a capture reads a tensor of its own, so the eager
    # windows must not pass a view (the compiled stage guards on it: a capture that recompiles fails)
    softmax = emulator._window_softmax
    monkeypatch.setattr(emulator, "_window_softmax", lambda *a: views.append(a[3]._base is not None) or softmax(*a))
    got = emulate_decode(q, cache, **kw, target=target)
    assert _digest(*got) == want, f"{key}: O / LSE bits differ from the CPU path's"
    assert views and not any(views), views
    assert len(_EagerWindowGraph.replays) <= 1, "one capture in a first call"
    assert _EagerWindowGraph.closed == 0, "the graphs are kept for the next call"
    if name.startswith("random_"):  # 700 keys: tiles 0-4 inside, 5 not. Window 1: the first rescaling window
        # (1) eager, 2-4 replay, 5 eager; window 2: of windows 2 and 4 (not inside), one is not worth a capture
        assert _EagerWindowGraph.replays == ([3] if window == 1 else [])
    _EagerWindowGraph.log = []
    again = emulate_decode(q, cache, **kw, target=target)  # the kept graph replayed, the first window's captured
    assert _digest(*again) == want, f"{key}: O / LSE bits differ from the CPU path's in a second call"
    if name.startswith("random_") and window == 1:
        assert _EagerWindowGraph.log == [("capture", None), ("replay", 0)] + [("replay", s) for s in (1, 2, 3, 4)]


def _six_tile_windows_case(monkeypatch):
    """3 unsplit sequences of 6 whole tiles (the pinned random Q, e4m3 Q), and the CUDA path with windows of two
    tiles and window graphs taken on the CPU. Returns ``(q, cache, kwargs, the CPU path's digest)``."""
    import mjolnir_numerics.emulator as emulator
    from benchmarks.bench_emulator import random_e4m3_cache

    q, _, kw = _random_pinned_inputs(e4m3_q=True)
    cache = random_e4m3_cache(3, 768, 2, 128, 16, "cpu")
    kw["chunk_tiles"] = 6
    want = _digest(*emulate_decode(q, cache, **kw, target="h200"))
    _take_the_cuda_code_path(monkeypatch, 2)
    monkeypatch.setattr(emulator, "_window_graphs_available", lambda device: True)
    return q, cache, kw, want


@pytest.mark.parametrize("first_call_compiles", [False, True])
def test_a_window_is_captured_after_a_first_window_of_its_shape(first_call_compiles, monkeypatch):
    """Windows of two tiles over 3 unsplit sequences of 6 whole tiles, the window graphs' plumbing run on the
    CPU. Once the process has compiled the shape's graphs, the first window (eager) is enough to capture the
    second, replayed for it and the third (before: the second eager, and the third alone too few to capture).
    A first call of the shape, whose capture after the first window would have to compile (torch raises under
    the capture's ``fail_on_recompile`` stance), runs that window eagerly instead: no warning, no capture in
    that call (one replayable window is left), captures in the next. The graphs are kept: from the second call
    on, the first window is replayed too, and from the third nothing is captured. The CPU path's bits in every
    call."""
    import mjolnir_numerics.emulator as emulator

    q, cache, kw, want = _six_tile_windows_case(monkeypatch)
    refusals = [first_call_compiles]

    class FirstCallCompiles(_EagerWindowGraph):
        def __init__(self, *args):
            if refusals.pop() if refusals else False:
                raise RuntimeError(
                    "Detected recompile when torch.compile stance is 'fail_on_recompile'. filename: 'emulator.py'"
                )
            super().__init__(*args)

    monkeypatch.setattr(emulator, "_WindowGraph", FirstCallCompiles)
    per_call = []
    for _ in range(3):
        _EagerWindowGraph.log = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a capture that fails for any other reason warns
            got = emulate_decode(q, cache, **kw, target="h200")
        assert _digest(*got) == want
        per_call.append(_EagerWindowGraph.log)
    # later calls of the problem replay every window, the first window's graph captured in the second call
    every = [("replay", 0), ("replay", 2), ("replay", 4)]
    capture = ("capture", None)
    if first_call_compiles:  # the refused capture logs nothing; both kinds are captured in the second call
        assert per_call == [[], [capture, ("replay", 0), capture, ("replay", 2), ("replay", 4)], every], per_call
    else:
        assert per_call == [[capture, ("replay", 2), ("replay", 4)], [capture] + every, every], per_call


def _kept_graphs_problem(q_path: str) -> list:
    """Three calls of one problem (3 sequences of 769-800 keys on 16-key pages: 7 tiles, the last partial), each
    with its own Q (and descale), K / V descales, sequence lengths, a permutation of the block table's pages
    and pool bytes: a dict per call, CPU tensors, for :func:`_run_kept_graphs_call`."""
    from benchmarks.bench_emulator import random_e4m3_cache
    from mjolnir_numerics.scales import quantize_q

    gen = torch.Generator().manual_seed(5)
    pages = random_e4m3_cache(3, 800, 2, 128, 16, "cpu").block_table
    calls = []
    for step in range(3):
        q = (torch.randn(3, 12, 128, generator=gen) * (1 + step)).to(torch.bfloat16)
        extra = {}
        if q_path == "e4m3":
            q, extra["q_descale"] = quantize_q(q, 3, 1, 2)
        pool = random_e4m3_cache(3, 800, 2, 128, 16, "cpu", seed=10 + step).k_pool
        calls.append(dict(
            q=q, extra=extra, k_pool=pool, v_pool=pool.flip(0),
            block_table=pages.flatten()[torch.randperm(pages.numel(), generator=gen)].view_as(pages),
            seq_lens=torch.tensor([800 - 7 * step, 790 + 5 * step, 769 + step], dtype=torch.int32),
            k_descale=torch.rand(3, 2, generator=gen) + 0.5, v_descale=torch.rand(3, 2, generator=gen) + 0.5,
        ))  # fmt: skip
    return calls


def _run_kept_graphs_call(cache, call: dict):
    """One call of :func:`_kept_graphs_problem` on ``cache`` (its tensors overwritten in place: the same problem
    for the kept graphs), one chunk per sequence; O and LSE on the CPU."""
    dev = cache.k_pool.device
    for name in ("k_pool", "v_pool", "block_table", "seq_lens", "k_descale", "v_descale"):
        getattr(cache, name).copy_(call[name])
    extra = {k: v.to(dev) for k, v in call["extra"].items()}
    o, lse = emulate_decode(call["q"].to(dev), cache, **extra, chunk_tiles=8, target="h200")
    return o.cpu(), lse.cpu()


@pytest.mark.parametrize("q_path", ["e4m3", "bf16"])
def test_kept_window_graphs_read_each_calls_own_inputs(q_path, monkeypatch):
    """The window graphs kept from call to call read each call's own inputs. Three calls of one problem (the
    same shapes and pools) with another Q and Q descale, other K / V descales, other sequence lengths (the same
    tiles inside), the block table's pages permuted and the pools' bytes changed in place give the CPU path's
    bits for their own inputs; the second call captures the first window's graph, the third captures nothing
    and replays every window whose tiles lie inside (windows of 2 tiles: 0-1, 2-3, 4-5; the window graphs'
    plumbing run on the CPU)."""
    import mjolnir_numerics.emulator as emulator
    from benchmarks.bench_emulator import random_e4m3_cache

    cache = random_e4m3_cache(3, 800, 2, 128, 16, "cpu")
    calls = _kept_graphs_problem(q_path)
    want = [_digest(*_run_kept_graphs_call(cache, c)) for c in calls]
    assert len(set(want)) == 3
    _take_the_cuda_code_path(monkeypatch, 2)
    monkeypatch.setattr(emulator, "_window_graphs_available", lambda device: True)
    monkeypatch.setattr(emulator, "_WindowGraph", _EagerWindowGraph)
    logs = []
    for c, w in zip(calls, want):
        _EagerWindowGraph.log = []
        assert _digest(*_run_kept_graphs_call(cache, c)) == w, f"call {len(logs) + 1}: bits differ from the CPU's"
        logs.append(_EagerWindowGraph.log)
    every = [("replay", 0), ("replay", 2), ("replay", 4)]
    assert logs == [[("capture", None), ("replay", 2), ("replay", 4)], [("capture", None)] + every, every], logs


@pytest.mark.parametrize("change", ["plan", "causal_masks"])
def test_kept_window_graphs_follow_the_plan_and_the_masks(change, monkeypatch):
    """Kept graphs read each call's plan and masks. ``plan``: sequence lengths (1024, 2048, 1024), then (2048,
    1024, 1024), in chunks of 8 tiles: the same number of chunks, other sequences and first tiles. ``causal_masks``:
    4 causal query rows per sequence, lengths 1024 each, then (1030, 1100, 1024), where a replayed window's last
    keys are masked or not (a small softmax scale, so that the masked keys change O). Both calls of each give the
    CPU path's bits for their own inputs, the second from the first's kept graphs (the plumbing on the CPU)."""
    import mjolnir_numerics.emulator as emulator
    from benchmarks.bench_emulator import random_e4m3_cache
    from mjolnir_numerics.scales import quantize_q

    cache = random_e4m3_cache(3, 2048, 2, 128, 16, "cpu")
    if change == "plan":
        lens, q_len, kw = [(1024, 2048, 1024), (2048, 1024, 1024)], 1, dict(chunk_tiles=8)
    else:
        lens, q_len, kw = [(1024, 1024, 1024), (1030, 1100, 1024)], 4, dict(chunk_tiles=16, softmax_scale=1e-4)
    gen = torch.Generator().manual_seed(9)
    q, q_descale = quantize_q((torch.randn(3 * q_len, 12, 128, generator=gen) * 3).to(torch.bfloat16), 3, q_len, 2)

    def run(seq_lens):
        cache.seq_lens.copy_(torch.tensor(seq_lens, dtype=torch.int32))
        return _digest(*emulate_decode(q, cache, q_descale=q_descale, q_len=q_len, target="h200", **kw))

    want = [run(s) for s in lens]
    assert want[0] != want[1]
    _take_the_cuda_code_path(monkeypatch, 2)
    monkeypatch.setattr(emulator, "_window_graphs_available", lambda device: True)
    monkeypatch.setattr(emulator, "_WindowGraph", _EagerWindowGraph)
    _EagerWindowGraph.log = []
    got = [run(s) for s in lens]
    assert got == want
    assert ("replay", 0) in _EagerWindowGraph.log, "the second call did not replay the kept graphs"


def test_kept_window_graphs_of_an_evicted_problem_are_captured_again(monkeypatch):
    """The device keeps the graphs of its last ``_REPLAYS_KEPT`` problems: a fifth closes the least recently used
    one's graphs, and that problem's next call starts afresh (an eager first window, one capture), with the CPU
    path's bits; a kept problem called again replays its kept graph. ``release_graph_memory`` closes them all."""
    import mjolnir_numerics.emulator as emulator
    from benchmarks.bench_emulator import random_e4m3_cache

    q, _, kw = _random_pinned_inputs(e4m3_q=True)
    caches = [random_e4m3_cache(3, 768, 2, 128, 16, "cpu", seed=s) for s in range(emulator._REPLAYS_KEPT + 1)]
    want = [_digest(*emulate_decode(q, c, **kw, chunk_tiles=6, target="h200")) for c in caches]
    _take_the_cuda_code_path(monkeypatch, 2)
    monkeypatch.setattr(emulator, "_window_graphs_available", lambda device: True)
    monkeypatch.setattr(emulator, "_WindowGraph", _EagerWindowGraph)

    def call(i):
        _EagerWindowGraph.log = []
        assert _digest(*emulate_decode(q, caches[i], **kw, chunk_tiles=6, target="h200")) == want[i]
        return _EagerWindowGraph.log

    first = [("capture", None), ("replay", 2), ("replay", 4)]
    assert [call(i) for i in range(len(caches) - 1)] == [first] * (len(caches) - 1)
    _EagerWindowGraph.closed = 0
    assert call(len(caches) - 1) == first  # a fifth problem: the first one's graph closed
    assert _EagerWindowGraph.closed == 1
    assert call(1) == [("capture", None), ("replay", 0), ("replay", 2), ("replay", 4)]  # kept: its first window's
    assert call(0) == first  # evicted: afresh
    _EagerWindowGraph.closed = 0
    emulator.release_graph_memory()  # closes every kept graph: the next call of a problem starts afresh
    assert _EagerWindowGraph.closed == 4 + 1  # the four problems' middle windows and the second one's first
    assert call(1) == first


def test_a_kept_problem_whose_capture_fails_starts_afresh(monkeypatch):
    """A capture that fails in a later call of a kept problem (for another reason than a graph to compile) warns,
    runs that call's windows eagerly with the CPU path's bits and drops the problem's graphs; the next call
    captures again."""
    import mjolnir_numerics.emulator as emulator

    q, cache, kw, want = _six_tile_windows_case(monkeypatch)
    refuse = []

    class RefusesOnDemand(_EagerWindowGraph):
        def __init__(self, *args):
            if refuse:
                raise RuntimeError("operation not permitted when stream is capturing")
            super().__init__(*args)

    monkeypatch.setattr(emulator, "_WindowGraph", RefusesOnDemand)
    logs = []
    for refusing in (False, True, False):
        refuse[:] = [1] if refusing else []
        _EagerWindowGraph.log, _EagerWindowGraph.closed = [], 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert _digest(*emulate_decode(q, cache, **kw, target="h200")) == want
        assert any("capturing a window" in str(w.message) for w in caught) == refusing
        logs.append((_EagerWindowGraph.log, _EagerWindowGraph.closed))
    first = [("capture", None), ("replay", 2), ("replay", 4)]
    # the second call's capture of the first window fails: its windows run eagerly, the kept graph is closed;
    # the third call is a first call again
    assert logs == [(first, 0), ([], 1), (first, 0)], logs


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.gpu
@pytest.mark.parametrize("q_path", ["e4m3", "bf16"])
def test_cuda_kept_window_graphs_read_each_calls_own_inputs(q_path, monkeypatch):
    """:func:`test_kept_window_graphs_read_each_calls_own_inputs` with CUDA graphs: three calls of one problem
    with other inputs give the CPU's bits for theirs; the third captures nothing and replays windows 0, 2, 4."""
    import mjolnir_numerics.emulator as emulator
    from benchmarks.bench_emulator import random_e4m3_cache

    calls = _kept_graphs_problem(q_path)
    cache_c = random_e4m3_cache(3, 800, 2, 128, 16, "cpu")
    want = [_run_kept_graphs_call(cache_c, c) for c in calls]
    log = []

    class Spy(emulator._WindowGraph):
        def __init__(self, *args):
            super().__init__(*args)
            log.append("capture")

        def replay(self, s0, *state):
            log.append(s0)
            return super().replay(s0, *state)

    monkeypatch.setattr(emulator, "_window", lambda *args: 2)
    monkeypatch.setattr(emulator, "_WindowGraph", Spy)
    monkeypatch.setattr(emulator, "_REPLAYS", {})  # no window graphs kept from another test
    cache_g = random_e4m3_cache(3, 800, 2, 128, 16, "cuda")
    for i, (c, (o_c, l_c)) in enumerate(zip(calls, want)):
        log.clear()
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="emulate_decode: capturing")  # a failed capture fails the test
            o_g, l_g = _run_kept_graphs_call(cache_g, c)
        assert _equal(o_c, o_g) and _equal(l_c, l_g), f"call {i + 1}: bits differ from the CPU's"
    assert log == [0, 2, 4], log


def test_a_capture_that_fails_otherwise_warns_and_runs_eagerly(monkeypatch):
    """A capture that fails for a reason other than a graph to compile warns, and the call's windows run
    eagerly, with the CPU path's bits."""
    import mjolnir_numerics.emulator as emulator

    q, cache, kw, want = _six_tile_windows_case(monkeypatch)

    class Refuses(_EagerWindowGraph):
        def __init__(self, *args):
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(emulator, "_WindowGraph", Refuses)
    with pytest.warns(RuntimeWarning, match="capturing a window as a CUDA graph failed"):
        got = emulate_decode(q, cache, **kw, target="h200")
    assert _digest(*got) == want


def test_replayed_windows_read_no_poisoned_page(monkeypatch):
    """A captured window skips the zeroing of keys past a sequence's end, so it is replayed only for windows
    whose keys all lie inside their sequences: NaN in every unused page and sequences whose last tile is
    partial give the CPU path's bits; every window replayed was inside, and some were replayed."""
    import mjolnir_numerics.emulator as emulator

    x = dataclasses.replace(get_case("varlen"), seq_lens=(1536, 1000, 1280)).build()
    cache = x.cache
    _poison_unused_pages(cache)
    kw = dict(q_descale=x.q_descale, target="h200", chunk_tiles=12)
    want = emulate_decode(x.q, cache, **kw)
    _take_the_cuda_code_path(monkeypatch, 1)
    monkeypatch.setattr(emulator, "_window_graphs_available", lambda device: True)
    monkeypatch.setattr(emulator, "_WindowGraph", _EagerWindowGraph)
    _EagerWindowGraph.replays, _EagerWindowGraph.closed = [], 0
    replayed = []  # the tiles each replay's sources read, with whether they claimed to be inside
    replay = _EagerWindowGraph.replay
    tile_source = emulator._TileSource
    reading = []

    def spy_replay(self, s0, *state):
        reading.append(s0)
        try:
            return replay(self, s0, *state)
        finally:
            reading.pop()

    def spy_source(cache, which, seqs, tiles, seq_lens, bt, inside=False):
        if reading:
            keys_inside = bool(((tiles + 1) * emulator.TILE_KEYS <= seq_lens[seqs]).all())
            replayed.append((reading[-1], inside, keys_inside))
        return tile_source(cache, which, seqs, tiles, seq_lens, bt, inside)

    monkeypatch.setattr(_EagerWindowGraph, "replay", spy_replay)
    monkeypatch.setattr(emulator, "_TileSource", spy_source)
    got = emulate_decode(x.q, cache, **kw)
    assert _equal(got[0], want[0]) and _equal(got[1], want[1]) and not torch.isnan(got[0].float()).any()
    # 1000 keys: tiles 0-6 of every sequence inside, tile 7 of the second not; window 1 eager, 2-6 replayed
    assert _EagerWindowGraph.replays == [5]
    assert sorted({r[0] for r in replayed}) == [2, 3, 4, 5, 6]
    assert all(inside and keys_inside for _, inside, keys_inside in replayed), replayed


@pytest.mark.parametrize("window", [1, 3, 6])
@pytest.mark.parametrize("key", sorted(k for k in PINNED_HW_DIGESTS if k.endswith("/h200")) + ["random_bf16/thor"])
def test_cuda_code_paths_give_the_pinned_bits_on_the_cpu(key, window, monkeypatch):
    """What the emulator does differently on CUDA, run here: several tiles per window (steps 3-7 batched,
    chunks that end inside a window masked), the MMA chains as the fused formula (evaluated eagerly here;
    the H200 run compiles it), the stages' branch-free forms (no shortcut that asks the device), and a 4-bit
    cache's pages looked up in one pass (``cache._code_pairs``)."""
    import mjolnir_numerics.cache as cache_module

    _take_the_cuda_code_path(monkeypatch, window)
    name, target = key.split("/")
    if name.startswith("random_"):
        q, cache, kw = _random_pinned_inputs(e4m3_q=name == "random_e4m3")
    else:
        x = get_case(name).build()
        q, cache, kw = x.q, x.cache, x.emulator_kwargs()
    stand_in = FusedOnTheCpu()  # after the cache is written: its writes take the CPU's path
    monkeypatch.setattr(cache_module, "fused", stand_in)
    got = emulate_decode(q, cache, **kw, target=target)
    assert _digest(*got) == PINNED_HW_DIGESTS[key], f"{key}: O / LSE bits differ from the CPU path's"
    assert bool(stand_in.taken) == (cache.fmt.bits == 4), stand_in.taken


@pytest.mark.parametrize("fmt", ["e4m3", "nvfp4"])
def test_the_fused_pv_operand_has_its_keys_contiguous(fmt, monkeypatch):
    """The P.V chain reduces over keys: the CUDA path hands it V with the keys contiguous, the values of the
    gathered tile widened in place (whose keys are strided)."""
    import mjolnir_numerics.emulator as emulator
    from mjolnir_numerics.arithmetic import MMA_MODELS, in_walk_order, kstep_groups

    monkeypatch.setattr(emulator, "fused_chain_available", lambda device: True)
    x = dataclasses.replace(get_case("varlen"), fmt=fmt, seq_lens=(300, 129)).build()
    seqs, tiles = torch.tensor([0, 0, 1]), torch.tensor([0, 2, 1])
    src = emulator._TileSource(x.cache, "v", seqs, tiles, x.cache.seq_lens, x.cache.block_table)
    mma = (MMA_MODELS["sm90_f16"], *kstep_groups("mma_sync_sm90", fmt, "e4m3", 128))
    v = emulator._fused_pv_operand(src, mma)
    strided = in_walk_order(src.operand().transpose(-1, -2).float(), mma[2])
    assert v.is_contiguous() and not strided.is_contiguous() and v.shape == (3, 2, 128, 8, 16)
    assert torch.equal(v, strided) and v.dtype == torch.float32
    # a walk that reorders P.V's keys is refused (the tile update pairs P's keys in storage order)
    shuffled = (mma[0], mma[1], mma[2].flip(-1), *mma[3:])
    with pytest.raises(NotImplementedError, match="walks that add consecutive keys; this walk reorders them"):
        emulator._fused_pv_operand(src, shuffled)


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "nvfp4"])
@pytest.mark.parametrize("q_path", ["e4m3", "bf16", "fp32_q_fp32_p"])
def test_prefix_shared_pages_give_the_bits_of_private_copies(fmt, q_path, monkeypatch):
    """A prefix cache (every sequence's block table points at the same pages, lengths L0+1 .. L0+n, as the
    end-to-end study builds it) against the same prefixes each on its own pages: the emulator decodes
    shared tiles once and runs each GEMM once per distinct tile over the stacked rows of the chunks
    reading it (the CPU's shared-tile path), and must give the same bits. ``fp32_q_fp32_p``: float32 Q
    and P, wide operands whose float64 GEMMs are inexact, so that the verified rounding and its exact
    fallback run on the stacked GEMMs too (counted)."""
    gen = torch.Generator().manual_seed(3)
    n, total, h_k, d = 12, 300, 2, 64
    k = torch.randn(total, h_k, d, generator=gen) * 2
    v = torch.randn(total, h_k, d, generator=gen)
    lens = list(range(total - n + 1, total + 1))
    top = 6.0 * 448.0 if fmt == "nvfp4" else FORMATS[fmt].max_normal  # the descale (NVFP4: g) from the amax
    kd, vd = k.abs().amax((0, 2)) / top, v.abs().amax((0, 2)) / top
    opts = dict(page_size=64, granularity="per_head", shuffle=False, poison=False, spare_pages=0)
    full = PagedKVCache.from_float([k], [v], fmt, k_descale=kd, v_descale=vd, **opts)
    shared = dataclasses.replace(
        full,
        block_table=full.block_table[:1].expand(n, -1).contiguous(),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
    )
    private = PagedKVCache.from_float(
        [k[:m] for m in lens], [v[:m] for m in lens], fmt, k_descale=kd, v_descale=vd, **opts
    )
    q = torch.randn(n, 3 * h_k, d, generator=gen)
    knobs = None
    if q_path == "e4m3":
        qd = q.abs().amax() / 448
        q_in, q_descale = (q / qd).to(torch.float8_e4m3fn), qd.expand(n, h_k).contiguous()
    elif q_path == "bf16":
        q_in, q_descale = q.to(torch.bfloat16), None
    else:
        q_in, q_descale, knobs = q, None, EmulatorKnobs(p_format="fp32")
    from mjolnir_numerics import emulator_stages as stages

    calls = []
    exact_dot = stages.exact_dot_f32
    monkeypatch.setattr(stages, "exact_dot_f32", lambda *a: calls.append(a[0].shape[0]) or exact_dot(*a))
    a = emulate_decode(q_in, shared, q_descale=q_descale, knobs=knobs, allow_unsupported=True)
    n_shared = sum(calls)
    b = emulate_decode(q_in, private, q_descale=q_descale, knobs=knobs, allow_unsupported=True)
    assert _equal(a[0], b[0]) and _equal(a[1], b[1])
    if q_path == "fp32_q_fp32_p":
        assert n_shared > 0, "the exact fallback never ran on the shared path"


@pytest.mark.parametrize("n, n_pages", [(1, 50), (2, 300), (8, 20), (8, 5000), (2, 1)])
def test_unique_rows_is_torch_unique_of_the_rows(n, n_pages):
    """The 1-D key path (and the fallback where the keys would overflow) gives torch.unique(dim=0)'s rows,
    order and inverse: page lists with -1 (past the end) and many repeats."""
    from mjolnir_numerics.emulator import _unique_rows

    rows = torch.randint(-1, n_pages, (300, n), generator=torch.Generator().manual_seed(n * n_pages))
    rows[150:] = rows[:150].flip(0)
    rows[0] = -1
    rows[1] = n_pages - 1
    want_u, want_i = torch.unique(rows, dim=0, return_inverse=True)
    got_u, got_i = _unique_rows(rows)
    assert torch.equal(got_u, want_u) and torch.equal(got_i, want_i)


def test_host_data_is_refused_inside_a_capture(monkeypatch):
    """A host list copied to the device inside a CUDA graph capture would be read again from its pinned buffer
    at every replay (reused by then): ``_host_tensor`` refuses it, so the capture fails and the eager windows
    run instead."""
    import mjolnir_numerics.emulator as emulator

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="inside a CUDA graph capture"):
        emulator._host_tensor([1, 2], torch.long, torch.device("cuda"))
    assert emulator._host_tensor([1, 2], torch.long, torch.device("cpu")).tolist() == [1, 2]


@pytest.mark.parametrize("failed", [True, False])
def test_a_refused_capture_end_leaves_the_allocator_out_of_capture(failed, monkeypatch):
    """Where CUDA refuses ``capture_end`` (an invalidated capture), torch raises before ending the allocator's
    side of the capture: ``_end_capture`` ends it by hand (the pool would stay the thread's allocation target
    for the process) and drops the device's pool, then raises the refusal unless the caller already has an
    error to report."""
    import mjolnir_numerics.emulator as emulator

    calls = []
    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", lambda i, p: calls.append(("end", i, p)))
    monkeypatch.setattr(torch._C, "_cuda_releasePool", lambda i, p: calls.append(("release", i, p)))

    class Refused:
        def capture_end(self):
            raise RuntimeError("operation failed due to a previous error during capture")

    class Ended:
        def capture_end(self):
            calls.append("ended")

    pool = type("Pool", (), {"id": (0, 7)})()
    monkeypatch.setattr(emulator, "_GRAPH_POOLS", {3: (pool, None)})
    emulator._end_capture(Ended(), pool, 3, failed=False)
    assert calls == ["ended"] and 3 in emulator._GRAPH_POOLS
    calls.clear()
    if failed:
        emulator._end_capture(Refused(), pool, 3, failed=True)
    else:
        with pytest.raises(RuntimeError, match="previous error"):
            emulator._end_capture(Refused(), pool, 3, failed=False)
    assert calls == [("end", 3, (0, 7)), ("release", 3, (0, 7))]
    assert 3 not in emulator._GRAPH_POOLS  # the next capture opens a new pool


class _GraphPoolModel:
    """What torch 2.11's allocators do with a pool's graphs, enough to test the plumbing on the CPU: a capture
    into a pool id counts it up (making it at its first capture), a freed graph counts it down, and a capture
    that reopens a pool whose count fell to zero fails the pinned-host allocator's assert (the device
    allocator's count, which a MemPool holds, is not modelled: it never reached zero)."""

    def __init__(self, monkeypatch, emulator):
        self.counts, self.pools, model = {}, 0, self

        class Graph:
            def capture_begin(self, pool, capture_error_mode):
                if model.counts.get(pool, 1) == 0:
                    raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED")
                model.counts[pool] = model.counts.get(pool, 0) + 1
                self.pool = pool

            def reset(self):
                model.counts[self.pool] -= 1

        def mem_pool():
            model.pools += 1
            return type("MemPool", (), {"id": (0, model.pools)})()

        def capture(graph, pool, fn, device):
            graph.capture_begin(pool=pool.id, capture_error_mode="thread_local")

        self.graph = Graph
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "MemPool", mem_pool)
        monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
        monkeypatch.setattr(emulator, "_capture", capture)
        monkeypatch.setattr(emulator, "_GRAPH_POOLS", {})


def test_graph_pools_are_one_per_device_until_released(monkeypatch):
    """The CUDA graphs' memory pool: made once per device and reused by every later capture (no new pool, so no
    new cudaMalloc, per call), until ``release_graph_memory`` lets it go."""
    import mjolnir_numerics.emulator as emulator

    model = _GraphPoolModel(monkeypatch, emulator)
    a = emulator._graph_pool(torch.device("cuda", 0))
    assert emulator._graph_pool(torch.device("cuda", 0)) is a and model.pools == 1
    b = emulator._graph_pool(torch.device("cuda", 1))
    assert b is not a and model.pools == 2
    emulator.release_graph_memory()
    assert emulator._graph_pool(torch.device("cuda", 0)) is not a and model.pools == 3
    import mjolnir_numerics

    assert mjolnir_numerics.release_graph_memory is emulator.release_graph_memory  # the public name users call


def test_a_graph_pool_stays_open_between_calls(monkeypatch):
    """Each call captures its graph into the device's pool and frees it at its end; the next call's capture
    reopens the pool. With only the MemPool held, the second capture fails the pinned-host allocator's assert
    (the H100 runs of 2026-12-06: every capture after a call's first); the pool's own graph keeps it open."""
    import mjolnir_numerics.emulator as emulator

    model = _GraphPoolModel(monkeypatch, emulator)
    bare = torch.cuda.MemPool()  # the pool alone: what failed on the H100
    for i in range(2):
        graph = model.graph()
        if i == 0:
            emulator._capture(graph, bare, None, None)
            graph.reset()
        else:
            with pytest.raises(RuntimeError, match="use_count > 0"):
                emulator._capture(graph, bare, None, None)
    for _ in range(3):  # three calls, each capturing one graph and freeing it
        pool = emulator._graph_pool(torch.device("cuda", 0))
        graph = model.graph()
        emulator._capture(graph, pool, None, None)
        graph.reset()
        assert model.counts[pool.id] == 1  # the pool's own graph
    assert model.pools == 2  # one pool for the three calls


@pytest.mark.parametrize("began", [True, False])
def test_a_failed_capture_begin_ends_the_allocators_capture(began, monkeypatch):
    """``capture_begin`` may fail after it began the device allocator's capture into the pool (the pinned-host
    allocator's assert) or before: the capture is abandoned either way (the device allocator's side ended
    where it began, its count released only then), the error propagates and the device's pool is dropped."""
    import mjolnir_numerics.emulator as emulator

    calls = []

    def end(i, p):
        if not began:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        calls.append(("end", i, p))

    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end)
    monkeypatch.setattr(torch._C, "_cuda_releasePool", lambda i, p: calls.append(("release", i, p)))
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("S", (), {"wait_stream": lambda self, s: 0})())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(emulator, "_CAPTURE_STREAMS", {5: type("S", (), {"wait_stream": lambda self, s: 0})()})

    class Fails:
        def capture_begin(self, pool, capture_error_mode):
            raise RuntimeError("it->second->use_count > 0 INTERNAL ASSERT FAILED")

    pool = type("Pool", (), {"id": (0, 9)})()
    monkeypatch.setattr(emulator, "_GRAPH_POOLS", {5: (pool, None)})
    ran = []
    with pytest.raises(RuntimeError, match="use_count"):
        emulator._capture(Fails(), pool, lambda: ran.append(1), torch.device("cuda", 5))
    assert not ran
    assert calls == ([("end", 5, (0, 9)), ("release", 5, (0, 9))] if began else [])
    assert 5 not in emulator._GRAPH_POOLS
