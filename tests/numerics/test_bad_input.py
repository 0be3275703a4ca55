"""Bad input is refused with an error naming the argument, never truncated, clamped or turned into NaN
output. One test per class of the audit of 2026-12-01 (652 bad and edge calls across the API; each of
these failed on the code before it, commit f3fc083 or 0c3a3cc)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mjolnir_numerics import (
    E4M3,
    PagedKVCache,
    chunked_plan,
    compute_descale,
    emulate_decode,
    error_metrics,
    nvfp4_quantize,
    pack,
    plan_split_kv,
    quantize_q,
    reference_decode,
    unpack_o,
)
from mjolnir_numerics.checks import ArgumentTypeError
from mjolnir_numerics.synthetic import make_kv
from mjolnir_numerics.targets import THOR, Target

G = torch.Generator().manual_seed(0)
K = torch.randn(2, 20, 2, 128, generator=G)
V = torch.randn(2, 20, 2, 128, generator=G)
Q = torch.randn(2, 8, 128, generator=G).to(torch.bfloat16)


def _cache(fmt="e4m3", **kw):
    return PagedKVCache.from_float(K, V, fmt, **{"page_size": 16, **kw})


# -- a float, bool or string where an int is meant: refused, never truncated ----------------------------
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: E4M3.code_value(1.5), "code: expected an int"),
        (lambda: E4M3.code_value(True), "code: expected an int"),
        (lambda: pack(torch.zeros(4, dtype=torch.uint8), 4.0), "bits: 4.0 is not one of"),
        (lambda: _cache(page_size=16.0), "page_size: 16.0 is not one of"),
        (lambda: _cache(spare_pages=True), "spare_pages: expected an int"),
        (lambda: _cache(seed=1.5), "seed: expected an int"),
        (lambda: _cache().gather(1.0), "seq: expected an int"),
        (lambda: _cache().gather(True), "seq: expected an int"),
        (lambda: unpack_o(torch.zeros(2, 2, 4, 128), 2, True, 2), "q_len: expected an int"),
        (lambda: unpack_o(torch.zeros(2, 2, 4, 128), 2, 0, 2), "q_len: expected an int >= 1"),
        (lambda: plan_split_kv([1.5, 300], 2), r"seq_lens\[0\]: expected an int"),
        (lambda: chunked_plan([-5]), r"seq_lens\[0\]: expected an int >= 0"),
        (lambda: chunked_plan([True]), r"seq_lens\[0\]: expected an int"),
        (lambda: THOR.ctas(128.0), "head_dim: expected an int"),
        (lambda: make_kv("gaussian", 2, 64.0, 8, 2, 128), "seq_len: expected an int or a list"),
        (lambda: make_kv("gaussian", 2, 64, 8, 2, 128, seed=1.5), "seed: expected an int"),
        (lambda: nvfp4_quantize(torch.randn(4, 32), True), "group: expected an int"),
        (lambda: nvfp4_quantize(torch.randn(4, 32), four_over_six="no"), "four_over_six: expected True or False"),
    ],
)
def test_a_non_int_where_an_int_is_meant_is_refused(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()


def test_numpy_and_0d_integer_scalars_are_ints():
    assert E4M3.code_value(np.int64(0x38)) == 1.0
    assert _cache().gather(torch.tensor(1))[0].shape == (20, 2, 128)


# -- the wrong kind of object: a clear error, not an AttributeError from inside -------------------------
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: PagedKVCache.from_float(K, None), "v: expected a float"),
        (lambda: compute_descale(None, "e4m3"), "x: expected a float"),
        (lambda: _cache().page_values("k", [0, 1]), "pages: expected a torch.Tensor"),
        (lambda: _cache().page_values("k", torch.tensor([0.7])), "pages: expected an integer tensor"),
        (lambda: _cache().page_values("k", torch.tensor([-1])), "pages: page indices must be in 0..5"),
        (lambda: emulate_decode(Q, None), "cache: expected a PagedKVCache"),
        (lambda: emulate_decode(Q, _cache().k_pool), "cache: expected a PagedKVCache"),
        (lambda: plan_split_kv(5, 2), "seq_lens: expected a list of ints"),
        (lambda: make_kv("gaussian", 2, 64, 8, 2, 128, generator="x"), "generator: expected a torch.Generator"),
        (lambda: error_metrics("s", [1.0], [1.0], torch.zeros(2), torch.zeros(2)), "o: expected a torch.Tensor"),
        (lambda: error_metrics("s", torch.ones(6), torch.ones(5), torch.zeros(2), torch.zeros(2)), "o: shape"),
        (lambda: error_metrics("s", torch.ones(6), torch.ones(6), torch.zeros(2), torch.zeros(3)), "lse: shape"),
        (lambda: _cache(device="nodevice"), "device: 'nodevice' is not a device name"),
        (lambda: _cache("nvfp4", nvfp4_options=[("four_over_six", True)]), "nvfp4_options: expected a dict"),
        (lambda: PagedKVCache.from_float(K[..., :6], V[..., :6], "e3m2"), "k: head dim 6 does not fill whole"),
    ],
)
def test_the_wrong_kind_of_argument_is_named(call, match):
    with pytest.raises((TypeError, ValueError), match=match):
        call()


def test_argument_type_errors_are_type_and_value_errors():
    with pytest.raises(TypeError):
        plan_split_kv(5, 2)
    with pytest.raises(ValueError):
        plan_split_kv(5, 2)
    assert issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, ValueError)


# -- non-finite and out-of-range values: refused, not NaN output ----------------------------------------
def test_nan_q_and_scales_that_do_not_survive_fp32_are_refused():
    c = _cache()
    bad = Q.clone()
    bad[1, 3, 7] = float("nan")
    with pytest.raises(ValueError, match="q: holds inf or NaN"):
        emulate_decode(bad, c)
    q8, qd = quantize_q(Q, 2, 1, 2)
    codes = q8.view(torch.uint8).clone()
    codes[0, 0, 0] = 0x7F
    with pytest.raises(ValueError, match="q: holds the e4m3 NaN code"):
        emulate_decode(codes.view(torch.float8_e4m3fn), c, q_descale=qd)
    with pytest.raises(ValueError, match="softmax_scale: 1e-46 rounds to 0 in fp32"):
        emulate_decode(Q, c, softmax_scale=1e-46)
    with pytest.raises(ValueError, match="softmax_scale: 1e-45 times log2"):
        emulate_decode(Q, c, softmax_scale=1e-45)  # the exponent scale c underflows: -inf * 0 = NaN
    with pytest.raises(ValueError, match="softmax_scale: 1e\\+39 overflows fp32"):
        emulate_decode(Q, c, softmax_scale=1e39)
    with pytest.raises(TypeError, match="softmax_scale: expected a number"):
        emulate_decode(Q, c, softmax_scale=torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="causal: expected True or False"):
        emulate_decode(Q, c, causal="no")
    with pytest.raises(ValueError, match="q: holds inf or NaN"):
        reference_decode(bad.float(), K, V)
    kn = K.clone()
    kn[0, 3, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="k: holds inf or NaN"):
        reference_decode(Q.float(), kn, V)
    with pytest.raises(ValueError, match="softmax_scale"):
        make_kv("gaussian", 2, 64, 8, 2, 128, softmax_scale=float("inf"))
    with pytest.raises(ValueError, match="scale_floor"):
        nvfp4_quantize(torch.randn(4, 32), scale_floor=float("inf"))


def _edited(edit):
    """A fresh cache (2 sequences of 20 keys, pages of 16), ``edit`` applied in place, with its Q arguments."""
    c = _cache()
    kw = {"q_descale": torch.ones(()), "q_len": 1}
    edit(c, kw)
    return c, kw


def _set(tensor, index, value):
    tensor[index] = value


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda c, kw: _set(c.seq_lens, 1, -3), r"seq_lens: must be >= 0, got \[20, -3\]"),
        (lambda c, kw: _set(c.seq_lens, 0, 40), "seq_lens: sequence 0 has 40 keys = 3 pages of 16, but its "),
        (lambda c, kw: _set(c.block_table, (1, 1), c.num_pages), r"block_table: referenced page indices must be in "
         rf"0\.\.{_cache().num_pages - 1}, got range \[\d+, {_cache().num_pages}\]"),
        (lambda c, kw: _set(c.block_table, (0, 0), -1), r"block_table: .*got range \[-1, "),
        (lambda c, kw: c.k_descale.zero_(), "k_descale: descales must be positive and finite"),
        (lambda c, kw: c.v_descale.fill_(math.inf), "v_descale: descales must be positive"),
        (lambda c, kw: kw.update(q_descale=torch.tensor([1.0, -1.0])), "q_descale: descales must be positive"),
        (lambda c, kw: kw.update(q_len=21), "q_len: 21 exceeds seq_len 20 of sequence 0"),  # 20 keys
        (lambda c, kw: (_set(c.seq_lens, 1, 3), kw.update(q_len=4)), "q_len: 4 exceeds seq_len 3"),
        # two faults: the first in the order of the checks is reported
        (lambda c, kw: (_set(c.seq_lens, 1, -3), c.k_descale.zero_()), "seq_lens: must be >= 0"),
        (lambda c, kw: (c.v_descale.zero_(), c.k_descale.zero_()), "k_descale"),
        (lambda c, kw: (c.v_descale.zero_(), kw.update(q_descale=torch.zeros(2))), "v_descale"),
        (lambda c, kw: (_set(c.seq_lens, 1, 3), kw.update(q_len=4, nan_q=True)), "q: holds inf or NaN"),
        (lambda c, kw: (_set(c.seq_lens, 1, 3), kw.update(q_len=4, q_descale=torch.zeros(2))), "q_len: 4 exceeds"),
    ],
)  # fmt: skip
def test_the_emulator_refuses_values_edited_into_its_cache(edit, match):
    """Each value emulate_decode checks on the device (seq_lens, the block table's references, the descales, Q,
    the exponent scale) is refused with its own error, and of two faults the first in the order of the checks is
    reported; the block table's unused entries are not checked (a sequence's pages past its end)."""
    c, kw = _edited(edit)
    q = Q if kw["q_len"] == 1 else torch.randn(2 * kw["q_len"], 8, 128, generator=G).to(torch.bfloat16)
    if kw.pop("nan_q", False):
        q = q.clone()
        q[-1, 0, 0] = math.nan
    with pytest.raises(ValueError, match=match):
        emulate_decode(q, c, **kw)


def test_the_emulator_reads_no_unused_block_table_entry():
    """An entry past a sequence's last page may hold anything (a serving stack's stale page): no error, and
    the same bits as with a valid page there."""
    c = _cache()
    c.seq_lens[1] = 10  # one page of 16: the second entry of its row is unused
    want = emulate_decode(Q, c)
    for stale in (-7, -1, c.num_pages, c.num_pages + 100):  # below and past the pool, one wrapping index among them
        c.block_table[1, 1] = stale
        got = emulate_decode(Q, c)
        assert all(torch.equal(a, b) for a, b in zip(want, got)), stale


def test_error_metrics_never_score_zeros_or_nan_as_perfect():
    z, one = torch.zeros(6), torch.ones(6)
    assert error_metrics("s", z, one, torch.zeros(2), torch.zeros(2)).cosine == 0.0
    assert error_metrics("s", z, z, torch.zeros(2), torch.zeros(2)).cosine == 1.0
    assert math.isnan(error_metrics("s", torch.full((6,), math.nan), one, torch.zeros(2), torch.zeros(2)).cosine)


# -- a scale far off the data: refused (some values saturating is the formats' defined behaviour) --------
def test_a_scale_under_which_no_value_survives_is_refused():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    for g in (1e-8, 1e6, 1e-6):  # every value saturates / rounds to 0 / most saturate
        with pytest.raises(ValueError, match="global_value: .* is far off the data"):
            nvfp4_quantize(x, global_value=g)
    nvfp4_quantize(x, global_value=float(x.abs().max()) / 2688 / 4)  # the largest values saturate: allowed
    with pytest.raises(ValueError, match="k_descale: .* is far off the data"):
        _cache(k_descale=torch.tensor(1e-4))
    with pytest.raises(ValueError, match="k_descale: .* is far off the data"):
        _cache("nvfp4", k_descale=torch.tensor(1e-9))
    c = _cache(k_descale=torch.tensor(0.01))  # |K| <= ~4 against 448 * 0.01 = 4.48: fits
    with pytest.raises(ValueError, match="v_descale: .* is far off the data"):
        c.write(torch.randn(1, 2, 128), torch.randn(1, 2, 128) * 1e9, torch.tensor([5]))


# -- targets describe a kernel that exists --------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(max_splits=0), "max_splits: expected an int >= 1"),
        (dict(q_tiles=()), "q_tiles: expected a non-empty ascending tuple"),
        (dict(q_tiles=(16, 8)), "q_tiles: expected a non-empty ascending tuple"),
        (dict(ctas_per_sm=((128, 0),)), "ctas_per_sm ctas: expected an int >= 1"),
    ],
)
def test_a_target_that_cannot_describe_a_kernel_is_refused(kw, match):
    base = dict(name="x", arch="sm_90a", backend="hopper", sm_count=132, ctas_per_sm=((128, 2),), q_tiles=(8, 16),
                fp8_min_q_tile=8, max_splits=32)  # fmt: skip
    with pytest.raises(ValueError, match=match):
        Target(**{**base, **kw})
