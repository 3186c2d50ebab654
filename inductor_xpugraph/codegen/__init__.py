"""Inductor codegen side: registration, wrapper subclass, device overrides, cache key."""

from .registration import (
    SUPPORTED_DEVICES,
    disable,
    enable,
    enable_from_environment,
    enabled_devices,
)

__all__ = [
    "SUPPORTED_DEVICES",
    "disable",
    "enable",
    "enable_from_environment",
    "enabled_devices",
]
