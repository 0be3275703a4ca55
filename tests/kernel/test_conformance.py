"""The kernel against the spec (mjolnir_numerics.emulate_decode) on the shared named cases plus the
kernel-specific ones below. Runs where a tcgen05 GPU (compute capability 10.x / 11.x) is present;
skips with the reason elsewhere. Tolerances: mjolnir_kernel.conformance (named, derived)."""

import math

import pytest
import torch

from mjolnir_kernel.arch import tcgen05_device_reason
from mjolnir_kernel.compile import cutlass_available
from mjolnir_kernel.conformance import KERNEL_CASES, compare_outputs, permute_pages
from mjolnir_numerics.cases import CASES, DecodeCase
from mjolnir_numerics.plan import plan_split_kv

_REASON = cutlass_available() or tcgen05_device_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"kernel conformance needs a tcgen05 GPU: {_REASON}"),
]

ALL_CASES = CASES + KERNEL_CASES


def _run_both(case: DecodeCase, **kernel_options):
    from mjolnir_kernel import decode
    from mjolnir_numerics.emulator import emulate_decode

    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    if kw["plan"] is None:  # the emulator's default plan is Thor's (20 SMs); pin it for both sides
        rows = case.q_len * (case.heads_q // case.heads_k)
        kw["plan"] = plan_split_kv(list(case.seq_lens), case.heads_k, n_q_tiles=max(1, math.ceil(rows / 32)))
    o, lse = decode(inputs.q, inputs.cache, **kw, **kernel_options)
    o_ref, lse_ref = emulate_decode(inputs.q, inputs.cache, **kw)
    return inputs, kw, (o, lse), (o_ref, lse_ref)


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.name)
def test_kernel_matches_spec(case):
    _, _, (o, lse), (o_ref, lse_ref) = _run_both(case)
    assert not torch.isnan(o.float()).any(), f"{case.name}: NaN in O (stray read of a poisoned page?)"
    report = compare_outputs(o.cpu(), lse.cpu(), o_ref.cpu(), lse_ref.cpu())
    print(f"{case.name}: {report.summary()}")
    assert report.ok, f"{case.name}: {report.summary()}"


def test_empty_sequences_give_zero_and_minus_inf():
    case = next(c for c in KERNEL_CASES if c.name == "seq_len_0_padding")
    inputs, _, (o, lse), _ = _run_both(case)
    empty = [i for i, L in enumerate(case.seq_lens) if L == 0]
    o4 = o.view(len(case.seq_lens), case.q_len, case.heads_q, case.head_dim)
    assert (o4[empty] == 0).all()
    assert torch.isneginf(lse[empty]).all()


def test_padded_work_list_is_bit_identical():
    """A work list padded with empty items (fixed grid for CUDA graphs) changes nothing."""
    case = next(c for c in CASES if c.name == "varlen")
    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    from mjolnir_kernel import decode

    plan = plan_split_kv(list(case.seq_lens), case.heads_k)
    padded = plan_split_kv(list(case.seq_lens), case.heads_k, pad_to=plan.num_work + 37)
    kw.pop("plan")
    o1, l1 = decode(inputs.q, inputs.cache, plan=plan, **kw)
    o2, l2 = decode(inputs.q, inputs.cache, plan=padded, **kw)
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(l1, l2)


def test_permuted_page_assignment_is_bit_identical():
    """Metamorphic: moving every page elsewhere in the pool (and the block table with it) gives the
    same output bit for bit."""
    from mjolnir_kernel import decode

    case = next(c for c in CASES if c.name == "varlen")
    inputs = case.build("cuda")
    cache = inputs.cache
    permuted = permute_pages(cache)
    kw = inputs.emulator_kwargs()
    o1, l1 = decode(inputs.q, cache, **kw)
    o2, l2 = decode(inputs.q, permuted, **kw)
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(l1, l2)


def test_q_and_o_inside_wider_rows():
    """Q read in place from a fused-QKV-like buffer, O written in place into a wider buffer."""
    from mjolnir_kernel import decode

    case = next(c for c in CASES if c.name == "bf16_q")
    inputs = case.build("cuda")
    rows, h_q, d = inputs.q.shape
    width = (h_q + 2 * case.heads_k) * d
    qbuf = torch.zeros(rows, width, dtype=inputs.q.dtype, device="cuda")
    qv = qbuf[:, : h_q * d].view(rows, h_q, d)
    qv.copy_(inputs.q)
    obuf = torch.full((rows, width), float("nan"), dtype=torch.bfloat16, device="cuda")
    ov = obuf[:, : h_q * d].view(rows, h_q, d)
    kw = inputs.emulator_kwargs()
    o_ref, l_ref = decode(inputs.q, inputs.cache, **kw)
    o, lse = decode(qv, inputs.cache, out=ov, **kw)
    assert o.data_ptr() == ov.data_ptr()
    assert torch.equal(ov.view(torch.int16), o_ref.view(torch.int16))
    assert torch.isnan(obuf[:, h_q * d :].float()).all(), "wrote outside O's columns"
