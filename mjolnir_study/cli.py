"""``mjolnir`` console command: ``mjolnir study`` runs the accuracy-vs-format study and writes the report.

::

    mjolnir study                 # the default grid (<= 10 min on a 2-core CPU) into reports/
    mjolnir study --quick         # the CI-sized grid (<= 1 min)
    mjolnir study --device cuda   # emulator, references and the model on a GPU
    mjolnir study --out /tmp/r --seed 1 --no-real-model

Writes ``OUT/study.csv`` (tidy rows), ``OUT/kv_stats.csv`` (captured K/V facts, with the real model),
``OUT/report.md`` and ``OUT/figures/*.png``.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mjolnir", description="Mjolnir: low-precision KV cache numerics.")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("study", help="run the accuracy-vs-format study and regenerate the report")
    s.add_argument("--quick", action="store_true", help="the small CI grid (<= 1 minute on a 2-core CPU)")
    s.add_argument("--device", default="cpu", help="torch device for the emulator, references and model (cpu, cuda)")
    s.add_argument("--out", default="reports", help="report folder (default: reports/)")
    s.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default 0)")
    s.add_argument("--no-real-model", action="store_true", help="skip the SmolLM2 parts (capture, layers, end to end)")
    s.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: fastest on a shared CPU)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _check_device(device: str) -> str:
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise SystemExit(f"--device: {device!r} is not a torch device (allowed: cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device: {device!r} asked for, but torch.cuda.is_available() is False")
    if dev.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device: {device!r}; allowed: cpu, cuda, cuda:N")
    return str(dev)


def run_study_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from . import report
    from .study import StudyConfig, read_csv, run_study, write_csv

    device = _check_device(args.device)
    preset = StudyConfig.quick if args.quick else StudyConfig.default
    if args.threads < 1:
        raise SystemExit(f"--threads: {args.threads} must be >= 1")
    config = preset(device=device, seed=args.seed, real_model=not args.no_real_model, cpu_threads=args.threads)
    out = Path(args.out)
    t0 = time.perf_counter()

    def log(line: str) -> None:
        print(f"[mjolnir study] {line}", file=sys.stderr, flush=True)

    log(f"preset {config.name}, device {device}, out {out}/")
    result = run_study(config, progress=not args.no_progress, log=log)
    csv_path = write_csv(result.rows, out / "study.csv")
    stats = result.info.get("kv_stats")
    if stats:
        with (out / "kv_stats.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(stats[0]))
            w.writeheader()
            w.writerows(stats)
    command = "mjolnir " + " ".join(shlex.quote(a) for a in argv)
    md = report.write_report(read_csv(csv_path), out, config=config.to_dict(), info=result.info, command=command)
    log(f"{len(result.rows)} rows -> {csv_path}; report -> {md} ({time.perf_counter() - t0:.0f} s)")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``mjolnir`` console script (``argv`` defaults to ``sys.argv[1:]``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command == "study":
        return run_study_command(args, argv)
    raise AssertionError(args.command)  # argparse rejects unknown subcommands


if __name__ == "__main__":
    sys.exit(main())
