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


def test_l2_resident_refuses_the_size_matched_read(capsys):
    with pytest.raises(SystemExit):
        bh.main(["--l2-resident", "--size-matched-stream"])
    assert "--l2-resident" in capsys.readouterr().err


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


@pytest.mark.parametrize("value", ["fastest", "occupancy,occupancy", "", "occupancy,batch"])
def test_plans_must_be_distinct_plan_modes(capsys, value):
    with pytest.raises(SystemExit):
        bh.main(["--plans", value])
    err = capsys.readouterr().err
    assert "--plans" in err and "occupancy, batch_invariant" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU this would run the benchmark")
def test_plans_accepts_both_modes(capsys):
    assert bh.main(["--plans", "batch_invariant, occupancy"]) == 2  # accepted: stops only at the missing GPU
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_csv_rows_carry_the_plan_and_old_csvs_still_read(tmp_path):
    from benchmarks import plot_bandwidth

    row = bh._row("mjolnir", 8, 32, 8, 128, "b8 32/8 d128", "e4m3", "e4m3", 0.1, 1e6, 4.5, plan="batch_invariant")
    assert row["plan"] == "batch_invariant" and tuple(row) == bh.CSV_FIELDS
    old = tmp_path / "old.csv"  # written before the plan column existed
    old.write_text(",".join(f for f in bh.CSV_FIELDS if f != "plan") + "\n" + ",".join(
        str(row[f]) for f in bh.CSV_FIELDS if f != "plan") + "\n")  # fmt: skip
    assert plot_bandwidth.read_rows(str(old))[0]["format"] == "e4m3"
