"""Inline-PTX building blocks of the Hopper decode kernel (warp-level MMA, ldmatrix, cp.async, conversions).

Each wrapper takes and returns cutlass ``Int32`` / ``Float32`` values; registers that hold packed pairs
are ``Int32`` bit patterns (``f16x2``, ``bf16x2``, four fp8 bytes). Instructions that touch memory are
emitted with side effects so the compiler keeps them in program order relative to barriers.
"""

from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

_ATT = llvm.AsmDialect.AD_ATT


def _asm(result_type, operands, text, constraints, side_effects=False):
    return llvm.inline_asm(
        result_type, operands, text, constraints, has_side_effects=side_effects, is_align_stack=False, asm_dialect=_ATT
    )


def _struct(n, elem):
    return llvm.StructType.get_literal([elem] * n)


def _unpack(res, n, elem, wrap):
    return tuple(wrap(llvm.extractvalue(elem, res, [i])) for i in range(n))


def _i32(x, loc=None, ip=None):
    return Int32(x).ir_value(loc=loc, ip=ip)


def _f32(x, loc=None, ip=None):
    return Float32(x).ir_value(loc=loc, ip=ip)


@dsl_user_op
def ldmatrix_x4(smem_addr, *, trans: bool = False, loc=None, ip=None):
    """``ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16``: lane ``8 i + r`` gives the address of row r
    of matrix i; returns the four 32-bit registers (one per matrix)."""
    t = ".trans" if trans else ""
    res = _asm(
        _struct(4, T.i32()),
        [_i32(smem_addr, loc, ip)],
        f"ldmatrix.sync.aligned.m8n8.x4{t}.shared.b16 {{$0, $1, $2, $3}}, [$4];",
        "=r,=r,=r,=r,r",
        side_effects=True,
    )
    return _unpack(res, 4, T.i32(), Int32)


@dsl_user_op
def mma_m16n8k16(a, b, c, *, bf16: bool, loc=None, ip=None):
    """``mma.sync.aligned.m16n8k16.row.col.f32.{f16|bf16}``: D = A (16x16) . B (16x8) + C, fp32 accumulate.
    a: 4 Int32 (packed pairs), b: 2 Int32, c: 4 Float32; returns 4 Float32."""
    ty = "bf16" if bf16 else "f16"
    res = _asm(
        _struct(4, T.f32()),
        [_i32(x, loc, ip) for x in a] + [_i32(x, loc, ip) for x in b] + [_f32(x, loc, ip) for x in c],
        f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
    )
    return _unpack(res, 4, T.f32(), Float32)


def _cp_async(cache: str, nbytes: int, smem_addr, gmem_addr, src_bytes, loc, ip, policy=None):
    hint = ".L2::cache_hint" if policy is not None else ""
    ops = [_i32(smem_addr, loc, ip), Int64(gmem_addr).ir_value(loc=loc, ip=ip), _i32(src_bytes, loc, ip)]
    if policy is not None:
        ops.append(Int64(policy).ir_value(loc=loc, ip=ip))
    _asm(
        None,
        ops,
        f"cp.async.{cache}.shared.global{hint} [$0], [$1], {nbytes}, $2" + (", $3;" if policy is not None else ";"),
        "r,l,r" + (",l" if policy is not None else ""),
        side_effects=True,
    )


@dsl_user_op
def l2_evict_first_policy(*, loc=None, ip=None):
    """A 64-bit L2 cache policy (``createpolicy``) that marks every line it touches evict-first."""
    return Int64(_asm(T.i64(), [], "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;", "=l"))


@dsl_user_op
def cp_async_16(smem_addr, gmem_addr, src_bytes, *, policy=None, loc=None, ip=None):
    """``cp.async.cg.shared.global`` of 16 bytes; ``src_bytes`` 0 zero-fills the destination (nothing is read).
    ``policy``: an L2 cache policy (``l2_evict_first_policy``)."""
    _cp_async("cg", 16, smem_addr, gmem_addr, src_bytes, loc, ip, policy)


@dsl_user_op
def cp_async_8(smem_addr, gmem_addr, src_bytes, *, loc=None, ip=None):
    """``cp.async.ca.shared.global`` of 8 bytes (zero-fill when ``src_bytes`` is 0)."""
    _cp_async("ca", 8, smem_addr, gmem_addr, src_bytes, loc, ip)


# -- global loads and stores ------------------------------------------------------------------------
@dsl_user_op
def ld_global_b32(gmem_addr, *, loc=None, ip=None):
    """A 4-byte read-only global load."""
    return Int32(_asm(T.i32(), [Int64(gmem_addr).ir_value(loc=loc, ip=ip)], "ld.global.nc.b32 $0, [$1];", "=r,l", True))


@dsl_user_op
def ld_global_v2_b32(gmem_addr, *, loc=None, ip=None):
    """An 8-byte read-only global load (8-byte aligned)."""
    res = _asm(
        _struct(2, T.i32()),
        [Int64(gmem_addr).ir_value(loc=loc, ip=ip)],
        "ld.global.nc.v2.b32 {$0, $1}, [$2];",
        "=r,=r,l",
        side_effects=True,
    )
    return _unpack(res, 2, T.i32(), Int32)


@dsl_user_op
def st_shared_b32(smem_addr, value, *, loc=None, ip=None):
    _asm(None, [_i32(smem_addr, loc, ip), _i32(value, loc, ip)], "st.shared.b32 [$0], $1;", "r,r", side_effects=True)


@dsl_user_op
def st_global_v2_b32(gmem_addr, v0, v1, *, loc=None, ip=None):
    _asm(
        None,
        [Int64(gmem_addr).ir_value(loc=loc, ip=ip), _i32(v0, loc, ip), _i32(v1, loc, ip)],
        "st.global.v2.b32 [$0], {$1, $2};",
        "l,r,r",
        side_effects=True,
    )


@dsl_user_op
def st_global_v4_f32(gmem_addr, v0, v1, v2, v3, *, loc=None, ip=None):
    _asm(
        None,
        [Int64(gmem_addr).ir_value(loc=loc, ip=ip)] + [_f32(x, loc, ip) for x in (v0, v1, v2, v3)],
        "st.global.v4.f32 [$0], {$1, $2, $3, $4};",
        "l,f,f,f,f",
        side_effects=True,
    )


# -- conversions (exact unless stated) ------------------------------------------------------------

_E4M3X2_TO_BF16X2 = (
    "cvt.rn.f16x2.e4m3x2 h, {src};\n\t"
    "mov.b32 {{h0, h1}}, h;\n\t"
    "cvt.f32.f16 f0, h0;\n\t"
    "cvt.f32.f16 f1, h1;\n\t"
    "cvt.rn.bf16x2.f32 {dst}, f1, f0;\n\t"
)


def _e4m3x2_to(dst, src, bf16):
    if bf16:
        return _E4M3X2_TO_BF16X2.format(dst=dst, src=src)
    return f"cvt.rn.f16x2.e4m3x2 {dst}, {src};\n\t"


_DECLS = ".reg .b16 lo, hi, h0, h1;\n\t.reg .b32 h, pr;\n\t.reg .f32 f0, f1;\n\t"


@dsl_user_op
def e4m3x4_to_pairs(x, *, bf16: bool, loc=None, ip=None):
    """Four e4m3 bytes (b0 lowest) -> ((b0, b1), (b2, b3)) as f16x2 or bf16x2 (exact: every e4m3 value is
    an f16 and a bf16 value)."""
    text = "{\n\t" + _DECLS + "mov.b32 {lo, hi}, $2;\n\t" + _e4m3x2_to("$0", "lo", bf16) + _e4m3x2_to("$1", "hi", bf16)
    res = _asm(_struct(2, T.i32()), [_i32(x, loc, ip)], text + "}", "=r,=r,r")
    return _unpack(res, 2, T.i32(), Int32)


@dsl_user_op
def e4m3x4_to_pairs_transposed(x, *, bf16: bool, loc=None, ip=None):
    """Four e4m3 bytes (b0 lowest) -> ((b0, b2), (b1, b3)) as f16x2 or bf16x2: a ``ldmatrix.trans`` register
    of byte pairs regrouped into pairs along the transposed axis."""
    text = (
        "{\n\t" + _DECLS + "prmt.b32 pr, $2, $2, 0x3120;\n\t" + "mov.b32 {lo, hi}, pr;\n\t"
        + _e4m3x2_to("$0", "lo", bf16) + _e4m3x2_to("$1", "hi", bf16)
    )  # fmt: skip
    res = _asm(_struct(2, T.i32()), [_i32(x, loc, ip)], text + "}", "=r,=r,r")
    return _unpack(res, 2, T.i32(), Int32)


@dsl_user_op
def f32x2_to_e4m3_pair(lo, hi, *, loc=None, ip=None):
    """(lo, hi) fp32 -> e4m3 with cvt.rn.satfinite (the spec's P rounding), returned widened to f16x2."""
    text = "{\n\t.reg .b16 t;\n\tcvt.rn.satfinite.e4m3x2.f32 t, $2, $1;\n\tcvt.rn.f16x2.e4m3x2 $0, t;\n\t}"
    return Int32(_asm(T.i32(), [_f32(lo, loc, ip), _f32(hi, loc, ip)], text, "=r,f,f"))


@dsl_user_op
def f32x2_to_bf16_pair(lo, hi, *, loc=None, ip=None):
    """(lo, hi) fp32 -> bf16x2, round to nearest even."""
    return Int32(_asm(T.i32(), [_f32(lo, loc, ip), _f32(hi, loc, ip)], "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f"))


@dsl_user_op
def ld_shared_b32(smem_addr, *, loc=None, ip=None):
    return Int32(_asm(T.i32(), [_i32(smem_addr, loc, ip)], "ld.shared.b32 $0, [$1];", "=r,r", True))


@dsl_user_op
def ld_shared_v2_b32(smem_addr, *, loc=None, ip=None):
    res = _asm(_struct(2, T.i32()), [_i32(smem_addr, loc, ip)], "ld.shared.v2.b32 {$0, $1}, [$2];", "=r,=r,r", True)
    return _unpack(res, 2, T.i32(), Int32)


@dsl_user_op
def ld_shared_v4_b32(smem_addr, *, loc=None, ip=None):
    """Four 32-bit words at a 16-byte aligned shared-memory address."""
    res = _asm(_struct(4, T.i32()), [_i32(smem_addr, loc, ip)], "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];",
               "=r,=r,=r,=r,r", True)  # fmt: skip
    return _unpack(res, 4, T.i32(), Int32)


@dsl_user_op
def ld_shared_u8(smem_addr, *, loc=None, ip=None):
    return Int32(_asm(T.i32(), [_i32(smem_addr, loc, ip)], "ld.shared.u8 $0, [$1];", "=r,r", True))


@dsl_user_op
def ld_shared_f32(smem_addr, *, loc=None, ip=None):
    return Float32(_asm(T.f32(), [_i32(smem_addr, loc, ip)], "ld.shared.f32 $0, [$1];", "=f,r", True))


@dsl_user_op
def ld_shared_v4_f32(smem_addr, *, loc=None, ip=None):
    """Four consecutive fp32 values at a 16-byte aligned shared-memory address."""
    res = _asm(_struct(4, T.f32()), [_i32(smem_addr, loc, ip)], "ld.shared.v4.f32 {$0, $1, $2, $3}, [$4];",
               "=f,=f,=f,=f,r", True)  # fmt: skip
    return _unpack(res, 4, T.f32(), Float32)


@dsl_user_op
def st_shared_f32(smem_addr, value, *, loc=None, ip=None):
    _asm(None, [_i32(smem_addr, loc, ip), _f32(value, loc, ip)], "st.shared.f32 [$0], $1;", "r,f", side_effects=True)


@dsl_user_op
def st_shared_v4_b32(smem_addr, v0, v1, v2, v3, *, loc=None, ip=None):
    _asm(
        None,
        [_i32(smem_addr, loc, ip)] + [_i32(x, loc, ip) for x in (v0, v1, v2, v3)],
        "st.shared.v4.b32 [$0], {$1, $2, $3, $4};",
        "r,r,r,r,r",
        side_effects=True,
    )


# -- NVFP4 codes -> e4m3 bytes by a per-block table ------------------------------------------------
_F16X2_POW2 = {4: 0x4C004C00, 6: 0x54005400}  # (2^k, 2^k) as f16x2, for SCALED_KV_EXPONENT's k
# NVFP4: per block of 16 codes, e4m3(m * scale * 2^-3) for the eight e2m1 magnitudes m (0, 0.5, 1, 1.5 |
# 2, 3, 4, 6) is made once, by four f16x2 products (exact: at most 6 significant bits, 2^-13 .. 336) and
# one rounding each (the spec's), into the two table words that e2m1's byte-permute lookup reads. Every
# entry carries the scale's sign (m = 0 included: 0 * s is -0 for a negative s), and e4m3 rounding is
# sign-symmetric, so XOR-ing the code's sign bit into the looked-up byte gives the product's sign, as
# IEEE multiplication does.
NVFP4_MAG_F16X2 = (0x2C000000, 0x32003000, 0x36003400, 0x3A003800)  # (lo | hi << 16): m * 2^-3 as f16


def f16x2_pow2(k: int) -> int:
    """The f16x2 register value (2^k, 2^k) for the exponents used here."""
    return _F16X2_POW2[k]


@dsl_user_op
def nvfp4_block_table(scale_byte, *, loc=None, ip=None):
    """A block's e4m3 scale byte s -> the two table words of ``e2m1x8_to_e4m3x8``: the e4m3 bytes of
    e4m3(m * s * 2^-3) for m = 0, 0.5, 1, 1.5 (word 0) and 2, 3, 4, 6 (word 1)."""
    text = "{\n\t.reg .b32 a, t<4>;\n\t.reg .b16 lo, hi, e<4>;\n\t"
    text += "prmt.b32 a, $2, $2, 0x0000;\n\tmov.b32 {lo, hi}, a;\n\t"
    text += "cvt.rn.f16x2.e4m3x2 a, lo;\n\t"  # (s, s) as f16x2
    for i, c in enumerate(NVFP4_MAG_F16X2):
        text += f"mov.b32 t{i}, {c:#x};\n\tmul.rn.f16x2 t{i}, t{i}, a;\n\tcvt.rn.satfinite.e4m3x2.f16x2 e{i}, t{i};\n\t"
    text += "mov.b32 $0, {e0, e1};\n\tmov.b32 $1, {e2, e3};\n\t}"
    res = _asm(_struct(2, T.i32()), [_i32(scale_byte, loc, ip)], text, "=r,=r,r")
    return _unpack(res, 2, T.i32(), Int32)


E2M1_SIGN_SELECTORS = (0xD9C8, 0xFBEA)  # prmt(w << 4, w, sel), sign-replicate mode: codes 0-3, codes 4-7


@dsl_user_op
def e2m1x8_to_e4m3x8(w, table, *, loc=None, ip=None):
    """Eight e2m1 codes (code i in bits 4i .. 4i + 3) -> two words of e4m3 bytes by byte permutes: the
    magnitudes index an 8-byte table (prmt), the signs come from prmt's sign-replicate mode (w << 4 puts
    the even codes' sign bits at byte msbs, w itself the odd codes', XOR-ed into the looked-up bytes).
    ``table``: two words of e4m3 bytes for the magnitudes 0, 0.5, 1, 1.5 | 2, 3, 4, 6 (NVFP4's, signed
    like the block scale, from ``nvfp4_block_table``)."""
    sg0, sg1 = E2M1_SIGN_SELECTORS
    ops = [_i32(w, loc, ip)] + [_i32(x, loc, ip) for x in table]
    setup = "mov.b32 l0, $3;\n\tmov.b32 l1, $4;\n\t"
    text = (
        "{\n\t.reg .b32 w4, sel, mag, sgn, l0, l1;\n\t" + setup + "shl.b32 w4, $2, 4;\n\t"
        "and.b32 sel, $2, 0x7777;\n\tprmt.b32 mag, l0, l1, sel;\n\t"
        f"prmt.b32 sgn, w4, $2, {sg0:#x};\n\tand.b32 sgn, sgn, 0x80808080;\n\txor.b32 $0, mag, sgn;\n\t"
        "shr.b32 sel, $2, 16;\n\tand.b32 sel, sel, 0x7777;\n\tprmt.b32 mag, l0, l1, sel;\n\t"
        f"prmt.b32 sgn, w4, $2, {sg1:#x};\n\tand.b32 sgn, sgn, 0x80808080;\n\txor.b32 $1, mag, sgn;\n\t}}"
    )
    res = _asm(_struct(2, T.i32()), ops, text, "=r,=r,r,r,r")
    return _unpack(res, 2, T.i32(), Int32)


# -- sub-byte codes -> e4m3 bytes of value * 2^-k, by bit placement alone --------------------------
# Every e2m1, e3m2 and e2m3 value times 2^-k is an e4m3 value whose byte is the code's own bits moved:
# the magnitude bits (exponent and mantissa fields) shifted into e4m3's low exponent bits and top mantissa
# bits, the sign to bit 7. The subnormals line up too (e2m1 / e2m3 subnormals are e4m3 subnormals at
# k = 6, e3m2 at k = 4), so no table and no rounding is needed. The kernel multiplies Q and P (as f16, by
# 2^k: exact) to undo the factor, so every product q k and p v is the same real number as with the exact
# bytes and the MMAs return the same bits.
SCALED_KV_EXPONENT = {"e2m1": 6, "e3m2": 4, "e2m3": 6}
# e2m1, eight codes in a word: the even codes (low nibbles) and the odd codes (high nibbles) each become
# four bytes -- magnitude (bits 0-2 of the code) to bits 2-4, sign (bit 3) to bit 7 -- then two byte
# permutes interleave them back into code order. (shift left, mask) of each term; a negative shift is a
# right shift.
E2M1_SCALED_EVEN = ((2, 0x1C1C1C1C), (4, 0x80808080))
E2M1_SCALED_ODD = ((-2, 0x1C1C1C1C), (0, 0x80808080))
E2M1_SCALED_INTERLEAVE = (0x5140, 0x7362)  # prmt(even, odd, sel): codes 0-3 | codes 4-7
# fp6, a 3-byte group of four codes (bits 6i .. 6i + 5): code i's five magnitude bits move 2i to byte i's
# bits 0-4 (e2m3) or 2i + 1 to bits 1-5 (e3m2, whose magnitude sits one bit higher in e4m3), and its sign
# 2i + 2 to bit 7, by a shift network: every code moves by 4 or 0 (codes 2, 3 or 0, 1), then by 2 or 0
# (codes 1, 3 or 0, 2), each step one shift and one lop3 that selects per bit between the shifted and the
# unshifted word; a last shift by 2 (e2m3) or 1 (e3m2) lifts every sign to bit 7, and one lop3 keeps the
# magnitudes and the signs. e3m2 first shifts the whole group left by 1. 7 instructions per group (e2m3), 8
# (e3m2), in one dependent chain. Garbage bits (the gathered word's fourth byte, the neighbours' bits next to a
# code) land only where the last masks drop them. (One shift-and-mask term per distinct shift, OR-ed, takes
# 13-15 instructions per group in short chains; it was faster at d = 128 with the warps converting between
# their MMAs, which the converter warps replaced: reports/hopper/2026-12-07-fp6-shift-network-gpu.md.)
FP6_GROUP_SELECTORS = (0x0543, 0x0432)  # prmt: bytes 3-5 (w0.b3, w1.b0, w1.b1) and 6-8 (w1.b2, w1.b3, w2.b0)
LOP3_SELECT = 0xE4  # lop3 immLut of (a & c) | (b & ~c): c picks a's bits, the rest come from b
LOP3_AND_OR = 0xEA  # lop3 immLut of (a & b) | c
FP6_SIGNS = 0x80808080


def fp6_network(e3m2: bool) -> dict:
    """The shift network's constants for e3m2 (magnitude to bits 1-5) or e2m3 (bits 0-4): the pre-shift,
    the two steps' (shift, select mask), the sign shift and the magnitude mask."""
    o = 1 if e3m2 else 0
    return {
        "pre_shift": o,
        "steps": ((4, 0xFFF << (16 + o)), (2, (0x3F << (8 + o)) | (0x3F << (24 + o)))),
        "sign_shift": 2 - o,
        "mag_mask": 0x1F1F1F1F << o,
    }


def fp6x16_ptx(e3m2: bool) -> str:
    """The PTX of ``fp6x16_to_e4m3x16_scaled``: inputs $4, $5, $6 (the words w0, w1, w2 of 16 codes),
    outputs $0 .. $3 (code group g's four e4m3 bytes in $g), by the shift network. The tests interpret
    this text."""
    s1, s2 = FP6_GROUP_SELECTORS
    text = "{\n\t.reg .b32 v<4>, x, a;\n\t"
    text += f"mov.b32 v0, $4;\n\tprmt.b32 v1, $4, $5, {s1:#x};\n\tprmt.b32 v2, $5, $6, {s2:#x};\n\t"
    text += "mul.hi.u32 v3, $6, 0x1000000;\n\t"  # w2 >> 8 on the FMA pipe
    net = fp6_network(e3m2)
    for g in range(4):
        src = f"v{g}"
        if net["pre_shift"]:
            text += f"shl.b32 x, v{g}, {net['pre_shift']};\n\t"
            src = "x"
        for shift, mask in net["steps"]:
            text += f"shl.b32 a, {src}, {shift};\n\tlop3.b32 x, a, {src}, {mask:#x}, {LOP3_SELECT:#x};\n\t"
            src = "x"
        text += f"shl.b32 a, x, {net['sign_shift']};\n\tand.b32 a, a, {FP6_SIGNS:#x};\n\t"
        text += f"lop3.b32 ${g}, x, {net['mag_mask']:#x}, a, {LOP3_AND_OR:#x};\n\t"
    return text + "}"


def _shift_and(dst: str, src: str, shift: int, mask: int) -> str:
    if shift > 0:
        return f"shl.b32 {dst}, {src}, {shift};\n\tand.b32 {dst}, {dst}, {mask:#x};\n\t"
    if shift < 0:  # a right shift as the high word of a product: the FMA pipe instead of the ALU pipe
        return f"mul.hi.u32 {dst}, {src}, {1 << (32 + shift):#x};\n\tand.b32 {dst}, {dst}, {mask:#x};\n\t"
    return f"and.b32 {dst}, {src}, {mask:#x};\n\t"


@dsl_user_op
def e2m1x8_to_e4m3x8_scaled(w, *, ordered: bool = True, loc=None, ip=None):
    """Eight e2m1 codes (code i in bits 4i .. 4i + 3) -> two words of e4m3 bytes of value * 2^-6 (codes
    4k .. 4k + 3 in word k) by shifts, masks and two byte permutes (``E2M1_SCALED_*``). ``ordered=False``
    skips the permutes: the even codes 0, 2, 4, 6 in the first word, the odd codes in the second."""
    text = "{\n\t.reg .b32 ev, od, t;\n\t"
    for name, terms in (("ev", E2M1_SCALED_EVEN), ("od", E2M1_SCALED_ODD)):
        (s0, m0), (s1, m1) = terms
        text += _shift_and(name, "$2", s0, m0) + _shift_and("t", "$2", s1, m1) + f"or.b32 {name}, {name}, t;\n\t"
    if ordered:
        lo, hi = E2M1_SCALED_INTERLEAVE
        text += f"prmt.b32 $0, ev, od, {lo:#x};\n\tprmt.b32 $1, ev, od, {hi:#x};\n\t}}"
    else:
        text += "mov.b32 $0, ev;\n\tmov.b32 $1, od;\n\t}"
    res = _asm(_struct(2, T.i32()), [_i32(w, loc, ip)], text, "=r,=r,r")
    return _unpack(res, 2, T.i32(), Int32)


@dsl_user_op
def fp6x16_to_e4m3x16_scaled(w0, w1, w2, *, e3m2: bool, loc=None, ip=None):
    """Sixteen fp6 codes (a little-endian bitstream: code i at bits 6i .. 6i + 5 of the 12 bytes
    w0 | w1 | w2; the four 3-byte groups gathered by ``FP6_GROUP_SELECTORS``) -> four words of e4m3
    bytes of value * 2^-k (k = ``SCALED_KV_EXPONENT``: 4 for e3m2, 6 for e2m3) by ``fp6x16_ptx``, the shift
    network."""
    text = fp6x16_ptx(e3m2)
    res = _asm(_struct(4, T.i32()), [_i32(x, loc, ip) for x in (w0, w1, w2)], text, "=r,=r,=r,=r,r,r,r")
    return _unpack(res, 4, T.i32(), Int32)


@dsl_user_op
def f16x2_times_pow2(x, k: int, *, loc=None, ip=None):
    """An f16x2 pair times 2^k (``mul.rn.f16x2``): exact for k >= 0 unless a product overflows."""
    c = f16x2_pow2(k)
    text = f"{{\n\t.reg .b32 c;\n\tmov.b32 c, {c:#x};\n\tmul.rn.f16x2 $0, $1, c;\n\t}}"
    return Int32(_asm(T.i32(), [_i32(x, loc, ip)], text, "=r,r"))


# -- misc ------------------------------------------------------------------------------------------
@dsl_user_op
def prmt(a, b, selector: int, *, loc=None, ip=None):
    """``prmt.b32``: byte i of the result is byte ``(selector >> 4 i) & 7`` of (b:a), a's bytes 0-3."""
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip)], f"prmt.b32 $0, $1, $2, {selector:#x};", "=r,r,r"))


__all__ = [
    "ldmatrix_x4",
    "mma_m16n8k16",
    "l2_evict_first_policy",
    "cp_async_16",
    "cp_async_8",
    "ld_global_b32",
    "ld_global_v2_b32",
    "st_shared_b32",
    "st_global_v2_b32",
    "st_global_v4_f32",
    "e4m3x4_to_pairs",
    "e4m3x4_to_pairs_transposed",
    "f32x2_to_e4m3_pair",
    "f32x2_to_bf16_pair",
    "ld_shared_b32",
    "ld_shared_v2_b32",
    "ld_shared_v4_b32",
    "ld_shared_u8",
    "ld_shared_f32",
    "ld_shared_v4_f32",
    "st_shared_f32",
    "st_shared_v4_b32",
    "f16x2_pow2",
    "nvfp4_block_table",
    "e2m1x8_to_e4m3x8",
    "e2m1x8_to_e4m3x8_scaled",
    "fp6x16_to_e4m3x16_scaled",
    "f16x2_times_pow2",
    "prmt",
    "NVFP4_MAG_F16X2",
    "E2M1_SIGN_SELECTORS",
    "SCALED_KV_EXPONENT",
    "E2M1_SCALED_EVEN",
    "E2M1_SCALED_ODD",
    "E2M1_SCALED_INTERLEAVE",
    "FP6_GROUP_SELECTORS",
    "FP6_SIGNS",
    "LOP3_SELECT",
    "LOP3_AND_OR",
    "fp6_network",
    "fp6x16_ptx",
]
