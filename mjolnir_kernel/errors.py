"""The kernels' error types (no cutlass import)."""

__all__ = ["ConfigError", "DeviceError"]


class ConfigError(ValueError):
    """A config a kernel cannot implement; the message names every offending field and value."""


class DeviceError(RuntimeError):
    """The current device runs neither decode kernel (tcgen05 on 10.x / 11.x, Hopper on 9.0)."""
