"""Argument checks shared by the public API: every refusal names the argument, the value and what is
allowed.

A wrong *kind* of argument (a list where a tensor is expected, a float where an int is meant) raises
:class:`ArgumentTypeError`, a subclass of both ``TypeError`` and ``ValueError`` (so callers that catch
either see it); a value of the right kind outside what is allowed raises ``ValueError``. Integers are
Python ints or integer scalars (numpy, 0-d integer tensors); ``True`` / ``False`` and floats that happen to
equal an integer (``16.0``) are refused, never truncated.
"""

from __future__ import annotations

import math
import numbers
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
