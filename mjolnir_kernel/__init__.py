"""mjolnir_kernel: the paged decode-attention kernels, tested against mjolnir_numerics: Thor (tcgen05,
sm_110a / sm_100a) and its Hopper sibling (sm_90a); ``decode`` picks one by compute capability.

Importing this package needs only the core dependencies (torch); cutlass is imported lazily when a
kernel is compiled or launched.

    from mjolnir_kernel import DecodeConfig, can_implement, decode
    o, lse = decode(q, cache, q_descale=qd, q_len=1, plan=plan)   # like mjolnir_numerics.emulate_decode

CLI: ``python -m mjolnir_kernel compile --arch sm_110a`` or ``--arch sm_90a`` (no GPU needed),
``python -m mjolnir_kernel bench``.
"""

from .arch import is_tcgen05_arch, is_tcgen05_capability, tcgen05_device_reason
from .config import ConfigError, DecodeConfig, can_implement, query_tile_for

__all__ = [
    "DecodeConfig", "ConfigError", "can_implement", "query_tile_for",
    "is_tcgen05_arch", "is_tcgen05_capability", "tcgen05_device_reason",
    "decode", "decode_paged", "prepare", "prepare_decode", "compile_decode",
]  # fmt: skip

_LAZY = {
    "decode": "api", "decode_paged": "api", "prepare": "api", "prepare_decode": "api", "DeviceError": "api",
    "compile_decode": "compile",
}  # fmt: skip


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'mjolnir_kernel' has no attribute {name!r}")
