"""Confidence intervals of the study's per-token metrics: a moving-block bootstrap over scored tokens.

Consecutive tokens of one text are not independent (a hard passage raises the KL of several tokens in a
row), so resampling single tokens would understate the spread. The bootstrap here resamples blocks of
``block`` consecutive tokens (the moving-block bootstrap, Kuensch 1989), ``n_boot`` times from a fixed
seed, and reports the percentile interval. Comparisons between two configurations are paired: both are
resampled with the same blocks (the same tokens), and the interval is that of the difference (or ratio),
which is far narrower than the two intervals side by side when the configurations err on the same tokens.

Every function is deterministic for a given ``seed`` and returns plain floats.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

BLOCK = 16
"""Tokens per resampled block: about a sentence of SmolLM2's tokenizer; a choice, stated in the report."""
N_BOOT = 2000
LEVEL = 0.95


def _check(values: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(values, torch.Tensor) or values.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D tensor of per-token values, got {type(values).__name__}")
    if values.numel() < 2:
        raise ValueError(f"{name}: at least 2 values are needed for an interval, got {values.numel()}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name}: holds inf or NaN")
    return values.double().cpu()


def block_indices(n: int, block: int = BLOCK, n_boot: int = N_BOOT, seed: int = 0) -> torch.Tensor:
    """``(n_boot, n)`` int64 token indices of ``n_boot`` moving-block resamples of ``n`` tokens: each row is
    ``ceil(n / b)`` blocks of ``b`` consecutive indices with uniform random starts, cut to ``n`` entries;
    ``b = min(block, max(1, n // 8))`` so that a resample has at least 8 blocks (a short sample falls back
    to single tokens rather than to one block that never varies)."""
    for name, v, low in (("n", n, 2), ("block", block, 1), ("n_boot", n_boot, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name}: expected an int >= {low}, got {v!r}")
    b = min(block, max(1, n // 8))
    k = -(-n // b)
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, n - b + 1, (n_boot, k), generator=gen)
    idx = (starts[:, :, None] + torch.arange(b)[None, None, :]).reshape(n_boot, k * b)
    return idx[:, :n]


def _interval(samples: torch.Tensor, level: float) -> tuple[float, float]:
    if not 0 < level < 1:
        raise ValueError(f"level: expected a probability in (0, 1), got {level!r}")
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(samples, q).tolist()
    return lo, hi


def mean_ci(values: torch.Tensor, *, transform: Callable = None, seed: int = 0, block: int = BLOCK,
            n_boot: int = N_BOOT, level: float = LEVEL) -> tuple[float, float]:  # fmt: skip
    """Percentile interval of ``transform(mean(values))`` (default: the mean itself) under the moving-block
    bootstrap. ``values``: 1-D per-token values (e.g. KL, a 0/1 agreement, a negative log-likelihood with
    ``transform=math.exp`` for perplexity), any real dtype and device (computed in float64 on the CPU).

    Raises:
        ValueError: ``values`` is not a 1-D tensor of at least 2 finite values, ``level`` is not in (0, 1),
            or ``block`` / ``n_boot`` is not a positive int."""
    v = _check(values, "values")
    means = v[block_indices(v.numel(), block, n_boot, seed)].mean(-1)
    if transform is not None:
        means = means.apply_(transform)  # CPU float64 (``_check``)
    return _interval(means, level)


def paired_ci(x: torch.Tensor, y: torch.Tensor, *, ratio: bool = False, transform: Callable = None, seed: int = 0,
              block: int = BLOCK, n_boot: int = N_BOOT, level: float = LEVEL) -> tuple[float, float]:  # fmt: skip
    """Percentile interval of ``f(mean(y)) - f(mean(x))`` (or ``f(mean(y)) / f(mean(x))`` with ``ratio``),
    ``f`` = ``transform`` or the identity, both means over the same resampled tokens. ``x`` and ``y`` are
    per-token values of two configurations on the same tokens, in the same order (1-D tensors).

    Raises:
        ValueError: as :func:`mean_ci`; ``x`` and ``y`` of different lengths; with ``ratio``, a resample
            whose ``x`` mean is 0."""
    a, b = _check(x, "x"), _check(y, "y")
    if a.numel() != b.numel():
        raise ValueError(f"x, y: the same tokens are needed, got {a.numel()} and {b.numel()} values")
    idx = block_indices(a.numel(), block, n_boot, seed)
    ma, mb = a[idx].mean(-1), b[idx].mean(-1)
    if transform is not None:
        ma, mb = ma.apply_(transform), mb.apply_(transform)
    if ratio:
        if bool((ma == 0).any()):
            raise ValueError("x: a resample has mean 0, so the ratio is undefined")
        return _interval(mb / ma, level)
    return _interval(mb - ma, level)


def verdict(lo: float, hi: float, threshold: float, *, below: bool) -> str:
    """``"agrees"`` when the whole interval is on the side of ``threshold`` the claim says (below it if
    ``below``, else at or above), ``"disagrees"`` when the whole interval is on the other side, else
    ``"not resolved"`` (at this sample size)."""
    if math.isnan(lo) or math.isnan(hi):
        return "not resolved"
    if below:
        return "agrees" if hi < threshold else ("disagrees" if lo >= threshold else "not resolved")
    return "agrees" if lo >= threshold else ("disagrees" if hi < threshold else "not resolved")


def combine(*verdicts: str) -> str:
    """All parts of a claim: ``disagrees`` if any part does, ``agrees`` if all do, else ``not resolved``."""
    if "disagrees" in verdicts:
        return "disagrees"
    return "agrees" if all(v == "agrees" for v in verdicts) else "not resolved"


def ratio_of_sums_ci(num: torch.Tensor, den: torch.Tensor, *, transform: Callable = None, seed: int = 0,
                     block: int = 1, n_boot: int = N_BOOT, level: float = LEVEL) -> tuple[float, float]:  # fmt: skip
    """Percentile interval of ``f(sum(num) / sum(den))`` under the bootstrap of units (``block`` 1: units
    resampled one by one, e.g. the (sequence, query head) rows of a decode's O, with ``num`` their squared
    errors, ``den`` their squared norms and ``f = sqrt``: the interval of rel L2).

    Raises:
        ValueError: as :func:`mean_ci`; ``num`` and ``den`` of different lengths; a resample whose ``den``
            sum is 0."""
    a, b = _check(num, "num"), _check(den, "den")
    if a.numel() != b.numel():
        raise ValueError(f"num, den: one value per unit is needed, got {a.numel()} and {b.numel()}")
    idx = block_indices(a.numel(), block, n_boot, seed)
    d = b[idx].sum(-1)
    if bool((d == 0).any()):
        raise ValueError("den: a resample sums to 0, so the ratio is undefined")
    s = a[idx].sum(-1) / d
    return _interval(s.apply_(transform) if transform is not None else s, level)


def paired_ratio_of_sums_ci(num_x: torch.Tensor, den_x: torch.Tensor, num_y: torch.Tensor, den_y: torch.Tensor, *,
                            transform: Callable = None, seed: int = 0, block: int = 1, n_boot: int = N_BOOT,
                            level: float = LEVEL) -> tuple[float, float]:  # fmt: skip
    """Percentile interval of ``f(sum(num_y) / sum(den_y)) / f(sum(num_x) / sum(den_x))`` with both
    configurations resampled on the same units (paired), e.g. one format's rel L2 with a transform over
    the same format's without it.

    Raises:
        ValueError: as :func:`ratio_of_sums_ci`; the four tensors of different lengths; a resample whose
            x value is 0."""
    ax, bx, ay, by = (_check(t, n) for t, n in ((num_x, "num_x"), (den_x, "den_x"), (num_y, "num_y"), (den_y, "den_y")))
    if len({ax.numel(), bx.numel(), ay.numel(), by.numel()}) != 1:
        raise ValueError("num_x, den_x, num_y, den_y: the same units are needed")
    idx = block_indices(ax.numel(), block, n_boot, seed)
    dx, dy = bx[idx].sum(-1), by[idx].sum(-1)
    if bool((dx == 0).any()) or bool((dy == 0).any()):
        raise ValueError("den_x, den_y: a resample sums to 0, so the ratio is undefined")
    x, y = ax[idx].sum(-1) / dx, ay[idx].sum(-1) / dy
    if transform is not None:
        x, y = x.apply_(transform), y.apply_(transform)
    if bool((x == 0).any()):
        raise ValueError("num_x: a resample's x value is 0, so the ratio is undefined")
    return _interval(y / x, level)
