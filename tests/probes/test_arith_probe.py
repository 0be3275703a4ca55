"""The GPU's arithmetic against the models, on the GPU (``benchmarks.probes.arith_probe``): one
``mma.sync.m16n8k16`` per test against ``arithmetic.block_fma``, the kernels' log against
``log_libdevice_f32``, their ex2 against the spec's bound; and the sweep's bookkeeping on the CPU."""

import math

import numpy as np
import pytest
import torch

from benchmarks.probes import arithmetic_sweep as sweep
from mjolnir_kernel import compile as kc
from mjolnir_numerics.arithmetic import MMA_MODELS, block_fma
from mjolnir_numerics.emulator_stages import exp2_f32, log_f32, log_libdevice_f32

_NO_CUTLASS = kc.cutlass_available()
_IS_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(
    _NO_CUTLASS is not None or not _IS_SM90,
    reason=f"needs an sm_90 GPU and the CuTe DSL ({_NO_CUTLASS or 'no sm_90 GPU'})",
)


def _bits(x):
    return x.contiguous().view(torch.int32)


@needs_sm90
@pytest.mark.parametrize("operand", ["f16", "bf16"])
def test_mma_sync_matches_the_model(operand, monkeypatch):
    from benchmarks.probes.arith_probe import compile_mma_probe, run_mma

    monkeypatch.setattr(sweep, "DEV", "cuda")
    dt = torch.float16 if operand == "f16" else torch.bfloat16
    compiled = compile_mma_probe(operand == "bf16")
    gen = torch.Generator(device="cuda").manual_seed(3)
    for name, (a, b, c) in sweep.mma_cases(operand, gen).items():
        hw = run_mma(compiled, a.to(dt).view(torch.int16), b.to(dt).view(torch.int16), c)
        model = block_fma(a[:, :, None, :], b[:, None, :, :], c, MMA_MODELS[f"sm90_{operand}"])
        same = (_bits(hw) == _bits(model)) | (hw.isnan() & model.isnan())
        assert bool(same.all()), f"{operand}/{name}: {int((~same).sum())} of {hw.numel()} differ"


@needs_sm90
def test_log_and_ex2_on_the_gpu():
    from benchmarks.probes.arith_probe import compile_unary_probe, run_unary

    x = torch.arange(0, 0x7F800001, 1237, dtype=torch.int64, device="cuda").to(torch.int32).view(torch.float32)
    hw = run_unary(compile_unary_probe("log"), x)
    assert torch.equal(_bits(hw), _bits(log_libdevice_f32(x)))
    neg = -torch.arange(0, 0x43160000, 1013, dtype=torch.int32, device="cuda").view(torch.float32)  # [-150, 0]
    e = run_unary(compile_unary_probe("ex2"), neg)
    d = (_bits(e).long() - _bits(exp2_f32(neg)).long()).abs()
    assert int(d.max()) <= 2 and int((d > 0).sum()) > 0  # the documented bound; not correctly rounded


def test_sweeps_count_against_their_models_on_the_cpu(monkeypatch, tmp_path):
    """With the models themselves as the 'hardware', every sweep counts 0 mismatches; with another function
    it counts them."""
    monkeypatch.setattr(sweep, "DEV", "cpu")
    monkeypatch.setattr(sweep, "CHUNK", 1 << 18)
    lo = int(np.float32(-0.9).view(np.uint32))
    hi = int(np.float32(-1.1).view(np.uint32))
    r = sweep.run_ex2(tmp_path, lo=lo, hi=hi, probe=(None, lambda _, x: exp2_f32(x)))
    assert r["ulp_diff_histogram"] == {0: hi - lo} and r["shift_structure"]["mismatches"] == 0
    assert r["shift_structure"]["checked"] > 0 and set(r["per_binade"]) == {"-1", "0"}
    r = sweep.run_ex2(tmp_path, lo=lo, hi=hi, probe=(None, lambda _, x: exp2_f32(x) * (1 + 2.0**-23)))
    assert r["ulp_diff_histogram"].get(0, 0) < hi - lo
    one = int(np.float32(1.0).view(np.uint32))
    r = sweep.run_log(tmp_path, lo=one, hi=one + (1 << 19), probe=(None, lambda _, x: log_libdevice_f32(x)))
    assert r["model_mismatches"] == 0 and r["inputs"] == (1 << 19) + len(sweep.LOG_SPECIALS)
    assert r["ulp_diff_vs_correctly_rounded"][1] > 0 and r["hw_not_correctly_rounded"]
    r = sweep.run_log(tmp_path, lo=one, hi=one + (1 << 19), probe=(None, lambda _, x: log_f32(x)))
    assert r["model_mismatches"] > 0 and not math.isnan(r["samples"][0]["x"])
