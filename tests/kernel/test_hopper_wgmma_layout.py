"""The wgmma path's operand bookkeeping, replayed on the CPU (mjolnir_kernel/hopper/wgmma_kernel.py):
V^T's register fragments from ``ldmatrix.trans`` + ``prmt``, the P^T slot order S writes, and the
shared-memory descriptor bits. A wrong selector or slot formula here would pair P with the wrong V
rows on the GPU; these checks pin them without one."""

import pytest

pytest.importorskip("cutlass")

from mjolnir_kernel.hopper.ptx import gmma_desc_bits  # noqa: E402
from mjolnir_kernel.hopper.wgmma_kernel import (  # noqa: E402
    BYTES_EVEN,
    BYTES_ODD,
    F16_GROUP_BYTES,
    SEL_EVEN,
    SEL_ODD,
    b_operand_offset,
    f16_k_major_offset,
    f16_m_major_offset,
    f16_slot,
    m_row_dim,
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


# -- v_operand "smem" and "f16": V^T through shared memory ------------------------------------------
# Replays of the kernel's store formulas (_store_v_transposed, _widen_v, the f16 P store) into a byte
# buffer, read back through the canonical wgmma operand layouts: O^T = V^T . P^T must come out in the
# M-row order the epilogue assumes (m_row_dim) with every key paired with its own P.


def _read_k_major(buf, m, k, group_bytes):
    return buf[b_operand_offset(m, k, group_bytes)]


def test_smem_v_transpose_stores_make_the_register_operand():
    from mjolnir_kernel.hopper.wgmma_kernel import P_GROUP_BYTES

    keys, dims = 32, 16  # one k-step of one warp's 16 M rows (one 16-wide d chunk)
    v = [[(key * 16 + d) % 251 for d in range(dims)] for key in range(keys)]
    buf = {}
    for g in range(8):
        for c in range(4):
            r = [_ldmatrix_trans(v, i, g, c) for i in range(4)]
            regs = [_prmt(r[0], r[1], SEL_EVEN), _prmt(r[0], r[1], SEL_ODD),
                    _prmt(r[2], r[3], SEL_EVEN), _prmt(r[2], r[3], SEL_ODD)]  # fmt: skip
            base = g * 16 + 4 * c  # the kernel's base for wq = 0, then + (8 mb + i % 2) groups + (2 s + i // 2) cores
            for i, reg in enumerate(regs):
                off = base + (i % 2) * P_GROUP_BYTES + (i // 2) * 128
                for j, byte in enumerate(reg):
                    assert off + j not in buf, "two stores to one byte"
                    buf[off + j] = byte
    key_of_slot = {p_slot(k): k for k in range(keys)}
    for m in range(16):
        d = m_row_dim(m)
        for k in range(keys):
            assert _read_k_major(buf, m, k, P_GROUP_BYTES) == v[key_of_slot[k]][d], (m, k)


def test_f16_widening_and_p_stores_pair_every_key_with_its_p():
    d_half, keys, wg = 64, 128, 1  # warpgroup 1 of d = 128
    d = 2 * d_half
    v = [[(key * 131 + dd * 7) % 253 for dd in range(d)] for key in range(keys)]
    vt = {}
    for t in range(keys):  # _widen_v: thread t, key t
        j = t % 16
        k = 16 * (t // 16) + 2 * (j % 8) + j // 8
        assert k == f16_slot(t)
        row_at = (k % 8) * 16 + (k // 8) * 128
        for cl in range(d_half // 16):
            ch = wg * (d_half // 16) + cl
            w = [v[t][16 * ch + 4 * i : 16 * ch + 4 * i + 4] for i in range(4)]  # the 16-byte load, as words
            for par, sel in ((0, BYTES_EVEN), (1, BYTES_ODD)):
                lane_vals = _prmt(w[0], w[1], sel) + _prmt(w[2], w[3], sel)  # cvt pairs keep the byte order
                for i, val in enumerate(lane_vals):
                    off = row_at + (2 * ch + par) * F16_GROUP_BYTES + 2 * i
                    assert off not in vt
                    vt[off] = val
    p = [[(row * 17 + key * 3) % 101 for key in range(keys)] for row in range(16)]
    pb = {}
    for wq_all in range(8):  # the P store of every warp: keys g, g + 8 of its 16 as one f16x2
        key_warp = 16 * wq_all
        for g in range(8):
            for c in range(4):
                ks = key_warp + 2 * g
                for r in range(4):
                    row = 2 * c + (r & 1) + 8 * (r >> 1)
                    off = (ks % 8) * 2 + (ks // 8) * 128 + (row % 8) * 16 + (r >> 1) * F16_GROUP_BYTES
                    for h, key in enumerate((key_warp + g, key_warp + g + 8)):
                        assert off + 2 * h not in pb
                        pb[off + 2 * h] = p[row][key]
    assert len(pb) == 16 * keys
    a0 = wg * (d // 16) * F16_GROUP_BYTES  # the kernel's first A descriptor of this warpgroup (mb = 0)
    for m in range(d_half):
        dd = wg * d_half + m_row_dim(m)
        for n in range(16):
            got = sum(vt[a0 + f16_m_major_offset(m, k)] * pb[f16_k_major_offset(n, k)] for k in range(keys))
            want = sum(v[key][dd] * p[n][key] for key in range(keys))
            assert got == want, (m, n)


def test_f16_slot_and_m_rows_are_permutations():
    assert sorted(f16_slot(k) for k in range(128)) == list(range(128))
    assert sorted(m_row_dim(m) for m in range(64)) == list(range(64))
    assert [m_row_dim(m) for m in range(16)] == [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15]


def test_wgmma_ss_refuses_what_it_cannot_emit():
    from mjolnir_kernel.hopper.ptx import wgmma_ss

    with pytest.raises(ValueError, match="dtype='bf16'"):
        wgmma_ss([0], [0], n=16, dtype="bf16")
    with pytest.raises(ValueError, match="1 A and 2 B descriptors"):
        wgmma_ss([0], [0, 1], n=16, dtype="f16")
    with pytest.raises(ValueError, match="n=12"):
        wgmma_ss([0], [0], n=12, dtype="e4m3")
