"""Transforms of Q, K and V that leave attention unchanged in exact arithmetic, applied before the
cache is written (research knobs of the accuracy study; the kernels run unchanged on the results).

**Hadamard rotation** (QuaRot, SpinQuant; SGLang's FP4-KV recipe). ``H_b`` is the normalised Sylvester
Hadamard matrix of order ``b`` (entries ``+-1 / sqrt(b)``; symmetric and orthogonal, so ``H_b H_b = I``),
and ``R = diag(H_b, ..., H_b)`` applies it to each block of ``b`` consecutive head dims (``b`` = 16, 32 or
the head dim). Rotating Q and K, ``(q R) . (k R) = q . k``: S is unchanged in exact arithmetic, so the
kernel runs as it is on rotated inputs. Rotating V too, the attention output is ``O R``, and ``O = (O R) R``
is rotated back after the call. Rotations spread an outlier channel over its block, which is what helps a
narrow format.

*Bound*: here the rotation is computed in float64 and rounded once to float32, so each rotated element has
relative error at most u = 2^-24 and ``||q R|| = ||q||``; then ``|S' - S| <= (2 u + u^2) ||q|| ||k||`` for every
score (``rotation_score_bound``). The rotation back of O is float64 and rounded once to float32 too.

**K smoothing** (KIVI / KVQuant's per-channel view of K; SmoothQuant's balance): per kv head and channel a
power of two ``s_c``; ``k' = k / s`` and ``q' = q * s`` (for every query head of the kv head's group), so
``q' . k' = q . k`` with every product bit-identical (a power of two scales exactly, away from overflow and
underflow). ``s_c = 2^round(alpha log2(amax_c |K|) - (1 - alpha) log2(amax_c |Q|))`` balances the two
channels' ranges (alpha = 0.5 by default). The fold is exact, but the e4m3-Q path then quantizes the
folded Q: its per-(sequence, kv head) descale follows the new amax, so Q's rounding changes, and the study
measures the result with that rounding in (nothing to account for separately).
"""

from __future__ import annotations

import math

import torch

from .arithmetic import _pow2

__all__ = [
    "HADAMARD_BLOCKS",
    "TRANSFORMS",
    "hadamard_matrix",
    "rotate",
    "rotation_score_bound",
    "smoothing_factors",
    "apply_smoothing",
]

HADAMARD_BLOCKS = (16, 32, "d")
"""Block sizes of the rotation: 16, 32 or the whole head dim."""

TRANSFORMS = ("none", "hadamard16", "hadamard32", "hadamard_d", "smooth_k")
"""Names the study uses: no transform, a rotation of Q, K and V in blocks of 16, 32 or d, K smoothing."""


def hadamard_matrix(n: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """The normalised Sylvester Hadamard matrix of order ``n`` (a power of two): ``(n, n)`` of ``dtype``,
    entries ``+-1 / sqrt(n)``, symmetric, ``H @ H = I``.

    Raises:
        ValueError: ``n`` is not an int power of two."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n & (n - 1):
        raise ValueError(f"n: expected a power of two >= 1, got {n!r}")
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(dtype=dtype, device=device)


def _block(block, d: int) -> int:
    b = d if block == "d" else block
    if isinstance(b, bool) or not isinstance(b, int) or b not in (16, 32, d) or d % b:
        raise ValueError(f"block: expected 16, 32 or 'd' (dividing head dim {d}), got {block!r}")
    if b & (b - 1):
        raise ValueError(f"block: {b} is not a power of two (the head dim {d} with block='d')")
    return b


def rotate(x: torch.Tensor, block=16) -> torch.Tensor:
    """``x`` times the block-diagonal Hadamard rotation along its last dim (its own inverse: ``rotate(
    rotate(x)) = x`` up to the rounding of the result).

    Args:
        x: float ``(..., d)``: Q, K, V or O rows.
        block: 16, 32 or ``"d"`` (one block over the whole head dim); must divide d.

    Returns:
        ``x``'s dtype and shape: computed in float64, rounded once.

    Raises:
        ValueError: ``x`` not a floating-point tensor; ``block`` not 16, 32 or ``"d"``, not dividing d, or
            (``"d"``) d not a power of two.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 1:
        raise ValueError("x: expected a floating-point tensor (..., d)")
    d = x.shape[-1]
    b = _block(block, d)
    h = hadamard_matrix(b, device=x.device)
    y = x.double().unflatten(-1, (d // b, b)) @ h
    return y.flatten(-2).to(x.dtype)


def rotation_score_bound(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The bound on ``|S' - S|`` of the module docstring, per (query row, key row): ``(2 u + u^2)
    ||q|| ||k||`` with u = 2^-24 (float32 rotated rows). ``q (..., M, d)``, ``k (..., N, d)``; float64
    ``(..., M, N)``."""
    u = 2.0**-24
    qn = q.double().norm(dim=-1)
    kn = k.double().norm(dim=-1)
    return (2 * u + u * u) * qn[..., :, None] * kn[..., None, :]


def smoothing_factors(q: torch.Tensor, k: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """Per (kv head, channel) powers of two that balance K's and Q's channel ranges.

    Args:
        q: float ``(T_q, h_q, d)`` query rows (all sequences' rows stacked), ``h_q`` a multiple of h_k.
        k: float ``(T_k, h_k, d)`` key rows.
        alpha: in [0, 1]: 1 divides K's channels by their whole range, 0 leaves K as it is (Q's range in).

    Returns:
        float32 ``(h_k, d)`` powers of two ``2^n``, n = round(alpha log2 amax_k - (1 - alpha) log2 amax_q)
        (1 for a channel that is zero in K or in Q). At ``alpha = 0.5`` (the default) n is exact on every
        device, ties rounding up: the n with ``amax_q 2^(2n - 1) <= amax_k < amax_q 2^(2n + 1)``, settled by
        comparisons of exactly scaled values (a float64 log is off by an ulp on another device, which moved
        n where the ratio of the amaxes is an odd power of two: common for bfloat16 inputs). Other alphas
        round the float64 logs.

    Raises:
        ValueError: shapes other than these, or ``alpha`` outside [0, 1].
    """
    if q.dim() != 3 or k.dim() != 3 or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q, k: expected (T_q, h_q, d) and (T_k, h_k, d) with h_k | h_q, got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    if not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise ValueError(f"alpha: expected a number in [0, 1], got {alpha!r}")
    h_k, d = k.shape[1], k.shape[2]
    k_amax = k.double().abs().amax(dim=0)  # (h_k, d)
    q_amax = q.double().abs().amax(dim=0).view(h_k, q.shape[1] // h_k, d).amax(dim=1)
    live = (k_amax > 0) & (q_amax > 0)
    k_l, q_l = torch.where(live, k_amax, 1.0), torch.where(live, q_amax, 1.0)
    n = torch.round(alpha * torch.log2(k_l) - (1 - alpha) * torch.log2(q_l)).long()
    if alpha == 0.5:  # within 1 of the exact n; settle it (q_l 2^m is exact: both normal float64)
        n = torch.where(k_l < q_l * _pow2(2 * n - 1), n - 1, torch.where(k_l >= q_l * _pow2(2 * n + 1), n + 1, n))
    return _pow2(torch.where(live, n, 0)).float()


def apply_smoothing(q: torch.Tensor, k: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q * s, k / s)`` with the factors of :func:`smoothing_factors` broadcast over each kv head's
    query heads: ``q (..., h_q, d)``, ``k (..., h_k, d)``, ``s (h_k, d)`` powers of two. Exact (no rounding)
    while the results stay in the dtype's normal range.

    Raises:
        ValueError: ``s``'s shape does not match ``q`` and ``k``."""
    h_k, d = s.shape
    if q.shape[-1] != d or k.shape[-2:] != (h_k, d) or q.shape[-2] % h_k:
        raise ValueError(f"s: shape {tuple(s.shape)} does not match q {tuple(q.shape)} and k {tuple(k.shape)}")
    s_q = s.repeat_interleave(q.shape[-2] // h_k, dim=0).to(q.device)
    return (q * s_q.to(q.dtype)), (k / s.to(k.device, k.dtype))
