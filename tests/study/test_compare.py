"""``mjolnir compare``: two runs' rows paired by configuration; what differs is found and named."""

from __future__ import annotations

import pytest

pytest.importorskip("pandas", reason="comparing runs needs pandas (the notebooks extra)")

from mjolnir_study import cli  # noqa: E402
from mjolnir_study.compare import compare_runs, format_comparison  # noqa: E402
from mjolnir_study.study import write_csv  # noqa: E402


def _rows() -> list[dict]:
    base = {"part": "grid", "source": "synthetic", "kind": "gaussian", "seq_len": 1024, "num_seqs": 2,
            "heads_q": 8, "heads_k": 2, "head_dim": 128, "recipe": "amax", "granularity": "per_head",
            "q_dtype": "e4m3", "p_variant": "e4m3_x448", "transform": "none", "scales": "dynamic",
            "target": "thor", "arithmetic": "ideal", "error_source": "total"}  # fmt: skip
    rows = [
        {**base, "data": "gaussian/L1024x2", "fmt": f, "rel_l2": r, "cosine": 1 - r * r / 2, "seconds": 0.1}
        for f, r in (("e4m3", 0.0621), ("e2m1", 0.2893))
    ]
    rows.append({**base, "part": "end_to_end", "source": "smollm2", "kind": "smollm2", "data": "smollm2/heldout",
                 "fmt": "e4m3", "kl": 0.0112, "top1": 0.942, "sha256": "00c67015cf16410e", "seconds": 3.0})  # fmt: skip
    rows.append({**rows[-1], "fmt": "e2m1", "kl": 0.269, "top1": 0.738, "sha256": "1234567890123456"})
    return rows


def _run(tmp_path, name, rows):
    return write_csv(rows, tmp_path / name / "study.csv").parent


def test_identical_runs_agree_and_wall_time_is_not_compared(tmp_path):
    a = _run(tmp_path, "a", _rows())
    rows = _rows()
    rows[0]["seconds"] = 99.0
    b = _run(tmp_path, "b", rows)
    c = compare_runs(a, b)
    assert c.agree and c.paired == 4 and c.digests == (2, 0)
    assert cli.main(["compare", str(a), str(b / "study.csv")]) == 0


def test_a_moved_metric_a_digest_and_a_missing_row_are_each_reported(tmp_path, capsys):
    a = _run(tmp_path, "a", _rows())
    rows = _rows()
    rows[1]["rel_l2"] = 0.2894
    rows[2]["sha256"] = "00c67015cf16410f"
    del rows[3]
    b = _run(tmp_path, "b", rows)
    c = compare_runs(a, b)
    assert not c.agree
    assert c.columns["rel_l2"].differ == 1 and c.columns["rel_l2"].max_abs == pytest.approx(1e-4)
    assert c.columns["cosine"].differ == 0 and c.digests == (1, 1) and len(c.only_a) == 1 and not c.only_b
    assert cli.main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "rel_l2: 1 of 2 values differ" in out and "digest differs" in out and "only in" in out
    assert out.rstrip().endswith("verdict: the runs differ (identical as written)")


def test_rtol_admits_small_differences_only(tmp_path):
    a = _run(tmp_path, "a", _rows())
    rows = _rows()
    rows[0]["rel_l2"] = 0.0621 * (1 + 1e-3)
    b = _run(tmp_path, "b", rows)
    assert not compare_runs(a, b).agree
    assert compare_runs(a, b, rtol=2e-3).agree and not compare_runs(a, b, rtol=5e-4).agree
    assert "within relative 0.002" in format_comparison(compare_runs(a, b, rtol=2e-3))[-1]


def test_digest_that_looks_like_a_number_is_compared_as_text(tmp_path):
    rows = _rows()
    rows[3]["sha256"] = "1e23456789012345"  # pandas would read it as a float
    a, b = _run(tmp_path, "a", rows), _run(tmp_path, "b", rows)
    assert compare_runs(a, b).digests == (2, 0)


def test_bad_arguments_are_one_line_errors(tmp_path, capsys):
    a = _run(tmp_path, "a", _rows())
    assert cli.main(["compare", str(a), str(tmp_path / "nowhere")]) == 2
    assert "no study.csv there" in capsys.readouterr().err
    assert cli.main(["compare", str(a), str(a), "--rtol", "-1"]) == 2
    assert "--rtol: expected a finite number >= 0" in capsys.readouterr().err
    with pytest.raises(ValueError, match="rtol"):
        compare_runs(a, a, rtol=float("nan"))
