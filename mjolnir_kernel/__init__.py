"""mjolnir_kernel: the paged decode-attention kernels, tested against mjolnir_numerics: Thor (tcgen05,
sm_110a / sm_100a) and its Hopper sibling (sm_90a); ``decode`` picks one by compute capability.

Importing this package needs only the core dependencies (torch); cutlass is imported when a kernel is
compiled or launched.

    from mjolnir_kernel import decode
    o, lse = decode(q, cache, q_descale=qd)        # like mjolnir_numerics.emulate_decode(q, cache, ...)

CLI: ``python -m mjolnir_kernel compile --arch sm_110a`` or ``--arch sm_90a`` (no GPU needed),
``python -m mjolnir_kernel bench``.
"""

from .api import DeviceError, PreparedDecode, decode, prepare
from .config import SHAPE_FIELDS, ConfigError, can_implement, default_config
from .hopper.config import HopperConfig
from .thor.config import ThorConfig

__all__ = [
    "decode", "prepare", "PreparedDecode", "DeviceError",
    "ThorConfig", "HopperConfig", "ConfigError", "SHAPE_FIELDS", "can_implement", "default_config",
    "compile_decode",
]  # fmt: skip


def __getattr__(name):
    if name == "compile_decode":  # the compile module imports nothing heavy either, but keeps its cache apart
        from .compile import compile_decode

        return compile_decode
    raise AttributeError(f"module 'mjolnir_kernel' has no attribute {name!r}")
