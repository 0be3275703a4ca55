"""How close each format's Hopper decode could come to the stream: Nsight Compute's instruction counts
turned into floors, side by side in one run on an sm_90 GPU (the lent H200).

For every format it profiles one launch of ``benchmarks.probes.profile_hopper_decode`` (batch 32,
L = 32768, e4m3 Q; the kernel's default config) under ``ncu``, and one launch of the read-only stream
(``torch.sum`` over a 1.5 GiB int64 tensor: torch splits larger sums into several kernels) the same way,
with the clocks left as they run (``--clock-control none``). Per kernel it prints:

* ``TB/s``, ``%stream``: KV bytes (as stored, plus NVFP4 block scales) over the profiled duration, and
  that as a fraction of the profiled stream;
* ``ALU busy``, ``issue busy``: the fraction of cycles in which the ALU pipe (integer, logic, byte
  permute and fp8/f16 pack and unpack conversions: 2 warp-instructions per cycle per SM on sm_90) and
  the issue slots (4 per cycle per SM) were used;
* ``ALU floor``, ``issue floor``: the bandwidth, as a fraction of the stream, that the kernel would
  reach if the busiest SM's ALU-pipe instructions (respectively all its instructions) issued on every
  cycle at the clock it ran at, and nothing else took time. A kernel cannot beat either floor without
  executing fewer such instructions per byte.

    python -m benchmarks.probes.pipe_floors                     # the default formats
    python -m benchmarks.probes.pipe_floors --formats e2m1      # one row

Needs ``ncu`` on the PATH (the device has it) and permission to read the GPU's performance counters.
"""

from __future__ import annotations

import argparse
import re
import sys

from benchmarks.probes._ncu import FORMATS, comma_list, run_ncu, tools_missing

STREAM_BYTES = 3 << 29  # 1.5 GiB: one reduction kernel (torch splits a sum over more than 2^31 bytes)

# The metrics each profile collects (``--print-units base``: seconds, bytes, hertz).
METRICS = (
    "gpu__time_duration.sum",
    "sm__cycles_elapsed.avg.per_second",
    "sm__inst_executed_pipe_alu.max",
    "sm__inst_executed_pipe_alu.avg.peak_sustained",
    "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
    "sm__inst_executed.max",
    "sm__inst_executed.avg.peak_sustained",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "dram__bytes_read.sum",
)

# Unit words ncu prints (base or human-readable), as multipliers to seconds / bytes / hertz.
_PREFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_UNIT = re.compile(r"^([numkKMGT]?)(s|second|byte|hz|Hz)$")
_LINE = re.compile(r"^\s*([a-z0-9_]+__[\w.]+)\s+(?:(\S+)\s+)?([\d,]+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*$")
_KV_BYTES = re.compile(r"profile_hopper_decode: .*\((\d+) bytes\) of KV")


def unit_scale(unit: str) -> float:
    """The multiplier from ``unit`` (as ncu prints it: ``nsecond``, ``us``, ``Gbyte``, ``Ghz``,
    ``cycle/nsecond``, ``inst``, ``%`` ...) to seconds, bytes or hertz; 1 for counts, ratios and
    percentages."""
    if "/" in unit:
        num, den = unit.split("/", 1)
        return unit_scale(num) / unit_scale(den)
    m = _UNIT.match(unit.replace("usecond", "us").replace("nsecond", "ns").replace("msecond", "ms"))
    if m is None:
        return 1.0
    prefix, base = m.groups()
    if prefix == "m" and base.lower() == "hz":  # ncu has no millihertz; "mhz" would be megahertz
        return 1e6
    return _PREFIX[prefix]


def parse_metrics(text: str) -> dict:
    """``{metric: value}`` from ncu's metric lines (``name unit value``), in seconds, bytes and hertz.
    Raises ValueError when a metric appears twice (more than one kernel was profiled)."""
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        name, unit, value = m.groups()
        if name in out:
            raise ValueError(f"parse_metrics: {name} appears twice: profile exactly one kernel launch")
        out[name] = float(value.replace(",", "")) * unit_scale(unit or "")
    return out


def floors(metrics: dict, kv_bytes: float, stream_tbps: float) -> dict:
    """One profiled kernel's row: ``us``, ``tbps``, ``pct_stream``, ``alu_busy``, ``issue_busy`` and the
    two floors (``alu_floor`` / ``issue_floor``, percent of ``stream_tbps``: the bandwidth if the busiest
    SM issued its ALU-pipe / all instructions on every cycle). ``kv_bytes``: bytes the kernel must read;
    ``stream_tbps``: the read-only stream profiled the same way, in TB/s."""
    missing = [m for m in METRICS if m not in metrics and m != "dram__bytes_read.sum"]
    if missing:
        raise ValueError(f"floors: metrics missing from the profile: {', '.join(missing)}")
    if kv_bytes <= 0 or stream_tbps <= 0:
        raise ValueError(f"floors: kv_bytes and stream_tbps must be > 0, got {kv_bytes} and {stream_tbps}")
    clock = metrics["sm__cycles_elapsed.avg.per_second"]
    seconds = metrics["gpu__time_duration.sum"]
    alu_s = metrics["sm__inst_executed_pipe_alu.max"] / metrics["sm__inst_executed_pipe_alu.avg.peak_sustained"] / clock
    issue_s = metrics["sm__inst_executed.max"] / metrics["sm__inst_executed.avg.peak_sustained"] / clock

    def pct(s):
        return 100.0 * kv_bytes / s / 1e12 / stream_tbps

    return {
        "us": seconds * 1e6,
        "tbps": kv_bytes / seconds / 1e12,
        "pct_stream": pct(seconds),
        "alu_busy": metrics["sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active"],
        "issue_busy": metrics["smsp__issue_active.avg.pct_of_peak_sustained_active"],
        "alu_floor": pct(alu_s),
        "issue_floor": pct(issue_s),
        "clock_ghz": clock / 1e9,
    }


def _ncu(target: list, kernel_regex: str, launch_skip: int) -> str:
    cmd = [
        "ncu", "--clock-control", "none", "--target-processes", "all", "--print-units", "base",
        "-k", f"regex:{kernel_regex}", "--launch-skip", str(launch_skip), "--launch-count", "1",
        "--metrics", ",".join(METRICS), sys.executable, *target,
    ]  # fmt: skip
    return run_ncu(cmd, "pipe_floors")


def _stream_target() -> int:
    """The profiled stream: torch.sum over STREAM_BYTES of int64, three launches (ncu takes the third)."""
    import torch

    x = torch.ones(STREAM_BYTES // 8, dtype=torch.int64, device="cuda")
    for _ in range(3):
        x.sum()
    torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default=",".join(FORMATS), type=comma_list(FORMATS, "--formats"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--stream-target", action="store_true", help=argparse.SUPPRESS)  # what ncu runs
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error(f"--batch: expected at least 1, got {args.batch}")
    if args.stream_target:
        return _stream_target()
    if tools_missing("pipe_floors"):
        return 2
    import torch

    stream = parse_metrics(_ncu(["-m", "benchmarks.probes.pipe_floors", "--stream-target"], "reduce", 2))
    stream_bytes = STREAM_BYTES
    if not 0.95 * stream_bytes <= stream.get("dram__bytes_read.sum", 0.0) <= 1.05 * stream_bytes:
        raise RuntimeError(
            f"pipe_floors: the profiled stream kernel read {stream.get('dram__bytes_read.sum', 0.0):.3g} bytes"
            f" from DRAM, not the {stream_bytes} of its tensor: ncu picked the wrong launch"
        )
    stream_tbps = stream_bytes / stream["gpu__time_duration.sum"] / 1e12
    print(f"# {torch.cuda.get_device_name()}; Nsight Compute, clocks as they run; batch {args.batch}, L = 32768,")
    print("# 32/8 heads, d = 128, page size 64, e4m3 Q; one launch each")
    gib = STREAM_BYTES / (1 << 30)
    print(f"# read-only stream (torch.sum over {gib:g} GiB int64, profiled the same way): {stream_tbps:.2f} TB/s")
    head = ("format", "us", "TB/s", "%stream", "ALU busy", "issue busy", "ALU floor", "issue floor", "GHz")
    print("{:<7} {:>8} {:>6} {:>8} {:>9} {:>11} {:>10} {:>12} {:>5}".format(*head))
    for fmt in args.formats:
        target = ["-m", "benchmarks.probes.profile_hopper_decode", "--format", fmt, "--q-dtype", "e4m3",
                  "--batch", str(args.batch), "--launches", "4"]  # fmt: skip
        out = _ncu(target, "Hopper", 3)
        kv = _KV_BYTES.search(out)
        if kv is None:
            raise RuntimeError(f"pipe_floors: no KV byte count in the profile target's output:\n{out[-2000:]}")
        r = floors(parse_metrics(out), float(kv.group(1)), stream_tbps)
        print(
            f"{fmt:<7} {r['us']:8.1f} {r['tbps']:6.2f} {r['pct_stream']:7.1f}% {r['alu_busy']:8.1f}%"
            f" {r['issue_busy']:10.1f}% {r['alu_floor']:9.1f}% {r['issue_floor']:11.1f}% {r['clock_ghz']:5.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
