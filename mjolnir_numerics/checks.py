"""Argument checks shared by the public API: every refusal names the argument, the value and what is
allowed.

A wrong *kind* of argument (a list where a tensor is expected, a float where an int is meant) raises
:class:`ArgumentTypeError`, a subclass of both ``TypeError`` and ``ValueError`` (so callers that catch
either see it); a value of the right kind outside what is allowed raises ``ValueError``. Integers are
Python ints or integer scalars (numpy, 0-d integer tensors); ``True`` / ``False`` and floats that happen to
equal an integer (``16.0``) are refused, never truncated.
"""

from __future__ import annotations

import argparse
import math
import numbers
import sys
from collections.abc import Iterable
from typing import Any, Optional

import torch

__all__ = [
    "ArgumentTypeError",
    "check_int",
    "check_choice",
    "check_bool",
    "check_float",
    "check_tensor",
    "check_device",
    "check_scale_fits",
    "scale_fit_counts",
    "refuse_scale",
    "check_f32",
    "OneLineArgumentParser",
    "int_arg",
]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong kind (type or dtype); the message names it and what is allowed."""


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{value!r} ({type(value).__name__})"


def check_int(name: str, value: Any, low: Optional[int] = None, high: Optional[int] = None) -> int:
    """``value`` as a Python int in ``[low, high]`` (either bound optional)."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{name}: expected an int, got {_describe(value)}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        span = f">= {low}" if high is None else (f"<= {high}" if low is None else f"in {low}..{high}")
        raise ValueError(f"{name}: expected an int {span}, got {value}")
    return value


def check_choice(name: str, value: Any, allowed: Iterable) -> Any:
    """``value`` if it is one of ``allowed`` with the same type (``16.0`` is not the page size ``16``)."""
    allowed = tuple(allowed)
    for a in allowed:
        if type(value) is type(a) and value == a:
            return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) in allowed:
        return int(value)  # numpy / torch integer scalars
    shown = ", ".join(repr(a) for a in allowed)
    raise ValueError(f"{name}: {value!r} is not one of {shown}")


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name}: expected True or False, got {_describe(value)}")
    return value


def check_float(name: str, value: Any, positive: bool = False, allow_zero: bool = True) -> float:
    """A finite real number (int, float, or a one-element tensor) as a float; ``positive``: > 0, or >= 0
    with ``allow_zero``."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ArgumentTypeError(f"{name}: expected a number, got {_describe(value)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name}: expected a finite number, got {_describe(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    if positive and (value < 0 or (value == 0 and not allow_zero)):
        raise ValueError(f"{name}: expected a number {'>=' if allow_zero else '>'} 0, got {value!r}")
    return value


def check_tensor(
    name: str,
    x: Any,
    *,
    kind: Optional[str] = None,
    dim: Optional[int] = None,
    finite: bool = False,
) -> torch.Tensor:
    """``x`` if it is a tensor of the given ``kind`` (``"float"``: a floating dtype, ``"int"``: an integer
    dtype, bool excluded) and number of dims; ``finite``: no inf or NaN."""
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(f"{name}: expected a torch.Tensor, got {_describe(x)}")
    if kind == "float" and not x.is_floating_point():
        raise ArgumentTypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if kind == "int" and (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool):
        raise ArgumentTypeError(f"{name}: expected an integer tensor, got {x.dtype}")
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name}: expected {dim} dims, got shape {tuple(x.shape)}")
    if finite and x.is_floating_point() and x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: holds inf or NaN")
    return x


def check_device(name: str, device: Any) -> torch.device:
    """``device`` (a string or ``torch.device``) as a ``torch.device``."""
    if isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise ArgumentTypeError(f"{name}: expected a device name such as 'cpu' or 'cuda', got {_describe(device)}")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(f"{name}: {device!r} is not a device name such as 'cpu', 'cuda' or 'cuda:1'") from None


def scale_fit_counts(x: torch.Tensor, descale: torch.Tensor, top: float, smallest: float) -> torch.Tensor:
    """What :func:`check_scale_fits` decides on, on ``x``'s device and without waiting for it: int64 ``(3,)``
    holding the number of nonzero values of ``x``, how many of them saturate (``|x| / descale > top``), and
    1 if every one rounds to 0 (``|x| / descale <= smallest / 2``), else 0."""
    nz = x != 0
    r = x.abs() / descale
    return torch.stack([nz.sum(), (r > top).sum(), ((r <= smallest / 2) | ~nz).all().long()])


def refuse_scale(name: str, x: torch.Tensor, descale: torch.Tensor, top: float, counts) -> None:
    """Raise the ValueError of :func:`check_scale_fits` for the host values of :func:`scale_fit_counts`, if
    they say the descale is far off the data."""
    n, saturated, all_zero = (int(c) for c in counts)
    if n == 0 or not (2 * saturated > n or all_zero):
        return
    amax = float(x.abs().max())
    d = float(descale.max()) if descale.numel() else float("nan")
    what = f"{100 * saturated / n:.0f} % of the nonzero values would saturate" if saturated else "all round to 0"
    raise ValueError(
        f"{name}: {d:.4g} is far off the data (amax {amax:.4g}): {what}; a descale near amax / {top:g} = "
        f"{amax / top:.4g} keeps them"
    )


def check_scale_fits(name: str, x: torch.Tensor, descale: torch.Tensor, top: float, smallest: float) -> None:
    """Refuse a descale far off the data: one under which more than half of the nonzero values of ``x``
    saturate (``|x| / descale`` above the format's ``top``), or every one rounds to 0 (at most half its
    ``smallest`` positive value). A few values saturating, and small values flushing to 0 under a scale set
    by outliers, are the formats' defined behaviour (what the studies measure); these two are units
    mistakes. ``descale`` broadcasts against ``x``."""
    refuse_scale(name, x, descale, top, scale_fit_counts(x, descale, top, smallest).tolist())


def check_f32(name: str, value: Any, positive: bool = False) -> float:
    """A finite number (``positive``: > 0) that stays finite (and nonzero) once rounded to fp32, the
    precision the kernels use it at; returned rounded to fp32."""
    v = check_float(name, value, positive=positive, allow_zero=not positive)
    r = float(torch.tensor(v, dtype=torch.float32))
    if not math.isfinite(r):
        raise ValueError(f"{name}: {v!r} overflows fp32 (largest 3.4028e+38)")
    if positive and r == 0:
        raise ValueError(f"{name}: {v!r} rounds to 0 in fp32 (smallest positive 1.4e-45)")
    return r


# -- command lines ------------------------------------------------------------------------------------
class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr (``prog: error: MESSAGE (see prog --help)``) and exit
    status 2: no usage block, no traceback. Subcommand parsers inherit it."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def int_arg(low: int, high: Optional[int] = None):
    """An argparse ``type``: an int in ``[low, high]``; argparse names the flag in its error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"expected an int {bound}, got {text!r}")
        return value

    parse.__name__ = "int"
    return parse
