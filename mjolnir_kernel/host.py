"""Host side of the decode kernel: argument checks, kernel views and element strides, launch arguments.

Pure PyTorch except :func:`element_types` and :func:`launch_args` (which import cutlass lazily), so the
checks run (and are tested) on a machine without the CuTe DSL or a GPU. Every error is a ValueError
naming the argument, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from mjolnir_numerics.capability import KV_FORMATS, unsupported_reason
from mjolnir_numerics.formats import FORMATS, NVFP4

STRIDE_FIELDS = (
    "q_seq", "o_seq",
    "k_page", "k_row", "k_head",
    "v_page", "v_row", "v_head",
    "qd_seq", "qd_head", "kd_seq", "kd_head", "vd_seq", "vd_head",
    "ks_page", "ks_row", "ks_head", "vs_page", "vs_row", "vs_head",
)  # fmt: skip
TMA_ALIGN = 16  # bytes: TMA global addresses and strides
INT32_MAX = 2**31 - 1
Q_DTYPES = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3"}


def element_types(config) -> dict:
    """cutlass element types of the kernel's pointers for ``config`` (imports cutlass)."""
    import cutlass

    kv = {
        "e4m3": cutlass.Float8E4M3FN,
        "e3m2": cutlass.Float6E3M2FN,
        "e2m3": cutlass.Float6E2M3FN,
        "e2m1": cutlass.Float4E2M1FN,
        "nvfp4": cutlass.Float4E2M1FN,
    }[config.kv_format]
    q = cutlass.Float8E4M3FN if config.fp8 else cutlass.BFloat16
    return {"q": q, "kv": kv, "scales": cutlass.Float8E4M3FN}


def _shape(t) -> tuple:
    return tuple(getattr(t, "shape", ()))


def _need_tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def check_descale(name: str, t, num_seqs: int, heads_k: int) -> torch.Tensor:
    """A descale is float32 of shape () / (1,) (per tensor), (h_k,) or (num_seqs, h_k)."""
    _need_tensor(name, t)
    if t.dtype != torch.float32:
        raise ValueError(f"{name}: expected float32, got {t.dtype}")
    ok = t.shape in ((), (1,), (heads_k,), (num_seqs, heads_k))
    if not ok:
        raise ValueError(
            f"{name}: shape {tuple(t.shape)} is not () or (1,) (per tensor), ({heads_k},) (per kv head) or"
            f" ({num_seqs}, {heads_k}) (per sequence and kv head)"
        )
    return t


def descale_strides(t: torch.Tensor, num_seqs: int, heads_k: int) -> tuple[int, int]:
    """(seq, head) element strides of a descale: 0 where it broadcasts."""
    if t.numel() == 1 and t.dim() <= 1:  # per tensor (or per head with h_k == 1: the same thing)
        return 0, 0
    if t.dim() == 1:
        return 0, t.stride(0)
    return t.stride(0), t.stride(1)


def kv_element_strides(name: str, t: torch.Tensor, bits: int) -> tuple[int, int, int]:
    """(page, row, head) strides of a logical (pages, PS, h_k, row) KV view, in KV elements.

    8-bit pools use their own strides; sub-byte pools are uint8 byte views whose byte strides
    are converted to element strides. TMA needs the row contiguous and 16-byte-multiple strides."""
    if t.stride(3) != 1:
        raise ValueError(f"{name}: the row (last dim) must be contiguous, strides {tuple(t.stride())}")
    byte = [s * t.element_size() for s in t.stride()[:3]]
    if any(b % TMA_ALIGN for b in byte):
        raise ValueError(
            f"{name}: TMA needs page/row/head strides that are multiples of {TMA_ALIGN} bytes, got {byte} bytes"
        )
    if bits == 8:
        return tuple(int(s) for s in t.stride()[:3])
    return tuple(b * 8 // bits for b in byte)


@dataclass
class DecodeProblem:
    """Validated problem sizes (ints) of one decode call."""

    num_seqs: int
    q_len: int
    heads_q: int
    heads_k: int
    head_dim: int
    n_q: int  # q_len * h_r packed query rows per kv head
    page_size: int
    num_pages: int
    max_blocks: int
    q_dtype: str
    kv_format: str


def check_decode_inputs(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    k_descale: torch.Tensor,
    v_descale: torch.Tensor,
    *,
    kv_format: str,
    q_len: int,
    q_descale: Optional[torch.Tensor] = None,
    k_scales: Optional[torch.Tensor] = None,
    v_scales: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> DecodeProblem:
    """Check every argument of a decode call before anything launches; returns the problem sizes.

    Shapes and dtypes:
      q            (num_seqs * q_len, h_q, d) bfloat16 or float8_e4m3fn, d contiguous
      k/v_pool     (num_pages, PS, h_k, row): float8_e4m3fn with row = d (e4m3), else uint8 byte
                   views with row = d * bits / 8; row contiguous, 16-byte-multiple strides
      k/v_scales   nvfp4 only: (num_pages, PS, h_k, d / 16) float8_e4m3fn
      block_table  int32 (num_seqs, max_blocks), contiguous;  seq_lens int32 (num_seqs,)
      descales     float32 (), (h_k,) or (num_seqs, h_k); q_descale required for e4m3 Q
      out          optional bfloat16 like q
    Reads seq_lens on the host (a device sync) to check the block table covers them.
    """
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format: {kv_format!r} is not one of {KV_FORMATS}")
    if isinstance(q_len, bool) or not isinstance(q_len, int) or q_len < 1:
        raise ValueError(f"q_len: expected an int >= 1, got {q_len!r}")
    _need_tensor("q", q)
    if q.dtype not in Q_DTYPES:
        raise ValueError(f"q: dtype {q.dtype} is not bfloat16 or float8_e4m3fn")
    q_dtype = Q_DTYPES[q.dtype]
    if q.dim() != 3:
        raise ValueError(f"q: expected (num_seqs * q_len, h_q, d), got shape {tuple(q.shape)}")
    rows, heads_q, d = q.shape
    reason = unsupported_reason(kv_format, q_dtype, d)
    if reason is not None:
        raise ValueError(f"q: {reason}")
    if q.stride(2) != 1:
        raise ValueError(f"q: the head dim must be contiguous, strides {tuple(q.stride())}")

    bits = FORMATS[kv_format].bits
    row = d * bits // 8
    pool_dtype = torch.float8_e4m3fn if bits == 8 else torch.uint8
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        _need_tensor(name, pool)
        if pool.dtype != pool_dtype:
            raise ValueError(f"{name}: kv_format {kv_format!r} pools are {pool_dtype}, got {pool.dtype}")
        if pool.dim() != 4 or pool.shape[3] != row:
            raise ValueError(f"{name}: expected (num_pages, page_size, h_k, {row}) for d={d}, got {tuple(pool.shape)}")
    if v_pool.shape != k_pool.shape:
        raise ValueError(f"v_pool: shape {tuple(v_pool.shape)} differs from k_pool {tuple(k_pool.shape)}")
    num_pages, page_size, heads_k, _ = k_pool.shape
    reason = unsupported_reason(kv_format, q_dtype, d, page_size)
    if reason is not None:
        raise ValueError(f"k_pool: {reason}")
    if heads_k < 1 or heads_q % heads_k:
        raise ValueError(f"q: h_q={heads_q} is not a multiple of the cache's h_k={heads_k}")
    if rows % q_len:
        raise ValueError(f"q: {rows} rows is not a multiple of q_len={q_len}")
    num_seqs = rows // q_len
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        kv_element_strides(name, pool, bits)

    if kv_format == "nvfp4":
        want = (num_pages, page_size, heads_k, d // NVFP4.group)
        for name, sc in (("k_scales", k_scales), ("v_scales", v_scales)):
            if not isinstance(sc, torch.Tensor) or tuple(sc.shape) != want or sc.dtype != torch.float8_e4m3fn:
                raise ValueError(
                    f"{name}: nvfp4 needs float8_e4m3fn block scales of shape {want}, got "
                    f"{None if sc is None else (tuple(sc.shape), sc.dtype)}"
                )
            if sc.stride(3) != 1:
                raise ValueError(f"{name}: the scale row must be contiguous, strides {tuple(sc.stride())}")
    elif k_scales is not None or v_scales is not None:
        raise ValueError(f"k_scales: only kv_format 'nvfp4' takes block scales, got them with {kv_format!r}")

    _need_tensor("block_table", block_table)
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != num_seqs:
        raise ValueError(
            f"block_table: expected int32 ({num_seqs}, max_blocks), got {block_table.dtype} {tuple(block_table.shape)}"
        )
    if not block_table.is_contiguous():
        raise ValueError(f"block_table: must be contiguous (row-major), strides {tuple(block_table.stride())}")
    _need_tensor("seq_lens", seq_lens)
    if seq_lens.dtype != torch.int32 or seq_lens.shape != (num_seqs,) or not seq_lens.is_contiguous():
        raise ValueError(
            f"seq_lens: expected contiguous int32 ({num_seqs},), got {seq_lens.dtype} {tuple(seq_lens.shape)}"
        )

    check_descale("k_descale", k_descale, num_seqs, heads_k)
    check_descale("v_descale", v_descale, num_seqs, heads_k)
    if q_dtype == "e4m3":
        if q_descale is None:
            raise ValueError("q_descale: float8_e4m3fn Q needs its descale (quantize_q returns it)")
        check_descale("q_descale", q_descale, num_seqs, heads_k)
    elif q_descale is not None:
        check_descale("q_descale", q_descale, num_seqs, heads_k)

    n_q = q_len * (heads_q // heads_k)
    # The kernel reads q as (b, h_k, n_q, d): rows of one sequence packed, the sequence stride free.
    if q_len == 1 and (q.stride(1) != d):
        raise ValueError(
            f"q: heads of one token must be packed (stride {d} between heads), strides {tuple(q.stride())}"
        )
    if (q.stride(0) * q.element_size()) % TMA_ALIGN and num_seqs > 1:
        raise ValueError(
            f"q: the token stride must be a multiple of {TMA_ALIGN} bytes, got {q.stride(0) * q.element_size()}"
        )
    if out is not None:
        _need_tensor("out", out)
        if out.dtype != torch.bfloat16 or tuple(out.shape) != tuple(q.shape):
            raise ValueError(f"out: expected bfloat16 {tuple(q.shape)}, got {out.dtype} {tuple(out.shape)}")
        if out.stride(2) != 1 or out.stride(1) != d:
            raise ValueError(f"out: heads must be packed with d contiguous, strides {tuple(out.stride())}")
        if (out.stride(0) * 2) % TMA_ALIGN:
            raise ValueError(f"out: the token stride must be a multiple of {TMA_ALIGN} bytes")

    devices = {t.device for t in (q, k_pool, v_pool, block_table, seq_lens, k_descale, v_descale) if t is not None}
    if len(devices) != 1:
        raise ValueError(f"q: all tensors must be on one device, got {sorted(str(x) for x in devices)}")
    for name, t in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool), ("out", out)):
        if t is not None and t.data_ptr() % TMA_ALIGN:
            raise ValueError(f"{name}: data pointer must be {TMA_ALIGN}-byte aligned (TMA), got {t.data_ptr():#x}")

    if num_seqs:
        lens = seq_lens.to("cpu")
        if int(lens.min()) < 0:
            raise ValueError(f"seq_lens: must be >= 0, got min {int(lens.min())}")
        short = (lens > 0) & (lens < q_len)
        if bool(short.any()):
            i = int(short.nonzero()[0])
            raise ValueError(f"q_len: {q_len} exceeds seq_len {int(lens[i])} of sequence {i}")
        need = (int(lens.max()) + page_size - 1) // page_size
        if need > block_table.shape[1]:
            raise ValueError(
                f"block_table: {block_table.shape[1]} blocks per row, but seq_lens max {int(lens.max())} needs"
                f" {need} pages of {page_size}"
            )
        if need * page_size > INT32_MAX or num_pages * heads_k > INT32_MAX:
            raise ValueError("seq_lens: sizes exceed int32 indexing")
    return DecodeProblem(
        num_seqs, q_len, heads_q, heads_k, d, n_q, page_size, num_pages, block_table.shape[1], q_dtype, kv_format
    )


def kernel_strides(
    q4: torch.Tensor,
    o4: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    q_descale: torch.Tensor,
    k_descale: torch.Tensor,
    v_descale: torch.Tensor,
    bits: int,
    k_scales: Optional[torch.Tensor] = None,
    v_scales: Optional[torch.Tensor] = None,
) -> tuple[int, ...]:
    """The kernel's ``strides`` argument (see STRIDE_FIELDS), element strides as ints.

    q4, o4: (b, h_k, n_q, d) views with rows packed (n_q, h_k) and d contiguous; the sequence stride
    is free (Q/O may live inside wider rows)."""
    b, h_k, n_q, d = q4.shape
    for name, t in (("q", q4), ("out", o4)):
        if t.stride(3) != 1 or t.stride(2) != d or t.stride(1) != n_q * d:
            raise ValueError(
                f"{name}: kernel view rows must be packed (n_q, h_k) with d contiguous, got {tuple(t.stride())}"
            )
    ks = vs = (0, 0, 0)
    if k_scales is not None:
        ks = tuple(int(s) for s in k_scales.stride()[:3])
        vs = tuple(int(s) for s in v_scales.stride()[:3])
    vals = (
        q4.stride(0) if b > 1 else 0,
        o4.stride(0) if b > 1 else 0,
        *kv_element_strides("k_pool", k_pool, bits),
        *kv_element_strides("v_pool", v_pool, bits),
        *descale_strides(q_descale, b, h_k),
        *descale_strides(k_descale, b, h_k),
        *descale_strides(v_descale, b, h_k),
        *ks,
        *vs,
    )
    if not all(0 <= x <= INT32_MAX for x in vals):
        raise ValueError(f"strides: out of int32 range: {dict(zip(STRIDE_FIELDS, vals))}")
    return tuple(int(x) for x in vals)


POINTER_ORDER = (
    ("q", "q"), ("k", "kv"), ("v", "kv"), ("k_scales", "scales"), ("v_scales", "scales"),
    ("block_table", "i32"), ("seq_lens", "i32"), ("work", "i32"), ("n_splits", "i32"),
    ("q_descale", "f32"), ("k_descale", "f32"), ("v_descale", "f32"), ("o", "bf16"), ("lse", "f32"),
    ("o_part", "f32"), ("m_part", "f32"), ("l_part", "f32"),
)  # fmt: skip
"""The kernels' pointer arguments in the compile order: (tensor name, element type key)."""


def kernel_arguments(config, sizes: tuple, strides: tuple, pointer, scale_qs: float, scale_o: float, stream) -> tuple:
    """Positional arguments of both decode kernels' ``__call__`` (the compile order), shared by the launch
    (:func:`launch_args`) and the compile (``compile.compile_only_args``).

    ``sizes``: (problem shape (b, h_k, n_q, d), max_blocks, num_pages, num_work); ``pointer(name, dtype)``:
    the cute pointer of tensor ``name`` with element type ``dtype``."""
    import cutlass

    types = dict(element_types(config), i32=cutlass.Int32, f32=cutlass.Float32, bf16=cutlass.BFloat16)
    shape, max_blocks, num_pages, num_work = sizes
    pointers = tuple(pointer(name, types[kind]) for name, kind in POINTER_ORDER)
    return (shape, max_blocks, num_pages, num_work, strides, *pointers, float(scale_qs), float(scale_o), stream)


def launch_args(
    config,
    problem: DecodeProblem,
    strides: tuple,
    num_work: int,
    tensors: dict,
    scale_qs: float,
    scale_o: float,
    stream,
) -> tuple:
    """Positional arguments of the compiled kernel (pointers from the tensors' data_ptr)."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    def pointer(name, dtype):
        return make_ptr(dtype, tensors[name].data_ptr(), cute.AddressSpace.gmem, assumed_align=16)

    shape = (problem.num_seqs, problem.heads_k, problem.n_q, problem.head_dim)
    sizes = (shape, problem.max_blocks, problem.num_pages, num_work)
    return kernel_arguments(config, sizes, strides, pointer, scale_qs, scale_o, stream)
