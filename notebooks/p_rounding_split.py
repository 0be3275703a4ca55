# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # P rounding and split merging
#
# Two error sources of the kernel that are not the KV format: P, the softmax probabilities fed to the
# second GEMM (the Thor kernel: `e4m3(p * 448)`; FlashAttention 3/4: `e4m3(p * 256)`; the bf16 path:
# `bf16(p)`), and the merging of split-KV partial results. Then the full attribution: each error source
# (K, V, Q, P, split merging) switched on alone.

# %% tags=["parameters"]
import os

SIZE = os.environ.get("MJOLNIR_NOTEBOOK_SIZE", "small")  # "small" (CI) or "full"
SEED = 0
SPLIT_SEQ_LEN = {"small": 1024, "full": 8192}[SIZE]
SPLITS = (1, 2, 4, 8, 16)

# %%
import pandas as pd

from mjolnir_study.figures import save_figure
from mjolnir_study.report import SOURCE_ORDER, plot_attribution, plot_p_rounding
from mjolnir_study.study import StudyConfig, run_study, split_merging_errors, to_frame

config = StudyConfig.parts_only(["p_rounding", "attribution"], "quick" if SIZE == "small" else "default", seed=SEED)
result = run_study(config, progress=False)
df = to_frame(result.rows)
print(f"{len(df)} rows in {result.info['seconds']:.0f} s")

# %% [markdown]
# ## P rounding alone
# Error of O with each P variant against the same run with fp32 P (same quantized cache and Q).

# %%
fig = plot_p_rounding(df)
save_figure(fig, "nb_p_rounding")
p = df[(df.part == "p_rounding") & (df.error_source == "p_rounding")]
p.pivot_table(index="p_variant", columns=["kind", "seq_len"], values="rel_l2")

# %%
# claims: bf16 P (8 significant bits) rounds less than e4m3 P (4); fp32 P is the baseline (error 0)
t = p.pivot_table(index="p_variant", columns=["kind", "seq_len"], values="rel_l2")
assert (t.loc["fp32"] == 0).all()
assert (t.loc["bf16"] < t.loc["e4m3_x448"]).all()
# P rounding is a small part of the total error of an e4m3 cache
tot = df[(df.part == "p_rounding") & (df.error_source == "total")].pivot_table(
    index="p_variant", columns=["kind", "seq_len"], values="rel_l2")
assert (t.loc["e4m3_x448"] < tot.loc["e4m3_x448"]).all()

# %% [markdown]
# ## Split merging
# The same decode cut into n chunks (the plan's split-KV) vs not cut: only the fp32 merge of partial
# (m, l, O) differs.

# %%
split = pd.DataFrame(split_merging_errors("gaussian", SPLIT_SEQ_LEN, SPLITS, seed=SEED))
split

# %% [markdown]
# A split run differs from the unsplit one by about as much as P rounding itself: each chunk rounds
# `e4m3(p * 448)` against its own running max, not the sequence's. With fp32 P the merge is exact at
# the bf16 output, and splitting does not change the error against the reference.

# %%
# claims: one chunk is the unsplit kernel bit for bit; the merge arithmetic is rounding-level (fp32 P);
# a split neither helps nor hurts accuracy vs the reference (within 10%)
s = split.set_index("splits")
assert s.loc[1, "bit_identical"]
assert (split.rel_l2_vs_unsplit_fp32_p < 1e-3).all()
assert (abs(split.rel_l2_vs_reference / s.loc[1, "rel_l2_vs_reference"] - 1) < 0.1).all()

# %% [markdown]
# ## Attribution: each source alone

# %%
fig = plot_attribution(df)
save_figure(fig, "nb_attribution")
a = df[df.part == "attribution"].pivot_table(index=["data", "fmt"], columns="error_source", values="rel_l2")
a = a[[s for s in SOURCE_ORDER if s in a.columns]]
a

# %%
# claims: for 4-bit formats the KV quantization dominates P rounding; split merging is a P-rounding-sized
# effect (see above), never larger than the total
for (data, fmt), row in a.iterrows():
    assert row["split_merging"] < row["total"], (data, fmt)
    assert row["split_merging"] <= 2 * row["p_rounding"] + 1e-6, (data, fmt)
    if fmt in ("e2m1", "nvfp4"):
        assert max(row["k_quantization"], row["v_quantization"]) > row["p_rounding"], (data, fmt)
