"""KV element formats as data: one frozen description per format and a registry.

Every format the decode kernel reads is described here once; quantizers, packing, the emulator and
the kernels derive what they need from these descriptions instead of branching on names.

Element formats are OCP-style minifloats ``sign | exponent | mantissa``:

=======  ====  ===  ===  ====  ==========  ===============  ====================================
name     bits  exp  man  bias  max normal  min subnormal    special codes
=======  ====  ===  ===  ====  ==========  ===============  ====================================
e4m3     8     4    3    7     448         2^-9             0x7F / 0xFF are NaN ("fn": no inf)
e3m2     6     3    2    3     28          2^-4             none (finite only)
e2m3     6     2    3    1     7.5         2^-3             none (finite only)
e2m1     4     2    1    1     6           0.5              none (finite only)
=======  ====  ===  ===  ====  ==========  ===============  ====================================

``nvfp4`` is a block-scaled format: e2m1 codes, one e4m3 scale per 16 consecutive elements along the
head dimension, and one fp32 global scale (see :mod:`mjolnir_numerics.nvfp4`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Union

import torch

from .checks import check_device, check_int

__all__ = ["Format", "BlockScaledFormat", "FORMATS", "get_format", "E4M3", "E3M2", "E2M3", "E2M1", "NVFP4"]


@dataclass(frozen=True)
class Format:
    """A sign-magnitude minifloat element format.

    Attributes:
        name: registry name (``"e4m3"`` is the finite-only "fn" variant).
        exp_bits: exponent field width.
        man_bits: mantissa (fraction) field width.
        bias: exponent bias.
        nan_at_max_code: True for the "fn" convention of e4m3, where the all-ones magnitude code
            (0x7F) is NaN and the largest finite value is one code below it. False for formats
            without NaN or inf (fp6, fp4).
    """

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    nan_at_max_code: bool = False
    _tables: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    # -- derived properties ---------------------------------------------------------------------
    @property
    def bits(self) -> int:
        """Bits per stored element: 1 sign + exponent + mantissa."""
        return 1 + self.exp_bits + self.man_bits

    @property
    def bits_per_value(self) -> float:
        """Storage cost per element in bits (no side data for plain element formats)."""
        return float(self.bits)

    @property
    def num_codes(self) -> int:
        """Number of distinct codes, 2**bits."""
        return 1 << self.bits

    @property
    def sign_mask(self) -> int:
        """The sign bit of a code."""
        return 1 << (self.bits - 1)

    @property
    def min_exponent(self) -> int:
        """Unbiased exponent of the smallest normal value (also the subnormals' exponent), 1 - bias."""
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """Magnitude code of the largest finite value (0x7E for e4m3, all ones otherwise)."""
        all_ones = self.sign_mask - 1
        return all_ones - 1 if self.nan_at_max_code else all_ones

    @property
    def nan_code(self) -> int | None:
        """Code a NaN input converts to: 0x7F for e4m3; fp6/fp4 have no NaN and give +max."""
        return self.sign_mask - 1 if self.nan_at_max_code else None

    @cached_property
    def max_normal(self) -> float:
        """Largest finite value (448, 28, 7.5, 6)."""
        return self.code_value(self.max_code)

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, 2**(1 - bias)."""
        return 2.0**self.min_exponent

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value, 2**(1 - bias - man_bits)."""
        return 2.0 ** (self.min_exponent - self.man_bits)

    # -- code values ----------------------------------------------------------------------------
    def code_value(self, code: int) -> float:
        """The value of one code (a Python float; NaN for e4m3's NaN codes)."""
        code = check_int("code", code)
        if not 0 <= code < self.num_codes:
            raise ValueError(
                f"code: {code} is not a {self.bits}-bit code of {self.name} (allowed 0..{self.num_codes - 1})"
            )
        sign = -1.0 if code & self.sign_mask else 1.0
        mag = code & (self.sign_mask - 1)
        if self.nan_at_max_code and mag == self.sign_mask - 1:
            return math.nan
        exp_field = mag >> self.man_bits
        man = mag & ((1 << self.man_bits) - 1)
        if exp_field == 0:
            return sign * math.ldexp(man, self.min_exponent - self.man_bits)
        return sign * math.ldexp((1 << self.man_bits) + man, exp_field - self.bias - self.man_bits)

    @cached_property
    def value_list(self) -> tuple[float, ...]:
        """Value of every code, indexed by code (length 2**bits)."""
        return tuple(self.code_value(c) for c in range(self.num_codes))

    def values(self, device: Union[str, torch.device, None] = None) -> torch.Tensor:
        """Value of every code as a float32 tensor of shape (2**bits,) on ``device`` (cached)."""
        key = str(check_device("device", device)) if device is not None else "cpu"
        table = self._tables.get(key)
        if table is None:
            table = torch.tensor(self.value_list, dtype=torch.float32, device=key)
            self._tables[key] = table
        return table

    @cached_property
    def finite_values(self) -> tuple[float, ...]:
        """All distinct finite values, ascending (-0.0 and +0.0 collapse to 0.0)."""
        return tuple(sorted({v for v in self.value_list if not math.isnan(v)}))

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class BlockScaledFormat:
    """A block-scaled format: ``element`` codes with one ``scale``-format scale per ``group`` elements
    along the last dimension, and one fp32 global scale per tensor (or per descale group).

    A value decodes as ``element_value * fp32(scale) * global``.
    """

    name: str
    element: Format
    scale: Format
    group: int

    @property
    def bits(self) -> int:
        """Bits of one stored element code (the packed KV rows hold these)."""
        return self.element.bits

    @property
    def bits_per_value(self) -> float:
        """Storage cost per element in bits, block scales included (4.5 for NVFP4)."""
        return self.element.bits + self.scale.bits / self.group

    @property
    def max_normal(self) -> float:
        """Largest value representable with a unit global scale: element max * scale max (6 * 448)."""
        return self.element.max_normal * self.scale.max_normal

    def __str__(self) -> str:
        return self.name


E4M3 = Format("e4m3", exp_bits=4, man_bits=3, bias=7, nan_at_max_code=True)
E3M2 = Format("e3m2", exp_bits=3, man_bits=2, bias=3)
E2M3 = Format("e2m3", exp_bits=2, man_bits=3, bias=1)
E2M1 = Format("e2m1", exp_bits=2, man_bits=1, bias=1)
NVFP4 = BlockScaledFormat("nvfp4", element=E2M1, scale=E4M3, group=16)

FORMATS: dict[str, Union[Format, BlockScaledFormat]] = {f.name: f for f in (E4M3, E3M2, E2M3, E2M1, NVFP4)}
"""Every KV format the kernel reads, by name."""

AnyFormat = Union[Format, BlockScaledFormat]


def get_format(fmt: Union[str, AnyFormat]) -> AnyFormat:
    """Look a format up by name (a format object is returned as is).

    Raises:
        ValueError: ``fmt`` is not a known format name; the message lists the valid ones.
    """
    if isinstance(fmt, (Format, BlockScaledFormat)):
        return fmt
    if isinstance(fmt, str) and fmt in FORMATS:
        return FORMATS[fmt]
    raise ValueError(f"fmt: unknown format {fmt!r}; valid formats are {', '.join(FORMATS)}")


def get_element_format(fmt: Union[str, AnyFormat], argument: str = "fmt") -> Format:
    """Like :func:`get_format`, but only element formats (not nvfp4) are accepted."""
    f = get_format(fmt)
    if not isinstance(f, Format):
        names = ", ".join(n for n, v in FORMATS.items() if isinstance(v, Format))
        raise ValueError(
            f"{argument}: {f.name} is block-scaled and needs its scales; use nvfp4_quantize for it, "
            f"or one of the element formats {names}"
        )
    return f
