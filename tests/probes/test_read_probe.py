"""The bare-read kernel (``benchmarks.probes.read_probe``) and its benchmark
(``benchmarks.probes.read_roofline``): argument checks and the machine code on any machine, and on an sm_90+
GPU that every byte is read once."""

import re

import pytest
import torch

from benchmarks.probes import read_roofline as rr
from mjolnir_kernel import compile as kc
from mjolnir_kernel import sass

_NO_CUTLASS = kc.cutlass_available()
needs_cutlass = pytest.mark.skipif(_NO_CUTLASS is not None, reason=f"needs the CuTe DSL: {_NO_CUTLASS}")
_NO_TOOLS = _NO_CUTLASS or sass.sass_tools()[1]
needs_tools = pytest.mark.skipif(_NO_TOOLS is not None, reason=f"needs the DSL and cuobjdump: {_NO_TOOLS}")
_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
needs_gpu = pytest.mark.skipif(not _GPU, reason="needs a CUDA GPU of compute capability >= 9.0 (sm_90+)")


def test_sizes_parse_to_bytes_and_bad_ones_are_named():
    assert rr.parse_sizes_mb("67.1, 2") == [67_100_000, 2_000_000]
    with pytest.raises(ValueError, match=r"--sizes-mb: 'abc' is not a number"):
        rr.parse_sizes_mb("1,abc")
    with pytest.raises(ValueError, match=r"--sizes-mb: '0': expected a positive size"):
        rr.parse_sizes_mb("0")


def test_bad_sizes_stop_the_benchmark_before_any_gpu_work(capsys):
    with pytest.raises(SystemExit):
        rr.main(["--sizes-mb", "67,x"])
    assert "--sizes-mb: 'x' is not a number" in capsys.readouterr().err


@needs_cutlass
def test_sweep_keeps_to_the_resident_threads_per_sm():
    configs = rr.sweep_configs(threads=(256, 1024), unrolls=(4,), ctas_per_sm=(1, 2, 4), patterns=("chunks",))
    assert (1024, 4, 4, "chunks") not in configs and (1024, 4, 2, "chunks") in configs
    assert (256, 4, 4, "chunks") in configs
    assert all(t * c <= 2048 for t, _, c, _ in configs)


@needs_cutlass
def test_probe_arguments_are_checked():
    from benchmarks.probes.read_probe import ReadProbe

    with pytest.raises(ValueError, match="pattern: expected one of"):
        ReadProbe(256, 4, "random")
    with pytest.raises(ValueError, match="threads: expected a multiple of 32 in"):
        ReadProbe(100, 4, "chunks")
    with pytest.raises(ValueError, match="unroll: expected an int in"):
        ReadProbe(256, 0, "chunks")


@needs_tools
@pytest.mark.parametrize("pattern", ["chunks", "stride"])
def test_each_step_issues_unroll_stream_loads_of_16_bytes(pattern):
    """The timed loop is a stream read: ``unroll`` 16-byte non-caching loads per step and nothing else
    that touches memory."""
    from benchmarks.probes.read_probe import compile_read_probe

    text = sass.disassemble_compiled(lambda d: compile_read_probe(256, 8, pattern, "sm_90a", cubin_dir=d))
    loop = sass.parse_loops(text, "kernel")[0]
    ops = dict(loop.opcodes)
    body = [ln for ln in text.splitlines() if re.match(r"\s*/\*([0-9a-f]+)\*/", ln)]
    body = [ln for ln in body if loop.start <= int(re.match(r"\s*/\*([0-9a-f]+)\*/", ln).group(1), 16) <= loop.end]
    loads = [ln for ln in body if "LDG" in ln]
    assert ops["LDG"] == 8 and all("LDG.E.NA.128" in ln for ln in loads)
    assert not any(op in ops for op in ("STG", "STS", "LDS", "BAR"))


@needs_cutlass
@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["chunks", "stride"])
@pytest.mark.parametrize(
    ("n_vec", "threads", "unroll", "ctas"),
    [(1, 256, 4, 3), (5000, 256, 4, 7), (123_457, 512, 8, 132), (40_000, 256, 8, 1000)],
    ids=["one-vector", "tails", "h200-grid", "more-ctas-than-work"],
)
def test_every_vector_is_read_once(pattern, n_vec, threads, unroll, ctas):
    """XOR over the threads' sink words == XOR over the input's words: a vector missed, or read twice, or
    read by the wrong lane's offset would change it (random words)."""
    from benchmarks.probes.read_probe import compile_read_probe, read_launcher

    major, minor = torch.cuda.get_device_capability()
    compiled = compile_read_probe(threads, unroll, pattern, f"sm_{major}{minor}a")
    gen = torch.Generator(device="cuda").manual_seed(n_vec)
    words = torch.randint(-(2**31), 2**31, (n_vec * 4,), dtype=torch.int64, generator=gen, device="cuda")
    src = words.to(torch.int32)
    sink = torch.zeros(ctas * threads, dtype=torch.int32, device="cuda")
    read_launcher(compiled, src, ctas, threads, unroll, pattern, sink=sink, store=True)()
    torch.cuda.synchronize()

    def xor_all(t):
        out = 0
        for w in t.cpu().tolist():
            out ^= w & 0xFFFFFFFF
        return out

    assert xor_all(sink) == xor_all(src)
    # and nothing is written when not asked
    sink.zero_()
    read_launcher(compiled, src, ctas, threads, unroll, pattern, sink=sink)()
    torch.cuda.synchronize()
    assert int(sink.abs().sum()) == 0
