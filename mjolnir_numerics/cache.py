"""A paged KV cache for one attention layer, stored exactly as the decode kernel reads it.

Storage (what the kernel's TMA loads see):

* ``e4m3``: ``torch.float8_e4m3fn`` pools, one byte per element;
* ``e3m2`` / ``e2m3`` (6 bits), ``e2m1`` / ``nvfp4`` (4 bits): uint8 byte views whose last dim is
  ``d * bits / 8`` (see :mod:`mjolnir_numerics.packing`), plus, for NVFP4, e4m3 block-scale pools
  ``(num_pages, PS, h_k, d / 16)``.

Physical layouts (all exposed as logical ``(num_pages, PS, h_k, row)`` views with the row contiguous):

==============  ====================================  =====================================
layout          physical buffer                        used by
==============  ====================================  =====================================
``nhd``         two ``(pages, PS, h_k, row)`` pools    vLLM (separate K and V caches)
``hnd``         ``(pages, 2, h_k, PS, row)``           head-major pages
``interleaved`` ``(pages, h_k, PS, 2 * row)``, K | V   vLLM main FlashAttention backend
``flashinfer``  ``(pages, 2, PS, h_k, row)``           FlashInfer NHD
==============  ====================================  =====================================

Descales map stored values to real units: ``real = value * descale`` with one value, one per kv head,
or one per (sequence, kv head). For NVFP4 the cache keeps the descale the *kernel* takes, ``8 * g``
(the convert stage computes ``e4m3(code * scale / 8)``, :mod:`mjolnir_numerics.nvfp4`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch

from .capability import PAGE_SIZES
from .checks import (
    ArgumentTypeError, check_bool, check_choice, check_device, check_float, check_int, check_tensor, refuse_scale,
    scale_fit_counts,
)  # fmt: skip
from .formats import E2M1, E4M3, AnyFormat, BlockScaledFormat, Format, get_format
from . import fused
from .nvfp4 import DEFAULT_SCALE_FLOOR, KERNEL_SHIFT, NVFP4_SMALLEST, encode_unchecked
from .packing import pack, packed_size, unpack
from .quantize import _round_to_odd_lut, quantize
from .scales import GRANULARITIES, compute_descale

__all__ = ["LAYOUTS", "PAGE_SIZES", "PagedKVCache", "check_descale", "descale_table"]

LAYOUTS = ("nhd", "hnd", "interleaved", "flashinfer")

# Poison for pages no sequence references, so that a stray read shows in the output:
# e4m3 NaN for 8-bit pools; the all-ones byte (every code the largest, -max) for sub-byte pools;
# the largest e4m3 scale (448) for NVFP4 scale pools.
POISON_BYTE = {8: E4M3.nan_code, 6: 0xFF, 4: 0xFF}
POISON_SCALE = E4M3.max_code

# nvfp4_quantize options a cache may fix for its writes (its global scale comes from the descale).
NVFP4_CACHE_OPTIONS = ("four_over_six", "scale_floor")

KV = Union[torch.Tensor, Sequence[torch.Tensor]]


def _row_bytes(fmt: AnyFormat, d: int) -> int:
    return packed_size(d, fmt.bits)


def _allocate(layout: str, num_pages: int, page_size: int, heads_k: int, row: int, device) -> tuple:
    """Physical buffer(s) and the logical (pages, PS, h_k, row) uint8 K and V views over them."""
    if layout == "nhd":
        k = torch.zeros(num_pages, page_size, heads_k, row, dtype=torch.uint8, device=device)
        v = torch.zeros_like(k)
        return (k, v), k, v
    if layout == "hnd":
        buf = torch.zeros(num_pages, 2, heads_k, page_size, row, dtype=torch.uint8, device=device)
        return (buf,), buf[:, 0].transpose(1, 2), buf[:, 1].transpose(1, 2)
    if layout == "interleaved":
        buf = torch.zeros(num_pages, heads_k, page_size, 2 * row, dtype=torch.uint8, device=device)
        kv = buf.transpose(1, 2)
        return (buf,), kv[..., :row], kv[..., row:]
    if layout == "flashinfer":
        buf = torch.zeros(num_pages, 2, page_size, heads_k, row, dtype=torch.uint8, device=device)
        return (buf,), buf[:, 0], buf[:, 1]
    raise ValueError(f"layout: {layout!r} is not one of {', '.join(LAYOUTS)}")


def check_descale(descale: torch.Tensor, num_seqs: int, heads_k: int, argument: str) -> torch.Tensor:
    """Validate a descale: float, shape ``()``/``(1,)``, ``(h_k,)`` or ``(num_seqs, h_k)``, positive and finite.

    Returns it as float32. Raises ValueError naming ``argument`` otherwise.
    """
    if not isinstance(descale, torch.Tensor) or not descale.is_floating_point():
        raise ValueError(f"{argument}: expected a float tensor, got {getattr(descale, 'dtype', type(descale))}")
    shape = tuple(descale.shape)
    if shape not in ((), (1,), (heads_k,), (num_seqs, heads_k)):
        raise ValueError(
            f"{argument}: shape {shape} fits no granularity; allowed () or (1,) per tensor, "
            f"({heads_k},) per kv head, ({num_seqs}, {heads_k}) per (sequence, kv head)"
        )
    d = descale.float()
    if not (torch.isfinite(d).all() and (d > 0).all()):
        raise ValueError(f"{argument}: descales must be positive and finite, got {d.flatten()[:8].tolist()}")
    return d


def descale_table(descale: torch.Tensor, num_seqs: int, heads_k: int) -> torch.Tensor:
    """Expand a descale of any granularity to ``(num_seqs, h_k)`` float32."""
    d = descale.float()
    if d.dim() == 0 or d.shape == (1,):
        return d.reshape(1, 1).expand(num_seqs, heads_k)
    if d.dim() == 1:
        return d.reshape(1, heads_k).expand(num_seqs, heads_k)
    return d


def _as_seq_list(x: KV, argument: str, allow_nonfinite: bool) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        if x.dim() != 4:
            raise ValueError(
                f"{argument}: expected (num_seqs, L, h_k, d) or a list of (L, h_k, d), got {tuple(x.shape)}"
            )
        seqs = list(x.unbind(0))
    elif isinstance(x, (list, tuple)):
        seqs = list(x)
    else:
        raise ArgumentTypeError(
            f"{argument}: expected a float (num_seqs, L, h_k, d) tensor or a list of (L, h_k, d), got "
            f"{type(x).__name__}"
        )
    if not seqs:
        raise ValueError(f"{argument}: expected at least one sequence")
    first = None
    for i, s in enumerate(seqs):
        if not isinstance(s, torch.Tensor) or s.dim() != 3 or not s.is_floating_point():
            raise ValueError(
                f"{argument}[{i}]: expected a float tensor (L, h_k, d), got {getattr(s, 'shape', type(s))}"
            )
        if first is None:
            first = s.shape[1:]
        elif s.shape[1:] != first:
            raise ValueError(
                f"{argument}[{i}]: (h_k, d) = {tuple(s.shape[1:])} differs from the first sequence's {tuple(first)}"
            )
        if not allow_nonfinite and not torch.isfinite(s).all():
            raise ValueError(f"{argument}[{i}]: holds inf or NaN (pass allow_nonfinite=True to store them saturated)")
    return seqs


def _gather_bytes(pool: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``pool[idx]`` of a one-byte pool (any layout view) as uint8, gathered through a float8 view
    of the same bytes: torch's CPU gather is ~40x slower for uint8 than for float8."""
    return pool.view(torch.float8_e4m3fn)[idx].view(torch.uint8)


def _scatter_rows(pool: torch.Tensor, page: torch.Tensor, off: torch.Tensor, rows: torch.Tensor) -> None:
    """``pool[page, off] = rows`` for a one-byte pool ``(pages, PS, h_k, row)`` (any layout view) and uint8
    ``rows (n, h_k, row)``, moved as the widest words the row's bytes and alignment allow (fewer, wider
    elements for ``index_put_``; the same bytes land either way)."""
    raw = pool.view(torch.uint8)
    row = raw.shape[-1]
    for word, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        aligned = (raw.storage_offset() % size == 0) and all(st % size == 0 for st in raw.stride()[:-1])
        if row % size == 0 and aligned:
            raw.view(word)[page, off] = rows.view(word)
            return
    raw[page, off] = rows


def _decode(codes: torch.Tensor, fmt: Format, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float32 values of valid uint8 codes (what ``dequantize`` returns, without its range check:
    callers pass whole bytes of an 8-bit format or unpacked codes): int32 indices into the table.
    ``out``: a contiguous float32 tensor with ``codes.numel()`` elements to write into."""
    idx = torch.empty(codes.shape, dtype=torch.int32, device=codes.device)
    idx.copy_(codes)
    if out is None:
        out = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
    torch.index_select(fmt.values(codes.device), 0, idx.reshape(-1), out=out.view(-1))
    return out.view(codes.shape)


_E4M3_CODES: dict = {}


def _code_pairs(pool: torch.Tensor, scales: Optional[torch.Tensor], idx: torch.Tensor, table: torch.Tensor,
                group: int) -> torch.Tensor:  # fmt: skip
    """The e4m3 code pairs of a 4-bit pool's pages ``idx`` (int64 ``(n,)``): int16 ``(n, PS, h_k, d / 2)``,
    ``table`` (:func:`_e4m3_codes_of`) at each packed byte, or for NVFP4 at ``scale_code << 8 | byte`` with
    ``scales`` (uint8 ``(num_pages, PS, h_k, d / group)``) the block scale codes. ``pool``: uint8
    ``(num_pages, PS, h_k, d / 2)``, any layout view. CUDA compiles the gather and the lookup into one kernel,
    with no int32 keys in memory (e2m1 at b32 x 32K: 0.92-0.94x the emulator's call on an H100, 2026-12-07)."""
    key = pool[idx].to(torch.int32)
    if scales is not None:
        sc = scales[idx].to(torch.int32)  # (n, PS, h_k, d / group)
        key = (key.unflatten(-1, (sc.shape[-1], group // 2)) | (sc[..., None] << 8)).flatten(-2)
    return table[key]


def _e4m3_codes_of(fmt: AnyFormat, device) -> torch.Tensor:
    """A lookup table from a sub-byte format's stored bits to the e4m3 codes of its MMA operands (every such
    operand is an e4m3 value: the fp6 / fp4 code values exactly, NVFP4's after the convert stage's rounding):

    - e3m2, e2m3: uint8 ``(64,)``, the e4m3 code of each code's value (signed zeros kept);
    - e2m1: int16 ``(256,)``, one packed byte's two codes at once: the entry's two bytes (in memory order)
      are the e4m3 codes of the byte's low nibble, then its high nibble, as :func:`unpack` orders them;
    - NVFP4: int16 ``(65536,)`` at ``scale_code << 8 | byte``: the same pair for a byte of the block whose
      scale code is ``scale_code``, each ``e4m3(code_value * scale * 2^-3)`` (``_decode_pages``' formula,
      NaN scales included, evaluated once for every pair).

    Built once per format and device, on the CPU, by the spec's own functions."""
    key = (fmt.name, str(device))
    if key in _E4M3_CODES:
        return _E4M3_CODES[key]
    cpu = torch.device("cpu")
    if isinstance(fmt, BlockScaledFormat):
        scale_values = _decode(torch.arange(256, dtype=torch.uint8), fmt.scale)  # (256,): NaN at 0x7F / 0xFF
        shifted = fmt.element.values(cpu)[None, :] * scale_values[:, None] * KERNEL_SHIFT  # as _decode_pages
        codes = quantize(shifted, E4M3)  # (256 scales, 16 codes)
    else:
        values = fmt.values(cpu)
        codes = quantize(values, E4M3)
        if not torch.equal(E4M3.values(cpu)[codes.long()].view(torch.int32), values.view(torch.int32)):
            raise RuntimeError(f"{fmt.name}: a code's value is not an e4m3 value")
    if fmt.bits == 4:  # a packed byte's two codes: low nibble first, as unpack orders them
        byte = torch.arange(256)
        pairs = torch.stack([codes.view(-1, 16)[:, byte & 0x0F], codes.view(-1, 16)[:, byte >> 4]], dim=-1)
        codes = pairs.contiguous().view(torch.int16).reshape(-1)  # (scales x 256 bytes,)
    _E4M3_CODES[key] = codes.to(device)
    return _E4M3_CODES[key]


# Tuning: page_values decodes this many elements per chunk (4 MiB of float32; the int32 index and
# byte temporaries of a whole-pool decode cost more in page faults than the decode itself). On CUDA every
# chunk is a handful of kernel launches, so chunks are 16x larger there (144 MiB of temporaries at most).
_PAGE_VALUES_CHUNK = 1 << 20
_PAGE_VALUES_CHUNK_CUDA = 1 << 24


@dataclass(frozen=True, eq=False)
class PagedKVCache:
    """One layer's paged KV cache, stored as the kernel reads it.

    Attributes:
        fmt: the storage format (an element format or NVFP4).
        page_size: tokens per page (PS).
        layout: physical layout, one of :data:`LAYOUTS`.
        head_dim: d.
        k_pool, v_pool: logical ``(num_pages, PS, h_k, row)`` views; ``float8_e4m3fn`` with
            ``row = d`` for e4m3, else uint8 with ``row = d * bits / 8``.
        k_scales, v_scales: NVFP4 block scales ``(num_pages, PS, h_k, d / 16)`` float8_e4m3fn, else None.
        block_table: int32 ``(num_seqs, max_blocks)``; entry ``j`` of row ``s`` is the page holding
            tokens ``[j * PS, (j + 1) * PS)`` of sequence ``s``.
        seq_lens: int32 ``(num_seqs,)``, tokens in each sequence (new tokens included).
        k_descale, v_descale: float32 ``()``, ``(h_k,)`` or ``(num_seqs, h_k)``: the descales the kernel
            takes (NVFP4: ``8 * g``).
        storage: the physical buffers behind the pools (kept alive; for writers and byte counts).
        nvfp4_options: NVFP4 encoder options every write uses (``four_over_six``, ``scale_floor``;
            see :func:`~mjolnir_numerics.nvfp4.nvfp4_quantize`); None for the default recipe.
    """

    fmt: AnyFormat
    page_size: int
    layout: str
    head_dim: int
    k_pool: torch.Tensor
    v_pool: torch.Tensor
    k_scales: Optional[torch.Tensor]
    v_scales: Optional[torch.Tensor]
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    k_descale: torch.Tensor
    v_descale: torch.Tensor
    storage: tuple = ()
    nvfp4_options: Optional[dict] = None
    _writers: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # per helper module

    def __post_init__(self):
        self.validate()

    def __getstate__(self) -> dict:
        """Pickled and deep-copied without its writers (compiled kernels bound to this process's device)."""
        return {**self.__dict__, "_writers": {}}

    # -- shape properties ---------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self.k_pool.shape[0]

    @property
    def heads_k(self) -> int:
        return self.k_pool.shape[2]

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.k_pool.device

    @property
    def is_block_scaled(self) -> bool:
        return isinstance(self.fmt, BlockScaledFormat)

    @property
    def element_format(self) -> Format:
        return self.fmt.element if isinstance(self.fmt, BlockScaledFormat) else self.fmt

    def kv_bytes(self) -> int:
        """Bytes the kernel reads for all tokens of all sequences (K and V, block scales included)."""
        return int(int(self.seq_lens.sum()) * self.heads_k * 2 * self.fmt.bits_per_value * self.head_dim) // 8

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> None:
        """Check every invariant the kernel relies on; raises ValueError naming the field."""
        fmt = get_format(self.fmt)
        check_choice("page_size", self.page_size, PAGE_SIZES)
        check_int("head_dim", self.head_dim, low=1)
        for name in ("k_pool", "v_pool", "block_table", "seq_lens", "k_descale", "v_descale"):
            check_tensor(name, getattr(self, name))
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: {self.layout!r} is not one of {', '.join(LAYOUTS)}")
        row = _row_bytes(fmt, self.head_dim)
        want_dtype = torch.float8_e4m3fn if fmt.bits == 8 else torch.uint8
        for name, pool in (("k_pool", self.k_pool), ("v_pool", self.v_pool)):
            if pool.dtype != want_dtype:
                raise ValueError(f"{name}: {fmt.name} pools are {want_dtype}, got {pool.dtype}")
            if pool.dim() != 4 or pool.shape[1] != self.page_size or pool.shape[3] != row:
                raise ValueError(f"{name}: expected (num_pages, {self.page_size}, h_k, {row}), got {tuple(pool.shape)}")
            if pool.stride(3) != 1:
                raise ValueError(f"{name}: the row (last dim) must be contiguous, strides {pool.stride()}")
        if self.v_pool.shape != self.k_pool.shape:
            raise ValueError(f"v_pool: shape {tuple(self.v_pool.shape)} differs from k_pool {tuple(self.k_pool.shape)}")
        if isinstance(fmt, BlockScaledFormat):
            want = (self.num_pages, self.page_size, self.heads_k, self.head_dim // fmt.group)
            for name, sc in (("k_scales", self.k_scales), ("v_scales", self.v_scales)):
                if sc is None or tuple(sc.shape) != want or sc.dtype != torch.float8_e4m3fn:
                    raise ValueError(
                        f"{name}: {fmt.name} needs float8_e4m3fn scales of shape {want}, got "
                        f"{None if sc is None else (tuple(sc.shape), sc.dtype)}"
                    )
            unknown = set(self.nvfp4_options or {}) - set(NVFP4_CACHE_OPTIONS)
            if unknown:
                raise ValueError(
                    f"nvfp4_options: {sorted(unknown)} are not encoder options of the cache; allowed "
                    f"{', '.join(NVFP4_CACHE_OPTIONS)} (the global scale follows from the descale)"
                )
            opts = self.nvfp4_options or {}
            check_bool("nvfp4_options['four_over_six']", opts.get("four_over_six", False))
            floor = opts.get("scale_floor", DEFAULT_SCALE_FLOOR)
            if floor is not None:
                check_float("nvfp4_options['scale_floor']", floor, positive=True, allow_zero=False)
        elif self.nvfp4_options:
            raise ValueError(f"nvfp4_options: only the nvfp4 format takes them, not {fmt.name}")
        elif self.k_scales is not None or self.v_scales is not None:
            raise ValueError(f"k_scales: only block-scaled formats carry scale pools, not {fmt.name}")
        bt, sl = self.block_table, self.seq_lens
        if bt.dtype != torch.int32 or bt.dim() != 2:
            raise ValueError(f"block_table: expected int32 (num_seqs, max_blocks), got {bt.dtype} {tuple(bt.shape)}")
        if sl.dtype != torch.int32 or sl.dim() != 1 or sl.shape[0] != bt.shape[0]:
            raise ValueError(
                f"seq_lens: expected int32 ({bt.shape[0]},) to match block_table, got {sl.dtype} {tuple(sl.shape)}"
            )
        if sl.numel() and int(sl.min()) < 0:
            raise ValueError(f"seq_lens: must be >= 0, got min {int(sl.min())}")
        need = (sl.long() + self.page_size - 1) // self.page_size  # pages each sequence references
        if need.numel() and int(need.max()) > bt.shape[1]:
            s = int(need.argmax())
            raise ValueError(
                f"seq_lens: sequence {s} has {int(sl[s])} tokens = {int(need[s])} pages of {self.page_size}, "
                f"but its block_table row holds {bt.shape[1]}"
            )
        used = torch.arange(bt.shape[1], device=bt.device)[None, :] < need[:, None].to(bt.device)
        refs = bt[used]
        if refs.numel() and (int(refs.min()) < 0 or int(refs.max()) >= self.num_pages):
            raise ValueError(
                f"block_table: referenced page indices must be in 0..{self.num_pages - 1}, "
                f"got range [{int(refs.min())}, {int(refs.max())}]"
            )
        check_descale(self.k_descale, self.num_seqs, self.heads_k, "k_descale")
        check_descale(self.v_descale, self.num_seqs, self.heads_k, "v_descale")

    # -- reading ------------------------------------------------------------------------------
    def _pool(self, which: str):
        if which == "k":
            return self.k_pool, self.k_scales
        if which == "v":
            return self.v_pool, self.v_scales
        raise ValueError(f"which: expected 'k' or 'v', got {which!r}")

    def page_values(self, which: str, pages: torch.Tensor) -> torch.Tensor:
        """The values the kernel's MMA reads for the given pages (no descale applied).

        e4m3: the e4m3 values; fp6/fp4: the code values; NVFP4: ``e4m3(code * scale * 2^-3)``.

        Args:
            which: ``"k"`` or ``"v"``.
            pages: integer tensor of page indices, any shape.

        Returns:
            float32 ``(*pages.shape, PS, h_k, d)``.
        """
        check_tensor("pages", pages, kind="int")
        if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= self.num_pages):
            raise ValueError(
                f"pages: page indices must be in 0..{self.num_pages - 1}, got range [{int(pages.min())}, "
                f"{int(pages.max())}]"
            )
        return self._page_values(which, pages, kernel_view=True)

    def _page_values(self, which: str, pages: torch.Tensor, kernel_view: bool) -> torch.Tensor:
        """:meth:`page_values`; with ``kernel_view=False`` NVFP4 pages skip the convert stage's e4m3
        rounding (``code * scale * 2^-3``, the format's own dequantization up to the descale)."""
        pool, scales = self._pool(which)
        idx = pages.long().to(pool.device).reshape(-1)
        if idx.device.type == "cpu" and idx.numel() > 1:  # pages shared by sequences (a prefix cache): decode once
            uniq, inverse = torch.unique(idx, return_inverse=True)  # (on CUDA, unique would wait for the device)
            if uniq.numel() < idx.numel():
                return self._page_values(which, uniq, kernel_view)[inverse].view(*pages.shape, *pool.shape[1:-1], -1)
        decode = lambda i, o: self._decode_pages(pool, scales, i, o, kernel_view)  # noqa: E731
        return self._decode_in_chunks(pool, pages, idx, torch.float32, decode)

    def _decode_in_chunks(self, pool, pages: torch.Tensor, idx: torch.Tensor, dtype: torch.dtype, decode):
        """``(*pages.shape, PS, h_k, d)`` of ``dtype`` for ``idx (n,)``, the flattened ``pages`` on the pool's
        device, filled by ``decode(idx_part, out_part)`` a few pages at a time (the temporaries stay a few MiB)."""
        out = torch.empty((idx.numel(), *pool.shape[1:-1], self.head_dim), dtype=dtype, device=pool.device)
        chunk = _PAGE_VALUES_CHUNK_CUDA if out.is_cuda else _PAGE_VALUES_CHUNK
        step = max(1, chunk // max(1, math.prod(out.shape[1:])))  # pages per chunk
        for i in range(0, idx.numel(), step):
            decode(idx[i : i + step], out[i : i + step])
        return out.view(*pages.shape, *out.shape[1:])

    def _page_codes(self, which: str, pages: torch.Tensor) -> torch.Tensor:
        """The values of :meth:`page_values` as e4m3 codes, uint8 ``(*pages.shape, PS, h_k, d)``: every
        format's MMA operands are e4m3 values (the fp6 and fp4 codes' values exactly, NVFP4's after the
        convert stage's rounding, which gives their codes), one byte each where the values take four. The
        emulator's CUDA path gathers tiles this way (:class:`mjolnir_numerics.emulator._TileSource`)."""
        pool, scales = self._pool(which)
        idx = pages.long().to(pool.device).reshape(-1)
        if self.fmt.bits == 4 and fused.available(pool.device):  # one compiled pass, no chunks
            group = self.fmt.group if scales is not None else 0
            sc = None if scales is None else scales.view(torch.uint8)
            table = _e4m3_codes_of(self.fmt, pool.device)
            pairs = fused.compiled_many(_code_pairs)(pool.view(torch.uint8), sc, idx, table, group)
            return pairs.view(torch.uint8).view(*pages.shape, *pool.shape[1:-1], self.head_dim)
        decode = lambda i, o: self._decode_page_codes(pool, scales, i, o)  # noqa: E731
        return self._decode_in_chunks(pool, pages, idx, torch.uint8, decode)

    def _decode_page_codes(self, pool, scales, idx: torch.Tensor, out: torch.Tensor) -> None:
        """``_page_codes`` of the pages ``idx (n,)`` written into ``out (n, PS, h_k, d)`` uint8: one table
        lookup per fp6 code, per 4-bit byte (its two codes; NVFP4 with the byte's block scale)."""
        raw = _gather_bytes(pool, idx)
        if self.fmt.bits == 8:
            out.copy_(raw)
            return
        table = _e4m3_codes_of(self.fmt, out.device)
        if self.fmt.bits == 6:
            codes = unpack(raw, 6)
            torch.index_select(table, 0, codes.reshape(-1).to(torch.int32), out=out.view(-1))
            return
        key = torch.empty(raw.shape, dtype=torch.int32, device=raw.device)
        key.copy_(raw)
        if scales is not None:  # the block's scale code above each of its bytes
            sc = _gather_bytes(scales, idx)  # (n, PS, h_k, d / group)
            key.view(*sc.shape, -1).bitwise_or_(sc.unsqueeze(-1).to(torch.int32) << 8)
        torch.index_select(table, 0, key.view(-1), out=out.view(torch.int16).view(-1))

    def _decode_pages(self, pool, scales, idx: torch.Tensor, out: torch.Tensor, kernel_view: bool = True) -> None:
        """``_page_values`` of the pages ``idx (n,)`` written into ``out (n, PS, h_k, d)`` float32."""
        raw = _gather_bytes(pool, idx)
        if self.fmt.bits == 8:
            _decode(raw, E4M3, out)
            return
        codes = unpack(raw, self.fmt.bits)
        if scales is None:
            _decode(codes, self.element_format, out)
            return
        vals = _decode(codes, self.element_format)
        g = self.fmt.group
        sc = _decode(_gather_bytes(scales, idx), E4M3)
        shifted = vals.reshape(*vals.shape[:-1], -1, g) * sc.unsqueeze(-1) * KERNEL_SHIFT
        if kernel_view:
            _decode(quantize(shifted, E4M3), E4M3, out)
        else:
            out.copy_(shifted.reshape(out.shape))

    def descale_table(self, which: str) -> torch.Tensor:
        """The kernel's descale for K or V expanded to ``(num_seqs, h_k)`` float32."""
        d = self.k_descale if which == "k" else self.v_descale if which == "v" else None
        if d is None:
            raise ValueError(f"which: expected 'k' or 'v', got {which!r}")
        return descale_table(d, self.num_seqs, self.heads_k)

    def gather(self, seq: int, kernel_view: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's K and V in real units, ``(L, h_k, d)`` float32 each.

        Args:
            seq: sequence index.
            kernel_view: True (default) returns what the kernel computes with (MMA values times the
                kernel's descale); False returns the format's own dequantization, which differs only
                for NVFP4 (``code * scale * g`` without the convert stage's e4m3 rounding).
        """
        seq = check_int("seq", seq, low=0, high=self.num_seqs - 1)
        check_bool("kernel_view", kernel_view)
        L = int(self.seq_lens[seq])
        n = (L + self.page_size - 1) // self.page_size
        pages = self.block_table[seq, :n]
        out = []
        for which in ("k", "v"):
            d = self.descale_table(which)[seq].to(self.device)
            vals = self._page_values(which, pages, kernel_view)
            vals = vals.reshape(n * self.page_size, self.heads_k, self.head_dim)[:L]
            out.append(vals * d[None, :, None])
        return out[0], out[1]

    # -- writing ------------------------------------------------------------------------------
    def _row_descale(self, which: str, seq_ids: Optional[torch.Tensor]) -> torch.Tensor:
        """The descale of each new row, float32 broadcastable to ``(n_tokens, h_k, 1)`` (no wait for the device)."""
        d = (self.k_descale if which == "k" else self.v_descale).to(self.device)
        if d.dim() == 2:
            return d[seq_ids.to(self.device).long()].unsqueeze(-1)
        return d.reshape(1, -1, 1)

    def _writer(self):
        """The one-launch writer of ``mjolnir_kernel.helpers`` for this cache (made on first use, then kept: it
        reads the descales at each launch, so an in-place change of them is seen), or None where the helper
        kernels do not run or cannot take this cache's rows (four-over-six NVFP4, a head dim or pool rows the
        writer does not take)."""
        kernels = fused.helper_kernels(self.device)
        if kernels is None or (self.nvfp4_options or {}).get("four_over_six", False):
            return None
        if self.k_descale.device != self.device or self.v_descale.device != self.device:
            return self._make_writer(kernels)  # descales copied to the device at each write: nothing kept
        key = id(kernels)
        if key not in self._writers:
            self._writers[key] = self._make_writer(kernels)
        return self._writers[key]

    def _make_writer(self, kernels):
        bits = 4 if self.is_block_scaled else self.fmt.bits
        if any(kernels.write_unsupported(*self._pool(w), self.head_dim, bits) for w in ("k", "v")):
            return None
        descales = (self.k_descale.to(self.device), self.v_descale.to(self.device))
        pools, scales = (self.k_pool, self.v_pool), (self.k_scales, self.v_scales)
        common = dict(page_size=self.page_size, head_dim=self.head_dim)
        if self.is_block_scaled:
            floor = (self.nvfp4_options or {}).get("scale_floor", DEFAULT_SCALE_FLOOR)
            lut = _round_to_odd_lut(E2M1, self.device)
            return kernels.CacheWriter(
                descales, pools, scales, element="e2m1", lut=lut, nvfp4=True, floor=floor, g_scale=KERNEL_SHIFT,
                **common,
            )  # fmt: skip
        lut = _round_to_odd_lut(self.fmt, self.device)
        return kernels.CacheWriter(descales, pools, (None, None), element=self.fmt.name, lut=lut, **common)

    def _encode_rows(self, x: torch.Tensor, descale: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Rows ``x (n, h_k, d)`` (real units) under descales broadcastable to ``(n, h_k, 1)``, as the pools
        store them: bytes ``(n, h_k, row)`` and NVFP4 scale codes ``(n, h_k, d / 16)`` (else None), uint8.
        One fused kernel on CUDA (:mod:`mjolnir_numerics.fused`)."""
        if self.is_block_scaled:
            opts = self.nvfp4_options or {}
            floor, four_six = opts.get("scale_floor", DEFAULT_SCALE_FLOOR), opts.get("four_over_six", False)
            # the NVFP4 global scale behind the kernel descale 8 g
            return encode_unchecked(x, descale, self.fmt.group, floor, four_six, packed=True, g_scale=KERNEL_SHIFT)
        if fused.available(x.device):
            lut = _round_to_odd_lut(self.fmt, x.device)
            return fused.compiled(fused.encode_elements, bits=self.fmt.bits)(x, descale, lut), None
        return pack(quantize(x.float() / descale, self.fmt), self.fmt.bits, check=False), None

    def write(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        slot_mapping: torch.Tensor,
        seq_ids: Optional[torch.Tensor] = None,
        allow_nonfinite: bool = False,
        *,
        check: bool = True,
    ) -> None:
        """Store new tokens at the given slots, as vLLM's ``reshape_and_cache`` does (in place).

        Tokens are quantized with the cache's existing descales. Sequence lengths and the block table
        are the caller's to update (as in vLLM).

        Args:
            k, v: float ``(n_tokens, h_k, d)`` in real units, finite.
            slot_mapping: integer ``(n_tokens,)``, slot ``page * PS + offset`` of each token; every slot
                at most once (a float or duplicate slot is refused, never truncated or overwritten).
            seq_ids: integer ``(n_tokens,)``, the sequence of each token; needed only for
                per-(sequence, kv head) descales.
            allow_nonfinite: store inf/NaN (saturating / NaN codes, as the hardware converts them)
                instead of raising; element formats only.
            check: check the values too (finite K/V, slots in range and distinct, sequence ids in range,
                descales that fit the data); each needs the device's answer. ``False`` is the serving loop's
                write: no wait for the device, so it can be captured in a CUDA graph; the caller then
                guarantees those (an out-of-range slot is a device-side error, a duplicate slot keeps one
                of its rows, a non-finite value stores as the hardware converts it). Shapes and dtypes are
                always checked.

        On CUDA K and V are encoded and stored by one kernel launch (``mjolnir_kernel.helpers`` where the
        CuTe DSL is installed; else one compiled encoder and one ``index_put_`` for each), with the CPU's bits. A
        checked write is all or nothing: every argument is checked before any byte of the pools changes (and
        nothing after the checks can fail), so a refused write leaves the cache as it was.
        """
        check_bool("allow_nonfinite", allow_nonfinite)
        check_bool("check", check)
        if allow_nonfinite and self.is_block_scaled:
            raise ValueError(f"allow_nonfinite: {self.fmt.name} block scales come from amax and need finite K/V")
        for name, t in (("k", k), ("v", v)):
            check_tensor(name, t, kind="float", dim=3)
            if tuple(t.shape[1:]) != (self.heads_k, self.head_dim):
                raise ValueError(f"{name}: expected (n_tokens, {self.heads_k}, {self.head_dim}), got {tuple(t.shape)}")
        n = k.shape[0]
        if v.shape[0] != n:
            raise ValueError(f"v: has {v.shape[0]} tokens, k has {n}")
        check_tensor("slot_mapping", slot_mapping, kind="int", dim=1)
        if slot_mapping.shape[0] != n:
            raise ValueError(f"slot_mapping: expected ({n},) to match k and v, got {tuple(slot_mapping.shape)}")
        per_seq = self.k_descale.dim() == 2 or self.v_descale.dim() == 2
        if per_seq and seq_ids is None:
            raise ValueError("seq_ids: per-(sequence, kv head) descales need the sequence of every token")
        if seq_ids is not None:
            check_tensor("seq_ids", seq_ids, kind="int", dim=1)
            if seq_ids.shape[0] != n:
                raise ValueError(f"seq_ids: expected ({n},) to match k and v, got {tuple(seq_ids.shape)}")
        k, v = k.to(self.device), v.to(self.device)
        slots = slot_mapping.to(self.device).long()
        if check:
            self._check_write(k, v, slots, seq_ids, allow_nonfinite)
        writer = self._writer()
        if writer is not None:  # one launch for K and V: encode and store (CUDA)
            writer(k, v, slots, None if seq_ids is None else seq_ids.to(self.device))
            return
        encoded = [
            (which, *self._encode_rows(x, self._row_descale(which, seq_ids))) for which, x in (("k", k), ("v", v))
        ]
        page, off = slots // self.page_size, slots % self.page_size  # all-or-nothing: every row encoded first
        for which, data, sc in encoded:
            pool, scales = self._pool(which)
            _scatter_rows(pool, page, off, data)
            if scales is not None:
                _scatter_rows(scales, page, off, sc)

    def _check_write(self, k, v, slots: torch.Tensor, seq_ids: Optional[torch.Tensor], allow_nonfinite: bool) -> None:
        """The value checks of a checked :meth:`write`: every statistic computed on the device, then one wait
        for all of them; a failing check is then described from the data."""
        n = slots.shape[0]
        if n == 0:
            return
        n_slots = self.num_pages * self.page_size
        ordered = slots.sort().values
        rows = None if seq_ids is None else seq_ids.to(self.device).long()
        if self.is_block_scaled:  # the stored descale is 8 g; values are code * scale * g
            top, smallest, unit = E2M1.max_normal * E4M3.max_normal, NVFP4_SMALLEST, KERNEL_SHIFT
        else:
            top, smallest, unit = self.fmt.max_normal, self.fmt.min_subnormal, 1.0
        descales = {which: self._row_descale(which, seq_ids) * unit for which in ("k", "v")}
        rows_in_range = torch.ones((), dtype=torch.bool, device=self.device)
        if rows is not None:
            rows_in_range = (rows.min() >= 0) & (rows.max() < self.num_seqs)
        stats = [
            torch.isfinite(k).all(), torch.isfinite(v).all(), ordered[0] >= 0, ordered[-1] < n_slots,
            (ordered[1:] != ordered[:-1]).all(), rows_in_range,
        ]  # fmt: skip
        fits = [scale_fit_counts(x.float(), descales[which], top, smallest) for which, x in (("k", k), ("v", v))]
        host = torch.cat([torch.stack(stats).long(), *fits]).tolist()  # the one wait
        k_finite, v_finite, low_ok, high_ok, distinct, rows_ok = (bool(h) for h in host[:6])
        for name, finite in (("k", k_finite), ("v", v_finite)):
            if not allow_nonfinite and not finite:
                raise ValueError(f"{name}: holds inf or NaN (pass allow_nonfinite=True to store them)")
        if not (low_ok and high_ok):
            raise ValueError(
                f"slot_mapping: slots must be in 0..{n_slots - 1}, got range [{int(ordered[0])}, {int(ordered[-1])}]"
            )
        if not distinct:
            values, counts = torch.unique(slots, return_counts=True)
            raise ValueError(f"slot_mapping: slot {int(values[counts > 1][0])} appears more than once")
        if not rows_ok:
            raise ValueError(f"seq_ids: must be in 0..{self.num_seqs - 1}")
        for i, (which, x) in enumerate((("k", k), ("v", v))):
            refuse_scale(f"{which}_descale", x.float(), descales[which], top, host[6 + 3 * i : 9 + 3 * i])

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def from_float(
        cls,
        k: KV,
        v: KV,
        fmt: Union[str, AnyFormat] = "e4m3",
        *,
        page_size: int = 16,
        layout: str = "nhd",
        granularity: str = "per_tensor",
        k_descale: Optional[torch.Tensor] = None,
        v_descale: Optional[torch.Tensor] = None,
        shuffle: bool = True,
        poison: bool = True,
        spare_pages: Optional[int] = None,
        seed: int = 0,
        allow_nonfinite: bool = False,
        nvfp4_options: Optional[dict] = None,
        device: Union[str, torch.device, None] = None,
    ) -> "PagedKVCache":
        """Build a cache from float K/V per sequence (real units), quantizing them into ``fmt``.

        Args:
            k, v: ``(num_seqs, L, h_k, d)`` or lists of ``(L_i, h_k, d)`` float tensors (varlen).
            fmt: storage format name or object.
            page_size: tokens per page, one of :data:`PAGE_SIZES`.
            layout: physical layout, one of :data:`LAYOUTS`.
            granularity: descale granularity when descales are not given: ``"per_tensor"``,
                ``"per_head"`` or ``"per_seq_head"`` (amax / max, :func:`compute_descale`).
            k_descale, v_descale: explicit descales in real units per stored unit (for NVFP4 the
                global scale ``g``; the cache keeps ``8 * g``); override ``granularity``.
            shuffle: assign pages in a seeded random order (True) or contiguously.
            poison: fill pages no sequence references with poison (e4m3 NaN, the largest code,
                the largest scale), so that a stray read shows.
            spare_pages: unreferenced pages to allocate beyond those needed (default max(2, n/4)).
            seed: seed of the page shuffle.
            allow_nonfinite: store inf/NaN inputs (saturated / NaN codes) instead of raising.
            nvfp4_options: NVFP4 only: encoder options kept for every write, e.g.
                ``{"four_over_six": True}`` or ``{"scale_floor": None}`` (:func:`nvfp4_quantize`).
            device: where the pools live (default: the device of the first K sequence).
        """
        f = get_format(fmt)
        ks = _as_seq_list(k, "k", allow_nonfinite)
        vs = _as_seq_list(v, "v", allow_nonfinite)
        if len(ks) != len(vs):
            raise ValueError(f"v: has {len(vs)} sequences, k has {len(ks)}")
        for i, (a, b) in enumerate(zip(ks, vs)):
            if a.shape != b.shape:
                raise ValueError(f"v[{i}]: shape {tuple(b.shape)} differs from k[{i}] {tuple(a.shape)}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout: {layout!r} is not one of {', '.join(LAYOUTS)}")
        page_size = check_choice("page_size", page_size, PAGE_SIZES)
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity: {granularity!r} is not one of {', '.join(GRANULARITIES)}")
        for name, flag in (("shuffle", shuffle), ("poison", poison), ("allow_nonfinite", allow_nonfinite)):
            check_bool(name, flag)
        seed = check_int("seed", seed)
        if spare_pages is not None:
            spare_pages = check_int("spare_pages", spare_pages, low=0)
        if nvfp4_options is not None and not isinstance(nvfp4_options, dict):
            raise ArgumentTypeError(f"nvfp4_options: expected a dict or None, got {type(nvfp4_options).__name__}")
        heads_k, d = ks[0].shape[1:]
        if isinstance(f, BlockScaledFormat) and d % f.group:
            raise ValueError(f"k: head dim {d} is not a multiple of the {f.name} block of {f.group}")
        if isinstance(f, BlockScaledFormat) and allow_nonfinite:
            raise ValueError(f"allow_nonfinite: {f.name} block scales are computed from amax and need finite K/V")
        per = {8: 1, 6: 4, 4: 2}[f.bits]
        if d % per:
            raise ValueError(f"k: head dim {d} does not fill whole bytes at {f.bits} bits; use a multiple of {per}")
        row = _row_bytes(f, d)
        device = check_device("device", device) if device is not None else ks[0].device
        num_seqs = len(ks)
        lens = [s.shape[0] for s in ks]

        descales = []
        for name, seqs, given in (("k_descale", ks, k_descale), ("v_descale", vs, v_descale)):
            if given is None:
                finite = (
                    [torch.nan_to_num(s, nan=0.0, posinf=0.0, neginf=0.0) for s in seqs] if allow_nonfinite else seqs
                )
                dsc = compute_descale(finite, f, granularity)
            else:
                dsc = check_descale(given, num_seqs, heads_k, name)
            descales.append(dsc.to(device))
        if isinstance(f, BlockScaledFormat):
            descales = [dsc / KERNEL_SHIFT for dsc in descales]

        blocks = [math.ceil(L / page_size) for L in lens]
        used = sum(blocks)
        spare = max(2, used // 4) if spare_pages is None else spare_pages
        num_pages = used + spare
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(num_pages, generator=gen) if shuffle else torch.arange(num_pages)
        block_table = torch.zeros(num_seqs, max(1, max(blocks)), dtype=torch.int32)
        cursor = 0
        for s, n in enumerate(blocks):
            block_table[s, :n] = order[cursor : cursor + n].to(torch.int32)
            cursor += n
        unused = order[cursor:]
        if unused.numel():  # rows' unused entries point at an unreferenced page: a stray read shows
            filler = block_table.new_full(block_table.shape, int(unused[0]))
            mask = torch.arange(block_table.shape[1])[None, :] >= torch.tensor(blocks)[:, None]
            block_table = torch.where(mask, filler, block_table)

        storage, k_raw, v_raw = _allocate(layout, num_pages, page_size, heads_k, row, device)
        k_sc = v_sc = None
        if isinstance(f, BlockScaledFormat):
            k_sc = torch.zeros(num_pages, page_size, heads_k, d // f.group, dtype=torch.uint8, device=device)
            v_sc = torch.zeros_like(k_sc)
        if poison and unused.numel():
            idx = unused.to(device)
            for raw in (k_raw, v_raw):
                raw[idx] = POISON_BYTE[f.bits]
            for sc in (k_sc, v_sc):
                if sc is not None:
                    sc[idx] = POISON_SCALE
        as_pool = (lambda t: t.view(torch.float8_e4m3fn)) if f.bits == 8 else (lambda t: t)
        cache = cls(
            fmt=f,
            page_size=page_size,
            layout=layout,
            head_dim=d,
            k_pool=as_pool(k_raw),
            v_pool=as_pool(v_raw),
            k_scales=None if k_sc is None else k_sc.view(torch.float8_e4m3fn),
            v_scales=None if v_sc is None else v_sc.view(torch.float8_e4m3fn),
            block_table=block_table.to(device),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
            k_descale=descales[0],
            v_descale=descales[1],
            storage=storage + tuple(t for t in (k_sc, v_sc) if t is not None),
            nvfp4_options=dict(nvfp4_options) if nvfp4_options else None,
        )
        for s, L in enumerate(lens):
            if L == 0:
                continue
            pos = torch.arange(L, device=device)
            slots = block_table[s].to(device).long()[pos // page_size] * page_size + pos % page_size
            cache.write(ks[s].to(device), vs[s].to(device), slots, torch.full((L,), s, device=device), allow_nonfinite)
        return cache
