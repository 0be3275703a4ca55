"""The decode kernels' arithmetic, one function per kernel stage (docs/numerics.md, "The kernel's arithmetic").

Every function works on whole batches at once: a leading "chunk" dimension (one per work item of the
split plan, i.e. one CTA per kv head), then the kv head, then query rows / key rows. Shapes below use
``C`` chunks, ``G`` kv heads, ``N = q_len * h_r`` packed query rows, ``D`` head dim and ``T = 128``
keys per tile (:data:`~mjolnir_numerics.plan.TILE_KEYS`).

What is modelled and what is bounded
====================================
This is the ONE place that states how the emulator models arithmetic it cannot observe. Every model
below is deterministic and built only from IEEE float32 / float64 basic operations on exactly
representable data, so the emulator is bit-identical on CPU and CUDA.

1. **Tensor-core dot products** (S = K.Q and V.P per tile, and the V.P sum added into the fp32
   accumulator). By default, where the kernel runs the configuration: the target's hardware model, one
   block FMA per MMA instruction in the kernel's order (:func:`score_tile_mma`,
   :func:`accumulate_pv_mma`; :mod:`mjolnir_numerics.arithmetic` states the model and proves its
   implementation exact). The ideal model (``EmulatorKnobs(mma="ideal")``, and every configuration no
   kernel runs): the EXACT sum of the exact products, rounded once to fp32 (round to nearest even),
   computed in three tiers (:func:`settle_f32`). e4m3 values are multiples of 2^-9
   below 2^9, so an e4m3 x e4m3 (or fp6 / fp4 / NVFP4-kernel-value) product is an integer below 2^36
   on the 2^-18 grid and any sum of up to 2^17 of them is an integer below 2^53: the float64 GEMM is
   exact in any order, on any device (the fp8-Q path). With a wide operand (bf16 Q; bf16 / e5m2 / fp32
   P) the same holds per output element whenever the row's smallest ulp times 2^-9, scaled by 2^53,
   exceeds ``||a|| ||b||`` (a bound on every partial sum): most S elements. Elsewhere (P spanning
   many binades) the float64 GEMM is off by at most :func:`gemm_error_bound`, and where the interval
   it allows rounds to one fp32 value that value is the answer (:func:`verified_f32`, round to nearest
   is monotone); the few elements left in doubt (ties and near-ties) are summed exactly
   (:func:`exact_dot_f32`: ``math.fsum`` and, on fp32 midpoints, integer arithmetic). So the result
   is the correctly rounded exact sum in every case, whatever order the GEMM used.
   ``O_new = fp32(O + exact(V.P))``: the accumulator is one more addend of the exact sum; the final
   fp32 rounding is correct (:func:`add_round_f32`: a float64 sum is re-done with
   round-to-odd only where it lands exactly on an fp32 midpoint). *Bound against hardware*: the tensor
   core adds in an unspecified order with its own intermediate precision; for an ``n``-term fp32
   accumulation that differs from the model by at most ``n * 2^-24 * sum(|a_i b_i|)``
   (:data:`TENSOR_CORE_REL_BOUND`, the classical recursive-summation bound), per tile (n = d for S,
   n = 128 keys + the accumulator for O). Hopper's fp8 tensor cores do not meet it: their e4m3 products
   were off by up to ~2^-10 of ``sum(|a_i b_i|)`` already at 32 terms
   (``python -m benchmarks.probes.probe_fp8_accumulation``), so the Hopper kernel multiplies exactly widened
   f16 / bf16 values (an fp8 wgmma variant, not conformant, was measured and removed: reports/hopper/).
2. **ex2.approx.ftz.f32** (p, the correction, the split weights): on the H200 and H100, the H200's SFU
   bit for bit (:func:`exp2_sm90_f32`: the correctly rounded value plus a measured difference of -2 ..
   +1 ulp read from a table; 0 differences over every input of [-150, 0]). Elsewhere the correctly
   rounded fp32 exp2 with subnormal results flushed to +0 (:func:`exp2_f32`): computed from float64
   exp2 (error < 2 float64 ulps) rounded once, and the 400 inputs whose exact value lies within 256
   float64 ulps of an fp32 rounding midpoint looked up in a table decided in decimal arithmetic, so CPU
   and CUDA libm differences cannot show, and no branch asks the device.
3. **log (LSE, ``cute.math.log(fastmath=False)``)**: libdevice's ``logf``, bit for bit
   (:func:`log_libdevice_f32`, plain fp32 fmas; matched the H200 on every positive fp32), or the
   correctly rounded fp32 natural log (:func:`log_f32`: float64 log, the results within 2^7 float64
   ulps of an fp32 midpoint redone in decimal, a host round trip), which it is within 1 ulp of.
4. **fma** (the row sum ``l = fma(corr, l, p)``): exact product in float64, exact round-to-odd sum,
   one rounding to fp32: exactly IEEE fma.
5. **fp32 add / mul / div** (softmax, epilogue, reduction): IEEE round to nearest even, as the
   hardware's ``add.rn``/``mul.rn``/``div.rn``. The reduction's ``l_acc += w * l`` and
   ``o_acc += w * o`` are one fma per term, as the reduction kernel writes them
   (``mjolnir_kernel.reduction.weighted_add``, ``FFMA`` in its SASS).
6. **Conversions**: e4m3 / fp6 / fp4 by :func:`mjolnir_numerics.quantize.quantize`'s rounding (bit-exact
   ``cvt.rn.satfinite``); bf16 and e5m2 as torch's round-to-nearest-even casts give them, written in
   integer operations (:func:`round_bf16`, :func:`~mjolnir_numerics.arithmetic.round_nearest_grid`).
7. **Subnormals**: fp32 add/mul keep subnormal results (the kernel's packed f32x2 ops do not set
   ``.ftz``); only the ex2 results are flushed. ex2's flush of subnormal *inputs* is irrelevant
   (2^x of a tiny x is 1 either way).
8. **Loads**: pages at or past a sequence's end are not read (the kernel passes an out-of-range page
   index and TMA zero-fills the box), so they are 0 whatever the block table holds; rows past the end
   inside the last page ARE read (K masked by a select, V multiplied by p = 0: a NaN stored there
   would propagate, as on the GPU). For NVFP4 a zero-filled page is codes 0 times page 0's scale:
   0 here, and on the GPU too unless page 0's scale byte is the e4m3 NaN.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from typing import Callable, Optional

import torch

from .arithmetic import chain_gemm, round_nearest_f32, round_nearest_grid
from .formats import E4M3
from .fused import quantize_f32
from .quantize import _round_to_odd_lut

__all__ = [
    "TENSOR_CORE_REL_BOUND",
    "LOG2E_F32",
    "round_odd_add",
    "add_round_f32",
    "fma_f32",
    "mul_f32",
    "div_f32",
    "round_bf16",
    "exp2_f32",
    "exp2_sm90_f32",
    "log_f32",
    "log_libdevice_f32",
    "log2_f32",
    "gemm_error_bound",
    "verified_f32",
    "exact_dot_f32",
    "settle_f32",
    "grid_exponent",
    "row_norm",
    "NARROW_GRID_EXP",
    "NORM_MARGIN",
    "BOUND_FLOOR",
    "score_tile",
    "score_tile_mma",
    "load_tables",
    "mask_tile",
    "softmax_tile",
    "round_p",
    "row_sum_correction",
    "accumulate_row_sum",
    "running_column_max",
    "rescale_o",
    "accumulate_pv",
    "accumulate_pv_mma",
    "reduce_row_sum",
    "epilogue",
    "reduction",
]

TENSOR_CORE_REL_BOUND = 2.0**-24
"""Per-term relative bound of an unspecified-order fp32 summation (unit roundoff u = 2^-24):
``|hw - model| <= n * u * sum(|a_i b_i|)`` for an ``n``-term tensor-core dot product."""

LOG2E_F32 = float(torch.tensor(math.log2(math.e), dtype=torch.float32))
"""log2(e) at device precision (the kernel's constant is a Python float turned into Float32)."""

_F32_MIN_NORMAL = 2.0**-126


def _sync_free(x: torch.Tensor) -> bool:
    """Take the branch-free form of a stage (no data-dependent shortcut that asks the device): on CUDA,
    where each such question is a host round trip that stalls the queue. Both forms give the same bits."""
    return x.is_cuda


_HARD_ULP64 = 1 << 7  # float64 ulps (= 2^-22 fp32 ulp) from an fp32 rounding midpoint that trigger the decimal redo
_DECIMAL_DIGITS = 60


# ----------------------------------------------------------------------------------------------
# Arithmetic models (see the module docstring)
# ----------------------------------------------------------------------------------------------
def round_odd_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float64 ``a + b`` rounded to odd (exact TwoSum error folded into the last bit).

    Rounding the result to fp32 (round to nearest even) then gives the correctly rounded fp32 of the
    exact sum, because float64 has at least 2 more bits than fp32 (Boldo & Melquiond 2005).
    Non-finite sums are returned as float64 ``a + b``.
    """
    s = a + b
    bp = s - a
    ap = s - bp
    err = (a - ap) + (b - bp)  # NaN exactly where s is not finite
    inexact = err.abs() > 0
    if not _sync_free(s) and not bool(inexact.any()):  # a shortcut only where asking costs nothing
        return s
    # round to odd = truncate toward zero, then set the last bit if inexact: s was rounded away from
    # zero where err has the other sign (one ulp down in magnitude: bits - 1); s != 0 when inexact
    bits = s.view(torch.int64)
    away = ((bits ^ err.view(torch.int64)) < 0) & inexact
    return ((bits - away.to(torch.int64)) | inexact.to(torch.int64)).view(torch.float64)


_F32_EXP_MASK = 0x7F800000
_LOW29 = (1 << 29) - 1  # float64 fraction bits below fp32 precision (52 - 23)
_HALF29 = 1 << 28


def _double_rounding_risky(s: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Where ``r = RN32(s)`` of a float64 ``s = RN64(x)`` may differ from ``RN32(x)``: ``s`` exactly on an
    fp32 rounding midpoint, or ``r`` an fp32 zero / subnormal of a nonzero value (bool, ``s``'s shape)."""
    risky = (s.view(torch.int64) & _LOW29) == _HALF29
    zero_or_sub = (r.view(torch.int32) & _F32_EXP_MASK) == 0  # fp32 exponent field 0
    if bool(zero_or_sub.any()):
        risky |= zero_or_sub & (r != 0)
    return risky


def add_round_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 rounding of the exact sum of ``a`` and ``b`` (float32 or float64, at least one float64;
    correct rounding, cheap path).

    ``RN32(RN64(x)) == RN32(x)`` unless ``RN64(x)`` lands exactly on an fp32 rounding midpoint (or in
    the fp32 subnormal range); only those elements take the exact round-to-odd path.
    """
    if _sync_free(a) or _sync_free(b):  # no host round trip: round to odd everywhere (the same bits)
        return round_nearest_f32(round_odd_add(a.double(), b.double()))  # a rounding no compiler pass drops
    s = a + b  # float64: a float32 operand widens exactly inside the op
    r = s.float().contiguous()
    risky = _double_rounding_risky(s, r)
    if bool(risky.any()):
        # flat indices: a 1-D gather / scatter is far cheaper than indexing with one tensor per dim
        idx = risky.reshape(-1).nonzero().squeeze(1)
        a_r = a.expand_as(s).reshape(-1)[idx].double()
        b_r = b.expand_as(s).reshape(-1)[idx].double()
        r.view(-1)[idx] = round_odd_add(a_r, b_r).float()
    return r


def mul_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IEEE fp32 ``a * b`` (``mul.rn``) of fp32 tensors (broadcasting; float32 out): the exact float64 product
    rounded once. Where a product feeds an addition, this form keeps a compiler from contracting the two into
    one fma (Triton may)."""
    return round_nearest_f32(a.double() * b.double())


def div_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IEEE fp32 ``a / b`` (``div.rn``) of fp32 tensors (broadcasting; float32 out): the float64 quotient rounded
    once more to fp32, which is the correctly rounded fp32 quotient (53 >= 2 * 24 + 2: S. A. Figueroa, "When is
    double rounding innocuous?", SIGNUM 1995). Also inside compiled graphs, where Triton's float32 ``/`` is
    approximate. (``fused.div_rn`` is the same quotient with a plain ``.float()``, for graphs that chain none.)"""
    return round_nearest_f32(a.double() / b.double())


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """float32 ``x`` rounded to bfloat16 (nearest, ties to even; NaN kept), as float32: ``x.to(bfloat16).float()``
    in integer operations on the bits (:func:`~mjolnir_numerics.arithmetic.round_nearest_grid`), which no
    compiler pass can drop (inductor's ``pointless_convert``, torch 2.11, rewrites ``float32 -> bfloat16 ->
    float32`` as no conversion at all)."""
    return round_nearest_grid(x.double(), 7, -126, 128).float()


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """IEEE fp32 ``fma(a, b, c)`` (one rounding) of fp32 tensors, broadcasting; returns float32."""
    prod = a.double() * b.double()  # exact: 24 + 24 bits fit float64's 53
    return add_round_f32(prod, c)


def _correct_round(y: torch.Tensor, x: torch.Tensor, exact: Callable[[Decimal], Decimal]) -> torch.Tensor:
    """fp32 rounding of ``y`` (a float64 approximation of ``f(x)``, error << 2^-22 fp32 ulp) that is
    correct: values near an fp32 rounding boundary are decided with ``exact`` in decimal."""
    z = y.float()
    # within _HARD_ULP64 float64 ulps of an fp32 rounding midpoint (bits below fp32 precision ~ 100..0)
    hard = ((y.view(torch.int64) - (_HALF29 - _HARD_ULP64)) & _LOW29) < 2 * _HARD_ULP64
    if not bool(hard.any()):
        return z
    hard &= torch.isfinite(y) & (y.abs() >= _F32_MIN_NORMAL)
    if not bool(hard.any()):
        return z
    idx = hard.nonzero(as_tuple=True)
    mant, expo = torch.frexp(y[idx].abs())
    scaled = mant * 2.0**24  # in [2^23, 2^24): fp32 significand, the rounding bit as the fraction
    xs = x[idx].double().cpu().tolist()
    fl = torch.floor(scaled).cpu().tolist()
    ex = expo.cpu().tolist()
    sg = torch.sign(y[idx]).cpu().tolist()
    fixed = []
    with localcontext() as ctx:
        ctx.prec = _DECIMAL_DIGITS
        for xv, f, e, s in zip(xs, fl, ex, sg):
            mid = Decimal(f + 0.5) * (Decimal(2) ** (int(e) - 24))
            val = abs(exact(Decimal(xv)))
            mag = (f + (1.0 if val > mid else 0.0)) * 2.0 ** (int(e) - 24)
            fixed.append(s * mag)
    out = z.clone()
    out[idx] = torch.tensor(fixed, dtype=torch.float64).to(z.device).float()
    return out


# fp32 r in (-1, 1) whose exact 2^r lies within EXP2_HARD_ULP64 float64 ulps of an fp32 rounding midpoint,
# with their correctly rounded 2^r (decided in 60-digit decimal arithmetic): written by ``python -m
# benchmarks.probes.exp2_hard_cases`` from a scan of all 2 x 25 x 2^23 inputs with |r| in [2^-25, 1) (below,
# 2^r lies within 2^-25 ln 2 of 1, far from the midpoints 1 - 2^-25 and 1 + 2^-24).
EXP2_HARD_CASES = "exp2_hard_cases.txt"
EXP2_HARD_ULP64 = 256
EXP2_HARD_BINADES = 25
_exp2_hard: dict = {}


def _exp2_hard_table(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The hard inputs' bits (int32, ascending) and their correctly rounded ``2^r``'s bits (int32) on
    ``device``, read once per process."""
    key = str(device)
    if key not in _exp2_hard:
        if "cpu" not in _exp2_hard:
            from importlib.resources import files

            rows = [
                line.split()
                for line in files(__package__).joinpath("data", EXP2_HARD_CASES).read_text().splitlines()
                if line and not line.startswith("#")
            ]
            pairs = torch.tensor([[int(a, 16), int(b, 16)] for a, b in rows], dtype=torch.int64).to(torch.int32)
            _exp2_hard["cpu"] = (pairs[:, 0].contiguous(), pairs[:, 1].contiguous())
        _exp2_hard[key] = tuple(t.to(device) for t in _exp2_hard["cpu"])
    return _exp2_hard[key]


def _exp2_unit(r: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 ``2^r`` of fp32 ``r`` in (-1, 1), with no data-dependent branch: the float64
    ``exp2`` (within 1-2 float64 ulps of the exact value on every device) rounded to fp32 is correct unless the
    exact value lies within :data:`EXP2_HARD_ULP64` float64 ulps of an fp32 midpoint, and those inputs are
    looked up in the hard-case table. Returns float32 like ``r``."""
    z = round_nearest_f32(torch.exp2(r.double()))
    keys, values = _exp2_hard_table(r.device)
    rb = r.contiguous().view(torch.int32)
    pos = torch.searchsorted(keys, rb).clamp(max=keys.numel() - 1)
    hit = keys[pos] == rb
    return torch.where(hit, values[pos], z.view(torch.int32)).view(torch.float32)


def exp2_f32(x: torch.Tensor) -> torch.Tensor:
    """``ex2.approx.ftz.f32`` model: correctly rounded fp32 ``2**x`` of fp32 ``x``, subnormal results
    flushed to +0; ``-inf -> 0``, ``+inf -> inf``, NaN -> NaN. Returns float32 like ``x``.

    ``2^x = 2^n 2^r`` with ``n = ceil(x)`` and ``r = x - n`` in (-1, 0] (exact in fp32; for x in (0, 1),
    where ``x - 1`` would not be, n = 0 and r = x): the correctly rounded ``2^r`` (:func:`_exp2_unit`)
    scaled by ``2^n`` is the correctly rounded ``2^x`` wherever that is normal (below, both flush to 0: no
    fp32 ``x`` puts ``2^x`` within half a subnormal step of 2^-126; past 2^128 both are inf). No branch asks
    the device, so the function also runs inside compiled graphs (call :func:`load_tables` for the device
    first: a graph can look the hard-case table up but not read its file).

    Raises:
        TypeError: ``x`` is not float32 (the table is keyed by float32 bit patterns).
    """
    if x.dtype != torch.float32:
        raise TypeError(f"x: expected float32, got {x.dtype}")
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, torch.zeros_like(x))
    n = torch.where((xf > 0) & (xf < 1), 0.0, torch.ceil(xf))
    r = xf - n  # exact: a multiple of x's ulp below 1 in magnitude
    pow2 = ((n.clamp(-200, 200).long() + 1023) << 52).view(torch.float64)
    z = _exp2_unit(r).double() * pow2  # exact scaling
    z = torch.where(z < _F32_MIN_NORMAL, 0.0, torch.where(z >= 2.0**128, math.inf, z)).float()  # exact
    z = torch.where(x == -math.inf, 0.0, torch.where(x == math.inf, math.inf, z))
    return torch.where(torch.isnan(x), x, z)


# The H200's ex2.approx.ftz.f32 (MUFU.EX2), measured on every fp32 x < 0 with |x| in [2^-25, 1): the
# difference of its result from the correctly rounded one, in fp32 ulps (-2 .. +1), 2 bits per input
# (d + 2, four inputs a byte, the lowest bits first), binade k = 0 .. 24 (|x| in [2^-(k+1), 2^-k), inputs in bit order
# from 0x80000000 | (126 - k) << 23) one after another: 52,428,800 bytes, 283 KB as xz. Written by
# ``python -m benchmarks.probes.arithmetic_sweep --out DIR --parts ex2_raw`` on the H200 (2026-12-02),
# then ``--ex2-table DIR``.
EX2_SM90_TABLE = "data/ex2_sm90.xz"
EX2_SM90_BINADES = 25
_ex2_tables: dict = {}


def _ex2_sm90_table(device: torch.device) -> torch.Tensor:
    """The packed ex2 table (uint8, 52 MB) on ``device``, read once per process (and once per device)."""
    key = str(device)
    if key not in _ex2_tables:
        if "cpu" not in _ex2_tables:
            import lzma
            from importlib.resources import files

            raw = lzma.decompress(files(__package__).joinpath(EX2_SM90_TABLE).read_bytes())
            if len(raw) != EX2_SM90_BINADES << 21:
                raise RuntimeError(f"{EX2_SM90_TABLE}: {len(raw)} bytes, expected {EX2_SM90_BINADES << 21}")
            _ex2_tables["cpu"] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        _ex2_tables[key] = _ex2_tables["cpu"].to(device)
    return _ex2_tables[key]


def exp2_sm90_f32(x: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """The H200's ``ex2.approx.ftz.f32`` (sm_90 ``MUFU.EX2``), bit for bit, for fp32 ``x <= 0``.

    Measured structure (``reports/hopper/2026-12-01-arithmetic.md``): the result is ``2^n ex2(r)`` with
    ``n = ceil(x)`` and ``r = x - n`` in (-1, 0] (exact in fp32), flushed to +0 below 2^-126; ``ex2(r)``
    is correctly rounded for |r| < 2^-25, and for |r| in [2^-25, 1) it is the correctly rounded
    value plus a measured difference of -2 .. +1 ulp, read from the table (no compact formula reproduced
    it: the SFU interpolates a table with a quadratic, Oberman and Siu, ARITH 2005). ``-inf -> 0``, NaN
    -> NaN. The kernels only exponentiate ``x <= 0`` (scores minus their running max); a positive ``x``
    raises ``ValueError``, as it was not measured.

    Args:
        x: float32, any shape, on any device (the table is moved there once).
        check: raise for a positive ``x`` (a question to the device: a host round trip on CUDA, and no
            compiled graph can hold it). The emulator turns it off: its inputs are a score minus a running
            max that includes it, or the difference of two running maxes, never positive.

    Returns:
        float32 like ``x``.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"x: expected float32, got {x.dtype}")
    if check and bool((x > 0).any()):
        raise ValueError("x: the sm_90 ex2 model covers x <= 0 (the kernels' inputs); got a positive value")
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, torch.zeros_like(x))
    n = torch.ceil(xf)
    r = xf - n  # exact: a multiple of x's ulp below 1 in magnitude; +-0 falls outside the table
    cr = _exp2_unit(r)
    rb = r.view(torch.int32)
    k = 126 - ((rb >> 23) & 0xFF)
    in_table = (rb < 0) & (k >= 0) & (k < EX2_SM90_BINADES)
    idx = k.clamp(0, EX2_SM90_BINADES - 1).long() * (1 << 23) + (rb & 0x7FFFFF).long()
    table = _ex2_sm90_table(x.device)
    d = ((table[idx >> 2] >> ((idx & 3) * 2).to(torch.uint8)) & 3).to(torch.int32) - 2
    hw_r = (cr.view(torch.int32) + torch.where(in_table, d, torch.zeros_like(d))).view(torch.float32)
    # 2^n from its bits: exact on every device; below -200 the result flushes to 0 whatever n is
    pow2 = ((n.clamp(min=-200).long() + 1023) << 52).view(torch.float64)
    z = hw_r.double() * pow2  # exact scaling
    z = torch.where(z < _F32_MIN_NORMAL, torch.zeros_like(z), z).float()
    z = torch.where(x == -math.inf, torch.zeros_like(z), z)
    return torch.where(torch.isnan(x), x, z)


def log_f32(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 natural log of fp32 ``x`` (``log(0) = -inf``, negative -> NaN)."""
    x64 = x.double()
    return _correct_round(torch.log(x64), x64, lambda d: d.ln())


# libdevice ``logf`` (``__nv_logf``, CUDA 13): the minimax polynomial of log1p on the reduced argument,
# highest degree first, applied by Horner's rule in fp32 fmas; its leading coefficient is
# -0.13018857 (float bits 0x3E055027).
_LOGF_POLY = (
    -0.13018856942653656006,
    0.14084610342979431152,
    -0.12148627638816833496,
    0.13980610668659210205,
    -0.16684235632419586182,
    0.20012299716472625732,
    -0.24999669194221496582,
    0.33333182334899902344,
    -0.5,
)
_LN2_F32 = 0.69314718246459960938  # fp32(ln 2)
_TWO_M23 = 2.0**-23


def log_libdevice_f32(x: torch.Tensor) -> torch.Tensor:
    """The kernel's LSE log, ``cute.math.log(x, fastmath=False)`` = libdevice ``logf``, bit for bit.

    Transcribed from the sm_90a SASS of the decode kernels' epilogue and reduction (a sequence of IEEE
    fp32 operations, no SFU): ``x`` below 2^-126 is scaled by 2^23 (t = -23, else t = 0);
    ``i = bits(x) - 0x3f2aaaab``, ``e = i & 0xff800000`` (the exponent that brings x into
    [2/3, 4/3)); ``m = float(bits(x) - e)``, ``f = m - 1``; the polynomial ``r`` of ``_LOGF_POLY`` in
    ``f`` by fmas, then ``r = f * r``, ``r = fma(f, r, f)``; ``t = fma(float(e), 2^-23, t)``; the
    result ``fma(t, fp32(ln 2), r)``. ``x`` negative, +inf or NaN (bits above 0x7f7fffff as unsigned):
    ``fma(x, inf, inf)`` (NaN, +inf, NaN); ``x == 0``: -inf. Measured on the H200 against the
    hardware over every fp32 in [1, 2^24] (``benchmarks/probes/arithmetic_sweep.py --parts log``); the
    same libdevice code runs on every target. Within 1 ulp of the correctly rounded :func:`log_f32`.

    Args:
        x: float32 tensor, any shape, CPU or CUDA.

    Returns:
        float32 tensor like ``x``.
    """
    if x.dtype != torch.float32:
        raise ValueError(f"x: expected float32, got {x.dtype}")
    tiny = x < _F32_MIN_NORMAL
    xs = torch.where(tiny, x * 2.0**23, x)
    t = torch.where(tiny, -23.0, 0.0).to(torch.float32)
    bits = xs.view(torch.int32)
    e = (bits - 0x3F2AAAAB) & torch.tensor(0xFF800000 - (1 << 32), dtype=torch.int32)
    m = (bits - e).view(torch.float32)
    ef = e.to(torch.float32)  # a multiple of 2^23 below 2^31 in magnitude: exact
    f = m - 1.0
    r = torch.full_like(f, _LOGF_POLY[0])
    for coef in _LOGF_POLY[1:]:
        r = fma_f32(f, r, torch.tensor(coef, dtype=torch.float32, device=x.device))
    r = f * r
    r = fma_f32(f, r, f)
    t = fma_f32(ef, torch.tensor(_TWO_M23, dtype=torch.float32, device=x.device), t)
    res = fma_f32(t, torch.tensor(_LN2_F32, dtype=torch.float32, device=x.device), r)
    special = (bits < 0) | (bits > 0x7F7FFFFF)  # as unsigned: above the largest finite positive
    inf = torch.tensor(math.inf, dtype=torch.float32, device=x.device)
    res = torch.where(special, fma_f32(xs, inf, inf), res)
    return torch.where(x == 0, -inf, res)


def log2_f32(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 base-2 log of fp32 ``x`` (the LSE-base-2 research knob)."""
    x64 = x.double()
    return _correct_round(torch.log2(x64), x64, lambda d: d.ln() / Decimal(2).ln())


# The narrow operands (e4m3, fp6 / fp4 and NVFP4-kernel values: K, V, e4m3 Q and P) are multiples of
# 2^NARROW_GRID_EXP of magnitude at most NARROW_MAX (e4m3's largest finite value): any sum of up to 2^17
# of their products is exact in float64, and K narrow values have a 2-norm of at most NARROW_MAX sqrt(K).
NARROW_GRID_EXP = -9
NARROW_MAX = 448.0


_U64 = 2.0**-53  # float64 unit roundoff
# Relative margin on a product of two computed 2-norms in settle_f32's exact-tier test: each norm's own
# rounding is below (K + 2) u, which stays under this margin for K < 2^12 terms.
NORM_MARGIN = 2.0**-40
# verified_f32 widens every bound to at least this fraction of |z| (2 float64 ulps), so z +- bound
# always moves off z and a z sitting exactly on an fp32 midpoint is always in doubt.
BOUND_FLOOR = 2.0**-51


def gemm_error_bound(n_terms: int, a_norm: torch.Tensor, b_norm: torch.Tensor) -> torch.Tensor:
    """A bound on ``|fl64(sum a_i b_i) - sum a_i b_i|`` for an ``n_terms`` float64 dot product summed in
    ANY order (blocked, pairwise, fused; CPU or CUDA GEMMs): the classical ``gamma_n sum |a_i b_i|`` with
    ``gamma_n = n u / (1 - n u)``, u = 2^-53, and ``sum |a_i b_i| <= ||a|| ||b||`` (Cauchy-Schwarz).
    Doubled, which covers the float64 rounding of the norms themselves (relative error < n u).

    Args: ``a_norm (..., M, 1)``, ``b_norm (..., 1, N)`` float64 2-norms of the rows / columns (broadcast).
    """
    n = n_terms + 1
    gamma = n * _U64 / (1.0 - n * _U64)
    return (2.0 * gamma) * (a_norm * b_norm)


def verified_f32(z: torch.Tensor, bound: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 rounding of an exact value known only to lie within ``bound`` of the float64 ``z``.

    Round-to-nearest is monotone, so where ``z - bound`` and ``z + bound`` round to the same fp32 value,
    that value IS the correctly rounded exact result, whatever the exact value is. Returns
    ``(r, doubt)``: float32 ``r`` (correct wherever ``doubt`` is False) and the bool mask of elements
    whose interval contains an fp32 rounding boundary (finite ``z`` only; NaN and inf pass through as
    ``z.float()``, as the exact GEMMs give them). The bound is taken as at least ``BOUND_FLOOR |z|``.
    Results that are fp32 zeros or subnormals of a nonzero
    ``z`` count as in doubt too, so a float64 -> float32 conversion that flushes subnormals cannot show.
    """
    r = z.float()
    bound = torch.maximum(bound, z.abs() * BOUND_FLOOR)
    doubt = ((z - bound).float() != (z + bound).float()) & torch.isfinite(z)
    tiny = (r.view(torch.int32) & _F32_EXP_MASK) == 0
    return r, doubt | (tiny & (z != 0))


def _rational_to_f32(num: int, k: int) -> float:
    """fp32 round-to-nearest-even of ``num * 2^-k`` (Python ints; the fp32 subnormals included)."""
    if num == 0:
        return 0.0  # an exact zero sum rounds to +0 (the tensor core's accumulator starts at +0)
    n = abs(num)
    e = n.bit_length() - 1 - k  # value in [2^e, 2^(e + 1))
    ulp = max(e, -126) - 23  # fp32 ulp exponent at this magnitude (2^-149 below the normals)
    shift = -k - ulp
    if shift >= 0:
        m = n << shift
    else:
        m, rem = divmod(n, 1 << -shift)
        half = 1 << (-shift - 1)
        if rem > half or (rem == half and m & 1):
            m += 1
    return math.copysign(math.ldexp(m, ulp), num)


def exact_dot_f32(a: torch.Tensor, b: torch.Tensor, addend: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The correctly rounded fp32 of ``sum_i a[j, i] b[j, i] (+ addend[j])`` for each row j (for the few
    elements :func:`verified_f32` leaves in doubt).

    The products are exact in float64 (wide x narrow operands, model 1); ``math.fsum`` returns their
    exact sum rounded once to float64, and rounding that to fp32 is the correct rounding unless it lies
    exactly on an fp32 rounding midpoint (or in the fp32 subnormal range), where the sum is redone in
    integer arithmetic. Args: ``a``, ``b`` float64 ``(m, K)``; ``addend`` ``(m,)``. Returns float32 ``(m,)``
    on ``a``'s device.
    """
    prods = (a.double() * b.double()).cpu()
    if addend is not None:
        prods = torch.cat([prods, addend.double().cpu()[:, None]], dim=1)
    rows = prods.tolist()
    s64 = torch.tensor([math.fsum(row) for row in rows], dtype=torch.float64)
    r = s64.float()
    risky = _double_rounding_risky(s64, r)
    for j in risky.nonzero().flatten().tolist():
        ratios = [x.as_integer_ratio() for x in rows[j] if x != 0.0]
        k = max(den.bit_length() - 1 for _, den in ratios)  # every denominator is a power of two
        total = sum(num << (k - (den.bit_length() - 1)) for num, den in ratios)
        r[j] = _rational_to_f32(total, k)
    return r.to(a.device)


# ----------------------------------------------------------------------------------------------
# Kernel stages (docs/numerics.md, "The kernel's arithmetic", steps 3-11)
# ----------------------------------------------------------------------------------------------
def score_tile(
    q: torch.Tensor,
    k_tile: torch.Tensor,
    q_sig_bits: Optional[int],
    q_norm: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Step 3, GEMM1: ``S = K . Q`` for one tile, the exact sum rounded once to fp32 (model 1).

    Args:
        q: ``(C, G, M, D)`` float64 (or float32) values of the packed query rows, e4m3 or bf16 values; rows
            past the real ones may be zero padding (their S rows are zeros).
        k_tile: ``(C, G, T, D)`` float values the MMA reads for the tile's keys.
        q_sig_bits: None on the fp8-Q path (narrow x narrow: the float64 GEMM is exact), 8 for bf16 Q
            (wide: the float64 GEMM is settled by :func:`verified_f32` and :func:`exact_dot_f32`).
        q_norm: ``(C, G, M)`` float64 row norms of ``q`` (computed when not given; the emulator makes them
            once per call).
        out: optional float64 ``(C, G, M, T)`` buffer for the GEMM.

    Returns:
        float32 ``(C, G, M, T)``: S in raw units (no scale, no descale).
    """
    q64, k64 = q.double(), k_tile.double()
    z = torch.matmul(q64, k64.transpose(-1, -2), out=out)
    if q_sig_bits is None:
        return z.float()
    if q_norm is None:
        q_norm = row_norm(q64, -1)
    k_norm = NARROW_MAX * math.sqrt(k64.shape[-1])  # a bound, not the norm: no pass over the tile
    grid = grid_exponent(q64, q_sig_bits) + NARROW_GRID_EXP
    return settle_f32(z, q_norm[..., :, None], k_norm, grid[..., :, None], q64, k64)


def score_tile_mma(q: torch.Tensor, k_tile: torch.Tensor, model, groups: torch.Tensor) -> torch.Tensor:
    """Step 3 under a hardware MMA model (``mjolnir_numerics.arithmetic``): ``S = K . Q`` as the kernel's
    chain of MMA instructions forms it, from 0, one instruction per row of ``groups`` (the head dims it
    adds, in issue order: ``arithmetic.kstep_groups``).

    Args:
        q: ``(C, G, M, D)`` float query rows; k_tile: ``(C, G, T, D)`` float key values (the MMA's
            operands, exact in the model's operand format; any float dtype that holds them, float8 too).
        model: an ``arithmetic.MmaModel``; groups: int64 ``(steps, K)``.

    Returns:
        float32 ``(C, G, M, T)``.
    """
    c = torch.zeros(q.shape[:-1] + (k_tile.shape[-2],), dtype=torch.float32, device=q.device)
    return chain_gemm(q, k_tile, c, groups, model)


def row_norm(x: torch.Tensor, dim: int) -> torch.Tensor:
    """2-norm of float64 ``x`` along ``dim`` (that dimension removed; float64): sum of squares, then sqrt,
    relative error below (K + 2) u for K terms, which :data:`NORM_MARGIN` and the doubled
    :func:`gemm_error_bound` allow for; several times faster on CPU than ``torch.linalg.vector_norm``."""
    return (x * x).sum(dim).sqrt()


def grid_exponent(a: torch.Tensor, sig_bits: int) -> torch.Tensor:
    """Per row of ``a (..., M, K)`` (values with ``sig_bits`` significant bits): an exponent g such that
    every value of the row is a multiple of 2^g (the ulp of its smallest nonzero magnitude; float64
    ``(..., M)``; rows of zeros get a large g, they add exact zeros)."""
    tiny = torch.where(a != 0, a.abs(), torch.full((), math.inf, dtype=a.dtype, device=a.device)).amin(dim=-1)
    _, e = torch.frexp(torch.where(torch.isfinite(tiny), tiny, torch.ones((), dtype=a.dtype, device=a.device)))
    return (torch.clamp(e - 1, min=-126) - (sig_bits - 1)).double()


def settle_f32(
    z: torch.Tensor,
    a_norm: torch.Tensor,
    b_norm: torch.Tensor,
    grid: torch.Tensor,
    a_rows: torch.Tensor,
    b_rows: torch.Tensor,
    addend: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """fp32 round-to-nearest of the exact ``a_rows[.., i, :] . b_rows[.., j, :] (+ addend[.., i, j])``
    for every (i, j), from the float64 GEMM result ``z`` (model 1), in three tiers:

    1. exact GEMM: every product is a multiple of 2^grid (the rows' smallest ulps) and every partial sum
       is at most ``sum |a b| <= ||a|| ||b||``; below 2^(53 + grid) each is a float64 integer multiple of
       2^grid, so ``z`` IS the exact sum, in any order: one rounding (with the addend: :func:`add_round_f32`);
    2. elsewhere (wide operands spanning many binades), :func:`verified_f32` with
       :func:`gemm_error_bound` (plus the rounding of the addend's float64 add);
    3. what that leaves in doubt, :func:`exact_dot_f32` in integer arithmetic.

    Args: ``z (..., M, N)`` float64; ``a_norm (..., M, 1)``, ``b_norm (..., 1, N)`` float64 norms (or
    upper bounds on them; a float for a bound on every column);
    ``grid`` broadcastable exponents; ``a_rows (..., M, K)``, ``b_rows (..., N, K)``; ``addend (..., M, N)``.
    """
    size = a_norm * b_norm
    exact = size * (1.0 + NORM_MARGIN) < torch.exp2(grid + 53.0)
    n_exact = int(exact.sum())
    if n_exact == exact.numel():
        return z.float() if addend is None else add_round_f32(addend, z)
    zz = z if addend is None else addend.double() + z
    bound = gemm_error_bound(a_rows.shape[-1], a_norm, b_norm)
    if addend is not None:
        bound = bound + (2.0 * _U64) * zz.abs()
    r, doubt = verified_f32(zz, bound)
    if n_exact:  # (P spanning many binades: usually none) tier 1 where it applies
        r = torch.where(exact, z.float() if addend is None else add_round_f32(addend, z), r)
        doubt &= ~exact
    if bool(doubt.any()):
        idx = doubt.nonzero(as_tuple=True)
        lead, i, j = idx[:-2], idx[-2], idx[-1]
        add = None if addend is None else addend[idx]
        r[idx] = exact_dot_f32(a_rows[(*lead, i)], b_rows[(*lead, j)], add)
    return r


def load_tables(device: torch.device, sm90_ex2: bool) -> None:
    """Read the tables the stages look up onto ``device`` now (the exp2 hard cases, the e4m3 quantizer's and
    the sm_90 ex2's when ``sm90_ex2``): a compiled graph can look them up but not read their files."""
    _exp2_hard_table(device)
    E4M3.values(device)
    _round_to_odd_lut(E4M3, device)
    if sm90_ex2:
        _ex2_sm90_table(device)


def mask_tile(s: torch.Tensor, keys: torch.Tensor, last_key: torch.Tensor) -> torch.Tensor:
    """Step 4: keys past a column's last visible key are -inf (a select: NaN/garbage cannot leak).

    Args:
        s: ``(C, G, N, T)`` float32.
        keys: ``(C, T)`` int64 absolute key indices of the tile.
        last_key: ``(C, N)`` int64: the last key each query row sees (``seq_len - q_len + qi`` when
            causal, ``seq_len - 1`` otherwise; ``-1`` for an empty sequence).
    """
    if not _sync_free(s) and bool((keys[:, -1] <= last_key.amin(dim=1)).all()):
        return s  # every key of every tile is visible to every column
    hidden = keys[:, None, None, :] > last_key[:, None, :, None]
    return torch.where(hidden, torch.full_like(s, -math.inf), s)


def softmax_tile(
    s: torch.Tensor, m_use: torch.Tensor, c: torch.Tensor, ex2: Callable[[torch.Tensor], torch.Tensor] = exp2_f32
) -> torch.Tensor:
    """Step 6: ``p = ex2((S - m_use) * c)``: one fp32 subtract, one fp32 multiply, then ex2.

    Args:
        s: ``(C, G, N, T)`` float32; m_use: ``(C, G, N)``; c: ``(C, G)`` float32, the folded scale
            ``scale_qs_log2_e * (q_descale * k_descale)``.
        ex2: the ex2 model (:func:`exp2_f32` or :func:`exp2_sm90_f32`).

    Returns:
        float32 ``(C, G, N, T)``, unrounded p in [0, 1].
    """
    x = (s - m_use[..., None]) * c[:, :, None, None]
    return ex2(x)


def round_p(p: torch.Tensor, p_scale: float, p_format: str) -> torch.Tensor:
    """Step 7: P as the second GEMM reads it, in units of ``p * p_scale``.

    ``"e4m3"``: ``e4m3(fp32(p * p_scale))`` (the fp8-Q path, p_scale 448); ``"bf16"``: ``bf16(p *
    p_scale)`` (the bf16-Q path, p_scale 1); ``"e5m2"``; ``"fp32"``: no rounding. Returns float32.
    """
    x = p * p_scale if p_scale != 1.0 else p
    if p_format == "e4m3":  # the quantizer's formula (quantize() would launch a helper kernel on CUDA)
        return E4M3.values(x.device)[quantize_f32(x, _round_to_odd_lut(E4M3, x.device)).long()]
    if p_format == "bf16":
        return round_bf16(x)
    if p_format == "e5m2":  # x.to(float8_e5m2).float() in integer operations (see round_bf16)
        return round_nearest_grid(x.double(), 2, -14, 16).float()
    if p_format == "fp32":
        return x
    raise ValueError(f"p_format: {p_format!r} is not one of e4m3, e5m2, bf16, fp32")


def row_sum_correction(
    m_prev: torch.Tensor, m_use: torch.Tensor, c: torch.Tensor, ex2: Callable[[torch.Tensor], torch.Tensor] = exp2_f32
) -> torch.Tensor:
    """Step 8 (the factor): ``corr = ex2((m_prev - m_use) * c)``, one fp32 subtract, one multiply, ex2.

    Args:
        m_prev, m_use: ``(C, G, N)`` float32: the max before the tile, and the exponent reference after it.
        c: ``(C, G)`` float32, as in :func:`softmax_tile`.
        ex2: the ex2 model (:func:`exp2_f32` or :func:`exp2_sm90_f32`).

    Returns:
        float32 ``(C, G, N)``: 0 where ``m_prev`` is -inf (nothing to correct), 1 where the max held.
    """
    return ex2((m_prev - m_use) * c[:, :, None])


def accumulate_row_sum(corr: torch.Tensor, l: torch.Tensor, p_sum: torch.Tensor) -> torch.Tensor:
    """Step 8 (the sums): per key row (thread), ``l = fma(corr, l, p)``.

    Args:
        corr: ``(C, G, N)`` float32 (:func:`row_sum_correction`).
        l: ``(C, G, N, T)`` float32 per-thread row sums (key row i of the tile is thread i).
        p_sum: ``(C, G, N, T)`` the p added to the row sum (the unrounded p in the kernel).

    Returns:
        float32 ``(C, G, N, T)``.
    """
    return fma_f32(corr[..., None], l, p_sum)


def running_column_max(m_in: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step 5 over several consecutive tiles at once: the running column max after each (max is exact, so
    a running maximum over the tiles is the tile-by-tile recurrence, bit for bit).

    Args:
        m_in: ``(C, G, N)`` float32, the max before the first of the tiles.
        s: ``(W, C, G, N, T)`` masked scores of W consecutive tiles of each chunk.

    Returns:
        ``(m_prev, m, m_use)``, each ``(W, C, G, N)``: the max before and after each tile, and the
        exponent reference (0 where the max is still -inf).
    """
    m = torch.cummax(torch.maximum(s.amax(dim=-1), m_in[None]), dim=0).values
    m_prev = torch.cat([m_in[None], m[:-1]])
    return m_prev, m, torch.where(m == -math.inf, torch.zeros_like(m), m)


def rescale_o(o: torch.Tensor, corr: torch.Tensor, m: torch.Tensor, m_prev: torch.Tensor) -> torch.Tensor:
    """Step 8 (O): ``O = fp32(O * corr)`` for the CTAs (chunk, kv head) where some column max moved;
    the others skip the TMEM round trip (every corr is exactly 1 there, so skipping is bit-identical).

    Args: o ``(C, G, N, D)``; corr, m, m_prev ``(C, G, N)``.
    """
    moved = (m != m_prev).any(dim=-1)  # (C, G), warpgroup-uniform in the kernel
    if not _sync_free(o) and not bool(moved.any()):
        return o
    return torch.where(moved[..., None, None], o * corr[..., None], o)


def accumulate_pv(
    o: torch.Tensor,
    p_q: torch.Tensor,
    v_tile: torch.Tensor,
    p_sig_bits: Optional[int],
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Step 9, GEMM2 and the accumulate into tensor memory: ``O = fp32(O + V.P)``, the tile's exact
    contraction added to the accumulator with ONE rounding (model 1: the accumulator is one more addend).

    Args:
        o: ``(C, G, N, D)`` float32 accumulator (already rescaled by the correction).
        p_q: ``(C, G, M, T)`` rounded P values, M >= N (rows past N: zero padding, dropped).
        v_tile: ``(C, G, T, D)`` float values the MMA reads.
        p_sig_bits: None for narrow P (e4m3: the float64 GEMM is exact); 8 (bf16), 3 (e5m2) or 24 (fp32)
            for wide P, settled by :func:`verified_f32` and :func:`exact_dot_f32`.
        out: optional float64 ``(C, G, M, D)`` buffer for the GEMM.

    Returns:
        float32 ``(C, G, N, D)``.
    """
    n = o.shape[-2]
    p64, v64 = p_q.double(), v_tile.double()
    y = torch.matmul(p64, v64, out=out)[..., :n, :]
    if p_sig_bits is None:
        return add_round_f32(o, y)
    p_rows = p64[..., :n, :]
    p_norm = row_norm(p_rows, -1)[..., :, None]
    v_norm = NARROW_MAX * math.sqrt(v64.shape[-2])  # a bound on every column's norm
    grid = grid_exponent(p_rows, p_sig_bits)[..., :, None] + NARROW_GRID_EXP
    return settle_f32(y, p_norm, v_norm, grid, p_rows, v64.transpose(-1, -2), o)


def accumulate_pv_mma(o: torch.Tensor, p_q: torch.Tensor, v_tile: torch.Tensor, model, groups: torch.Tensor):
    """Step 9 under a hardware MMA model: ``O += V . P`` as the kernel's chain of MMA instructions adds the
    tile into the fp32 accumulator, one instruction per row of ``groups`` (the keys it adds, in issue
    order), each result the next one's accumulator.

    Args:
        o: ``(C, G, N, D)`` float32 accumulator (already rescaled); p_q: ``(C, G, M, T)`` rounded P, M >= N;
        v_tile: ``(C, G, T, D)`` float values; model, groups: as :func:`score_tile_mma`.

    Returns:
        float32 ``(C, G, N, D)``.
    """
    return chain_gemm(p_q[..., : o.shape[-2], :], v_tile.transpose(-1, -2), o, groups, model)


def reduce_row_sum(l: torch.Tensor, warp: int = 32) -> torch.Tensor:
    """Step 10 (row sum): butterfly over the 32 lanes of each warp (xor 16, 8, 4, 2, 1, in fp32),
    then ``w0 + w1 + w2 + w3`` left to right.

    Args:
        l: ``(..., T)`` float32 per-thread sums, T = 128 (thread i = key row i).

    Returns:
        float32 ``(...)``.
    """
    t = l.shape[-1]
    v = l.reshape(*l.shape[:-1], t // warp, warp)
    width = warp
    while width > 1:  # lane i adds lane i ^ (width / 2): as a tree, the halves of each group
        width //= 2
        v = v[..., :width] + v[..., width : 2 * width]
    w = v[..., 0]
    total = w[..., 0]
    for i in range(1, w.shape[-1]):
        total = total + w[..., i]
    return total


def epilogue(
    o: torch.Tensor,
    m: torch.Tensor,
    l_sum: torch.Tensor,
    cta_scale: torch.Tensor,
    out_scale: torch.Tensor,
    part_scale: torch.Tensor,
    lse_scale: Optional[torch.Tensor] = None,
    lse_log: Callable[[torch.Tensor], torch.Tensor] = log_f32,
) -> dict:
    """Step 10: the per-CTA epilogue.

    Args:
        o: ``(C, G, N, D)`` float32 accumulator; m: ``(C, G, N)`` raw column max; l_sum: ``(C, G, N)``
            reduced row sum.
        cta_scale: ``(C, G)`` ``scale_qs * q_descale * k_descale`` (LSE units per raw S unit).
        out_scale: ``(C, G)`` ``scale_o * v_descale * (1 / p_scale)``; part_scale ``(C, G)``
            ``v_descale * (1 / p_scale)``.
        lse_log: the log of the LSE (natural by default).

    Returns:
        dict with ``o_final`` (float32 ``O * (out_scale / (l + 1e-30))``, before the bf16 store),
        ``lse`` (``m_out + log(l)``), and the split partials ``o_part`` (``O * part_scale``), ``m_part``
        (``m_out``), ``l_part`` (``l``); callers pick by whether the chunk's sequence is split.
    """
    m_out = mul_f32(m, (cta_scale if lse_scale is None else lse_scale)[..., None])  # not fused into the + below
    l_eps = l_sum + torch.tensor(1e-30, dtype=torch.float32, device=l_sum.device)
    inv_l = div_f32(out_scale[..., None], l_eps)
    o_final = o * inv_l[..., None]
    lse = m_out + lse_log(l_sum)
    o_part = o * part_scale[..., None, None]
    return {"o_final": o_final, "lse": lse, "o_part": o_part, "m_part": m_out, "l_part": l_sum}


def reduction(
    o_part: torch.Tensor,
    m_part: torch.Tensor,
    l_part: torch.Tensor,
    scale_o: float,
    weight_log2: float = LOG2E_F32,
    lse_log: Callable[[torch.Tensor], torch.Tensor] = log_f32,
    ex2: Callable[[torch.Tensor], torch.Tensor] = exp2_f32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 11: merge the split partials of the sequences with more than one chunk.

    Args:
        o_part: ``(B, J, G, N, D)`` float32 partials in split order (absent splits: 0);
        m_part: ``(B, J, G, N)`` (absent: -inf); l_part: ``(B, J, G, N)`` (absent: 0).
        scale_o: the output scale (fp32 value).
        weight_log2: ``log2(e)`` as fp32 (1.0 for base-2 LSE).
        lse_log: the LSE's log model; ex2: the ex2 model of the weights.

    Returns:
        ``(o float32 (B, G, N, D) before the bf16 store, lse float32 (B, G, N))``:
        ``m_max = max_j m_j``; ``w_j = ex2(log2e * (m_j - m_max))`` (0 where m_j = -inf);
        ``l = sum_j w_j l_j`` and ``o = sum_j w_j o_j`` in split order (one fma per term);
        ``o = scale_o * o * (1 / l)`` (0 where l is 0); ``lse = m_max + log(l)``.
    """
    m_max = m_part.amax(dim=1)
    w = ex2(weight_log2 * (m_part - m_max[:, None]))
    w = torch.where(m_part == -math.inf, torch.zeros_like(w), w)
    l_acc = torch.zeros_like(l_part[:, 0])
    o_acc = torch.zeros_like(o_part[:, 0])
    for j in range(o_part.shape[1]):
        l_acc = fma_f32(w[:, j], l_part[:, j], l_acc)
        o_acc = fma_f32(w[:, j, ..., None], o_part[:, j], o_acc)
    inv_l = torch.where(l_acc > 0, div_f32(torch.ones_like(l_acc), torch.where(l_acc > 0, l_acc, 1.0)), 0.0)
    so = torch.tensor(scale_o, dtype=torch.float32, device=o_acc.device)
    o = (so * o_acc) * inv_l[..., None]
    lse = m_max + lse_log(l_acc)
    return o, lse
