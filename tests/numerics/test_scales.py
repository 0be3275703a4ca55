"""Descales from amax, e4m3 Q quantization, and the kernel's qi-major packed query rows."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from conftest import cuda_only

from mjolnir_numerics import E4M3, FORMATS, GRANULARITIES, compute_descale, pack_q, quantize_q, unpack_o

F32 = np.float32
# largest value of each format, written out (OCP MX v1.0 / NVFP4: 6 * 448)
MAX_NORMAL = {"e4m3": 448.0, "e3m2": 28.0, "e2m3": 7.5, "e2m1": 6.0, "nvfp4": 2688.0}


def kv(num_seqs=3, L=5, h_k=4, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_seqs, L, h_k, d, generator=g) * torch.arange(1, h_k + 1).view(1, 1, h_k, 1)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_descale_shapes_and_values_for_the_three_granularities(fmt):
    x = kv()
    xn = np.abs(x.numpy())
    amax = {
        "per_tensor": xn.max(),
        "per_head": xn.max(axis=(0, 1, 3)),
        "per_seq_head": xn.max(axis=(1, 3)),
    }
    shapes = {"per_tensor": (), "per_head": (4,), "per_seq_head": (3, 4)}
    assert set(GRANULARITIES) == set(shapes)
    for gran in GRANULARITIES:
        d = compute_descale(x, fmt, gran)
        assert d.dtype == torch.float32 and d.shape == shapes[gran], gran
        want = (amax[gran].astype(F32) / F32(MAX_NORMAL[fmt])).astype(F32)
        np.testing.assert_array_equal(d.numpy(), want, err_msg=f"{fmt} {gran}")


def test_default_granularity_is_per_tensor():
    x = kv()
    assert torch.equal(compute_descale(x, "e4m3"), compute_descale(x, "e4m3", "per_tensor"))


def test_varlen_list_matches_per_sequence_amax():
    seqs = [torch.randn(L, 2, 8) * (i + 1) for i, L in enumerate([1, 7, 3])]
    d = compute_descale(seqs, "e4m3", "per_seq_head")
    assert d.shape == (3, 2)
    want = np.stack([np.abs(s.numpy()).max(axis=(0, 2)) for s in seqs]).astype(F32) / F32(448)
    np.testing.assert_array_equal(d.numpy(), want)
    assert compute_descale(seqs, "e4m3", "per_head").shape == (2,)
    assert float(compute_descale(seqs, "e4m3", "per_tensor")) == float(
        F32(max(float(s.abs().max()) for s in seqs)) / F32(448)
    )


def test_zero_and_empty_groups_get_descale_one():
    seqs = [torch.zeros(4, 2, 8), torch.randn(3, 2, 8), torch.zeros(0, 2, 8)]
    seqs[1][:, 1] = 0
    d = compute_descale(seqs, "e3m2", "per_seq_head")
    assert d[0].tolist() == [1.0, 1.0]
    assert d[2].tolist() == [1.0, 1.0]
    assert d[1, 1] == 1.0 and d[1, 0] != 1.0
    assert float(compute_descale(torch.zeros(1, 2, 2, 4), "e4m3")) == 1.0


# amax / descale lands on max_normal within two float32 roundings (the division and its inverse)
AMAX_OVER_DESCALE_REL_TOL = 2.0**-22


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "nvfp4"])
def test_descale_maps_amax_onto_max_normal(fmt):
    x = kv()
    d = compute_descale(x, fmt, "per_seq_head")
    amax = x.abs().amax(dim=(1, 3))
    ratio = (amax / d).double() / MAX_NORMAL[fmt]
    assert ((ratio - 1).abs() <= AMAX_OVER_DESCALE_REL_TOL).all()


def test_unknown_granularity_lists_the_allowed():
    with pytest.raises(ValueError, match=r"^granularity: .*per_tensor.*per_head.*per_seq_head"):
        compute_descale(kv(), "e4m3", "per_token")


def test_unknown_format_raises_naming_fmt():
    with pytest.raises(ValueError, match=r"^fmt: .*e4m3"):
        compute_descale(kv(), "int8")


@pytest.mark.parametrize("bad", [torch.zeros(2, 3, 4), torch.zeros(1, 2, 3, 4, 5)])
def test_wrong_rank_raises_naming_x(bad):
    with pytest.raises(ValueError, match=r"^x: expected \(num_seqs, L, h_k, d\)"):
        compute_descale(bad, "e4m3")


def test_bad_varlen_lists_raise_naming_the_sequence():
    with pytest.raises(ValueError, match=r"^x: "):
        compute_descale([], "e4m3")
    with pytest.raises(ValueError, match=r"^x\[1\]: has 3 kv heads"):
        compute_descale([torch.zeros(2, 2, 4), torch.zeros(2, 3, 4)], "e4m3")
    with pytest.raises(ValueError, match=r"^x\[0\]: expected a float tensor"):
        compute_descale([torch.zeros(2, 2, 4, dtype=torch.int32)], "e4m3")
    x = torch.zeros(2, 2, 4)
    x[1, 1, 1] = float("nan")
    with pytest.raises(ValueError, match=r"^x\[0\]: holds inf or NaN"):
        compute_descale([x], "e4m3")


def test_integer_kv_raises_naming_x():
    with pytest.raises(ValueError, match=r"^x\[0\]: expected a float tensor"):
        compute_descale(torch.zeros(1, 2, 2, 4, dtype=torch.int64), "e4m3")


# ---------------------------------------------------------------------------------------------------
# query packing
# ---------------------------------------------------------------------------------------------------
def test_pack_q_rows_are_qi_major_on_a_hand_built_example():
    # 1 sequence, q_len 2, h_k 2, h_r 2, d 1: q[t, h] = 10 * t + h
    q = torch.tensor([[[0.0], [1.0], [2.0], [3.0]], [[10.0], [11.0], [12.0], [13.0]]])
    p = pack_q(q, num_seqs=1, q_len=2, heads_k=2)
    assert p.shape == (1, 2, 4, 1)
    # kv head 0 owns query heads 0, 1; row n = qi * h_r + hr
    assert p[0, 0, :, 0].tolist() == [0.0, 1.0, 10.0, 11.0]
    assert p[0, 1, :, 0].tolist() == [2.0, 3.0, 12.0, 13.0]
    assert torch.equal(unpack_o(p, 1, 2, 2), q)


def test_pack_q_two_sequences_keep_their_rows_apart():
    num_seqs, q_len, h_k, h_r, d = 2, 3, 2, 2, 1
    q = torch.arange(num_seqs * q_len * h_k * h_r, dtype=torch.float32).view(num_seqs * q_len, h_k * h_r, d)
    p = pack_q(q, num_seqs, q_len, h_k)
    for s in range(num_seqs):
        for g in range(h_k):
            for qi in range(q_len):
                for hr in range(h_r):
                    assert p[s, g, qi * h_r + hr, 0] == q[s * q_len + qi, g * h_r + hr, 0]


@pytest.mark.parametrize(
    "num_seqs, q_len, h_k, h_r, d", [(1, 1, 1, 1, 4), (3, 1, 2, 4, 8), (2, 4, 2, 3, 16), (0, 2, 2, 2, 8)]
)
def test_pack_q_unpack_o_round_trip(num_seqs, q_len, h_k, h_r, d):
    q = torch.randn(num_seqs * q_len, h_k * h_r, d)
    p = pack_q(q, num_seqs, q_len, h_k)
    assert p.shape == (num_seqs, h_k, q_len * h_r, d)
    assert torch.equal(unpack_o(p, num_seqs, q_len, h_k), q)


def test_pack_q_is_a_view_for_q_len_1():
    q = torch.randn(3, 8, 16)
    p = pack_q(q, 3, 1, 2)
    assert p.data_ptr() == q.data_ptr() and p._base is q


@pytest.mark.parametrize(
    "shape, args, argument",
    [
        ((6, 4, 8), (2, 2, 3), "q"),  # h_q 4 not a multiple of heads_k 3
        ((5, 4, 8), (2, 2, 2), "q"),  # 5 rows != 2 * 2
        ((4, 8), (2, 2, 2), "q"),  # rank 2
        ((4, 4, 8), (2, 2, 0), "heads_k"),
        ((4, 4, 8), (2, 0, 2), "q_len"),
        ((4, 4, 8), (-1, 2, 2), "num_seqs"),
    ],
)
def test_bad_q_layouts_raise_naming_the_argument(shape, args, argument):
    q = torch.zeros(shape)
    for fn in (pack_q, quantize_q):
        with pytest.raises(ValueError, match=rf"^{argument}: "):
            fn(q, *args)


def test_unpack_o_of_the_wrong_shape_raises_naming_o():
    with pytest.raises(ValueError, match=r"^o: "):
        unpack_o(torch.zeros(2, 3, 4, 8), 2, 1, 2)
    with pytest.raises(ValueError, match=r"^o: 5 rows per kv head is not a multiple of q_len=2"):
        unpack_o(torch.zeros(2, 2, 5, 8), 2, 2, 2)


# ---------------------------------------------------------------------------------------------------
# quantize_q
# ---------------------------------------------------------------------------------------------------
def ref_quantize_q(q: np.ndarray, num_seqs, q_len, h_k):
    """Independent: per (sequence, kv head) amax / 448 in float32, codes = e4m3(q / descale)."""
    rows, h_q, d = q.shape
    h_r = h_q // h_k
    q5 = q.astype(F32).reshape(num_seqs, q_len, h_k, h_r, d)
    amax = np.abs(q5).max(axis=(1, 3, 4))
    descale = amax / F32(448)
    descale = np.where(descale > 0, descale, F32(1)).astype(F32)
    scaled = q5 / descale[:, None, :, None, None]
    assert (np.abs(scaled) <= 464).all()  # ml_dtypes e4m3 is trusted up to 464
    codes = scaled.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(rows, h_q, d)
    return codes, descale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_q_matches_independent_computation(dtype):
    num_seqs, q_len, h_k, h_r, d = 3, 2, 2, 4, 32
    g = torch.Generator().manual_seed(1)
    q = (torch.randn(num_seqs * q_len, h_k * h_r, d, generator=g) * 3).to(dtype)
    q[:q_len, :h_r] = 0  # sequence 0, kv head 0 is all zero: descale 1
    codes, descale = quantize_q(q, num_seqs, q_len, h_k)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == q.shape
    assert descale.dtype == torch.float32 and descale.shape == (num_seqs, h_k)
    want_codes, want_descale = ref_quantize_q(q.float().numpy(), num_seqs, q_len, h_k)
    np.testing.assert_array_equal(descale.numpy(), want_descale)
    np.testing.assert_array_equal(codes.view(torch.uint8).numpy(), want_codes)
    assert float(descale[0, 0]) == 1.0
    # each group's largest |q| maps to 448 (within one float32 rounding it is exactly 448)
    assert float(codes.float().abs().max()) == 448.0


def test_quantize_q_approximates_q_within_half_an_e4m3_ulp():
    q = torch.randn(4, 8, 64)
    codes, descale = quantize_q(q, 4, 1, 2)
    approx = codes.float().view(4, 2, 4, 64) * descale[:, :, None, None]
    err = (approx.view(4, 8, 64) - q).abs()
    # half an e4m3 ulp: 2^-4 relative for normals, half the subnormal spacing 2^-10 (times descale) below
    bound = q.abs() * 2.0**-4 + (2.0**-10) * descale.repeat_interleave(4, dim=1)[:, :, None]
    assert (err <= bound * (1 + 2.0**-20)).all()


def test_quantize_q_rejects_integer_fp8_and_non_finite_q():
    with pytest.raises(ValueError, match=r"^q: .*bf16/fp16/fp32"):
        quantize_q(torch.zeros(2, 2, 4, dtype=torch.int32), 2, 1, 1)
    with pytest.raises(ValueError, match=r"^q: "):
        quantize_q(torch.zeros(2, 2, 4).to(torch.float8_e4m3fn), 2, 1, 1)
    q = torch.zeros(2, 2, 4)
    q[1, 1, 1] = float("inf")
    with pytest.raises(ValueError, match=r"^q: holds inf or NaN"):
        quantize_q(q, 2, 1, 1)


@cuda_only
def test_cuda_scales_and_q_match_cpu():
    x = kv()
    for gran in GRANULARITIES:
        assert torch.equal(compute_descale(x, "e4m3", gran), compute_descale(x.cuda(), "e4m3", gran).cpu())
    q = torch.randn(6, 8, 64)
    c, d = quantize_q(q, 3, 2, 2)
    cc, dc = quantize_q(q.cuda(), 3, 2, 2)
    assert torch.equal(c.view(torch.uint8), cc.view(torch.uint8).cpu()) and torch.equal(d, dc.cpu())
    assert E4M3.max_normal == 448.0


def test_empty_batch_gives_an_empty_per_seq_descale_and_unit_others():
    x = torch.zeros(0, 5, 2, 4)
    assert compute_descale(x, "e4m3", "per_seq_head").shape == (0, 2)
    assert torch.equal(compute_descale(x, "e4m3", "per_head"), torch.ones(2))
    assert torch.equal(compute_descale(x, "e4m3", "per_tensor"), torch.tensor(1.0))
