"""Sub-byte packing: round trips, the documented bit positions, and clear errors.

Layouts (docs/numerics.md, "Packing"): fp4 puts element 2i in the low nibble of byte i; fp6 is a
little-endian bitstream, element i at bits [6i, 6i + 6), four codes in three bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import cuda_only
from hypothesis import given, settings
from hypothesis import strategies as st

from mjolnir_numerics import pack, packed_size, unpack

CODES_PER_GROUP = {8: 1, 6: 4, 4: 2}  # codes that fill whole bytes at each width


def bitstream_pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Independent packer: write every code's bits LSB first into one bitstream, cut it into bytes."""
    lead, d = codes.shape[:-1], codes.shape[-1]
    stream = ((codes[..., :, None].astype(np.uint16) >> np.arange(bits)) & 1).astype(np.uint8)
    stream = stream.reshape(*lead, d * bits)
    return np.packbits(stream, axis=-1, bitorder="little")


@st.composite
def codes_and_bits(draw):
    bits = draw(st.sampled_from([8, 6, 4]))
    lead = draw(st.lists(st.integers(0, 3), max_size=3))
    d = CODES_PER_GROUP[bits] * draw(st.integers(0, 12))
    seed = draw(st.integers(0, 2**32 - 1))
    codes = np.random.default_rng(seed).integers(0, 1 << bits, size=(*lead, d), dtype=np.uint8)
    return torch.from_numpy(codes), bits


@settings(max_examples=150, deadline=None)
@given(cb=codes_and_bits())
def test_pack_unpack_round_trip(cb):
    codes, bits = cb
    packed = pack(codes, bits)
    d = codes.shape[-1]
    assert packed.dtype == torch.uint8
    assert packed.shape == (*codes.shape[:-1], d * bits // 8)
    assert packed.shape[-1] == packed_size(d, bits)
    assert torch.equal(unpack(packed, bits), codes)


@settings(max_examples=100, deadline=None)
@given(cb=codes_and_bits())
def test_pack_matches_an_independent_little_endian_bitstream(cb):
    codes, bits = cb
    np.testing.assert_array_equal(pack(codes, bits).numpy(), bitstream_pack(codes.numpy(), bits))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64, torch.int16])
def test_pack_accepts_any_integer_dtype(dtype):
    codes = torch.tensor([[1, 2, 3, 4], [60, 61, 62, 63]], dtype=dtype)
    assert torch.equal(pack(codes, 6), pack(codes.to(torch.uint8), 6))


# ---------------------------------------------------------------------------------------------------
# hand-written bytes
# ---------------------------------------------------------------------------------------------------
FP4_CASES = [
    # codes (element 0 first) -> bytes; element 2i is the LOW nibble
    ([0x1, 0x2, 0x3, 0x4], [0x21, 0x43]),
    ([0xF, 0x0], [0x0F]),
    ([0x0, 0xF], [0xF0]),
    ([0x8, 0x6, 0xE, 0x7], [0x68, 0x7E]),
]
FP6_CASES = [
    # 24-bit little-endian word = c0 | c1 << 6 | c2 << 12 | c3 << 18, stored as bytes lo, mid, hi
    ([1, 2, 3, 4], [0x81, 0x30, 0x10]),  # 0x103081
    ([63, 0, 0, 0], [0x3F, 0x00, 0x00]),
    ([0, 63, 0, 0], [0xC0, 0x0F, 0x00]),  # bits 6..11
    ([0, 0, 63, 0], [0x00, 0xF0, 0x03]),  # bits 12..17
    ([0, 0, 0, 63], [0x00, 0x00, 0xFC]),  # bits 18..23
    ([0x20, 0x01, 0, 0, 0, 0, 0, 0x3F], [0x60, 0x00, 0x00, 0x00, 0x00, 0xFC]),  # two groups
]


@pytest.mark.parametrize("codes, expected", FP4_CASES)
def test_fp4_element_2i_is_the_low_nibble(codes, expected):
    packed = pack(torch.tensor(codes, dtype=torch.uint8), 4)
    assert packed.tolist() == expected
    assert unpack(torch.tensor(expected, dtype=torch.uint8), 4).tolist() == codes


@pytest.mark.parametrize("codes, expected", FP6_CASES)
def test_fp6_is_a_little_endian_bitstream_four_codes_in_three_bytes(codes, expected):
    packed = pack(torch.tensor(codes, dtype=torch.uint8), 6)
    assert packed.tolist() == expected
    assert unpack(torch.tensor(expected, dtype=torch.uint8), 6).tolist() == codes


def test_fp8_packing_is_one_byte_per_code_and_a_copy():
    codes = torch.tensor([[0, 0x7F, 0x80, 0xFF]], dtype=torch.uint8)
    packed = pack(codes, 8)
    assert torch.equal(packed, codes)
    assert packed.data_ptr() != codes.data_ptr()
    assert torch.equal(unpack(packed, 8), codes)


def test_packing_works_row_by_row():
    codes = torch.tensor([[1, 2, 3, 4], [63, 0, 0, 0]], dtype=torch.uint8)
    assert pack(codes, 6).tolist() == [[0x81, 0x30, 0x10], [0x3F, 0x00, 0x00]]


@pytest.mark.parametrize("bits, d, nbytes", [(8, 5, 5), (6, 16, 12), (6, 128, 96), (4, 128, 64), (4, 0, 0)])
def test_packed_size(bits, d, nbytes):
    assert packed_size(d, bits) == nbytes


# ---------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits, d", [(6, 2), (6, 6), (4, 3), (4, 1)])
def test_last_dim_that_does_not_fill_whole_bytes_raises(bits, d):
    with pytest.raises(
        ValueError, match=rf"^codes: last dim {d} does not fill whole bytes at {bits} bits.*multiple of"
    ):
        pack(torch.zeros(2, d, dtype=torch.uint8), bits)
    with pytest.raises(ValueError, match=rf"^d: {d} codes do not fill whole bytes"):
        packed_size(d, bits)


@pytest.mark.parametrize("bits, bad", [(6, 64), (4, 16), (4, 255), (6, -1)])
def test_codes_too_wide_for_the_bits_raise(bits, bad):
    codes = torch.tensor([0, bad, 0, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"^codes: values must be in 0\.\.{(1 << bits) - 1}"):
        pack(codes, bits)


@pytest.mark.parametrize("bits", [5, 16, 0])
def test_unsupported_bits_raise_naming_bits(bits):
    with pytest.raises(ValueError, match=r"^bits: .* is not one of 8, 6, 4"):
        pack(torch.zeros(4, dtype=torch.uint8), bits)
    with pytest.raises(ValueError, match=r"^bits: "):
        unpack(torch.zeros(4, dtype=torch.uint8), bits)


def test_float_bits_and_bad_sizes_are_refused_not_truncated():
    """4.0 is not the width 4 (it used to pass the membership test and fail inside the shifts)."""
    for fn in (lambda: pack(torch.zeros(4, dtype=torch.uint8), 4.0), lambda: unpack(torch.zeros(4, dtype=torch.uint8),
               6.0), lambda: packed_size(128, 4.0)):  # fmt: skip
        with pytest.raises(ValueError, match=r"^bits: 4.0 is not one of|^bits: 6.0 is not one of"):
            fn()
    with pytest.raises(TypeError, match=r"^d: expected an int, got 128.0"):
        packed_size(128.0, 4)
    with pytest.raises(ValueError, match=r"^d: expected an int >= 0, got -2"):
        packed_size(-2, 4)
    assert packed_size(np.int64(128), np.int32(4)) == 64


def test_float_or_scalar_codes_raise():
    with pytest.raises(ValueError, match=r"^codes: .*integer"):
        pack(torch.zeros(4), 4)
    with pytest.raises(ValueError, match=r"^codes: "):
        pack(torch.tensor(3, dtype=torch.uint8), 4)


def test_unpack_needs_uint8_bytes_and_whole_fp6_groups():
    with pytest.raises(ValueError, match=r"^packed: .*uint8"):
        unpack(torch.zeros(3, dtype=torch.int32), 6)
    with pytest.raises(ValueError, match=r"^packed: last dim 4 .*3-byte"):
        unpack(torch.zeros(4, dtype=torch.uint8), 6)


@cuda_only
@pytest.mark.parametrize("bits", [8, 6, 4])
def test_cuda_packs_like_cpu(bits):
    codes = torch.randint(0, 1 << bits, (7, 3, 64), dtype=torch.uint8)
    packed = pack(codes, bits)
    assert torch.equal(pack(codes.cuda(), bits).cpu(), packed)
    assert torch.equal(unpack(packed.cuda(), bits).cpu(), codes)
