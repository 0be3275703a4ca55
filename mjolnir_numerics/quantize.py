"""Bit-exact element quantization: what ``cvt.rn.satfinite.{e4m3x2,e3m2x2,e2m3x2,e2m1x2}.f32`` does.

The rounding works on the integer bits of the input, so it is exact for every float32 (and float64)
value and identical on CPU and CUDA:

* round to nearest, ties to even, with the target's subnormals kept;
* finite overflow and +-inf saturate to +-max (the largest finite value);
* NaN converts to 0x7F for e4m3 and to +max for fp6 / fp4 (CUDA ``cuda_fp6.hpp`` / ``cuda_fp4.hpp``);
* the sign of -0.0 (and of negative values that round to zero) is kept.

How: with the input's significand ``sig`` (implicit bit included) and unbiased exponent ``E``, the
target keeps ``man_bits`` fraction bits at exponent ``e_t = max(E, 1 - bias)``, so
``k = (src_man_bits - man_bits) + (e_t - E)`` low bits of ``sig`` are rounded away with
ties-to-even. The resulting magnitude code is ``((e_t + bias - 1) << man_bits) + rounded``: one
formula for normals, subnormals and a carry into the next binade alike.
"""

from __future__ import annotations

from typing import Union

import torch

from . import fused
from .formats import AnyFormat, Format, get_element_format

__all__ = ["quantize", "dequantize", "round_to_format"]

# (integer view dtype, fraction bits, exponent bias, exponent field width) of each source layout.
_SOURCE_LAYOUT = {
    torch.float32: (torch.int32, 23, 127, 8),
    torch.float64: (torch.int64, 52, 1023, 11),
}


_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _check_float_dtype(x: torch.Tensor, argument: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{argument}: expected a torch.Tensor of floats, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(
            f"{argument}: expected a floating-point tensor (float32, float64, float16 or bfloat16), got {x.dtype}"
        )
    if x.dtype not in _SOURCE_LAYOUT and x.dtype not in _HALF_DTYPES:
        raise ValueError(f"{argument}: dtype {x.dtype} is not supported; use float32, float64, float16 or bfloat16")


def _check_float_input(x: torch.Tensor, argument: str) -> torch.Tensor:
    _check_float_dtype(x, argument)
    return x.float() if x.dtype in _HALF_DTYPES else x  # exact widening


def _exact_codes(x: torch.Tensor, f: Format) -> torch.Tensor:
    """The reference rounding on the integer bits of a float32 or float64 tensor (see the module doc)."""
    int_dtype, src_man, src_bias, src_exp_w = _SOURCE_LAYOUT[x.dtype]
    raw = x.contiguous().view(int_dtype)
    one = torch.ones((), dtype=int_dtype, device=x.device)
    mag = raw & ((1 << (src_man + src_exp_w)) - 1)
    exp_field = mag >> src_man
    frac = mag & ((1 << src_man) - 1)
    is_nan = (exp_field == (1 << src_exp_w) - 1) & (frac != 0)

    sig = torch.where(exp_field > 0, frac | (1 << src_man), frac)  # significand, implicit bit included
    e_src = torch.clamp(exp_field, min=1) - src_bias  # unbiased exponent (source subnormals: 1 - bias)
    e_t = torch.clamp(e_src, min=f.min_exponent)  # exponent of the result's binade in the target
    # Bits to round away; at src_man + 2 or more, less than half an ulp is left -> 0.
    k = torch.clamp(e_t - e_src + (src_man - f.man_bits), max=src_man + 2)
    kept = sig >> k
    rem = sig - (kept << k)
    half = one << (k - 1)
    kept = kept + ((rem > half) | ((rem == half) & ((kept & 1) == 1))).to(int_dtype)

    code = ((e_t + (f.bias - 1)) << f.man_bits) + kept
    code = torch.clamp(code, max=f.max_code)  # satfinite: finite overflow and inf go to max
    code = torch.where(raw < 0, code | f.sign_mask, code)
    nan_code = f.nan_code if f.nan_code is not None else f.max_code
    code = torch.where(is_nan, torch.full_like(code, nan_code), code)
    return code.to(torch.uint8)


def _round_to_odd_lut(f: Format, device: torch.device) -> torch.Tensor:
    """Codes of all 65536 bfloat16 bit patterns (uint8, indexed by the pattern), cached per device.

    Round-to-odd to bfloat16 (truncate, then OR the sticky bit into the last place) keeps 8
    significant bits; rounding that to nearest-even at <= 6 significant bits equals rounding the
    original float32 directly (Boldo & Melquiond, "When double rounding is odd", 2005). Every format
    here keeps at most 4, so the table of the 65536 patterns is exact for all float32 inputs.
    """
    key = ("ro_lut", str(device))
    lut = f._tables.get(key)
    if lut is None:
        patterns = (torch.arange(1 << 16, dtype=torch.int32) << 16).view(torch.float32)
        lut = _exact_codes(patterns, f).to(device)
        f._tables[key] = lut
    return lut


# Elements per thread per step of the table path on the CPU: keeps the int32 scratch cache-sized and
# reused (allocating a fresh 4-byte-per-element scratch costs more than the arithmetic). CUDA: one pass.
_CPU_CHUNK_PER_THREAD = 1 << 19


def quantize(x: torch.Tensor, fmt: Union[str, Format]) -> torch.Tensor:
    """Round ``x`` to the codes of an element format, exactly as ``cvt.rn.satfinite`` does.

    Args:
        x: float tensor of any shape on any device. float32 is rounded directly (the hardware
            instruction's input); float64 is rounded once, directly from float64 (no double
            rounding through float32); float16 / bfloat16 are widened exactly first.
        fmt: an element format or its name: ``"e4m3"``, ``"e3m2"``, ``"e2m3"``, ``"e2m1"``.

    Returns:
        uint8 tensor of the same shape and device holding one code per element in its low
        ``fmt.bits`` bits (sign in bit ``bits - 1``).

    Raises:
        ValueError: ``x`` is not a floating-point tensor, or ``fmt`` is unknown or block-scaled.

    On CUDA a float32 / float16 / bfloat16 ``x`` takes one fused kernel (:func:`mjolnir_numerics.fused.
    quantize_codes`: the same formula and bits); its first call compiles it.
    """
    f = get_element_format(fmt)
    _check_float_dtype(x, "x")
    if x.dtype != torch.float64 and fused.available(x.device):  # one kernel, the same formula and bits
        return fused.quantize_codes(x, _round_to_odd_lut(f, x.device), f)
    x = _check_float_input(x, "x")
    if x.dtype == torch.float64:
        return _exact_codes(x, f)
    lut = _round_to_odd_lut(f, x.device)
    bits = x.reshape(-1).view(torch.int32)
    out = torch.empty(bits.shape, dtype=torch.uint8, device=x.device)
    chunk = _CPU_CHUNK_PER_THREAD * torch.get_num_threads() if x.device.type == "cpu" else max(1, bits.numel())
    scratch = torch.empty(min(chunk, bits.numel()), dtype=torch.int32, device=x.device)
    for start in range(0, bits.numel(), chunk):
        b = bits[start : start + chunk]
        t = scratch[: b.numel()]
        torch.bitwise_and(b, 0xFFFF, out=t)
        t += 0xFFFF  # bit 16 is now set iff any of the low 16 bits was (the sticky bit)
        t |= b
        t >>= 16
        t &= 0xFFFF  # round-to-odd bfloat16 pattern of x
        torch.index_select(lut, 0, t, out=out[start : start + chunk])
    return out.view(x.shape)


def dequantize(codes: torch.Tensor, fmt: Union[str, Format]) -> torch.Tensor:
    """Decode element codes to float32 values (exact: every code's value is a float32).

    Args:
        codes: integer tensor (uint8 usually) of any shape, each value in ``0 .. 2**fmt.bits - 1``.
        fmt: an element format or its name.

    Returns:
        float32 tensor of the same shape and device (e4m3's 0x7F / 0xFF decode to NaN).

    Raises:
        ValueError: ``codes`` is not an integer tensor or holds a value that is not a code of ``fmt``.
    """
    f = get_element_format(fmt)
    if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.dtype == torch.bool:
        raise ValueError(
            f"codes: expected an integer tensor of {f.name} codes, got {getattr(codes, 'dtype', type(codes))}"
        )
    idx = codes.long()
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= f.num_codes):
        raise ValueError(
            f"codes: values must be {f.bits}-bit codes of {f.name} (0..{f.num_codes - 1}), "
            f"got range [{int(idx.min())}, {int(idx.max())}]"
        )
    return f.values(codes.device)[idx]


def round_to_format(x: torch.Tensor, fmt: Union[str, AnyFormat]) -> torch.Tensor:
    """``dequantize(quantize(x, fmt), fmt)``: the float32 values ``x`` rounds to (same shape)."""
    f = get_element_format(fmt)
    return dequantize(quantize(x, f), f)
