"""The occupancy-pinned split-KV plan, shared by the emulator and the kernels.

The decode grid is ``(work items, query tiles, kv heads)``; one wave of CTA slots holds
``slots = sm_count * ctas_per_sm // (heads_k * n_q_tiles)`` work items. Each sequence of ``L`` keys is
``max(1, ceil(L / 128))`` tiles of :data:`TILE_KEYS` keys (an empty sequence still gets one tile, so its
CTA writes O = 0 and LSE = -inf). The plan picks the SMALLEST chunk size (in tiles) such that all chunks
of all sequences fit one wave, then cuts every sequence into contiguous chunks of that size (the last
one may be short). Long sequences get more chunks than short ones, so varlen batches balance, and
each CTA streams one contiguous KV range front to back (the FlashInfer / FlashDecoding scheme).

* When the batch alone fills a wave (``num_seqs >= slots``) or ``max_splits == 1``, nothing is split.
* A sequence never gets more than ``max_splits`` chunks (the reduction's compile-time bound).
* ``force_splits > 0`` cuts the longest sequence into that many chunks instead (still capped).
* Work items are ordered longest first (stable), so the waves after the first get the short ones.
* ``pad_to > 0`` appends empty items ``(0, 0, 0, 0)`` up to a fixed count (a fixed grid for CUDA
  graphs); they exit at once.

The occupancy plan's chunk size depends on the whole batch, so a sequence's bits depend on its
neighbours (a split re-rounds P against each chunk's own max, and the merge adds in fp32). The
**batch-invariant** plan (``default_plan(..., mode="batch_invariant")``, or ``plan="batch_invariant"`` in
``emulate_decode`` and ``mjolnir_kernel.decode``) cuts each sequence as the occupancy plan would cut it
alone in the batch: its chunk size depends only on its own length, the problem's shape (KV heads, query
tiles) and the target. Serving a request alone or inside any batch then gives the same bits; a batch of
long sequences gets more chunks (and more reduction work) than the occupancy plan would give it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import torch

from .checks import ArgumentTypeError, check_int, check_tensor
from .targets import Target, get_target

__all__ = ["TILE_KEYS", "PLAN_MODES", "SplitPlan", "plan_split_kv", "chunked_plan", "default_plan"]

PLAN_MODES = ("occupancy", "batch_invariant")

TILE_KEYS = 128
"""Keys per KV tile: the M of the S = K.Q GEMM (one key row per thread of the softmax warpgroup)."""


def _tiles(seq_len: int) -> int:
    return max(1, math.ceil(seq_len / TILE_KEYS))


@dataclass(frozen=True)
class SplitPlan:
    """A split-KV plan.

    Attributes:
        work: tuple of ``(seq, tile_begin, tile_end, split_slot)`` work items, one CTA each (per q tile and
            kv head): tiles ``[tile_begin, tile_end)`` of sequence ``seq``; ``split_slot`` is the chunk's
            index inside its sequence (where its partials go). Padding items are ``(0, 0, 0, 0)``.
        n_splits: chunks per sequence (1: the sequence is not split and writes its final output in decode).
        chunk_tiles: tiles per chunk (a sequence's last chunk may be shorter); in a batch-invariant plan,
            where each sequence has its own chunk size, the largest.
        slots: work items that fit one wave.
    """

    work: tuple[tuple[int, int, int, int], ...]
    n_splits: tuple[int, ...]
    chunk_tiles: int
    slots: int

    @property
    def num_work(self) -> int:
        """Number of work items, padding included (the grid's first dimension)."""
        return len(self.work)

    @property
    def num_seqs(self) -> int:
        return len(self.n_splits)

    def chunks(self) -> tuple[tuple[int, int, int, int], ...]:
        """The non-empty work items, sorted by (seq, split_slot)."""
        return tuple(sorted((w for w in self.work if w[2] > w[1]), key=lambda w: (w[0], w[3])))

    def work_tensor(self, device: Union[str, torch.device] = "cpu") -> torch.Tensor:
        """The work list as an int32 ``(num_work, 4)`` tensor (one empty item when the list is empty)."""
        rows = list(self.work) if self.work else [(0, 0, 0, 0)]
        return torch.tensor(rows, dtype=torch.int32).reshape(-1, 4).to(device)

    def n_splits_tensor(self, device: Union[str, torch.device] = "cpu") -> torch.Tensor:
        """Chunks per sequence as an int32 ``(num_seqs,)`` tensor."""
        return torch.tensor(self.n_splits, dtype=torch.int32).to(device)

    def check(self, seq_lens: Sequence[int], argument: str = "plan") -> None:
        """Raise ValueError unless the plan covers every tile of every sequence exactly once, in
        contiguous chunks numbered ``0 .. n_splits - 1`` in key order."""
        seq_lens = _seq_lens(seq_lens)
        if len(self.n_splits) != len(seq_lens):
            raise ValueError(f"{argument}: plans {len(self.n_splits)} sequences, the batch has {len(seq_lens)}")
        per_seq: dict[int, list[tuple[int, int, int]]] = {}
        for w in self.work:
            if len(w) != 4:
                raise ValueError(f"{argument}: work item {w!r} is not (seq, tile_begin, tile_end, split_slot)")
            b, t0, t1, j = (int(x) for x in w)
            if t1 == t0:
                continue  # padding
            if not 0 <= b < len(seq_lens) or t1 < t0:
                raise ValueError(f"{argument}: work item {w!r} is out of range for {len(seq_lens)} sequences")
            per_seq.setdefault(b, []).append((j, t0, t1))
        for b, L in enumerate(seq_lens):
            items = sorted(per_seq.get(b, []))
            want = _tiles(L)
            if [j for j, _, _ in items] != list(range(len(items))) or len(items) != self.n_splits[b]:
                raise ValueError(
                    f"{argument}: sequence {b} has split slots {[j for j, _, _ in items]}, "
                    f"expected 0..{self.n_splits[b] - 1}"
                )
            edge = 0
            for _, t0, t1 in items:
                if t0 != edge:
                    raise ValueError(f"{argument}: sequence {b} chunks are not contiguous at tile {edge} (got {t0})")
                edge = t1
            if edge != want:
                raise ValueError(f"{argument}: sequence {b} (seq_len {L}) has {want} tiles, the plan covers {edge}")

    def __repr__(self) -> str:
        real = sum(1 for w in self.work if w[2] > w[1])
        pad = self.num_work - real
        return (
            f"SplitPlan(chunk_tiles={self.chunk_tiles}, work={real}{f'+{pad} pad' if pad else ''}, "
            f"slots={self.slots}, max_chunks={max(self.n_splits, default=0)})"
        )


def _check_int(name: str, value, low: int) -> int:
    return check_int(name, value, low=low)


def _seq_lens(seq_lens) -> list[int]:
    """``seq_lens`` (a list / tuple of ints >= 0 or a 1-D integer tensor) as a non-empty list of ints."""
    if isinstance(seq_lens, torch.Tensor):
        check_tensor("seq_lens", seq_lens, kind="int", dim=1)
        seq_lens = seq_lens.tolist()
    elif not isinstance(seq_lens, (list, tuple)):
        raise ArgumentTypeError(f"seq_lens: expected a list of ints or an int tensor, got {type(seq_lens).__name__}")
    if not seq_lens:
        raise ValueError("seq_lens: expected at least one sequence")
    if all(type(L) is int and L >= 0 for L in seq_lens):  # the common case, without a call per length
        return list(seq_lens)
    return [check_int(f"seq_lens[{i}]", L, low=0) for i, L in enumerate(seq_lens)]


def plan_split_kv(
    seq_lens: Union[Sequence[int], torch.Tensor],
    heads_k: int,
    n_q_tiles: int = 1,
    sm_count: int = 20,
    ctas_per_sm: int = 2,
    max_splits: int = 16,
    force_splits: int = 0,
    min_chunk_tiles: int = 1,
    pad_to: int = 0,
) -> SplitPlan:
    """Occupancy-pinned split-KV plan (see the module docstring).

    Args:
        seq_lens: keys per sequence, ints >= 0 (a list or an integer tensor).
        heads_k: kv heads (CTAs per work item along the grid's z).
        n_q_tiles: query-row tiles per kv head (grid y).
        sm_count: SMs of the target (20 on Jetson AGX Thor).
        ctas_per_sm: resident CTAs per SM.
        max_splits: most chunks per sequence.
        force_splits: > 0 cuts the longest sequence into this many chunks (others by the same chunk size).
        min_chunk_tiles: smallest chunk size in tiles.
        pad_to: > 0 pads the work list to this many items.

    Returns:
        SplitPlan.

    Raises:
        ValueError: an argument out of range, or ``pad_to`` below the number of work items.
    """
    seq_lens = _seq_lens(seq_lens)
    for name, v, low in (
        ("heads_k", heads_k, 1),
        ("n_q_tiles", n_q_tiles, 1),
        ("sm_count", sm_count, 1),
        ("ctas_per_sm", ctas_per_sm, 1),
        ("max_splits", max_splits, 1),
        ("force_splits", force_splits, 0),
        ("min_chunk_tiles", min_chunk_tiles, 1),
        ("pad_to", pad_to, 0),
    ):
        _check_int(name, v, low)

    tiles = [_tiles(L) for L in seq_lens]
    longest = max(tiles)
    slots = max(1, (sm_count * ctas_per_sm) // (heads_k * n_q_tiles))
    lo = max(min_chunk_tiles, math.ceil(longest / max_splits))  # at most max_splits chunks per sequence
    if force_splits > 0:
        chunk = max(lo, math.ceil(longest / force_splits))
    elif len(tiles) >= slots or max_splits == 1:
        chunk = longest
    else:
        hi = max(lo, longest)
        while lo < hi:  # bisect the smallest chunk whose chunk count fits one wave (monotone in chunk)
            mid = (lo + hi) // 2
            if sum(math.ceil(t / mid) for t in tiles) <= slots:
                hi = mid
            else:
                lo = mid + 1
        chunk = lo
    work: list[tuple[int, int, int, int]] = []
    n_splits: list[int] = []
    for b, t in enumerate(tiles):
        k = math.ceil(t / chunk)
        n_splits.append(k)
        work.extend((b, j * chunk, min((j + 1) * chunk, t), j) for j in range(k))
    work.sort(key=lambda w: w[1] - w[2])  # longest first; sort is stable
    if pad_to:
        if pad_to < len(work):
            raise ValueError(f"pad_to: {pad_to} is below the plan's {len(work)} work items")
        work.extend([(0, 0, 0, 0)] * (pad_to - len(work)))
    return SplitPlan(tuple(work), tuple(n_splits), chunk, slots)


def chunked_plan(seq_lens: Union[Sequence[int], torch.Tensor], chunk_tiles: int = 0) -> SplitPlan:
    """A plan cutting every sequence into chunks of ``chunk_tiles`` tiles (0: no split), the
    seed emulator's ``chunk_tiles`` argument. ``slots`` is set to the number of work items."""
    seq_lens = _seq_lens(seq_lens)
    _check_int("chunk_tiles", chunk_tiles, 0)
    tiles = [_tiles(L) for L in seq_lens]
    chunk = chunk_tiles or max(tiles)
    work, n_splits = [], []
    for b, t in enumerate(tiles):
        k = math.ceil(t / chunk)
        n_splits.append(k)
        work.extend((b, j * chunk, min((j + 1) * chunk, t), j) for j in range(k))
    return SplitPlan(tuple(work), tuple(n_splits), chunk, len(work))


def default_plan(
    seq_lens: Union[Sequence[int], torch.Tensor],
    heads_k: int,
    n_q: int,
    *,
    target: Union[str, Target],
    q_dtype: str = "bf16",
    head_dim: int = 128,
    pad_to: int = 0,
    mode: str = "occupancy",
) -> SplitPlan:
    """The plan a decode call makes when it is given none: :func:`plan_split_kv` with the target's SM
    count, CTAs per SM (at ``head_dim``), query tiles (for ``n_q`` rows on the ``q_dtype`` path) and
    split limit. ``mjolnir_kernel.decode`` and :func:`~mjolnir_numerics.emulate_decode` both call it, so
    with default arguments they walk the same chunks on every target.

    ``mode="batch_invariant"`` cuts every sequence as the occupancy plan cuts it alone (the module
    docstring): its chunks, hence its bits, do not depend on the rest of the batch.

    Args:
        seq_lens: keys per sequence (ints >= 0, a list or an integer tensor).
        heads_k: KV heads.
        n_q: packed query rows per KV head, ``q_len * h_q / h_k``.
        target: a :class:`~mjolnir_numerics.targets.Target` or its name (``"thor"``, ``"h200"`` ...).
        q_dtype: ``"bf16"`` or ``"e4m3"`` (the e4m3-Q path may need a wider query tile).
        head_dim: d (the CTAs per SM may depend on it).
        pad_to: > 0 pads the work list to this many items (a fixed grid for CUDA graphs).
        mode: ``"occupancy"`` (one chunk size for the batch, filling one wave) or ``"batch_invariant"``.

    Raises:
        ValueError: as :func:`plan_split_kv`, or for an unknown target, head dim or mode.
    """
    t = get_target(target)
    if mode not in PLAN_MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(PLAN_MODES)}")
    if mode == "batch_invariant":
        seq_lens = _seq_lens(seq_lens)
        alone = [
            plan_split_kv([L], heads_k, n_q_tiles=t.n_q_tiles(n_q, q_dtype), sm_count=t.sm_count,
                          ctas_per_sm=t.ctas(head_dim), max_splits=t.max_splits)
            for L in seq_lens
        ]  # fmt: skip
        work = [(b, *w[1:]) for b, p in enumerate(alone) for w in p.work]
        work.sort(key=lambda w: w[1] - w[2])  # longest first, as the occupancy plan; stable
        _check_int("pad_to", pad_to, 0)
        if pad_to:
            if pad_to < len(work):
                raise ValueError(f"pad_to: {pad_to} is below the plan's {len(work)} work items")
            work.extend([(0, 0, 0, 0)] * (pad_to - len(work)))
        n_splits = tuple(p.n_splits[0] for p in alone)
        return SplitPlan(tuple(work), n_splits, max(p.chunk_tiles for p in alone), alone[0].slots)
    return plan_split_kv(
        seq_lens, heads_k, n_q_tiles=t.n_q_tiles(n_q, q_dtype), sm_count=t.sm_count, ctas_per_sm=t.ctas(head_dim),
        max_splits=t.max_splits, pad_to=pad_to,
    )  # fmt: skip
