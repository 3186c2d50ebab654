"""Inductor codegen side: registration, wrapper subclass, device overrides, cache key."""

from .registration import SUPPORTED_DEVICES, disable, enable, enabled_devices

__all__ = ["SUPPORTED_DEVICES", "disable", "enable", "enabled_devices"]
