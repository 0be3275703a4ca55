"""EXPERIMENT (issue 27): the Hopper kernel with converter warps (``HopperConfig.converter_warps``, 4 and 8)
against the spec with that kernel's walk (``arithmetic.kstep_groups`` walk ``"mma_sync_sm90_tiles"``: K from an
e4m3 tile for every format), on the named sub-byte cases; and NVFP4 at d = 128, whose default kernel already
reads K from a tile, against the default kernel's bits. Runs on a Hopper GPU; skips with the reason elsewhere."""

import dataclasses

import pytest
import torch

from mjolnir_kernel.arch import decode_device_reason
from mjolnir_kernel.compile import cutlass_available
from mjolnir_kernel.conformance import KERNEL_CASES, random_cases
from mjolnir_kernel.errors import ConfigError
from mjolnir_kernel.hopper.config import HopperConfig, can_implement_hopper
from mjolnir_numerics.cases import CASES, DecodeCase

_REASON = cutlass_available() or decode_device_reason()
_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"needs a GPU a kernel runs on: {_REASON}"),
    pytest.mark.skipif(not _HOPPER, reason="converter warps are a Hopper (sm_90a) kernel experiment"),
]


def _runs_with_converters(case, warps) -> bool:
    """A sub-byte case whose shape the kernel with ``warps`` converter warps implements (fp6 at d = 256 does
    not fit shared memory; eight converter warps run at d = 128 only)."""
    if case.fmt == "e4m3" or case.q_dtype != "e4m3":
        return False
    try:
        can_implement_hopper(
            HopperConfig(head_dim=case.head_dim, kv_format=case.fmt, q_dtype="e4m3", converter_warps=warps)
        )
    except ConfigError:
        return False
    return True


SUB_BYTE_FORMATS = ("e3m2", "e2m3", "e2m1", "nvfp4")
# work items of one, two and three tiles (the pairs' first uses, no EMPTY wait), and an empty sequence
SHORT_CASES = tuple(
    DecodeCase(f"converters_few_tiles_{fmt}", (100, 256, 300, 384, 0), heads_q=32, heads_k=8, fmt=fmt, page_size=64)
    for fmt in SUB_BYTE_FORMATS
)
ALL_CASES = CASES + KERNEL_CASES + SHORT_CASES + random_cases(12, seed=27, formats=SUB_BYTE_FORMATS)
SUB_BYTE_RUNS = [(c, w) for w in (4, 8) for c in ALL_CASES if _runs_with_converters(c, w)]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    return a.shape == b.shape and torch.equal(a.view(view), b.view(view))


def _converter_call(inputs, warps, plan=None):
    """(o, lse, plan) of the kernel with ``warps`` converter warps, the default config's other fields, and the
    case's plan (or ``plan``)."""
    from mjolnir_kernel import decode, prepare

    kw = inputs.emulator_kwargs()
    if plan is not None:
        kw["plan"] = plan
    config = dataclasses.replace(prepare(inputs.q, inputs.cache, **kw).config, converter_warps=warps)
    return decode(inputs.q, inputs.cache, **kw, config=config, return_plan=True)


def _check_against_the_spec(name, inputs, o, lse, plan):
    from mjolnir_numerics.emulator import emulate_decode
    from mjolnir_numerics.targets import target_for

    target = dataclasses.replace(target_for(inputs.q.device), walk="mma_sync_sm90_tiles")
    kw = dict(inputs.emulator_kwargs(), plan=plan)
    ref = emulate_decode(inputs.q, inputs.cache, **kw, target=target, return_details=True)
    differ = int((o.view(torch.int16) != ref.o.view(torch.int16)).sum()) if o.shape == ref.o.shape else -1
    assert _same_bits(o, ref.o), f"{name}: O differs from the spec in {differ} places"
    assert _same_bits(lse, ref.lse), f"{name}: LSE differs from the spec"


def _run_id(run) -> str:
    case, warps = run
    return f"{case.name}-cw{warps}"


@pytest.mark.parametrize("run", SUB_BYTE_RUNS, ids=_run_id)
def test_converter_warps_give_the_spec_bits_of_their_walk(run):
    case, warps = run
    inputs = case.build("cuda")
    o, lse, plan = _converter_call(inputs, warps)
    _check_against_the_spec(_run_id(run), inputs, o, lse, plan)


@pytest.mark.parametrize("warps", [4, 8])
def test_converter_warps_on_a_padded_work_list(warps):
    """A CUDA-graph work list padded with empty items (their CTAs exit at once, before any barrier)."""
    from mjolnir_numerics.plan import default_plan
    from mjolnir_numerics.targets import target_for

    case = DecodeCase("converters_padded", (100, 900, 0, 3000), heads_q=32, heads_k=8, fmt="e2m1", page_size=64)
    inputs = case.build("cuda")
    plan = default_plan(
        list(case.seq_lens), case.heads_k, case.heads_q // case.heads_k, target=target_for(inputs.q.device),
        q_dtype="e4m3", head_dim=case.head_dim, pad_to=4 * 64,
    )  # fmt: skip
    assert plan.num_work == 4 * 64
    o, lse, used = _converter_call(inputs, warps, plan)
    assert used == plan
    _check_against_the_spec(case.name, inputs, o, lse, plan)


@pytest.mark.parametrize("run", [r for r in SUB_BYTE_RUNS if r[0].fmt == "nvfp4" and r[0].head_dim == 128], ids=_run_id)
def test_converter_warps_give_the_default_kernels_bits_where_both_read_a_k_tile(run):
    from mjolnir_kernel import decode

    case, warps = run
    inputs = case.build("cuda")
    o, lse, plan = _converter_call(inputs, warps)
    o0, lse0 = decode(inputs.q, inputs.cache, **dict(inputs.emulator_kwargs(), plan=plan))
    assert _same_bits(o, o0) and _same_bits(lse, lse0), _run_id(run)
