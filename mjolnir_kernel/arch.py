"""Architecture gating by family: tcgen05 (TMEM, UMMA) runs on compute capability 10.x and 11.x.

Pure Python; never compare a major version with ``== 10`` alone (Thor is sm_110, B200 sm_100,
B300 sm_103).
"""

from __future__ import annotations

import re

TCGEN05_MAJORS = (10, 11)
KNOWN_ARCHS = ("sm_100a", "sm_103a", "sm_110a")
_ARCH_RE = re.compile(r"^sm_(\d+)(\d)([af]?)$")


def parse_arch(arch: str) -> tuple[int, int]:
    """'sm_110a' -> (11, 0); raises ValueError naming the argument."""
    m = _ARCH_RE.match(str(arch))
    if not m:
        raise ValueError(f"arch={arch!r} is not an arch string like 'sm_110a' or 'sm_100a'")
    return int(m.group(1)), int(m.group(2))


def is_tcgen05_capability(major: int, minor: int = 0) -> bool:
    """True for compute capability 10.x and 11.x (the tcgen05 family)."""
    return int(major) in TCGEN05_MAJORS


def is_tcgen05_arch(arch: str) -> bool:
    return is_tcgen05_capability(*parse_arch(arch))


def check_tcgen05_arch(arch: str) -> str:
    """Return ``arch`` if it is a tcgen05 arch-specific target, else raise ValueError."""
    major, minor = parse_arch(arch)
    if not is_tcgen05_capability(major, minor) or not str(arch).endswith("a"):
        raise ValueError(
            f"arch={arch!r}: the decode kernel needs tcgen05, i.e. an arch-specific target of compute capability"
            f" 10.x or 11.x such as {', '.join(KNOWN_ARCHS)}"
        )
    return arch


def arch_of_capability(major: int, minor: int) -> str:
    return f"sm_{major}{minor}a"


def _device_reason(device, accepts, needs: str) -> str | None:
    """None when ``accepts(major, minor)`` holds for ``device`` (default: the current CUDA device), else
    the reason why not, ending with ``needs``."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    major, minor = torch.cuda.get_device_capability(device)
    if not accepts(major, minor):
        return f"{torch.cuda.get_device_name(device)} is compute capability {major}.{minor}; {needs}"
    return None


def tcgen05_device_reason(device=None) -> str | None:
    """None when ``device`` (default: the current CUDA device) runs tcgen05, else the reason why not."""
    return _device_reason(device, is_tcgen05_capability, "tcgen05 needs 10.x or 11.x (Thor, B200, B300)")


HOPPER_CAPABILITY = (9, 0)


def backend_of_capability(major: int, minor: int) -> str | None:
    """The decode backend for a compute capability: "thor" (tcgen05, 10.x / 11.x), "hopper" (9.0), else None."""
    if is_tcgen05_capability(major, minor):
        return "thor"
    if (int(major), int(minor)) == HOPPER_CAPABILITY:
        return "hopper"
    return None


def decode_device_reason(device=None) -> str | None:
    """None when ``device`` runs one of the decode kernels (tcgen05 or Hopper), else the reason why not."""
    return _device_reason(
        device,
        lambda major, minor: backend_of_capability(major, minor) is not None,
        "the decode kernels need 9.0 (Hopper), 10.x or 11.x",
    )


def hopper_device_reason(device=None) -> str | None:
    """None when ``device`` is a compute capability 9.0 GPU (the Hopper kernel's target), else why not."""
    return _device_reason(
        device, lambda major, minor: backend_of_capability(major, minor) == "hopper", "the Hopper kernel needs 9.0"
    )
