"""NVFP4: e2m1 codes, one e4m3 scale per 16 elements along the last dim, and an fp32 global scale.

The default recipe is the one torchao, NVIDIA ModelOpt and TRT-LLM share (all arithmetic in fp32):

1. global scale ``g = amax(x) / (6 * 448)`` (the decode multiplier);
2. block scale ``s = e4m3_rne_sat((amax(block) / 6) / g)``;
3. codes ``q = e2m1_rne_sat(x / (fp32(s) * g))``; a value decodes as ``q * s * g``.

The Thor kernel does not multiply by the scale inside the MMA: a convert warpgroup writes
``e4m3(code_value * fp32(s) * 2^-3)`` to shared memory (at most 6 * 448 / 8 = 336, never saturating),
and the host folds the ``2^3`` back into the descale it passes (``g * 8``). Both the dequantized values
and those kernel values are returned.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Union

import torch

from . import fused
from .checks import check_bool, check_float, check_int, check_scale_fits, check_tensor
from .formats import E2M1, E4M3, NVFP4
from .packing import pack
from .quantize import _round_to_odd_lut, dequantize

__all__ = ["NVFP4Tensor", "nvfp4_quantize", "GLOBAL_SCALE_CONVENTIONS", "KERNEL_SHIFT"]

# The convert stage's power-of-two shift: kernel value = e4m3(code * scale * KERNEL_SHIFT), descale g / KERNEL_SHIFT.
KERNEL_SHIFT = 0.125

DEFAULT_SCALE_FLOOR = 2.0**-9  # ModelOpt's block-scale floor: the smallest e4m3 subnormal

NVFP4_SMALLEST = E2M1.min_subnormal * E4M3.min_subnormal  # the smallest nonzero |value| / g (0.5 * 2^-9)

GLOBAL_SCALE_CONVENTIONS = {
    # name: the largest |x| that maps to the top of the (element, scale) range, as a multiple of amax
    "amax": E2M1.max_normal * E4M3.max_normal,  # torchao / ModelOpt / TRT-LLM: g = amax / (6 * 448)
    "flashinfer": E4M3.max_normal,  # FlashInfer's KV quantizer: encode scale 448 / amax, i.e. g = amax / 448
}


@dataclass(frozen=True)
class NVFP4Tensor:
    """An NVFP4-quantized tensor ``x`` of shape ``(..., d)``.

    Attributes:
        codes: uint8 ``(..., d)``, one e2m1 code per element (pack with ``pack(codes, 4)``).
        scales: uint8 ``(..., d // group)``, e4m3 codes of the block scales.
        global_scale: float32 tensor broadcastable to ``(..., 1)``: the decode multiplier ``g``.
        group: elements per block scale (16).

    The decoded tensors are computed on first use (one fused kernel on CUDA) and kept:
    :attr:`values` ``code * scale * g`` and :attr:`kernel_values`, what the Thor convert stage feeds the fp8
    MMA.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    group: int = NVFP4.group

    @cached_property
    def _decoded(self) -> tuple[torch.Tensor, torch.Tensor]:
        e4m3_lut, _, e4m3_values, e2m1_values = _tables(self.codes.device)
        decode = fused.for_device(fused.nvfp4_decode, self.codes.device, group=self.group, shift=KERNEL_SHIFT)
        d, nb = self.codes.shape[-1], self.scales.shape[-1]
        g = torch.broadcast_to(self.global_scale, (*self.codes.shape[:-1], 1)).reshape(-1, 1)
        values, kernel = decode(
            self.codes.reshape(-1, d), self.scales.reshape(-1, nb), g, e4m3_lut, e4m3_values, e2m1_values
        )
        return values.view(self.codes.shape), kernel.view(self.codes.shape)

    @property
    def values(self) -> torch.Tensor:
        """float32 ``(..., d)``: the dequantized values ``code * scale * g``."""
        return self._decoded[0]

    @property
    def kernel_values(self) -> torch.Tensor:
        """float32 ``(..., d)``: ``e4m3(code * scale * 2^-3)``, every one a finite e4m3 value of magnitude
        <= 336 (the convert stage's output)."""
        return self._decoded[1]

    @property
    def kernel_descale(self) -> torch.Tensor:
        """float32, like :attr:`global_scale`: the descale the kernel takes, ``g * 8``."""
        return self.global_scale / KERNEL_SHIFT

    def packed_codes(self) -> torch.Tensor:
        """The codes packed two per byte, ``(..., d // 2)`` uint8 (element 2i in the low nibble)."""
        return pack(self.codes, E2M1.bits, check=False)  # e2m1 codes by construction

    def scale_values(self) -> torch.Tensor:
        """The block scales as float32 values, ``(..., d // group)``."""
        return dequantize(self.scales, E4M3)


def _tables(device) -> tuple[torch.Tensor, ...]:
    """The encoder's and decoder's tables on ``device``: the e4m3 and e2m1 round-to-odd tables (uint8) and the
    e4m3 and e2m1 code values (float32)."""
    return _round_to_odd_lut(E4M3, device), _round_to_odd_lut(E2M1, device), E4M3.values(device), E2M1.values(device)


_CONSTANTS: dict = {}


def _constant(value: float, device) -> torch.Tensor:
    """A float32 scalar tensor on ``device``, made once (no host-to-device copy inside a CUDA graph capture)."""
    key = (value, str(device))
    if key not in _CONSTANTS:
        _CONSTANTS[key] = torch.tensor(value, dtype=torch.float32, device=device)
    return _CONSTANTS[key]


def _f32(v: float) -> float:
    """``v`` rounded to float32 (nearest even). For the quotient of two float32 values computed in float64
    this is the correctly rounded float32 quotient (double rounding is innocuous: 53 >= 2 * 24 + 2), the
    bits of a float32 tensor division on any device."""
    return struct.unpack("f", struct.pack("f", v))[0]


def _global_scale(amax: torch.Tensor, divisor: float) -> torch.Tensor:
    """The global scale of a tensor whose ``max |x|`` is ``amax`` (float32 ``()`` on any device), without a
    wait: ``amax / divisor`` as a float32 tensor division (correctly rounded: the bits of :func:`_f32`), or
    1 where that is not > 0 (amax 0, or a quotient that underflows), as the checked path's host value."""
    q = amax / _constant(divisor, amax.device)
    return torch.where(q > 0, q, _constant(1.0, amax.device))


def _encode(x: torch.Tensor, g: torch.Tensor, floor: Optional[float], group: int, divisor: float, **packed):
    """Codes and block-scale codes of ``x (..., d)`` (:func:`~mjolnir_numerics.fused.nvfp4_block_scales`, then
    :func:`~mjolnir_numerics.fused.nvfp4_codes`; with
    ``g_scale=...``, packed two per byte under the global scales ``g * g_scale``)."""
    e4m3_lut, e2m1_lut, e4m3_values, _ = _tables(x.device)
    kernels = fused.helper_kernels(x.device)
    if kernels is not None and group == 16:  # the directly launched kernel (CUDA, CuTe DSL)
        lead, d = x.shape[:-1], x.shape[-1]
        rows = math.prod(lead)
        g_rows = torch.broadcast_to(g.float(), (*lead, 1)).reshape(rows, 1)
        codes, scale_codes = kernels.nvfp4_encode(
            x.reshape(rows, d), g_rows, floor, e2m1_lut, divisor=divisor,
            packed=bool(packed), g_scale=packed.get("g_scale", 1.0),
        )  # fmt: skip
        return codes.view(*lead, -1), scale_codes.view(*lead, -1)
    floor_t = None if floor is None else _constant(floor, x.device)
    if packed:
        g = g * packed["g_scale"]  # a power of two: exact
    scaled = fused.nvfp4_block_scales(x, g, floor_t, group=group, divisor=divisor)  # eager on purpose
    fn = fused.nvfp4_codes_packed if packed else fused.nvfp4_codes
    encode = fused.for_device(fn, x.device, group=group)
    return encode(x, g, scaled, e4m3_lut, e2m1_lut, e4m3_values)


def _block_sse(values: torch.Tensor, xg: torch.Tensor) -> torch.Tensor:
    """Squared error of each block, ``(..., blocks)`` float64, of ``values`` against ``xg (..., blocks, group)``:
    differences and squares in float64, summed in a fixed pairwise order (halves added elementwise until one
    is left, an odd count padded with an exact 0). Only correctly rounded elementwise operations, so every
    device gives the same bits: a reduction's summation order is the device's own, and a float32 ``sum``
    decided one near-tie of a 2,032-token end-to-end run the other way on the H200 (2026-12-03)."""
    diff = values.double().unflatten(-1, xg.shape[-2:]) - xg.double()
    e = diff * diff
    while e.shape[-1] > 1:
        if e.shape[-1] % 2:
            e = torch.cat([e[..., :-1], torch.zeros_like(e[..., -1:])], -1)  # an odd count: + 0 is exact
        e = e[..., 0::2] + e[..., 1::2]
    return e[..., 0]


def encode_unchecked(
    x: torch.Tensor,
    g: torch.Tensor,
    group: int,
    scale_floor: Optional[float],
    four_over_six: bool,
    packed: bool = False,
    g_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder behind :func:`nvfp4_quantize`, without its checks (no wait for the device): codes
    ``(..., d)`` (``packed``: two per byte, ``(..., d // 2)``) and block-scale codes ``(..., d // group)``,
    uint8, of finite ``x (..., d)`` (float32, float16 or bfloat16) under global scales ``g * g_scale``
    (``g`` broadcastable to ``(..., 1)``, ``g_scale`` a power of two)."""
    if not four_over_six and packed:  # the cache writer's rows: one graph from its descales
        return _encode(x, g, scale_floor, group, E2M1.max_normal, g_scale=g_scale)
    if g_scale != 1.0:
        g = g * g_scale
    if not four_over_six:
        return _encode(x, g, scale_floor, group, E2M1.max_normal)
    codes, scale_codes = _encode(x, g, scale_floor, group, E2M1.max_normal)
    codes4, scale4 = _encode(x, g, scale_floor, group, 4.0)
    blocks = (x.shape[-1] // group, group)
    xg = x.float().unflatten(-1, blocks)

    better = _block_sse(NVFP4Tensor(codes4, scale4, g, group).values, xg) < _block_sse(
        NVFP4Tensor(codes, scale_codes, g, group).values, xg
    )  # ties keep amax / 6
    scale_codes = torch.where(better, scale4, scale_codes)
    codes = torch.where(better.unsqueeze(-1), codes4.unflatten(-1, blocks), codes.unflatten(-1, blocks)).flatten(-2)
    return (pack(codes, E2M1.bits, check=False) if packed else codes), scale_codes


def nvfp4_quantize(
    x: torch.Tensor,
    group: int = NVFP4.group,
    *,
    global_scale: str = "amax",
    global_value: Union[float, torch.Tensor, None] = None,
    scale_floor: Optional[float] = DEFAULT_SCALE_FLOOR,
    four_over_six: bool = False,
    check: bool = True,
) -> NVFP4Tensor:
    """Quantize ``x`` to NVFP4.

    Args:
        x: float tensor ``(..., d)`` with ``d % group == 0``, finite values (CPU or CUDA).
        group: elements per e4m3 block scale along the last dim (16 for NVFP4).
        global_scale: how ``g`` follows from ``amax(x)`` when ``global_value`` is not given:
            ``"amax"`` (default; torchao / ModelOpt / TRT-LLM): ``g = amax / (6 * 448)``, so the
            largest block uses the whole e4m3 scale range; ``"flashinfer"``: FlashInfer's KV
            quantizer's encode scale ``448 / amax``, i.e. ``g = amax / 448`` (block scales <= 74.7).
        global_value: an explicit ``g`` (a float, or a tensor broadcastable to ``x.shape[:-1] + (1,)``
            for per-head or per-sequence global scales), e.g. ModelOpt's exported ``k_scale / 6``.
        scale_floor: lower clamp of the fp32 block scale before it is rounded to e4m3, so tiny blocks
            keep a nonzero scale. ``2**-9`` (default, ModelOpt: the smallest e4m3 subnormal),
            ``2**-6`` (torchao: the smallest e4m3 normal), or ``None`` (TRT-LLM: tiny block scales
            may underflow to 0, and that block then decodes to 0).
        four_over_six: "4 over 6" (vLLM ``nvfp4_4over6``): per block, also try the scale
            ``amax(block) / 4`` (mapping the block's largest value to e2m1's 4 instead of 6, which
            gives finer steps near it) and keep whichever of the two has the smaller sum of squared
            errors of the dequantized values (ties keep ``amax / 6``).
        check: check the values (finite ``x``; a ``global_value`` that is positive, finite and fits the
            data), which needs the device's answer. ``False`` is the serving loop's call: no wait for the
            device (capturable in a CUDA graph) and the same bits for valid input; the caller guarantees
            those (inf / NaN in ``x`` then give undefined codes, never an error).

    Returns:
        :class:`NVFP4Tensor`.

    Raises:
        ValueError: ``x`` is not a float tensor, holds inf/NaN, its last dim is not a multiple of
            ``group``; an unknown ``global_scale``; a ``global_value`` that is not positive and finite, or
            so far off the data that most nonzero values of ``x`` would saturate or round to 0 (a units
            mistake; a few values saturating is the format's defined behaviour and passes).
    """
    check_tensor("x", x, kind="float")
    group = check_int("group", group, low=1)
    check_bool("four_over_six", four_over_six)
    check_bool("check", check)
    if x.dim() == 0 or x.shape[-1] % group:
        raise ValueError(f"x: last dim {tuple(x.shape)[-1:] or '()'} must be a multiple of group={group}")
    if global_scale not in GLOBAL_SCALE_CONVENTIONS:
        raise ValueError(
            f"global_scale: unknown convention {global_scale!r}; allowed {', '.join(GLOBAL_SCALE_CONVENTIONS)}"
        )
    if scale_floor is not None and check_float("scale_floor", scale_floor, positive=True, allow_zero=False) <= 0:
        raise ValueError(f"scale_floor: expected a positive finite float or None, got {scale_floor!r}")
    x = x.float()
    lead, d = x.shape[:-1], x.shape[-1]
    divisor = GLOBAL_SCALE_CONVENTIONS[global_scale]
    kernels = fused.helper_kernels(x.device) if group == 16 and not four_over_six else None
    if not check and global_value is None:  # g on the device: no wait
        amax = torch.linalg.vector_norm(x, float("inf")) if x.numel() else torch.zeros((), device=x.device)
        if kernels is not None:  # one launch after the amax: g = _global_scale(amax, divisor) in the kernel
            codes, scale_codes, g = kernels.nvfp4_encode_global(
                x, amax, scale_floor, _round_to_odd_lut(E2M1, x.device), global_divisor=divisor
            )
            return NVFP4Tensor(codes, scale_codes, torch.broadcast_to(g, (*lead, 1)), group)
        g = _global_scale(amax, divisor)
    elif global_value is None:
        # max |x| in one pass and one wait (NaN and inf propagate); the inf-norm is a max: exact
        amax = float(torch.linalg.vector_norm(x, float("inf"))) if x.numel() else 0.0
        if not math.isfinite(amax):
            raise ValueError("x: holds inf or NaN; NVFP4 scales are computed from amax and need finite values")
        g_value = _f32(amax / divisor)  # the fp32 division's bits (see _f32)
        g = torch.full((), g_value if g_value > 0 else 1.0, dtype=torch.float32, device=x.device)  # 0: any g
    else:
        if isinstance(global_value, torch.Tensor):
            g = check_tensor("global_value", global_value, kind="float").to(torch.float32, copy=False).to(x.device)
        else:
            g = torch.tensor(check_float("global_value", global_value), dtype=torch.float32, device=x.device)
        if check and not (torch.isfinite(g).all() and (g > 0).all()):
            raise ValueError("global_value: must be positive and finite")
    g_one = g.float() if g.numel() == 1 else None  # one global scale: the kernel takes it as it is
    try:
        g = torch.broadcast_to(g.float(), (*lead, 1))
    except RuntimeError:
        raise ValueError(f"global_value: shape {tuple(g.shape)} does not broadcast to {(*lead, 1)}") from None

    if check and global_value is not None:
        if not bool(torch.isfinite(x.abs().amax() if x.numel() else torch.zeros(()))):
            raise ValueError("x: holds inf or NaN; NVFP4 scales are computed from amax and need finite values")
        check_scale_fits("global_value", x, g, E2M1.max_normal * E4M3.max_normal, NVFP4_SMALLEST)
    if kernels is not None and g_one is not None:  # one launch
        codes, scale_codes = kernels.nvfp4_encode(
            x.reshape(-1, d), g_one, scale_floor, _round_to_odd_lut(E2M1, x.device), divisor=E2M1.max_normal
        )
        return NVFP4Tensor(
            codes=codes.view(x.shape), scales=scale_codes.view(*lead, d // group), global_scale=g, group=group
        )
    # rows flattened: one graph for any rank
    codes, scale_codes = encode_unchecked(x.reshape(-1, d), g.reshape(-1, 1), group, scale_floor, four_over_six)
    codes, scale_codes = codes.view(x.shape), scale_codes.view(*lead, d // group)
    return NVFP4Tensor(codes=codes, scales=scale_codes, global_scale=g, group=group)
