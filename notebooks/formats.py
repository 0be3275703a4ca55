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
# # KV formats: value grids and element quantization error
#
# Every KV format the decode kernel reads, as data (`mjolnir_numerics.formats`), and what rounding to
# each one costs on i.i.d. data scaled per tensor (descale = amax / max). NVFP4 uses its own two-level
# recipe (fp32 global scale, e4m3 scale per 16 values). The logic lives in the packages; this notebook
# holds parameters, calls, assertions and figures.

# %% tags=["parameters"]
import os

SIZE = os.environ.get("MJOLNIR_NOTEBOOK_SIZE", "small")  # "small" (CI) or "full" (committed outputs)
N_VALUES = {"small": 1 << 14, "full": 1 << 20}[SIZE]  # values drawn per distribution
SEED = 0

# %%
import pandas as pd

from mjolnir_numerics.formats import FORMATS
from mjolnir_study.figures import save_figure
from mjolnir_study.report import plot_quantization_error, plot_value_grids
from mjolnir_study.study import format_errors

# %% [markdown]
# ## The formats

# %%
props = pd.DataFrame(
    [
        {
            "format": f.name,
            "bits/value": f.bits_per_value,
            "max": f.max_normal,
            "min subnormal": getattr(f, "min_subnormal", getattr(getattr(f, "element", None), "min_subnormal", None)),
            "distinct finite values": len(f.finite_values) if hasattr(f, "finite_values") else None,
        }
        for f in FORMATS.values()
    ]
)
props

# %%
# claims: the registry holds the five kernel formats with their OCP ranges; NVFP4 pays 0.5 bit for its scales
p = props.set_index("format")
assert p.loc["e4m3", "max"] == 448 and p.loc["e3m2", "max"] == 28 and p.loc["e2m3", "max"] == 7.5
assert p.loc["e2m1", "max"] == 6 and p.loc["nvfp4", "bits/value"] == 4.5
assert p.loc["e4m3", "distinct finite values"] == 253  # 254 non-NaN codes, +0 and -0 collapse
assert p.loc["e3m2", "distinct finite values"] == p.loc["e2m3", "distinct finite values"] == 63

# %% [markdown]
# ## Value grids
# e3m2 spans 2^-4 .. 28 (range), e2m3 spans 2^-3 .. 7.5 with twice as many steps per octave (precision).

# %%
fig = plot_value_grids()
save_figure(fig, "nb_formats_value_grids")

# %% [markdown]
# ## Quantization error per format and distribution

# %%
errors = pd.DataFrame(format_errors(n=N_VALUES, seed=SEED))
errors.pivot_table(index="fmt", columns="distribution", values="rel_rms").round(4)

# %%
fig = plot_quantization_error(errors)
save_figure(fig, "nb_formats_quantization_error")

# %%
# claims: more mantissa bits -> less error at the same storage; block scales rescue 4-bit values
g = errors[errors.distribution == "gaussian"].set_index("fmt").rel_rms
assert g["e4m3"] < g["e3m2"] and g["e2m3"] < g["e3m2"] < g["e2m1"]
assert g["nvfp4"] < 0.8 * g["e2m1"]
# heavy tails (a 10x outlier every 1000 values) stretch a per-tensor scale: e2m1 flushes most values to 0
h = errors[errors.distribution == "heavy_tail"].set_index("fmt")
assert h.loc["e2m1", "zero_fraction"] > 0.3 and h.loc["e4m3", "zero_fraction"] < 0.01
