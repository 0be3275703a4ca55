"""The Hopper kernel's converter warps (``HopperConfig.converters``: fp6 at d = 128 and NVFP4) against the spec,
bit for bit: the named cases and the kernel cases of those formats, work items of one to three tiles (the tile
pairs' first uses, before any EMPTY wait), an empty sequence, a CUDA-graph work list padded with empty items
(their CTAs exit before any barrier), and random cases. Runs on a Hopper GPU; skips with the reason elsewhere.
``tests/kernel/test_conformance.py`` runs every format with the named tolerances."""

import pytest
import torch

from mjolnir_kernel.arch import decode_device_reason
from mjolnir_kernel.compile import cutlass_available
from mjolnir_kernel.conformance import KERNEL_CASES, random_cases
from mjolnir_kernel.hopper.config import HopperConfig
from mjolnir_numerics.cases import CASES, DecodeCase

_REASON = cutlass_available() or decode_device_reason()
_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"needs a GPU a kernel runs on: {_REASON}"),
    pytest.mark.skipif(not _HOPPER, reason="converter warps are the Hopper (sm_90a) kernel's"),
]

CONVERTED_FORMATS = ("e3m2", "e2m3", "nvfp4")
SHORT_CASES = tuple(
    DecodeCase(f"converters_few_tiles_{fmt}", (100, 256, 300, 384, 0), heads_q=32, heads_k=8, fmt=fmt, page_size=64)
    for fmt in CONVERTED_FORMATS
)
ALL_CASES = CASES + KERNEL_CASES + SHORT_CASES + random_cases(12, seed=27, formats=CONVERTED_FORMATS)
CONVERTER_CASES = [
    c for c in ALL_CASES if HopperConfig(head_dim=c.head_dim, kv_format=c.fmt, q_dtype=c.q_dtype).converters
]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    view = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    return a.shape == b.shape and torch.equal(a.view(view), b.view(view))


def _check_against_the_spec(name, inputs, kw):
    from mjolnir_kernel import decode
    from mjolnir_numerics.emulator import emulate_decode

    o, lse, plan = decode(inputs.q, inputs.cache, **kw, return_plan=True)
    ref = emulate_decode(inputs.q, inputs.cache, **kw, return_details=True)
    assert plan == ref.plan, f"{name}: decode planned {plan}, emulate_decode {ref.plan}"
    differ = int((o.view(torch.int16) != ref.o.view(torch.int16)).sum()) if o.shape == ref.o.shape else -1
    assert _same_bits(o, ref.o), f"{name}: O differs from the spec in {differ} places"
    assert _same_bits(lse, ref.lse), f"{name}: LSE differs from the spec"


def test_the_cases_cover_every_converted_format_and_head_dim():
    covered = {(c.fmt, c.head_dim) for c in CONVERTER_CASES}
    assert covered == {("e3m2", 128), ("e2m3", 128), ("nvfp4", 128), ("nvfp4", 256)}, covered


@pytest.mark.parametrize("case", CONVERTER_CASES, ids=lambda c: c.name)
def test_converter_warps_give_the_spec_bits(case):
    inputs = case.build("cuda")
    _check_against_the_spec(case.name, inputs, inputs.emulator_kwargs())


@pytest.mark.parametrize("fmt", ["e3m2", "nvfp4"])
def test_converter_warps_on_a_padded_work_list(fmt):
    from mjolnir_numerics.plan import default_plan
    from mjolnir_numerics.targets import target_for

    case = DecodeCase("converters_padded", (100, 900, 0, 3000), heads_q=32, heads_k=8, fmt=fmt, page_size=64)
    inputs = case.build("cuda")
    plan = default_plan(
        list(case.seq_lens), case.heads_k, case.heads_q // case.heads_k, target=target_for(inputs.q.device),
        q_dtype="e4m3", head_dim=case.head_dim, pad_to=4 * 64,
    )  # fmt: skip
    assert plan.num_work == 4 * 64
    _check_against_the_spec(case.name, inputs, dict(inputs.emulator_kwargs(), plan=plan))
