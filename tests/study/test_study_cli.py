"""The ``mjolnir study`` command line: where it writes, what it prints, and how it rejects bad flags.

The default run writes to ``runs/<UTC timestamp>/`` under the current directory (git-ignored), never to
the committed ``reports/``; every flag is checked before any work (one line on stderr, exit 2); the end
of a run prints the output folder, the files and the headline table. One small real run
(``--quick --no-real-model``, a few seconds) in a temporary working directory checks the whole path.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="study extra not installed: pip install -e '.[study]'")
pytest.importorskip("pandas", reason="study extra not installed: pip install -e '.[study]'")

from mjolnir_study import cli  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STAMP = re.compile(r"^\d{8}-\d{6}(-\d+)?$")


# --------------------------------------------------------------------------------------------------
# The output folder
# --------------------------------------------------------------------------------------------------
def test_default_out_is_a_timestamped_folder_under_runs(tmp_path):
    now = datetime.datetime(2026, 12, 1, 20, 30, 0, tzinfo=datetime.timezone.utc)
    assert build_args([]).out is None  # the parser's default is no folder: resolve_out picks it
    out = cli.resolve_out(None, cwd=tmp_path, now=now)
    assert out == tmp_path / "runs" / "20261201-203000"
    assert "reports" not in out.parts
    # a non-UTC clock is converted to UTC
    later = datetime.datetime(2026, 12, 2, 1, 30, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=5)))
    assert cli.default_out(tmp_path, later).name == "20261201-203000"
    # a folder of the same second is not reused
    out.mkdir(parents=True)
    assert cli.default_out(tmp_path, now).name == "20261201-203000-2"


def test_default_out_uses_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = cli.resolve_out(None)
    assert out.parent == tmp_path / "runs" and STAMP.match(out.name)


def test_explicit_out_is_kept(tmp_path):
    assert cli.resolve_out("reports") == Path("reports")
    assert cli.resolve_out(str(tmp_path / "x")) == tmp_path / "x"
    assert cli.resolve_out("rel", cwd=tmp_path) == tmp_path / "rel"


def test_runs_is_git_ignored():
    if not (REPO / ".gitignore").exists():
        pytest.skip("not a checkout")
    assert "/runs/" in (REPO / ".gitignore").read_text().split()


# --------------------------------------------------------------------------------------------------
# Bad flags: one line on stderr, exit 2, before any work
# --------------------------------------------------------------------------------------------------
def build_args(extra):
    return cli.build_parser().parse_args(["study", *extra])


@pytest.fixture
def no_study(monkeypatch):
    """Fail the test if the study (or the output folder's creation) is reached."""
    from mjolnir_study import study

    def boom(*a, **k):
        raise AssertionError("run_study was called although the command line is bad")

    monkeypatch.setattr(study, "run_study", boom)
    monkeypatch.setattr(cli, "_make_out", boom, raising=False)


def run_main(argv):
    err, out = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue(), time.perf_counter() - t0


def assert_usage_error(argv, flag):
    rc, out, err, seconds = run_main(argv)
    assert rc == 2, (rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], err
    assert "Traceback" not in err and out == ""
    assert seconds < 10
    return lines[0]


def test_out_that_is_a_file_exits_2_before_work(tmp_path, no_study):
    f = tmp_path / "a_file"
    f.write_text("x")
    line = assert_usage_error(["study", "--quick", "--out", str(f)], "--out")
    assert "not a directory" in line
    assert f.read_text() == "x"


def test_out_under_a_file_exits_2(tmp_path, no_study):
    f = tmp_path / "a_file"
    f.write_text("x")
    assert_usage_error(["study", "--out", str(f / "sub" / "dir")], "--out")
    assert_usage_error(["study", "--out", ""], "--out")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_in_a_read_only_folder_exits_2(tmp_path, no_study):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert_usage_error(["study", "--out", str(ro / "out")], "--out")
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--threads", "0"], "--threads"),
        (["--threads", "-3"], "--threads"),
        (["--threads", "two"], "--threads"),
        (["--seed", "-1"], "--seed"),
        (["--seed", "1.5"], "--seed"),
        (["--device", "not_a_device"], "--device"),
        (["--device", "mps"], "--device"),
        (["--bogus"], "--bogus"),
        (["--target", "mi300"], "--target"),
    ],
)
def test_bad_flags_exit_2(extra, flag, tmp_path, no_study):
    assert_usage_error(["study", "--out", str(tmp_path / "o"), *extra], flag)
    assert not (tmp_path / "o").exists()


def test_cuda_without_a_gpu_exits_2(tmp_path, no_study):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert_usage_error(["study", "--device", "cuda", "--out", str(tmp_path / "o")], "--device")


def test_console_script_exit_code_and_stderr(tmp_path):
    # the real process: exit status 2 (not SystemExit's 1), one stderr line, no traceback
    f = tmp_path / "a_file"
    f.write_text("x")
    for extra, flag in ((["--out", str(f)], "--out"), (["--threads", "0"], "--threads")):
        p = subprocess.run(
            [sys.executable, "-m", "mjolnir_study", "study", "--quick", "--no-real-model", "--no-progress", *extra],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
        assert p.returncode == 2, p
        assert len(p.stderr.strip().splitlines()) == 1 and flag in p.stderr, p.stderr
        assert p.stdout == ""
    assert not (tmp_path / "runs").exists()


def test_a_failed_run_leaves_no_empty_folder(tmp_path, monkeypatch):
    from mjolnir_study import study

    def fail(*a, **k):
        raise RuntimeError("study failed")

    monkeypatch.setattr(study, "run_study", fail)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="study failed"):
        run_main(["study", "--quick", "--no-real-model", "--no-progress"])
    assert not list((tmp_path / "runs").iterdir())


# --------------------------------------------------------------------------------------------------
# A real (small) run with the default output folder
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        rc, out, err, seconds = run_main(["study", "--quick", "--no-real-model", "--no-progress"])
    assert rc == 0, err
    return cwd, out


def test_default_run_writes_under_runs_not_reports(default_run):
    cwd, _ = default_run
    assert not (cwd / "reports").exists()
    (folder,) = list((cwd / "runs").iterdir())
    assert STAMP.match(folder.name)
    for name in ("study.csv", "report.md", "figures/pareto.png"):
        assert (folder / name).is_file(), name


def test_summary_names_the_folder_files_and_headline(default_run):
    cwd, out = default_run
    (folder,) = list((cwd / "runs").iterdir())
    lines = out.strip().splitlines()
    assert 5 <= len(lines) <= 25, out
    assert f"runs/{folder.name}/" in lines[0]
    assert "study.csv" in out and "report.md" in out and "figures" in out
    # the headline table: one row per KV format with its synthetic error
    from mjolnir_study import report
    from mjolnir_study.study import read_csv

    table = report.summary_table(read_csv(folder / "study.csv"))
    for _, r in table.iterrows():
        (row,) = [x for x in lines if x.split()[:1] == [r.fmt]]
        assert f"{r.syn_rel_l2:.4f}" in row


def test_report_links_resolve_in_its_folder(default_run):
    cwd, _ = default_run
    (folder,) = list((cwd / "runs").iterdir())
    text = (folder / "report.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert "study.csv" in targets and any(t.startswith("figures/") for t in targets)
    for t in targets:
        if "://" not in t:
            assert (folder / t.partition("#")[0]).exists(), t


def test_repo_links_are_relative_inside_the_checkout(tmp_path):
    from mjolnir_study import report

    if not (REPO / "pyproject.toml").exists():
        pytest.skip("not a checkout")
    for out in (REPO / "reports", REPO / "runs" / "20261201-203000"):
        link = report._repo_link("docs/data.md#smollm2-facts", out)
        target = re.fullmatch(r"\[docs/data\.md\]\(([^)#]+)#smollm2-facts\)", link).group(1)
        assert (out / target).resolve() == REPO / "docs" / "data.md"
    assert report._repo_link("docs/data.md#smollm2-facts", tmp_path) == "`docs/data.md`"


def test_no_missing_document_is_cited():
    # the numerics and anchors notes are not in the repository: the package cites docs/numerics.md, docs/data.md
    missing = [name + ".md" for name in ("NUMERICS", "ANCHORS")]
    pkg = REPO / "mjolnir_study"
    for f in pkg.glob("*.py"):
        text = f.read_text()
        assert not any(m in text for m in missing), f.name


def test_quick_and_full_are_exclusive():
    assert_usage_error(["study", "--quick", "--full"], "--full")


def test_target_names_are_the_spec_targets():
    from mjolnir_numerics.targets import TARGETS
    from mjolnir_study.study import StudyConfig

    assert cli.TARGET_NAMES == tuple(TARGETS)
    assert StudyConfig.quick(target="h200").target == "h200"
    with pytest.raises(ValueError, match="mi300"):
        StudyConfig.quick(target="mi300")
