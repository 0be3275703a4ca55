"""Shared fixtures for the Mjolnir test suite.

* ``MJOLNIR_TEST_SIZE=small|full`` scales random-sample sizes (``full``: at least one million random
  values per sweep; ``small``, the default: 200k) through :func:`test_size`.
* ``cuda_only`` / :data:`DEVICES`: CUDA variants skip with a reason when no GPU is present.
* ``seed_module``: the seed's pure-PyTorch helpers (``minifloat_table`` / ``minifloat_quantize``) loaded
  from ``../shared/seed/t5_decode.py`` through :func:`benchmarks.seed.load_seed`.
"""

from __future__ import annotations

import os
import types

import pytest
import torch

from benchmarks.seed import SEED_PATH, load_seed

# The seed definitions the tests and the benchmark compare against (only these are executed).
SEED_NAMES = ("_MINIFLOAT", "minifloat_table", "minifloat_quantize")

_SIZES = {"small": 200_000, "full": 1_000_000}


def test_size_name() -> str:
    """``"small"`` (default) or ``"full"``, from ``MJOLNIR_TEST_SIZE``."""
    name = os.environ.get("MJOLNIR_TEST_SIZE", "small")
    if name not in _SIZES:
        raise ValueError(f"MJOLNIR_TEST_SIZE: {name!r} is not one of {', '.join(_SIZES)}")
    return name


def random_sample_size() -> int:
    """Number of random float32 values per random sweep: 1M at ``full``, 200k at ``small``."""
    return _SIZES[test_size_name()]


test_size_name.__test__ = False  # not a test, despite the name


@pytest.fixture(scope="session")
def seed_module() -> types.SimpleNamespace:
    """The seed's minifloat helpers; skips the test when the seed file is absent."""
    if not SEED_PATH.exists():
        pytest.skip(f"seed file {SEED_PATH} is absent; the seed comparison needs it")
    return load_seed(*SEED_NAMES)


HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
"""Marker for CUDA variants: they skip with a reason on CPU-only machines."""

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[cuda_only, pytest.mark.gpu]),
]
"""Parametrize a test over CPU and (skipping without a GPU) CUDA."""


@pytest.fixture(scope="session")
def sample_size() -> int:
    """Random sample size for the current ``MJOLNIR_TEST_SIZE``."""
    return random_sample_size()


class FusedOnTheCpu:
    """A stand-in for the cache module's ``fused``: available on the CPU, ``compiled_many(fn)`` = ``fn`` with a
    spy (the compiled functions it was given are in ``taken``); everything else the real module's."""

    def __init__(self):
        self.taken = []

    def available(self, device):
        return True

    def compiled_many(self, fn, tune=False):
        def spy(*args):
            self.taken.append((fn.__name__, args[-1]))
            return fn(*args)

        return spy

    def __getattr__(self, name):
        import mjolnir_numerics.fused as fused

        return getattr(fused, name)
