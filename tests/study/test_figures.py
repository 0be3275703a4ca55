"""Figures people can trust: every point inside the axes, no bars on log axes, intervals drawn."""

import math

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402

from mjolnir_study.report import plot_attribution, plot_e2e  # noqa: E402
from mjolnir_study.study import COLUMNS  # noqa: E402

SOURCES = ("k_quantization", "v_quantization", "q_quantization", "p_rounding", "split_merging", "total")


def _attribution_rows():
    rows = []
    for kind, scale in (("a/L1", 0.01), ("b/L1", 1.0)):  # panel b's values are 100x panel a's
        for fmt in ("e4m3", "e2m1"):
            for i, src in enumerate(SOURCES):
                value = 0.0 if src == "split_merging" and fmt == "e4m3" else scale * (i + 1) * 0.05
                rows.append({"part": "attribution", "data": kind, "fmt": fmt, "error_source": src, "rel_l2": value})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_attribution_points_all_inside_shared_axes_and_no_bars():
    fig = plot_attribution(_attribution_rows())
    for ax in fig.axes:
        if not ax.get_visible() or not ax.lines:
            continue
        lo, hi = ax.get_ylim()
        assert not any(isinstance(c, BarContainer) for c in ax.containers)
        for line in ax.lines:
            for y in line.get_ydata():
                assert lo < y < hi, (ax.get_title(), y, (lo, hi))
    # the exact zero is drawn, hollow, on the floor line
    hollow = [ln for ax in fig.axes for ln in ax.lines if ln.get_markerfacecolor() == "none"]
    assert hollow


def test_e2e_draws_the_intervals():
    rows = []
    for fmt, kl, top1 in (("e4m3", 0.01, 0.95), ("e2m1", 0.3, 0.66)):
        rows.append({"part": "end_to_end", "fmt": fmt, "recipe": "amax", "granularity": "per_head", "q_dtype": "e4m3",
                     "kl": kl, "kl_lo": kl * 0.8, "kl_hi": kl * 1.25, "top1": top1, "top1_lo": top1 - 0.03,
                     "top1_hi": top1 + 0.02})  # fmt: skip
    fig = plot_e2e(pd.DataFrame(rows, columns=list(COLUMNS)))
    kl_ax = fig.axes[0]
    assert kl_ax.get_xscale() == "log" and not any(isinstance(c, BarContainer) for c in kl_ax.containers)
    bars = [c for c in kl_ax.containers if c.__class__.__name__ == "ErrorbarContainer"]
    assert bars, "no error bars on the KL panel"
    lo, hi = kl_ax.get_xlim()
    assert lo < 0.008 and hi > 0.375 and not math.isnan(lo)
