"""The Nsight Compute target (``benchmarks.probes.profile_hopper_decode``) without a GPU: its argument
checks, its refusal to run without one, and how ``--kernel-times`` names the grids of a profile."""

from types import SimpleNamespace

import pytest
import torch

from benchmarks.probes import profile_hopper_decode as phd


@pytest.mark.parametrize(
    "argv, name", [(["--graph-calls", "-1"], "--graph-calls"), (["--launches", "0"], "--launches")]
)
def test_profile_rejects_bad_counts(argv, name, capsys):
    with pytest.raises(SystemExit) as e:
        phd.main(argv)
    assert e.value.code == 2 and f"{name}: expected" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a CUDA GPU")
def test_without_a_gpu_it_says_so(capsys):
    assert phd.main(["--format", "e2m1", "--q-dtype", "e4m3", "--batch", "1"]) == 2
    assert "profile_hopper_decode: needs a CUDA GPU" in capsys.readouterr().err


def test_kernel_times_picks_the_two_grids_by_name():
    """--kernel-times: the decode and reduction grids' mean durations, by the names the CuTe DSL gives them;
    other kernels (a fill, a copy) and grids never launched are left out."""

    def ev(key, count, total):
        return SimpleNamespace(key=key, count=count, device_time_total=total)

    prof = SimpleNamespace(
        key_averages=lambda: [
            ev("kernel_cutlass_kernel_mjolnir_kernelhopperdecode_kernelHopperDecodeKernel_object_at_0x7f", 20, 400.0),
            ev("kernel_cutlass_kernel_mjolnir_kernelreductionSplitReduction_object_at_0x7f", 20, 58.0),
            ev("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>", 3, 6.0),
            ev("cudaLaunchKernelExC", 40, 0.0),
            ev("kernel_HopperDecodeKernel_never_launched", 0, 0.0),
        ]
    )
    assert phd.kernel_times(prof) == {"HopperDecodeKernel": (20, 20.0), "SplitReduction": (20, 2.9)}
