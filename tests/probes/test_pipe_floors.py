"""The pipe-floor benchmark's arithmetic, without a GPU: ncu's metric lines parse to base units whichever
way ncu prints them, and the floors follow from instruction counts, peak rates and the clock."""

import pytest

from benchmarks.probes import pipe_floors as pf

# One kernel's metrics as `ncu --print-units base` prints them (the kernel line above them is skipped).
BASE = """\
  kernel_HopperDecodeKernel_object_at__tensorptr (32, 1, 8)x(256, 1, 1), Context 1, Stream 13, Device 0, CC 9.0
    Section: Command line profiler metrics
    ---------------------------------------------------------------------- ----------- ------------
    dram__bytes_read.sum                                                          byte 1,073,741,824
    gpu__time_duration.sum                                                     nsecond      500,000
    sm__cycles_elapsed.avg.per_second                                               hz 2,000,000,000
    sm__inst_executed.avg.peak_sustained                                    inst/cycle            4
    sm__inst_executed.max                                                         inst      800,000
    sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active                      %        62.50
    sm__inst_executed_pipe_alu.avg.peak_sustained                           inst/cycle            2
    sm__inst_executed_pipe_alu.max                                                inst      500,000
    smsp__issue_active.avg.pct_of_peak_sustained_active                              %        40.00
"""

# The same kernel in ncu's human-readable units.
HUMAN = BASE.replace("byte 1,073,741,824", "Gbyte 1.073741824").replace("nsecond      500,000", "us 500")
HUMAN = HUMAN.replace("hz 2,000,000,000", "Ghz 2")


@pytest.mark.parametrize("text", [BASE, HUMAN], ids=["base", "human"])
def test_metric_lines_parse_to_base_units(text):
    m = pf.parse_metrics(text)
    assert set(m) == set(pf.METRICS)
    assert m["gpu__time_duration.sum"] == pytest.approx(500e-6)
    assert m["dram__bytes_read.sum"] == pytest.approx(1 << 30)
    assert m["sm__cycles_elapsed.avg.per_second"] == pytest.approx(2e9)
    assert m["sm__inst_executed_pipe_alu.max"] == 500_000
    assert m["smsp__issue_active.avg.pct_of_peak_sustained_active"] == 40.0


@pytest.mark.parametrize(
    "unit, scale",
    [("nsecond", 1e-9), ("usecond", 1e-6), ("ms", 1e-3), ("second", 1.0), ("Kbyte", 1e3), ("Mbyte", 1e6),
     ("Mhz", 1e6), ("mhz", 1e6), ("cycle/nsecond", 1e9), ("inst/cycle", 1.0), ("%", 1.0), ("", 1.0)],
)  # fmt: skip
def test_unit_scales(unit, scale):
    assert pf.unit_scale(unit) == pytest.approx(scale)


def test_floors_follow_from_counts_rates_and_clock():
    m = pf.parse_metrics(BASE)
    kv = 1e9
    r = pf.floors(m, kv_bytes=kv, stream_tbps=4.0)
    assert r["us"] == pytest.approx(500.0)
    assert r["tbps"] == pytest.approx(2.0)  # 1 GB in 500 us
    assert r["pct_stream"] == pytest.approx(50.0)
    # ALU floor: 500,000 instructions at 2 per cycle at 2 GHz = 125 us -> 8 TB/s = 200 % of 4 TB/s
    assert r["alu_floor"] == pytest.approx(200.0)
    # issue floor: 800,000 at 4 per cycle at 2 GHz = 100 us -> 10 TB/s = 250 %
    assert r["issue_floor"] == pytest.approx(250.0)
    assert (r["alu_busy"], r["issue_busy"], r["clock_ghz"]) == (62.5, 40.0, pytest.approx(2.0))


def test_a_second_kernel_in_the_profile_is_refused():
    with pytest.raises(ValueError, match="appears twice"):
        pf.parse_metrics(BASE + BASE)


def test_missing_metrics_are_named():
    m = pf.parse_metrics(BASE)
    del m["sm__inst_executed.max"]
    with pytest.raises(ValueError, match="sm__inst_executed.max"):
        pf.floors(m, kv_bytes=1e9, stream_tbps=4.0)


def test_floors_refuse_nonpositive_sizes():
    with pytest.raises(ValueError, match="kv_bytes and stream_tbps"):
        pf.floors(pf.parse_metrics(BASE), kv_bytes=0, stream_tbps=4.0)


def test_kv_byte_line_of_the_profile_target_is_found():
    line = (
        "profile_hopper_decode: 5 launches of sm90-x (batch 32, L 32768, 1 chunks per sequence; eager),"
        " 1.074 GB (1073741824 bytes) of KV"
    )
    assert pf._KV_BYTES.search(line).group(1) == "1073741824"


@pytest.mark.parametrize("argv, flag", [(["--formats", "e5m2"], "--formats"), (["--batch", "0"], "--batch")])
def test_bad_arguments_are_named(capsys, argv, flag):
    with pytest.raises(SystemExit):
        pf.main(argv)
    assert flag in capsys.readouterr().err
