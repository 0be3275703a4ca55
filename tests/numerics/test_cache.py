"""The paged KV cache: storage as the kernel reads it, layouts, poisoning, writer, reader, validation."""

import dataclasses
import math

import pytest
import torch

from mjolnir_numerics import E4M3, FORMATS, nvfp4_quantize, round_to_format
from mjolnir_numerics.cache import LAYOUTS, PAGE_SIZES, POISON_BYTE, PagedKVCache
from tests.conftest import FusedOnTheCpu

ELEMENT_FORMATS = ("e4m3", "e3m2", "e2m3", "e2m1")
LENS = (37, 0, 100)


def _kv(lens=LENS, heads_k=2, d=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = [torch.randn(L, heads_k, d, generator=g) * 3 for L in lens]
    v = [torch.randn(L, heads_k, d, generator=g) for L in lens]
    return k, v


@pytest.mark.parametrize("fmt", ELEMENT_FORMATS)
@pytest.mark.parametrize("granularity", ["per_tensor", "per_head", "per_seq_head"])
def test_gather_equals_direct_rounding(fmt, granularity):
    k, v = _kv()
    cache = PagedKVCache.from_float(k, v, fmt, page_size=16, granularity=granularity)
    for s, (ks, vs) in enumerate(zip(k, v)):
        kk, vv = cache.gather(s)
        for name, x, got in (("k", ks, kk), ("v", vs, vv)):
            d = cache.descale_table(name)[s][None, :, None]
            assert torch.equal(got, round_to_format(x / d, fmt) * d), (fmt, granularity, s, name)


def test_nvfp4_gather_matches_nvfp4_quantize():
    k, v = _kv()
    cache = PagedKVCache.from_float(k, v, "nvfp4", page_size=32, granularity="per_head")
    g = cache.descale_table("k")[0] / 8  # the cache keeps the kernel descale 8 * g
    kk, _ = cache.gather(2, kernel_view=False)
    ref = nvfp4_quantize(k[2], global_value=g.reshape(-1, 1))
    assert torch.equal(kk, ref.values)
    kern, _ = cache.gather(2, kernel_view=True)
    assert torch.equal(kern, ref.kernel_values * ref.kernel_descale)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_layouts_hold_identical_logical_bytes(fmt):
    k, v = _kv()
    caches = {lay: PagedKVCache.from_float(k, v, fmt, page_size=16, layout=lay) for lay in LAYOUTS}
    ref = caches["nhd"]
    for lay, c in caches.items():
        assert torch.equal(c.block_table, ref.block_table)
        for a, b in ((c.k_pool, ref.k_pool), (c.v_pool, ref.v_pool)):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), lay
            assert a.stride(-1) == 1


def test_physical_layout_shapes():
    k, v = _kv()
    row = 128
    hnd = PagedKVCache.from_float(k, v, "e4m3", page_size=16, layout="hnd")
    (buf,) = hnd.storage
    assert buf.shape == (hnd.num_pages, 2, 2, 16, row)
    assert hnd.k_pool.data_ptr() == buf.data_ptr() and hnd.v_pool.data_ptr() == buf[:, 1].data_ptr()
    inter = PagedKVCache.from_float(k, v, "e2m3", page_size=16, layout="interleaved")
    (buf,) = inter.storage
    assert buf.shape == (inter.num_pages, 2, 16, 2 * 96)
    assert inter.v_pool.data_ptr() - inter.k_pool.data_ptr() == 96  # V right after K in each row
    fi = PagedKVCache.from_float(k, v, "e2m1", page_size=16, layout="flashinfer")
    (buf,) = fi.storage
    assert buf.shape == (fi.num_pages, 2, 16, 2, 64)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_unreferenced_pages_are_poisoned(fmt):
    k, v = _kv()
    cache = PagedKVCache.from_float(k, v, fmt, page_size=16)
    need = [math.ceil(L / 16) for L in LENS]
    referenced = set()
    for s, n in enumerate(need):
        referenced |= set(cache.block_table[s, :n].tolist())
    unreferenced = [p for p in range(cache.num_pages) if p not in referenced]
    assert unreferenced, "the builder must leave spare pages to poison"
    poison = POISON_BYTE[FORMATS[fmt].bits]
    for pool in (cache.k_pool, cache.v_pool):
        assert bool((pool.view(torch.uint8)[unreferenced] == poison).all())
    if fmt == "e4m3":
        assert torch.isnan(cache.page_values("k", torch.tensor(unreferenced))).all()
    if cache.k_scales is not None:
        assert bool((cache.k_scales.view(torch.uint8)[unreferenced] == E4M3.max_code).all())
    # unused block-table entries point at a poisoned page, so a stray read shows
    assert int(cache.block_table[1, 0]) in unreferenced


def test_shuffled_and_contiguous_pages_hold_the_same_sequences():
    k, v = _kv()
    a = PagedKVCache.from_float(k, v, "e3m2", page_size=16, shuffle=True, seed=3)
    b = PagedKVCache.from_float(k, v, "e3m2", page_size=16, shuffle=False)
    assert not torch.equal(a.block_table, b.block_table)
    for s in range(len(LENS)):
        for x, y in zip(a.gather(s), b.gather(s)):
            assert torch.equal(x, y)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_writer_appending_tokens_equals_building_at_once(fmt):
    k, v = _kv(lens=(50,))
    full = PagedKVCache.from_float(k, v, fmt, page_size=16, granularity="per_seq_head", shuffle=False)
    # same descales, the first 20 tokens built, the next 30 appended with the writer
    part = PagedKVCache.from_float(
        [k[0][:20]],
        [v[0][:20]],
        fmt,
        page_size=16,
        shuffle=False,
        k_descale=full.k_descale / (8 if fmt == "nvfp4" else 1),
        v_descale=full.v_descale / (8 if fmt == "nvfp4" else 1),
        spare_pages=4,
    )
    pos = torch.arange(20, 50)
    bt = torch.cat([part.block_table[0, :2], torch.tensor([2, 3], dtype=torch.int32)])  # contiguous pages
    part.write(k[0][20:], v[0][20:], bt.long()[pos // 16] * 16 + pos % 16, seq_ids=torch.zeros(30, dtype=torch.long))
    grown = dataclasses.replace(part, block_table=bt[None], seq_lens=torch.tensor([50], dtype=torch.int32))
    for x, y in zip(grown.gather(0), full.gather(0)):
        assert torch.equal(x, y)


def test_kv_bytes_counts_block_scales():
    k, v = _kv()
    n = sum(LENS) * 2 * 128 * 2  # tokens * heads * d * (K and V)
    assert PagedKVCache.from_float(k, v, "e4m3").kv_bytes() == n
    assert PagedKVCache.from_float(k, v, "e3m2").kv_bytes() == n * 6 // 8
    assert PagedKVCache.from_float(k, v, "nvfp4").kv_bytes() == n * 4.5 / 8


def test_page_sizes_and_layout_lists():
    assert PAGE_SIZES == (16, 32, 64, 128)
    assert LAYOUTS == ("nhd", "hnd", "interleaved", "flashinfer")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(page_size=8), "page_size"),
        (dict(layout="nchw"), "layout"),
        (dict(granularity="per_token"), "granularity"),
        (dict(fmt="fp5"), "fmt"),
        (dict(k_descale=torch.tensor(0.0)), "k_descale"),
        (dict(v_descale=torch.tensor(-1.0)), "v_descale"),
        (dict(k_descale=torch.tensor(float("nan"))), "k_descale"),
        (dict(k_descale=torch.ones(5)), "k_descale"),
        (dict(spare_pages=-1), "spare_pages"),
    ],
)
def test_builder_rejects_bad_arguments(kwargs, match):
    k, v = _kv()
    with pytest.raises(ValueError, match=match):
        PagedKVCache.from_float(k, v, **kwargs)


def test_builder_rejects_nonfinite_unless_allowed():
    k, v = _kv(lens=(20,))
    k[0][3, 0, 5] = float("inf")
    with pytest.raises(ValueError, match=r"k\[0\].*inf or NaN"):
        PagedKVCache.from_float(k, v, "e4m3")
    cache = PagedKVCache.from_float(k, v, "e4m3", allow_nonfinite=True)
    kk, _ = cache.gather(0)
    assert kk[3, 0, 5] == 448 * cache.descale_table("k")[0, 0]  # saturated, as cvt.rn.satfinite does


def test_builder_rejects_mismatched_k_and_v():
    k, v = _kv()
    with pytest.raises(ValueError, match="v"):
        PagedKVCache.from_float(k, v[:2])
    with pytest.raises(ValueError, match="k"):
        PagedKVCache.from_float(k, [torch.randn(37, 3, 128)] + v[1:])
    with pytest.raises(ValueError, match="head dim"):
        PagedKVCache.from_float([torch.randn(5, 2, 40)], [torch.randn(5, 2, 40)], "nvfp4")


def test_validation_catches_inconsistent_fields():
    k, v = _kv()
    c = PagedKVCache.from_float(k, v, "e4m3", page_size=16)
    with pytest.raises(ValueError, match="seq_lens"):
        dataclasses.replace(c, seq_lens=torch.tensor([37, 0, 10_000], dtype=torch.int32))
    bad = c.block_table.clone()
    bad[0, 0] = c.num_pages
    with pytest.raises(ValueError, match="block_table"):
        dataclasses.replace(c, block_table=bad)
    with pytest.raises(ValueError, match="block_table"):
        dataclasses.replace(c, block_table=c.block_table.long())
    with pytest.raises(ValueError, match="k_pool"):
        dataclasses.replace(c, k_pool=c.k_pool.view(torch.uint8))
    with pytest.raises(ValueError, match="v_descale"):
        dataclasses.replace(c, v_descale=torch.ones(2, 2))


def test_writer_rejects_bad_slots_and_missing_seq_ids():
    k, v = _kv()
    c = PagedKVCache.from_float(k, v, "e4m3", page_size=16, granularity="per_seq_head")
    x = torch.randn(2, 2, 128)
    with pytest.raises(ValueError, match="slot_mapping"):
        c.write(x, x, torch.tensor([0, c.num_pages * 16]), seq_ids=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="seq_ids"):
        c.write(x, x, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="k"):
        c.write(torch.randn(2, 3, 128), x, torch.tensor([0, 1]), seq_ids=torch.tensor([0, 0]))


def _pool_bytes(c):
    out = [c.k_pool.view(torch.uint8).clone(), c.v_pool.view(torch.uint8).clone()]
    for sc in (c.k_scales, c.v_scales):
        if sc is not None:
            out.append(sc.view(torch.uint8).clone())
    return out


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "nvfp4"])
def test_writer_refuses_float_and_duplicate_slots_and_changes_nothing(fmt):
    """A float slot is refused (never truncated: 1.7 -> 1, -0.5 -> 0), a duplicate slot is refused (never
    silently overwritten), and a refused write leaves every byte of the pools as it was, also when only
    its V rows are bad."""
    k, v = _kv()
    c = PagedKVCache.from_float(k, v, fmt, page_size=16)
    before = _pool_bytes(c)
    x = torch.randn(2, 2, 128)
    with pytest.raises(TypeError, match="slot_mapping: expected an integer tensor, got torch.float32"):
        c.write(x, x, torch.tensor([1.7, -0.5]))
    with pytest.raises(ValueError, match="slot_mapping: slot 5 appears more than once"):
        c.write(x, x, torch.tensor([5, 5]))
    with pytest.raises(TypeError, match="slot_mapping: expected a torch.Tensor, got \\[0, 1\\] \\(list\\)"):
        c.write(x, x, [0, 1])
    bad_v = x.clone()
    bad_v[1, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="v: holds inf or NaN"):
        c.write(x, bad_v, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="v: has 1 tokens, k has 2"):
        c.write(x, x[:1], torch.tensor([0, 1]))
    for a, b in zip(before, _pool_bytes(c)):
        assert torch.equal(a, b)
    c.write(x, x, torch.tensor([0, 1]))  # the same write, valid, does change the pools
    assert any(not torch.equal(a, b) for a, b in zip(before, _pool_bytes(c)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_cuda_cache_matches_cpu(fmt):
    k, v = _kv()
    cpu = PagedKVCache.from_float(k, v, fmt, page_size=16)
    gpu = PagedKVCache.from_float(k, v, fmt, page_size=16, device="cuda")
    assert torch.equal(cpu.k_pool.view(torch.uint8), gpu.k_pool.view(torch.uint8).cpu())
    for x, y in zip(cpu.gather(2), gpu.gather(2)):
        assert torch.equal(x, y.cpu())


def test_nvfp4_options_are_kept_for_every_write():
    k, v = _kv(lens=(40,))
    cache = PagedKVCache.from_float(k, v, "nvfp4", page_size=16, nvfp4_options={"four_over_six": True})
    g = cache.descale_table("k")[0] / 8
    ref = nvfp4_quantize(k[0], global_value=g.reshape(-1, 1), four_over_six=True)
    default = nvfp4_quantize(k[0], global_value=g.reshape(-1, 1))
    kk, _ = cache.gather(0, kernel_view=False)
    assert torch.equal(kk, ref.values) and not torch.equal(kk, default.values)


def test_nvfp4_options_are_checked():
    k, v = _kv(lens=(20,))
    with pytest.raises(ValueError, match="nvfp4_options"):
        PagedKVCache.from_float(k, v, "nvfp4", nvfp4_options={"global_scale": "flashinfer"})
    with pytest.raises(ValueError, match="nvfp4_options"):
        PagedKVCache.from_float(k, v, "e4m3", nvfp4_options={"four_over_six": True})


@pytest.mark.parametrize("fmt", ["e4m3", "e2m3", "e2m1", "nvfp4"])
def test_shared_pages_decode_once_with_the_same_bits(fmt):
    # A prefix cache points many block-table rows at the same pages: page_values decodes each distinct
    # page once and gathers; the result must be the page-by-page decode, in the requested order and shape.
    k, v = _kv()
    cache = PagedKVCache.from_float(k, v, fmt, page_size=16)
    pages = torch.tensor([[3, 0, 3], [1, 3, 0]])
    for which in ("k", "v"):
        got = cache.page_values(which, pages)
        assert got.shape == (2, 3, 16, 2, 128)
        for idx in pages.unique().tolist():
            one = cache.page_values(which, torch.tensor([idx]))[0]
            for pos in (pages == idx).nonzero().tolist():
                assert torch.equal(got[pos[0], pos[1]], one), (fmt, which, idx, pos)
        assert not torch.equal(got[0, 0], got[0, 1])  # distinct pages stay distinct


@pytest.mark.parametrize("fmt", ["e4m3", "e3m2", "e2m1", "nvfp4"])
def test_page_values_do_not_depend_on_the_decode_chunk(fmt, monkeypatch):
    """page_values decodes in chunks of pages (CUDA's 16x the CPU's): one page per chunk, a chunk of several
    pages, and everything in one chunk give the same values."""
    import mjolnir_numerics.cache as cache_module

    k, v = _kv()
    cache = PagedKVCache.from_float(k, v, fmt, page_size=16)
    pages = torch.arange(cache.num_pages).flip(0)
    per_page = 16 * cache.heads_k * cache.head_dim
    results = []
    for chunk in (1, 3 * per_page, 1 << 30):
        monkeypatch.setattr(cache_module, "_PAGE_VALUES_CHUNK", chunk)
        results.append(cache.page_values("k", pages).view(torch.int32))  # bits: unwritten pages hold NaN
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
    assert not torch.equal(results[0][0], results[0][-1])


def _check_page_codes(fmt, layout, device, monkeypatch):
    """``_page_codes`` against ``page_values`` on ``device``: every page of a cache (poisoned ones included, in a
    shuffled order, a few pages per decode chunk; one page holding every byte value and every scale code)."""
    import mjolnir_numerics.cache as cache_module

    k, v = _kv()
    k[0][:3] = 0.0
    k[0][3:5] = -0.0  # negative zeros survive every format's rounding
    cache = PagedKVCache.from_float(k, v, fmt, page_size=16, layout=layout, device=device)
    for pool, scales in (cache._pool("k"), cache._pool("v")):  # page 0: every byte, and every scale code (NaN too)
        for t in (pool, scales) if scales is not None else (pool,):
            raw = t[0].view(torch.uint8)
            raw.copy_((torch.arange(raw.numel()) * 7 % 256).to(torch.uint8).view(raw.shape))
    pages = torch.randperm(cache.num_pages, generator=torch.Generator().manual_seed(1)).to(device)
    per_chunk = 3 * 16 * cache.heads_k * cache.head_dim  # a few pages per decode chunk
    monkeypatch.setattr(cache_module, "_PAGE_VALUES_CHUNK", per_chunk)
    monkeypatch.setattr(cache_module, "_PAGE_VALUES_CHUNK_CUDA", per_chunk)
    for which in ("k", "v"):
        codes = cache._page_codes(which, pages)
        want = cache.page_values(which, pages)
        assert codes.dtype == torch.uint8 and codes.shape == want.shape and codes.device == want.device
        got = E4M3.values(codes.device)[codes.long()]
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (fmt, layout, which)
    assert bool((cache._page_codes("k", pages) == 0x80).any())  # -0 reached the codes


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_page_codes_hold_the_page_values_as_e4m3_codes(fmt, layout, monkeypatch):
    """The emulator's CUDA path gathers tiles as e4m3 codes (``_page_codes``): the codes' e4m3 values are the
    kernel's values bit for bit, signed zeros and NaNs included (here on CPU tensors)."""
    _check_page_codes(fmt, layout, "cpu", monkeypatch)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", ["e2m1", "nvfp4"])
def test_code_pairs_in_one_pass_give_the_page_codes(fmt, layout, monkeypatch):
    """On CUDA a 4-bit pool's gather and pair lookup are one compiled pass (``_code_pairs``, run here eagerly):
    the same check as above, taken by that path (NVFP4 with its 16-value blocks)."""
    import mjolnir_numerics.cache as cache_module

    stand_in = FusedOnTheCpu()
    monkeypatch.setattr(cache_module, "fused", stand_in)
    _check_page_codes(fmt, layout, "cpu", monkeypatch)
    assert stand_in.taken and set(stand_in.taken) == {("_code_pairs", 16 if fmt == "nvfp4" else 0)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_page_codes_match_on_cuda(fmt, layout, monkeypatch):
    """The same on CUDA, where ``page_values`` rounds NVFP4's products by the fused quantize kernel while
    ``_page_codes`` looks them up in a table the CPU's ``quantize`` built."""
    _check_page_codes(fmt, layout, "cuda", monkeypatch)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_page_codes_of_every_nvfp4_scale_and_byte(layout):
    """NVFP4's codes come from a table at ``scale_code << 8 | byte``: 32 pages hold each of the 65,536 pairs of a
    scale code (NaN codes and signed zeros included) and a byte of its block, and every pair's two codes are
    the e4m3 codes of the values ``page_values`` gives."""
    cache = PagedKVCache.from_float(*_kv(lens=(512,)), "nvfp4", page_size=16, layout=layout)
    pool, scales = cache._pool("k")
    assert cache.num_pages >= 32
    slots = torch.arange(32 * math.prod(scales.shape[1:])).view(32, *scales.shape[1:])  # (32, PS, h_k, d / 16)
    scales[:32].view(torch.uint8).copy_((slots % 256).to(torch.uint8))
    byte = (slots // 256 * 8).unsqueeze(-1) + torch.arange(8)  # each block's 8 bytes
    pool[:32].view(torch.uint8).copy_((byte % 256).to(torch.uint8).flatten(-2))
    assert torch.equal(torch.unique((slots % 256).unsqueeze(-1) * 256 + byte % 256), torch.arange(65536))
    pages = torch.arange(32).flip(0)
    codes = cache._page_codes("k", pages)
    want = cache.page_values("k", pages)
    assert torch.equal(E4M3.values(torch.device("cpu"))[codes.long()].view(torch.int32), want.view(torch.int32))
