"""The emulator's GPU benchmark reports what a run measured (its rows faked here: no GPU needed)."""

from __future__ import annotations

import pytest
import torch

import benchmarks.bench_emulator_gpu as bench


def _fake_row(emu_times, kernel_ms=1.0, same=True, ab=None, arms=None):
    def bench_row(name, spec, repeat, kernel_iters, gen, ab_name=None, arm_sets=None):
        emu_ms = sorted(emu_times)[len(emu_times) // 2]
        return dict(
            name=name, shape="b32 4K 24/4 d256", fmt="e4m3", q="e4m3", kernel_ms=kernel_ms, emu_ms=emu_ms,
            emu_range=f"{min(emu_times):.1f}-{max(emu_times):.1f}", ratio=emu_ms / kernel_ms, warm_s=1.0,
            extra_gb=0.5, cache_gb=1.0, mem_ratio=0.5, same=same, ab=ab if ab_name else None,
            arms=arms if arm_sets else None, returned_ms=7.5, syncs=3,
        )  # fmt: skip

    return bench_row


def _run(monkeypatch, capsys, row, argv):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(torch, "Generator", lambda device=None: type("G", (), {"manual_seed": lambda s, n: s})())
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "bench_row", row)
    rc = bench.main(argv)
    return rc, capsys.readouterr().out.splitlines()


def test_a_row_prints_its_median_and_the_spread_of_its_calls(monkeypatch, capsys):
    rc, out = _run(monkeypatch, capsys, _fake_row([12.0, 10.0, 31.0]), ["--rows", "b32_4k_e4m3q"])
    row = [line for line in out if line.startswith("b32_4k_e4m3q")][0]
    assert "12.0" in row and "10.0-31.0" in row and "12.0x" in row and "identical" in row
    assert row.split()[-3:] == ["7.5", "3", "identical"]  # the time until the call returned, the host syncs
    assert rc == 0 and "goal missed" not in row


def test_a_missed_ratio_or_differing_bits_fail_the_run(monkeypatch, capsys):
    rc, out = _run(monkeypatch, capsys, _fake_row([40.0]), ["--rows", "b32_4k_e4m3q"])
    assert rc == 1 and "(ratio goal missed)" in out[-1]
    rc, out = _run(monkeypatch, capsys, _fake_row([2.0], same=False), ["--rows", "b32_4k_e4m3q"])
    assert rc == 1 and "DIFFER" in out[-1]


def test_ab_prints_both_medians_and_their_ratio(monkeypatch, capsys):
    rc, out = _run(
        monkeypatch, capsys, _fake_row([12.0], ab=(10.0, 8.0, 6.5, 4.5)), ["--rows", "b32_4k_e4m3q", "--ab", "X"]
    )
    assert rc == 0 and "X=0 10.0 ms, X=1 8.0 ms" in out[-1] and "1/0 0.80" in out[-1] and "8.0x" in out[-1]
    assert out[-1].endswith("returned 6.5 / 4.5 ms")
    rc, out = _run(monkeypatch, capsys, _fake_row([12.0], ab=(10.0, 8.0, 6.5, 4.5)), ["--rows", "b32_4k_e4m3q"])
    assert "X=0" not in "\n".join(out)
    monkeypatch.setattr(bench, "bench_row", lambda *a: pytest.fail("no row runs with a bad --ab"))
    assert bench.main(["--rows", "b32_4k_e4m3q", "--ab", "X=1"]) == 2
    assert "--ab: expected environment variables' names" in capsys.readouterr().err


def test_ab_alternates_the_variable_after_a_call_of_each_and_restores_it(monkeypatch):
    """One untimed call per value (each variant compiles its graphs there), then timed pairs in alternating
    order; the medians are of the timed calls only, every output is checked, and the variable is put back."""
    import os

    calls = []

    def fake_ms(fn, repeat, returned):  # the untimed pair: 1000 ms; the timed calls at 0: 10, 12, 14; at 1: 8, 9, 10
        out = fn()
        flag = os.environ["MJOLNIR_AB_TEST"]
        k = calls[2:].count(flag) - 1  # this flag's timed calls before this one
        t = 1000.0 if len(calls) <= 2 else {"0": 10.0 + 2 * k, "1": 8.0 + k}[flag]
        returned.append(t / 2)  # the host's share: half of each call
        return t, [t], out

    monkeypatch.setattr(bench, "_ms", fake_ms)
    monkeypatch.setenv("MJOLNIR_AB_TEST", "keep")
    off, on, same, back = bench._ab(lambda: calls.append(os.environ["MJOLNIR_AB_TEST"]) or len(calls),
                                    "MJOLNIR_AB_TEST", 3, lambda out: out != 6)  # fmt: skip
    assert calls == ["0", "1", "1", "0", "0", "1", "1", "0"]
    assert (off, on) == (12.0, 9.0) and back == (6.0, 4.5) and not same and os.environ["MJOLNIR_AB_TEST"] == "keep"
    monkeypatch.delenv("MJOLNIR_AB_TEST")
    calls.clear()
    assert bench._ab(lambda: calls.append(1), "MJOLNIR_AB_TEST", 1, lambda out: True)[2]
    assert "MJOLNIR_AB_TEST" not in os.environ


def test_ab_sets_several_variables_together(monkeypatch):
    """``--ab A,B``: both variables at 0 in one arm and both at 1 in the other, each put back as it was."""
    import os

    seen = []
    monkeypatch.setattr(bench, "_ms", lambda fn, repeat, returned: (returned.append(1.0), (2.0, [2.0], fn()))[1])
    monkeypatch.setenv("MJOLNIR_AB_A", "keep")
    monkeypatch.delenv("MJOLNIR_AB_B", raising=False)
    both = "MJOLNIR_AB_A,MJOLNIR_AB_B"
    bench._ab(lambda: seen.append((os.environ["MJOLNIR_AB_A"], os.environ["MJOLNIR_AB_B"])), both, 1, lambda out: True)
    assert seen == [("0", "0"), ("1", "1"), ("1", "1"), ("0", "0")]
    assert os.environ["MJOLNIR_AB_A"] == "keep" and "MJOLNIR_AB_B" not in os.environ


def test_the_host_share_and_the_syncs_of_a_call(monkeypatch):
    """``_ms`` records each call's time until it returned (before the device synchronisation), never more
    than its whole time; ``_syncs`` counts the sync debug mode's warnings of one call, and only those, and
    switches the mode back."""
    import time
    import warnings

    modes = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: time.sleep(0.02))  # the device finishing its work
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    returned: list = []
    total, times, out = bench._ms(lambda: time.sleep(0.005) or "o", 3, returned)
    assert out == "o" and len(returned) == 3 and all(5 <= r < t for r, t in zip(returned, times))
    assert all(t >= 25 for t in times)

    def call():
        warnings.warn("called a synchronizing CUDA operation", stacklevel=2)
        warnings.warn("something else", stacklevel=2)
        warnings.warn("called a synchronizing CUDA operation", stacklevel=2)

    assert bench._syncs(call) == 2 and modes == ["warn", "default"]


def test_arms_run_in_turn_reversed_every_round_and_restore_the_environment(monkeypatch):
    """Every arm once untimed, then rounds in order and in reverse; a variable an arm does not set is as it was
    before (not left over from the previous arm); the medians are per arm, of the timed calls only."""
    import os

    seen = []

    def fake_ms(fn, repeat, returned):
        out = fn()
        a = seen[-1]
        t = 1000.0 if len(seen) <= 3 else {"00": 10.0, "10": 8.0, "11": 6.0}[a]
        returned.append(t / 2)
        return t, [t], out

    monkeypatch.setattr(bench, "_ms", fake_ms)
    monkeypatch.setenv("MJOLNIR_ARM_B", "was")
    monkeypatch.delenv("MJOLNIR_ARM_A", raising=False)
    arms = [{"MJOLNIR_ARM_A": "0"}, {"MJOLNIR_ARM_A": "1"}, {"MJOLNIR_ARM_A": "1", "MJOLNIR_ARM_B": "1"}]
    env = []

    def fn():
        a, b = os.environ.get("MJOLNIR_ARM_A"), os.environ.get("MJOLNIR_ARM_B")
        env.append((a, b))
        seen.append(a + ("1" if b == "1" else "0"))
        return len(seen)

    medians, same, backs = bench._arms(fn, arms, 2, lambda out: out != 5)
    assert seen == ["00", "10", "11", "11", "10", "00", "00", "10", "11"]
    assert env[0] == ("0", "was") and env[1] == ("1", "was") and env[2] == ("1", "1")
    assert env[4] == ("1", "was")  # arm 2 right after arm 3, which set B
    assert medians == [10.0, 8.0, 6.0] and backs == [5.0, 4.0, 3.0] and not same
    assert os.environ["MJOLNIR_ARM_B"] == "was" and "MJOLNIR_ARM_A" not in os.environ


def test_parse_arms_and_its_errors(monkeypatch, capsys):
    assert bench.parse_arms("A=0,B=0;A=1,B=1") == [{"A": "0", "B": "0"}, {"A": "1", "B": "1"}]
    for bad in ("A=0", "A=0;B", "A=0;A=1,A=0", "A=0;1X=2", "A=0;"):
        with pytest.raises(ValueError, match="--arms"):
            bench.parse_arms(bad)
    monkeypatch.setattr(bench, "bench_row", lambda *a: pytest.fail("no row runs with bad arms"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench.main(["--rows", "b32_4k_e4m3q", "--arms", "A=0;B"]) == 2
    assert "--arms: expected NAME=VALUE" in capsys.readouterr().err
    assert bench.main(["--rows", "b32_4k_e4m3q", "--arms", "A=0;A=1", "--ab", "A"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_arms_print_a_line_each_with_the_ratio_to_the_first(monkeypatch, capsys):
    row = _fake_row([12.0], kernel_ms=2.0, arms=[(10.0, 9.0), (8.0, 3.0)])
    rc, out = _run(monkeypatch, capsys, row, ["--rows", "b32_4k_e4m3q", "--arms", "A=0,B=0;A=1,B=1"])
    assert rc == 0
    assert "arm 1 A=0,B=0: 10.0 ms" in out[-2] and "1.00 of arm 1" in out[-2] and "ratio 5.0x" in out[-2]
    assert "arm 2 A=1,B=1: 8.0 ms" in out[-1] and "0.80 of arm 1" in out[-1] and out[-1].endswith("returned 3.0 ms")


@pytest.mark.parametrize("n_arms", [4, 5])
def test_more_arms_than_kept_problems_get_a_note(n_arms, monkeypatch, capsys):
    """The emulator keeps the window graphs of 4 problems per device: a fifth arm with graphs of its own would evict
    another arm's, and every call would capture again inside the timing, so ``_arms`` says so (once, on stderr)."""
    from mjolnir_numerics.emulator import _REPLAYS_KEPT

    assert _REPLAYS_KEPT == 4
    monkeypatch.setattr(bench, "_ms", lambda fn, repeat, returned: (returned.append(1.0), (2.0, [2.0], fn()))[1])
    arms = [{"MJOLNIR_ARM_N": str(i)} for i in range(n_arms)]
    bench._arms(lambda: 0, arms, 1, lambda out: True)
    err = capsys.readouterr().err
    note = f"# note: {n_arms} arms, more than the 4 problems whose window graphs the emulator keeps per device"
    assert (note in err) == (n_arms > 4) and err.count("# note:") == (n_arms > 4)


def test_same_bits_compares_o_and_lse_bit_for_bit():
    o = torch.tensor([1.0, -0.0, float("nan")], dtype=torch.bfloat16)
    lse = torch.tensor([0.5, float("-inf")])
    assert bench.same_bits((o, lse), (o.clone(), lse.clone()))
    assert not bench.same_bits((o, lse), (torch.tensor([1.0, 0.0, float("nan")], dtype=torch.bfloat16), lse))  # -0
    assert not bench.same_bits((o, lse), (o, torch.tensor([0.5, -3.0e38])))
