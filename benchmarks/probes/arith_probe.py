"""The GPU's own arithmetic, measured where the decode kernels use it (device code): the inputs of one
``mma.sync.m16n8k16`` (f16 or bf16 operands, fp32 accumulate) and two special functions, on arrays.

* ``MmaProbe(bf16)``: test t is one instruction, D[t] = A[t] (16 x 16) . B[t]^T (B stored (8, 16), k
  contiguous) + C[t] (16 x 8), every operand as raw bits (uint16 A and B, fp32 C and D). The fragments
  follow the PTX ISA's layout of m16n8k16 (lane = 4 * group + thread in group).
* ``UnaryProbe(op)``: y[i] = op(x[i]) for fp32 arrays; ``"ex2"`` is ``cute.math.exp2(x, fastmath=True)``
  (``ex2.approx.ftz.f32``, what the kernels' softmax, corrections and split weights use), ``"log"`` is
  ``cute.math.log(x, fastmath=False)`` (the kernels' LSE).

``benchmarks.probes.arithmetic_sweep`` runs them on the H200 against ``mjolnir_numerics.arithmetic``.
"""

import cutlass
import cutlass.cute as cute

from mjolnir_kernel.hopper.ptx import ld_global_b32, mma_m16n8k16

UNARY_OPS = ("ex2", "log")
THREADS = 256


class MmaProbe:
    """One m16n8k16 MMA per test; compile key: ``bf16`` (else f16 operands)."""

    def __init__(self, bf16: bool):
        self.bf16 = bool(bf16)

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, b_ptr: cute.Pointer, c_ptr: cute.Pointer, d_ptr: cute.Pointer,
                 tests: cutlass.Int32, stream):  # fmt: skip
        mC = cute.make_tensor(c_ptr, cute.make_layout((tests * 128,)))
        mD = cute.make_tensor(d_ptr, cute.make_layout((tests * 128,)))
        base = cute.make_layout((1,))
        mA, mB = cute.make_tensor(a_ptr, base), cute.make_tensor(b_ptr, base)
        self.kernel(mA, mB, mC, mD).launch(grid=(tests, 1, 1), block=[32, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mD: cute.Tensor):
        i64 = cutlass.Int64
        t, _, _ = cute.arch.block_idx()
        lane, _, _ = cute.arch.thread_idx()
        g = lane // 4
        c = lane % 4
        a_base = mA.iterator.toint() + i64(t) * 512  # 16 x 16 halves
        b_base = mB.iterator.toint() + i64(t) * 256  # 8 x 16 halves

        def half_word(base, row, col, width):
            return ld_global_b32(base + i64(row * width + col) * 2)

        a = (half_word(a_base, g, 2 * c, 16), half_word(a_base, g + 8, 2 * c, 16),
             half_word(a_base, g, 2 * c + 8, 16), half_word(a_base, g + 8, 2 * c + 8, 16))  # fmt: skip
        b = (half_word(b_base, g, 2 * c, 16), half_word(b_base, g, 2 * c + 8, 16))
        o = t * 128
        idx = (o + g * 8 + 2 * c, o + g * 8 + 2 * c + 1, o + (g + 8) * 8 + 2 * c, o + (g + 8) * 8 + 2 * c + 1)
        acc = (mC[idx[0]], mC[idx[1]], mC[idx[2]], mC[idx[3]])
        d = mma_m16n8k16(a, b, acc, bf16=self.bf16)
        for e in cutlass.range_constexpr(4):
            mD[idx[e]] = d[e]


class UnaryProbe:
    """y = op(x) elementwise over fp32 arrays of ``n`` values; compile key: ``op`` (``UNARY_OPS``)."""

    def __init__(self, op: str):
        if op not in UNARY_OPS:
            raise ValueError(f"op: expected one of {UNARY_OPS}, got {op!r}")
        self.op = op

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, y_ptr: cute.Pointer, n: cutlass.Int32, stream):
        mX = cute.make_tensor(x_ptr, cute.make_layout((n,)))
        mY = cute.make_tensor(y_ptr, cute.make_layout((n,)))
        self.kernel(mX, mY, n).launch(grid=((n + THREADS - 1) // THREADS, 1, 1), block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mY: cute.Tensor, n: cutlass.Int32):
        b, _, _ = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        i = b * THREADS + tid
        if i < n:
            x = mX[i]
            if cutlass.const_expr(self.op == "ex2"):
                mY[i] = cute.math.exp2(x, fastmath=True)
            else:
                mY[i] = cute.math.log(x, fastmath=False)


def _ptr(dtype, address=16):
    from cutlass.cute.runtime import make_ptr

    return make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=16)


def compile_mma_probe(bf16: bool, arch: str = "sm_90a"):
    import cuda.bindings.driver as cuda

    from mjolnir_kernel.compile import COMPILE_OPTIONS

    u8, f32 = cutlass.Uint8, cutlass.Float32
    args = (_ptr(u8), _ptr(u8), _ptr(f32), _ptr(f32), cutlass.Int32(1), cuda.CUstream(0))
    return cute.compile(MmaProbe(bf16), *args, options=f"{COMPILE_OPTIONS} --gpu-arch {arch}")


def compile_unary_probe(op: str, arch: str = "sm_90a"):
    import cuda.bindings.driver as cuda

    from mjolnir_kernel.compile import COMPILE_OPTIONS

    f32 = cutlass.Float32
    args = (_ptr(f32), _ptr(f32), cutlass.Int32(1), cuda.CUstream(0))
    return cute.compile(UnaryProbe(op), *args, options=f"{COMPILE_OPTIONS} --gpu-arch {arch}")


def run_mma(compiled, a_bits, b_bits, c):
    """D (T, 16, 8) fp32 for A bits (T, 16, 16) and B bits (T, 8, 16) (int16 / uint16 CUDA tensors of f16 or
    bf16 bit patterns) and C (T, 16, 8) fp32."""
    import cuda.bindings.driver as cuda
    import torch

    a_bits, b_bits, c = a_bits.contiguous(), b_bits.contiguous(), c.contiguous()
    d = torch.empty_like(c)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    u8, f32 = cutlass.Uint8, cutlass.Float32
    compiled(_ptr(u8, a_bits.data_ptr()), _ptr(u8, b_bits.data_ptr()), _ptr(f32, c.data_ptr()),
             _ptr(f32, d.data_ptr()), cutlass.Int32(c.shape[0]), stream)  # fmt: skip
    return d


def run_unary(compiled, x):
    """op(x) for a contiguous fp32 CUDA tensor ``x`` (fewer than 2^31 values)."""
    import cuda.bindings.driver as cuda
    import torch

    x = x.contiguous()
    y = torch.empty_like(x)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    f32 = cutlass.Float32
    compiled(_ptr(f32, x.data_ptr()), _ptr(f32, y.data_ptr()), cutlass.Int32(x.numel()), stream)
    return y
