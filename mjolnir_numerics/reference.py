"""The exact reference and error attribution for decode attention.

:func:`reference_decode` is float64 softmax attention with the kernel's masks and conventions (packed
query rows, causal tail for ``q_len > 1``, natural-log LSE, O = 0 and LSE = -inf for an empty
sequence), on whatever K/V values it is given: the unquantized ones, or a cache's kernel view.

:func:`attribute_errors` isolates each error source of the quantized kernel by switching one at a time
and reports relative L2 error, max abs error, cosine similarity and LSE error for each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from .cache import PagedKVCache, check_descale, descale_table
from .checks import ArgumentTypeError, check_bool, check_float, check_int, check_tensor
from .emulator import EmulatorKnobs, emulate_decode
from .plan import SplitPlan
from .scales import check_q_rows, pack_q, quantize_q, unpack_o

__all__ = ["reference_decode", "ErrorRow", "error_metrics", "attribute_errors", "ERROR_SOURCES"]

KV = Union[torch.Tensor, Sequence[torch.Tensor], PagedKVCache]


def _kv_lists(k: KV, v: Optional[KV]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    if isinstance(k, PagedKVCache):
        if v is not None:
            raise ValueError("v: pass v=None when k is a PagedKVCache (it holds both)")
        pairs = [k.gather(s) for s in range(k.num_seqs)]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    if v is None:
        raise ValueError("v: required unless k is a PagedKVCache")
    seqs = []
    for name, x in (("k", k), ("v", v)):
        if isinstance(x, torch.Tensor):
            check_tensor(name, x, kind="float", dim=4, finite=True)
            seqs.append(list(x.unbind(0)))
        elif isinstance(x, (list, tuple)):
            seqs.append([check_tensor(f"{name}[{i}]", t, kind="float", dim=3, finite=True) for i, t in enumerate(x)])
        else:
            raise ArgumentTypeError(
                f"{name}: expected a float (num_seqs, L, h_k, d) tensor or a list of (L_i, h_k, d), "
                f"got {type(x).__name__}"
            )
    ks, vs = seqs
    if not ks:
        raise ValueError("k: holds no sequences")
    if len(ks) != len(vs):
        raise ValueError(f"v: has {len(vs)} sequences, k has {len(ks)}")
    for i, (a, b) in enumerate(zip(ks, vs)):
        if a.shape != b.shape:
            raise ValueError(f"v[{i}]: expected (L, h_k, d) matching k[{i}] {tuple(a.shape)}, got {tuple(b.shape)}")
        if a.shape[1:] != ks[0].shape[1:]:
            raise ValueError(f"k[{i}]: (h_k, d) = {tuple(a.shape[1:])} differs from k[0]'s {tuple(ks[0].shape[1:])}")
    return ks, vs


def reference_decode(
    q: torch.Tensor,
    k: KV,
    v: Optional[KV] = None,
    *,
    q_descale: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    scale_o: float = 1.0,
    q_len: int = 1,
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (float64) decode attention.

    Args:
        q: ``(num_seqs * q_len, h_q, d)``, any float dtype or ``float8_e4m3fn`` (then multiplied by
            ``q_descale``, shape ``()``, ``(h_k,)`` or ``(num_seqs, h_k)``).
        k, v: real-unit K and V, ``(num_seqs, L, h_k, d)`` or lists of ``(L_i, h_k, d)``; or ``k`` a
            :class:`PagedKVCache` (its kernel view: MMA values times the kernel descales) and ``v=None``.
        softmax_scale: default ``1 / sqrt(d)``; scale_o: output multiplier.
        q_len, causal: as in :func:`~mjolnir_numerics.emulator.emulate_decode` (``q_len`` at most every
            non-empty sequence's length).

    Raises ValueError / ``ArgumentTypeError`` (a ``TypeError`` too) naming the argument for inputs
    :func:`~mjolnir_numerics.emulator.emulate_decode` refuses: e4m3 Q without ``q_descale``, a non-finite
    or non-positive ``softmax_scale``, ``q_len`` beyond a sequence, mismatched K / V shapes.

    Returns:
        ``(o, lse)``: float64 ``(num_seqs * q_len, h_q, d)`` and float64 ``(num_seqs, h_k, q_len * h_r)``
        (natural log of the sum of ``exp(scale * q.k)`` over visible keys; -inf for an empty sequence).
    """
    q_len = check_int("q_len", q_len, low=1)
    check_bool("causal", causal)
    scale_o = check_float("scale_o", scale_o)
    ks, vs = _kv_lists(k, v)
    num_seqs = len(ks)
    heads_k, d = ks[0].shape[1], ks[0].shape[2]
    check_tensor("q", q, dim=3)
    if not (q.is_floating_point() or q.dtype == torch.float8_e4m3fn):
        raise ArgumentTypeError(f"q: expected a floating-point or float8_e4m3fn tensor, got {q.dtype}")
    if not bool(torch.isfinite(q.float()).all()):
        raise ValueError("q: holds inf or NaN")
    h_q, h_r, dq = check_q_rows(q, num_seqs, q_len, heads_k)
    if dq != d:
        raise ValueError(f"q: head dim {dq} differs from k's {d}")
    for i, kb in enumerate(ks):
        if 0 < kb.shape[0] < q_len:
            raise ValueError(f"q_len: {q_len} exceeds seq_len {kb.shape[0]} of sequence {i}")
    qv = q.float().double()
    if q_descale is not None:
        qd = descale_table(check_descale(q_descale, num_seqs, heads_k, "q_descale"), num_seqs, heads_k).double()
    elif q.dtype == torch.float8_e4m3fn:
        raise ValueError("q_descale: e4m3 Q needs its per-(sequence, kv head) descale (see quantize_q)")
    else:
        qd = torch.ones(num_seqs, heads_k, dtype=torch.float64)
    qp = pack_q(qv, num_seqs, q_len, heads_k) * qd.to(qv.device)[:, :, None, None]  # (B, G, N, D)
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else check_float("softmax_scale", softmax_scale, True, False)
    n = q_len * h_r
    o = torch.zeros(num_seqs, heads_k, n, d, dtype=torch.float64, device=qp.device)
    lse = torch.full((num_seqs, heads_k, n), -math.inf, dtype=torch.float64, device=qp.device)
    qi = torch.arange(n, device=qp.device) // h_r
    for b in range(num_seqs):
        L = ks[b].shape[0]
        if L == 0:
            continue
        kb = ks[b].to(qp.device).double().permute(1, 0, 2)  # (G, L, D)
        vb = vs[b].to(qp.device).double().permute(1, 0, 2)
        s = torch.einsum("gnd,gld->gnl", qp[b], kb) * scale
        last = L - 1 - ((q_len - 1 - qi) if causal else torch.zeros_like(qi))
        hidden = torch.arange(L, device=qp.device)[None, :] > last[:, None]
        s = s.masked_fill(hidden[None], -math.inf)
        lse[b] = torch.logsumexp(s, dim=-1)
        o[b] = scale_o * torch.einsum("gnl,gld->gnd", torch.softmax(s, dim=-1), vb)
    return unpack_o(o, num_seqs, q_len, heads_k), lse


@dataclass(frozen=True)
class ErrorRow:
    """One error source: metrics of the output with that source switched on vs without it.

    Attributes:
        source: name (see :data:`ERROR_SOURCES`).
        rel_l2: ``||o - o_ref|| / ||o_ref||`` over all outputs.
        max_abs: ``max |o - o_ref|``.
        cosine: cosine similarity of the flattened outputs.
        lse_max_abs: ``max |lse - lse_ref|`` over finite entries (natural log).
    """

    source: str
    rel_l2: float
    max_abs: float
    cosine: float
    lse_max_abs: float


ERROR_SOURCES = ("k_quantization", "v_quantization", "q_quantization", "p_rounding", "split_merging", "total")


def error_metrics(
    source: str, o: torch.Tensor, o_ref: torch.Tensor, lse: torch.Tensor, lse_ref: torch.Tensor
) -> ErrorRow:
    """:class:`ErrorRow` of ``o`` against ``o_ref`` (the same shape) and of ``lse`` against ``lse_ref`` (the
    same shape). Cosine: 1 when both outputs are zero, 0 when exactly one is; NaN anywhere gives NaN
    metrics (never a perfect score)."""
    for name, x in (("o", o), ("o_ref", o_ref), ("lse", lse), ("lse_ref", lse_ref)):
        check_tensor(name, x)
    if o.shape != o_ref.shape:
        raise ValueError(f"o: shape {tuple(o.shape)} differs from o_ref's {tuple(o_ref.shape)}")
    if lse.shape != lse_ref.shape:
        raise ValueError(f"lse: shape {tuple(lse.shape)} differs from lse_ref's {tuple(lse_ref.shape)}")
    a, b = o.double().flatten(), o_ref.double().flatten()
    diff = a - b
    nb = float(b.norm())
    rel = float(diff.norm()) / nb if nb > 0 else float(diff.norm())
    na = float(a.norm())
    if math.isnan(na) or math.isnan(nb):
        cos = math.nan
    elif na == 0 or nb == 0:
        cos = 1.0 if na == nb else 0.0
    else:
        cos = float(a @ b) / (na * nb)
    fin = torch.isfinite(lse_ref.double())
    lse_err = float((lse.double()[fin] - lse_ref.double()[fin]).abs().max()) if bool(fin.any()) else 0.0
    return ErrorRow(source, rel, float(diff.abs().max()) if diff.numel() else 0.0, cos, lse_err)


def attribute_errors(
    q: torch.Tensor,
    k: Union[torch.Tensor, Sequence[torch.Tensor]],
    v: Union[torch.Tensor, Sequence[torch.Tensor]],
    fmt: str = "e4m3",
    *,
    q_path: str = "e4m3",
    page_size: int = 16,
    granularity: str = "per_head",
    softmax_scale: Optional[float] = None,
    q_len: int = 1,
    causal: bool = True,
    plan: Optional[SplitPlan] = None,
    target=None,
    knobs: Optional[EmulatorKnobs] = None,
    allow_unsupported: bool = False,
) -> list[ErrorRow]:
    """Isolate each error source of the quantized decode, one at a time.

    Sources (each a row; the baseline is the exact float64 reference unless stated):

    * ``k_quantization``: the reference on the cache's K (kernel view), exact Q and V;
    * ``v_quantization``: the reference on the cache's V, exact Q and K;
    * ``q_quantization``: the reference on e4m3 Q (``q_path="e4m3"``) or bf16 Q, exact K and V;
    * ``p_rounding``: the emulator vs the emulator with fp32 P (``p_format="fp32"``, ``p_scale=1``),
      both on the quantized cache and Q;
    * ``split_merging``: the emulator with ``plan`` (default: the kernel's) vs without splitting;
      0 when the plan splits nothing. A split references each chunk's P to the chunk's own max, so
      this includes re-rounding P (same order as ``p_rounding``); the merge's own effect on the LSE
      is fp32 noise;
    * ``total``: the emulator vs the exact reference.

    Args:
        q: float ``(num_seqs * q_len, h_q, d)`` in real units; k, v: float real-unit K/V
            ``(num_seqs, L, h_k, d)`` or lists of ``(L_i, h_k, d)``.
        fmt: KV format; q_path: ``"e4m3"`` or ``"bf16"``; page_size, granularity: of the cache.
        plan: the split plan for the emulator (default: the kernel's, planned for ``target``).
        target: the :class:`~mjolnir_numerics.targets.Target` (or its name) the emulator models (default:
            that of q's device, see :func:`~mjolnir_numerics.targets.default_target`).
        knobs: emulator knobs for every emulator run (P rounding is overridden for its baseline). Default:
            the ideal arithmetic (``EmulatorKnobs(mma="ideal", log="correctly_rounded",
            ex2="correctly_rounded")``), so that every source is measured against a baseline of the same
            arithmetic; with ``mma="hardware"`` the ``p_rounding`` row also holds what the hardware MMA model
            adds (its fp32-P baseline is ideal).
        allow_unsupported: the emulator's research switch (e.g. head dim 64), see :func:`emulate_decode`.

    Returns:
        list of :class:`ErrorRow`, in :data:`ERROR_SOURCES` order.
    """
    if q_path not in ("e4m3", "bf16"):
        raise ValueError(f"q_path: {q_path!r} is not one of e4m3, bf16")
    knobs = knobs or EmulatorKnobs(mma="ideal", log="correctly_rounded", ex2="correctly_rounded")
    ks, vs = _kv_lists(k, v)
    num_seqs, heads_k = len(ks), ks[0].shape[1]
    cache = PagedKVCache.from_float(ks, vs, fmt, page_size=page_size, granularity=granularity, shuffle=True)
    kq, vq = zip(*(cache.gather(s) for s in range(num_seqs)))
    common = dict(softmax_scale=softmax_scale, q_len=q_len, causal=causal)
    if q_path == "e4m3":
        q_in, qd = quantize_q(q, num_seqs, q_len, heads_k)
    else:
        q_in, qd = q.to(torch.bfloat16), None
    o_ref, lse_ref = reference_decode(q, ks, vs, **common)
    rows = []
    o, lse = reference_decode(q, list(kq), vs, **common)
    rows.append(error_metrics("k_quantization", o, o_ref, lse, lse_ref))
    o, lse = reference_decode(q, ks, list(vq), **common)
    rows.append(error_metrics("v_quantization", o, o_ref, lse, lse_ref))
    o, lse = reference_decode(q_in, ks, vs, q_descale=qd, **common)
    rows.append(error_metrics("q_quantization", o, o_ref, lse, lse_ref))

    def emu(**kw):
        return emulate_decode(
            q_in, cache, q_descale=qd, target=target, allow_unsupported=allow_unsupported, **common, **kw
        )

    o_emu, lse_emu = emu(plan=plan, knobs=knobs)
    fp32_p = EmulatorKnobs(
        p_scale=1.0, p_format="fp32", row_sum=knobs.row_sum, v_descale_at=knobs.v_descale_at, lse_base=knobs.lse_base,
        mma="ideal", log=knobs.log, ex2=knobs.ex2,
    )  # fmt: skip
    o_np, lse_np = emu(plan=plan, knobs=fp32_p)
    rows.append(error_metrics("p_rounding", o_emu, o_np, lse_emu, lse_np))
    o_ns, lse_ns = emu(chunk_tiles=0, knobs=knobs)
    rows.append(error_metrics("split_merging", o_emu, o_ns, lse_emu, lse_ns))
    rows.append(error_metrics("total", o_emu, o_ref, lse_emu, lse_ref))
    return rows
