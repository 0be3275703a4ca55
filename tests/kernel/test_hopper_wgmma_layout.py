"""The wgmma path's operand bookkeeping, replayed on the CPU (mjolnir_kernel/hopper/wgmma_kernel.py):
V^T's register fragments from ``ldmatrix.trans`` + ``prmt``, the P^T slot order S writes, and the
shared-memory descriptor bits. A wrong selector or slot formula here would pair P with the wrong V
rows on the GPU; these checks pin them without one."""

import pytest

pytest.importorskip("cutlass")

from mjolnir_kernel.hopper.ptx import gmma_desc_bits  # noqa: E402
from mjolnir_kernel.hopper.wgmma_kernel import (  # noqa: E402
    SEL_EVEN,
    SEL_ODD,
    b_operand_offset,
    p_slot,
)


def _prmt(a: list[int], b: list[int], selector: int) -> list[int]:
    pool = a + b  # bytes 0-3 from a, 4-7 from b
    return [pool[(selector >> (4 * i)) & 7] for i in range(4)]


def _ldmatrix_trans(v, matrix: int, g: int, c: int) -> list[int]:
    """Thread (g, c)'s register of ``ldmatrix.trans`` (b16) over keys 8 matrix .. + 7 of a byte matrix:
    column g (bytes 2g, 2g + 1) of rows 2c and 2c + 1."""
    k0 = 8 * matrix + 2 * c
    return [v[k0][2 * g], v[k0][2 * g + 1], v[k0 + 1][2 * g], v[k0 + 1][2 * g + 1]]


def test_v_transpose_fragments_hold_v_at_the_slot_keys():
    v = [[(key * 16 + d) % 251 for d in range(16)] for key in range(32)]  # 32 keys x 16 d, all distinct
    key_of_slot = {p_slot(k): k for k in range(32)}
    assert sorted(key_of_slot) == list(range(32)), "p_slot must be a permutation of the 32 keys of a k-step"
    for g in range(8):
        for c in range(4):
            r = [_ldmatrix_trans(v, i, g, c) for i in range(4)]
            frags = [_prmt(r[0], r[1], SEL_EVEN), _prmt(r[0], r[1], SEL_ODD),
                     _prmt(r[2], r[3], SEL_EVEN), _prmt(r[2], r[3], SEL_ODD)]  # fmt: skip
            for reg, frag in enumerate(frags):  # wgmma 8-bit A: row g (+8 for odd regs), k 4c (+16 for regs 2, 3)
                m_row = g + 8 * (reg % 2)
                d = 2 * (m_row % 8) + m_row // 8  # the kernel's relabeling of V^T's M rows
                for j, byte in enumerate(frag):
                    slot = 4 * c + j + 16 * (reg // 2)
                    assert byte == v[key_of_slot[slot]][d], (g, c, reg, j)


def test_s_keys_g_and_g_plus_8_land_on_adjacent_slots():
    for wq in range(4):
        for g in range(8):
            k = 16 * (wq % 2) + g
            slot0 = 16 * (wq % 2) + 4 * (g // 2) + 2 * (g % 2)  # the kernel's formula
            assert p_slot(k) == slot0 and p_slot(k + 8) == slot0 + 1


def test_b_operand_offsets_tile_the_buffer():
    rows, k = 16, 128
    offs = {b_operand_offset(r, kk, 8 * k) for r in range(rows) for kk in range(k)}
    assert offs == set(range(rows * k))
    assert b_operand_offset(0, 16, 8 * k) == 128 and b_operand_offset(8, 0, 8 * k) == 8 * k


def test_descriptor_bits_match_a_known_cutlass_descriptor():
    # CuTe's make_gmma_desc for a K-major, no-swizzle operand with LBO 128 and SBO 8 (16-byte units) at
    # shared address 0x400 prints GmmaDescriptor 0x0000000800800040.
    assert gmma_desc_bits(128 * 16, 8 * 16) | (0x400 >> 4) == 0x0000000800800040
    with pytest.raises(ValueError, match="lbo"):
        gmma_desc_bits(24, 128)
