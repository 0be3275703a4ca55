"""Two study runs, row by row: do the numbers hold on another machine?

``mjolnir compare RUN_A RUN_B`` (or :func:`compare_runs`) pairs the rows of two ``study.csv`` files by
their configuration (every column that says *what* was measured, :data:`KEY_COLUMNS`), then reports

* rows present in one run only (a different preset or grid: the runs are not comparable row by row);
* real-model rows whose ``sha256`` differs: the spec was fed (or returned) different bits;
* per metric column, how many values differ as written (6 significant digits) and the largest absolute
  and relative difference.

The wall-time column ``seconds`` is not compared. Two runs *agree* when every row pairs, every digest
matches, and no metric differs by more than ``rtol`` (relative; default 0: identical as written).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["KEY_COLUMNS", "Comparison", "compare_runs", "format_comparison", "study_csv"]

KEY_COLUMNS = (
    "part", "data", "source", "kind", "layer", "seq_len", "num_seqs", "heads_q", "heads_k", "head_dim", "fmt",
    "recipe", "granularity", "q_dtype", "p_variant", "transform", "scales", "target", "arithmetic", "error_source",
)  # fmt: skip
"""The columns that name a configuration (rows pair on them, and on their order among equal keys)."""
IGNORED_COLUMNS = ("seconds", "sha256", "bits_per_value", "kernel_supported")
"""Not compared as metrics: wall time, the digest (compared on its own) and properties of the format."""


@dataclass
class ColumnDiff:
    """One metric column over the paired rows: values compared, values that differ, largest differences."""

    compared: int = 0
    differ: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0


@dataclass
class Comparison:
    """What :func:`compare_runs` found.

    Attributes:
        paired: rows present in both runs.
        only_a, only_b: configuration keys (tuples of :data:`KEY_COLUMNS` values) of unpaired rows.
        digests: ``(compared, differ)`` over rows where both runs carry a ``sha256``.
        digest_mismatch: keys of the rows whose digests differ.
        columns: metric column -> :class:`ColumnDiff`.
        rtol: the tolerance :attr:`agree` applies.
    """

    paired: int
    only_a: list = field(default_factory=list)
    only_b: list = field(default_factory=list)
    digests: tuple[int, int] = (0, 0)
    digest_mismatch: list = field(default_factory=list)
    columns: dict[str, ColumnDiff] = field(default_factory=dict)
    rtol: float = 0.0

    @property
    def agree(self) -> bool:
        """Every row pairs, every digest matches and no metric moves by more than ``rtol`` (relative)."""
        if self.only_a or self.only_b or self.digest_mismatch or self.paired == 0:
            return False
        return all(c.max_rel <= self.rtol for c in self.columns.values())


def study_csv(path: str | Path) -> Path:
    """``path`` if it is a file, else ``path/study.csv`` (FileNotFoundError naming it when absent)."""
    p = Path(path)
    csv = p / "study.csv" if p.is_dir() else p
    if not csv.is_file():
        raise FileNotFoundError(f"{path}: no study.csv there (give a run folder or a study.csv)")
    return csv


def _keyed(df):
    """``{key: row}`` with the occurrence number among equal keys appended to each key."""
    out, seen = {}, {}
    for _, row in df.iterrows():
        key = tuple("" if _missing(row[c]) else str(row[c]) for c in KEY_COLUMNS)
        n = seen[key] = seen.get(key, -1) + 1
        out[key + (n,)] = row
    return out


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v == ""


def compare_runs(a: str | Path, b: str | Path, rtol: float = 0.0) -> Comparison:
    """Pair the rows of runs ``a`` and ``b`` (run folders or ``study.csv`` paths) and compare them.

    Args:
        a, b: the two runs.
        rtol: largest relative difference of a metric that still counts as agreement (>= 0).

    Returns:
        a :class:`Comparison`.

    Raises:
        FileNotFoundError: ``a`` or ``b`` is neither a ``study.csv`` nor a folder holding one.
        ValueError: ``rtol`` not a finite number >= 0, or a CSV without the :data:`KEY_COLUMNS`.
    """
    from .study import read_csv

    if not (isinstance(rtol, (int, float)) and rtol >= 0 and math.isfinite(rtol)):
        raise ValueError(f"rtol: expected a finite number >= 0, got {rtol!r}")
    da, db = read_csv(study_csv(a)), read_csv(study_csv(b))
    for name, df in (("a", da), ("b", db)):
        missing = [c for c in KEY_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"{name}: {', '.join(missing)} missing: not a study.csv of this version")
    ra, rb = _keyed(da), _keyed(db)
    both = [k for k in ra if k in rb]
    metrics = [
        c
        for c in da.columns
        if c in db.columns and c not in KEY_COLUMNS and c not in IGNORED_COLUMNS and da[c].dtype.kind in "fi"
    ]
    out = Comparison(
        paired=len(both),
        only_a=[k[:-1] for k in ra if k not in rb],
        only_b=[k[:-1] for k in rb if k not in ra],
        columns={c: ColumnDiff() for c in metrics},
        rtol=float(rtol),
    )
    n_dig = 0
    for k in both:
        x, y = ra[k], rb[k]
        if "sha256" in x and "sha256" in y and not _missing(x["sha256"]) and not _missing(y["sha256"]):
            n_dig += 1
            if x["sha256"] != y["sha256"]:
                out.digest_mismatch.append(k[:-1])
        for c in metrics:
            u, v = x[c], y[c]
            if _missing(u) and _missing(v):
                continue
            cd = out.columns[c]
            cd.compared += 1
            if _missing(u) or _missing(v):  # a value on one side only
                cd.differ += 1
                cd.max_abs = cd.max_rel = math.inf
                continue
            d = abs(float(u) - float(v))
            if d > 0:
                cd.differ += 1
                cd.max_abs = max(cd.max_abs, d)
                cd.max_rel = max(cd.max_rel, d / max(abs(float(u)), abs(float(v))))
    out.digests = (n_dig, len(out.digest_mismatch))
    return out


def format_comparison(c: Comparison, a: str = "a", b: str = "b") -> list[str]:
    """The lines ``mjolnir compare`` prints: pairing, digests, the columns that differ, the verdict."""
    lines = [f"rows paired: {c.paired}; only in {a}: {len(c.only_a)}; only in {b}: {len(c.only_b)}"]
    for side, keys in ((a, c.only_a), (b, c.only_b)):
        for k in keys[:5]:
            lines.append(f"  only in {side}: {'/'.join(x for x in k if x)}")
        if len(keys) > 5:
            lines.append(f"  ... and {len(keys) - 5} more only in {side}")
    n, bad = c.digests
    lines.append(f"sha256 digests (real-model inputs and outputs of the spec): {n - bad} of {n} equal")
    for k in c.digest_mismatch[:5]:
        lines.append(f"  digest differs: {'/'.join(x for x in k if x)}")
    same = [name for name, d in c.columns.items() if d.differ == 0 and d.compared]
    lines.append(f"metric columns identical as written: {len(same)} of {len(c.columns)}")
    for name, d in c.columns.items():
        if d.differ:
            lines.append(
                f"  {name}: {d.differ} of {d.compared} values differ, max |diff| {d.max_abs:.3g}, "
                f"max relative {d.max_rel:.3g}"
            )
    verdict = "agree" if c.agree else "differ"
    tol = "identical as written" if c.rtol == 0 else f"within relative {c.rtol:g}"
    lines.append(f"verdict: the runs {verdict} ({tol})")
    return lines
