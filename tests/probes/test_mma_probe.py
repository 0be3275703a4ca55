"""The warp-level MMA probe (``benchmarks.probes.mma_probe``, ``benchmarks.probes.probe_fp8_accumulation
--mma-sync``): its error measure on the CPU, its argument checks, and what ptxas makes of the fp8
``mma.sync`` on sm_90a (from the machine code, no GPU needed)."""

import re

import pytest
import torch

from benchmarks.probes import probe_fp8_accumulation as probe
from mjolnir_kernel import compile as kc
from mjolnir_kernel import sass

_NO_CUTLASS = kc.cutlass_available()
needs_cutlass = pytest.mark.skipif(_NO_CUTLASS is not None, reason=f"needs the CuTe DSL: {_NO_CUTLASS}")
_NO_TOOLS = _NO_CUTLASS or sass.sass_tools()[1]
needs_tools = pytest.mark.skipif(_NO_TOOLS is not None, reason=f"needs the DSL and cuobjdump: {_NO_TOOLS}")


def test_error_stats_measure_against_the_exact_sum():
    """The exact product rounded once is 100 % identical with no error; one output moved by one fp32 ulp
    is counted, in units of 2^-24 sum |a b| of its own row and column."""
    gen = torch.Generator().manual_seed(1)
    a, b = probe._operands("qk", 16, 8, 64, gen, "cpu")
    exact = (a.double() @ b.double().t()).float()
    st = probe.error_stats(exact, a, b)
    assert st["identical"] == 1.0 and st["max_units"] == 0.0
    off = exact.clone()
    off[3, 5] = torch.nextafter(off[3, 5], torch.tensor(float("inf")))
    st = probe.error_stats(off, a, b)
    assert st["identical"] == pytest.approx(1 - 1 / (16 * 8))
    mag = (a.double().abs() @ b.double().abs().t())[3, 5].item()
    err = off[3, 5].double().item() - (a.double() @ b.double().t())[3, 5].item()
    assert st["max_units"] == pytest.approx(abs(err) / (mag * 2.0**-24))


def test_mma_sync_probe_needs_k_in_steps_of_32(capsys):
    with pytest.raises(SystemExit):
        probe.main(["--mma-sync", "--ks", "32,48"])
    assert "--ks: the fp8 mma.sync takes K in steps of 32" in capsys.readouterr().err


@needs_cutlass
def test_probe_kernel_arguments_are_checked():
    from benchmarks.probes.mma_probe import WarpMmaProbe

    with pytest.raises(ValueError, match="k: expected a positive multiple of 32, got 48"):
        WarpMmaProbe(48, "fp8")
    with pytest.raises(ValueError, match="path: expected one of"):
        WarpMmaProbe(64, "bf16")


def _opcodes(sass_text: str) -> list:
    ops = []
    for line in sass_text.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops.append(m.group(1))
    return ops


@needs_tools
def test_fp8_mma_sync_is_lowered_to_f16_mmas_on_sm90():
    """Hopper has no warp-level fp8 MMA: ptxas turns one ``mma.sync.m16n8k32`` on e4m3 into the same f16
    unpacks and two ``HMMA.16816`` that the decode kernel already issues, plus an fp32 add per output.
    So feeding the e4m3 bytes to mma.sync would not take the widening out of the tile loop (docs/numerics.md,
    "Special functions and the tensor cores")."""
    from benchmarks.probes.mma_probe import probe_sass

    fp8, f16 = _opcodes(probe_sass(32, "fp8")), _opcodes(probe_sass(32, "f16"))
    hmma = [op for op in fp8 if op.startswith("HMMA")]
    assert hmma and all(op.startswith("HMMA.16816.F32") for op in hmma) and len(hmma) == 2, hmma
    assert not any("E4M3" in op and "MMA" in op for op in fp8)  # no fp8 tensor-core instruction
    assert fp8.count("F2FP.F16.E4M3.UNPACK_B") == f16.count("F2FP.F16.E4M3.UNPACK_B") > 0
    assert fp8.count("FADD") >= 4 and f16.count("FADD") == 0  # the k32 result is added to C in fp32
