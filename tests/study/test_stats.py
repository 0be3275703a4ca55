"""The study's confidence intervals (``mjolnir_study.stats``) and the verdicts computed from them."""

import math

import pandas as pd
import pytest
import torch

from mjolnir_study import stats
from mjolnir_study.real_model import E2ERow
from mjolnir_study.report import anchor_findings
from mjolnir_study.study import COLUMNS, E2E_CI_COLUMNS, e2e_intervals


def test_block_indices_are_runs_of_consecutive_tokens_and_deterministic():
    idx = stats.block_indices(256, block=16, n_boot=50, seed=3)
    assert idx.shape == (50, 256) and int(idx.min()) >= 0 and int(idx.max()) <= 255
    runs = idx.view(50, 16, 16)
    assert bool((runs[..., 1:] - runs[..., :-1] == 1).all())
    assert torch.equal(idx, stats.block_indices(256, block=16, n_boot=50, seed=3))
    assert not torch.equal(idx, stats.block_indices(256, block=16, n_boot=50, seed=4))
    assert stats.block_indices(15, block=16, n_boot=4).shape == (4, 15)  # short: single tokens, still varies
    assert len({tuple(r.tolist()) for r in stats.block_indices(15, block=16, n_boot=20)}) > 1


def test_mean_interval_covers_the_mean_at_the_expected_width():
    x = torch.randn(4000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lo, hi = stats.mean_ci(x, block=1)
    assert lo < float(x.mean()) < hi
    assert 0.6 * 2 * 1.96 / math.sqrt(4000) < hi - lo < 1.4 * 2 * 1.96 / math.sqrt(4000)
    lo8, hi8 = stats.mean_ci(x[:250], block=1)
    assert hi8 - lo8 > 3 * (hi - lo)  # 16x fewer tokens: about 4x wider


def test_blocks_widen_the_interval_of_correlated_tokens():
    base = torch.randn(100, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x = base.repeat_interleave(16)  # runs of 16 equal values: 100 independent values, not 1600
    w1 = -math.fsum(stats.mean_ci(x, block=1) * torch.tensor([1.0, -1.0]).numpy())
    w16 = -math.fsum(stats.mean_ci(x, block=16) * torch.tensor([1.0, -1.0]).numpy())
    assert w16 > 2.5 * w1


def test_paired_intervals_see_the_pairing():
    x = torch.rand(512, generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 0.5
    assert stats.paired_ci(x, x + 0.25) == pytest.approx((0.25, 0.25))
    assert stats.paired_ci(x, 2 * x, ratio=True) == pytest.approx((2.0, 2.0))
    lo, hi = stats.paired_ci(x, x, transform=math.exp, ratio=True)
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.0)
    b = stats.mean_ci(x + 0.25)
    assert b[1] - b[0] > 0.01  # unpaired, each interval has width; the paired difference has none


def test_verdicts_from_intervals():
    assert stats.verdict(0.01, 0.015, 0.02, below=True) == "agrees"
    assert stats.verdict(0.021, 0.03, 0.02, below=True) == "disagrees"
    assert stats.verdict(0.01, 0.03, 0.02, below=True) == "not resolved"
    assert stats.verdict(0.96, 0.99, 0.95, below=False) == "agrees"
    assert stats.verdict(0.90, 0.94, 0.95, below=False) == "disagrees"
    assert stats.verdict(math.nan, math.nan, 0.95, below=False) == "not resolved"
    assert stats.combine("agrees", "agrees") == "agrees"
    assert stats.combine("agrees", "not resolved") == "not resolved"
    assert stats.combine("not resolved", "disagrees") == "disagrees"


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.ones(1), "at least 2"),
        (torch.ones(2, 2), "1-D"),
        (torch.tensor([1.0, math.nan]), "inf or NaN"),
        ([1.0, 2.0], "1-D"),
    ],
)
def test_bad_samples_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        stats.mean_ci(bad)


def test_paired_needs_the_same_tokens_and_a_valid_level():
    with pytest.raises(ValueError, match="the same tokens"):
        stats.paired_ci(torch.ones(4), torch.ones(5))
    with pytest.raises(ValueError, match="level"):
        stats.mean_ci(torch.arange(4.0), level=1.5)


def _row(fmt, kl, agree, nll, q="e4m3"):
    n = len(kl)
    return E2ERow(f"{fmt}/per_head/q={q}", fmt, "per_head", q, "amax", 8.0, sum(kl) / n, max(kl), sum(agree) / n,
                  math.exp(sum(nll) / n), 1.0, n, 0.0, torch.tensor(kl, dtype=torch.float64),
                  torch.tensor(agree, dtype=torch.float64), torch.tensor(nll, dtype=torch.float64))  # fmt: skip


def test_e2e_intervals_pair_each_row_with_the_e4m3_baseline():
    g = torch.Generator().manual_seed(5)
    kl = (torch.rand(200, generator=g, dtype=torch.float64) * 0.02).tolist()
    nll = (torch.rand(200, generator=g, dtype=torch.float64) + 1).tolist()
    rows = [_row("e4m3", kl, [1.0] * 200, nll), _row("e2m1", [3 * k for k in kl], [1.0] * 150 + [0.0] * 50, nll)]
    ci = e2e_intervals(rows, torch.tensor(nll, dtype=torch.float64))
    assert set(ci[0]) == set(E2E_CI_COLUMNS)
    assert math.isnan(ci[0]["vs_e4m3_kl_ratio_lo"]) and ci[0]["kl_lo"] < rows[0].kl < ci[0]["kl_hi"]
    assert ci[1]["vs_e4m3_kl_ratio_lo"] == pytest.approx(3.0) and ci[1]["vs_e4m3_kl_ratio_hi"] == pytest.approx(3.0)
    assert ci[1]["vs_e4m3_top1_diff_hi"] < 0 and ci[0]["ppl_rel_lo"] == pytest.approx(0.0)
    assert all(math.isnan(v) for v in e2e_intervals(rows, None)[0].values())


def test_the_near_lossless_verdict_follows_the_interval():
    """The same point values, a narrow and a wide interval: agrees, then not resolved."""
    base = {"part": "end_to_end", "fmt": "e4m3", "q_dtype": "e4m3", "granularity": "per_head", "recipe": "amax",
            "kl": 0.01, "top1": 0.97, "ppl": 10.1, "ppl_ref": 10.0}  # fmt: skip
    narrow = dict(base, kl_lo=0.008, kl_hi=0.012, top1_lo=0.96, top1_hi=0.98, ppl_rel_lo=0.005, ppl_rel_hi=0.015)
    wide = dict(narrow, kl_lo=0.002, kl_hi=0.03)

    def first(row):
        return anchor_findings(pd.DataFrame([row], columns=list(COLUMNS)))[0]["verdict"]

    assert first(narrow) == "agrees"
    assert first(wide) == "not resolved"
    assert first(dict(narrow, top1_lo=0.90, top1_hi=0.93)) == "disagrees"


def test_ratio_of_sums_interval_covers_the_ratio_and_pairs():
    from mjolnir_study.stats import paired_ratio_of_sums_ci, ratio_of_sums_ci

    gen = torch.Generator().manual_seed(4)
    ref = torch.rand(64, generator=gen, dtype=torch.float64) + 0.5
    err = ref * (0.01 + 0.002 * torch.randn(64, generator=gen, dtype=torch.float64)).abs()
    point = math.sqrt(float(err.sum() / ref.sum()))
    lo, hi = ratio_of_sums_ci(err, ref, transform=math.sqrt)
    assert lo < point < hi and hi - lo < 0.5 * point
    assert ratio_of_sums_ci(err, ref, transform=math.sqrt) == (lo, hi)  # deterministic for a seed
    # paired: a second configuration with errors 0.8x the first's on the same units has ratio 0.8 exactly
    # in every resample (the pairing removes the units' own spread)
    plo, phi = paired_ratio_of_sums_ci(err, ref, err * 0.64, ref, transform=math.sqrt)
    assert abs(plo - 0.8) < 1e-12 and abs(phi - 0.8) < 1e-12
    with pytest.raises(ValueError, match="num, den: one value per unit"):
        ratio_of_sums_ci(err, ref[:10])
    with pytest.raises(ValueError, match="den: a resample sums to 0"):
        ratio_of_sums_ci(err, torch.zeros(64, dtype=torch.float64))
    with pytest.raises(ValueError, match="the same units"):
        paired_ratio_of_sums_ci(err, ref, err[:5], ref[:5])
