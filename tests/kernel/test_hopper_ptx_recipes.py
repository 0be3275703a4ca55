"""The bit recipes behind the Hopper kernel's sub-byte -> e4m3 conversions (mjolnir_kernel.hopper.ptx),
replayed on the CPU for every code: NVFP4's per-block table of e4m3(m * scale / 8) with the sign selectors
of its byte-permute lookup, the byte selectors that gather fp6 code groups, and the scaled conversions of
e2m1, e3m2 and e2m3 (``HopperConfig.scaled_kv``): the shifts and masks that make each code's e4m3 byte of
value * 2^-k, and the f16 powers of two that Q and P carry.
The PTX itself runs in the H200 conformance tests; these pin the constants it is built from to the
formats' definitions."""

import numpy as np
import pytest
import torch

from mjolnir_kernel.hopper.ptx import (
    E2M1_SCALED_EVEN,
    E2M1_SCALED_INTERLEAVE,
    E2M1_SCALED_ODD,
    E2M1_SIGN_SELECTORS,
    FP6_GROUP_SELECTORS,
    FP6_SCALED_MAG,
    FP6_SCALED_TERMS,
    NVFP4_MAG_F16X2,
    SCALED_KV_EXPONENT,
    f16x2_pow2,
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


def _fp6_blocks(seed: int, trials: int = 600):
    """(the four 3-byte code groups the kernel gathers with FP6_GROUP_SELECTORS, the 16 codes) of 12 bytes
    of a little-endian fp6 bitstream: all ones first, then random bytes."""
    sel1, sel2 = FP6_GROUP_SELECTORS
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        raw = rng.integers(0, 256, 12, dtype=np.uint8) if trial else np.full(12, 0xFF, dtype=np.uint8)
        w0, w1, w2 = (int(x) for x in raw.view("<u4"))
        stream = int.from_bytes(raw.tobytes(), "little")
        yield [w0, _prmt(w0, w1, sel1), _prmt(w1, w2, sel2), w2 >> 8], [(stream >> (6 * i)) & 63 for i in range(16)]


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


@pytest.mark.parametrize("fmt", ["e3m2", "e2m3"])
def test_fp6_scaled_conversion(fmt):
    """16 codes in 12 bytes -> the four 3-byte groups (as for the exact conversion) -> per group the
    shift-and-mask terms (e3m2: magnitude doubled by r + (r & mask)) -> the e4m3 byte of value * 2^-k of
    every code, -0 included; the group's fourth byte (another group's bits) never reaches the result."""
    want = _e4m3_bytes(_values(fmt) * 2.0 ** -SCALED_KV_EXPONENT[fmt])
    for groups, codes in _fp6_blocks(3):
        got = []
        for v in groups:
            r = _terms(v, FP6_SCALED_TERMS)
            if fmt == "e3m2":
                r = (r + (r & FP6_SCALED_MAG)) & 0xFFFFFFFF
            got += [(r >> (8 * i)) & 0xFF for i in range(4)]
        assert got == [want[c] for c in codes]
