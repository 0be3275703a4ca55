"""The bit recipes behind the Hopper kernel's sub-byte -> e4m3 conversions (mjolnir_kernel.hopper.ptx),
replayed on the CPU for every code: NVFP4's per-block table of e4m3(m * scale / 8) with the sign selectors
of its byte-permute lookup, the byte selectors that gather fp6 code groups, and the scaled conversions of
e2m1, e3m2 and e2m3 (``HopperConfig.scaled_kv``): the shifts and masks that make each code's e4m3 byte of
value * 2^-k, and the f16 powers of two that Q and P carry. The fp6 conversion's PTX text itself is
interpreted here, instruction by instruction, on every 24-bit code group. The PTX also runs in the GPU
conformance tests; these pin it and the constants it is built from to the formats' definitions."""

import numpy as np
import pytest
import torch

from mjolnir_kernel.hopper.ptx import (
    E2M1_SCALED_EVEN,
    E2M1_SCALED_INTERLEAVE,
    E2M1_SCALED_ODD,
    E2M1_SIGN_SELECTORS,
    FP6_GROUP_SELECTORS,
    NVFP4_MAG_F16X2,
    SCALED_KV_EXPONENT,
    f16x2_pow2,
    fp6x16_ptx,
)
from mjolnir_numerics.formats import E4M3, get_format
from mjolnir_numerics.quantize import quantize


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte (sel nibble i & 7) of {b, a}; with the
    nibble's bit 3 set, that byte's sign bit replicated."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        n = (sel >> (4 * i)) & 0xF
        v = src[n & 7]
        if n & 8:
            v = 0xFF if v & 0x80 else 0
        out |= v << (8 * i)
    return out


def _values(fmt: str) -> np.ndarray:
    return np.asarray(torch.as_tensor(get_format(fmt).values(), dtype=torch.float64))


def _e4m3_bytes(x: np.ndarray) -> list:
    return quantize(torch.as_tensor(x, dtype=torch.float64), E4M3).tolist()


def _e2m1_words(seed: int) -> list:
    """Words of eight e2m1 codes: all zeros, all ones, every sign bit alone, both code orders, 2000 random."""
    rng = np.random.default_rng(seed)
    return [0, 0xFFFFFFFF, 0x88888888, 0x76543210, 0xFEDCBA98] + [int(w) for w in rng.integers(0, 2**32, 2000)]


@pytest.mark.parametrize("k", sorted(set(SCALED_KV_EXPONENT.values())))
def test_f16x2_powers_of_two(k):
    assert f16x2_pow2(k) == (np.float16(2.0**k).view(np.uint16).item() * 0x10001)


def test_nvfp4_block_table_gives_e4m3_of_code_times_scale():
    """For every finite e4m3 block scale s: the table nvfp4_block_table builds (f16 products of the halves
    of NVFP4_MAG_F16X2 with s, rounded by cvt.rn.satfinite.e4m3x2.f16x2), looked up by e2m1's byte
    permutes with the code's sign bit XOR-ed in, gives the spec's e4m3(code * fp32(s) * 2^-3) for all 16
    codes, signed zeros included; the f16 products are exact, so that one rounding is the spec's."""
    halves = np.array([[c & 0xFFFF, c >> 16] for c in NVFP4_MAG_F16X2], dtype=np.uint16).view(np.float16).ravel()
    e2m1 = _values("e2m1")
    np.testing.assert_array_equal(halves.astype(np.float64), e2m1[:8] * 2.0**-3)
    sel0, sel1 = E2M1_SIGN_SELECTORS
    scales = E4M3.values().double().numpy()
    tested = 0
    for sbyte in range(256):
        if not np.isfinite(scales[sbyte]):
            continue
        scale = np.float16(scales[sbyte])
        prod16 = halves * scale  # mul.rn.f16x2
        np.testing.assert_array_equal(prod16.astype(np.float64), e2m1[:8] * 2.0**-3 * float(scale))
        assert (np.signbit(prod16) == bool(sbyte & 0x80)).all()
        table = _e4m3_bytes(prod16.astype(np.float64))
        lo = table[0] | table[1] << 8 | table[2] << 16 | table[3] << 24
        hi = table[4] | table[5] << 8 | table[6] << 16 | table[7] << 24
        want = _e4m3_bytes(e2m1 * scales[sbyte] * 2.0**-3)
        for w in (0x76543210, 0xFEDCBA98):
            w4 = (w << 4) & 0xFFFFFFFF
            o0 = _prmt(lo, hi, w & 0x7777) ^ (_prmt(w4, w, sel0) & 0x80808080)
            o1 = _prmt(lo, hi, (w >> 16) & 0x7777) ^ (_prmt(w4, w, sel1) & 0x80808080)
            got = [(o0 >> (8 * i)) & 0xFF for i in range(4)] + [(o1 >> (8 * i)) & 0xFF for i in range(4)]
            assert got == [want[(w >> (4 * j)) & 15] for j in range(8)], (hex(sbyte), hex(w))
        tested += 1
    assert tested == 254  # every e4m3 byte but the two NaNs


def _terms(w: int, terms) -> int:
    """OR of (w shifted left by s, or right by -s) & mask over the (s, mask) terms, in 32 bits."""
    out = 0
    for shift, mask in terms:
        out |= ((w << shift) if shift >= 0 else (w >> -shift)) & mask
    return out & 0xFFFFFFFF


@pytest.mark.parametrize("fmt", sorted(SCALED_KV_EXPONENT))
def test_scaled_bytes_are_the_values_times_a_power_of_two(fmt):
    """Every code's value times 2^-k is an e4m3 value (subnormals included), so the scaled conversion
    loses nothing, and Q and P times 2^k (f16, below 65504) give back every product exactly."""
    k = SCALED_KV_EXPONENT[fmt]
    values = _values(fmt)
    scaled = torch.as_tensor(values * 2.0**-k)
    back = E4M3.values().double()[quantize(scaled, E4M3).long()].numpy()
    np.testing.assert_array_equal(back, values * 2.0**-k)
    assert 448 * 2.0**k < 65504  # the largest e4m3 Q or P times 2^k is still a finite f16
    assert f16x2_pow2(k) == (np.float16(2.0**k).view(np.uint16).item() * 0x10001)


def test_e2m1_scaled_conversion():
    """Even codes (low nibbles) and odd codes (high nibbles) through their shift-and-mask terms, then the
    two interleaving byte permutes -> the e4m3 byte of value * 2^-6 of every code in code order."""
    want = _e4m3_bytes(_values("e2m1") * 2.0 ** -SCALED_KV_EXPONENT["e2m1"])
    lo_sel, hi_sel = E2M1_SCALED_INTERLEAVE
    for w in _e2m1_words(2):
        ev, od = _terms(w, E2M1_SCALED_EVEN), _terms(w, E2M1_SCALED_ODD)
        o0, o1 = _prmt(ev, od, lo_sel), _prmt(ev, od, hi_sel)
        got = [(o0 >> (8 * i)) & 0xFF for i in range(4)] + [(o1 >> (8 * i)) & 0xFF for i in range(4)]
        assert got == [want[(w >> (4 * j)) & 15] for j in range(8)], hex(w)


_U32 = 0xFFFFFFFF


def _np_prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    """``_prmt`` (default mode, no sign replication) on uint32 arrays."""
    out = np.zeros_like(a)
    for i in range(4):
        n = (sel >> (4 * i)) & 0xF
        assert not n & 8, "sign-replicate mode is not used by the fp6 conversion"
        src = a if n < 4 else b
        out |= ((src >> np.uint32(8 * (n & 3))) & np.uint32(0xFF)) << np.uint32(8 * i)
    return out


def _lop3(a: np.ndarray, b: np.ndarray, c: np.ndarray, lut: int) -> np.ndarray:
    """PTX lop3.b32: bit j of the result is bit (4 a_j + 2 b_j + c_j) of the 8-bit truth table ``lut``,
    the table of F(0xF0, 0xCC, 0xAA)."""
    out = np.zeros_like(a)
    for idx in range(8):
        if lut >> idx & 1:
            ma = a if idx & 4 else ~a
            mb = b if idx & 2 else ~b
            mc = c if idx & 1 else ~c
            out |= ma & mb & mc
    return out


def _run_ptx(text: str, inputs: dict) -> dict:
    """Interpret the integer PTX of the sub-byte conversions on uint32 arrays: mov, prmt (default mode),
    mul.hi.u32, shl, shr, and, or, add.u32 and lop3 on .b32 registers, immediates and $n operands.
    ``inputs`` maps '$n' to arrays; returns every register written, outputs included."""
    regs = dict(inputs)

    def val(tok):
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        if tok.startswith("$") or tok[0].isalpha():
            raise KeyError(f"read before write: {tok}")
        return np.uint32(int(tok, 0))

    body = text.strip().removeprefix("{").removesuffix("}")
    for line in (ln.strip() for ln in body.split(";")):
        if not line or line.startswith(".reg"):
            continue
        op, _, rest = line.partition(" ")
        args = [a.strip() for a in rest.split(",")]
        dst, srcs = args[0], [val(a) for a in args[1:]]
        if op == "mov.b32":
            out = srcs[0]
        elif op == "prmt.b32":
            out = _np_prmt(srcs[0], srcs[1], int(args[3], 0))
        elif op == "mul.hi.u32":
            out = ((srcs[0].astype(np.uint64) * np.uint64(int(srcs[1]))) >> np.uint64(32)).astype(np.uint32)
        elif op == "shl.b32":
            out = srcs[0] << np.uint32(int(args[2], 0))
        elif op == "shr.b32":
            out = srcs[0] >> np.uint32(int(args[2], 0))
        elif op == "and.b32":
            out = srcs[0] & srcs[1]
        elif op == "or.b32":
            out = srcs[0] | srcs[1]
        elif op == "add.u32":
            out = srcs[0] + srcs[1]
        elif op == "lop3.b32":
            a, b, c = (np.broadcast_to(np.asarray(x, dtype=np.uint32), srcs[0].shape) for x in srcs[:3])
            out = _lop3(a, b, c, int(args[4], 0))
        else:
            raise NotImplementedError(f"PTX op {op!r} in {line!r}")
        regs[dst] = np.asarray(out, dtype=np.uint32) & np.uint32(_U32)
    return regs


def _fp6_words_with_group(pos: int, groups: np.ndarray, rng) -> tuple:
    """Words w0, w1, w2 of 12-byte fp6 blocks whose code group ``pos`` (bits 24 pos .. 24 pos + 23 of the
    little-endian stream) holds ``groups`` and every other byte is random."""
    w = [rng.integers(0, 2**32, groups.size, dtype=np.uint64).astype(np.uint32) for _ in range(3)]
    g = groups.astype(np.uint32)
    lo_bit = 24 * pos
    for k in range(3):  # word k holds stream bits 32 k .. 32 k + 31
        lo, hi = max(lo_bit, 32 * k), min(lo_bit + 24, 32 * k + 32)
        if lo >= hi:
            continue
        width = hi - lo
        mask = np.uint32(((1 << width) - 1) << (lo - 32 * k))
        part = ((g >> np.uint32(lo - lo_bit)) << np.uint32(lo - 32 * k)) & mask
        w[k] = (w[k] & ~mask) | part
    return tuple(w)


@pytest.mark.parametrize("fmt", ["e3m2", "e2m3"])
@pytest.mark.parametrize("pos", range(4))
def test_fp6_conversion_ptx_on_every_code_group(fmt, pos):
    """The kernel's fp6 PTX (``fp6x16_ptx``, the shift network), interpreted on every one of the
    2^24 code groups in block position ``pos`` (the other 9 bytes random), gives in output word ``pos`` the
    e4m3 bytes of value * 2^-k of the group's four codes, -0 included: garbage bits never reach the result."""
    want = np.array(_e4m3_bytes(_values(fmt) * 2.0 ** -SCALED_KV_EXPONENT[fmt]), dtype=np.uint32)
    groups = np.arange(1 << 24, dtype=np.uint32)
    w0, w1, w2 = _fp6_words_with_group(pos, groups, np.random.default_rng(10 + pos))
    regs = _run_ptx(fp6x16_ptx(fmt == "e3m2"), {"$4": w0, "$5": w1, "$6": w2})
    expect = np.zeros_like(groups)
    for j in range(4):
        expect |= want[(groups >> np.uint32(6 * j)) & np.uint32(63)] << np.uint32(8 * j)
    got = regs[f"${pos}"]
    bad = np.flatnonzero(got != expect)
    assert bad.size == 0, f"{bad.size} groups differ, first {hex(int(groups[bad[0]]))}: {hex(int(got[bad[0]]))}"


@pytest.mark.parametrize("fmt", ["e3m2", "e2m3"])
def test_fp6_conversion_ptx_on_blocks(fmt):
    """The same PTX on whole 12-byte blocks (all four groups at once, the block of all ones first): the 16
    codes of the bitstream, in order, as e4m3 bytes of value * 2^-k; the interpreter's prmt agrees with
    the scalar ``_prmt`` the NVFP4 test uses."""
    want = _e4m3_bytes(_values(fmt) * 2.0 ** -SCALED_KV_EXPONENT[fmt])
    rng = np.random.default_rng(3)
    raws = [np.full(12, 0xFF, dtype=np.uint8)] + [rng.integers(0, 256, 12, dtype=np.uint8) for _ in range(599)]
    words = np.stack([r.view("<u4") for r in raws]).astype(np.uint32)
    regs = _run_ptx(fp6x16_ptx(fmt == "e3m2"), {"$4": words[:, 0], "$5": words[:, 1], "$6": words[:, 2]})
    sel1, sel2 = FP6_GROUP_SELECTORS
    for n, raw in enumerate(raws):
        w0, w1, w2 = (int(x) for x in raw.view("<u4"))
        assert int(regs["v1"][n]) == _prmt(w0, w1, sel1) and int(regs["v2"][n]) == _prmt(w1, w2, sel2)
        stream = int.from_bytes(raw.tobytes(), "little")
        got = [(int(regs[f"${g}"][n]) >> (8 * i)) & 0xFF for g in range(4) for i in range(4)]
        assert got == [want[(stream >> (6 * i)) & 63] for i in range(16)]
