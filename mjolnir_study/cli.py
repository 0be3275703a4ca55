"""``mjolnir`` console command: ``mjolnir study`` runs the accuracy-vs-format study and writes the report.

::

    mjolnir study                 # the default grid (about 3 minutes on a 2-core CPU) into runs/<UTC time>/
    mjolnir study --quick         # the CI-sized grid (about 25 s on a 2-core CPU)
    mjolnir study --out reports   # regenerate the committed report in reports/
    mjolnir study --device cuda   # emulator, references and the model on a GPU
    mjolnir study --out /tmp/r --seed 1 --no-real-model
    mjolnir compare runs/A runs/B # the two runs' rows, paired: identical, or which differ and by how much
    mjolnir notebooks             # execute notebooks/*.py at the full size into their .ipynb (stored outputs)

Writes ``OUT/study.csv`` (tidy rows), ``OUT/kv_stats.csv`` (captured K/V facts, with the real model),
``OUT/report.md`` and ``OUT/figures/*.png``; ``OUT`` is ``runs/<UTC timestamp>/`` under the current
directory unless ``--out`` names it (``runs/`` is git-ignored, so the default run leaves the tree clean).
At the end it prints (stdout) the folder, the files written and the report's headline table.

Every flag is checked before any work starts; a bad one prints one line on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from mjolnir_numerics.checks import int_arg
from mjolnir_numerics.targets import TARGETS

from .study import MAX_WORKERS

__all__ = ["CLIError", "build_parser", "check_device", "check_out", "default_out", "main", "resolve_out"]

# Measured on the 2-core CPU, wall time, the model's stored weights present (2026-12-03): --quick 19-30 s
# (earlier, with another job sharing the machine); the default 2 min 57 s and 3 min 7 s (study 167 and
# 177 s; one worker process); --full 9 min 12 s (48 windows, before the last speed-up).
QUICK_TIME = "25 s"
DEFAULT_TIME = "3 minutes"
FULL_TIME = "9-10 minutes"
TARGET_NAMES = tuple(TARGETS)  # --target's choices
MAX_THREADS = max(1, os.cpu_count() or 1)  # more torch threads than cores only oversubscribes (99999 ran out of memory)
SEED_MAX = 2**63 - 1  # the synthetic seeds add up to ~1e6 to it; torch generators take < 2**64


class CLIError(Exception):
    """A bad command line: :func:`main` prints ``mjolnir: error: MESSAGE`` (one line) and returns 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block) raised as :class:`CLIError`."""

    def error(self, message: str):
        raise CLIError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mjolnir", description="Mjolnir: low-precision KV cache numerics.")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "study",
        help="run the accuracy-vs-format study and write the report",
        description=f"Run the accuracy-vs-format study (about {DEFAULT_TIME} on a 2-core CPU; --quick about "
        f"{QUICK_TIME}) and write study.csv, report.md and figures/ into the output folder.",
    )
    size = s.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"the small CI grid (about {QUICK_TIME} on a 2-core CPU)")
    size.add_argument(
        "--full",
        action="store_true",
        help=f"more data: 48 end-to-end windows (6,096 tokens), 4 sequences per context point (about {FULL_TIME} "
        "on a 2-core CPU)",
    )
    s.add_argument("--device", default="cpu", help="torch device for the emulator, references and model (cpu, cuda)")
    s.add_argument(
        "--out",
        default=None,
        help="output folder (default: runs/<UTC timestamp>/ under the current directory, git-ignored; "
        "--out reports regenerates the committed report)",
    )
    s.add_argument("--seed", type=int_arg(0, SEED_MAX), default=0, help="seed of the synthetic data (default 0)")
    s.add_argument("--no-real-model", action="store_true", help="skip the SmolLM2 parts (capture, layers, end to end)")
    s.add_argument(
        "--threads",
        type=int_arg(1, MAX_THREADS),
        default=1,
        help="torch CPU threads (default 1: fastest on a shared CPU)",
    )
    s.add_argument(
        "--workers",
        type=int_arg(0, MAX_WORKERS),
        default=None,
        help="CPU processes that score the end-to-end windows beside the rest of the study (default: one per "
        "spare core, at most 4, so 1 on a 2-core CPU; 0: none). The rows do not depend on it",
    )
    s.add_argument(
        "--target",
        default="thor",
        choices=TARGET_NAMES,
        help="the kernel target the spec models (its split plan and tile walk; default thor on any device, so "
        "a CUDA run reproduces a CPU run)",
    )
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    c = sub.add_parser(
        "compare",
        help="compare two study runs row by row (does a result hold on another machine?)",
        description="Pair the rows of two runs' study.csv by configuration and report rows found in one run "
        "only, differing sha256 digests of the real-model inputs, and per metric column the values that differ "
        "and by how much. Exit status 0 when the runs agree, 1 when they differ.",
    )
    c.add_argument("run_a", help="a run folder (holding study.csv) or a study.csv")
    c.add_argument("run_b", help="the other run")
    c.add_argument(
        "--rtol",
        type=float,
        default=0.0,
        help="largest relative difference of a metric that still agrees (default 0: identical as written)",
    )
    n = sub.add_parser(
        "notebooks",
        help="execute the notebooks and store their outputs (notebooks/*.ipynb)",
        description="Execute each notebooks/NAME.py and write notebooks/NAME.ipynb with its outputs and a stamp "
        "(the script's digest); a test fails while a stored notebook is stale.",
    )
    n.add_argument("names", nargs="*", help="notebook names (default: all)")
    n.add_argument("--size", default="full", choices=("small", "full"), help="MJOLNIR_NOTEBOOK_SIZE (default full)")
    return parser


# --------------------------------------------------------------------------------------------------
# Validation (all before any work)
# --------------------------------------------------------------------------------------------------
def check_device(device: str) -> str:
    """``device`` as torch spells it, or :class:`CLIError` when it is not a usable cpu / cuda device."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise CLIError(f"--device: {device!r} is not a torch device (allowed: cpu, cuda, cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise CLIError(f"--device: {device!r}; allowed: cpu, cuda, cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise CLIError(f"--device: {device!r} asked for, but torch.cuda.is_available() is False")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise CLIError(f"--device: {device!r}, but only {torch.cuda.device_count()} CUDA device(s) are visible")
    return str(dev)


def default_out(cwd: Optional[Path] = None, now: Optional[datetime.datetime] = None) -> Path:
    """``cwd/runs/<UTC timestamp YYYYMMDD-HHMMSS>`` (``-2``, ``-3``, ... appended if that folder exists)."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    now = datetime.datetime.now(datetime.timezone.utc) if now is None else now
    base = cwd / "runs" / now.astimezone(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def resolve_out(out: Optional[str], cwd: Optional[Path] = None, now: Optional[datetime.datetime] = None) -> Path:
    """The output folder ``mjolnir study`` writes to: ``--out`` as given, else :func:`default_out`."""
    if out is None:
        return default_out(cwd, now)
    if not out.strip():
        raise CLIError("--out: empty path")
    path = Path(out).expanduser()
    return path if path.is_absolute() or cwd is None else Path(cwd) / path


def check_out(path: Path) -> Path:
    """``path`` if it can be the output folder (a writable folder, or creatable), else :class:`CLIError`.

    Nothing is created here.
    """
    if path.exists():
        if not path.is_dir():
            raise CLIError(f"--out: {str(path)!r} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise CLIError(f"--out: {str(path)!r} is not writable")
        return path
    parent = path.parent
    while not parent.exists():  # the nearest existing ancestor must be a writable folder
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise CLIError(f"--out: cannot create {str(path)!r}: {str(parent)!r} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(f"--out: cannot create {str(path)!r}: {str(parent)!r} is not writable")
    return path


def _make_out(path: Path) -> bool:
    """Create the output folder; True if this call created it."""
    existed = path.is_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(f"--out: cannot create {str(path)!r}: {e.strerror or e}") from None
    return not existed


# --------------------------------------------------------------------------------------------------
# The end-of-run summary
# --------------------------------------------------------------------------------------------------
def _display(path: Path) -> str:
    """``path`` relative to the current directory when it is under it, else absolute."""
    path = path.absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _cell(v, fmt: str) -> str:
    try:
        if v != v:  # NaN
            return "-"
        return format(v, fmt)
    except (TypeError, ValueError):
        return str(v)


HEADLINE_COLUMNS = (  # (summary_table column, header, format)
    ("fmt", "fmt", ""),
    ("bits", "bits", ".4g"),
    ("syn_rel_l2", "syn_rel_l2", ".4f"),
    ("syn_cosine", "syn_cos", ".5f"),
    ("real_rel_l2", "real_rel_l2", ".4f"),
    ("real_worst_layer_rel_l2", "real_worst", ".4f"),
    ("e2e_kl", "e2e_kl", ".4f"),
    ("e2e_top1", "e2e_top1", ".3f"),
    ("e2e_ppl", "e2e_ppl", ".2f"),
)


def summary_lines(df, out: Path, files: Sequence[Path], seconds: float, info: Optional[dict] = None) -> list[str]:
    """The one-screen summary (< 25 lines): output folder, files written, the report's headline table
    (:func:`mjolnir_study.report.summary_table`, one row per KV format) and the anchor verdicts."""
    from . import report

    info = info or {}
    lines = [f"mjolnir study: wrote {_display(out)}/ in {seconds:.0f} s"]
    pngs = [f for f in files if f.suffix == ".png"]
    for f in files:
        if f.suffix != ".png":
            rows = ""
            if f.suffix == ".csv":
                with f.open() as fh:
                    rows = f"  ({max(0, sum(1 for _ in fh) - 1)} rows)"
            lines.append(f"  {f.relative_to(out).as_posix()}{rows}")
    if pngs:
        lines.append(f"  figures/*.png  ({len(pngs)}: {', '.join(p.stem for p in pngs)})")
    st = report.summary_table(df)
    cols = [(c, h, f) for c, h, f in HEADLINE_COLUMNS if c in st.columns]
    if len(st):
        lines.append("Headline (report.md), per KV format; rel_l2 / cosine of the decode output O:")
        legend = ["syn = median over synthetic kinds (per_head scales, e4m3 Q)"]
        if "real_rel_l2" in st.columns:
            legend.append("real = median / worst SmolLM2 layer")
        if "e2e_kl" in st.columns:
            e2e = df[df.part == "end_to_end"]
            legend.append(f"e2e = SmolLM2 end to end (KL nats/token; ppl unquantized {e2e.ppl_ref.iloc[0]:.2f})")
        lines.extend("  " + x for x in legend)
        table = [[h for _, h, _ in cols]] + [[_cell(r[c], f) for c, _, f in cols] for _, r in st.iterrows()]
        widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
        for row in table:
            cells = [x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(row, widths))]
            lines.append("  " + "  ".join(cells).rstrip())
    if info.get("real_model", "used") != "used":
        lines.append(f"Real model: {info['real_model']}")
    findings = report.anchor_findings(df)
    if findings:
        verdicts = [f["verdict"] for f in findings]
        known = ["agrees", "disagrees", "not resolved"]
        order = known + sorted(set(verdicts) - set(known))
        counts = ", ".join(f"{v} {verdicts.count(v)}" for v in order if v in verdicts)
        lines.append(f"Published anchors: {counts} (see report.md)")
    md = [f for f in files if f.name == "report.md"]
    if md:
        lines.append(f"Report: {_display(md[0])}")
    return lines


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------
def run_study_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Validate every flag (:class:`CLIError` on a bad one, before any work), run the study, write and summarize."""
    device = check_device(args.device)
    if not 1 <= args.threads <= MAX_THREADS:  # argparse checks these; a Namespace built by hand may not be
        raise CLIError(f"--threads: expected an int in [1, {MAX_THREADS}], got {args.threads!r}")
    if not 0 <= args.seed <= SEED_MAX:
        raise CLIError(f"--seed: expected an int in [0, {SEED_MAX}], got {args.seed!r}")
    out = check_out(resolve_out(args.out))

    from . import report
    from .study import StudyConfig, read_csv, run_study, write_csv

    preset = (
        StudyConfig.quick if args.quick else StudyConfig.full if getattr(args, "full", False) else StudyConfig.default
    )
    try:
        config = preset(
            device=device,
            seed=args.seed,
            real_model=not args.no_real_model,
            cpu_threads=args.threads,
            cpu_workers=getattr(args, "workers", None),
            target=getattr(args, "target", "thor"),
        )
    except ValueError as e:
        raise CLIError(str(e)) from None
    created = _make_out(out)
    t0 = time.perf_counter()

    def log(line: str) -> None:
        print(f"[mjolnir study] {line}", file=sys.stderr, flush=True)

    try:
        log(f"preset {config.name}, device {device}, out {_display(out)}/")
        result = run_study(config, progress=not args.no_progress, log=log)
        csv_path = write_csv(result.rows, out / "study.csv")
        files = [csv_path]
        stats = result.info.get("kv_stats")
        if stats:
            with (out / "kv_stats.csv").open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(stats[0]))
                w.writeheader()
                w.writerows(stats)
            files.append(out / "kv_stats.csv")
        command = "mjolnir " + " ".join(shlex.quote(a) for a in argv)
        df = read_csv(csv_path)
        md = report.write_report(df, out, config=config.to_dict(), info=result.info, command=command)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # leave no empty runs/<timestamp>/ behind a failed or interrupted run
        raise
    files.append(md)
    figures = list(report.FIGURES) + (["kv_stats"] if stats else [])
    files += [p for p in (out / "figures" / f"{name}.png" for name in figures) if p.exists()]
    seconds = time.perf_counter() - t0
    print("\n".join(summary_lines(df, out, files, seconds, result.info)), flush=True)
    return 0


def run_compare_command(args: argparse.Namespace) -> int:
    """``mjolnir compare``: print :func:`~mjolnir_study.compare.format_comparison`; 0 when the runs agree, else 1."""
    from .compare import compare_runs, format_comparison

    if not (math.isfinite(args.rtol) and args.rtol >= 0):
        raise CLIError(f"--rtol: expected a finite number >= 0, got {args.rtol!r}")
    try:
        c = compare_runs(args.run_a, args.run_b, rtol=args.rtol)
    except (FileNotFoundError, ValueError) as e:
        raise CLIError(str(e)) from None
    print("\n".join(format_comparison(c, args.run_a, args.run_b)), flush=True)
    return 0 if c.agree else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``mjolnir`` console script (``argv`` defaults to ``sys.argv[1:]``).

    Returns 0 on success and 2 on a bad command line (one line on stderr, nothing run).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        if args.command == "study":
            return run_study_command(args, argv)
        if args.command == "compare":
            return run_compare_command(args)
        if args.command == "notebooks":
            from .notebooks import notebook_scripts, refresh

            try:
                names = notebook_scripts(args.names or None)
            except ValueError as e:
                raise CLIError(str(e)) from None
            refresh([p.stem for p in names], size=args.size, log=lambda line: print(line, flush=True))
            return 0
        raise AssertionError(args.command)  # argparse rejects unknown subcommands
    except CLIError as e:
        print(f"mjolnir: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
