"""``benchmarks.probes.emulator_chain``'s arguments: ``--arms`` and its companions are checked before anything
needs a GPU, each refusal naming the argument and what it allows."""

import pytest

from benchmarks.probes import emulator_chain


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--arms", "X=0"], "--arms: expected at least two arms separated by ';'"),
        (["--arms", "X=0;X"], "--arms: expected NAME=VALUE pairs"),
        (
            ["--arms", "X=0;X=1", "--arms-row", "b32_nope"],
            "--arms-row: unknown 'b32_nope'; choose from b32_32k_e4m3_e4m3q",
        ),
        (["--arms", "X=0;X=1", "--repeat", "0"], "--repeat: expected >= 1, got 0"),
    ],
)
def test_bad_arms_arguments_are_refused_by_name(argv, message, capsys):
    assert emulator_chain.main(argv) == 2
    assert message in capsys.readouterr().err


def test_good_arms_arguments_get_as_far_as_the_gpu_check(capsys, monkeypatch):
    monkeypatch.setattr(emulator_chain.torch.cuda, "is_available", lambda: False)
    assert emulator_chain.main(["--arms", "X=0;X=1", "--arms-row", "b32_32k_e2m1", "--repeat", "1"]) == 2
    assert capsys.readouterr().err.strip() == "emulator_chain: needs a CUDA GPU"
