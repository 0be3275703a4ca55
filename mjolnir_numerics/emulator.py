"""The decode spec: a bit-faithful emulator of the paged decode kernels (docs/numerics.md, "The kernel's
arithmetic").

:func:`emulate_decode` takes what the kernel takes, in vLLM shapes, and walks the same plan, the same
128-key tiles and the same rounding points; the stages live in :mod:`mjolnir_numerics.emulator_stages`
(one function per kernel stage, and the single statement of what is modelled and what is bounded).

Vectorization: all work items (chunks of the split plan, or each chunk's tile streams where the target
walks it in several: ``Target.tile_streams``) of all sequences and all kv heads advance together, one
item-local tile index at a time (the fp32 recurrences are sequential in the tile index); items that have
run out of tiles sit the remaining steps out. Only the pages a tile needs
are decoded, so memory stays at a few tiles of K/V for the whole batch.

On CUDA the same stages run in larger batches and with fewer host round trips, for the same bits (the
tests run these paths on the CPU too): steps 3-7 (S, the masks, the running max, P and the row-sum
factors) for a window of up to 64 consecutive tiles at once, since none of them depends on l or O (max
is exact, so the running max over a window is the tile-by-tile one); the S chains as one compiled
formula on packed integer operands (``arithmetic.chain_gemm``: no tensor of products is written, each
product's truncation an integer shift); steps 8-9 of each tile, the P.V chain in its float64 form, as
one compiled graph (the integer form measured slower there: reports/emulator/2026-12-04-gpu-int-chain.md);
steps 4-8's factors of a window, the epilogue and the split merge each as one compiled graph too; and the
stages' branch-free forms (no data-dependent shortcut that would ask the device; every emulated fp32
rounding written so that no compiler pass drops it: docs/numerics.md, "Roundings that compilers keep").
A window of every chunk, all its tiles inside their sequences, is captured once as a CUDA graph per kind
(its tile count, and whether it is the chunks' first) and replayed for the windows of its kind (one launch
instead of hundreds of host-side calls; the same kernels, so the same bits). The graphs are kept for the
next calls of the same problem (the last four problems per device: the same shapes, pools, formats and
models), which copy their inputs into the graphs' tensors and replay every such window, the first included.
The graphs' memory stays in one pool per device between calls (up to a window's working set, about a GiB at
the largest windows, shared by the kept graphs); :func:`release_graph_memory` lets it go. ``MJOLNIR_COMPILE=0``
keeps CUDA eager. The first call of a process compiles and tunes the graphs (about 4 minutes on the H200's host
for the first shape; torch's inductor cache keeps them across processes).

Deliberate differences from the seed's ``emulate_decode`` (all at the fp32-ulp level on the results;
``tests/numerics/test_emulator.py::test_agrees_with_the_seed_emulator`` bounds them):

* inputs and outputs are the kernel's: vLLM-shaped Q (bf16, or e4m3 plus its descale), the paged
  cache's stored bytes, bf16 O ``(num_seqs * q_len, h_q, d)``; the seed takes packed float values and
  float pools and returns fp32 O before the store (here ``return_details=True`` gives it as ``o_fp32``);
* S and V.P are the target's tensor-core block FMAs in the kernel's order, or with
  ``EmulatorKnobs(mma="ideal")`` exact sums rounded once (the seed: torch fp32 einsum, summation order
  of the BLAS);
* the row sum is the kernel's per-key-row ``fma(corr, l, p)`` reduced by the warp butterfly and the
  4-warp sum (the seed: ``l * corr + p.sum(-1)``);
* O is rescaled only when a column max moved (bit-identical; the seed always rescales);
* unsplit sequences take the kernel's epilogue ``O * (out_scale / (l + 1e-30))`` with
  ``out_scale = scale_o * v_descale * fp32(1 / p_scale)``; the seed sends every sequence through its
  merge (``scale_o * (o * vd / p_scale) / l``, weight exp(0) = 1);
* the reduction is the kernel's (``ex2(log2e * (m_j - m_max))``, 0 for -inf, split-order sums,
  ``scale_o * o * (1 / l)``, 0 where l = 0); the seed uses ``torch.exp`` and a division;
* ex2 is the target's measured SFU (the H200 and H100: ``emulator_stages.exp2_sm90_f32``) or correctly
  rounded with flush-to-zero, log is libdevice's ``logf`` (or correctly rounded) (the seed: torch's libm);
* constants are fp32 (``fp32(fp32(scale) * fp32(log2 e))``; the seed multiplies two doubles first);
* an empty sequence gives O = 0 and LSE = -inf (the seed fails on it);
* rows past the sequence end inside its last page are read, as the kernel reads them (K masked, V
  times p = 0); the seed never gathers them. Identical unless those rows hold NaN.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Optional, Union

import torch

from .arithmetic import (
    MMA_MODELS,
    OPERAND_FORMATS,
    _chain_formula,
    _fused,
    fused_chain_available,
    kstep_groups,
)
from .cache import PagedKVCache, check_descale, descale_table
from .capability import HEAD_DIMS, unsupported_reason
from .checks import ArgumentTypeError, check_bool, check_choice, check_f32, check_int
from .emulator_stages import (
    LOG2E_F32,
    accumulate_pv,
    accumulate_pv_mma,
    accumulate_row_sum,
    div_f32,
    epilogue,
    exp2_f32,
    load_tables,
    exp2_sm90_f32,
    log2_f32,
    log_f32,
    log_libdevice_f32,
    mask_tile,
    reduce_row_sum,
    reduction,
    rescale_o,
    row_sum_correction,
    running_column_max,
    row_norm,
    round_p,
    score_tile,
    score_tile_mma,
    softmax_tile,
)
from .formats import Format, get_format
from .plan import PLAN_MODES, TILE_KEYS, SplitPlan, chunked_plan, default_plan
from .scales import pack_q, unpack_o
from .targets import MAX_TILE_STREAMS, Target, default_target, get_target

__all__ = ["EmulatorKnobs", "DecodeResult", "emulate_decode", "release_graph_memory", "P_FORMATS", "KERNEL_P_SCALE"]

KERNEL_P_SCALE = 448.0
"""The fp8-Q path stores P as e4m3(p * 448): p in [0, 1] spans e4m3's whole range (FlashAttention: 256)."""

P_FORMATS = ("e4m3", "e5m2", "bf16", "fp32")
ROW_SUM_FROM = ("unrounded", "rounded")
V_DESCALE_AT = ("epilogue", "output")
LSE_BASES = ("e", "2")
MMA_ARITHMETIC = ("hardware", "ideal")
LOG_ARITHMETIC = ("hardware", "correctly_rounded")
EX2_ARITHMETIC = ("hardware", "correctly_rounded")
_Q_SIG_BITS = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}
_P_SIG_BITS = {"e4m3": None, "e5m2": 3, "bf16": 8, "fp32": 24}


@dataclass(frozen=True)
class EmulatorKnobs:
    """Research knobs; every default is the kernel on the emulated target.

    Attributes:
        p_scale: P is rounded as ``fmt(p * p_scale)`` and ``1 / p_scale`` folds into the output scale.
            None: the kernel's (448 on the fp8-Q path, 1 on the bf16-Q path); FlashAttention uses 256.
        p_format: ``"e4m3"``, ``"e5m2"``, ``"bf16"``, ``"fp32"``; None: the kernel's (e4m3 for fp8 Q,
            bf16 for bf16 Q).
        row_sum: ``"unrounded"`` (kernel: fma over the fp32 p) or ``"rounded"`` (over
            ``fmt(p * p_scale) / p_scale``, as FlashAttention 3 does).
        v_descale_at: ``"epilogue"`` (kernel: folded into the fp32 output scale) or ``"output"``
            (FlashInfer: ``bf16(bf16(o) * v_descale)`` after the output is rounded).
        lse_base: ``"e"`` (kernel: natural log) or ``"2"`` (FlashInfer).
        mma: ``"hardware"`` (the target's MMA model: ``mjolnir_numerics.arithmetic``, its instructions in the
            kernel's order), ``"ideal"`` (each tile's contraction exact, rounded once to nearest), or None:
            hardware where the kernel runs the configuration (its P format, bf16 or e4m3 Q), else ideal.
        log: the LSE's natural log: ``"hardware"`` (the target's: libdevice ``logf``,
            :func:`~mjolnir_numerics.emulator_stages.log_libdevice_f32`), ``"correctly_rounded"``, or None:
            as ``mma``, the target's where the kernel runs the configuration, else correctly rounded.
            ``lse_base="2"`` (not a kernel's) always takes the correctly rounded log2.
        ex2: ``ex2.approx.ftz.f32`` (p, the correction, the split weights): ``"hardware"`` (the target's
            measured SFU where it has one: :func:`~mjolnir_numerics.emulator_stages.exp2_sm90_f32` on the
            H200 and H100; correctly rounded on targets with none measured), ``"correctly_rounded"``
            (with flush to zero), or None: as ``mma``, the target's where the kernel runs the
            configuration, else correctly rounded.
        tile_streams: how each work item walks its tiles (:attr:`~mjolnir_numerics.targets.Target.tile_streams`):
            None, the target's (1 on every target today: front to back); S in 2 .. 32, S interleaved streams of
            tiles, each with its own online softmax, merged by the split reduction. A walk no kernel runs
            yet (the Hopper target's two-warpgroup candidate): its accuracy, and the spec it would be
            tested against.
    """

    p_scale: Optional[float] = None
    p_format: Optional[str] = None
    row_sum: str = "unrounded"
    v_descale_at: str = "epilogue"
    lse_base: str = "e"
    mma: Optional[str] = None
    log: Optional[str] = None
    ex2: Optional[str] = None
    tile_streams: Optional[int] = None

    def __post_init__(self):
        if self.tile_streams is not None:
            check_int("tile_streams", self.tile_streams, low=1, high=MAX_TILE_STREAMS)
        if self.p_format is not None and self.p_format not in P_FORMATS:
            raise ValueError(f"p_format: {self.p_format!r} is not one of {', '.join(P_FORMATS)}")
        if self.p_scale is not None and not (math.isfinite(self.p_scale) and self.p_scale > 0):
            raise ValueError(f"p_scale: expected a positive finite float, got {self.p_scale!r}")
        for name, val, allowed in (
            ("row_sum", self.row_sum, ROW_SUM_FROM),
            ("v_descale_at", self.v_descale_at, V_DESCALE_AT),
            ("lse_base", self.lse_base, LSE_BASES),
            ("mma", self.mma, MMA_ARITHMETIC + (None,)),
            ("log", self.log, LOG_ARITHMETIC + (None,)),
            ("ex2", self.ex2, EX2_ARITHMETIC + (None,)),
        ):
            if val not in allowed:
                raise ValueError(f"{name}: {val!r} is not one of {', '.join(str(a) for a in allowed)}")


@dataclass(frozen=True)
class DecodeResult:
    """Outputs of :func:`emulate_decode` with ``return_details=True``.

    Attributes:
        o: bf16 ``(num_seqs * q_len, h_q, d)``.
        lse: float32 ``(num_seqs, h_k, q_len * h_r)`` (natural log unless ``lse_base="2"``).
        o_fp32: float32 ``(num_seqs, h_k, q_len * h_r, d)``: the packed output just before the bf16
            store (for ``v_descale_at="output"``, before the first bf16 rounding).
        plan: the plan that was walked.
    """

    o: torch.Tensor
    lse: torch.Tensor
    o_fp32: torch.Tensor
    plan: SplitPlan
    extras: dict = field(default_factory=dict)


def _f32(x: float) -> float:
    """A Python float rounded to fp32 (a constant at device precision)."""
    return float(torch.tensor(x, dtype=torch.float32))


def _check_cache(cache) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-validate what the kernel relies on (tensors may have been edited in place)."""
    sl = cache.seq_lens
    bt = cache.block_table
    if not isinstance(sl, torch.Tensor) or sl.dim() != 1 or sl.is_floating_point():
        raise ValueError(f"seq_lens: expected an integer (num_seqs,) tensor, got {getattr(sl, 'shape', type(sl))}")
    if not isinstance(bt, torch.Tensor) or bt.dim() != 2 or bt.shape[0] != sl.shape[0] or bt.is_floating_point():
        raise ValueError(
            f"block_table: expected an integer (num_seqs={sl.shape[0]}, max_blocks) tensor, "
            f"got {getattr(bt, 'shape', type(bt))}"
        )
    sl_cpu = sl.long().cpu()
    if sl_cpu.numel() and int(sl_cpu.min()) < 0:
        raise ValueError(f"seq_lens: must be >= 0, got {sl_cpu.tolist()[:8]}")
    ps = cache.page_size
    need = (sl_cpu + ps - 1) // ps
    if need.numel() and int(need.max()) > bt.shape[1]:
        s = int(need.argmax())
        raise ValueError(
            f"seq_lens: sequence {s} has {int(sl_cpu[s])} keys = {int(need[s])} pages of {ps}, but its "
            f"block_table row holds {bt.shape[1]} pages"
        )
    bt_cpu = bt.long().cpu()
    used = torch.arange(bt.shape[1])[None, :] < need[:, None]
    refs = bt_cpu[used]
    if refs.numel() and (int(refs.min()) < 0 or int(refs.max()) >= cache.num_pages):
        raise ValueError(
            f"block_table: referenced page indices must be in 0..{cache.num_pages - 1}, got range "
            f"[{int(refs.min())}, {int(refs.max())}]"
        )
    n, hk = sl.shape[0], cache.heads_k
    check_descale(cache.k_descale, n, hk, "k_descale")
    check_descale(cache.v_descale, n, hk, "v_descale")
    return sl_cpu, bt_cpu


_E4M3_TABLES: dict = {}


def _e4m3_table(device) -> torch.Tensor:
    """float64 value of every e4m3 code (NaN for 0x7F / 0xFF), cached per device."""
    key = str(device)
    if key not in _E4M3_TABLES:
        from .formats import E4M3

        _E4M3_TABLES[key] = E4M3.values(device).double()
    return _E4M3_TABLES[key]


def _unique_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(rows, dim=0, return_inverse=True)`` of int64 page lists ``rows (A, n)``, ``A >= 1``, with
    values >= -1 (-1: past the sequence's end): the same rows in the same (lexicographic) order. When each
    row fits one int64 key (``(max + 2) ** n < 2**62``), a 1-D unique of the keys, several times faster on
    the CPU."""
    base, n = int(rows.max()) + 2, rows.shape[1]
    if base**n >= 1 << 62:
        return torch.unique(rows, dim=0, return_inverse=True)
    weights = torch.tensor([base ** (n - 1 - j) for j in range(n)], dtype=torch.int64, device=rows.device)
    keys, inv = torch.unique(((rows + 1) * weights).sum(1), return_inverse=True)  # digits in [0, base): monotone
    return (keys[:, None] // weights) % base - 1, inv


class _TileSource:
    """One KV tile of every active chunk, gathered but not yet decoded (decoding happens per block of
    chunks, so the float64 values stay in cache between the decode and the tile's GEMM).

    ``data`` is ``(A, T, G, D)``: e4m3 codes (uint8) for e4m3 pools and, on the fused (CUDA) path, for every
    format (``cache._page_codes``), else the float32 MMA values from ``cache.page_values``. Keys on pages at
    or past the sequence end are 0 (code 0): the kernel passes an out-of-range page index there and TMA
    zero-fills the box, whatever the block table holds.

    On the CPU, when at most half the chunks' tiles are distinct (the sequences of a prefix cache share
    pages), each distinct tile is decoded once to float64 instead (``tiles`` ``(U, G, T, D)`` and the
    chunks' ``index`` into it): the same values, without decoding a shared page once per sequence, and
    the ideal arithmetic's GEMMs run once per distinct tile over the stacked rows of every chunk that
    reads it (:meth:`groups`; the same bits: each S and O element is the exact contraction rounded once,
    whatever the GEMM's shape and order).
    """

    def __init__(self, cache, which: str, seqs: torch.Tensor, tiles: torch.Tensor, seq_lens, bt, inside=False):
        """``inside``: the caller knows (on the host) that every key of these tiles lies before its sequence's
        end, so no page needs zeroing (on CUDA the zeroing pass over the gathered tiles is skipped)."""
        ps = cache.page_size
        dev = seqs.device
        if ps <= TILE_KEYS:
            npp = TILE_KEYS // ps
            blk = tiles[:, None] * npp + torch.arange(npp, device=dev)[None, :]
            offset = None
        else:
            blk = (tiles * TILE_KEYS // ps)[:, None]
            offset = (tiles * TILE_KEYS) % ps
        valid = blk * ps < seq_lens[seqs][:, None]
        blk_c = blk.clamp(max=bt.shape[1] - 1)
        pages = torch.where(valid, bt[seqs[:, None], blk_c], torch.zeros_like(blk_c))
        pool = cache.k_pool if which == "k" else cache.v_pool
        e4m3_pool = isinstance(cache.fmt, Format) and cache.fmt.bits == 8 and pool.dtype == torch.float8_e4m3fn
        # the fused (CUDA) path takes every format's tiles as e4m3 codes, one byte a value: the MMA operands are
        # e4m3 values in every format (PagedKVCache._page_codes), and the S chain packs codes inside its graph
        sub_byte_codes = not e4m3_pool and fused_chain_available(dev)
        self.codes = e4m3_pool or sub_byte_codes
        self.device, self.head_dim = dev, int(cache.head_dim)
        self.tiles = self.index = None

        def decode(p: torch.Tensor) -> torch.Tensor:  # (..., PS, G, D) per page index
            if sub_byte_codes:
                return cache._page_codes(which, p.to(pool.device)).to(dev)
            if self.codes:  # gathered as float8 (torch's uint8 gather path is ~40x slower on CPU), kept as codes
                return pool[p.to(pool.device)].view(torch.uint8).to(dev)
            # unchecked: every index here is a page of the block table (checked once) or 0; the check would
            # ask the device twice per call
            return cache._page_values(which, p.to(pool.device), kernel_view=True).to(dev)

        if dev.type == "cpu" and offset is None:
            masked = torch.where(valid, pages, -1)  # -1: a page past the sequence's end (zeros)
            uniq, inv = _unique_rows(masked)
            if 2 * uniq.shape[0] <= masked.shape[0]:
                vals = decode(uniq.clamp(min=0))  # (U, npp, PS, G, D)
                vals = _e4m3_table(dev)[vals.long()] if self.codes else vals.double()
                vals = torch.where((uniq >= 0)[:, :, None, None, None], vals, 0.0)
                u, n_p, p_s, g, d = vals.shape
                self.tiles = vals.reshape(u, n_p * p_s, g, d).transpose(1, 2).contiguous()
                self.index = inv
                return
        raw = decode(pages)
        a, n_p, p_s, g, d = raw.shape
        raw = raw.reshape(a, n_p * p_s, g, d)
        if offset is not None:
            rows = offset[:, None] + torch.arange(TILE_KEYS, device=dev)[None, :]
            raw = raw[torch.arange(a, device=dev)[:, None], rows]
        if not inside and (dev.type != "cpu" or not bool(valid.all())):  # CUDA: asking would stall the queue
            key_valid = (
                valid.repeat_interleave(ps, dim=1)[:, :TILE_KEYS] if offset is None else valid.expand(a, TILE_KEYS)
            )
            raw = torch.where(key_valid[:, :, None, None], raw, torch.zeros((), dtype=raw.dtype, device=dev))
        self.data = raw

    def part(self, a0: int, a1: int) -> "_TileSource":
        """The tiles ``a0 .. a1 - 1`` (a view)."""
        other = object.__new__(_TileSource)
        other.codes, other.device, other.head_dim = self.codes, self.device, self.head_dim
        other.tiles, other.index = self.tiles, None if self.index is None else self.index[a0:a1]
        if self.tiles is None:
            other.data = self.data[a0:a1]
        return other

    def groups(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Shared tiles: ``(tile, chunks)`` per distinct tile, ``tile`` float64 ``(G, T, D)`` and ``chunks``
        the int64 indices of the chunks that read it (ascending)."""
        order = torch.argsort(self.index, stable=True)
        counts = torch.bincount(self.index, minlength=self.tiles.shape[0]).tolist()
        return [(self.tiles[u], c) for u, c in enumerate(torch.split(order, counts)) if c.numel()]

    def operand(self) -> torch.Tensor:
        """``(A, G, T, D)`` values in the narrowest dtype that holds them exactly (float8 for e4m3 codes,
        else float32): the fused MMA chain widens them as it reads them (CUDA: never shared tiles)."""
        assert self.tiles is None, "shared tiles are a CPU layout"
        blk = self.data.transpose(1, 2)
        return blk.view(torch.float8_e4m3fn) if self.codes else blk

    def values(self, a0: int, a1: int, workspace: dict) -> torch.Tensor:
        """float64 ``(a1 - a0, G, T, D)`` values of chunks ``a0 .. a1 - 1``, written into a reused
        workspace buffer (fresh multi-MiB CPU allocations cost more than the decode itself)."""
        if self.tiles is not None:
            out = _buffer(workspace, "values", (a1 - a0, *self.tiles.shape[1:]), torch.float64, self.device)
            return torch.index_select(self.tiles, 0, self.index[a0:a1], out=out)
        blk = self.data[a0:a1].transpose(1, 2)
        out = _buffer(workspace, "values", blk.shape, torch.float64, self.device)
        if self.codes:  # a 256-entry float64 table: the cheapest exact decode on CPU (fp8 casts are slow)
            idx = _buffer(workspace, "codes", blk.shape, torch.int32, self.device)
            idx.copy_(blk)
            torch.index_select(_e4m3_table(self.device), 0, idx.view(-1), out=out.view(-1))
        else:
            out.copy_(blk)
        return out


def _host_tensor(data, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(data, dtype=dtype)`` on ``device``. On CUDA the copy goes through pinned memory without
    blocking: a copy from pageable memory synchronises the stream, so the host would wait for all the work
    queued (the windows' masks and the epilogue's indices are built while the device is busy)."""
    t = torch.tensor(data, dtype=dtype)
    if device.type != "cuda":
        return t.to(device)
    if torch.cuda.is_current_stream_capturing():  # a replay would read the pinned buffer again, reused by then
        raise RuntimeError("_host_tensor: host data cannot be copied inside a CUDA graph capture")
    return t.pin_memory().to(device, non_blocking=True)


def _buffer(workspace: dict, name: str, shape, dtype, device) -> torch.Tensor:
    """A reused scratch tensor of ``shape`` (contents undefined)."""
    n = math.prod(shape)
    buf = workspace.get(name)
    if buf is None or buf.numel() < n or buf.dtype != dtype:
        buf = torch.empty(max(n, 1), dtype=dtype, device=device)
        workspace[name] = buf
    return buf[:n].view(shape)


# -- Tuning (CPU; results do not depend on any of these) ------------------------------------------
# Bytes of float64 (chunk, kv head) tiles decoded per block: 4 MiB (16 tiles of 128 x 256) stay in cache
# until their GEMM reads them (measured ~4x faster than decoding a whole step first; 8 and 16 tiles of
# d = 256 measured equal, 4 and 32 slower). Narrower heads take more tiles per block, for fewer calls.
_BLOCK_BYTES = 4 << 20
# Narrow operands of the exact GEMMs (e4m3 Q rows for S, e4m3 P rows for V.P) are padded with zero
# rows to at least this many: MKL's float64 GEMM runs 8-row operands 10-20% faster than 6-row ones
# (h_r = 6). Zero rows only add rows of exact zeros, which are dropped.
_MIN_GEMM_ROWS = 8


# CUDA: tiles per chunk whose steps 3-7 run as one batch (the fp32 recurrences of l and O stay tile by
# tile), sized so that the window's scores, P and operands stay near _WINDOW_BYTES; on the CPU one tile
# (the block loop below keeps its operands in cache instead).
_WINDOW_BYTES = 1 << 30
_MAX_WINDOW = 64


def _window(device, heads_k: int, n_rows: int, head_dim: int, tile_keys: int, num_chunks: int) -> int:
    if torch.device(device).type == "cpu" or num_chunks == 0:
        return 1
    per_tile = num_chunks * heads_k * tile_keys * (2 * head_dim * 4 + n_rows * 64)  # operands, S / P / ex2 temporaries
    return max(1, min(_MAX_WINDOW, _WINDOW_BYTES // per_tile))


def _blocks(num_chunks: int, heads_k: int, head_dim: int, device) -> list[tuple[int, int]]:
    if torch.device(device).type != "cpu":
        return [(0, num_chunks)]
    step = max(1, _BLOCK_BYTES // (heads_k * TILE_KEYS * head_dim * 8))
    return [(a0, min(num_chunks, a0 + step)) for a0 in range(0, num_chunks, step)]


def _pad_rows(x: torch.Tensor) -> torch.Tensor:
    """``x (..., M, K)`` with zero rows appended up to ``_MIN_GEMM_ROWS`` (see the tuning block)."""
    m = x.shape[-2]
    if m >= _MIN_GEMM_ROWS:
        return x
    return torch.cat([x, x.new_zeros((*x.shape[:-2], _MIN_GEMM_ROWS - m, x.shape[-1]))], dim=-2)


def _stack_rows(x: torch.Tensor) -> torch.Tensor:
    """``(A, G, R, K)`` -> ``(1, G, A * R, K)``: the rows of A chunks as one operand per kv head."""
    a, g, r, k = x.shape
    return x.transpose(0, 1).reshape(1, g, a * r, k)


def _unstack_rows(x: torch.Tensor, a: int) -> torch.Tensor:
    """The inverse of :func:`_stack_rows`: ``(1, G, A * R, K)`` -> ``(A, G, R, K)``."""
    _, g, ar, k = x.shape
    return x.reshape(g, a, ar // a, k).transpose(0, 1)


def _score_step(q_a: torch.Tensor, q_norm, n_rows: int, k_src: "_TileSource", blocks, ws: dict, q_sig_bits, mma):
    """Step 3 for one tile of every active chunk, block by block: S float32 ``(A, G, N, T)``.
    ``q_a``: float64 Q rows ``(A, G, M, D)`` (zero-padded past ``n_rows``); ``q_norm`` their norms (wide Q);
    ``mma``: None (the ideal arithmetic) or (model, head-dim groups, key groups) of the hardware's."""
    a, g, rows, _ = q_a.shape
    if mma is not None and fused_chain_available(q_a.device):  # one fused chain over every tile
        return score_tile_mma(q_a[:, :, :n_rows], k_src.operand(), mma[0], mma[1])
    if mma is not None:
        s = torch.empty((a, g, n_rows, TILE_KEYS), dtype=torch.float32, device=q_a.device)
        for a0, a1 in blocks:
            s[a0:a1] = score_tile_mma(q_a[a0:a1, :, :n_rows], k_src.values(a0, a1, ws), mma[0], mma[1])
        return s
    s = torch.empty((a, g, n_rows, TILE_KEYS), dtype=torch.float32, device=q_a.device)
    if k_src.tiles is not None:  # shared tiles: one GEMM per distinct tile, over the rows of every chunk reading it
        for tile, chunks in k_src.groups():
            q_u = _stack_rows(q_a[chunks, :, :n_rows])
            qn = None if q_norm is None else _stack_rows(q_norm[chunks, :, :n_rows, None])[..., 0]
            s_u = score_tile(q_u, tile[None], q_sig_bits, qn)
            s[chunks] = _unstack_rows(s_u, chunks.numel())
        return s
    prod = _buffer(ws, "s", (a, g, rows, TILE_KEYS), torch.float64, q_a.device)
    for a0, a1 in blocks:
        qn = None if q_norm is None else q_norm[a0:a1]
        s_blk = score_tile(q_a[a0:a1], k_src.values(a0, a1, ws), q_sig_bits, qn, out=prod[a0:a1])
        s[a0:a1] = s_blk[..., :n_rows, :]
    return s


def _pv_step(o_a: torch.Tensor, p_q: torch.Tensor, v_src: _TileSource, blocks, ws: dict, p_sig_bits, mma):
    """Step 9 for one tile of every active chunk, block by block: ``O += V.P``, float32 ``(A, G, N, D)``:
    the ideal arithmetic (:func:`~mjolnir_numerics.emulator_stages.accumulate_pv`, ``mma`` None) or the
    hardware's (:func:`~mjolnir_numerics.emulator_stages.accumulate_pv_mma`)."""
    a, g, n, t = p_q.shape
    if mma is not None:
        o_new = torch.empty_like(o_a)
        for a0, a1 in blocks:
            o_new[a0:a1] = accumulate_pv_mma(o_a[a0:a1], p_q[a0:a1], v_src.values(a0, a1, ws), mma[0], mma[2])
        return o_new
    if v_src.tiles is not None:  # shared tiles: one GEMM per distinct tile (as in _score_step)
        o_new = torch.empty_like(o_a)
        for tile, chunks in v_src.groups():
            o_u = accumulate_pv(_stack_rows(o_a[chunks]), _stack_rows(p_q[chunks]), tile[None], p_sig_bits)
            o_new[chunks] = _unstack_rows(o_u, chunks.numel())
        return o_new
    d = v_src.head_dim
    rows = max(n, _MIN_GEMM_ROWS)
    p64 = _buffer(ws, "p64", (a, g, rows, t), torch.float64, p_q.device)
    p64[..., :n, :] = p_q  # exact widening
    p64[..., n:, :] = 0
    vp = _buffer(ws, "vp", (a, g, rows, d), torch.float64, p_q.device)
    o_new = torch.empty_like(o_a)
    for a0, a1 in blocks:
        o_new[a0:a1] = accumulate_pv(o_a[a0:a1], p64[a0:a1], v_src.values(a0, a1, ws), p_sig_bits, out=vp[a0:a1])
    return o_new


def _fused_pv_operand(v_src: _TileSource, mma) -> Optional[torch.Tensor]:
    """On the fused path (CUDA, hardware MMA): the window's V as the chain reads it, float32 ``(A, G, D,
    steps, K)`` (keys in the instructions' order; both walks issue consecutive keys), contiguous; else None.

    The chain reduces over the keys. Widened in place of the gathered tile's ``(A, T, G, D)`` order, they
    would sit G * D floats apart, and inductor compiles the strided operand into slower kernels: on an H100
    the b32 x 32K row took 99.4 ms with it against 70.6 ms with this one copy per window, same bits
    (reports/emulator/2026-12-06-v-contiguous.md)."""
    if mma is None or not fused_chain_available(v_src.device):
        return None
    steps, k = mma[2].shape
    if not torch.equal(mma[2].reshape(-1).cpu(), torch.arange(steps * k)):
        # the tile update pairs P's keys in storage order with these: a reordered V alone would pair them wrongly
        raise NotImplementedError("the fused P.V chain takes walks that add consecutive keys; this walk reorders them")
    v = v_src.operand().transpose(-1, -2)  # (A, G, D, T), keys strided
    # a new tensor, not .to(): that would return the strided view itself were V float32 already
    return torch.empty(v.shape, dtype=torch.float32, device=v.device).copy_(v).unflatten(-1, (steps, k))


_EX2_SM90_UNCHECKED = functools.partial(exp2_sm90_f32, check=False)


def _window_graphs_available(device) -> bool:
    """Whether windows are replayed as CUDA graphs (:class:`_WindowGraph`): on the current CUDA device, with
    the compiled stages."""
    device = torch.device(device)
    # on the current device only: a replay runs on the current device's stream
    current = device.type == "cuda" and device.index in (None, torch.cuda.current_device())
    return current and fused_chain_available(device)


# one capture stream per device, for the process (as torch.cuda.graph keeps one): the caching allocator hands
# a freed block back only to the stream it was allocated on, so a new stream per capture would not reuse memory
_CAPTURE_STREAMS: dict = {}
# one memory pool per device for every graph the emulator captures, held for the process with a graph that
# keeps it open (see _graph_pool)
_GRAPH_POOLS: dict = {}


def _device_index(device: torch.device):
    """The index of a CUDA ``device`` (the current one's for a bare "cuda"); other devices by name."""
    if device.type != "cuda":
        return str(device)
    return torch.cuda.current_device() if device.index is None else device.index


def _graph_pool(device: torch.device):
    """The ``torch.cuda.MemPool`` the emulator's CUDA graphs allocate from on ``device``, made on first use and
    held for the process: a capture reuses the memory the previous call's graph freed (a pool per call would
    ``cudaMalloc`` a window's working set at every call, and its release waits for the device).

    The pool is held together with a graph of its own (one fill, captured here, never replayed). torch 2.11
    counts a pool's graphs twice: the device allocator, where the MemPool holds a count of its own, and the
    pinned-host allocator, where only graphs do; each asserts ``use_count > 0`` when a capture reopens a pool
    whose graphs were all freed. With the pool alone, every capture after a call's graph was freed failed the
    host allocator's assert (both graph branches' H100 runs of 2026-12-06: the graphs of a call's first
    capture only). :func:`release_graph_memory` lets both go."""
    index = _device_index(device)
    if index not in _GRAPH_POOLS:
        where = torch.device("cuda", index)
        with torch.cuda.device(index):
            pool, keeper = torch.cuda.MemPool(), torch.cuda.CUDAGraph()
            _capture(keeper, pool, lambda: torch.zeros(1, device=where), where)
        _GRAPH_POOLS[index] = (pool, keeper)
    return _GRAPH_POOLS[index][0]


class _Replays:
    """The window graphs of one problem, kept from call to call on a device: a later call of the same problem
    (the same key: shapes, pools, formats, models and constants) replays them without capturing again.

    ``inputs``: the tensors a window reads that each call makes anew (Q's rows, the chunks' sequences and first
    tiles, the masks' last keys, the exponent scales, seq_lens and the block table on the device), those of the
    call that made the entry; a later call copies its values into them, so that the graphs read them there.
    The pools are not copied: the key holds their addresses, so a graph replays only where the call's pools
    are where its capture read them. ``graphs``: ``_WindowGraph`` per window kind ``(tiles, first)``;
    ``warmed``: the kinds an eager window of this process has compiled (``"first"``: provisionally, see
    ``_emulate``); ``calls``: the calls that used the entry before this one.

    Every window of a call reads the entry's inputs, eager ones too, so two calls of one problem must not run at
    once: the current stream is part of the key (calls on two streams keep two entries), and calls from two
    threads at once are not supported. The kept graphs share the device's pool and replay in any order, which
    is safe because nothing a capture allocates outlives it: the state and the inputs are allocated outside
    captures, and every table built on first use (the e4m3 and code tables, the walk orders, the ex2 tables)
    is first built by an eager window, before any capture reads it."""

    def __init__(self, key: tuple, inputs: dict):
        self.key, self.inputs = key, {k: None if v is None else v.clone() for k, v in inputs.items()}
        self.graphs: dict = {}
        self.warmed: dict = {}
        self.calls = 0

    def take(self, inputs: dict) -> dict:
        """The entry's input tensors, holding the values of ``inputs`` (the same shapes: the key says so)."""
        for k, v in inputs.items():
            if v is not None:
                self.inputs[k].copy_(v)
        return self.inputs

    def close(self) -> None:
        for g in self.graphs.values():
            g.close()
        self.graphs.clear()


# the window graphs of the last few problems run on each device: (device, key) -> _Replays, the most recently
# used last. Their memory is one pool's (_graph_pool): what a capture frees, the next one reuses, so kept graphs
# cost their state and inputs (a few MB at b32 x 32K), not a working set each
_REPLAYS: dict = {}
_REPLAYS_KEPT = 4  # problems per device


def _replays(device: torch.device, key: tuple, inputs: dict) -> _Replays:
    """The :class:`_Replays` of ``key`` on ``device``, made where it is not kept (the least recently used
    problem's graphs closed where the device keeps ``_REPLAYS_KEPT`` already)."""
    index = (_device_index(device), key)
    entry = _REPLAYS.pop(index, None)
    if entry is None:
        same_device = [k for k in _REPLAYS if k[0] == index[0]]
        if len(same_device) >= _REPLAYS_KEPT:
            _REPLAYS.pop(same_device[0]).close()
        entry = _Replays(key, inputs)
    _REPLAYS[index] = entry
    return entry


def release_graph_memory() -> None:
    """Let go of the emulator's kept CUDA graphs and their memory pools (one per device, up to a window's working
    set: about a GiB at the largest windows); ``torch.cuda.empty_cache()`` then returns it to the device. The
    next call on CUDA captures again, into a new pool. Nothing to do on the CPU or where no call has run on
    CUDA.

    Example (a notebook that needs the GPU's memory back after a study)::

        mjolnir_numerics.release_graph_memory()
        torch.cuda.empty_cache()
    """
    for entry in _REPLAYS.values():
        entry.close()
    _REPLAYS.clear()
    _GRAPH_POOLS.clear()


def _capture(graph, pool, fn, device: torch.device) -> None:
    """Capture ``fn()`` (CUDA work on ``device``'s current stream) into ``graph``, allocating from ``pool`` (a
    ``torch.cuda.MemPool``): on a side stream with ``capture_begin``, not ``torch.cuda.graph``, which
    synchronizes the device and empties the allocator's cache on entry (the queued work would drain and every
    later buffer be allocated afresh: the window graphs' H100 A/B of 2026-12-06 paid both once per call).
    A capture that would compile (a guard that misses) raises instead; other threads' CUDA calls are theirs
    (``thread_local``). On any failure, of ``capture_begin`` too, the device allocator leaves capture mode and
    the device's pool is dropped (the pinned-host allocator's side cannot be ended from Python: the next
    capture opens a new pool) before the error propagates."""
    index = _device_index(device)
    with torch.cuda.device(index):
        if index not in _CAPTURE_STREAMS:
            _CAPTURE_STREAMS[index] = torch.cuda.Stream(index)
        main, side = torch.cuda.current_stream(), _CAPTURE_STREAMS[index]
        side.wait_stream(main)
        with torch.cuda.stream(side), torch.compiler.set_stance("fail_on_recompile"):
            try:
                graph.capture_begin(pool=pool.id, capture_error_mode="thread_local")
            except BaseException:
                _abandon_capture(pool, index)
                raise
            try:
                fn()
            except BaseException:
                _end_capture(graph, pool, index, failed=True)
                raise
            _end_capture(graph, pool, index, failed=False)
        main.wait_stream(side)


def _needs_compile(err: BaseException) -> bool:
    """Whether a capture failed because a graph it calls was not compiled for its inputs (a capture runs under
    torch's ``fail_on_recompile`` stance, which raises a ``RuntimeError`` instead of compiling)."""
    return isinstance(err, RuntimeError) and "stance is 'fail_on_recompile'" in str(err)


def _end_capture(graph, pool, index: int, failed: bool) -> None:
    """``graph.capture_end()``; where CUDA refuses it (an invalidated capture), the capture is abandoned
    (:func:`_abandon_capture`: capture_end raises before it ends the allocator's capture itself, and the pool
    would stay the thread's allocation target for the rest of the process). Raises the refusal unless
    ``failed`` (then the caller's error is the one to report)."""
    try:
        graph.capture_end()
    except RuntimeError:
        _abandon_capture(pool, index)
        if not failed:
            raise


def _abandon_capture(pool, index: int) -> None:
    """After a failed ``capture_begin`` or ``capture_end``: the device allocator's capture into ``pool`` ended
    and its count released where the capture had begun it (``capture_begin`` can fail before or after), and
    the device's pool dropped, so that the next capture starts a new one."""
    try:
        torch._C._cuda_endAllocateToPool(index, pool.id)
    except RuntimeError:  # not recording: capture_begin failed before it began the allocator's side
        pass
    else:
        torch._C._cuda_releasePool(index, pool.id)
    if index in _GRAPH_POOLS and _GRAPH_POOLS[index][0] is pool:
        del _GRAPH_POOLS[index]


class _WindowGraph:
    """One window's steps 3-9 (``body``) captured as a CUDA graph, replayed for every window of the same
    shape: the state ``m, l, o`` lives in the graph's own tensors and is updated in place, and the window's
    first tile is read from a device scalar, so a replay is one launch from the host where the window's
    eager form is a few hundred compiled calls (each with its guards and Python wrapper). The graph runs
    the same kernels on the same shapes, so the bits are the eager ones.

    ``body(base, m, l, o) -> (m, l, o)``: ``base`` an int64 0-d tensor; it must ask the device nothing (no
    sync, no data-dependent shape) and must have run eagerly on these shapes before (so that every
    compiled graph it calls is compiled, outside the capture).
    """

    def __init__(self, body, m: torch.Tensor, l: torch.Tensor, o: torch.Tensor):
        self.state = (m.clone(), l.clone(), o.clone())
        self.base = torch.zeros((), dtype=torch.long, device=m.device)
        self.graph = torch.cuda.CUDAGraph()
        self.pool = _graph_pool(m.device)

        def run():
            for x, y in zip(self.state, body(self.base, *self.state)):
                x.copy_(y)

        _capture(self.graph, self.pool, run, m.device)

    def close(self) -> None:
        """Free the graph: its memory goes back to the pool, for the next call's capture."""
        self.graph.reset()
        self.graph = self.pool = None

    def replay(self, s0: int, m: torch.Tensor, l: torch.Tensor, o: torch.Tensor):
        """The window whose first tile is ``s0``, from the state ``m, l, o`` (copied into the graph's tensors
        unless they are them: the state the previous replay returned); returns the state after it (the
        graph's tensors: the next replay overwrites them, so a caller keeps them only until then)."""
        if m is not self.state[0]:
            for x, y in zip(self.state, (m, l, o)):
                x.copy_(y)
        self.base.fill_(s0)
        self.graph.replay()
        return self.state


def _window_softmax(s_t, keys, last, m_in, c_w, n_w: int, p_scale: float, p_format: str, rounded_sum: bool, ex2):
    """Steps 4-7 and the factor of step 8 for ``n_w`` consecutive tiles of every active chunk, as one function
    (what CUDA compiles into one graph): the masks, the running column max, P, P rounded as the second GEMM
    reads it, the p the row sum adds and the row-sum correction. None of it depends on l or O.

    Args:
        s_t: float32 ``(W * A, G, N, T)`` scores, tile-major (the A chunks of the window's first tile, then
            of its second ...); keys: int64 ``(W * A, T)``; last: int64 ``(W * A, N)`` (:func:`mask_tile`);
        m_in: float32 ``(A, G, N)``, the running max before the window; c_w: float32 ``(W * A, G)``.

    Returns:
        ``(m_prev, m_new, p_q, p_sum, corr)``: float32 ``(W * A, G, N)``, ``(W * A, G, N)``, ``(W * A, G, N,
        T)``, ``(W * A, G, N, T)`` and ``(W * A, G, N)``.
    """
    s_t = mask_tile(s_t, keys, last)
    wa, g, n, t = s_t.shape
    m_prev, m_new, m_use = running_column_max(m_in, s_t.view(n_w, wa // n_w, g, n, t))
    m_prev, m_new, m_use = (x.reshape(wa, g, n) for x in (m_prev, m_new, m_use))
    p = softmax_tile(s_t, m_use, c_w, ex2)
    p_q = round_p(p, p_scale, p_format)
    p_sum = div_f32(p_q, torch.full_like(p_q[:1, :1, :1, :1], p_scale)) if rounded_sum else p
    return m_prev, m_new, p_q, p_sum, row_sum_correction(m_prev, m_use, c_w, ex2)


def _final(l, o, m, cta_scale, out_scale, part_scale, lse_scale, lse_log):
    """Step 10 as one function (what CUDA compiles into one graph): the row sums reduced, then the
    epilogue. Returns :func:`~mjolnir_numerics.emulator_stages.epilogue`'s values as a tuple, in its order."""
    ep = epilogue(o, m, reduce_row_sum(l), cta_scale, out_scale, part_scale, lse_scale, lse_log)
    return ep["o_final"], ep["lse"], ep["o_part"], ep["m_part"], ep["l_part"]


def _tile_update(corr, l, p_sum, o, m_new, m_prev, p_q, v, rescale: bool, extra_bits, min_exponent, emin):
    """Steps 8-9 of one tile as one function (what CUDA compiles into one graph): the row sums, O rescaled
    where a max moved (not on a chunk's first tile), then the P.V chain into O. ``v``: float32 ``(A, G,
    D, steps, K)``; the rest as in the stages. Returns ``(l, o)``."""
    l = accumulate_row_sum(corr, l, p_sum)
    if rescale:
        o = rescale_o(o, corr, m_new, m_prev)
    a = p_q[..., : o.shape[-2], :].unflatten(-1, (v.shape[-2], v.shape[-1]))
    return l, _chain_formula(a, v, o, extra_bits, min_exponent, emin)


def emulate_decode(
    q: torch.Tensor,
    cache,
    *,
    q_descale: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    scale_o: float = 1.0,
    q_len: int = 1,
    causal: bool = True,
    plan: Optional[SplitPlan] = None,
    chunk_tiles: Optional[int] = None,
    target: Optional[Union[str, Target]] = None,
    knobs: Optional[EmulatorKnobs] = None,
    allow_unsupported: bool = False,
    return_details: bool = False,
    cpu_threads: Optional[int] = 1,
) -> Union[tuple[torch.Tensor, torch.Tensor], DecodeResult]:
    """Emulate the paged decode kernel, bit for bit under the models of
    :mod:`mjolnir_numerics.emulator_stages`.

    Args:
        q: ``(num_seqs * q_len, h_q, d)``: bf16 (the bf16-Q path) or ``torch.float8_e4m3fn`` (the fp8-Q
            path); with ``allow_unsupported`` also float16 / float32.
        cache: a :class:`~mjolnir_numerics.cache.PagedKVCache` (pools, layout, block table, seq_lens and
            the kernel's K/V descales); anything else is refused with a ``TypeError``.
        q_descale: float32 ``()``, ``(h_k,)`` or ``(num_seqs, h_k)``; required for e4m3 Q (from
            :func:`~mjolnir_numerics.scales.quantize_q`), 1 by default for bf16 Q.
        softmax_scale: scale of ``q . k`` (default ``1 / sqrt(d)``), used at fp32.
        scale_o: output multiplier, used at fp32.
        q_len: query tokens per sequence (speculative decode / chunked prefill tail).
        causal: with ``q_len > 1``, query ``qi`` sees keys ``0 .. seq_len - q_len + qi``; else all keys.
        plan: the split plan to walk: a :class:`~mjolnir_numerics.plan.SplitPlan`, or a mode of
            :func:`~mjolnir_numerics.plan.default_plan` for ``target`` (the plan ``mjolnir_kernel.decode``
            makes there): None or ``"occupancy"`` (the default), ``"batch_invariant"`` (each sequence's
            bits independent of the rest of the batch); or ``chunk_tiles``: cut every sequence into
            chunks of that many tiles (0: no split), like the seed's emulator.
        target: the GPU whose default plan is walked (a :class:`~mjolnir_numerics.targets.Target` or
            its name); None: the cache's CUDA device when a kernel runs there, else Thor.
        knobs: research knobs (:class:`EmulatorKnobs`); the default is the kernel.
        allow_unsupported: emulate beyond the kernels' capability rules
            (:mod:`~mjolnir_numerics.capability`: any KV format with bf16 Q, float16 / float32 Q, any
            head dim, page sizes that are powers of two).
        return_details: return a :class:`DecodeResult` instead of ``(o, lse)``.
        cpu_threads: torch intra-op threads during the call on CPU (restored after; None: leave
            torch's setting). The default 1: the work is thousands of tile-sized ops, for which OpenMP
            synchronisation costs more than a second core gives (up to 20x slower on a shared
            machine). Results do not depend on it.

    Returns:
        ``(o, lse)``: bf16 ``(num_seqs * q_len, h_q, d)`` and float32 ``(num_seqs, h_k, q_len * h_r)``
        (natural log; -inf for an empty sequence, whose O is 0).

    Raises:
        ValueError: naming the argument, for h_q not a multiple of h_k, a d mismatch, a q dtype / KV
            format pair the kernel cannot run, bad descales (shape, zero, negative, NaN), a seq_len
            beyond its block-table row, a referenced page out of range, ``0 < seq_len < q_len``, an
            invalid plan, or a knob out of range.

    On CUDA, the first call of a shape compiles its graphs (minutes). The CUDA graphs of its windows are kept
    for the next calls of the same problem (the same shapes and pools, whatever their contents), with their
    memory, until :func:`release_graph_memory`; calls of one problem on one stream share those graphs' input
    tensors, so do not make them from two threads at once (calls on two streams keep separate graphs).
    """
    if cpu_threads is not None and (
        isinstance(cpu_threads, bool) or not isinstance(cpu_threads, int) or cpu_threads < 1
    ):
        raise ValueError(f"cpu_threads: expected an int >= 1 or None, got {cpu_threads!r}")
    change = cpu_threads is not None and q.device.type == "cpu" if isinstance(q, torch.Tensor) else False
    saved = torch.get_num_threads()
    if change:
        torch.set_num_threads(cpu_threads)
    try:
        return _emulate(
            q,
            cache,
            q_descale,
            softmax_scale,
            scale_o,
            q_len,
            causal,
            plan,
            chunk_tiles,
            target,
            knobs,
            allow_unsupported,
            return_details,
        )
    finally:
        if change:
            torch.set_num_threads(saved)


def _emulate(
    q,
    cache,
    q_descale,
    softmax_scale,
    scale_o,
    q_len,
    causal,
    plan,
    chunk_tiles,
    target,
    knobs,
    allow_unsupported,
    return_details,
):
    knobs = knobs if knobs is not None else EmulatorKnobs()
    if not isinstance(knobs, EmulatorKnobs):
        raise ArgumentTypeError(f"knobs: expected EmulatorKnobs, got {type(knobs).__name__}")
    if not isinstance(cache, PagedKVCache):
        raise ArgumentTypeError(f"cache: expected a PagedKVCache, got {type(cache).__name__}")
    check_bool("causal", causal)
    for name, flag in (("allow_unsupported", allow_unsupported), ("return_details", return_details)):
        check_bool(name, flag)
    fmt = get_format(cache.fmt)
    heads_k, d_cache, ps = int(cache.heads_k), int(cache.head_dim), int(cache.page_size)
    if isinstance(q_len, bool) or not isinstance(q_len, int) or q_len < 1:
        raise ValueError(f"q_len: expected an int >= 1, got {q_len!r}")

    # -- q, dtype and capability rules ----------------------------------------------------------
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q: expected a tensor (num_seqs * q_len, h_q, d), got shape {tuple(getattr(q, 'shape', ()))}")
    seq_lens, bt = _check_cache(cache)
    num_seqs = int(seq_lens.shape[0])
    rows, h_q, d = q.shape
    if rows != num_seqs * q_len:
        raise ValueError(f"q: has {rows} rows, expected num_seqs * q_len = {num_seqs} * {q_len}")
    if h_q % heads_k:
        raise ValueError(f"q: h_q={h_q} is not a multiple of the cache's h_k={heads_k}")
    if d != d_cache:
        raise ValueError(f"q: head dim {d} differs from the cache's head dim {d_cache}")
    fp8_q = q.dtype == torch.float8_e4m3fn
    if fp8_q and q.numel() and bool(((q.view(torch.uint8) & 0x7F) == 0x7F).any()):
        raise ValueError("q: holds the e4m3 NaN code")
    if not fp8_q and q.is_floating_point() and not bool(torch.isfinite(q).all()):
        raise ValueError("q: holds inf or NaN")
    supported_q = (torch.bfloat16, torch.float8_e4m3fn)
    if q.dtype not in supported_q and not (allow_unsupported and q.dtype in _Q_SIG_BITS):
        raise ValueError(
            f"q: dtype {q.dtype} is not one the kernel takes (bfloat16 or float8_e4m3fn"
            f"{'' if allow_unsupported else '; float16/float32 need allow_unsupported=True'})"
        )
    q_dtype = "e4m3" if fp8_q else "bf16"
    if not allow_unsupported:
        reason = unsupported_reason(fmt.name, q_dtype, d, ps)
        if reason is not None:
            raise ValueError(
                f"q: the kernels cannot run this problem ({reason}); pass allow_unsupported=True to emulate it"
            )
    if ps < 1 or ps & (ps - 1):
        raise ValueError(f"cache: page_size {ps} is not a power of two")
    short = (seq_lens > 0) & (seq_lens < q_len)
    if bool(short.any()):
        s = int(short.nonzero()[0])
        raise ValueError(f"q_len: {q_len} exceeds seq_len {int(seq_lens[s])} of sequence {s}")
    if q_descale is None:
        if fp8_q:
            raise ValueError("q_descale: e4m3 Q needs its per-(sequence, kv head) descale (see quantize_q)")
        q_descale = torch.ones((), dtype=torch.float32)
    qd = descale_table(check_descale(q_descale, num_seqs, heads_k, "q_descale"), num_seqs, heads_k)
    scale_qs = check_f32("softmax_scale", softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d), True)
    if not math.isfinite(scale_qs * LOG2E_F32):
        raise ValueError(f"softmax_scale: {softmax_scale!r} times log2(e) overflows fp32")
    scale_o = check_f32("scale_o", scale_o)

    # -- plan -------------------------------------------------------------------------------------
    h_r = h_q // heads_k
    n_rows = q_len * h_r
    if plan is not None and chunk_tiles is not None:
        raise ValueError("plan: pass either plan or chunk_tiles, not both")
    tgt = default_target(cache.k_pool.device) if target is None else get_target(target)
    if plan is None and chunk_tiles is not None:
        plan = chunked_plan(seq_lens, chunk_tiles)
    elif plan is None or isinstance(plan, str):
        mode = check_choice("plan", plan or "occupancy", PLAN_MODES)
        plan_d = d if d in HEAD_DIMS else HEAD_DIMS[0]  # beyond the kernels (allow_unsupported): plan as for 128
        plan = default_plan(seq_lens, heads_k, n_rows, target=tgt, q_dtype=q_dtype, head_dim=plan_d, mode=mode)
    if not isinstance(plan, SplitPlan):
        raise ArgumentTypeError(f"plan: expected a SplitPlan or one of {PLAN_MODES}, got {type(plan).__name__}")
    seq_lens_host = seq_lens.tolist()
    plan.check(seq_lens_host)

    # -- per-path constants -------------------------------------------------------------------------
    p_format = knobs.p_format or ("e4m3" if fp8_q else "bf16")
    p_scale = _f32(knobs.p_scale if knobs.p_scale is not None else (KERNEL_P_SCALE if fp8_q else 1.0))
    inv_p_scale = _f32(1.0 / p_scale)
    q_sig_bits = None if fp8_q else _Q_SIG_BITS[q.dtype]
    p_sig_bits = _P_SIG_BITS[p_format]
    # the kernel's own configuration: its P format and a problem it runs (the capability rule)
    native = p_format == ("e4m3" if fp8_q else "bf16") and unsupported_reason(fmt.name, q_dtype, d, ps) is None
    arithmetic = knobs.mma or ("hardware" if native else "ideal")
    mma = None
    if arithmetic == "hardware":
        if not native:
            raise ValueError(
                f"knobs: mma='hardware' models the kernels' own MMAs (P {('e4m3' if fp8_q else 'bf16')} on a problem "
                f"they run), got P {p_format}, q {q.dtype}, {fmt.name} KV, head dim {d}; use mma='ideal'"
            )
        model = MMA_MODELS[tgt.mma_model(q_dtype)]
        constants = (model.extra_bits, model.min_exponent, OPERAND_FORMATS[model.operand][1])
        mma = (model, *kstep_groups(tgt.walk, fmt.name, q_dtype, d), constants)

    dev = q.device
    kd = cache.descale_table("k").float().to(dev)
    vd = cache.descale_table("v").float().to(dev)
    qd = qd.to(dev)
    q_vals = pack_q(q, num_seqs, q_len, heads_k).float()  # (B, G, N, D), exact widening
    qk = qd * kd  # fp32
    cta_c = torch.tensor(_f32(scale_qs * LOG2E_F32), device=dev) * qk  # scale_qs_log2_e * qk_descale
    if not bool(((cta_c > 0) & torch.isfinite(cta_c)).all()):  # 0 would give (-inf) * 0 = NaN for masked keys
        raise ValueError(
            f"softmax_scale: {softmax_scale!r} times log2(e) and the Q and K descales leaves the exponent scale "
            f"outside fp32 ([{float(cta_c.min()):.3g}, {float(cta_c.max()):.3g}]); it must stay positive and finite"
        )
    cta_scale = torch.tensor(scale_qs, device=dev) * qk
    so = torch.tensor(scale_o, device=dev)
    if knobs.v_descale_at == "epilogue":
        out_scale = (so * vd) * inv_p_scale
        part_scale = vd * inv_p_scale
    else:
        out_scale = (so * torch.ones_like(vd)) * inv_p_scale
        part_scale = torch.full_like(vd, inv_p_scale)
    if knobs.lse_base == "2":
        if knobs.log == "hardware":
            raise ValueError("knobs: log='hardware' models the kernels' natural-log LSE; lse_base='2' has none")
        lse_log = log2_f32
    else:
        default_log = "hardware" if native and tgt.log == "libdevice_logf" else "correctly_rounded"
        hw_log = (knobs.log or default_log) == "hardware"
        lse_log = log_libdevice_f32 if hw_log else log_f32
    hw_ex2 = (knobs.ex2 or ("hardware" if native else "correctly_rounded")) == "hardware"
    # the emulator's ex2 inputs are never positive (a score minus a running max that includes it, or the
    # difference of two running maxes): the sm_90 model's range check would only ask the device
    ex2 = _EX2_SM90_UNCHECKED if hw_ex2 and tgt.ex2 == "sm90_mufu" else exp2_f32
    # CUDA: the stages between the MMA chains as compiled graphs (each a few kernels instead of dozens of
    # launches); the CPU runs the same functions eagerly
    stage = _fused if fused_chain_available(dev) else (lambda fn: fn)
    load_tables(dev, ex2 is _EX2_SM90_UNCHECKED)

    # -- chunks of all sequences advance together ----------------------------------------------------
    # A chunk walked in S tile streams is S items: stream s takes tiles t0 + s, t0 + s + S, ... with its own
    # running max, row sums and O, and writes split j * S + s (S = 1: the chunk itself)
    n_streams = knobs.tile_streams or tgt.tile_streams
    chunks = [(b, t0 + s, len(range(t0 + s, t1, n_streams)), j * n_streams + s)
              for b, t0, t1, j in plan.chunks() for s in range(n_streams)]  # fmt: skip
    cseq = torch.tensor([w[0] for w in chunks], dtype=torch.long, device=dev)
    ct0 = torch.tensor([w[1] for w in chunks], dtype=torch.long, device=dev)
    cslot = [w[3] for w in chunks]
    C, G, N, D, T = len(chunks), heads_k, n_rows, d, TILE_KEYS
    sl_dev = seq_lens.to(dev)
    bt_dev = bt.to(dev)
    qi = torch.arange(N, device=dev) // h_r
    tail = (q_len - 1 - qi) if causal else torch.zeros_like(qi)
    last_key = sl_dev[cseq][:, None] - 1 - tail[None, :]  # (C, N)
    q_c = _pad_rows(q_vals[cseq].double())  # exact; widened once, not per tile
    # bf16 Q: the row norms that bound each S element's float64 GEMM error (emulator_stages.verified_f32)
    q_norm_c = None if q_sig_bits is None else row_norm(q_c, -1)
    c_c, cta_scale_c = cta_c[cseq], cta_scale[cseq]

    m = torch.full((C, G, N), -math.inf, device=dev)
    l = torch.zeros((C, G, N, T), device=dev)
    o = torch.zeros((C, G, N, D), device=dev)
    key_ids = torch.arange(T, device=dev)
    lens = [w[2] for w in chunks]  # on the host: which chunks take part costs no device round trip
    n_steps = max(lens, default=0)
    window = _window(dev, G, N, D, T, len(lens))
    ws: dict = {}  # scratch buffers reused across tiles

    def inside_at(s0, n_w, act_list) -> bool:
        """Whether every key of tiles ``s0 .. s0 + n_w - 1`` of the chunks ``act_list`` (ended chunks' too) lies
        before its sequence's end: then no page past an end is read, and nothing needs zeroing."""
        last_tile = (s0 + n_w - 1) * n_streams
        return all((chunks[i][1] + last_tile + 1) * T <= seq_lens_host[chunks[i][0]] for i in act_list)

    def window_pass(s0, base, n_w, act_list, sel, m_in, l_in, o_in):
        """Steps 3-9 for tiles ``s0 .. s0 + n_w - 1`` of the chunks ``act_list`` (those that have tile s0; a
        chunk that ends inside the window has its later tiles masked whole, which leave m unchanged, and
        its l and O kept from its last tile); ``sel`` selects them (a slice of all, or their int64 indices
        on the device). ``base``: the window's first tile, ``s0`` itself or a 0-d int64 device tensor
        holding it (what a replayed CUDA graph reads: every window it is replayed for is inside, see
        ``graphable``). ``m_in, l_in, o_in``: the state of those chunks before the window; returns it after."""
        A = len(act_list)
        live = [[lens[i] > s0 + j for i in act_list] for j in range(n_w)]

        def rep(x):  # the chunks' rows once per tile of the window
            return x if n_w == 1 else x.repeat(n_w, *(1,) * (x.dim() - 1))

        seqs = rep(cseq[sel])
        steps = (base + torch.arange(n_w, device=dev)[:, None]) * n_streams
        tiles = (ct0[sel][None, :] + steps).reshape(-1)
        keys = tiles[:, None] * T + key_ids[None, :]
        last = rep(last_key[sel])
        if not all(map(all, live)):
            last = torch.where(_host_tensor(sum(live, []), torch.bool, dev)[:, None], last, -1)
        c_w = rep(c_c[sel])
        blocks = _blocks(n_w * A, G, d, dev)
        inside = inside_at(s0, n_w, act_list)
        # steps 3-7 and the factors of step 8 for all W tiles at once: nothing here depends on l or O
        k_src = _TileSource(cache, "k", seqs, tiles, sl_dev, bt_dev, inside)
        q_a = rep(q_c[sel])
        q_n = None if q_norm_c is None else rep(q_norm_c[sel])
        s_t = _score_step(q_a, q_n, N, k_src, blocks, ws, q_sig_bits, mma)
        del k_src, q_a
        m_prev, m_new, p_q, p_sum, corr = stage(_window_softmax)(
            s_t, keys, last, m_in, c_w, n_w, p_scale, p_format, knobs.row_sum == "rounded", ex2
        )
        del s_t
        v_src = _TileSource(cache, "v", seqs, tiles, sl_dev, bt_dev, inside)
        v_fused = _fused_pv_operand(v_src, mma)
        # steps 8-9 tile after tile: the fp32 recurrences of l and O
        l_a, o_a = l_in, o_in
        for j in range(n_w):
            t = slice(j * A, (j + 1) * A)
            if v_fused is not None:  # CUDA: the tile's whole update as one compiled graph
                # the products per MMA instruction (V's last dim, K: 16 or 32) a constant of the compiled graph,
                # so that inductor writes each instruction's sum as one persistent reduction over registers
                # instead of a loop over a symbolic K (1.10x faster at b32 x 32K on an H100, 2026-12-06)
                v_t = v_fused[t]
                torch._dynamo.mark_static(v_t, v_t.dim() - 1)  # (a negative index is ignored)
                l_new, o_new = _fused(_tile_update, True)(
                    corr[t], l_a, p_sum[t], o_a, m_new[t], m_prev[t], p_q[t], v_t, s0 + j > 0, *mma[3]
                )
            else:
                l_new = accumulate_row_sum(corr[t], l_a, p_sum[t])
                o_new = o_a if s0 + j == 0 else rescale_o(o_a, corr[t], m_new[t], m_prev[t])
                v_t = v_src.part(j * A, (j + 1) * A)
                o_new = _pv_step(o_new, p_q[t], v_t, _blocks(A, G, d, dev), ws, p_sig_bits, mma)
            if all(live[j]):
                l_a, o_a = l_new, o_new
            else:
                keep = _host_tensor(live[j], torch.bool, dev)[:, None, None, None]
                l_a, o_a = torch.where(keep, l_new, l_a), torch.where(keep, o_new, o_a)
        # a copy, not a view of m_new: the compiled _window_softmax guards on whether m_in is a view and on its
        # base's size, and the captured window reads the state from tensors of its own (a view here made
        # the capture recompile, the H100 run of 2026-12-06)
        return m_new[(n_w - 1) * A :].clone(), l_a, o_a

    # CUDA with the fused chains: a window of every chunk, all its tiles live and inside their sequences, is the
    # same work on the same shapes as every other window of its kind (its tile count, and whether it is the
    # chunks' first: its first tile does not rescale O) but for its first tile's index. A kind is captured as a
    # CUDA graph once an eager window has compiled every graph it calls, and replayed: one launch per window
    # instead of hundreds of host-side calls. The graphs stay for the next call of the same problem
    # (_Replays). Inside: the capture skips the zeroing of keys past a sequence's end, so its replays must too.
    def kind_of(s0, n_w):
        if all(n >= s0 + n_w for n in lens) and inside_at(s0, n_w, range(C)):
            return (n_w, s0 == 0)
        return None

    # the pools must be where the work is (a copy between devices cannot be captured)
    pools = [x for x in (cache.k_pool, cache.v_pool, cache.k_scales, cache.v_scales) if x is not None]
    graphs = mma is not None and _window_graphs_available(dev) and all(x.device == dev for x in pools)
    replays = None
    if graphs:
        inputs = dict(cseq=cseq, ct0=ct0, key_ids=key_ids, last_key=last_key, c_c=c_c, q_c=q_c, q_norm_c=q_norm_c,
                      sl_dev=sl_dev, bt_dev=bt_dev)  # fmt: skip
        key = (
            type(cache), fmt.name, getattr(cache, "layout", None), ps,
            tuple((x.data_ptr(), tuple(x.shape), x.stride(), x.dtype) for x in pools),
            tuple((k, None if v is None else (tuple(v.shape), v.dtype)) for k, v in inputs.items()),
            window, n_streams, knobs, q.dtype, mma[0].name, tuple(mma[1].flatten().tolist()),
            tuple(mma[2].flatten().tolist()), mma[3], p_scale, p_format, ex2, q_sig_bits,
            torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else None,
        )  # fmt: skip
        replays = _replays(dev, key, inputs)
        inputs = replays.take(inputs)  # the graphs read these tensors: every window of this call does too
        cseq, ct0, key_ids, last_key, c_c = (inputs[k] for k in ("cseq", "ct0", "key_ids", "last_key", "c_c"))
        q_c, q_norm_c, sl_dev, bt_dev = (inputs[k] for k in ("q_c", "q_norm_c", "sl_dev", "bt_dev"))
    kinds = [kind_of(s0, min(window, n_steps - s0)) if graphs else None for s0 in range(0, n_steps, window)]
    for i, s0 in enumerate(range(0, n_steps, window)):
        n_w = min(window, n_steps - s0)
        act_list = [i for i, n in enumerate(lens) if n > s0]
        full = len(act_list) == C
        kind = kinds[i] if graphs else None
        if kind is not None:
            graph = replays.graphs.get(kind)
            # a capture costs what an eager window costs: worth it where at least two windows of this call replay
            # it, or where the problem has run before (and so may run again)
            worth = kinds[i:].count(kind) >= 2 or replays.calls > 0
            if graph is None and replays.warmed.get(kind) and worth:
                body = lambda base, m_in, l_in, o_in, s0=s0, n_w=n_w: window_pass(  # noqa: E731
                    s0, base, n_w, list(range(C)), slice(None), m_in, l_in, o_in
                )
                try:
                    graph = replays.graphs[kind] = _WindowGraph(body, m, l, o)
                except Exception as err:  # noqa: BLE001 - the eager windows give the same bits
                    if replays.warmed[kind] == "first" and _needs_compile(err):
                        replays.warmed[kind] = False  # the first call of this shape: this window compiles the rest
                    else:
                        warnings.warn(
                            f"emulate_decode: capturing a window as a CUDA graph failed ({err!r}); this call's "
                            "windows run eagerly (the same bits, more host time)",
                            RuntimeWarning,
                            stacklevel=3,
                        )
                        graphs = False
            if graph is not None:
                m, l, o = graph.replay(s0, m, l, o)
                continue
        if full:  # the state itself (m[:] would be a view: see window_pass)
            m_a, l_a, o_a = window_pass(s0, s0, n_w, act_list, slice(None), m, l, o)
        else:
            sel = _host_tensor(act_list, torch.long, dev)
            m_a, l_a, o_a = window_pass(s0, s0, n_w, act_list, sel, m[sel], l[sel], o[sel])
        if kind is not None:  # an eager window has compiled every graph a capture of its kind calls
            replays.warmed[kind] = True
            # So, once the process has compiled them, has a first window for the later windows of its size: its
            # later tiles rescale O as theirs do. But the first call of a shape compiles its graphs as they come,
            # each tile's update for the slices of its own tile; where the capture after a first window would
            # compile one, it raises (no capture compiles), and the window runs eagerly (then the next one is
            # captured). Capturing a window earlier keeps the GPU busy for one window fewer of host-bound eager
            # work (0.95x the call at b32 x 32K, an H100).
            later = (n_w, False)
            if kind[1] and n_w > 1 and not replays.warmed.get(later):
                replays.warmed[later] = "first"
        if full:
            m, l, o = m_a, l_a, o_a
        else:
            m[sel], l[sel], o[sel] = m_a, l_a, o_a
    if replays is not None:
        replays.calls += 1
        if not graphs:  # a failed capture: start afresh
            _REPLAYS.pop((_device_index(dev), replays.key), None)

    # -- epilogue --------------------------------------------------------------------------------------
    # which chunks are split, from the plan on the host (nonzero() would wait for all the work queued)
    split_list = [plan.n_splits[w[0]] * n_streams > 1 for w in chunks]
    lse_scale = None if knobs.lse_base == "e" else c_c
    # the correctly rounded logs (research knobs) decide near-midpoint results in decimal on the host: eager
    final_stage = stage if lse_log is log_libdevice_f32 else (lambda fn: fn)
    o_final, lse, o_part, m_part, l_part = final_stage(_final)(
        l, o, m, cta_scale_c, out_scale[cseq], part_scale[cseq], lse_scale, lse_log
    )
    o_out = torch.zeros((num_seqs, G, N, D), device=dev)
    lse_out = torch.zeros((num_seqs, G, N), device=dev)
    unsplit = _host_tensor([i for i, s in enumerate(split_list) if not s], torch.long, dev)
    o_out[cseq[unsplit]] = o_final[unsplit]
    lse_out[cseq[unsplit]] = lse[unsplit]
    split_chunks = [i for i, s in enumerate(split_list) if s]
    split_seqs = sorted({chunks[i][0] for i in split_chunks})
    if split_seqs:
        J = max(plan.n_splits[b] for b in split_seqs) * n_streams
        row_of = {b: r for r, b in enumerate(split_seqs)}
        o_p = torch.zeros((len(split_seqs), J, G, N, D), device=dev)
        m_p = torch.full((len(split_seqs), J, G, N), -math.inf, device=dev)
        l_p = torch.zeros((len(split_seqs), J, G, N), device=dev)
        idx = _host_tensor(split_chunks, torch.long, dev)
        r_idx = _host_tensor([row_of[chunks[i][0]] for i in split_chunks], torch.long, dev)
        j_idx = _host_tensor([cslot[i] for i in split_chunks], torch.long, dev)
        o_p[r_idx, j_idx] = o_part[idx]
        m_p[r_idx, j_idx] = m_part[idx]
        l_p[r_idx, j_idx] = l_part[idx]
        o_red, lse_red = final_stage(reduction)(
            o_p, m_p, l_p, scale_o, LOG2E_F32 if knobs.lse_base == "e" else 1.0, lse_log, ex2
        )
        seq_idx = _host_tensor(split_seqs, torch.long, dev)
        o_out[seq_idx] = o_red
        lse_out[seq_idx] = lse_red

    if replays is not None and _REPLAYS.get((_device_index(dev), replays.key)) is not replays:
        replays.close()  # its memory back to the pool, now that the epilogue is queued
    o_bf16 = o_out.to(torch.bfloat16)
    if knobs.v_descale_at == "output":
        o_bf16 = (o_bf16.float() * vd[:, :, None, None]).to(torch.bfloat16)
    o_final = unpack_o(o_bf16, num_seqs, q_len, heads_k)
    if return_details:
        return DecodeResult(o=o_final, lse=lse_out, o_fp32=o_out, plan=plan)
    return o_final, lse_out
