"""``benchmarks.probes.trace_gaps`` on a hand-made Chrome trace: the GPU's busy time is the union of its
events (overlaps counted once), the gaps and the host operations during them, the per-bucket fractions."""

import gzip
import json

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
    assert "GPU busy per 1 ms (%): 0 100 50 50" in out
    assert "at    2.50 ms:   1.00 ms, 1 host ops (Torch-Compiled Region: 1/0)" in out
    assert "host synchronisations: 1 2.55" in out and "cudaGraphLaunch" in out


def test_a_trace_without_gpu_events_is_an_error(tmp_path, capsys):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 0, "dur": 1}]}))
    assert trace_gaps.main([str(path)]) == 1
    assert "holds no GPU event" in capsys.readouterr().err
