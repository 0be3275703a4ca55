"""A bare read of global memory on the GPU (device code): how fast any kernel can read ``n`` bytes.

The issue's yardstick is ``torch.sum`` over a few GB of int64 (4.5-4.6 TB/s on the H200). A decode call
reads far fewer bytes (67 MB at batch 1 with 32K keys), and a read of that size is slower for any kernel:
the grid has to ramp up and drain. ``torch.sum`` over the same bytes measures that for one kernel
(``--size-matched-stream`` in ``benchmarks.bench_hopper_decode``); ``ReadProbe`` is the other side, a
kernel that does nothing but read, tuned by a sweep (``benchmarks.probes.read_roofline``), so that a row
can be compared with the fastest bare read of its bytes found on that GPU.

Each thread XORs 16-byte ``ld.global.nc.L1::no_allocate`` loads, ``unroll`` independent ones per step
(the loads are inline assembly with side effects, so none is optimised away), and writes its XOR to a sink
word only when asked (``store``: tests check that every byte is read once; timed launches write nothing).
Two ways to share the bytes out:

* ``pattern="chunks"``: CTA i reads its own contiguous range (as a decode CTA reads its pages);
* ``pattern="stride"``: the grid walks the buffer in grid-sized steps (the usual grid-stride loop).

Its two PTX wrappers (the 16-byte stream load and the sink store) live here, not in
``mjolnir_kernel.hopper.ptx``: the decode kernel uses neither.
"""

import cutlass
import cutlass.cute as cute

from mjolnir_kernel.hopper.ptx import T, Int32, Int64, _asm, _i32, _struct, _unpack, dsl_user_op

READ_PATTERNS = ("chunks", "stride")
VECTOR_BYTES = 16


@dsl_user_op
def ld_global_v4_b32(gmem_addr, *, loc=None, ip=None):
    """A 16-byte read-only global load (16-byte aligned) that does not allocate in L1: a stream read."""
    res = _asm(_struct(4, T.i32()), [Int64(gmem_addr).ir_value(loc=loc, ip=ip)],
               "ld.global.nc.L1::no_allocate.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
               side_effects=True)  # fmt: skip
    return _unpack(res, 4, T.i32(), Int32)


@dsl_user_op
def st_global_b32(gmem_addr, value, *, loc=None, ip=None):
    _asm(None, [Int64(gmem_addr).ir_value(loc=loc, ip=ip), _i32(value, loc, ip)], "st.global.b32 [$0], $1;", "l,r",
         side_effects=True)  # fmt: skip


class ReadProbe:
    """Compile key: ``threads`` per CTA (a multiple of 32, at most 1024), ``unroll`` (loads in flight per
    thread and step, 1-16) and the ``pattern`` (``READ_PATTERNS``). Arguments of the compiled kernel:
    source pointer (16-byte aligned), vectors to read (Int32), vectors per CTA (Int32; "chunks" only),
    sink pointer (Int32, one word per thread of the grid), store (Int32: nonzero writes the sink), grid
    size (Int32), stream."""

    def __init__(self, threads: int, unroll: int, pattern: str):
        if pattern not in READ_PATTERNS:
            raise ValueError(f"pattern: expected one of {READ_PATTERNS}, got {pattern!r}")
        if isinstance(threads, bool) or not isinstance(threads, int) or not 32 <= threads <= 1024 or threads % 32:
            raise ValueError(f"threads: expected a multiple of 32 in [32, 1024], got {threads!r}")
        if isinstance(unroll, bool) or not isinstance(unroll, int) or not 1 <= unroll <= 16:
            raise ValueError(f"unroll: expected an int in [1, 16], got {unroll!r}")
        self.threads, self.unroll, self.pattern = threads, unroll, pattern

    @cute.jit
    def __call__(self, src_ptr: cute.Pointer, n_vec: cutlass.Int32, per_cta: cutlass.Int32, sink_ptr: cute.Pointer,
                 store: cutlass.Int32, grid: cutlass.Int32, stream):  # fmt: skip
        base = cute.make_layout((1,))
        src, sink = cute.make_tensor(src_ptr, base), cute.make_tensor(sink_ptr, base)
        launch = self.kernel(src, n_vec, per_cta, sink, store)
        launch.launch(grid=(grid, 1, 1), block=[self.threads, 1, 1], stream=stream)

    @cute.kernel
    def kernel(
        self, src: cute.Tensor, n_vec: cutlass.Int32, per_cta: cutlass.Int32, sink: cute.Tensor, store: cutlass.Int32
    ):
        i32, i64 = cutlass.Int32, cutlass.Int64
        cta, _, _ = cute.arch.block_idx()
        n_cta, _, _ = cute.arch.grid_dim()
        tid, _, _ = cute.arch.thread_idx()
        t, u = self.threads, self.unroll
        base = src.iterator.toint()
        acc = i32(0)
        if cutlass.const_expr(self.pattern == "chunks"):
            start = cta * per_cta
            end = cutlass.min(start + per_cta, n_vec)
            step = i32(t * u)
        else:
            start = cta * (t * u)
            end = n_vec
            step = n_cta * (t * u)
        # Full steps: unroll loads of 16 bytes, each warp's 32 lanes on 512 contiguous bytes.
        full = i32(0)
        if end - start >= t * u:
            full = (end - start - t * u) // step + 1
        v = start + tid
        for _ in cutlass.range(full, unroll=1):
            words = [ld_global_v4_b32(base + i64(v + k * t) * VECTOR_BYTES) for k in range(u)]
            for w in words:
                acc = acc ^ w[0] ^ w[1] ^ w[2] ^ w[3]
            v = v + step
        # The rest, one guarded load at a time ("stride": only the last step can be partial).
        rest = start + full * step + tid
        for k in cutlass.range_constexpr(u):
            idx = rest + k * t
            if idx < end:
                w = ld_global_v4_b32(base + i64(idx) * VECTOR_BYTES)
                acc = acc ^ w[0] ^ w[1] ^ w[2] ^ w[3]
        if store != 0:
            st_global_b32(sink.iterator.toint() + i64(cta * t + tid) * 4, acc)


def compile_read_probe(threads: int, unroll: int, pattern: str, arch: str = "sm_90a", cubin_dir=None):
    """The compiled ``ReadProbe`` (dummy pointers at compile time; launch it through ``read_launcher``);
    ``cubin_dir``: keep the cubin there (``mjolnir_kernel.sass.disassemble_compiled``)."""
    import cuda.bindings.driver as cuda
    from cutlass.cute.runtime import make_ptr

    from mjolnir_kernel.compile import COMPILE_OPTIONS

    def ptr(dtype):
        return make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=16)

    i32 = cutlass.Int32
    args = (ptr(cutlass.Uint8), i32(1), i32(1), ptr(i32), i32(0), i32(1), cuda.CUstream(0))
    options = f"{COMPILE_OPTIONS} --gpu-arch {arch}"
    if cubin_dir is not None:
        options += f" --keep-cubin --dump-dir {cubin_dir}"
    return cute.compile(ReadProbe(threads, unroll, pattern), *args, options=options)


def read_launcher(compiled, src, ctas: int, threads: int, unroll: int, pattern: str, sink=None, store: bool = False):
    """A no-argument callable that launches ``compiled`` (from ``compile_read_probe(threads, unroll,
    pattern)``) over the bytes of the contiguous CUDA tensor ``src`` with ``ctas`` CTAs, on the stream
    current at each call (so it can be captured in a CUDA graph). ``src``: 16-byte aligned, a whole number
    of 16-byte vectors; ``sink``: an int32 CUDA tensor of at least ``ctas * threads`` words (made if None),
    into which each thread writes the XOR of the words it read if ``store``."""
    import cuda.bindings.driver as cuda
    import torch
    from cutlass.cute.runtime import make_ptr

    if not src.is_cuda or not src.is_contiguous():
        raise ValueError("src: expected a contiguous CUDA tensor")
    nbytes = src.numel() * src.element_size()
    if nbytes % VECTOR_BYTES or src.data_ptr() % VECTOR_BYTES:
        raise ValueError(f"src: expected a 16-byte aligned whole number of 16-byte vectors, got {nbytes} bytes "
                         f"at {src.data_ptr():#x}")  # fmt: skip
    n_vec = nbytes // VECTOR_BYTES
    if n_vec >= 2**31:
        raise ValueError(f"src: at most 2^31 - 1 vectors of 16 bytes (32 GiB), got {n_vec}")
    if pattern not in READ_PATTERNS:
        raise ValueError(f"pattern: expected one of {READ_PATTERNS}, got {pattern!r}")
    if ctas < 1:
        raise ValueError(f"ctas: expected a positive CTA count, got {ctas}")
    if sink is None:
        sink = torch.zeros(ctas * threads, dtype=torch.int32, device=src.device)
    if sink.numel() < ctas * threads:
        raise ValueError(f"sink: expected at least ctas * threads = {ctas * threads} words, got {sink.numel()}")
    per_cta = -(-n_vec // ctas)
    src_ptr = make_ptr(cutlass.Uint8, src.data_ptr(), cute.AddressSpace.gmem, assumed_align=16)
    sink_ptr = make_ptr(cutlass.Int32, sink.data_ptr(), cute.AddressSpace.gmem, assumed_align=16)

    def launch():
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        compiled(src_ptr, n_vec, per_cta, sink_ptr, int(store), ctas, stream)

    launch.sink = sink  # keeps the sink alive as long as the launcher
    return launch
