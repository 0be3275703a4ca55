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


def _grid_rows():
    from mjolnir_study.report import plot_granularity, plot_nvfp4_recipes  # noqa: F401

    rows = []
    for i, kind in enumerate(("gaussian", "outlier_keys")):
        for fmt in ("e4m3", "e2m1"):
            for j, gran in enumerate(("per_tensor", "per_head", "per_seq_head")):
                v = 0.05 * (1 + i) * (1 + 4 * (fmt == "e2m1")) * (1 + 0.1 * j)
                rows.append({"part": "grid", "kind": kind, "fmt": fmt, "granularity": gran, "q_dtype": "e4m3",
                             "rel_l2": v, "rel_l2_lo": 0.9 * v, "rel_l2_hi": 1.1 * v})  # fmt: skip
        for rec in ("amax", "four_over_six", "no_scale_floor"):
            v = 0.15 * (1 + i)  # amax and no_scale_floor equal: drawn apart all the same
            rows.append({"part": "nvfp4_recipe", "kind": kind, "fmt": "nvfp4", "recipe": rec, "rel_l2": v,
                         "rel_l2_lo": 0.9 * v, "rel_l2_hi": 1.1 * v})  # fmt: skip
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _errorbars(ax):
    return [c for c in ax.containers if c.__class__.__name__ == "ErrorbarContainer"]


def test_granularity_is_points_with_intervals_not_log_bars():
    from mjolnir_study.report import plot_granularity

    fig = plot_granularity(_grid_rows())
    for ax in fig.axes:
        assert ax.get_yscale() == "log" and not any(isinstance(c, BarContainer) for c in ax.containers)
        assert len(_errorbars(ax)) == 3  # one per granularity, each with its intervals


def test_nvfp4_recipes_are_told_apart_and_carry_intervals():
    from mjolnir_study.report import plot_nvfp4_recipes

    ax = plot_nvfp4_recipes(_grid_rows()).axes[0]
    bars = _errorbars(ax)
    assert len(bars) == 3 and len({b.lines[0].get_marker() for b in bars}) == 3
    xs = [tuple(b.lines[0].get_xdata()) for b in bars]
    assert len(set(xs)) == 3  # equal values, different positions: no recipe hides another
