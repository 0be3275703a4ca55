"""Host-side checks of decode(): every bad input is rejected before launching, naming the argument.
Runs without a GPU (CPU tensors; the device check comes after the argument checks)."""

import pytest
import torch

from mjolnir_kernel.api import DeviceError, decode
from mjolnir_kernel.host import STRIDE_FIELDS, check_decode_inputs, kernel_strides
from mjolnir_numerics.cache import LAYOUTS, PagedKVCache
from mjolnir_numerics.scales import pack_q, quantize_q

H_Q, H_K, D = 8, 2, 128


def make(fmt="e4m3", layout="nhd", ps=16, lens=(40, 7), q_len=1, q_dtype="bf16", granularity="per_head"):
    g = torch.Generator().manual_seed(0)
    k = [torch.randn(L, H_K, D, generator=g) for L in lens]
    v = [torch.randn(L, H_K, D, generator=g) for L in lens]
    cache = PagedKVCache.from_float(k, v, fmt, page_size=ps, layout=layout, granularity=granularity)
    q = torch.randn(len(lens) * q_len, H_Q, D, generator=g).to(torch.bfloat16)
    qd = None
    if q_dtype == "e4m3":
        q, qd = quantize_q(q, len(lens), q_len, H_K)
    return q, qd, cache


def args_of(q, qd, cache, q_len=1):
    return (q, cache.k_pool, cache.v_pool, cache.block_table, cache.seq_lens, cache.k_descale, cache.v_descale), dict(
        kv_format=cache.fmt.name, q_len=q_len, q_descale=qd, k_scales=cache.k_scales, v_scales=cache.v_scales
    )


def test_valid_inputs_pass():
    for fmt, q_dtype in (("e4m3", "bf16"), ("e4m3", "e4m3"), ("e2m3", "e4m3"), ("e2m1", "e4m3"), ("nvfp4", "e4m3")):
        q, qd, cache = make(fmt, q_dtype=q_dtype)
        a, kw = args_of(q, qd, cache)
        p = check_decode_inputs(*a, **kw)
        assert (p.num_seqs, p.heads_k, p.n_q, p.head_dim, p.page_size) == (2, H_K, H_Q // H_K, D, 16)


def _expect(arg, match, *a, **kw):
    with pytest.raises(ValueError, match=match) as e:
        check_decode_inputs(*a, **kw)
    assert str(e.value).startswith(arg), f"error does not start with the argument name {arg!r}: {e.value}"


def test_q_checks():
    q, qd, cache = make()
    a, kw = args_of(q, qd, cache)
    _expect("q", "dtype torch.float16", q.half(), *a[1:], **kw)
    _expect("q", "expected \\(num_seqs", q[0], *a[1:], **kw)
    _expect("q", "head_dim: 64", q[..., :64], *a[1:], **kw)
    _expect(
        "q", "head dim must be contiguous", torch.zeros(2, H_Q, 2 * D, dtype=torch.bfloat16)[..., ::2], *a[1:], **kw
    )
    _expect("q", "not a multiple of the cache's h_k", q[:, :5], *a[1:], **kw)
    _expect("q", "not a multiple of q_len", q[:1].expand(3, H_Q, D).contiguous(), *a[1:], **{**kw, "q_len": 2})
    _expect("q_len", "int >= 1", *a, **{**kw, "q_len": 0})
    qf, qdf, cache6 = make("e2m3", q_dtype="e4m3")
    a6, kw6 = args_of(q, None, cache6)
    _expect("q", "e2m3 KV runs only with e4m3 Q", *a6, **kw6)


def test_q_descale_checks():
    q, qd, cache = make(q_dtype="e4m3")
    a, kw = args_of(q, qd, cache)
    _expect("q_descale", "needs its descale", *a, **{**kw, "q_descale": None})
    _expect("q_descale", "float32", *a, **{**kw, "q_descale": qd.double()})
    _expect("q_descale", "shape \\(3,\\)", *a, **{**kw, "q_descale": torch.ones(3)})


def test_pool_checks():
    q, qd, cache = make()
    a, kw = args_of(q, qd, cache)
    k, v = a[1], a[2]
    _expect("k_pool", "are torch.float8_e4m3fn", q, k.view(torch.uint8), v, *a[3:], **kw)
    _expect("v_pool", "differs from k_pool", q, k, v[:-1], *a[3:], **kw)
    _expect("k_pool", "page_size: 8", q, k[:, :8], v[:, :8], *a[3:], **kw)
    wide = torch.zeros(k.shape[0], 16, H_K, D + 8, dtype=torch.uint8).view(torch.float8_e4m3fn)[..., :D]
    _expect("k_pool", "multiples of 16 bytes", q, wide, wide, *a[3:], **kw)
    q6, qd6, c6 = make("e2m3", q_dtype="e4m3")
    a6, kw6 = args_of(q6, qd6, c6)
    _expect("k_pool", "\\(num_pages, page_size, h_k, 96\\)", q6, a6[1][..., :64], a6[2][..., :64], *a6[3:], **kw6)


def test_nvfp4_scale_checks():
    q, qd, cache = make("nvfp4", q_dtype="e4m3", granularity="per_tensor")
    a, kw = args_of(q, qd, cache)
    _expect("k_scales", "block scales of shape", *a, **{**kw, "k_scales": None})
    _expect("v_scales", "block scales of shape", *a, **{**kw, "v_scales": cache.v_scales[..., :4]})
    q8, qd8, c8 = make(q_dtype="e4m3")
    a8, kw8 = args_of(q8, qd8, c8)
    _expect("k_scales", "only kv_format 'nvfp4'", *a8, **{**kw8, "k_scales": cache.k_scales})


def test_block_table_and_seq_lens_checks():
    q, qd, cache = make(lens=(40, 7))
    a, kw = args_of(q, qd, cache)
    bt, sl = cache.block_table, cache.seq_lens
    _expect("block_table", "int32", q, a[1], a[2], bt.long(), sl, *a[5:], **kw)
    wide_bt = torch.zeros(bt.shape[0], bt.shape[1] + 1, dtype=torch.int32)[:, : bt.shape[1]]
    _expect("block_table", "contiguous", q, a[1], a[2], wide_bt, sl, *a[5:], **kw)
    _expect("seq_lens", "int32", q, a[1], a[2], bt, sl.long(), *a[5:], **kw)
    _expect("seq_lens", "\\(2,\\)", q, a[1], a[2], bt, sl[:1], *a[5:], **kw)
    too_long = sl.clone()
    too_long[0] = bt.shape[1] * 16 + 1
    _expect("block_table", "needs", q, a[1], a[2], bt, too_long, *a[5:], **kw)
    neg = sl.clone()
    neg[1] = -1
    _expect("seq_lens", ">= 0", q, a[1], a[2], bt, neg, *a[5:], **kw)


def test_descale_shape_checks():
    q, qd, cache = make()
    a, kw = args_of(q, qd, cache)
    _expect("k_descale", "per kv head", q, a[1], a[2], a[3], a[4], torch.ones(5), a[6], **kw)
    _expect("v_descale", "float32", q, a[1], a[2], a[3], a[4], a[5], torch.ones(2, dtype=torch.float64), **kw)


def test_q_len_longer_than_a_sequence_is_rejected():
    q, qd, cache = make(lens=(40, 3), q_len=4)
    a, kw = args_of(q, qd, cache, q_len=4)
    _expect("q_len", "exceeds seq_len 3", *a, **kw)


def test_out_checks():
    q, qd, cache = make()
    a, kw = args_of(q, qd, cache)
    _expect("out", "bfloat16", *a, **{**kw, "out": torch.empty(q.shape, dtype=torch.float32)})


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt, bits", [("e4m3", 8), ("e3m2", 6), ("e2m1", 4)])
def test_kernel_strides_of_every_layout(layout, fmt, bits):
    q, qd, cache = make(fmt, layout=layout, q_dtype="e4m3")
    q4 = pack_q(q, 2, 1, H_K)
    o4 = torch.empty(q4.shape, dtype=torch.bfloat16)
    s = dict(
        zip(
            STRIDE_FIELDS,
            kernel_strides(q4, o4, cache.k_pool, cache.v_pool, qd, cache.k_descale, cache.v_descale, bits),
        )
    )
    esize = cache.k_pool.element_size()
    for which, pool in (("k", cache.k_pool), ("v", cache.v_pool)):
        byte = [x * esize for x in pool.stride()[:3]]
        assert [s[f"{which}_page"], s[f"{which}_row"], s[f"{which}_head"]] == [b * 8 // bits for b in byte]
    if layout == "nhd":  # separate contiguous (pages, PS, h_k, row) pools, strides in elements
        assert (s["k_page"], s["k_row"], s["k_head"]) == (16 * H_K * D, H_K * D, D)
    if layout == "hnd":  # (pages, 2, h_k, PS, row): tokens of a head are adjacent
        assert (s["k_page"], s["k_row"], s["k_head"]) == (2 * H_K * 16 * D, D, 16 * D)
    assert (s["qd_seq"], s["qd_head"]) == (H_K, 1)  # quantize_q: (num_seqs, h_k)
    assert (s["kd_seq"], s["kd_head"]) == (0, 1)  # per_head descale broadcasts over sequences


def test_per_tensor_descale_broadcasts():
    q, qd, cache = make(granularity="per_tensor")
    q4 = pack_q(q, 2, 1, H_K)
    s = dict(
        zip(
            STRIDE_FIELDS,
            kernel_strides(q4, q4, cache.k_pool, cache.v_pool, torch.ones(()), cache.k_descale, cache.v_descale, 8),
        )
    )
    assert (s["kd_seq"], s["kd_head"], s["vd_seq"], s["vd_head"], s["qd_seq"], s["qd_head"]) == (0,) * 6


def test_strided_q_rows_are_read_in_place():
    """Q inside wider rows (vLLM's fused QKV view): the sequence stride is free."""
    q, qd, cache = make()
    wide = torch.zeros(2, (H_Q + 2 * H_K) * D, dtype=torch.bfloat16)
    qv = wide[:, : H_Q * D].view(2, H_Q, D)
    qv.copy_(q)
    q4 = pack_q(qv, 2, 1, H_K)
    assert q4.data_ptr() == wide.data_ptr()
    s = dict(
        zip(
            STRIDE_FIELDS,
            kernel_strides(q4, q4, cache.k_pool, cache.v_pool, torch.ones(()), cache.k_descale, cache.v_descale, 8),
        )
    )
    assert s["q_seq"] == (H_Q + 2 * H_K) * D


def test_decode_without_a_tcgen05_gpu_says_why():
    q, qd, cache = make()
    with pytest.raises(DeviceError, match=r"tcgen05 GPU \(10.x / 11.x\) or a Hopper GPU \(9.0\): q is on the CPU"):
        decode(q, cache)
    with pytest.raises(ValueError, match="^q: dtype"):  # argument errors come first, even on the CPU
        decode(q.half(), cache)
    with pytest.raises(ValueError, match="^softmax_scale"):
        decode(q, cache, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="^causal"):
        decode(q, cache, causal="yes")


def test_decode_names_a_bad_cache_and_nan_q_before_looking_for_a_gpu():
    from mjolnir_numerics import PagedKVCache

    q = torch.randn(2, 8, 128).to(torch.bfloat16)
    with pytest.raises(TypeError, match="cache: expected a mjolnir_numerics PagedKVCache, got NoneType"):
        decode(q, None)
    cache = PagedKVCache.from_float(torch.randn(2, 20, 2, 128), torch.randn(2, 20, 2, 128), "e4m3", page_size=16)
    bad = q.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="q: holds inf or NaN"):
        decode(bad, cache)
    with pytest.raises(ValueError, match="softmax_scale: 1e-46 rounds to 0 in fp32"):
        decode(q, cache, softmax_scale=1e-46)
