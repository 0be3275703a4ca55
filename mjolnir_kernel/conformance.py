"""Kernel-vs-spec comparison: named tolerances, ulp distances, and a report per case.

The kernel and ``mjolnir_numerics.emulate_decode`` share every rounding point (the stages of
``mjolnir_numerics.emulator_stages``; docs/numerics.md) except two the spec does not yet reproduce bit for
bit:

* tensor-core summation order: the fp32 sums of S = K.Q and O += V.P are formed in the MMA's own
  order; the spec models them as an exact (float64) sum rounded once to fp32. The kernel's S differs
  from the spec's by a few fp32 ulps;
* ex2.approx.ftz.f32: at most 2 fp32 ulps from the correctly rounded exp2 the spec uses (measured on
  an H200; docs/numerics.md, "Special functions").

Both perturb fp32 values at ~2^-21 relative. Rounding to bf16 (2^-8) hides them except where an fp32
value sits next to a bf16 rounding boundary (1 ulp) or where a perturbed p flips its e4m3 / bf16
code (a quantum of P moves O by at most p * |v| * 2^-3 / l, a few bf16 ulps for the dominant key).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from mjolnir_numerics.cases import DecodeCase

# Named tolerances (see the module docstring for where each comes from).
O_MAX_ULP_BF16 = 4  # tensor-core summation order + ex2.approx, after a possible P-code flip
O_MIN_IDENTICAL_FRACTION = 0.95  # bf16 outputs bit-identical to the spec (boundary cases are rare)
LSE_MAX_ULP_F32 = 64  # log(l) of a sum of ex2.approx terms: relative error of l ~ 2^-21 -> ~8 ulps of |lse| >= 1
LSE_ATOL = 2.0**-16  # |lse| < 1: absolute bound with the same origin
# A P-code flip (the kernel's p and the spec's p land on adjacent P codes because their S differ by a
# few fp32 ulps) moves O[n, :] by dP * V[k, :] * out_scale / l with l >= 1 (the running max key adds
# p = 1). The largest code step below p = 1: e4m3(p * 448) steps by 32 in [256, 448], i.e. 32 / 448 in
# p units; bf16(p) by 2^-8. Elements beyond O_MAX_ULP_BF16 must stay within that step times max |V| times
# scale_o (``p_flip_atol``) and be rare (O_MIN_IDENTICAL_FRACTION still holds for all elements).
P_STEP_E4M3 = 32.0 / 448.0
P_STEP_BF16 = 2.0**-8


def p_flip_atol(v_values_absmax: float, v_descale_max: float, scale_o: float, q_dtype: str) -> float:
    """Absolute bound on |O_kernel - O_spec| from one P-code flip (see P_STEP_E4M3).

    Args:
      v_values_absmax: max |V| in the values the MMA reads (before the descale).
      v_descale_max: the largest V descale; scale_o: the output multiplier; q_dtype: "e4m3" or "bf16".
    """
    step = P_STEP_E4M3 if q_dtype == "e4m3" else P_STEP_BF16
    return float(step * v_values_absmax * v_descale_max * abs(scale_o))


def case_flip_atol(inputs, scale_o: float = 1.0) -> float:
    """:func:`p_flip_atol` for a built case (``mjolnir_numerics.cases.CaseInputs``): its cache's V values on
    the pages its sequences use, its largest V descale, its Q path."""
    cache = inputs.cache
    ps = cache.page_size
    used = [cache.block_table[i, : -(-n // ps)] for i, n in enumerate(cache.seq_lens.tolist()) if n > 0]
    v_abs = float(cache.page_values("v", torch.cat(used)).abs().max()) if used else 0.0
    q_dtype = "e4m3" if inputs.q.dtype == torch.float8_e4m3fn else "bf16"
    return p_flip_atol(v_abs, float(cache.v_descale.max()), scale_o, q_dtype)


def ordinal(x: torch.Tensor) -> torch.Tensor:
    """Monotone integer ordinal of bf16 / fp32 values (adjacent floats differ by 1; +0 == -0)."""
    if x.dtype == torch.bfloat16:
        i = x.view(torch.int16).to(torch.int64)
        return torch.where(i >= 0, i, -(i & 0x7FFF))
    if x.dtype == torch.float32:
        i = x.view(torch.int32).to(torch.int64)
        return torch.where(i >= 0, i, -(i & 0x7FFFFFFF))
    raise ValueError(f"x: expected bfloat16 or float32, got {x.dtype}")


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|ordinal(a) - ordinal(b)|; int64, 0 where both are the same NaN-free value."""
    return (ordinal(a) - ordinal(b)).abs()


@dataclass
class ComparisonReport:
    o_max_ulp: int
    o_identical_fraction: float
    o_flip_outliers: int  # elements beyond O_MAX_ULP_BF16, each within the P-flip bound
    o_max_abs: float
    o_nan_mismatch: int
    lse_max_ulp: int
    lse_max_abs: float
    lse_inf_mismatch: int
    ok: bool

    def summary(self) -> str:
        return (
            f"O: max {self.o_max_ulp} bf16 ulp (allowed {O_MAX_ULP_BF16}; {self.o_flip_outliers} P-flip outliers,"
            f" max abs {self.o_max_abs:.3g}), {100 * self.o_identical_fraction:.2f}% "
            f"bit-identical (need {100 * O_MIN_IDENTICAL_FRACTION:.0f}%), {self.o_nan_mismatch} NaN mismatches; "
            f"LSE: max {self.lse_max_ulp} fp32 ulp / {self.lse_max_abs:.3g} abs, {self.lse_inf_mismatch} inf mismatches"
            f" -> {'ok' if self.ok else 'FAIL'}"
        )


def compare_outputs(
    o: torch.Tensor, lse: torch.Tensor, o_ref: torch.Tensor, lse_ref: torch.Tensor, o_flip_atol: float | None = None
) -> ComparisonReport:
    """Kernel (o, lse) against the spec's, under the named tolerances (all tensors on one device).

    ``o_flip_atol`` (from :func:`p_flip_atol`): O elements beyond O_MAX_ULP_BF16 pass when within it
    (a kernel whose S is summed in another order than the spec's, e.g. warp-level MMA); None: no
    outliers allowed."""
    if o.shape != o_ref.shape or o.dtype != torch.bfloat16 or o_ref.dtype != torch.bfloat16:
        raise ValueError(f"o: expected bf16 {tuple(o_ref.shape)}, got {o.dtype} {tuple(o.shape)}")
    if lse.shape != lse_ref.shape:
        raise ValueError(f"lse: expected {tuple(lse_ref.shape)}, got {tuple(lse.shape)}")
    o_nan = torch.isnan(o.float()) != torch.isnan(o_ref.float())
    both = ~torch.isnan(o.float()) & ~torch.isnan(o_ref.float())
    d = ulp_distance(o, o_ref)[both]
    o_max = int(d.max()) if d.numel() else 0
    ident = float((d == 0).float().mean()) if d.numel() else 1.0
    abs_err = (o.float() - o_ref.float()).abs()[both]
    o_max_abs = float(abs_err.max()) if abs_err.numel() else 0.0
    beyond = d > O_MAX_ULP_BF16
    outliers = int(beyond.sum())
    if o_flip_atol is None:
        o_ulp_ok = outliers == 0
    else:
        o_ulp_ok = bool((abs_err[beyond] <= o_flip_atol).all())
    lse_f, ref_f = lse.float(), lse_ref.float()
    fin = torch.isfinite(lse_f) & torch.isfinite(ref_f)
    inf_mismatch = int(
        ((~torch.isfinite(lse_f)) != (~torch.isfinite(ref_f))).sum() + (lse_f[~fin] != ref_f[~fin]).sum()
    )
    ld = ulp_distance(lse_f[fin], ref_f[fin])
    la = (lse_f[fin] - ref_f[fin]).abs()
    lse_ok = bool(((ld <= LSE_MAX_ULP_F32) | (la <= LSE_ATOL)).all()) if ld.numel() else True
    ok = int(o_nan.sum()) == 0 and o_ulp_ok and ident >= O_MIN_IDENTICAL_FRACTION and inf_mismatch == 0 and lse_ok
    return ComparisonReport(
        o_max_ulp=o_max,
        o_identical_fraction=ident,
        o_flip_outliers=outliers if o_flip_atol is not None else 0,
        o_max_abs=o_max_abs,
        o_nan_mismatch=int(o_nan.sum()),
        lse_max_ulp=int(ld.max()) if ld.numel() else 0,
        lse_max_abs=float(la.max()) if la.numel() else 0.0,
        lse_inf_mismatch=inf_mismatch,
        ok=ok,
    )


def permute_pages(cache, seed: int = 7):
    """A copy of a ``PagedKVCache`` whose pages sit elsewhere in the pools (page p moves to slot inv[p],
    a seeded random permutation), with the block table rewritten to match: the same logical cache, so a
    kernel must give bit-identical output on it (a metamorphic test of the page addressing).

    Returns:
      the permuted cache (new K/V pools and NVFP4 scale pools, block table int32 on the cache's device).
    """
    perm = torch.randperm(cache.num_pages, generator=torch.Generator().manual_seed(seed)).to(cache.device)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    moved = {}
    for f in fields(cache):
        t = getattr(cache, f.name)
        if f.name in ("k_pool", "v_pool", "k_scales", "v_scales") and t is not None:
            buf = torch.empty_like(t.contiguous())
            buf[inv] = t  # page p moves to slot inv[p]
            moved[f.name] = buf
    moved["block_table"] = inv[cache.block_table.long()].to(torch.int32)
    return replace(cache, **moved)


# Kernel-specific cases (candidates for mjolnir_numerics.cases): every layout, descale granularity,
# format on each layout/page size, q_len 2-4 causal / non-causal, forced splits 1..32, page sizes 16..128,
# both head dims, GQA groups 6 and 12.
KERNEL_CASES = (
    DecodeCase("layout_interleaved", (200, 70), layout="interleaved"),
    DecodeCase("layout_flashinfer", (200, 70), layout="flashinfer"),
    DecodeCase("per_tensor_descale", (150, 60), granularity="per_tensor"),
    DecodeCase("bf16_q_per_seq_head_hnd", (150, 60), q_dtype="bf16", granularity="per_seq_head", layout="hnd"),
    DecodeCase("page_size_32", (300, 33), page_size=32),
    DecodeCase("page_size_64_e2m3", (300, 65), page_size=64, fmt="e2m3"),
    DecodeCase("page_size_128_nvfp4", (300, 129), page_size=128, fmt="nvfp4", granularity="per_tensor"),
    DecodeCase("e2m1_hnd_d256", (260,), fmt="e2m1", layout="hnd", heads_q=24, heads_k=4, head_dim=256),
    DecodeCase("q_len4_causal_bf16", (9, 300), q_len=4, q_dtype="bf16"),
    DecodeCase("q_len4_noncausal_e3m2", (9, 300), q_len=4, causal=False, fmt="e3m2"),
    DecodeCase("splits_1", (1000, 300), force_splits=1),
    DecodeCase("splits_3", (1000, 300), force_splits=3),
    DecodeCase("splits_16", (2100, 300), force_splits=16),
    DecodeCase("splits_16_bf16_d256", (2100,), force_splits=16, q_dtype="bf16", head_dim=256, heads_q=24, heads_k=4),
    DecodeCase("seq_len_0_padding", (0, 0, 130, 0), notes="CUDA-graph padding rows"),
    # first written for the Hopper kernel; names kept (the reports cite them)
    DecodeCase("hopper_d256_bf16_24_4", (700, 129), q_dtype="bf16", heads_q=24, heads_k=4, head_dim=256),
    DecodeCase("hopper_32_8_d128_ps64", (1500, 3), heads_q=32, heads_k=8, page_size=64, layout="hnd"),
    DecodeCase("hopper_n_q_above_tile", (300, 290), q_len=3, heads_q=48, heads_k=4, notes="n_q 36: three q tiles"),
    DecodeCase("hopper_q_len2_noncausal_bf16", (140, 5), q_len=2, causal=False, q_dtype="bf16"),
    DecodeCase("hopper_e3m2_d256_splits", (900, 129), fmt="e3m2", heads_q=24, heads_k=4, head_dim=256,
               force_splits=3, notes="fp6 at d = 256 (two P.V chunks per warp on Hopper), three chunks"),
    DecodeCase("hopper_e2m3_per_seq_head", (260, 7), fmt="e2m3", heads_q=32, heads_k=8, page_size=32,
               granularity="per_seq_head", notes="fp6 with per-(sequence, head) descales"),
    DecodeCase("hopper_nvfp4_d256", (600, 129), fmt="nvfp4", heads_q=24, heads_k=4, head_dim=256,
               granularity="per_tensor", force_splits=2,
               notes="NVFP4 at d = 256 (Hopper: converter warps, K then V), two chunks"),
    DecodeCase("hopper_32_splits_three_q_tiles", (4096, 3, 0, 2600), q_len=3, heads_q=48, heads_k=4,
               force_splits=32, notes="n_q 36; 32 and 21 chunks, an empty sequence, a three-key one"),
)  # fmt: skip


# -- the user's conformance check: named cases plus random ones, on the GPU at hand ---------------------
def _check_choices(name: str, values, allowed) -> tuple:
    """``values`` (None: all of ``allowed``) as a tuple, each one of ``allowed``; ValueError naming ``name``."""
    if values is None:
        return tuple(allowed)
    values = tuple(values)
    if not values:
        raise ValueError(f"{name}: expected at least one of {tuple(allowed)}, got none")
    bad = [v for v in values if v not in allowed]
    if bad:
        raise ValueError(f"{name}: {bad[0]!r} is not one of {tuple(allowed)}")
    return values


def random_cases(n: int, seed: int = 0, max_keys: int = 65536, formats=None, head_dims=None) -> tuple[DecodeCase, ...]:
    """``n`` random cases the kernels run (``fuzz_<seed>_<i>``): a random KV format (of ``formats``; None:
    all) and Q dtype the capability rule allows, 1-4 sequences of 0 to ``max_keys`` keys (varlen, often
    short), q_len 1-8 causal or not, every page size, layout and descale granularity, GQA groups 1-8, a head
    dim of ``head_dims`` (None: both), and K/V patterns with sinks, outlier channels and heavy tails; default
    plans (no forced splits). The same arguments give the same cases. ValueError naming the argument for a
    negative ``n``, or an empty ``formats`` / ``head_dims`` or one with a value the kernels do not take."""
    import random

    from mjolnir_numerics.cache import LAYOUTS
    from mjolnir_numerics.capability import HEAD_DIMS, KV_FORMATS, PAGE_SIZES
    from mjolnir_numerics.cases import PATTERNS
    from mjolnir_numerics.scales import GRANULARITIES

    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: expected an int >= 0, got {n!r}")
    formats = _check_choices("formats", formats, KV_FORMATS)
    head_dims = _check_choices("head_dims", head_dims, HEAD_DIMS)
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        fmt = rng.choice(formats)
        q_dtype = rng.choice(("bf16", "e4m3")) if fmt == "e4m3" else "e4m3"
        q_len = rng.choice((1, 1, 1, 2, 3, 4, 8))
        long_cap = max_keys if rng.random() < 0.15 else 3000
        lens = [0 if rng.random() < 0.1 else rng.randint(q_len, max(q_len, long_cap)) for _ in range(rng.randint(1, 4))]
        heads_k = rng.choice((1, 2, 4, 8))
        cases.append(DecodeCase(
            f"fuzz_{seed}_{i}", tuple(lens), heads_q=heads_k * rng.choice((1, 2, 4, 6, 8)), heads_k=heads_k,
            head_dim=rng.choice(head_dims), q_len=q_len, causal=rng.random() < 0.7, fmt=fmt, q_dtype=q_dtype,
            page_size=rng.choice(PAGE_SIZES), layout=rng.choice(LAYOUTS), granularity=rng.choice(GRANULARITIES),
            pattern=rng.choice(PATTERNS), seed=seed * 100003 + i,
        ))  # fmt: skip
    return tuple(cases)


def select_cases(cases, formats=None, head_dims=None) -> tuple:
    """The cases of ``cases`` whose KV format is one of ``formats`` and head dim one of ``head_dims`` (None:
    any); ValueError naming the argument for a format or head dim the kernels do not take."""
    from mjolnir_numerics.capability import HEAD_DIMS, KV_FORMATS

    formats = _check_choices("formats", formats, KV_FORMATS)
    head_dims = _check_choices("head_dims", head_dims, HEAD_DIMS)
    return tuple(c for c in cases if c.fmt in formats and c.head_dim in head_dims)


@dataclass(frozen=True)
class ConformanceRow:
    """One case of :func:`conform`: the comparison, the plans' agreement and the bit-identical fractions."""

    case: str
    report: ComparisonReport
    same_plan: bool
    o_identical: float
    lse_identical: float

    def line(self) -> str:
        plan = "same plan" if self.same_plan else "PLANS DIFFER"
        return (f"{self.case:<34} O {100 * self.o_identical:8.3f} %  LSE {100 * self.lse_identical:8.3f} %  "
                f"max {self.report.o_max_ulp} bf16 ulp, {self.report.lse_max_ulp} fp32 ulp  {plan}  "
                f"{'ok' if self.report.ok else 'FAIL'}")  # fmt: skip


def conform(cases, device: str = "cuda", on_row=None) -> list[ConformanceRow]:
    """Run every case through ``mjolnir_kernel.decode`` and ``mjolnir_numerics.emulate_decode`` with the same
    arguments and default plans on ``device`` (a GPU a kernel runs on), and compare them bit for bit.
    A case whose build or call raises is reported as a failing row (its error in ``case``). ``on_row``: called
    with each row as soon as its case is done (progress)."""
    from mjolnir_numerics.emulator import emulate_decode

    from .api import decode

    rows = []
    for case in cases:
        try:
            x = case.build(device)
            kw = x.emulator_kwargs()
            o, lse, plan = decode(x.q, x.cache, **kw, return_plan=True)
            ref = emulate_decode(x.q, x.cache, **kw, return_details=True)
        except Exception as e:  # a case that cannot run is a finding, reported by name
            bad = ComparisonReport(0, 0.0, 0, 0.0, 0, 0, 0.0, 0, False)
            rows.append(ConformanceRow(f"{case.name}: {type(e).__name__}: {str(e)[:80]}", bad, False, 0.0, 0.0))
        else:
            report = compare_outputs(o.cpu(), lse.cpu(), ref.o.cpu(), ref.lse.cpu(), o_flip_atol=case_flip_atol(x))
            o_same = float((o.view(torch.int16) == ref.o.view(torch.int16)).float().mean()) if o.numel() else 1.0
            l_same = float((lse.view(torch.int32) == ref.lse.view(torch.int32)).float().mean()) if lse.numel() else 1.0
            rows.append(ConformanceRow(case.name, report, plan == ref.plan, o_same, l_same))
        if on_row is not None:
            on_row(rows[-1])
    return rows


def _conform_indexed_shard(job) -> tuple[int, list[ConformanceRow]]:
    k, cases = job
    return k, conform(cases)


def conform_parallel(cases, jobs: int, on_row=None) -> list[ConformanceRow]:
    """:func:`conform` in ``jobs`` processes sharing the GPU (the compiles, one per distinct config, are
    the slow part and run on the CPU); cases of one config stay in one process, rows come back in the
    cases' order. ``on_row``: called with each row as its process finishes its share (progress; in the
    order they finish)."""
    if jobs <= 1:
        return conform(cases, on_row=on_row)
    import multiprocessing as mp

    shards = [[] for _ in range(jobs)]
    order = {}
    for i, case in enumerate(cases):  # one shard per (format, Q, d, page size, q_len, causal): one compile each
        key = (case.fmt, case.q_dtype, case.head_dim, case.page_size, case.q_len, case.causal)
        order.setdefault(key, len(order))
        shards[order[key] % jobs].append((i, case))
    shards = [shard for shard in shards if shard]
    rows = [None] * len(cases)
    with mp.get_context("spawn").Pool(jobs) as pool:
        done = pool.imap_unordered(
            _conform_indexed_shard, [(k, [c for _, c in shard]) for k, shard in enumerate(shards)]
        )
        for k, res in done:
            for (i, _), row in zip(shards[k], res):
                rows[i] = row
                if on_row is not None:
                    on_row(row)
    return rows
