"""A matrix product through Hopper's warp-level MMAs, for ``benchmarks.probes.probe_fp8_accumulation
--mma-sync``.

D = A . B^T for e4m3 A (m, k) and B (n, k), row-major bytes, fp32 D (m, n): one warp per 16 x 8 tile of D,
chained over k in fp32 registers, either

* ``path="fp8"``: ``mma.sync.m16n8k32`` on the e4m3 bytes (sm_89+; on sm_90a ptxas lowers it to the f16
  unpacks and ``HMMA.16816`` the decode kernel issues itself, plus fp32 adds: ``probe_sass``), or
* ``path="f16"``: ``mma.sync.m16n8k16`` on the bytes widened exactly to f16, in the decode kernel's order
  (four bytes of a row per lane and k-step, ``e4m3x4_to_pairs``).

The question it answers: does the fp8 warp-level MMA add 32 products as exactly as the f16 one adds 16,
or like the fp8 warpgroup MMA (docs/numerics.md, "Special functions and the tensor cores")?
``probe_fp8_accumulation`` compares both with the exact sum (on the H200: at fp32 precision, like the f16
path).

The fp8 ``mma.sync`` and the fp32 pair store are defined here, not in ``mjolnir_kernel.hopper.ptx``: the
decode kernel uses neither.
"""

import cutlass
import cutlass.cute as cute

from mjolnir_kernel.hopper.ptx import (
    T,
    Float32,
    Int64,
    _asm,
    _f32,
    _i32,
    _struct,
    _unpack,
    dsl_user_op,
    e4m3x4_to_pairs,
    ld_global_b32,
    mma_m16n8k16,
)

MMA_PATHS = ("fp8", "f16")


@dsl_user_op
def mma_m16n8k32_e4m3(a, b, c, *, loc=None, ip=None):
    """``mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32`` (sm_89+): D = A (16x32) . B (32x8) + C on fp8
    operands, four e4m3 bytes per register. a: 4 Int32, b: 2 Int32, c: 4 Float32; returns 4 Float32. Used
    by ``benchmarks.probes.probe_fp8_accumulation --mma-sync`` (how exactly the warp-level fp8 MMA adds)."""
    res = _asm(
        _struct(4, T.f32()),
        [_i32(x, loc, ip) for x in a] + [_i32(x, loc, ip) for x in b] + [_f32(x, loc, ip) for x in c],
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
    )
    return _unpack(res, 4, T.f32(), Float32)


@dsl_user_op
def st_global_v2_f32(gmem_addr, v0, v1, *, loc=None, ip=None):
    _asm(None, [Int64(gmem_addr).ir_value(loc=loc, ip=ip), _f32(v0, loc, ip), _f32(v1, loc, ip)],
         "st.global.v2.f32 [$0], {$1, $2};", "l,f,f", side_effects=True)  # fmt: skip


class WarpMmaProbe:
    """Compile key: the contraction length ``k`` (a multiple of 32) and the MMA ``path`` (``MMA_PATHS``)."""

    def __init__(self, k: int, path: str):
        if path not in MMA_PATHS:
            raise ValueError(f"path: expected one of {MMA_PATHS}, got {path!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 32 or k % 32:
            raise ValueError(f"k: expected a positive multiple of 32, got {k!r}")
        self.k = k
        self.path = path

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, b_ptr: cute.Pointer, d_ptr: cute.Pointer, m: cutlass.Int32,
                 n: cutlass.Int32, stream):  # fmt: skip
        base = cute.make_layout((1,))
        mA, mB, mD = cute.make_tensor(a_ptr, base), cute.make_tensor(b_ptr, base), cute.make_tensor(d_ptr, base)
        self.kernel(mA, mB, mD, n).launch(grid=(m // 16, n // 8, 1), block=[32, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mD: cute.Tensor, n: cutlass.Int32):
        i64, f32 = cutlass.Int64, cutlass.Float32
        tile_m, tile_n, _ = cute.arch.block_idx()
        lane, _, _ = cute.arch.thread_idx()
        g = lane // 4
        c = lane % 4
        k = self.k
        rows = (i64(tile_m * 16 + g) * k, i64(tile_m * 16 + g + 8) * k)  # byte offsets of A rows g, g + 8
        col = i64(tile_n * 8 + g) * k  # of B row (D column) g
        a_base, b_base = mA.iterator.toint(), mB.iterator.toint()
        acc = cute.make_rmem_tensor((4,), f32)
        acc.fill(f32(0))
        if cutlass.const_expr(self.path == "fp8"):  # lane (g, c): bytes 4c .. 4c + 3 and 16 + 4c .. of a k-step
            for s in cutlass.range_constexpr(k // 32):
                a = [ld_global_b32(a_base + rows[r] + 32 * s + 16 * h + 4 * c) for h in range(2) for r in range(2)]
                b = [ld_global_b32(b_base + col + 32 * s + 16 * h + 4 * c) for h in range(2)]
                r = mma_m16n8k32_e4m3(a, b, (acc[0], acc[1], acc[2], acc[3]))
                for e in cutlass.range_constexpr(4):
                    acc[e] = r[e]
        else:  # as the decode kernel: bytes 4c .. 4c + 3 of a row feed k positions 2c, 2c + 1, 2c + 8, 2c + 9
            for s in cutlass.range_constexpr(k // 16):
                a0, a2 = e4m3x4_to_pairs(ld_global_b32(a_base + rows[0] + 16 * s + 4 * c), bf16=False)
                a1, a3 = e4m3x4_to_pairs(ld_global_b32(a_base + rows[1] + 16 * s + 4 * c), bf16=False)
                b0, b1 = e4m3x4_to_pairs(ld_global_b32(b_base + col + 16 * s + 4 * c), bf16=False)
                r = mma_m16n8k16((a0, a1, a2, a3), (b0, b1), (acc[0], acc[1], acc[2], acc[3]), bf16=False)
                for e in cutlass.range_constexpr(4):
                    acc[e] = r[e]
        d_base = mD.iterator.toint()
        for half in cutlass.range_constexpr(2):  # D rows g, g + 8; columns 2c, 2c + 1 of the tile
            row = i64(tile_m * 16 + g + 8 * half)
            st_global_v2_f32(d_base + (row * i64(n) + i64(tile_n * 8 + 2 * c)) * 4, acc[2 * half], acc[2 * half + 1])


def compile_probe(k: int, path: str, arch: str = "sm_90a", cubin_dir=None):
    """The compiled ``WarpMmaProbe`` (dummy pointers; run it with ``run_probe``); ``cubin_dir``: keep the
    cubin there (``probe_sass``)."""
    import cuda.bindings.driver as cuda
    from cutlass.cute.runtime import make_ptr

    from mjolnir_kernel.compile import COMPILE_OPTIONS

    def ptr(dtype):
        return make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=16)

    args = (ptr(cutlass.Uint8), ptr(cutlass.Uint8), ptr(cutlass.Float32), cutlass.Int32(16), cutlass.Int32(8),
            cuda.CUstream(0))  # fmt: skip
    options = f"{COMPILE_OPTIONS} --gpu-arch {arch}"
    if cubin_dir is not None:
        options += f" --keep-cubin --dump-dir {cubin_dir}"
    return cute.compile(WarpMmaProbe(k, path), *args, options=options)


def probe_sass(k: int, path: str, arch: str = "sm_90a") -> str:
    """The probe kernel's machine code (``cuobjdump -sass``; needs the ``kernel`` extra's tools). On sm_90a
    it shows how ptxas lowers the fp8 ``mma.sync.m16n8k32``: unpacks to f16 (F2FP), two ``HMMA.16816`` per
    instruction and fp32 adds, not a native fp8 MMA."""
    from mjolnir_kernel.sass import disassemble_compiled

    return disassemble_compiled(lambda cubin_dir: compile_probe(k, path, arch, cubin_dir))


def run_probe(compiled, a, b):
    """D = A . B^T (fp32, (m, n)) for e4m3 CUDA tensors ``a`` (m, k) and ``b`` (n, k), m a multiple of 16 and
    n of 8, with a kernel from ``compile_probe`` for this k."""
    import torch
    from cutlass.cute.runtime import make_ptr

    m, k = a.shape
    n = b.shape[0]
    if m % 16 or n % 8 or b.shape[1] != k:
        raise ValueError(f"a, b: expected (m, k) and (n, k) with m % 16 == 0 and n % 8 == 0, got {a.shape}, {b.shape}")
    a, b = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    d = torch.empty(m, n, dtype=torch.float32, device=a.device)

    def ptr(dtype, t):
        return make_ptr(dtype, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=16)

    import cuda.bindings.driver as cuda

    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    compiled(ptr(cutlass.Uint8, a), ptr(cutlass.Uint8, b), ptr(cutlass.Float32, d), m, n, stream)
    return d
