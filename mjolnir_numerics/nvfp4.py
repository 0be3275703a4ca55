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

from dataclasses import dataclass
from typing import Optional, Union

import torch

from .formats import E2M1, E4M3, NVFP4
from .checks import check_bool, check_float, check_int, check_scale_fits, check_tensor
from .packing import pack
from .quantize import dequantize, quantize

__all__ = ["NVFP4Tensor", "nvfp4_quantize", "GLOBAL_SCALE_CONVENTIONS", "KERNEL_SHIFT"]

# The convert stage's power-of-two shift: kernel value = e4m3(code * scale * KERNEL_SHIFT), descale g / KERNEL_SHIFT.
KERNEL_SHIFT = 0.125

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
        values: float32 ``(..., d)``, the dequantized values ``code * scale * g``.
        kernel_values: float32 ``(..., d)``, what the Thor convert stage feeds the fp8 MMA:
            ``e4m3(code * scale * 2^-3)``, every one a finite e4m3 value of magnitude <= 336.
        kernel_descale: float32 tensor like ``global_scale``: the descale the kernel takes, ``g * 8``.
        group: elements per block scale (16).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    values: torch.Tensor
    kernel_values: torch.Tensor
    kernel_descale: torch.Tensor
    group: int = NVFP4.group

    def packed_codes(self) -> torch.Tensor:
        """The codes packed two per byte, ``(..., d // 2)`` uint8 (element 2i in the low nibble)."""
        return pack(self.codes, E2M1.bits)

    def scale_values(self) -> torch.Tensor:
        """The block scales as float32 values, ``(..., d // group)``."""
        return dequantize(self.scales, E4M3)


def _block_scale_codes(
    block_amax: torch.Tensor, divisor: float, g: torch.Tensor, floor: Optional[float]
) -> torch.Tensor:
    # divide by a tensor: CUDA divides by a Python scalar as a multiply by its rounded reciprocal
    scaled = (block_amax / torch.tensor(divisor, dtype=torch.float32, device=block_amax.device)) / g
    if floor is not None:
        scaled = torch.clamp(scaled, min=floor)
    return quantize(scaled, E4M3)


def _encode(xg: torch.Tensor, scale_codes: torch.Tensor, g: torch.Tensor):
    """codes and dequantized values of blocks ``xg (..., nb, group)`` under the given block scales."""
    s = dequantize(scale_codes, E4M3).unsqueeze(-1)
    total = s * g.unsqueeze(-1)
    ratio = torch.where(total > 0, xg / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(xg))
    codes = quantize(ratio, E2M1)
    values = dequantize(codes, E2M1) * s * g.unsqueeze(-1)
    return codes, values


def nvfp4_quantize(
    x: torch.Tensor,
    group: int = NVFP4.group,
    *,
    global_scale: str = "amax",
    global_value: Union[float, torch.Tensor, None] = None,
    scale_floor: Optional[float] = 2.0**-9,
    four_over_six: bool = False,
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
    if x.dim() == 0 or x.shape[-1] % group:
        raise ValueError(f"x: last dim {tuple(x.shape)[-1:] or '()'} must be a multiple of group={group}")
    x = x.float()
    if not torch.isfinite(x).all():
        raise ValueError("x: holds inf or NaN; NVFP4 scales are computed from amax and need finite values")
    if global_scale not in GLOBAL_SCALE_CONVENTIONS:
        raise ValueError(
            f"global_scale: unknown convention {global_scale!r}; allowed {', '.join(GLOBAL_SCALE_CONVENTIONS)}"
        )
    if scale_floor is not None and check_float("scale_floor", scale_floor, positive=True, allow_zero=False) <= 0:
        raise ValueError(f"scale_floor: expected a positive finite float or None, got {scale_floor!r}")

    lead, d = x.shape[:-1], x.shape[-1]
    if global_value is None:
        amax = x.abs().amax() if x.numel() else torch.zeros((), device=x.device)
        g = amax / torch.tensor(GLOBAL_SCALE_CONVENTIONS[global_scale], dtype=torch.float32, device=x.device)
        g = torch.where(g > 0, g, torch.ones_like(g))  # an all-zero tensor: any g encodes it exactly
    else:
        if isinstance(global_value, torch.Tensor):
            g = check_tensor("global_value", global_value, kind="float").to(torch.float32, copy=False).to(x.device)
        else:
            g = torch.tensor(check_float("global_value", global_value), dtype=torch.float32, device=x.device)
        if not (torch.isfinite(g).all() and (g > 0).all()):
            raise ValueError("global_value: must be positive and finite")
    try:
        g = torch.broadcast_to(g.float(), (*lead, 1))
    except RuntimeError:
        raise ValueError(f"global_value: shape {tuple(g.shape)} does not broadcast to {(*lead, 1)}") from None

    if global_value is not None:
        check_scale_fits("global_value", x, g, E2M1.max_normal * E4M3.max_normal, NVFP4_SMALLEST)
    xg = x.reshape(*lead, d // group, group)
    block_amax = xg.abs().amax(dim=-1)
    scale_codes = _block_scale_codes(block_amax, E2M1.max_normal, g, scale_floor)
    codes, values = _encode(xg, scale_codes, g)
    if four_over_six:
        scale4 = _block_scale_codes(block_amax, 4.0, g, scale_floor)
        codes4, values4 = _encode(xg, scale4, g)
        better = ((values4 - xg) ** 2).sum(-1) < ((values - xg) ** 2).sum(-1)
        scale_codes = torch.where(better, scale4, scale_codes)
        codes = torch.where(better.unsqueeze(-1), codes4, codes)
        values = torch.where(better.unsqueeze(-1), values4, values)

    scale_vals = dequantize(scale_codes, E4M3).unsqueeze(-1)
    kernel_values = dequantize(quantize(dequantize(codes, E2M1) * scale_vals * KERNEL_SHIFT, E4M3), E4M3)
    return NVFP4Tensor(
        codes=codes.reshape(*lead, d),
        scales=scale_codes,
        global_scale=g,
        values=values.reshape(*lead, d),
        kernel_values=kernel_values.reshape(*lead, d),
        kernel_descale=g / KERNEL_SHIFT,
        group=group,
    )
