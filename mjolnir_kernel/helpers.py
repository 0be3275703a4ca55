"""Host side of the helper kernels (:mod:`mjolnir_kernel.helpers_kernel`): quantize, pack and the NVFP4
encoder launched directly on CUDA tensors.

``mjolnir_numerics`` calls these where :func:`available` says (a CUDA device and the CuTe DSL; the
``MJOLNIR_KERNELS=0`` environment variable turns them off); they return the bits of the spec's formulas
in ``mjolnir_numerics.fused`` (tests/kernel/test_helpers_gpu.py compares them on every float32 bit
pattern and every code). Each kernel is compiled once per process, device architecture and variant (well
under a second); a launch allocates its outputs, never waits for the device and can be captured in a CUDA
graph.

The functions take what the helpers have already checked (dtypes, shapes, finiteness) and raise
ValueError on what the kernels cannot take (a size over 2^40, an input not 16-byte aligned after
``contiguous()``).
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Optional

import torch

from mjolnir_numerics.formats import E2M1

__all__ = [
    "available",
    "quantize_f32",
    "pack_codes",
    "nvfp4_encode",
    "nvfp4_encode_global",
    "write_unsupported",
    "CacheWriter",
]

MAX_ELEMENTS = 1 << 40
_lock = threading.Lock()
_compiled: dict = {}


@functools.cache
def _dsl_reason() -> Optional[str]:
    from .compile import cutlass_available

    return cutlass_available()


def available(device) -> bool:
    """Whether the helper kernels run on ``device``: CUDA with compute capability 9.0 or later and the CuTe
    DSL importable, unless ``MJOLNIR_KERNELS=0``."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if device.type != "cuda" or os.environ.get("MJOLNIR_KERNELS", "1") == "0":
        return False
    return _runs_on(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _runs_on(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9 and _dsl_reason() is None


def _types():
    import cutlass

    return {"f32": cutlass.Float32, "u8": cutlass.Uint8}


def _pointer(kind: str, address: int, align: int):
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    return make_ptr(_types()[kind], address, cute.AddressSpace.gmem, assumed_align=align)


@functools.cache
def _tvm_ffi() -> bool:
    """Whether kernels are compiled for TVM-FFI calls (``apache-tvm-ffi`` importable; ``MJOLNIR_TVM_FFI=0``
    turns it off): a call then passes raw addresses through one C function, where the DSL's own calling
    path converts every argument in Python (the H200 profile: tens of microseconds per call). Where it is
    not importable (and not turned off), warns once per process: the same bits, slower launches."""
    if os.environ.get("MJOLNIR_TVM_FFI", "1") == "0":
        return False
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        warnings.warn(
            "mjolnir_kernel.helpers: apache-tvm-ffi is not importable, so the helper kernels launch through the "
            "CuTe DSL's Python calling path: the same bits, 10-75 us more host time per call (an H100, "
            "2026-12-06). Install the kernel extra (pip install 'mjolnir[kernel]'), or set MJOLNIR_TVM_FFI=0 "
            "to take that path without this warning.",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


try:  # the current stream's handle without building a Stream object (what Triton's launcher calls)
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # pragma: no cover - a torch without it
    _raw_stream = None


def _current_stream(device: torch.device) -> int:
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


class _Launcher:
    """A compiled helper kernel and how to call it: ``launcher(tensors, scalars, device)`` passes each tensor's
    address (a typed pointer of the compile-time kind and alignment) and the current stream.

    ``build()`` returns (the kernel object, the pointers' (kind, alignment), placeholder scalars)."""

    def __init__(self, build, device):
        import cuda.bindings.driver as cuda
        import cutlass.cute as cute

        kernel, self.pointers, scalars = build()
        self.ffi = _tvm_ffi()
        args = [_pointer(kind, 1 << 20, align) for kind, align in self.pointers]
        options = "--enable-tvm-ffi" if self.ffi else None
        with torch.cuda.device(device):
            self.fn = cute.compile(kernel, *args, *scalars, cuda.CUstream(0), options=options)
        # The TVM-FFI function itself: it takes raw addresses and the stream handle as ints, without the
        # DSL wrapper's per-argument conversion in Python.
        self.raw = self.fn.__tvm_ffi_object__() if self.ffi and hasattr(self.fn, "__tvm_ffi_object__") else None

    def __call__(self, tensors: tuple, scalars: tuple, device: torch.device) -> None:
        stream = _current_stream(device)
        if self.raw is not None:
            self.raw(*[t.data_ptr() for t in tensors], *scalars, stream)
        elif self.ffi:
            self.fn(*[t.data_ptr() for t in tensors], *scalars, stream)
        else:
            import cuda.bindings.driver as cuda

            ptrs = (_pointer(kind, t.data_ptr(), align) for (kind, align), t in zip(self.pointers, tensors))
            self.fn(*ptrs, *scalars, cuda.CUstream(stream))


def _kernel(key: tuple, device: torch.device, build) -> _Launcher:
    """The launcher of ``key`` on ``device`` (compiled on first use from ``build()``: see :class:`_Launcher`)."""
    full = (key, device.index)
    hit = _compiled.get(full)
    if hit is not None:
        return hit
    with _lock:
        if full not in _compiled:
            _compiled[full] = _Launcher(build, device)
        return _compiled[full]


def _int64(n: int) -> tuple:
    import cutlass

    return tuple(cutlass.Int64(1) for _ in range(n))


def _build_quantize(fmt):
    from .helpers_kernel import QuantizeKernel

    return QuantizeKernel(fmt), (("f32", 16), ("u8", 1), ("u8", 4)), _int64(1)


def _build_pack(bits: int):
    from .helpers_kernel import PackKernel

    return PackKernel(bits), (("u8", 16), ("u8", 16)), _int64(1)


_PACK_BUILDS = {4: functools.partial(_build_pack, 4), 6: functools.partial(_build_pack, 6)}


def _aligned(name: str, t: torch.Tensor, align: int) -> torch.Tensor:
    if t.is_contiguous() and t.data_ptr() % align == 0:
        return t
    t = t.contiguous()
    if t.data_ptr() % align:
        t = t.clone()  # a fresh allocation is aligned
    if t.data_ptr() % align:
        raise ValueError(f"{name}: the kernel needs a {align}-byte aligned tensor")
    return t


def _check_size(name: str, n: int) -> None:
    if n > MAX_ELEMENTS:
        raise ValueError(f"{name}: {n} elements; the helper kernels take at most 2^40")


E2M1_TABLE_LINE_OFFSET = 64  # bytes into a 128-byte line where e2m1_table starts
_e2m1_tables: dict = {}


def e2m1_table(lut: torch.Tensor) -> torch.Tensor:
    """The table the e2m1 lookups of the NVFP4 encoder and the cache writer read, from ``lut``, e2m1's
    round-to-odd table (uint8 ``(65536,)``): every ``2^(s - 16)``-th entry for the index shift ``s =
    helpers_kernel.E2M1_INDEX_SHIFT`` (4096 entries at ``s = 20``: entry ``i`` is ``lut[16 i]``, the code of the
    float32 whose bits are ``i << 20``), starting :data:`E2M1_TABLE_LINE_OFFSET` bytes into a 128-byte line, so
    that the entries of exponents 120-135 of each sign share one line (``helpers_kernel``'s note at
    ``E2M1_INDEX_SHIFT``). Built once per table and index shift (a uint8 view into a slightly larger buffer)."""
    from .helpers_kernel import E2M1_INDEX_SHIFT

    key = (lut.device, lut.data_ptr(), E2M1_INDEX_SHIFT)
    hit = _e2m1_tables.get(key)
    if hit is not None:
        return hit[1]
    stride = 1 << (E2M1_INDEX_SHIFT - 16)
    n = lut.numel() // stride
    buf = torch.empty(n + 128, dtype=torch.uint8, device=lut.device)
    start = (E2M1_TABLE_LINE_OFFSET - buf.data_ptr()) % 128
    table = buf[start : start + n]
    table.copy_(lut[::stride])
    _e2m1_tables[key] = (lut, table)  # holding lut: its address is not reused while the entry stands
    return table


def quantize_f32(x: torch.Tensor, lut: torch.Tensor, fmt) -> torch.Tensor:
    """``fused.quantize_f32`` on CUDA: the ``fmt`` (an element :class:`~mjolnir_numerics.formats.Format`) codes
    of float32 ``x`` (any shape) through ``lut``, the format's round-to-odd table (uint8 ``(65536,)`` on ``x``'s
    device); e4m3's finite values by the hardware's conversion (the same codes). Returns uint8 of ``x``'s
    shape."""
    x = _aligned("x", x, 16)
    n = x.numel()
    _check_size("x", n)
    out = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    if n:
        _kernel(("quantize", fmt.name), x.device, functools.partial(_build_quantize, fmt))(
            (x, lut, out), (n,), x.device
        )
    return out


def pack_codes(codes: torch.Tensor, *, bits: int) -> torch.Tensor:
    """``fused.pack_codes`` on CUDA for 4 and 6 bits: valid uint8 codes ``(..., d)`` (``d`` even for 4 bits,
    a multiple of 4 for 6) -> uint8 ``(..., d * bits / 8)``."""
    if codes.dtype != torch.uint8:
        codes = codes.to(torch.uint8)
    codes = _aligned("codes", codes, 16)
    n = codes.numel()
    _check_size("codes", n)
    shape = codes.shape
    # new_empty: 0.7 us less host time per call than torch.empty(shape, dtype=, device=) on the H100's host
    # (benchmarks/probes/helpers_alloc_ab.py), where the whole call costs ~9 us
    out = codes.new_empty((*shape[:-1], shape[-1] * bits // 8))
    if n:
        _kernel(("pack", bits), codes.device, _PACK_BUILDS[bits])((codes, out), (n,), codes.device)
    return out


def _build_nvfp4(packed: bool, divisor: float, g_scale: float, has_floor: bool, global_divisor: Optional[float]):
    import cutlass

    from .helpers_kernel import NVFP4EncodeKernel

    pointers = (("f32", 16), ("f32", 4), ("u8", 1), ("u8", 8 if packed else 16), ("u8", 1), ("f32", 4))
    kernel = NVFP4EncodeKernel(packed, divisor, g_scale, has_floor, global_divisor)
    return kernel, pointers, (*_int64(3), cutlass.Float32(1.0))


def nvfp4_encode(
    x: torch.Tensor,
    g: torch.Tensor,
    floor: Optional[float],
    e2m1_lut: torch.Tensor,
    *,
    divisor: float,
    packed: bool = False,
    g_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The NVFP4 encoder (``fused.nvfp4_block_scales`` then ``fused.nvfp4_codes``; ``packed``: codes two per
    byte, under ``g * g_scale``) on CUDA, block 16, in one launch.

    Args:
        x: float32 ``(rows, d)``, ``d`` a multiple of 16, finite.
        g: float32 global scales, ``(rows, 1)`` or one value (``()``, ``(1,)`` or ``(1, 1)``).
        floor: the block-scale floor, or None.
        e2m1_lut: e2m1's round-to-odd table (the block scales are rounded by the hardware's e4m3 conversion).

    Returns:
        codes uint8 ``(rows, d)`` (``packed``: ``(rows, d // 2)``) and scale codes uint8 ``(rows, d // 16)``.
    """
    from .helpers_kernel import NVFP4_GROUP

    rows, d = x.shape
    x = _aligned("x", x if x.dtype == torch.float32 else x.float(), 16)
    _check_size("x", x.numel())
    if g.dtype != torch.float32:
        g = g.float()
    if g.numel() == 1:
        g_stride = 0  # the kernel reads g[0]
    elif g.shape == (rows, 1):
        g = g.reshape(rows)
        g_stride = g.stride(0)
    else:
        raise ValueError(f"g: expected one value or shape ({rows}, 1), got {tuple(g.shape)}")
    codes = torch.empty(rows, d // 2 if packed else d, dtype=torch.uint8, device=x.device)
    scales = torch.empty(rows, d // NVFP4_GROUP, dtype=torch.uint8, device=x.device)
    n_blocks = x.numel() // NVFP4_GROUP
    if n_blocks:
        has_floor = floor is not None
        build = functools.partial(_build_nvfp4, packed, divisor, g_scale, has_floor, None)
        kernel = _kernel(("nvfp4", packed, divisor, g_scale, has_floor, None), x.device, build)
        tensors = (x, g, e2m1_table(e2m1_lut), codes, scales, g)  # g_out: unused without a global divisor
        kernel(tensors, (n_blocks, d // NVFP4_GROUP, g_stride, float(floor) if has_floor else 0.0), x.device)
    return codes, scales


def nvfp4_encode_global(
    x: torch.Tensor, amax: torch.Tensor, floor: Optional[float], e2m1_lut: torch.Tensor, *, global_divisor: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``nvfp4_quantize(x, check=False)``'s encoder with one global scale from the amax, in one launch: the
    kernel computes ``g = nvfp4._global_scale(amax, global_divisor)`` (``div.rn.f32``, 1 where the quotient is
    not > 0) from ``amax`` on the device and writes it out (no wait for the device).

    Args:
        x: float32 ``(..., d)``, ``d`` a multiple of 16 (finite: the caller's guarantee); amax: float32 ``()``,
            ``max |x|``; floor: the block-scale floor, or None; e2m1_lut: e2m1's round-to-odd table.

    Returns:
        codes uint8 of ``x``'s shape, scale codes uint8 ``(..., d // 16)``, the global scale float32 ``()``.

    Raises:
        ValueError: ``x`` holds more than 2^40 values, or cannot be made 16-byte aligned.
    """
    x = _aligned("x", x if x.dtype == torch.float32 else x.float(), 16)
    n = x.numel()
    _check_size("x", n)
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    scales = torch.empty((*x.shape[:-1], x.shape[-1] // 16), dtype=torch.uint8, device=x.device)
    if n == 0:  # nothing to encode: g = 1, as for amax 0
        return codes, scales, torch.ones((), dtype=torch.float32, device=x.device)
    g = torch.empty((), dtype=torch.float32, device=x.device)
    options = (False, E2M1.max_normal, 1.0, floor is not None, global_divisor)  # unpacked; block scale amax / 6
    kernel = _kernel(("nvfp4", *options), x.device, functools.partial(_build_nvfp4, *options))
    tensors = (x, amax, e2m1_table(e2m1_lut), codes, scales, g)
    kernel(tensors, (n // 16, 1, 0, 0.0 if floor is None else float(floor)), x.device)
    return codes, scales, g


_STORE_ALIGN = {8: 16, 6: 4, 4: 8}  # bytes: the widest store of a 16-value chunk's codes


INDEX_LIMIT = 1 << 31  # the writer's slots and in-page byte offsets are 32-bit


def _index_strides(t: torch.Tensor, n: int = 3) -> tuple:
    """The byte strides of ``t``'s first ``n`` dims as the writer's 32-bit index arithmetic takes them: 0 for a dim
    of size 1 (its index is always 0, so its stride, whatever it is, is never used)."""
    return tuple(0 if size == 1 else stride * t.element_size() for size, stride in zip(t.shape[:n], t.stride()[:n]))


def _in_page_bytes(t: torch.Tensor) -> int:
    """One past the largest byte offset within a page of a ``(pages, PS, h_k, row)`` view, and at least its page
    stride (:func:`_index_strides`; torch's strides are never negative)."""
    _, ps, h, row = t.shape
    page, row_stride, head = _index_strides(t)
    return max(page, (ps - 1) * row_stride + (h - 1) * head + row * t.element_size())


def write_unsupported(pool: torch.Tensor, scales: Optional[torch.Tensor], head_dim: int, bits: int) -> Optional[str]:
    """Why a :class:`CacheWriter` cannot store rows into ``pool`` (a ``(pages, PS, h_k, row)`` view), or None:
    ``head_dim`` must be a multiple of 16, every row start aligned for the chunk stores, and the slots, the
    strides and a page's byte offsets below 2^31 (the writer's index arithmetic is 32-bit)."""
    if head_dim % 16:
        return f"head_dim {head_dim} is not a multiple of 16"
    align = _STORE_ALIGN[bits]
    if pool.stride(-1) != 1 or pool.data_ptr() % align or any(s % align for s in _index_strides(pool)):
        return f"pool rows are not {align}-byte aligned"
    if scales is not None and scales.stride(-1) != 1:
        return "the scale rows are not contiguous"
    if head_dim * bits // 8 > pool.shape[-1] * pool.element_size():
        return f"pool rows of {pool.shape[-1] * pool.element_size()} bytes are shorter than {head_dim} codes"
    views = (pool,) if scales is None else (pool, scales)
    if pool.shape[0] * pool.shape[1] >= INDEX_LIMIT or any(_in_page_bytes(v) >= INDEX_LIMIT for v in views):
        return "the pools hold 2^31 slots or more, or a page spans 2^31 bytes or more"
    return None


MAX_WRITE_CHUNKS = 1 << 30  # 16-value chunks of K (or V) per write: the writer's index arithmetic


class CacheWriter:
    """The cache writer's encode-and-store of K and V in one launch (no host synchronisation), bound to one
    cache's pools: everything that does not change from write to write (strides, descales, tables, the
    kernel's constants) is worked out once, so that a call costs little more than the launch.

    Args:
        descales: K's and V's float32 descales, each ``()``, ``(h_k,)`` or ``(num_seqs, h_k)`` (NVFP4: the
            kernel descale ``8 g``), on the pools' device. They are read at each launch (an in-place change
            is seen), except where K's and V's differ in shape, when both are expanded to one layout here.
        pools: K's and V's ``(pages, PS, h_k, row)`` byte views with the same strides
            (:func:`write_unsupported` is None for each); scales: NVFP4's ``(pages, PS, h_k, d / 16)`` scale
            views, else ``(None, None)``.
        element: the element format's name (NVFP4: ``"e2m1"``); page_size: a power of two; head_dim: ``d``.
        lut: the element format's round-to-odd table; nvfp4: NVFP4 (block scales rounded by the hardware's e4m3
            conversion), floor: its block-scale floor or None, g_scale: its global scale per unit of descale (a
            power of two).

    ``writer(k, v, slots, seq_ids)`` stores rows ``k, v (n, h_k, d)`` (real units; float32 and bfloat16 are
    read directly, float16 or K and V of different dtypes are widened to float32 first; fewer than 2^34
    values each) at integer ``slots (n,)``; ``seq_ids (n,)`` is needed for per-(sequence, head) descales.

    Raises:
        ValueError: at construction, a page size that is not a power of two, K and V pools of different
            strides, a head dim that is not a multiple of 16, pools :func:`write_unsupported` refuses; at a call,
            rows that are not ``(n, h_k, d)`` or differ between K and V, slots or sequence ids that are not
            ``(n,)``, sequence ids missing where the descales are per sequence, more values than the writer
            takes. All before any launch.
    """

    def __init__(
        self,
        descales: tuple,
        pools: tuple,
        scales: tuple,
        *,
        element: str,
        page_size: int,
        head_dim: int,
        lut: torch.Tensor,
        nvfp4: bool = False,
        floor: Optional[float] = None,
        g_scale: float = 1.0,
    ):
        from mjolnir_numerics.formats import FORMATS

        from .helpers_kernel import GROUP, fast_divmod_constants

        if page_size & (page_size - 1):
            raise ValueError(f"page_size: the writer takes a power of two, got {page_size}")
        if page_size != pools[0].shape[1]:
            raise ValueError(f"page_size: {page_size}, but the pools' pages hold {pools[0].shape[1]} slots")
        if pools[0].stride() != pools[1].stride():
            raise ValueError("pools: K's and V's pools must have the same strides")
        if head_dim % GROUP:
            raise ValueError(f"head_dim: the writer takes a multiple of {GROUP}, got {head_dim}")
        self.element, self.bits = element, FORMATS[element].bits
        unsupported = write_unsupported(pools[0], scales[0], head_dim, self.bits)
        if unsupported:
            raise ValueError(f"pools: the writer cannot store into them: {unsupported}")
        heads = pools[0].shape[2]
        self.row_shape = (heads, head_dim)
        k_ds, v_ds = _shared_layout(*(ds.float() for ds in descales), heads)
        self.per_seq = k_ds.dim() == 2
        ds_strides = [s // k_ds.element_size() for s in _index_strides(k_ds, 2)]  # in elements
        if self.per_seq:
            (ds_seq, ds_head), num_seqs = ds_strides, k_ds.shape[0]
        else:
            ds_seq, ds_head, num_seqs = 0, (ds_strides[0] if k_ds.numel() > 1 else 0), 1
        if sum((n - 1) * s for n, s in zip(k_ds.shape, ds_strides)) >= INDEX_LIMIT:
            raise ValueError("descales: the writer's 32-bit index takes fewer than 2^31 elements' span")
        self.nvfp4 = bool(nvfp4)
        k_sc, v_sc = scales if scales[0] is not None else pools
        self.has_floor, self.g_scale = floor is not None, float(g_scale)
        lut = e2m1_table(lut) if element == "e2m1" else lut
        self.tensors = (k_ds, v_ds, lut, *pools, k_sc, v_sc)
        cpr = head_dim // GROUP
        self.scalars = (
            *fast_divmod_constants(cpr), cpr, *fast_divmod_constants(heads), heads, page_size.bit_length() - 1,
            page_size * pools[0].shape[0], num_seqs, *_index_strides(pools[0]), *_index_strides(k_sc), ds_seq, ds_head,
            float(floor) if self.has_floor else 0.0,
        )  # fmt: skip
        self.device = pools[0].device
        self._kernels: dict = {}

    def _kernel(self, bf16: bool) -> _Launcher:
        hit = self._kernels.get(bf16)
        if hit is None:
            from .helpers_kernel import CacheWriteKernel, writer_scalars

            key = ("write", self.element, self.nvfp4, bf16, self.per_seq, self.has_floor, self.g_scale)

            def build():
                pool = ("u8", _STORE_ALIGN[self.bits])
                pointers = (("f32", 16), ("f32", 16), ("u8", 8), ("u8", 8), ("f32", 4), ("f32", 4), ("u8", 1), pool,
                            pool, ("u8", 1), ("u8", 1))  # fmt: skip
                kernel = CacheWriteKernel(self.element, self.nvfp4, bf16, self.per_seq, self.has_floor, self.g_scale)
                return kernel, pointers, writer_scalars()

            hit = self._kernels[bf16] = _kernel(key, self.device, build)
        return hit

    def __call__(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, seq_ids: Optional[torch.Tensor]) -> None:
        n = k.shape[0]
        if tuple(k.shape[1:]) != self.row_shape or v.shape != k.shape:
            want = f"(n_tokens, {self.row_shape[0]}, {self.row_shape[1]})"
            raise ValueError(f"k, v: expected {want} each, got {tuple(k.shape)} and {tuple(v.shape)}")
        if slots.shape != (n,) or (seq_ids is not None and seq_ids.shape != (n,)):
            raise ValueError(f"slots, seq_ids: expected ({n},) each to match k, got {tuple(slots.shape)}")
        if k.dtype != v.dtype or k.dtype not in (torch.float32, torch.bfloat16):
            k, v = k.float(), v.float()
        k, v = _aligned("k", k, 16), _aligned("v", v, 16)
        n_chunks = k.numel() // 16
        if n_chunks == 0:
            return
        if n_chunks >= MAX_WRITE_CHUNKS:
            raise ValueError(f"k: {k.numel()} values; the writer takes fewer than {MAX_WRITE_CHUNKS * 16} per call")
        if slots.dtype != torch.int64 or not slots.is_contiguous():
            slots = slots.to(torch.int64).contiguous()
        if self.per_seq:
            if seq_ids is None:
                raise ValueError("seq_ids: per-(sequence, kv head) descales need the sequence of every token")
            if seq_ids.dtype != torch.int64 or not seq_ids.is_contiguous():
                seq_ids = seq_ids.to(torch.int64).contiguous()
        else:
            seq_ids = slots
        launcher = self._kernel(k.dtype == torch.bfloat16)
        launcher((k, v, slots, seq_ids, *self.tensors), (n_chunks, *self.scalars), k.device)


def _shared_layout(k_ds: torch.Tensor, v_ds: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K's and V's descales with one shape and one set of strides (the writer's launch shares them): as they
    are where they already agree (any cache's do), else both expanded to the finer granularity."""
    if k_ds.shape == v_ds.shape and k_ds.stride() == v_ds.stride():
        return k_ds, v_ds
    rows = max(ds.shape[0] if ds.dim() == 2 else 1 for ds in (k_ds, v_ds))
    shape = (rows, heads) if max(k_ds.dim(), v_ds.dim()) == 2 else (heads,)
    return torch.broadcast_to(k_ds, shape).contiguous(), torch.broadcast_to(v_ds, shape).contiguous()
