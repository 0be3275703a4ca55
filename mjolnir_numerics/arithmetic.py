"""The GPUs' own arithmetic, as data and exact models: tensor-core block FMAs and special functions.

The ideal models of the spec (an exact dot product rounded once; correctly rounded exp2 and log) are the
arithmetic of the math. The hardware models here are the arithmetic of the chips, bit for bit:

**Tensor-core MMA** (Khattak and Mikaitis, "Accurate Models of NVIDIA Tensor Cores", arXiv 2512.07004,
2025; the models of their MATLAB-tensor-core repository). One MMA instruction of K products is one fused
block: with E the largest of the products' unnormalised exponents ``ea + eb`` (``ea`` = floor(log2 |a|),
at least the operand format's smallest normal exponent; zero products left out) and of the accumulator
c's exponent (at least -126), and E at least ``min_exponent``, every product and c is truncated toward
zero to a multiple of g = 2^(E - 23 - extra_bits); the truncated terms are added exactly; the sum is
rounded toward zero to fp32 (subnormals kept). A zero sum is +0. Successive instructions chain: each
result, already fp32, is the next one's c.

Exactness of this implementation (vectorised torch, float64, CPU and CUDA alike): each product of two
operands of at most 11 significant bits is exact in float64; a term truncated to the grid g is
``trunc(x / g)`` grid units, exact (a multiplication by the power of two 1 / g, built from its bits, keeps
x a normal float64, and the conversion to int64 truncates toward zero); every term is below 2^(27 + 1)
units in magnitude and at most 33 terms are added, so their int64 sum is below 2^34 units, and times g it
is an exact float64. The fp32 rounding toward zero keeps the top 24 bits of that exact sum
(``round_toward_zero_f32``, by clearing float64 fraction bits). So the result is the model's, bit for bit.
The products' exponents are those of the operands, added after broadcasting (a zero operand's exponent
pushed out of the max and min), so the (..., M, T, K) products of a GEMM tile cost no frexp.

Fast path (``block_fma`` with ``fast=True``): when no term loses a bit to the alignment, the truncation is
the identity and the block equals the exact sum rounded toward zero. (The test below uses a lower bound of
the products' smallest exponent, the operands' smallest ones added, so it may send an element the slow way
that could have gone fast; the result is the same.) A product a_i b_i is a multiple of
2^(ea_i + eb_i - 2 m) (m: the operand's fraction bits), so it keeps every bit when E - (ea_i + eb_i) <=
23 + extra_bits - 2 m; c is a multiple of 2^(ec - 23), kept when E - ec <= extra_bits. Where both hold for
every term of an output element, that element is computed as a float64 dot product (exact: every product
is a multiple of 2^(E - 23 - extra_bits) and the sum stays below 2^53 of that unit) rounded toward zero.

On CUDA the chains are compiled formulas with no tensor of products: :func:`_int_chain` on operands packed
as integer significands and exponents (:func:`pack_operands`; the S chains) and :func:`_chain_formula` in
float64 (the P.V chains, where it measured faster: one tile's 131K outputs do not fill the GPU); both are
the block model above, tested against :func:`block_fma`.

Special values: a NaN operand or product gives NaN (the decode kernels produce none); infinities are not
modelled (their inputs are finite).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .fused import available, compiled_many

__all__ = [
    "MmaModel", "MMA_MODELS", "OPERAND_FORMATS", "WALKS", "block_fma", "ideal_block", "round_toward_zero_f32",
    "round_nearest_f32", "round_nearest_grid",
    "kstep_groups", "chain_fma", "chain_gemm", "fused_chain_available",
]  # fmt: skip

# operand format -> (fraction bits, smallest normal exponent)
OPERAND_FORMATS = {"f16": (10, -14), "bf16": (7, -126), "e4m3": (3, -6)}


@dataclass(frozen=True)
class MmaModel:
    """One MMA instruction's arithmetic.

    Attributes:
        name: registry name.
        operand: operand format (``OPERAND_FORMATS``): the products' inputs as the tensor core reads them.
        block: products per instruction, all added in one fused block (its K).
        extra_bits: alignment bits kept below fp32's 23 fraction bits, from the block's exponent E.
        min_exponent: E is at least this.
        exact_sum: the ideal model instead: the exact sum of the products and c, rounded once to nearest.
        verified: where this model was checked bit for bit against the silicon (empty: predicted only).
    """

    name: str
    operand: str
    block: int
    extra_bits: int = 2
    min_exponent: int = -133
    exact_sum: bool = False
    verified: str = ""


MMA_MODELS = {
    m.name: m
    for m in (
        # Hopper mma.sync.m16n8k16 with fp32 accumulate: one block of 16 products and c (H100 model)
        MmaModel("sm90_f16", "f16", 16, verified="H200, benchmarks.probes.arithmetic_sweep"),
        MmaModel("sm90_bf16", "bf16", 16, verified="H200, benchmarks.probes.arithmetic_sweep"),
        # Blackwell tcgen05 (B200 model; Thor is Blackwell): kind::f16 K = 16, kind::f8f6f4 K = 32
        MmaModel("sm100_f16", "f16", 16),
        MmaModel("sm100_bf16", "bf16", 16),
        MmaModel("sm100_e4m3", "e4m3", 32),
        # the ideal arithmetic: exact dot product, rounded once (the spec's research knob)
        MmaModel("ideal_f16", "f16", 1 << 30, exact_sum=True),
        MmaModel("ideal_bf16", "bf16", 1 << 30, exact_sum=True),
        MmaModel("ideal_e4m3", "e4m3", 1 << 30, exact_sum=True),
    )
}


def _exponent(x: torch.Tensor, emin: int) -> torch.Tensor:
    """floor(log2 |x|), at least ``emin`` (int64; any value for x = 0: callers mask zeros)."""
    _, e = torch.frexp(x)
    return torch.clamp(e.to(torch.int64) - 1, min=emin)


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """``2.0 ** e`` as float64 from its bits, for int64 ``e`` in [-1022, 1023]: exact on every device."""
    return ((e + 1023) << 52).view(torch.float64)


def round_toward_zero_f32(x: torch.Tensor) -> torch.Tensor:
    """float64 ``x`` rounded toward zero to fp32 (subnormals kept, finite overflow to +-inf), as float32.

    Where fp32 is normal (|x| >= 2^-126) this clears the 29 float64 fraction bits below fp32's 23 (the
    magnitude truncated: toward zero); below, it truncates x to a multiple of 2^-149."""
    x = x.contiguous()
    normal = (x.view(torch.int64) & ~((1 << 29) - 1)).view(torch.float64)
    sub = torch.trunc(x * 2.0**149) * 2.0**-149
    out = torch.where(x.abs() >= 2.0**-126, normal, sub)
    out = torch.where(out.abs() >= 2.0**128, torch.copysign(torch.full_like(out, math.inf), out), out)
    out = torch.where(out == 0, torch.zeros_like(out), out)  # a zero sum is +0
    return torch.where(torch.isnan(x), x, out).to(torch.float32)


_F64_INF = 0x7FF0000000000000
_F64_SIGN = -(1 << 63)


def round_nearest_grid(x: torch.Tensor, man_bits: int, min_exp: int, overflow_exp: int) -> torch.Tensor:
    """float64 ``x`` rounded to nearest, ties to even, on the grid of a binary format with ``man_bits`` fraction
    bits, smallest normal exponent ``min_exp`` (subnormals below, steps of ``2^(min_exp - man_bits)``) and
    ``2^overflow_exp`` the first magnitude that is infinite; NaN and the sign of zero kept. ``x``: float64, any
    shape; returns float64 of the same shape (the rounded values, each exact in the format), computed in
    integer operations on the bits. fp32 is ``(23, -126, 128)``, bf16 ``(7, -126, 128)``, e5m2 ``(2, -14, 16)``.

    Where the format is normal the float64 fraction bits below its ``man_bits`` are rounded away with ties to
    even on the magnitude's bits (a carry runs into the exponent, and from ``2^overflow_exp`` on the result is
    inf); below, ``|x| 2^(man_bits - min_exp)`` is rounded to an integer (``torch.round``: ties to even, exact)
    and scaled back.

    Raises:
        TypeError: ``x`` is not float64 (its bits are read as float64's).
    """
    if x.dtype != torch.float64:
        raise TypeError(f"x: expected float64, got {x.dtype}")
    drop = 52 - man_bits
    bits = x.contiguous().view(torch.int64)
    mag = bits & ~_F64_SIGN
    normal = (mag + ((1 << (drop - 1)) - 1) + ((mag >> drop) & 1)) & ~((1 << drop) - 1)
    normal = torch.where(normal >= (1023 + overflow_exp) << 52, _F64_INF, normal)
    step = man_bits - min_exp
    sub = (torch.round(mag.view(torch.float64) * 2.0**step) * 2.0**-step).view(torch.int64)
    out = torch.where(mag >= (1023 + min_exp) << 52, normal, sub)
    out = torch.where(mag > _F64_INF, mag, out)  # NaN: kept
    return (out | (bits & _F64_SIGN)).view(torch.float64)


def round_nearest_f32(x: torch.Tensor) -> torch.Tensor:
    """float64 ``x`` rounded to nearest fp32, ties to even (subnormals kept, overflow to +-inf, NaN kept, the
    sign of zero kept), as float32: what ``x.float()`` gives, written in integer operations on the bits
    (:func:`round_nearest_grid`).

    Why not ``x.float()``: in a compiled graph a float32 result that the next operation widens again can lose
    its rounding. Inductor's ``pointless_convert`` pass (torch 2.11, the device's) rewrites
    ``float64 -> float32 -> float64`` as no conversion at all, so a chain of emulated fp32 operations (the
    fma of the row sum, libdevice's log polynomial, the split merge) would run in float64. This rounding is
    integer arithmetic no pass removes; the final conversion is exact, so dropping it changes nothing.

    Raises:
        TypeError: ``x`` is not float64.
    """
    return round_nearest_grid(x, 23, -126, 128).to(torch.float32)


def ideal_block(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The exact sum of ``a * b`` over the last dim plus ``c``, rounded once to nearest fp32 (float64 holds
    it exactly for the operands here: products of <= 11-bit operands over a bounded exponent range)."""
    return ((a * b).sum(-1) + c.double()).to(torch.float32)


def _truncated_sum(prod: torch.Tensor, c: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """``sum_k trunc(prod_k / 2^unit) 2^unit + trunc(c / 2^unit) 2^unit`` in float64, exactly: scaling by
    a power of two keeps every value a normal float64, the conversion to int64 truncates toward zero, and
    the integer sum (below 2^34 grid units: the module docstring) converts back exactly."""
    down = _pow2(-unit)
    units = (prod * down[..., None]).to(torch.int64).sum(-1) + (c * down).to(torch.int64)
    return units.double() * _pow2(unit)


def block_fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, model: MmaModel, fast: bool = True) -> torch.Tensor:
    """One MMA block under ``model``: fp32 ``c + sum_k a[..., k] * b[..., k]`` as the tensor core forms it.

    Args:
        a, b: float64 ``(..., K)`` operand values, each exactly representable in ``model.operand``;
            K <= ``model.block`` (missing products are zeros).
        c: float32 ``(...)``: the accumulator (the previous instruction's result, or 0).
        model: an :class:`MmaModel`.
        fast: compute elements no alignment can change as an exact dot product (the module docstring's
            proof); the result is the same either way.

    Returns:
        float32 ``(...)``.
    """
    if a.shape[-1] > model.block:
        raise ValueError(f"a: {a.shape[-1]} products per block, the {model.name} model takes {model.block}")
    if model.exact_sum:
        return ideal_block(a, b, c)
    man, emin = OPERAND_FORMATS[model.operand]
    a, b = a.double(), b.double()
    shape = torch.broadcast_shapes(a.shape, b.shape)
    # exponents of the operands before they are broadcast: a (..., M, 1, K) and b (..., 1, T, K) in the
    # decode's GEMMs, so the (..., M, T, K) products' exponents cost one int add, not two frexps
    # (a zero operand gets an exponent far below (above) every other, so its products drop out of the max
    # (min); a product is 0 exactly when an operand is: the products of the operands are exact)
    low, high = -(1 << 20), 1 << 20
    ea, eb = _exponent(a, emin).to(torch.int32), _exponent(b, emin).to(torch.int32)
    e_prod = (torch.where(a == 0, low, ea) + torch.where(b == 0, low, eb)).amax(-1).long()
    c64 = c.double().expand(shape[:-1])
    prod = a * b
    ec = _exponent(c64, -126)
    e_c = torch.where(c64 != 0, ec, low)
    big = torch.maximum(torch.maximum(e_prod, e_c), torch.full_like(e_prod, model.min_exponent))
    unit = big - 23 - model.extra_bits  # the grid: 2^unit
    if fast:
        # a lower bound of the smallest product exponent: the operands' smallest, added (no broadcast);
        # a bound keeps fewer elements on the fast path than the exact minimum would, never a wrong one
        e_min = torch.where(a == 0, high, ea).amin(-1) + torch.where(b == 0, high, eb).amin(-1)
        spread = big - e_min.long()  # very negative where no product: kept
        keep = (spread <= 23 + model.extra_bits - 2 * man) & ((c64 == 0) | (big - ec <= model.extra_bits))
    else:
        keep = torch.zeros_like(big, dtype=torch.bool)
    n_keep = int(keep.sum())
    if 2 * n_keep < keep.numel():  # mostly truncating: the model's own formula everywhere, no gathers
        result = round_toward_zero_f32(_truncated_sum(prod, c64, unit))
    else:
        result = torch.empty(shape[:-1], dtype=torch.float32, device=a.device)
        result[keep] = round_toward_zero_f32(prod[keep].sum(-1) + c64[keep])
        slow = ~keep
        if n_keep < keep.numel():
            result[slow] = round_toward_zero_f32(_truncated_sum(prod[slow], c64[slow], unit[slow]))
    nan = torch.isnan(a).any(-1) | torch.isnan(b).any(-1) | torch.isnan(c64)  # a NaN operand: a NaN product
    return torch.where(nan, torch.full_like(result, math.nan), result)


# -- the tile walks: which head dims (GEMM1) and keys (GEMM2) each MMA instruction of a tile adds -------
WALKS = ("mma_sync_sm90", "tcgen05")
SCALED_FORMATS = ("e2m1", "e3m2", "e2m3")


def kstep_groups(walk: str, kv_format: str, q_dtype: str, head_dim: int, tile_keys: int = 128):
    """The MMA instructions of one tile, in issue order: ``(s_groups, pv_groups)``, int64 ``(steps, K)``
    index tensors (CPU): the head dims whose products one S instruction adds, and the keys one P.V
    instruction adds. Within an instruction the order does not matter (one fused block); across
    instructions it does (each result is the next one's accumulator).

    ``"mma_sync_sm90"`` (the Hopper kernel, K = 16): S from an e4m3 K tile in shared memory (e4m3 KV; fp6
    at d = 128 and NVFP4, converted by the converter warps) adds head dims 16 s .. 16 s + 15 in step s; with
    K converted straight into the fragments (e2m1, and fp6 at d = 256: ``HopperConfig.k_registers``) lane c
    of a quad holds head dims c d / 4 .. (c + 1) d / 4 - 1, four per step: dims c d / 4 + 4 s .. + 3 for
    fp6; for e2m1, whose codes skip the interleave, the even (s even) or odd (s odd) dims of c d / 4 + 8
    (s // 2) .. + 7. P.V adds keys 16 s .. 16 s + 15 in step s.
    ``"tcgen05"`` (the Thor kernel; predicted, not run on Thor silicon): K = 32 on the e4m3-Q path and 16 on
    the bf16-Q path, consecutive head dims for S and consecutive keys for P.V.
    """
    if walk == "mma_sync_sm90":
        k = 16
        registers = kv_format == "e2m1" or (kv_format in SCALED_FORMATS and head_dim != 128)
        steps = head_dim // k
        if not registers:
            s_groups = torch.arange(head_dim).view(steps, k)
        else:
            span = head_dim // 4
            lane = torch.arange(4)[:, None] * span  # (4 lanes, 1)
            rows = []
            for st in range(steps):
                if kv_format == "e2m1":
                    dims = lane + 8 * (st // 2) + 2 * torch.arange(4)[None, :] + st % 2
                else:
                    dims = lane + 4 * st + torch.arange(4)[None, :]
                rows.append(dims.reshape(-1))
            s_groups = torch.stack(rows)
        pv_groups = torch.arange(tile_keys).view(tile_keys // k, k)
        return s_groups, pv_groups
    if walk == "tcgen05":
        k = 32 if q_dtype == "e4m3" else 16
        return torch.arange(head_dim).view(head_dim // k, k), torch.arange(tile_keys).view(tile_keys // k, k)
    raise ValueError(f"walk: {walk!r} is not one of {WALKS}")


def chain_fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, groups: torch.Tensor, model: MmaModel) -> torch.Tensor:
    """A chain of MMA instructions: ``c`` then, for each row of ``groups`` in order, one :func:`block_fma`
    over those indices of the last dim of ``a`` and ``b`` (broadcast against each other), its result the
    next instruction's accumulator. float32 ``c.shape``."""
    if model.exact_sum:  # the ideal arithmetic adds the whole contraction at once
        return ideal_block(a, b, c)
    groups = groups.to(a.device)
    for g in groups:
        c = block_fma(a.index_select(-1, g), b.index_select(-1, g), c, model)
    return c


# -- the GEMM form of a chain, fused: no (..., M, N, K) tensor of products ------------------------------
def _exponent_bits(x: torch.Tensor) -> torch.Tensor:
    """floor(log2 |x|) of a nonzero normal float64 ``x`` from its exponent field (int64)."""
    return ((x.view(torch.int64) >> 52) & 0x7FF) - 1023


def _chain_formula(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, extra_bits: int, min_exponent: int, emin: int):
    """The block model of the module docstring, instruction after instruction, in its plainest form: for
    step s, ``E = max(max_k (ea + eb), ec, min_exponent)``, every term truncated to ``2^(E - 23 -
    extra_bits)``, the exact integer sum, rounded toward zero.

    ``a (..., M, S, K)``, ``b (..., N, S, K)`` float operands (step s adds ``a[..., s, :] . b[..., s, :]``),
    ``c (..., M, N)`` float32. Every operation is exact, so any evaluation order and any fusion (this
    function is what ``torch.compile`` fuses on CUDA) gives the same bits as :func:`block_fma`: the products
    of <= 11-bit operands are exact float64, scaling by a power of two is exact, a float64 ``trunc`` of a
    value below 2^53 is exact, and the sum of at most K + 1 integers below 2^28 is an exact float64 in
    any order. NaN operands give NaN (the products and the sum carry it).
    """
    low = -(1 << 20)
    a, b = a.double(), b.double()  # exact widening, inside the fused kernel (no float64 copy in memory)
    ea = torch.where(a == 0, low, torch.clamp(_exponent_bits(a), min=emin))
    eb = torch.where(b == 0, low, torch.clamp(_exponent_bits(b), min=emin))
    for s in range(a.shape[-2]):
        a_s, b_s = a[..., :, None, s, :], b[..., None, :, s, :]
        e_prod = (ea[..., :, None, s, :] + eb[..., None, :, s, :]).amax(-1)
        c64 = c.double()
        e_c = torch.where(c64 != 0, torch.clamp(_exponent_bits(c64), min=-126), low)
        unit = torch.clamp(torch.maximum(e_prod, e_c), min=min_exponent) - 23 - extra_bits
        down = _pow2(-unit)
        units = torch.trunc(a_s * b_s * down[..., None]).sum(-1) + torch.trunc(c64 * down)
        c = round_toward_zero_f32(units * _pow2(unit))
    return c


# -- the fused chain in 32-bit integers: what CUDA compiles ----------------------------------------------
# An operand is packed once as the int32 ``e * 2^16 + (m + 2^15)``: e its block-model exponent
# (floor(log2 |x|), at least the operand format's smallest normal exponent) and m = x 2^(10 - e) its
# signed integer significand (|m| < 2^11 for every value exact in f16, bf16 or e4m3, subnormals
# included: such a value is a multiple of 2^(e - 10)). A product is then m_a m_b 2^(e_a + e_b - 20), and
# its term on the grid 2^(E - 23 - extra_bits) is ``(|m_a m_b| << (3 + extra_bits)) >> (E - e_a - e_b)``
# with the sign put back: a truncation toward zero done by an integer shift, exact by construction.
_ZERO_E = -(1 << 13)  # a zero operand's e: its products sit far below every block's E (and add 0)
_NAN_E = 1 << 14  # a NaN or infinite operand's e: every product with it lifts E past _NAN_LIMIT
_NAN_LIMIT = 1 << 12
_SIG = 10


def pack_operands(x: torch.Tensor, operand: str) -> torch.Tensor:
    """MMA operands ``x`` (any float dtype; values exact in the model's ``operand`` format) packed as
    int32 ``e * 2^16 + (m + 2^15)`` (the block above): the form :func:`_int_chain` reads. Same shape."""
    emin = OPERAND_FORMATS[operand][1]
    x64 = x.double()
    _, fe = torch.frexp(x64)
    e = torch.clamp(fe.to(torch.int32) - 1, min=emin)
    m = (x64 * _pow2((_SIG - e).long())).to(torch.int32)
    finite = torch.isfinite(x64)
    e = torch.where(x64 == 0, _ZERO_E, torch.where(finite, e, _NAN_E))
    return e * 65536 + (torch.where(finite, m, 0) + 32768)


_E4M3_PACKED: dict = {}


def _gather(codes: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``table[codes]``: uint8 codes to their packed operands (one compiled gather on CUDA)."""
    return table[codes.long()]


def e4m3_packed_table(operand: str, device) -> torch.Tensor:
    """int32 ``(256,)``: :func:`pack_operands` of every e4m3 code's value (NaN codes included), made once
    per operand format and device."""
    key = (operand, str(device))
    if key not in _E4M3_PACKED:
        codes = torch.arange(256, dtype=torch.uint8, device=device)
        _E4M3_PACKED[key] = pack_operands(codes.view(torch.float8_e4m3fn).float(), operand)
    return _E4M3_PACKED[key]


def pack_fused(x: torch.Tensor, operand: str) -> torch.Tensor:
    """:func:`pack_operands` as CUDA runs it (one compiled pass; float8 e4m3 operands through a 256-entry
    table of their packed values, since Triton cannot compile float8 inside the graph)."""
    if x.dtype == torch.float8_e4m3fn:
        return _fused(_gather)(x.view(torch.uint8), e4m3_packed_table(operand, x.device))
    return _fused(pack_operands)(x, operand)


def _int_chain(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, model_name: str) -> torch.Tensor:
    """:func:`_chain_formula` on packed operands (:func:`pack_operands`), every product's work in 32-bit
    integers: ``a (..., M, S, K)``, ``b (..., N, S, K)`` int32 (step s adds ``a[..., s, :] . b[..., s,
    :]``), ``c (..., M, N)`` float32; returns float32 ``(..., M, N)``, the same bits.

    Per step: ``E = max(max_k (e_a + e_b), e_c, min_exponent)``; each product's term is its integer
    significand product shifted (left by 3 + extra_bits, right by E - e_a - e_b: truncation toward zero of
    the magnitude), summed in int32 (at most K * (2^11 - 1)^2 * 2^(3 + extra_bits) < 2^31 for K = 16 and 2
    extra bits; int64 beyond); c's term, the sum's scaling and the rounding toward zero stay per output
    element in float64, as in :func:`_chain_formula`. ``model_name`` is a name, not the model's integers, so
    that a compiled graph holds them as constants."""
    model = MMA_MODELS[model_name]
    if a.shape[-1] != model.block or b.shape[-1] != model.block:  # (compiled: K becomes a constant)
        raise ValueError(
            f"a, b: {a.shape[-1]} and {b.shape[-1]} products per step, the {model_name} model takes {model.block}"
        )
    lift = 23 + model.extra_bits - 2 * _SIG
    wide = model.block * ((2**11 - 1) ** 2 << lift) >= 1 << 31
    for s in range(a.shape[-2]):
        pa, pb = a[..., :, None, s, :], b[..., None, :, s, :]
        e = (pa >> 16) + (pb >> 16)
        # c's exponent from its float32 bits (a subnormal's field is 0: -127, clamped to -126)
        e_c = torch.clamp(((c.contiguous().view(torch.int32) >> 23) & 0xFF) - 127, min=-126)
        e_c = torch.where(c != 0, e_c, _ZERO_E)
        big = torch.clamp(torch.maximum(e.amax(-1), e_c), min=model.min_exponent)
        c64 = c.double()
        p = ((pa & 0xFFFF) - 32768) * ((pb & 0xFFFF) - 32768)
        t = (p.abs() << lift) >> torch.clamp(big[..., None] - e, 0, 31)
        t = torch.where(p < 0, -t, t)
        units = t.to(torch.int64).sum(-1) if wide else t.sum(-1, dtype=torch.int32)
        unit = big.long() - 23 - model.extra_bits
        total = units.double() + torch.trunc(c64 * _pow2(-unit))
        c = round_toward_zero_f32(total * _pow2(unit))
        c = torch.where(big >= _NAN_LIMIT, math.nan, c)
    return c


def _int_chain_codes(a: torch.Tensor, b_codes: torch.Tensor, table: torch.Tensor, c: torch.Tensor, model_name: str):
    """:func:`_int_chain` with ``b`` given as uint8 e4m3 codes ``(..., N, S, K)`` and ``table``
    (:func:`e4m3_packed_table`): compiled, the table lookup is fused into the chain's reduction, so the packed
    int32 ``b`` (four bytes per code) is never written out and read back."""
    return _int_chain(a, _gather(b_codes, table), c, model_name)


# The compile helper is shared with the fused helpers; these names are the emulator's.
fused_chain_available = available
_fused = compiled_many


_INDICES: dict = {}


def index_on(index: torch.Tensor, device) -> torch.Tensor:
    """A small CPU index tensor (a walk's key order) on ``device``, copied there once per process: a copy from
    the host waits for all the work queued on the device, and the emulator asks for the same order every window."""
    key = (tuple(index.tolist()), str(device))
    if key not in _INDICES:
        _INDICES[key] = index.to(device)
    return _INDICES[key]


def in_walk_order(x: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``x (..., steps * k)`` read in the order of a tile's MMA instructions, ``(..., steps, k)``: step s holds
    the indices of row s of ``groups`` (int64 ``(steps, k)``, :func:`kstep_groups`). A view where the groups
    are consecutive, else one gather along the last dim (the order copied to ``x``'s device once)."""
    steps, k = groups.shape
    order = groups.reshape(-1).cpu()
    if not torch.equal(order, torch.arange(order.numel())):
        x = x.index_select(-1, index_on(order, x.device))
    return x.unflatten(-1, (steps, k))


def chain_gemm(
    a_rows: torch.Tensor, b_rows: torch.Tensor, c: torch.Tensor, groups: torch.Tensor, model: MmaModel, fused=None
) -> torch.Tensor:
    """The chain of MMA instructions of one GEMM tile: ``c (..., M, N)`` plus ``a_rows[.., i, :] .
    b_rows[.., j, :]``, one :func:`block_fma` per row of ``groups`` (the contraction indices it adds, in
    issue order), each result the next one's accumulator.

    Args:
        a_rows: float ``(..., M, K)``; b_rows: float ``(..., N, K)`` (broadcastable leading dims); values
            exact in ``model.operand``.
        c: float32 ``(..., M, N)``.
        groups: int64 ``(steps, k)``, each index of ``range(K)`` at most once.
        model: an :class:`MmaModel` (not an ideal one: those add the whole contraction at once).
        fused: evaluate the formula compiled (:func:`_int_chain` on :func:`pack_operands`: one pass over the
            operands per instruction, no tensor of products; a float8 e4m3 ``b_rows`` is packed inside that
            graph, from its codes); None: where :func:`fused_chain_available`. The bits are the same.

    Returns:
        float32 ``(..., M, N)``.

    Raises:
        ValueError: ``model`` is an ideal model; a group of more than ``model.block`` indices (unfused path).
    """
    if model.exact_sum:
        raise ValueError(f"model: {model.name} is an ideal model; chain_gemm takes a hardware one")
    if fused is None:
        fused = fused_chain_available(a_rows.device)
    if not fused:
        a, b = a_rows.double()[..., :, None, :], b_rows.double()[..., None, :, :]
        return chain_fma(a, b, c, groups.to(a_rows.device), model)
    a = in_walk_order(pack_fused(a_rows, model.operand), groups)
    if b_rows.dtype == torch.float8_e4m3fn:  # e4m3 operands (the cache's K): codes, packed inside the graph
        table = e4m3_packed_table(model.operand, b_rows.device)
        b_codes = in_walk_order(b_rows.view(torch.uint8), groups)
        return _fused(_int_chain_codes, True)(a, b_codes, table, c, model.name)
    b = in_walk_order(pack_fused(b_rows, model.operand), groups)
    return _fused(_int_chain, True)(a, b, c, model.name)
