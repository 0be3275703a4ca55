"""Elementwise kernels behind the helpers users import on the GPU: quantize, pack, the NVFP4 encoder and the
cache writer (CuTe DSL device code; the host side is :mod:`mjolnir_kernel.helpers`).

Each kernel computes the formula of its ``mjolnir_numerics.fused`` counterpart, each step by the same exact
operation or by one that gives the same value, so its bits are the spec's:

* quantize: ``lut[t]`` where ``t`` is the round-to-odd bfloat16 index of the float32 bits (integer
  arithmetic) and ``lut`` the quantizer's 65536-entry table; e4m3 by the hardware's conversion
  (``cvt.rn.satfinite.e4m3x2.f32``, the rounding the spec describes) where the values are finite;
* pack: the integer shifts and ors of ``fused.pack_codes``, 64 (6 bits) or 32 (4 bits) codes per thread;
* NVFP4: one thread per 16-value block: ``amax`` (exact), the block scale ``e4m3(max(amax / divisor / g,
  floor))`` by two correctly rounded divisions (``div.rn.f32``) and the hardware's e4m3 conversion,
  ``total = scale * g`` (one ``mul.rn.f32``), the element codes through the e2m1 table of ``x / total``; with
  a global divisor, ``g`` itself from the tensor's amax on the device;
* the cache writer: one 16-value chunk of a new row per thread, encoded as above (element formats: the
  codes of ``x / descale``) and stored at its slot's address, K and V in one launch (:class:`CacheWriteKernel`);
  where its quotients come from a reciprocal, fp6 codes come from the fp8 conversions at a scale
  (:data:`FP6_BY_FP8`), not the table.

The element quotients ``x / divisor`` are the correctly rounded float32 quotients, but computed the way
correctly rounded division is built from a reciprocal (:func:`quotient_fast`: one reciprocal ``div.rn.f32``
per 16 values, then a product and two FMAs per value; Markstein's theorem) wherever that sequence is exact
(:func:`fast_division_ok`: every ``|x| < 2^100`` and ``2^-20 <= divisor < 2^20``), and by ``div.rn.f32``
elsewhere. docs/kernels.md has the argument; tests/kernel/test_helpers.py checks the sequence against
correctly rounded division.

Every kernel reads and writes through 4- to 16-byte vector accesses; the host checks the alignment they
need and that sizes fit, and the launch has no host synchronisation (so it can be captured in a CUDA
graph).
"""

from __future__ import annotations

from typing import Optional

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64
from cutlass.cutlass_dsl import T, dsl_user_op

from mjolnir_numerics.formats import FORMATS

from .hopper.ptx import _asm, _f32, _i32, _struct, _unpack

THREADS = 256
GROUP = 16  # values in an NVFP4 block, and in a chunk of the cache writer
NVFP4_GROUP = GROUP


# -- memory and arithmetic instructions -----------------------------------------------------------
def _addr(x, loc, ip):
    return Int64(x).ir_value(loc=loc, ip=ip)


@dsl_user_op
def ld_v4_b32(gmem_addr, *, loc=None, ip=None):
    """A 16-byte read-only global load (16-byte aligned): four 32-bit words."""
    res = _asm(_struct(4, T.i32()), [_addr(gmem_addr, loc, ip)], "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];",
               "=r,=r,=r,=r,l")  # fmt: skip
    return _unpack(res, 4, T.i32(), Int32)


@dsl_user_op
def ld_b32(gmem_addr, *, loc=None, ip=None):
    """A 4-byte read-only global load."""
    return Int32(_asm(T.i32(), [_addr(gmem_addr, loc, ip)], "ld.global.nc.b32 $0, [$1];", "=r,l"))


@dsl_user_op
def ld_u8(gmem_addr, *, loc=None, ip=None):
    """A read-only global byte load, zero-extended."""
    return Int32(_asm(T.i32(), [_addr(gmem_addr, loc, ip)], "ld.global.nc.u8 $0, [$1];", "=r,l"))


@dsl_user_op
def st_b8(gmem_addr, value, *, loc=None, ip=None):
    """Store the low byte of ``value``."""
    _asm(None, [_addr(gmem_addr, loc, ip), _i32(value, loc, ip)], "st.global.b8 [$0], $1;", "l,r", side_effects=True)


@dsl_user_op
def st_b32(gmem_addr, value, *, loc=None, ip=None):
    _asm(None, [_addr(gmem_addr, loc, ip), _i32(value, loc, ip)], "st.global.b32 [$0], $1;", "l,r", side_effects=True)


@dsl_user_op
def st_v2_b32(gmem_addr, v0, v1, *, loc=None, ip=None):
    _asm(None, [_addr(gmem_addr, loc, ip), _i32(v0, loc, ip), _i32(v1, loc, ip)], "st.global.v2.b32 [$0], {$1, $2};",
         "l,r,r", side_effects=True)  # fmt: skip


@dsl_user_op
def st_v4_b32(gmem_addr, v0, v1, v2, v3, *, loc=None, ip=None):
    _asm(None, [_addr(gmem_addr, loc, ip)] + [_i32(v, loc, ip) for v in (v0, v1, v2, v3)],
         "st.global.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r", side_effects=True)  # fmt: skip


@dsl_user_op
def div_rn(a, b, *, loc=None, ip=None) -> Float32:
    """The correctly rounded float32 quotient (``div.rn.f32``, IEEE; the spec's ``fused.div_rn``)."""
    return Float32(_asm(T.f32(), [_f32(a, loc, ip), _f32(b, loc, ip)], "div.rn.f32 $0, $1, $2;", "=f,f,f"))


@dsl_user_op
def mul_rn(a, b, *, loc=None, ip=None) -> Float32:
    """``fp32(a * b)`` rounded on its own (never contracted into an fma)."""
    return Float32(_asm(T.f32(), [_f32(a, loc, ip), _f32(b, loc, ip)], "mul.rn.f32 $0, $1, $2;", "=f,f,f"))


@dsl_user_op
def cvt_fp8x2(lo, hi, fp8: str, *, loc=None, ip=None) -> Int32:
    """Two float32 converted by ``cvt.rn.satfinite.{fp8}x2.f32`` (``fp8``: "e4m3" or "e5m2"; round to nearest
    even, out-of-range finite values to the largest finite): ``lo``'s code in bits 0-7, ``hi``'s in bits 8-15."""
    text = f"{{\n\t.reg .b16 t;\n\tcvt.rn.satfinite.{fp8}x2.f32 t, $2, $1;\n\tcvt.u32.u16 $0, t;\n\t}}"
    return Int32(_asm(T.i32(), [_f32(lo, loc, ip), _f32(hi, loc, ip)], text, "=r,f,f"))


def cvt_e4m3x2(lo, hi):
    """Two float32 converted by the hardware's ``cvt.rn.satfinite.e4m3x2.f32`` (the spec's e4m3 rounding):
    ``lo``'s code in bits 0-7, ``hi``'s in bits 8-15."""
    return cvt_fp8x2(lo, hi, "e4m3")


@dsl_user_op
def e4m3_value(code, *, loc=None, ip=None) -> Float32:
    """The value of e4m3 code ``code`` (low byte) as float32: ``cvt.rn.f16x2.e4m3x2`` then ``cvt.f32.f16``, both
    exact (e4m3 values are float16 values)."""
    text = ("{\n\t.reg .b16 c, lo, hi;\n\t.reg .b32 h;\n\tcvt.u16.u32 c, $1;\n\tcvt.rn.f16x2.e4m3x2 h, c;\n\t"
            "mov.b32 {lo, hi}, h;\n\tcvt.f32.f16 $0, lo;\n\t}")  # fmt: skip
    return Float32(_asm(T.f32(), [_i32(code, loc, ip)], text, "=f,r"))


@dsl_user_op
def fma_rn(a, b, c, *, loc=None, ip=None) -> Float32:
    """``fp32(a * b + c)`` with one rounding (``fma.rn.f32``)."""
    return Float32(
        _asm(T.f32(), [_f32(a, loc, ip), _f32(b, loc, ip), _f32(c, loc, ip)], "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f")
    )


@dsl_user_op
def ld_b64(gmem_addr, *, loc=None, ip=None):
    """An 8-byte read-only global load (an int64 slot or sequence id)."""
    return Int64(_asm(T.i64(), [_addr(gmem_addr, loc, ip)], "ld.global.nc.b64 $0, [$1];", "=l,l"))


@dsl_user_op
def as_f32(bits, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [_i32(bits, loc, ip)], "mov.b32 $0, $1;", "=f,r"))


@dsl_user_op
def as_i32(x, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_f32(x, loc, ip)], "mov.b32 $0, $1;", "=r,f"))


@dsl_user_op
def max_s32(a, b, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip)], "max.s32 $0, $1, $2;", "=r,r,r"))


@dsl_user_op
def max_f32(a, b, *, loc=None, ip=None) -> Float32:
    """``max(a, b)`` of non-NaN float32 (``torch.maximum`` there)."""
    return Float32(_asm(T.f32(), [_f32(a, loc, ip), _f32(b, loc, ip)], "max.f32 $0, $1, $2;", "=f,f,f"))


@dsl_user_op
def positive_mask(x, *, loc=None, ip=None) -> Int32:
    """All ones where float32 ``x > 0``, else 0."""
    text = "{\n\t.reg .pred p;\n\tsetp.gt.f32 p, $1, 0f00000000;\n\tselp.b32 $0, -1, 0, p;\n\t}"
    return Int32(_asm(T.i32(), [_f32(x, loc, ip)], text, "=r,f"))


@dsl_user_op
def positive_or_one(x, *, loc=None, ip=None) -> Float32:
    """``x`` where float32 ``x > 0``, else 1 (a divisor that is never 0)."""
    text = "{\n\t.reg .pred p;\n\tsetp.gt.f32 p, $1, 0f00000000;\n\tselp.f32 $0, $1, 0f3F800000, p;\n\t}"
    return Float32(_asm(T.f32(), [_f32(x, loc, ip)], text, "=f,f"))


@dsl_user_op
def trap(*, loc=None, ip=None) -> None:
    """Abort the kernel with a device-side error (a slot outside the pools: never a stray write)."""
    _asm(None, [], "trap;", "", side_effects=True)


def quantize_words(qs: list, lut) -> list:
    """The codes of float32 bits ``qs`` through the round-to-odd table at address ``lut``, packed four to a
    word (lowest first)."""
    c = [quantize_word(q, lut) for q in qs]
    return [c[4 * i] | (c[4 * i + 1] << 8) | (c[4 * i + 2] << 16) | (c[4 * i + 3] << 24) for i in range(len(c) // 4)]


def e4m3_words(qs: list) -> list:
    """16 e4m3 codes of float32 bits ``qs`` by the hardware conversion, packed four to a word (lowest first)."""
    pairs = [cvt_e4m3x2(as_f32(qs[2 * i]), as_f32(qs[2 * i + 1])) for i in range(len(qs) // 2)]
    return [pairs[2 * i] | (pairs[2 * i + 1] << 16) for i in range(len(pairs) // 2)]


# fp6 codes by an fp8 conversion at a scale. e2m3 and e4m3 both keep 3 fraction bits: ``x * 2^-6`` has e4m3
# exponent field ``E - 6 + 7 = E + 1``, e2m3's field for ``x``, and the subnormal spacings line up (``2^-3 *
# 2^-6 = 2^-9``). e3m2 and e5m2 (2 fraction bits) line up the same way at ``2^-12``. So the fp8 conversion of
# the scaled value rounds as the fp6 format does: below the fp6 overflow its magnitude byte is the fp6 code's,
# above it the magnitude is at least 32 (saturated to 31, the largest fp6 magnitude); the sign moves from bit
# 7 to bit 5. The writer folds the scale into its division (:func:`quotients_fast`), so no instruction per
# value is added for it. ``FP6_BY_FP8[name] = (fp8 format, k)``: codes of ``x`` from the conversion of
# ``x * 2^-k``.
FP6_BY_FP8 = {"e2m3": ("e4m3", 6), "e3m2": ("e5m2", 12)}


def fp6_words(scaled: list, fp8: str) -> list:
    """The fp6 codes of 16 float32 values (bits ``scaled``, already times ``2^-k`` of :data:`FP6_BY_FP8`), one
    per byte, four to a word (lowest first): two values per conversion, then the saturation and the sign four
    codes at a time (byte-parallel: no carry crosses a byte)."""
    pairs = [cvt_fp8x2(as_f32(scaled[2 * i]), as_f32(scaled[2 * i + 1]), fp8) for i in range(len(scaled) // 2)]
    words = []
    for i in range(len(pairs) // 2):
        w = pairs[2 * i] | (pairs[2 * i + 1] << 16)
        mag = w & 0x7F7F7F7F
        over = (mag + 0x60606060) & -2139062144  # 0x80808080: bit 7 of each byte whose magnitude is >= 32
        fill = over - ((over >> 7) & 0x01010101)  # 0x7F in those bytes
        words.append((mag & ~fill) | (fill & 0x1F1F1F1F) | ((w >> 2) & 0x20202020))
    return words


# e2m1 keeps one fraction bit, and rounding to odd at p + 2 significant bits, then to nearest-even at p, is
# rounding to nearest-even at p directly: so e2m1's code of a float32 is fixed by its sign, exponent and top
# three fraction bits rounded to odd, a 12-bit index (the bits >> 20, the sticky bit in bit 0) into a table of
# 4096 codes, every 16th of the 65536-entry table (``e2m1_table``). One exponent is 8 bytes of it and 16 are
# a 128-byte line, where the 65536-entry table spreads each exponent over a whole line: the 32 lanes of a
# lookup touch about 4 lines instead of 11-12 (K and V rows of a prefill), and the host places the table so
# that exponents 120-135 (|q| in [2^-7, 2^9)) share one line per sign. The other formats, looked up only off
# the writer's fast path, keep the 16-bit index.
E2M1_INDEX_SHIFT = 20


def index_shift(fmt: str) -> int:
    """The right shift of :func:`round_to_odd_index` for the table of format ``fmt``: 20 for e2m1 (the
    4096-entry table), 16 for the others."""
    return E2M1_INDEX_SHIFT if fmt == "e2m1" else 16


def round_to_odd_index(bits: Int32, shift: int = 16) -> Int32:
    """Float32 ``bits`` >> ``shift`` rounded to odd (bit 0 of the result is the sticky bit of the ``shift`` bits
    cut off): the index into a quantizer's round-to-odd table (``fused.quantize_f32`` at ``shift = 16``, the
    bfloat16 bits; :data:`E2M1_INDEX_SHIFT`)."""
    low = (1 << shift) - 1
    return ((((bits & low) + low) | bits) >> shift) & ((1 << (32 - shift)) - 1)


def quantize_word(bits: Int32, lut: Int64, shift: int = 16) -> Int32:
    """The code of one float32 (given as its bits) through the round-to-odd table at address ``lut``, indexed
    by :func:`round_to_odd_index` at ``shift``."""
    return ld_u8(lut + Int64(round_to_odd_index(bits, shift)))


def _thread_index() -> Int64:
    bidx, _, _ = cute.arch.block_idx()
    tid, _, _ = cute.arch.thread_idx()
    return Int64(bidx) * THREADS + Int64(tid)


def _blocks(n, per_thread):
    return cute.ceil_div(n, THREADS * per_thread)


# -- quantize ---------------------------------------------------------------------------------------
class QuantizeKernel:
    """``out[i] = code(x[i])`` for ``n`` float32 ``x`` (16-byte aligned), uint8 ``out`` (4-byte aligned): four
    values per thread (one 16-byte load, one 4-byte store), through the round-to-odd table ``lut``; e4m3 by the
    hardware conversion where all four are finite (the spec's codes either way: every float32 is tested on a
    GPU)."""

    VEC = 4

    def __init__(self, fmt):
        self.fmt = fmt

    @cute.jit
    def __call__(self, x: cute.Pointer, lut: cute.Pointer, out: cute.Pointer, n: Int64, stream: cuda.CUstream):
        self.kernel(x, lut, out, n).launch(grid=[_blocks(n, self.VEC), 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Pointer, lut: cute.Pointer, out: cute.Pointer, n: Int64):
        i = _thread_index() * self.VEC
        x0, lut0, out0 = x.toint(), lut.toint(), out.toint()
        if i + self.VEC <= n:
            w = ld_v4_b32(x0 + i * 4)
            if cutlass.const_expr(self.fmt.name == "e4m3"):
                if abs_max_bits(w) < 0x7F800000:  # finite
                    st_b32(out0 + i, e4m3_words(w)[0])
                else:
                    st_b32(out0 + i, quantize_words(w, lut0)[0])
            else:
                st_b32(out0 + i, quantize_words(w, lut0)[0])
        else:
            for j in cutlass.range_constexpr(self.VEC):
                if i + j < n:
                    st_b8(out0 + i + j, quantize_word(ld_b32(x0 + (i + j) * 4), lut0))


# -- pack ---------------------------------------------------------------------------------------------
@cute.jit
def pack4_word(w: Int32) -> Int32:
    """Four codes (bytes of ``w``, lowest first) -> two bytes ``c0 | c1 << 4``, ``c2 | c3 << 4`` (low 16 bits)."""
    lo = ((w & 0xFF) | (((w >> 8) & 0xFF) << 4)) & 0xFF
    hi = (((w >> 16) & 0xFF) | (((w >> 24) & 0xFF) << 4)) & 0xFF
    return lo | (hi << 8)


@cute.jit
def pack6_word(w: Int32) -> Int32:
    """Four codes (bytes of ``w``, lowest first) -> the 24-bit little-endian word ``c0 | c1 << 6 | c2 << 12 |
    c3 << 18`` (its three low bytes are what ``pack`` stores)."""
    c = (w & 0xFF) | (((w >> 8) & 0xFF) << 6) | (((w >> 16) & 0xFF) << 12) | (((w >> 24) & 0xFF) << 18)
    return c & 0xFFFFFF


class PackKernel:
    """``pack`` of ``n`` codes (uint8, 16-byte aligned; ``n`` a multiple of 4 for 6 bits, 2 for 4 bits) into
    ``n * bits / 8`` bytes (16-byte aligned): 16 codes per thread, one 16-byte load, so that a warp's loads
    are one contiguous 512 bytes, and 12 bytes (6 bits: three 4-byte stores) or 8 (4 bits: one 8-byte store)
    stored per thread; a last partial vector four codes at a time.

    Measured against 64 (6 bits) and 32 (4 bits) codes per thread with 16-byte stores, on an H100, 16M
    codes, graph-replayed: 6 bits 5.5 us against 10.6 us (a copy of the output 4.7 us), 4 bits 4.4 us against
    4.3 us (copy 3.7 us) (``reports/helpers/2026-12-06-pack-layouts.md``)."""

    VEC = 16  # codes per thread

    def __init__(self, bits: int):
        if bits not in (4, 6):
            raise ValueError(f"bits: the pack kernel packs 4 or 6 bits, got {bits}")
        self.bits = bits

    @cute.jit
    def __call__(self, codes: cute.Pointer, out: cute.Pointer, n: Int64, stream: cuda.CUstream):
        self.kernel(codes, out, n).launch(grid=[_blocks(n, self.VEC), 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, codes: cute.Pointer, out: cute.Pointer, n: Int64):
        i = _thread_index() * self.VEC
        src, dst = codes.toint(), out.toint() + i * self.bits // 8
        if i + self.VEC <= n:
            w = ld_v4_b32(src + i)
            if cutlass.const_expr(self.bits == 4):  # 4 words of codes -> 2 words, at an 8-byte boundary
                st_v2_b32(dst, *[pack4_word(w[2 * j]) | (pack4_word(w[2 * j + 1]) << 16) for j in range(2)])
            else:  # 4 words of codes -> 4 24-bit groups -> 3 words, at a 4-byte boundary
                a, b, c, d = [pack6_word(x) for x in w]
                words = [a | (b << 24), (b >> 8) | (c << 16), (c >> 16) | (d << 8)]
                for j in cutlass.range_constexpr(3):
                    st_b32(dst + 4 * j, words[j])
        else:  # the last thread's partial vector, one group of four codes at a time (n is even)
            for g in cutlass.range_constexpr(self.VEC // 4):
                j = i + 4 * g
                if j < n:
                    word = ld_u8(src + j) | (ld_u8(src + j + 1) << 8)
                    if j + 2 < n:
                        word = word | (ld_u8(src + j + 2) << 16) | (ld_u8(src + j + 3) << 24)
                    if cutlass.const_expr(self.bits == 4):
                        packed = pack4_word(word)
                        st_b8(dst + 2 * g, packed)
                        if j + 2 < n:
                            st_b8(dst + 2 * g + 1, packed >> 8)
                    else:  # n is a multiple of 4
                        packed = pack6_word(word)
                        for b in cutlass.range_constexpr(3):
                            st_b8(dst + 3 * g + b, packed >> (8 * b))


# -- 16-value blocks: the pieces the NVFP4 encoder and the cache writer share (straight-line code) -------
# The quotients x / divisor of a block come from a reciprocal where that is exact (quotient_fast); these are
# the bounds of fast_division_ok, as float32 bit patterns.
FAST_DIVISOR_LOW = 0x35800000  # 2^-20
FAST_DIVISOR_HIGH = 0x49800000  # 2^20
FAST_ABS_X_LIMIT = 0x71800000  # 2^100


def load_block(addr, bf16: bool) -> list:
    """The float32 bits of 16 consecutive float32 (64 bytes) or bfloat16 (32 bytes, widened exactly) values
    at 16-byte aligned ``addr``."""
    bits = []
    if bf16:
        for q in range(2):
            for w in ld_v4_b32(addr + 16 * q):
                bits.append(w << 16)
                bits.append(w & -65536)  # 0xFFFF0000
    else:
        for q in range(4):
            bits.extend(ld_v4_b32(addr + 16 * q))
    return bits


def abs_max_bits(bits: list) -> Int32:
    """``max |x|`` of a block as float32 bits: an integer max of the magnitudes' bits (exact for non-NaN)."""
    amax = Int32(0)
    for b in bits:
        amax = max_s32(amax, b & 0x7FFFFFFF)
    return amax


def fast_division_ok(amax_bits, divisor):
    """Whether :func:`quotient_fast` gives the correctly rounded quotient's codes for a whole block: every
    ``|x| < 2^100`` (``amax_bits``; NaN and inf fail) and ``2^-20 <= divisor < 2^20``. In that range a quotient
    of ``|x| >= 2^-100`` is a normal float32 whose residual ``x - divisor * q0`` is exact (no underflow), so
    Markstein's theorem applies; one of ``|x| < 2^-100`` is below ``2^-77`` either way, and every format
    rounds it to the zero code of its sign."""
    d = as_i32(divisor)
    return (amax_bits < FAST_ABS_X_LIMIT) & (d >= FAST_DIVISOR_LOW) & (d < FAST_DIVISOR_HIGH)


def quotient_fast(b, divisor, recip) -> Int32:
    """The bits of ``fp32(x / divisor)`` for float32 bits ``b`` of ``x``, given ``recip = fp32(1 / divisor)``
    (correctly rounded): ``q0 = fp32(x * recip)`` is within an ulp, the negated residual ``divisor * q0 - x`` is
    exact in one FMA, and ``q0 - residual * recip`` rounded once is the correctly rounded quotient (Markstein's
    theorem; no overflow or underflow where :func:`fast_division_ok` holds). The negated forms keep ``x``'s sign
    where the quotient rounds to zero, as division does: for ``x = -0``, ``q0 = -0``, the residual ``(-0) + (+0)
    = +0`` and the quotient ``(-0) + (-0) = -0``, where ``x - divisor * q0 = +0`` would give ``(+0) + (-0) = +0``.
    Both negations are operand modifiers of the FMAs (no instruction)."""
    x = as_f32(b)
    q0 = mul_rn(x, recip)
    neg_res = fma_rn(divisor, q0, -x)
    return as_i32(fma_rn(-neg_res, recip, q0))


def block_codes(bits: list, divisor_value, lut, keep=None, shift: int = 16) -> list:
    """Element codes ``lut[round_to_odd(x / divisor)]`` (``fused.encode_elements``; the table indexed at
    ``shift``, :func:`index_shift`), each quotient by ``div.rn.f32``; ``keep``: a mask the quotients' bits are
    and-ed with first (NVFP4's zero blocks)."""
    out = []
    for b in bits:
        q = as_i32(div_rn(as_f32(b), divisor_value))
        out.append(quantize_word(q if keep is None else q & keep, lut, shift))
    return out


def quotients_fast(bits: list, divisor_value, scale_exp: int = 0) -> list:
    """The bits of ``x / divisor`` for a block (:func:`quotient_fast`, one reciprocal per block), the correctly
    rounded quotients where :func:`fast_division_ok` holds.

    ``scale_exp = k > 0`` gives ``x / divisor * 2^-k`` instead, by dividing by ``divisor * 2^k`` (exact) with the
    reciprocal ``fp32(2^-k / divisor)``: every step is the unscaled one's times ``2^-k``, exactly, wherever that
    is a normal float32, so the quotients are the correctly rounded ones scaled; where the scaled quotient is
    below ``2^-126`` the computed one is below ``2^-110`` too, with ``x``'s sign (both zero codes in the fp6
    formats :data:`FP6_BY_FP8` serves; tests/kernel/test_helpers.py checks both)."""
    recip = div_rn(Float32(2.0**-scale_exp), divisor_value)
    scaled = divisor_value if scale_exp == 0 else divisor_value * Float32(2.0**scale_exp)  # exact: a power of 2
    return [quotient_fast(b, scaled, recip) for b in bits]


def store_block_fast(addr, qs: list, lut, bits: int, fmt: str) -> None:
    """:func:`store_block` (``bits`` per code) of the ``fmt`` codes of quotients ``qs`` (finite: where
    :func:`fast_division_ok` holds): e4m3 by the hardware conversion, any other format through the round-to-odd
    table ``lut`` (indexed at :func:`index_shift`)."""
    if fmt == "e4m3":
        st_v4_b32(addr, *e4m3_words(qs))
    else:
        store_block(addr, [quantize_word(q, lut, index_shift(fmt)) for q in qs], bits)


def store_fp6_words(addr, words: list) -> None:
    """:func:`store_block` of 16 6-bit codes given four to a word (lowest first, as :func:`fp6_words` gives
    them): 12 bytes at 4-byte aligned ``addr``."""
    store_packed6(addr, [pack6_word(w) for w in words])


def store_packed6(addr, p: list) -> None:
    """Four 24-bit groups of four 6-bit codes each (``c0 | c1 << 6 | c2 << 12 | c3 << 18``) as 12 bytes, three
    4-byte stores at 4-byte aligned ``addr``."""
    st_b32(addr, p[0] | (p[1] << 24))
    st_b32(addr + 4, (p[1] >> 8) | (p[2] << 16))
    st_b32(addr + 8, (p[2] >> 16) | (p[3] << 8))


def nvfp4_scale(amax_bits, g, floor, has_floor: bool, divisor: float) -> tuple:
    """The NVFP4 block scale (``fused.nvfp4_block_scales``) of a block whose ``max |x|`` has bits
    ``amax_bits``: (its e4m3 code, ``total = fp32(scale) * g``); the scale is at least ``floor`` where
    ``has_floor``. The scale, never negative or NaN for finite values, is rounded to e4m3 by the hardware
    conversion and widened back exactly (no table lookups)."""
    scaled = div_rn(div_rn(as_f32(amax_bits), Float32(divisor)), g)
    if has_floor:
        scaled = max_f32(scaled, floor)
    scale_code = cvt_e4m3x2(scaled, Float32(0.0))  # the high byte: the code of +0, 0
    return scale_code, mul_rn(e4m3_value(scale_code), g)


def store_block(addr, codes: list, bits: int) -> None:
    """``fused.pack_codes`` of 16 valid codes stored at ``addr``: 16 bytes (8 bits; 16-byte aligned), 12
    (6 bits; 4-byte aligned) or 8 (4 bits; 8-byte aligned)."""
    if bits == 8:
        words = [codes[4 * i] | (codes[4 * i + 1] << 8) | (codes[4 * i + 2] << 16) | (codes[4 * i + 3] << 24)
                 for i in range(4)]  # fmt: skip
        st_v4_b32(addr, *words)
    elif bits == 6:
        p = [codes[4 * i] | (codes[4 * i + 1] << 6) | (codes[4 * i + 2] << 12) | (codes[4 * i + 3] << 18)
             for i in range(4)]  # fmt: skip
        store_packed6(addr, p)
    else:
        pairs = [codes[2 * i] | (codes[2 * i + 1] << 4) for i in range(8)]
        st_v2_b32(addr, *[pairs[4 * i] | (pairs[4 * i + 1] << 8) | (pairs[4 * i + 2] << 16) | (pairs[4 * i + 3] << 24)
                          for i in range(2)])  # fmt: skip


# -- NVFP4 -------------------------------------------------------------------------------------------
class NVFP4EncodeKernel:
    """The NVFP4 encoder (``fused.nvfp4_block_scales`` then ``fused.nvfp4_codes``, codes optionally packed) of
    float32 values (16-byte aligned) in rows of ``16 * blocks_per_row``, one 16-value block per thread.

    Outputs: the codes, one per byte (``packed=False``, 16-byte aligned) or two per byte (``packed``, 8-byte
    aligned), and one e4m3 scale code per block. The global scale: per-row values ``g[row * g_stride]``
    (``g_stride`` 0: one for all rows) times ``g_scale`` (a power of two: exact); or, with
    ``global_divisor``, computed from ``amax = g[0]`` (``max |x|`` of the whole tensor) as
    ``nvfp4._global_scale`` does (``amax / global_divisor`` correctly rounded, 1 where that is not > 0) and
    written to ``g_out[0]`` by the first thread. With ``has_floor``, the block-scale floor ``floor``.
    """

    def __init__(
        self,
        packed: bool,
        divisor: float,
        g_scale: float = 1.0,
        has_floor: bool = True,
        global_divisor: Optional[float] = None,
    ):
        self.packed, self.divisor, self.g_scale = bool(packed), float(divisor), float(g_scale)
        self.has_floor = bool(has_floor)
        self.global_divisor = None if global_divisor is None else float(global_divisor)

    @cute.jit
    def __call__(
        self, x: cute.Pointer, g: cute.Pointer, e2m1_lut: cute.Pointer, codes: cute.Pointer, scales: cute.Pointer,
        g_out: cute.Pointer, n_blocks: Int64, blocks_per_row: Int64, g_stride: Int64, floor: Float32,
        stream: cuda.CUstream,
    ):  # fmt: skip
        self.kernel(x, g, e2m1_lut, codes, scales, g_out, n_blocks, blocks_per_row, g_stride, floor).launch(
            grid=[_blocks(n_blocks, 1), 1, 1], block=[THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self, x: cute.Pointer, g: cute.Pointer, e2m1_lut: cute.Pointer, codes: cute.Pointer, scales: cute.Pointer,
        g_out: cute.Pointer, n_blocks: Int64, blocks_per_row: Int64, g_stride: Int64, floor: Float32,
    ):  # fmt: skip
        blk = _thread_index()
        if blk < n_blocks:
            bits = load_block(x.toint() + blk * (GROUP * 4), False)
            if cutlass.const_expr(self.global_divisor is not None):
                gv = positive_or_one(div_rn(as_f32(ld_b32(g.toint())), Float32(self.global_divisor)))
                if blk == 0:
                    st_b32(g_out.toint(), as_i32(gv))
            else:
                gv = as_f32(ld_b32(g.toint() + (blk // blocks_per_row) * g_stride * 4))
            if cutlass.const_expr(self.g_scale != 1.0):
                gv = mul_rn(gv, Float32(self.g_scale))
            amax = abs_max_bits(bits)
            scale_code, total = nvfp4_scale(amax, gv, floor, self.has_floor, self.divisor)
            st_b8(scales.toint() + blk, scale_code)
            dst = codes.toint() + blk * (8 if self.packed else 16)
            if fast_division_ok(amax, total):  # total > 0: no zero-block mask (see CacheWriteKernel)
                store_block_fast(dst, quotients_fast(bits, total), e2m1_lut.toint(), 4 if self.packed else 8, "e2m1")
            else:
                keep, divisor = positive_mask(total), positive_or_one(total)
                store_block(
                    dst, block_codes(bits, divisor, e2m1_lut.toint(), keep, E2M1_INDEX_SHIFT), 4 if self.packed else 8
                )


# -- the cache writer ----------------------------------------------------------------------------------
INDEX_BITS = 30  # the writer's chunk and row indices are below 2^30 (helpers.MAX_WRITE_CHUNKS)


def fast_divmod_constants(divisor: int) -> tuple[int, int]:
    """``(multiplier, shift)`` with ``n // divisor == (n * multiplier) >> shift`` for every ``0 <= n < 2^30``
    (Granlund and Montgomery, 1994, for 30-bit ``n``: ``shift = 30 + ceil(log2 divisor)``, ``multiplier =
    ceil(2^shift / divisor) < 2^31``): a 32-bit multiplier, so the product is one 32 x 32 -> 64-bit multiply.
    Raises ValueError for a divisor below 1."""
    if divisor < 1:
        raise ValueError(f"divisor: expected a positive integer, got {divisor}")
    shift = INDEX_BITS + (divisor - 1).bit_length()
    return -(-(1 << shift) // divisor), shift


@dsl_user_op
def select_u64(which, a, b, *, loc=None, ip=None) -> Int64:
    """``a`` where the 32-bit ``which`` is not zero, else ``b`` (64-bit: addresses)."""
    text = "{\n\t.reg .pred p;\n\tsetp.ne.s32 p, $1, 0;\n\tselp.b64 $0, $2, $3, p;\n\t}"
    ops = [_i32(which, loc, ip), _addr(a, loc, ip), _addr(b, loc, ip)]
    return Int64(_asm(T.i64(), ops, text, "=l,r,l,l"))


@dsl_user_op
def fast_div(n, multiplier, shift, *, loc=None, ip=None) -> Int32:
    """``n // d`` for ``0 <= n < 2^30`` given :func:`fast_divmod_constants` ``(multiplier, shift)`` of ``d``: the
    64-bit product of two unsigned 32-bit numbers (one ``mul.wide.u32``), shifted right."""
    text = "{\n\t.reg .u64 p;\n\tmul.wide.u32 p, $1, $2;\n\tshr.u64 p, p, $3;\n\tcvt.u32.u64 $0, p;\n\t}"
    ops = [_i32(n, loc, ip), _i32(multiplier, loc, ip), _i32(shift, loc, ip)]
    return Int32(_asm(T.i32(), ops, text, "=r,r,r,r"))


def writer_scalars() -> tuple:
    """Placeholders of :class:`CacheWriteKernel`'s scalar arguments, in order and of their types (for compiling)."""
    i32 = (Int32(1),)
    return (*i32 * 8, Int64(1), Int64(1), *i32 * 8, Float32(1.0))


class CacheWriteKernel:
    """``PagedKVCache.write`` of K and V in one launch: encode each new row and store it at its slot.

    The grid's second dimension picks K (0) or V (1): the same slots, sequence ids and strides, each its own
    rows, descales and pools. Rows ``x (n, h_k, d)`` (float32 or bfloat16, contiguous, ``d`` a multiple of 16)
    are cut into 16-value chunks, one per thread, whose values are loaded first (2 or 4 chunks per thread
    measured slower on the H200: reports/helpers/2026-12-04-prefill-writer.md). Chunk ``t`` is row ``t //
    chunks_per_row`` and token ``row // heads`` (divisions by multiplication: :func:`fast_divmod_constants`;
    ``n_chunks < 2^30``). The index arithmetic is 32-bit but for the pool's page offset (``page * pool_page``,
    64-bit): the host takes the kernel only where the slots, the strides and a page's bytes stay below 2^31
    (``helpers.write_unsupported``). Token ``t``'s row for head ``h`` goes to byte ``page * pool_page + off *
    pool_row + h * pool_head`` of the pool (``page, off = divmod(slots[t], 2^page_shift)``); its descale is
    ``descale[seq_ids[t] * ds_seq + h * ds_head]`` (``per_seq``; else ``h * ds_head``). Element formats store
    ``pack(code(x / descale))`` (``fused.encode_elements``); NVFP4 stores the packed codes and block scales of
    ``fused.nvfp4_codes_packed`` under ``g = descale * g_scale`` (scales at ``page * sc_page + off * sc_row + h
    * sc_head``). A slot outside ``[0, num_slots)`` or a sequence id outside ``[0, num_seqs)`` traps (a
    device-side error) before the thread reads or writes through it, so nothing is written out of bounds.
    """

    def __init__(self, element: str, nvfp4: bool, bf16: bool, per_seq: bool, has_floor: bool, g_scale: float):
        self.fmt = FORMATS[element]  # NVFP4: e2m1
        self.bits, self.nvfp4, self.bf16, self.per_seq = self.fmt.bits, bool(nvfp4), bool(bf16), bool(per_seq)
        self.has_floor, self.g_scale = bool(has_floor), float(g_scale)

    @cute.jit
    def __call__(
        self, k: cute.Pointer, v: cute.Pointer, slots: cute.Pointer, seq_ids: cute.Pointer, k_descale: cute.Pointer,
        v_descale: cute.Pointer, lut: cute.Pointer, k_pool: cute.Pointer, v_pool: cute.Pointer,
        k_scales: cute.Pointer, v_scales: cute.Pointer, n_chunks: Int32,
        row_mul: Int32, row_shift: Int32, chunks_per_row: Int32, token_mul: Int32, token_shift: Int32,
        heads: Int32, page_shift: Int32, num_slots: Int64, num_seqs: Int64, pool_page: Int32, pool_row: Int32,
        pool_head: Int32, sc_page: Int32, sc_row: Int32, sc_head: Int32, ds_seq: Int32, ds_head: Int32,
        floor: Float32, stream: cuda.CUstream,
    ):  # fmt: skip
        self.kernel(
            k, v, slots, seq_ids, k_descale, v_descale, lut, k_pool, v_pool, k_scales, v_scales, n_chunks, row_mul,
            row_shift, chunks_per_row, token_mul, token_shift, heads, page_shift, num_slots, num_seqs, pool_page,
            pool_row, pool_head, sc_page, sc_row, sc_head, ds_seq, ds_head, floor,
        ).launch(grid=[_blocks(n_chunks, 1), 2, 1], block=[THREADS, 1, 1], stream=stream)  # fmt: skip

    @cute.kernel
    def kernel(
        self, k: cute.Pointer, v: cute.Pointer, slots: cute.Pointer, seq_ids: cute.Pointer, k_descale: cute.Pointer,
        v_descale: cute.Pointer, lut: cute.Pointer, k_pool: cute.Pointer, v_pool: cute.Pointer,
        k_scales: cute.Pointer, v_scales: cute.Pointer, n_chunks: Int32,
        row_mul: Int32, row_shift: Int32, chunks_per_row: Int32, token_mul: Int32, token_shift: Int32,
        heads: Int32, page_shift: Int32, num_slots: Int64, num_seqs: Int64, pool_page: Int32, pool_row: Int32,
        pool_head: Int32, sc_page: Int32, sc_row: Int32, sc_head: Int32, ds_seq: Int32, ds_head: Int32,
        floor: Float32,
    ):  # fmt: skip
        bidx, which, _ = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        t = Int32(bidx) * THREADS + Int32(tid)  # the index arithmetic in 32 bits (host: write_unsupported)
        if t < n_chunks:
            x = select_u64(which, v.toint(), k.toint())  # V's (which = 1) or K's
            bits = load_block(x + Int64(t) * (GROUP * (2 if self.bf16 else 4)), self.bf16)  # the loads first
            row = fast_div(t, row_mul, row_shift)
            chunk = t - row * chunks_per_row
            token = fast_div(row, token_mul, token_shift)
            head = row - token * heads
            slot = ld_b64(slots.toint() + Int64(token) * 8)
            ds_at = head * ds_head
            if cutlass.const_expr(self.per_seq):
                seq = ld_b64(seq_ids.toint() + Int64(token) * 8)
                if (seq < 0) | (seq >= num_seqs):
                    trap()
                ds_at = ds_at + Int32(seq) * ds_seq
            ds_base = select_u64(which, v_descale.toint(), k_descale.toint())
            ds = as_f32(ld_b32(ds_base + Int64(ds_at) * 4))
            if (slot < 0) | (slot >= num_slots):
                trap()
            slot32 = Int32(slot)  # < num_slots < 2^31
            page = slot32 >> page_shift
            off = slot32 - (page << page_shift)
            pool = select_u64(which, v_pool.toint(), k_pool.toint())
            in_page = off * pool_row + head * pool_head + chunk * (2 * self.bits)  # < helpers._in_page_bytes < 2^31
            dst = pool + Int64(page) * Int64(pool_page) + Int64(in_page)
            amax = abs_max_bits(bits)
            divisor = ds  # element formats: x / descale
            if cutlass.const_expr(self.nvfp4):  # NVFP4: the block scale, then x / (scale * g)
                scale_code, divisor = nvfp4_scale(amax, mul_rn(ds, Float32(self.g_scale)), floor, self.has_floor, 6.0)
                sc = select_u64(which, v_scales.toint(), k_scales.toint())
                st_b8(sc + Int64(page) * Int64(sc_page) + Int64(off * sc_row + head * sc_head + chunk), scale_code)
            # NVFP4's total scale is > 0 on the fast path (fast_division_ok), so its zero-block mask (all ones there)
            # and divisor-of-one guard are the slow path's alone
            if fast_division_ok(amax, divisor):
                if cutlass.const_expr(self.fmt.name in FP6_BY_FP8):
                    fp8, scale_exp = FP6_BY_FP8[self.fmt.name]
                    store_fp6_words(dst, fp6_words(quotients_fast(bits, divisor, scale_exp), fp8))
                else:
                    store_block_fast(dst, quotients_fast(bits, divisor), lut.toint(), self.bits, self.fmt.name)
            else:
                shift = index_shift(self.fmt.name)
                if cutlass.const_expr(self.nvfp4):
                    codes = block_codes(bits, positive_or_one(divisor), lut.toint(), positive_mask(divisor), shift)
                else:
                    codes = block_codes(bits, divisor, lut.toint(), None, shift)
                store_block(dst, codes, self.bits)
