"""What the decode kernels can run: one rule, used by the emulator, both kernels, the study and the CLIs.

Both kernels (Thor and Hopper) take the same problems:

* KV formats: every format of :data:`~mjolnir_numerics.formats.FORMATS` (e4m3, e3m2, e2m3, e2m1, nvfp4);
* Q: bf16, or e4m3 with a descale; every KV format but e4m3 needs e4m3 Q (the sub-byte values reach
  the MMA as e4m3 values next to e4m3 Q; there is no bf16 x fp6 / fp4 MMA path);
* head dims 128 and 256 (the MMAs' K tiling);
* page sizes 16, 32, 64 and 128 keys (a 128-key tile is a whole number of pages).

The emulator goes beyond these rules only when asked (``allow_unsupported=True``, a research switch).
"""

from __future__ import annotations

from typing import Optional

from .formats import FORMATS

__all__ = ["KV_FORMATS", "Q_DTYPES", "HEAD_DIMS", "PAGE_SIZES", "unsupported_reason", "check_supported"]

KV_FORMATS = tuple(FORMATS)
Q_DTYPES = ("bf16", "e4m3")
HEAD_DIMS = (128, 256)
PAGE_SIZES = (16, 32, 64, 128)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def unsupported_reason(
    kv_format: str, q_dtype: str, head_dim: Optional[int] = None, page_size: Optional[int] = None
) -> Optional[str]:
    """None when the kernels run this problem, else why not: one sentence naming the argument, its value
    and what is allowed. ``head_dim`` / ``page_size`` None: not checked."""
    if kv_format not in KV_FORMATS:
        return f"kv_format: {kv_format!r} is not one of {KV_FORMATS}"
    if q_dtype not in Q_DTYPES:
        return f"q_dtype: {q_dtype!r} is not one of {Q_DTYPES}"
    if kv_format != "e4m3" and q_dtype != "e4m3":
        return f"q_dtype: {kv_format} KV runs only with e4m3 Q (the fp8-Q path), got {q_dtype} Q"
    if head_dim is not None and (not _is_int(head_dim) or head_dim not in HEAD_DIMS):
        return f"head_dim: {head_dim!r} is not one of {HEAD_DIMS}"
    if page_size is not None and (not _is_int(page_size) or page_size not in PAGE_SIZES):
        return f"page_size: {page_size!r} is not one of {PAGE_SIZES}"
    return None


def check_supported(
    kv_format: str, q_dtype: str, head_dim: Optional[int] = None, page_size: Optional[int] = None
) -> None:
    """Raise ValueError (the message of :func:`unsupported_reason`) unless the kernels run this problem."""
    reason = unsupported_reason(kv_format, q_dtype, head_dim, page_size)
    if reason is not None:
        raise ValueError(reason)
