"""``bench_hopper_decode --csv`` rows and ``benchmarks.plot_bandwidth`` on them, without a GPU: the bars are
the default-configuration e4m3-Q rows, each with the fastest bare read of its own bytes, and the figure is
written; bad input is named."""

import csv

import pytest

from benchmarks import bench_hopper_decode as bh
from benchmarks import plot_bandwidth as pb

STREAM = 4.5
PCT_ROUNDING = 0.01  # bench_hopper_decode._row rounds pct_stream to 2 decimals
US_ROUNDING = 0.01  # ... and us to 2 decimals, so a fitted intercept is within a few of these
RATE_REL = 1e-3  # the slope through those rounded times, relative


def _rows():
    rows = []
    for b in (1, 8):
        shape = f"b{b} 32/8 d128"
        cases = (("e4m3", 67e6 * b, 23.4 * b, 16.5 * b), ("e2m1", 33.5e6 * b, 23.2 * b, 9.3 * b))
        for fmt, nbytes, us, read_us in cases:
            rows.append(bh._row("mjolnir", b, 32, 8, 128, shape, fmt, "e4m3", us / 1e3, nbytes, STREAM))
            rows.append(bh._row("sum", b, 32, 8, 128, shape, fmt, "sum", 2 * read_us / 1e3, nbytes, STREAM))
            rows.append(bh._row("read", b, 32, 8, 128, shape, fmt, "read", read_us / 1e3, nbytes, STREAM, "x"))
        # not bars: bf16 Q, a sweep-tagged row, a peer
        rows.append(bh._row("mjolnir", b, 32, 8, 128, shape, "e4m3", "bf16", 1e-3, 67e6, STREAM))
        rows.append(bh._row("mjolnir", b, 32, 8, 128, shape + " r3", "e4m3", "e4m3", 1e-3, 67e6, STREAM))
        rows.append(bh._row("sdpa", b, 32, 8, 128, shape, "bf16", "bf16", 1e-3, 134e6, STREAM))
    return rows


def test_csv_round_trip_and_bars_pick_the_default_rows(tmp_path):
    path = tmp_path / "h.csv"
    bh.write_csv(str(path), _rows())
    with open(path, newline="") as f:
        header = next(csv.reader(f))
    assert tuple(header) == bh.CSV_FIELDS
    data = pb.bars(pb.read_rows(str(path)))
    assert list(data) == [(32, 8, 128)] and list(data[(32, 8, 128)]) == [1, 8]
    pct, read = data[(32, 8, 128)][1]["e4m3"]
    assert pct == pytest.approx(100 * 67e6 / 23.4e-6 / 1e12 / STREAM, abs=PCT_ROUNDING)
    assert read == pytest.approx(100 * 67e6 / 16.5e-6 / 1e12 / STREAM, abs=PCT_ROUNDING)
    assert set(data[(32, 8, 128)][8]) == {"e4m3", "e2m1"}


def test_plot_writes_a_figure(tmp_path):
    path = tmp_path / "h.csv"
    bh.write_csv(str(path), _rows())
    assert pb.main([str(path), "--title", "test"]) == 0
    png = tmp_path / "h.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_bad_input_is_named(tmp_path, capsys):
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    assert pb.main([str(other)]) == 2
    assert "not bench_hopper_decode --csv output" in capsys.readouterr().err
    peers_only = tmp_path / "peers.csv"
    bh.write_csv(str(peers_only), [r for r in _rows() if r["kind"] == "sdpa"])
    assert pb.main([str(peers_only)]) == 2
    assert "no default-configuration Hopper rows" in capsys.readouterr().err


def test_csv_directory_is_checked_before_any_gpu_work(capsys):
    with pytest.raises(SystemExit):
        bh.main(["--csv", "/no/such/dir/h.csv"])
    assert "--csv '/no/such/dir/h.csv': no such directory" in capsys.readouterr().err


def test_fixed_cost_fit_recovers_a_line_and_needs_two_sizes(tmp_path, capsys):
    """``benchmarks.fixed_cost``: rows at several sizes on an exact line (8 us + bytes / 4.5 TB/s for the
    kernel, 2 us + bytes / 4.7 TB/s for the read) give back the line; one size is refused by name."""
    from benchmarks.probes import fixed_cost as fc

    paths = []
    for i, mb in enumerate((17, 34, 67, 134)):
        nbytes = mb * 1e6
        rows = [
            bh._row("mjolnir", 1, 32, 8, 128, "b1 32/8 d128", "e4m3", "e4m3", (8 + nbytes / 4.5e6) / 1e3, nbytes, 4.5),
            bh._row("read", 1, 32, 8, 128, "b1 32/8 d128", "e4m3", "read", (2 + nbytes / 4.7e6) / 1e3, nbytes, 4.5),
        ]
        paths.append(str(tmp_path / f"L{i}.csv"))
        bh.write_csv(paths[-1], rows)
    result = fc.fits([r for p in paths for r in pb.read_rows(p)])
    kernel, read = result
    assert kernel["kind"] == "mjolnir" and kernel["sizes"] == 4
    assert kernel["fixed_us"] == pytest.approx(8, abs=2 * US_ROUNDING)
    assert kernel["marginal_tbps"] == pytest.approx(4.5, rel=RATE_REL)
    assert read["fixed_us"] == pytest.approx(2, abs=2 * US_ROUNDING)
    assert read["marginal_tbps"] == pytest.approx(4.7, rel=RATE_REL)
    assert fc.main(paths) == 0
    out = capsys.readouterr().out
    assert "96%" in out  # 4.5 / 4.7
    with pytest.raises(ValueError, match="at least two distinct byte counts"):
        fc.fit([(1.0, 2.0), (1.0, 3.0)])
    assert fc.main(paths[:1]) == 2
    assert "no row seen at two or more sizes" in capsys.readouterr().err
