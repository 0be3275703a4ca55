"""``benchmarks.probes.trace_gaps`` on a hand-made Chrome trace: the GPU's busy time is the union of its
events (overlaps counted once), the gaps and the host operations during them, the per-bucket fractions."""

import gzip
import json
import math

import pytest

from benchmarks.probes import trace_gaps


def _trace(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::index", "ts": 0, "dur": 500},
        {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 100, "dur": 50},  # nested in aten::index
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 1000, "dur": 1000},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 1500, "dur": 1000},  # overlaps k1: 1000-2500 busy
        {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 1/0", "ts": 2600, "dur": 300},
        {"ph": "X", "cat": "gpu_memcpy", "name": "copy", "ts": 3500, "dur": 500},  # gap 2500-3500
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 2550, "dur": 5},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 3400, "dur": 20},
        {"ph": "i", "cat": "cpu_op", "name": "instant", "ts": 0},  # not a complete event: ignored
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return str(path)


def test_busy_intervals_merge_overlaps():
    gpu = [{"ts": 5, "dur": 5}, {"ts": 0, "dur": 4}, {"ts": 3, "dur": 3}, {"ts": 20, "dur": 1}]
    assert trace_gaps.busy_intervals(gpu) == [[0, 10], [20, 21]]


def test_top_level_drops_nested_operations():
    ops = [{"ts": 0, "dur": 10}, {"ts": 2, "dur": 3}, {"ts": 10, "dur": 1}]
    assert [e["ts"] for e in trace_gaps.top_level(ops)] == [0, 10]


def test_report_of_a_trace(tmp_path, capsys):
    assert trace_gaps.main([_trace(tmp_path), "--bucket-ms", "1", "--gaps", "1"]) == 0
    out = capsys.readouterr().out
    assert "GPU busy 2.0 ms of 4.0 ms" in out  # 1.5 ms of kernels (k1, k2 overlapping) + 0.5 ms copy
    assert "GPU busy per 1 ms (%; the last bucket over its own width): 0 100 50 50\n" in out
    assert "at    2.50 ms:   1.00 ms, 1 host ops (Torch-Compiled Region: 1/0)" in out
    assert "host synchronisations: 1 2.55" in out and "cudaGraphLaunch" in out


def test_a_trace_without_gpu_events_is_an_error(tmp_path, capsys):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 0, "dur": 1}]}))
    assert trace_gaps.main([str(path)]) == 1
    assert "holds no GPU event" in capsys.readouterr().err


def test_buckets_of_any_width_cover_the_span_once():
    """Widths that are not whole microseconds (the loop over them once never ended) and a span that is not a
    whole number of buckets (the last one is measured over its own width)."""
    busy = [[0.0, 1000.0], [1500.0, 2000.0]]
    for width in (1000 / 3, 777.7777, 123.456789, 2000.0, 5000.0):
        fractions = trace_gaps.bucket_fractions(busy, 0.0, 2000.0, width)
        widths = [min(width, 2000.0 - i * width) for i in range(len(fractions))]
        assert len(fractions) == math.ceil(2000.0 / width)
        assert abs(sum(f * w for f, w in zip(fractions, widths)) - 1500.0) < 1e-6, width
        assert all(0.0 <= f <= 1.0 for f in fractions)
    assert trace_gaps.bucket_fractions(busy, 0.0, 2000.0, 1500.0) == [1000 / 1500, 1.0]


def test_a_trace_without_host_operations(tmp_path, capsys):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 10}]}))
    assert trace_gaps.main([str(path)]) == 0
    assert "host operations end at - (no host operation)" in capsys.readouterr().out


def test_bad_bucket_widths_are_refused(tmp_path, capsys):
    for width in ("nan", "0", "-1", "1e-9"):
        with pytest.raises(SystemExit):
            trace_gaps.main([_trace(tmp_path), "--bucket-ms", width])
        assert "--bucket-ms must be in [0.01, 1e6] ms" in capsys.readouterr().err


def test_idle_time_in_spans(tmp_path, capsys):
    assert trace_gaps.idle_time([[0.0, 1000.0], [1500.0, 2000.0]], 500.0, 1800.0) == 500.0
    assert trace_gaps.main([_trace(tmp_path), "--spans", "0,2.2"]) == 0
    # busy 1.0-2.5 and 3.5-4.0 ms: idle 1.0 ms in 0-2.2, 1.0 ms in 2.2-4.0
    assert "GPU idle (ms) in 0.00-2.20 ms: 1.00; 2.20-4.00 ms: 1.00" in capsys.readouterr().out
    for bad in ("2,1", "x", "-1"):
        with pytest.raises(SystemExit):
            trace_gaps.main([_trace(tmp_path), "--spans", bad])
        assert "--spans" in capsys.readouterr().err
