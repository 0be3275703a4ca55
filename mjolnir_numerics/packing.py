"""Sub-byte packing of element codes along the last dimension, in the layout the kernel's loads read.

* 8 bits: one byte per element (a copy as uint8).
* 4 bits: element ``2i`` in the low nibble of byte ``i``, element ``2i + 1`` in the high nibble
  (``torch.float4_e2m1fn_x2``, PTX ``cvt ... e2m1x2``, torchao, ModelOpt and TRT-LLM agree).
* 6 bits: a little-endian bitstream, element ``i`` at bits ``[6i, 6i + 6)``: four codes fill three
  bytes. (The TMA ``16U6`` type reads 16 codes from 12 bytes; NVIDIA does not state its bit order,
  so this convention is unverified on silicon.)
"""

from __future__ import annotations


import torch

from . import fused
from .checks import check_bool, check_choice, check_int

__all__ = ["pack", "unpack", "packed_size", "SUPPORTED_BITS"]

SUPPORTED_BITS = (8, 6, 4)

# codes per group and bytes per group for each width
_GROUP = {8: (1, 1), 6: (4, 3), 4: (2, 1)}


def _check_bits(bits: int) -> int:
    return check_choice("bits", bits, SUPPORTED_BITS)


def packed_size(d: int, bits: int) -> int:
    """Bytes holding ``d`` codes of ``bits`` bits (``d * bits / 8``).

    Raises:
        ValueError: ``d`` codes do not fill whole bytes (fp6 needs d % 4 == 0, fp4 d % 2 == 0).
    """
    bits = _check_bits(bits)
    d = check_int("d", d, low=0)
    per, nbytes = _GROUP[bits]
    if d % per:
        raise ValueError(f"d: {d} codes do not fill whole bytes at {bits} bits; it must be a multiple of {per}")
    return d // per * nbytes


def pack(codes: torch.Tensor, bits: int, *, check: bool = True) -> torch.Tensor:
    """Pack codes ``(..., d)`` into bytes ``(..., d * bits / 8)``.

    Args:
        codes: integer tensor (uint8 usually), each value in ``0 .. 2**bits - 1``.
        bits: 8, 6 or 4.
        check: refuse codes outside ``0 .. 2**bits - 1`` (one pass over the codes and one wait for the
            device on CUDA). ``False`` skips it for a serving loop that must not wait:
            the caller guarantees valid codes (an invalid one spills into its neighbours' bits).

    Returns:
        uint8 tensor ``(..., d * bits // 8)`` on the same device.

    Raises:
        ValueError: unsupported ``bits``, a non-integer ``codes``, a code >= 2**bits, or a last
            dim that does not fill whole bytes.
    """
    bits = _check_bits(bits)
    check_bool("check", check)
    if not isinstance(codes, torch.Tensor) or codes.is_floating_point() or codes.dtype == torch.bool:
        raise ValueError(f"codes: expected an integer tensor, got {getattr(codes, 'dtype', type(codes))}")
    if codes.dim() == 0:
        raise ValueError("codes: expected at least one dimension to pack along")
    d = codes.shape[-1]
    if d % _GROUP[bits][0]:
        raise ValueError(
            f"codes: last dim {d} does not fill whole bytes at {bits} bits; it must be a multiple of {_GROUP[bits][0]}"
        )
    if check and codes.numel():
        lo, hi = torch.stack(torch.aminmax(codes)).tolist()  # one pass, one wait (a compiled any() was 10x slower)
        if lo < 0 or hi >= 1 << bits:
            _refuse_range(codes, bits)
    return fused.pack_any(codes, bits=bits)


def _refuse_range(codes: torch.Tensor, bits: int):
    raise ValueError(
        f"codes: values must be in 0..{(1 << bits) - 1} for {bits}-bit packing, "
        f"got range [{int(codes.min())}, {int(codes.max())}]"
    )


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack`: bytes ``(..., n)`` to codes ``(..., n * 8 / bits)`` (uint8).

    Raises:
        ValueError: unsupported ``bits``, a ``packed`` that is not uint8, or (fp6) a last dim that is
            not a whole number of 3-byte groups.
    """
    bits = _check_bits(bits)
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        raise ValueError(f"packed: expected a uint8 tensor of bytes, got {getattr(packed, 'dtype', type(packed))}")
    if packed.dim() == 0:
        raise ValueError("packed: expected at least one dimension to unpack along")
    n = packed.shape[-1]
    lead = packed.shape[:-1]
    if bits == 8:
        return packed.clone()
    if bits == 4:
        low = packed & 0x0F
        high = packed >> 4
        return torch.stack([low, high], dim=-1).reshape(*lead, n * 2)
    if n % 3:
        raise ValueError(f"packed: last dim {n} is not a whole number of 3-byte groups (6-bit packing)")
    b = packed.to(torch.int32).reshape(*lead, n // 3, 3)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    out = torch.stack([(word >> s) & 0x3F for s in (0, 6, 12, 18)], dim=-1)
    return out.reshape(*lead, n // 3 * 4).to(torch.uint8)
