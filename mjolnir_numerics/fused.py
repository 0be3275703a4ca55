"""Fused CUDA paths of the helpers users import: quantize, pack, the NVFP4 encoder and the cache writer.

Each function here is the spec's own formula written as one graph that ``torch.compile`` turns into one
or two kernels on CUDA (Triton), instead of the dozen eager passes over memory of the reference path.
They give the reference functions' bits because they are built only from operations every backend
computes alike:

* integer arithmetic on the inputs' bits (the round-to-odd index of :func:`quantize_f32`, packing);
* table lookups, ``abs``, ``max``, comparisons and selects (exact);
* float32 products of two values (correctly rounded everywhere; no sum follows a product, so nothing can
  be contracted into an FMA), and scaling by a power of two;
* float32 division as ``float32(float64(a) / float64(b))`` (:func:`div_rn`): the float64 quotient of two
  float32 values, rounded once more to float32, is the correctly rounded float32 quotient (53 >= 2 * 24 + 2:
  the second rounding of +, -, *, / and sqrt is then innocuous; S. A. Figueroa, "When is double rounding
  innocuous?", SIGNUM 1995). Triton lowers a float32 ``/`` to the approximate ``div.full.f32``; the
  float64 one is IEEE.

The helpers call them where :func:`available` says (CUDA with Triton, unless ``MJOLNIR_COMPILE=0``); on the
CPU the reference path runs. The tests run these formulas eagerly on the CPU against the reference, and
compiled on the GPU (every float32 bit pattern for the element formats).

The first call of each function on a device compiles it (seconds; torch's inductor cache keeps the result
for later processes).
"""

from __future__ import annotations

import functools
import math
import os

import torch

__all__ = [
    "available",
    "helper_kernels",
    "quantize_codes",
    "pack_any",
    "compiled",
    "for_device",
    "div_rn",
    "quantize_f32",
    "pack_codes",
    "encode_elements",
    "nvfp4_block_scales",
    "nvfp4_codes",
    "nvfp4_codes_packed",
    "nvfp4_decode",
]

_compiled: dict = {}


def available(device) -> bool:
    """Whether the fused paths run on ``device``: CUDA with Triton, unless ``MJOLNIR_COMPILE=0``. The
    reference path gives the same bits everywhere (the tests compare them)."""
    if os.environ.get("MJOLNIR_COMPILE", "1") == "0" or torch.device(device).type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


_HELPERS: list = []  # mjolnir_kernel.helpers once imported (None: not installed)


def helper_kernels(device):
    """``mjolnir_kernel.helpers`` where its directly launched kernels run on ``device`` (CUDA compute
    capability 9.0+ with the CuTe DSL, the ``kernel`` extra; ``MJOLNIR_KERNELS=0`` turns them off), else
    None. They compute this module's formulas, each step by the same exact operation or one that gives the
    same value (tested on every float32 bit pattern and every code), and cost a few microseconds of host time
    per call where a compiled graph's call costs over a hundred (the H200 profile of 2026-12-02)."""
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type != "cuda":
        return None
    if not _HELPERS:
        try:
            from mjolnir_kernel import helpers
        except ImportError:
            helpers = None
        _HELPERS.append(helpers)
    helpers = _HELPERS[0]
    return helpers if helpers is not None and helpers.available(device) else None


def quantize_codes(x: torch.Tensor, lut: torch.Tensor, fmt) -> torch.Tensor:
    """:func:`quantize_f32` of a float32 / float16 / bfloat16 CUDA tensor (any shape) with the fastest path
    on its device: the helper kernel, else the compiled formula."""
    kernels = helper_kernels(x.device)
    if kernels is not None:
        return kernels.quantize_f32(x.float(), lut, fmt)
    return compiled(quantize_f32)(x.reshape(-1), lut).view(x.shape)


def pack_any(codes: torch.Tensor, *, bits: int) -> torch.Tensor:
    """:func:`pack_codes` of valid codes ``(..., d)`` (any rank) with the fastest path on their device: 8 bits
    eagerly (a copy); 4 and 6 bits by the helper kernel, else the compiled formula on rows (CUDA) or the
    eager one. Returns uint8 ``(..., d * bits / 8)``."""
    if bits == 8:  # a copy: torch's own is the fastest
        return pack_codes(codes, bits=8)
    kernels = helper_kernels(codes.device)
    if kernels is not None:
        return kernels.pack_codes(codes, bits=bits)
    rows = codes.reshape(math.prod(codes.shape[:-1]), codes.shape[-1])  # one graph for any rank
    return for_device(pack_codes, codes.device, bits=bits)(rows).view(*codes.shape[:-1], codes.shape[-1] * bits // 8)


# Each helper's graphs share one code object per formula (bit widths, dtypes, broadcast descales and
# size-1 dims each make a variant): torch's default of 8 compiled variants per code object is too few.
_RECOMPILE_LIMIT, _ACCUMULATED_LIMIT = 64, 1024


def _raise_recompile_limits() -> None:
    """Raise torch's recompile limits to at least the helpers' (once, process-wide; never lowered): a
    limit patched around every call would cost more than the call's kernel."""
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, _RECOMPILE_LIMIT)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, _ACCUMULATED_LIMIT)


def compiled(fn, **static):
    """``fn`` compiled once per process, with shapes dynamic, and per value of its ``static`` keyword
    arguments (bit widths, group sizes: the graph branches on them, so each value gets its own graph).
    Returned as compiled: a helper's call is a few microseconds of work, less than a configuration patch
    around it would cost."""
    key = (fn, tuple(sorted(static.items())))
    if key not in _compiled:
        _raise_recompile_limits()
        _compiled[key] = torch.compile(functools.partial(fn, **static) if static else fn, dynamic=True, fullgraph=True)
    return _compiled[key]


def for_device(fn, device, **static):
    """``fn`` with its ``static`` keyword arguments bound: :func:`compiled` where :func:`available` says
    (CUDA), the eager formula elsewhere (the same bits)."""
    return compiled(fn, **static) if available(device) else functools.partial(fn, **static)


def compiled_many(fn, tune: bool = False):
    """``fn`` compiled once per process for many problem shapes and formats (the emulator's graphs): the
    recompile limits are raised from torch's default of 8 for the duration of each call (set and restored
    directly: ``torch._dynamo.config.patch`` costs 15-16 us a call on this project's CPU machine, 7 us this
    way, ``python -m benchmarks.probes.emulator_host_ops``; the emulator makes hundreds of calls). ``tune``:
    with inductor's coordinate descent tuning of its kernels' launch configurations (the MMA chains: 3-4x
    faster on the H200, 2026-12-04; the first compile of each takes longer)."""
    key = (fn, "many", tune)
    if key not in _compiled:
        options = {"coordinate_descent_tuning": True} if tune else None
        graph = torch.compile(fn, dynamic=True, fullgraph=True, options=options)
        cfg = torch._dynamo.config

        def call(*args):
            saved = cfg.recompile_limit, cfg.accumulated_recompile_limit
            cfg.recompile_limit = max(saved[0], 512)
            cfg.accumulated_recompile_limit = max(saved[1], 8192)
            try:
                return graph(*args)
            finally:
                cfg.recompile_limit, cfg.accumulated_recompile_limit = saved

        _compiled[key] = call
    return _compiled[key]


def div_rn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 quotient ``a / b`` of float32 tensors (see the module docstring).

    Compiled for CUDA, a quotient that feeds another float64 operation in the same graph loses its float32
    rounding: inductor's Triton code keeps the chain in float64 (and a bitcast round trip does not stop
    it), so no compiled graph here chains two of them (see :func:`nvfp4_block_scales`)."""
    return (a.double() / b.double()).float()


def quantize_f32(x: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Codes of float32 ``x`` through the round-to-odd table ``lut`` (uint8 ``(65536,)``, the quantizer's
    own): ``lut[round_to_odd_bf16_bits(x)]``, one integer formula per element (float16 / bfloat16 are
    widened exactly first). Same shape, uint8."""
    b = x.float().contiguous().view(torch.int32)
    t = ((((b & 0xFFFF) + 0xFFFF) | b) >> 16) & 0xFFFF  # bit 16 set iff any low bit was: the sticky bit
    return lut[t]


def pack_codes(codes: torch.Tensor, *, bits: int) -> torch.Tensor:
    """:func:`~mjolnir_numerics.packing.pack` of valid codes ``(..., d)`` (no range check): uint8 bytes."""
    if bits == 8:
        return codes.to(torch.uint8).clone()  # never the input itself
    c = codes.to(torch.int32)
    if bits == 4:
        c = c.unflatten(-1, (c.shape[-1] // 2, 2))
        return (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)
    c = c.unflatten(-1, (c.shape[-1] // 4, 4))
    word = c[..., 0] | (c[..., 1] << 6) | (c[..., 2] << 12) | (c[..., 3] << 18)  # 24-bit little-endian word
    return torch.stack([word & 0xFF, (word >> 8) & 0xFF, word >> 16], dim=-1).flatten(-2).to(torch.uint8)


def encode_elements(x: torch.Tensor, descale: torch.Tensor, lut: torch.Tensor, *, bits: int) -> torch.Tensor:
    """What the cache writer stores for element formats: ``pack(quantize(x.float() / descale))``.

    ``x`` float ``(..., d)``, ``descale`` float32 broadcastable to ``x.shape[:-1] + (1,)``; returns uint8
    ``(..., d * bits / 8)``.
    """
    return pack_codes(quantize_f32(div_rn(x.float(), descale), lut), bits=bits)


def _literal_group(group):
    """NVFP4's block of 16 as a literal: a group traced as a symbol would make the block reduction a
    looped one (the H200 profile of 2026-12-02 showed the looped NVFP4 encoder at 480 us for 16M values)."""
    return 16 if group == 16 else group


def nvfp4_block_scales(x, g, floor, *, group: int, divisor: float):
    """NVFP4 block scales before their e4m3 rounding, ``max(amax(block) / divisor / g, floor)`` with each
    division rounded to float32, float32 ``(..., d // group)``, of ``x (..., d)`` under ``g`` (float32,
    broadcastable to ``x.shape[:-1] + (1,)``); ``floor`` a float32 tensor of shape ``()`` or None.

    Always run eagerly, on every device: compiled for CUDA, the rounding of ``amax / divisor`` to float32
    vanished (inductor's Triton code divided its float64 value by ``g`` and rounded once), which moved a
    block scale exactly at a tie (``(amax / 6) / g`` = 136: e4m3 128 eagerly, 144 compiled; the H200,
    2026-12-03, ``benchmarks/probes/cpu_vs_cuda.py``). The codes that follow are compiled
    (:func:`nvfp4_codes`); the two are the encoder of ``nvfp4_quantize`` (``divisor`` 6; ``four_over_six``
    also tries 4)."""
    group = _literal_group(group)
    xg = x.float().unflatten(-1, (x.shape[-1] // group, group))
    scaled = div_rn(div_rn(xg.abs().amax(-1), torch.full_like(g, divisor)), g)
    return scaled if floor is None else torch.maximum(scaled, floor)


def nvfp4_codes(x, g, scaled, e4m3_lut, e2m1_lut, e4m3_values, *, group: int):
    """NVFP4 codes of ``x (..., d)`` (float32, or float16 / bfloat16 widened exactly) under global scales
    ``g`` (float32, broadcastable to ``x.shape[:-1] + (1,)``) and the block scales ``scaled`` of
    :func:`nvfp4_block_scales`: ``e2m1(x / (fp32(e4m3(scaled)) * g))``.

    Args:
        e4m3_lut, e2m1_lut: the quantizers' round-to-odd tables; e4m3_values: the e4m3 code values.

    Returns:
        ``(codes (..., d), scale codes (..., d // group))`` uint8.
    """
    group = _literal_group(group)
    xg = x.float().unflatten(-1, (x.shape[-1] // group, group))
    scale_codes = quantize_f32(scaled, e4m3_lut)
    total = e4m3_values[scale_codes.long()].unsqueeze(-1) * g.unsqueeze(-1)
    ratio = torch.where(total > 0, div_rn(xg, torch.where(total > 0, total, 1.0)), 0.0)
    return quantize_f32(ratio, e2m1_lut).flatten(-2), scale_codes


def nvfp4_codes_packed(x, g, scaled, e4m3_lut, e2m1_lut, e4m3_values, *, group: int):
    """:func:`nvfp4_codes` with the codes packed two per byte, ``(..., d // 2)``."""
    codes, scale_codes = nvfp4_codes(x, g, scaled, e4m3_lut, e2m1_lut, e4m3_values, group=group)
    return pack_codes(codes, bits=4), scale_codes


def nvfp4_decode(codes, scale_codes, g, e4m3_lut, e4m3_values, e2m1_values, *, group: int, shift: float):
    """An NVFP4 tensor's dequantized values ``code * scale * g`` and the convert stage's kernel values
    ``e4m3(code * scale * shift)``, float32 ``(..., d)`` each, from codes ``(..., d)``, scale codes
    ``(..., d // group)`` and ``g`` broadcastable to ``codes.shape[:-1] + (1,)``."""
    group = _literal_group(group)
    c = e2m1_values[codes.long()].unflatten(-1, (codes.shape[-1] // group, group))
    s = e4m3_values[scale_codes.long()].unsqueeze(-1)
    values = (c * s * g.unsqueeze(-1)).flatten(-2)
    kernel = e4m3_values[quantize_f32(c * s * shift, e4m3_lut).long()].flatten(-2)
    return values, kernel
