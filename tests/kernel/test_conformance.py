"""The decode kernel of this GPU against the spec (mjolnir_numerics.emulate_decode): the shared named
cases and the kernel cases of mjolnir_kernel.conformance, with default arguments on both sides (the same
plan: mjolnir_numerics.default_plan for the device's target). Runs on a GPU a kernel runs on (the Hopper
kernel on compute capability 9.0, the Thor kernel on 10.x / 11.x); skips with the reason elsewhere.
Tolerances: mjolnir_kernel.conformance (named, derived there)."""

import dataclasses

import pytest
import torch

from mjolnir_kernel.arch import decode_device_reason
from mjolnir_kernel.compile import cutlass_available
from mjolnir_kernel.conformance import KERNEL_CASES, case_flip_atol, compare_outputs, permute_pages
from mjolnir_numerics.cases import CASES
from mjolnir_numerics.plan import default_plan
from mjolnir_numerics.targets import target_for

_REASON = cutlass_available() or decode_device_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"kernel conformance needs a GPU a kernel runs on: {_REASON}"),
]

GPU_CASES = CASES + KERNEL_CASES


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    return a.shape == b.shape and torch.equal(a.view(view), b.view(view))


@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_matches_spec_with_default_arguments(case):
    """``decode(q, cache)`` and ``emulate_decode(q, cache)`` with the same arguments and no plan: both make
    the device target's default plan (the plans are equal), and the outputs meet the named tolerances;
    the summary line says how many bits are identical."""
    from mjolnir_kernel import decode
    from mjolnir_numerics.emulator import emulate_decode

    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()  # plan None unless the case forces splits
    o, lse, plan = decode(inputs.q, inputs.cache, **kw, return_plan=True)
    ref = emulate_decode(inputs.q, inputs.cache, **kw, return_details=True)
    assert plan == ref.plan, f"{case.name}: decode planned {plan}, emulate_decode {ref.plan}"
    assert not torch.isnan(o.float()).any(), f"{case.name}: NaN in O (stray read of a poisoned page?)"
    report = compare_outputs(o.cpu(), lse.cpu(), ref.o.cpu(), ref.lse.cpu(), o_flip_atol=case_flip_atol(inputs))
    print(f"CONFORMANCE {case.name}: {report.summary()}")
    assert report.ok, f"{case.name}: {report.summary()}"


def test_empty_sequences_give_zero_and_minus_inf():
    from mjolnir_kernel import decode

    case = next(c for c in KERNEL_CASES if c.name == "seq_len_0_padding")
    inputs = case.build("cuda")
    o, lse = decode(inputs.q, inputs.cache, **inputs.emulator_kwargs())
    empty = [i for i, L in enumerate(case.seq_lens) if L == 0]
    o4 = o.view(len(case.seq_lens), case.q_len, case.heads_q, case.head_dim)
    assert (o4[empty] == 0).all()
    assert torch.isneginf(lse[empty]).all()


@pytest.mark.parametrize("q_dtype", ["e4m3", "bf16"])
def test_batch_invariant_plan_gives_a_sequence_the_same_bits_in_any_batch(q_dtype):
    """One sequence (3000 keys) alone and inside three batches, plan="batch_invariant" on both sides: the
    kernel's O and LSE for it are the same bits every time, and the spec's plan is the kernel's."""
    from mjolnir_kernel import decode
    from mjolnir_numerics import PagedKVCache, emulate_decode, quantize_q

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3000, 2, 128, generator=g), torch.randn(3000, 2, 128, generator=g), torch.randn(1, 8, 128,
         generator=g))  # fmt: skip
    others = [tuple(torch.randn(*s, generator=g) for s in ((n, 2, 128), (n, 2, 128), (1, 8, 128)))
              for n in (40000, 200, 7000, 12000)]  # fmt: skip
    outs = []
    for batch in ([], others[:1], others[1:3], others):
        seqs = [x, *batch]
        cache = PagedKVCache.from_float([s[0] for s in seqs], [s[1] for s in seqs], "e4m3", page_size=64,
                                        granularity="per_seq_head", device="cuda")  # fmt: skip
        q = torch.cat([s[2] for s in seqs]).to(torch.bfloat16)
        kw = {}
        if q_dtype == "e4m3":
            q, kw["q_descale"] = quantize_q(q, len(seqs), 1, 2)
            kw["q_descale"] = kw["q_descale"].cuda()
        o, lse, plan = decode(q.cuda(), cache, plan="batch_invariant", return_plan=True, **kw)
        ref = emulate_decode(q.cuda(), cache, plan="batch_invariant", return_details=True, **kw)
        assert plan == ref.plan
        outs.append((o[:1].cpu(), lse[:1].cpu()))
    for o, lse in outs[1:]:
        assert _same_bits(o, outs[0][0]) and _same_bits(lse, outs[0][1])


def test_padded_work_list_is_bit_identical():
    from mjolnir_kernel import decode

    case = next(c for c in CASES if c.name == "varlen")
    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    kw.pop("plan")
    o1, l1, plan = decode(inputs.q, inputs.cache, **kw, return_plan=True)
    rows = case.q_len * case.heads_q // case.heads_k
    target = target_for(inputs.q.device)
    padded = default_plan(list(case.seq_lens), case.heads_k, rows, target=target, q_dtype=case.q_dtype,
                          head_dim=case.head_dim, pad_to=plan.num_work + 37)  # fmt: skip
    assert padded.work[: plan.num_work] == plan.work
    o2, l2 = decode(inputs.q, inputs.cache, plan=padded, **kw)
    assert padded.num_work == plan.num_work + 37
    assert _same_bits(o1, o2) and _same_bits(l1, l2)


def test_permuted_page_assignment_is_bit_identical():
    """Moving every page elsewhere in the pool (and the block table with it) changes no bit."""
    from mjolnir_kernel import decode

    case = next(c for c in CASES if c.name == "varlen")
    inputs = case.build("cuda")
    permuted = permute_pages(inputs.cache)
    kw = inputs.emulator_kwargs()
    o1, l1 = decode(inputs.q, inputs.cache, **kw)
    o2, l2 = decode(inputs.q, permuted, **kw)
    assert not torch.equal(permuted.block_table, inputs.cache.block_table)
    assert _same_bits(o1, o2) and _same_bits(l1, l2)


def test_q_and_o_inside_wider_rows():
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
    o_ref, _ = decode(inputs.q, inputs.cache, **kw)
    o, _ = decode(qv, inputs.cache, out=ov, **kw)
    assert o.data_ptr() == ov.data_ptr()
    assert _same_bits(ov, o_ref)
    assert torch.isnan(obuf[:, h_q * d :].float()).all(), "wrote outside O's columns"


def test_pdl_gives_the_same_bits():
    """Programmatic dependent launch only moves the reduction grid's launch earlier (it waits on the decode
    grid): O and LSE are bit-identical to the plain launch, on a case that goes through the reduction."""
    from mjolnir_kernel import decode, prepare

    case = next(c for c in CASES if c.name == "forced_splits")
    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    o1, l1, plan = decode(inputs.q, inputs.cache, **kw, return_plan=True)
    assert max(plan.n_splits) > 1, "the case must exercise the split reduction"
    config = dataclasses.replace(prepare(inputs.q, inputs.cache, **kw).config, pdl=True)
    o2, l2 = decode(inputs.q, inputs.cache, **kw, config=config)
    assert _same_bits(o1, o2) and _same_bits(l1, l2)


def test_graph_replays_repeat_the_bits():
    """A prepared call captured in a CUDA graph gives the eager call's bits on every replay (no state
    survives a launch), through the split reduction of 32 and 21 chunks over three query tiles."""
    from mjolnir_kernel import decode, prepare

    case = next(c for c in GPU_CASES if c.name == "hopper_32_splits_three_q_tiles")
    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    o1, l1 = decode(inputs.q, inputs.cache, **kw)
    stream = torch.cuda.Stream()  # the prepared launch is bound to the stream current at prepare time
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        prep = prepare(inputs.q, inputs.cache, **kw)
        assert prep.plan.n_splits == (32, 1, 1, 21)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            prep.launch()
        for _ in range(3):
            o_buf, l_buf = prep.outputs()
            o_buf.fill_(float("nan"))
            l_buf.fill_(float("nan"))
            graph.replay()
            o2, l2 = prep.outputs()
            assert _same_bits(o1, o2) and _same_bits(l1, l2)
        stream.synchronize()


def test_a_config_that_does_not_fit_the_call_is_refused():
    from mjolnir_kernel import decode, prepare

    case = next(c for c in CASES if c.name == "varlen")
    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    config = prepare(inputs.q, inputs.cache, **kw).config
    with pytest.raises(ValueError, match=r"^config: does not match the call: head_dim=256 \(the call needs 128\)"):
        decode(inputs.q, inputs.cache, **kw, config=dataclasses.replace(config, head_dim=256))
