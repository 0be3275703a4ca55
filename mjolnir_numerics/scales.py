"""Descales from amax, e4m3 Q quantization, and the kernel's packed query rows.

Vocabulary: a *descale* multiplies stored values back to real units (``real = stored * descale``),
as vLLM's ``k_scale`` / ``v_scale`` and the kernel's ``q/k/v_descale`` do. Granularities:

* ``"per_tensor"``: one value, shape ``()``;
* ``"per_head"``: one per kv head, shape ``(h_k,)``;
* ``"per_seq_head"``: one per (sequence, kv head), shape ``(num_seqs, h_k)``.

Query rows: the kernel works on ``N = q_len * h_r`` rows per kv head (``h_r = h_q / h_k``), packed
qi-major (row ``n = qi * h_r + hr``); for ``q_len == 1`` that is vLLM's own layout (a free view).
"""

from __future__ import annotations

from typing import Sequence, Union

import torch

from .checks import ArgumentTypeError, check_int
from .formats import E4M3, AnyFormat, get_format
from .quantize import dequantize, quantize

__all__ = ["GRANULARITIES", "compute_descale", "quantize_q", "pack_q", "unpack_o", "check_q_rows"]

GRANULARITIES = ("per_tensor", "per_head", "per_seq_head")


def _per_seq_amax(x: Union[torch.Tensor, Sequence[torch.Tensor]]) -> torch.Tensor:
    """amax per (sequence, kv head) of K or V given as ``(num_seqs, L, h_k, d)`` or a list of ``(L_i, h_k, d)``."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 4:
            raise ValueError(f"x: expected (num_seqs, L, h_k, d) or a list of (L, h_k, d), got shape {tuple(x.shape)}")
        if x.shape[0] == 0:  # an empty batch: no amax, so every (absent) group gets amax 0
            return torch.zeros(0, x.shape[2], dtype=torch.float32, device=x.device)
        seqs = list(x.unbind(0))
    elif isinstance(x, (list, tuple)):
        seqs = list(x)
        if not seqs:
            raise ValueError("x: expected at least one sequence")
    else:
        raise ArgumentTypeError(
            f"x: expected a float (num_seqs, L, h_k, d) tensor or a list of (L, h_k, d), got {type(x).__name__}"
        )
    heads = None
    rows = []
    for i, s in enumerate(seqs):
        if not isinstance(s, torch.Tensor) or not s.is_floating_point() or s.dim() != 3:
            raise ValueError(f"x[{i}]: expected a float tensor (L, h_k, d), got {getattr(s, 'shape', type(s))}")
        if heads is None:
            heads = s.shape[1]
        elif s.shape[1] != heads:
            raise ValueError(f"x[{i}]: has {s.shape[1]} kv heads, the first sequence has {heads}")
        if not torch.isfinite(s).all():
            raise ValueError(f"x[{i}]: holds inf or NaN; a descale from amax needs finite values")
        if s.shape[0] == 0:
            rows.append(torch.zeros(s.shape[1], dtype=torch.float32, device=s.device))
        else:
            rows.append(s.float().abs().amax(dim=(0, 2)))
    return torch.stack(rows)


def compute_descale(
    x: Union[torch.Tensor, Sequence[torch.Tensor]],
    fmt: Union[str, AnyFormat],
    granularity: str = "per_tensor",
) -> torch.Tensor:
    """Descale mapping each group's amax onto the format's largest value: ``amax / fmt.max_normal``.

    Args:
        x: K or V in real units: ``(num_seqs, L, h_k, d)``, or a list of ``(L_i, h_k, d)`` (varlen).
        fmt: the storage format; for ``nvfp4`` ``max_normal`` is ``6 * 448``, so the result is the NVFP4
            global scale ``g`` (the kernel itself takes ``8 * g``, see ``NVFP4Tensor.kernel_descale``).
        granularity: ``"per_tensor"``, ``"per_head"`` or ``"per_seq_head"``.

    Returns:
        float32 descale of shape ``()``, ``(h_k,)`` or ``(num_seqs, h_k)``; 1.0 for a group whose values
        are all zero or absent (any positive descale encodes zeros exactly); an empty batch
        ``(0, L, h_k, d)`` gives ``(0, h_k)`` per (sequence, head).

    Raises:
        ValueError: unknown ``fmt`` or ``granularity``; ``x`` of the wrong shape or holding inf/NaN.
    """
    f = get_format(fmt)
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: {granularity!r} is not one of {', '.join(GRANULARITIES)}")
    amax = _per_seq_amax(x)  # (num_seqs, h_k)
    if granularity == "per_tensor":
        amax = amax.amax() if amax.numel() else amax.new_zeros(())
    elif granularity == "per_head":
        amax = amax.amax(dim=0) if amax.shape[0] else amax.new_zeros(amax.shape[1])
    # divide by a tensor: CUDA divides by a Python scalar as a multiply by its rounded reciprocal
    descale = amax / torch.tensor(f.max_normal, dtype=torch.float32, device=amax.device)
    return torch.where(descale > 0, descale, torch.ones_like(descale)).float()


def _check_sizes(num_seqs, q_len, heads_k) -> None:
    check_int("num_seqs", num_seqs, low=0)
    check_int("q_len", q_len, low=1)
    check_int("heads_k", heads_k, low=1)


def check_q_rows(q: torch.Tensor, num_seqs: int, q_len: int, heads_k: int, argument: str = "q") -> tuple[int, int, int]:
    """Validate a vLLM query ``(num_seqs * q_len, h_q, d)``; returns ``(h_q, h_r, d)``.

    Raises:
        ValueError: naming the argument, for a wrong rank or row count, non-positive sizes, or
            ``h_q`` not a multiple of ``heads_k``.
    """
    _check_sizes(num_seqs, q_len, heads_k)
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(
            f"{argument}: expected a tensor (num_seqs * q_len, h_q, d), got shape {tuple(getattr(q, 'shape', ()))}"
        )
    rows, h_q, d = q.shape
    if rows != num_seqs * q_len:
        raise ValueError(
            f"{argument}: has {rows} rows, expected num_seqs * q_len = {num_seqs} * {q_len} = {num_seqs * q_len}"
        )
    if h_q % heads_k:
        raise ValueError(f"{argument}: h_q={h_q} is not a multiple of heads_k={heads_k}")
    return h_q, h_q // heads_k, d


def pack_q(q: torch.Tensor, num_seqs: int, q_len: int, heads_k: int) -> torch.Tensor:
    """vLLM query ``(num_seqs * q_len, h_q, d)`` to the kernel's rows ``(num_seqs, h_k, q_len * h_r, d)``.

    Row ``n = qi * h_r + hr`` of kv head ``g`` is query token ``qi``, head ``g * h_r + hr``. A view
    (no copy) for ``q_len == 1``; any dtype.
    """
    _, h_r, d = check_q_rows(q, num_seqs, q_len, heads_k)
    if q_len == 1:
        return q.view(num_seqs, heads_k, h_r, d)
    return q.reshape(num_seqs, q_len, heads_k, h_r, d).transpose(1, 2).reshape(num_seqs, heads_k, q_len * h_r, d)


def unpack_o(o: torch.Tensor, num_seqs: int, q_len: int, heads_k: int) -> torch.Tensor:
    """Inverse of :func:`pack_q`: ``(num_seqs, h_k, q_len * h_r, d)`` to ``(num_seqs * q_len, h_q, d)``."""
    _check_sizes(num_seqs, q_len, heads_k)
    if not isinstance(o, torch.Tensor) or o.dim() != 4 or o.shape[0] != num_seqs or o.shape[1] != heads_k:
        raise ValueError(
            f"o: expected (num_seqs={num_seqs}, h_k={heads_k}, q_len * h_r, d), got {tuple(getattr(o, 'shape', ()))}"
        )
    n_q, d = o.shape[2], o.shape[3]
    if n_q % q_len:
        raise ValueError(f"o: {n_q} rows per kv head is not a multiple of q_len={q_len}")
    h_r = n_q // q_len
    if q_len == 1:
        return o.reshape(num_seqs, heads_k * h_r, d)
    return o.reshape(num_seqs, heads_k, q_len, h_r, d).transpose(1, 2).reshape(num_seqs * q_len, heads_k * h_r, d)


def quantize_q(q: torch.Tensor, num_seqs: int, q_len: int, heads_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-(sequence, kv head) e4m3 quantization of a vLLM query, as the fp8-Q path takes it.

    The descale of each (sequence, kv head) is ``amax / 448`` over its ``q_len`` tokens, ``h_r`` query
    heads and ``d`` (1.0 where all are zero); codes are ``e4m3_rne_sat(q / descale)`` in fp32.

    Args:
        q: float ``(num_seqs * q_len, h_q, d)`` (bf16, fp16, fp32), finite.
        num_seqs, q_len, heads_k: batch layout; ``h_q`` must be a multiple of ``heads_k``.

    Returns:
        ``(q_e4m3, q_descale)``: ``torch.float8_e4m3fn (num_seqs * q_len, h_q, d)`` and float32
        ``(num_seqs, h_k)``; ``q_e4m3.float() * descale`` approximates ``q``.

    Raises:
        ValueError: wrong shapes (see :func:`check_q_rows`), a non-float ``q``, or inf/NaN in ``q``.
    """
    h_q, h_r, d = check_q_rows(q, num_seqs, q_len, heads_k)
    if not q.is_floating_point() or q.dtype == torch.float8_e4m3fn:
        raise ValueError(f"q: expected a bf16/fp16/fp32 tensor, got {q.dtype}")
    qf = q.float().reshape(num_seqs, q_len, heads_k, h_r, d)
    if not torch.isfinite(qf).all():
        raise ValueError("q: holds inf or NaN")
    amax = qf.abs().amax(dim=(1, 3, 4)) if qf.numel() else torch.zeros(num_seqs, heads_k, device=q.device)
    descale = amax / torch.tensor(E4M3.max_normal, dtype=torch.float32, device=amax.device)  # IEEE division on CUDA too
    descale = torch.where(descale > 0, descale, torch.ones_like(descale))
    codes = quantize(qf / descale[:, None, :, None, None], E4M3)
    return codes.view(torch.float8_e4m3fn).reshape(num_seqs * q_len, h_q, d), descale


def e4m3_values(t: torch.Tensor) -> torch.Tensor:
    """float32 values of a ``torch.float8_e4m3fn`` tensor (exact, through the code table)."""
    return dequantize(t.view(torch.uint8), E4M3)
