"""``benchmarks.bench_emulator_vs``: the cases it builds for each ``--format`` (the timing itself compares two
trees and is not a test)."""

import json

import pytest

from benchmarks import bench_emulator_vs as vs
from mjolnir_numerics.capability import KV_FORMATS


@pytest.mark.parametrize("fmt", KV_FORMATS)
def test_inputs_build_a_cache_of_the_format(fmt):
    q, cache, kw = vs._inputs(2, 300, "e4m3", "cpu", fmt)
    assert cache.fmt.name == fmt and cache.num_seqs == 2 and int(cache.seq_lens.max()) == 300
    assert cache.heads_k == vs.HEADS_K and cache.head_dim == vs.HEAD_DIM and cache.page_size == vs.PAGE_SIZE
    assert q.shape == (2, vs.HEADS_Q, vs.HEAD_DIM) and "q_descale" in kw


def test_worker_times_the_format_it_is_given():
    """The worker decodes the case's format (two formats, two digests) and reports its time."""
    rows = [vs.worker(json.dumps([1, 256, "e4m3", fmt]), "h200", "cpu", 1, False) for fmt in ("e2m1", "nvfp4")]
    assert rows[0]["digest"] != rows[1]["digest"] and all(r["seconds"] > 0 for r in rows)


def test_format_choices_refuse_an_unknown_format(capsys):
    with pytest.raises(SystemExit):
        vs.main(["--baseline", "HEAD", "--format", "fp5"])
    assert "--format" in capsys.readouterr().err
