"""The Hopper benchmark's timing harness rules that need no GPU: how many distinct input copies a
back-to-back replay cycles through (too few and the KV of a small cache would come from L2, inflating
its bandwidth), and the --back-to-back argument check."""

from types import SimpleNamespace

import pytest
import torch

from benchmarks import bench_hopper_decode as bh

L2 = 50 << 20  # the H200's L2


@pytest.fixture
def fake_l2(monkeypatch):
    monkeypatch.setattr(bh.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(bh.torch.cuda, "get_device_properties", lambda i: SimpleNamespace(L2_cache_size=L2))


@pytest.mark.parametrize("nbytes", [1 << 20, 20 << 20, 67 << 20, 199 << 20, 200 << 20, 2 << 30])
def test_back_to_back_copies_cover_four_l2s(fake_l2, monkeypatch, nbytes):
    monkeypatch.setattr(bh, "BACK_TO_BACK", 20)
    n = bh.input_copies(nbytes)
    assert 1 <= n <= 20
    # the copies together are at least four L2s, unless that would take more copies than calls per replay
    assert n * nbytes >= 4 * L2 or n == 20
    # and no more copies than that needs
    assert n == 1 or (n - 1) * nbytes < 4 * L2


def test_single_call_replays_use_one_copy(fake_l2, monkeypatch):
    monkeypatch.setattr(bh, "BACK_TO_BACK", 1)
    assert bh.input_copies(1 << 20) == 1


def test_back_to_back_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        bh.main(["--back-to-back", "0"])
    assert "--back-to-back" in capsys.readouterr().err


def test_kernel_times_picks_the_two_grids_by_name():
    """profile_hopper_decode --kernel-times: the decode and reduction grids' mean durations, by the names
    the CuTe DSL gives them; other kernels (a fill, a copy) are left out."""
    from benchmarks.profile_hopper_decode import kernel_times

    def ev(key, count, total):
        return SimpleNamespace(key=key, count=count, device_time_total=total)

    prof = SimpleNamespace(
        key_averages=lambda: [
            ev("kernel_cutlass_kernel_mjolnir_kernelhopperdecode_kernelHopperDecodeKernel_object_at_0x7f", 20, 400.0),
            ev("kernel_cutlass_kernel_mjolnir_kernelthorreduction_kernelSplitReduction_object_at_0x7f", 20, 58.0),
            ev("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>", 3, 6.0),
            ev("cudaLaunchKernelExC", 40, 0.0),
        ]
    )
    times = kernel_times(prof)
    assert times == {"HopperDecodeKernel": (20, 20.0), "SplitReduction": (20, 2.9)}


@pytest.mark.parametrize(
    "argv, name",
    [
        (["--graph-calls", "-1"], "--graph-calls"),
        (["--launches", "0"], "--launches"),
    ],
)
def test_profile_rejects_bad_counts(argv, name, capsys):
    from benchmarks.profile_hopper_decode import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and f"{name}: expected" in capsys.readouterr().err


def test_l2_resident_refuses_the_size_matched_read(capsys):
    with pytest.raises(SystemExit):
        bh.main(["--l2-resident", "--size-matched-stream"])
    assert "--l2-resident" in capsys.readouterr().err


def test_subbyte_sweeps_are_hopper_decode_options():
    """Each sub-byte sweep of the bench is a HopperConfig field that decode() takes as a Hopper-only option, and
    the values its help lists are the field's allowed values besides "auto"; "auto" parses to None."""
    from dataclasses import fields

    from mjolnir_kernel.api import HOPPER_ONLY_OPTIONS
    from mjolnir_kernel.hopper import config as hc

    allowed = {"k_operand": hc.K_OPERANDS, "v_convert": hc.V_CONVERTS, "schedule": hc.SCHEDULES,
               "mma_layout": hc.MMA_LAYOUTS}  # fmt: skip
    names = {f.name for f in fields(hc.HopperConfig)}
    for name, _, _, values in bh.SUBBYTE_SWEEPS:
        assert name in names and name in HOPPER_ONLY_OPTIONS
        assert [v.split()[0] for v in values.split(", ")] == [v for v in allowed[name] if v != "auto"]
    assert bh._auto_list("auto,keys,") == [None, "keys"]


@pytest.mark.parametrize("value", ["64", "128,96", "", "d128"])
def test_head_dims_must_be_the_shapes_own(capsys, value):
    with pytest.raises(SystemExit):
        bh.main(["--head-dims", value])
    err = capsys.readouterr().err
    assert "--head-dims" in err and "[128, 256]" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU this would run the benchmark")
def test_head_dims_accepts_the_shapes_own(capsys):
    assert bh.main(["--head-dims", " 256,128"]) == 2  # accepted: stops only at the missing GPU
    assert "needs a CUDA GPU" in capsys.readouterr().err
