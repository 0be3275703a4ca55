"""mjolnir_numerics: the numerics spec for low-precision KV caches in decode attention (pure PyTorch).

Formats and quantizers that agree bit for bit with the hardware, sub-byte packing, NVFP4, scales,
and (built on them) the paged KV cache, the split-KV plan and the decode emulator.
"""

from .cache import LAYOUTS, PAGE_SIZES, PagedKVCache
from .cases import CASES, CaseInputs, DecodeCase, get_case
from .capability import check_supported, unsupported_reason
from .emulator import DecodeResult, EmulatorKnobs, emulate_decode, release_graph_memory
from .formats import E2M1, E2M3, E3M2, E4M3, FORMATS, NVFP4, BlockScaledFormat, Format, get_format
from .nvfp4 import NVFP4Tensor, nvfp4_quantize
from .packing import pack, packed_size, unpack
from .plan import TILE_KEYS, SplitPlan, chunked_plan, default_plan, plan_split_kv
from .quantize import dequantize, quantize, round_to_format
from .reference import ERROR_SOURCES, ErrorRow, attribute_errors, error_metrics, reference_decode
from .scales import GRANULARITIES, compute_descale, pack_q, quantize_q, unpack_o
from .targets import TARGETS, Target, get_target, target_for
from .transforms import TRANSFORMS, apply_smoothing, hadamard_matrix, rotate, smoothing_factors

__version__ = "0.1.0"

__all__ = [
    "FORMATS", "Format", "BlockScaledFormat", "get_format", "E4M3", "E3M2", "E2M3", "E2M1", "NVFP4",
    "quantize", "dequantize", "round_to_format", "pack", "unpack", "packed_size",
    "NVFP4Tensor", "nvfp4_quantize", "GRANULARITIES", "compute_descale", "quantize_q", "pack_q", "unpack_o",
    "PagedKVCache", "LAYOUTS", "PAGE_SIZES", "TILE_KEYS", "SplitPlan", "plan_split_kv", "chunked_plan",
    "default_plan", "Target", "TARGETS", "get_target", "target_for", "check_supported", "unsupported_reason",
    "emulate_decode", "EmulatorKnobs", "DecodeResult", "release_graph_memory",
    "reference_decode", "attribute_errors", "error_metrics", "ErrorRow", "ERROR_SOURCES",
    "CASES", "DecodeCase", "CaseInputs", "get_case",
    "TRANSFORMS", "rotate", "hadamard_matrix", "smoothing_factors", "apply_smoothing",
]  # fmt: skip
