"""The kernel-vs-spec helpers of mjolnir_kernel.conformance on the CPU: the comparison and its named
tolerances, the P-flip bound, and the page permutation used as a metamorphic test."""

import torch

from mjolnir_kernel.conformance import (
    O_MAX_ULP_BF16,
    P_STEP_BF16,
    P_STEP_E4M3,
    compare_outputs,
    p_flip_atol,
    permute_pages,
)
from mjolnir_numerics.cases import CASES
from mjolnir_numerics.emulator import emulate_decode


def _outputs(n=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    o = torch.randn(n, generator=g).to(torch.bfloat16).view(16, 2, -1)
    lse = torch.randn(16, 2, 4, generator=g).abs() + 1.0
    return o, lse


def _nudge(o, flat_index, ulps):
    out = o.clone()
    bits = out.view(-1).view(torch.int16)
    bits[flat_index] += ulps
    return out


def test_identical_outputs_pass():
    o, lse = _outputs()
    r = compare_outputs(o, lse, o.clone(), lse.clone())
    assert r.ok and r.o_max_ulp == 0 and r.o_identical_fraction == 1.0 and r.o_max_abs == 0.0


def test_an_element_beyond_the_ulp_limit_needs_the_flip_bound():
    o, lse = _outputs()
    off = _nudge(o, 5, O_MAX_ULP_BF16 + 6)
    err = float((off.float() - o.float()).abs().max())
    assert not compare_outputs(off, lse, o, lse).ok  # no outliers allowed without a bound
    inside = compare_outputs(off, lse, o, lse, o_flip_atol=err)
    assert inside.ok and inside.o_flip_outliers == 1 and inside.o_max_ulp == O_MAX_ULP_BF16 + 6
    assert not compare_outputs(off, lse, o, lse, o_flip_atol=err / 2).ok


def test_the_identical_fraction_is_required_even_within_ulps():
    o, lse = _outputs()
    off = o.clone().view(-1)
    off.view(torch.int16)[: off.numel() // 10] += 1  # 10 % of elements 1 ulp off: within the ulp limit, < 95 %
    r = compare_outputs(off.view_as(o), lse, o, lse, o_flip_atol=1.0)
    assert r.o_max_ulp == 1 and r.o_identical_fraction < 0.95 and not r.ok


def test_p_flip_bound_is_one_p_code_step_times_v_and_the_scales():
    assert p_flip_atol(4.0, 0.5, 2.0, "e4m3") == P_STEP_E4M3 * 4.0 * 0.5 * 2.0
    assert p_flip_atol(4.0, 0.5, -2.0, "bf16") == P_STEP_BF16 * 4.0 * 0.5 * 2.0
    assert P_STEP_E4M3 == 32 / 448  # the e4m3 code step in [256, 448], in p units


def test_permuted_pages_hold_the_same_cache():
    case = next(c for c in CASES if c.name == "varlen")
    inputs = case.build("cpu")
    cache = inputs.cache
    moved = permute_pages(cache)
    assert not torch.equal(moved.block_table, cache.block_table)
    assert not torch.equal(moved.k_pool.view(torch.uint8), cache.k_pool.view(torch.uint8))
    for s in range(len(case.seq_lens)):
        for a, b in zip(cache.gather(s), moved.gather(s)):
            assert torch.equal(a, b)
    kw = inputs.emulator_kwargs()
    o1, l1 = emulate_decode(inputs.q, cache, **kw)
    o2, l2 = emulate_decode(inputs.q, moved, **kw)
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(l1, l2)


def test_random_cases_are_reproducible_supported_and_cover_the_space():
    import pytest

    from mjolnir_kernel.conformance import random_cases
    from mjolnir_numerics.capability import KV_FORMATS, check_supported
    from mjolnir_numerics.cases import PATTERNS

    cases = random_cases(200, seed=5, max_keys=4096)
    assert cases == random_cases(200, seed=5, max_keys=4096) and cases != random_cases(200, seed=6, max_keys=4096)
    assert len({c.name for c in cases}) == 200 and cases[3].name == "fuzz_5_3"
    for c in cases:
        check_supported(c.fmt, c.q_dtype, c.head_dim, c.page_size)
        assert all(n == 0 or c.q_len <= n <= 4096 for n in c.seq_lens)
    assert {c.fmt for c in cases} == set(KV_FORMATS) and {c.q_dtype for c in cases} == {"bf16", "e4m3"}
    assert {c.pattern for c in cases} == set(PATTERNS) and {c.q_len for c in cases} >= {1, 2, 3, 4, 8}
    assert any(0 in c.seq_lens for c in cases) and {c.causal for c in cases} == {True, False}
    with pytest.raises(ValueError, match="n: expected an int >= 0"):
        random_cases(-1)


def test_cases_restricted_to_formats_and_head_dims():
    """``--formats`` / ``--head-dims``: random cases drawn only from those (reproducible, every one of them
    drawn), named cases filtered to them, and a format or head dim the kernels do not take refused by name."""
    import pytest

    from mjolnir_kernel.conformance import KERNEL_CASES, random_cases, select_cases

    cases = random_cases(60, seed=2, formats=("e3m2", "e2m3"), head_dims=(256,))
    assert cases == random_cases(60, seed=2, formats=("e3m2", "e2m3"), head_dims=(256,))
    assert {c.fmt for c in cases} == {"e3m2", "e2m3"} and {c.head_dim for c in cases} == {256}
    named = select_cases(CASES + KERNEL_CASES, formats=("e3m2", "e2m3"))
    assert named and all(c.fmt in ("e3m2", "e2m3") for c in named)
    assert len(named) == sum(c.fmt in ("e3m2", "e2m3") for c in CASES + KERNEL_CASES)
    assert select_cases(CASES, head_dims=(128, 256)) == tuple(CASES)
    with pytest.raises(ValueError, match="formats: 'e5m2' is not one of"):
        random_cases(1, formats=("e5m2",))
    with pytest.raises(ValueError, match="head_dims: 96 is not one of"):
        select_cases(CASES, head_dims=(96,))
    with pytest.raises(ValueError, match="formats: expected at least one of"):
        select_cases(CASES, formats=())


def test_conform_reports_each_row_as_its_case_finishes():
    """``on_row`` sees every row as it is made (the command prints them as they come): here on the CPU,
    where the kernel refuses to run, as the failing row that names the error."""
    from mjolnir_kernel.conformance import conform

    seen = []
    rows = conform(CASES[:2], device="cpu", on_row=seen.append)
    assert seen == rows and len(rows) == 2
    assert all(not r.report.ok and "DeviceError" in r.case for r in rows)


def test_case_flip_atol_follows_the_cases_v_values():
    from mjolnir_kernel.conformance import case_flip_atol

    x = next(c for c in CASES if c.name == "varlen").build()
    cache = x.cache
    used = torch.cat([cache.block_table[i, : -(-n // cache.page_size)] for i, n in enumerate(cache.seq_lens.tolist())])
    v_abs = float(cache.page_values("v", used).abs().max())
    assert case_flip_atol(x) == p_flip_atol(v_abs, float(cache.v_descale.max()), 1.0, "e4m3") > 0


def test_conform_command_without_a_gpu_says_so(capsys):
    import pytest

    from mjolnir_kernel.__main__ import main
    from mjolnir_kernel.arch import decode_device_reason

    if decode_device_reason() is None:
        pytest.skip("a GPU a kernel runs on is present: conform would run")
    assert main(["conform", "--random", "1"]) == 2
    assert "conform: needs a GPU a kernel runs on" in capsys.readouterr().err
