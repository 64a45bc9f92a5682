"""MultiGpuBuilder: ringkernel's fluent way to configure and make a MultiGpuCoordinator."""
from __future__ import annotations

import dataclasses
from typing import Any

from .config import LoadBalancingStrategy, MultiGpuConfig
from .coordinator import MultiGpuCoordinator

__all__ = ["MultiGpuBuilder"]


class MultiGpuBuilder:
    """Fluent builder of a MultiGpuCoordinator; starts from MultiGpuConfig()'s
    defaults, each setter checks its value and returns the builder."""

    def __init__(self) -> None:
        self._config = MultiGpuConfig()

    def _set(self, **changes: Any) -> "MultiGpuBuilder":
        candidate = dataclasses.replace(self._config, **changes)   # validates; the builder stays as it was
        self._config = candidate
        return self

    def load_balancing(self, strategy: LoadBalancingStrategy) -> "MultiGpuBuilder":
        """Set the load-balancing strategy; returns the builder."""
        return self._set(load_balancing=strategy)

    def auto_select_device(self, enable: bool) -> "MultiGpuBuilder":
        """Set whether launches pick a device themselves; returns the builder."""
        return self._set(auto_select_device=enable)

    def max_kernels_per_device(self, max: int) -> "MultiGpuBuilder":   # noqa: A002 - the seed's name
        """Set the kernels a device may hold (>= 1, else InvalidConfigError); returns the builder."""
        return self._set(max_kernels_per_device=max)

    def enable_p2p(self, enable: bool) -> "MultiGpuBuilder":
        """Set whether peer-to-peer links are used; returns the builder."""
        return self._set(enable_p2p=enable)

    def preferred_devices(self, devices: list[int]) -> "MultiGpuBuilder":
        """Set the devices selection is limited to (empty: every device); returns the builder."""
        return self._set(preferred_devices=list(devices) if isinstance(devices, (list, tuple)) else devices)

    def strict(self, strict: bool) -> "MultiGpuBuilder":
        """vkmulti's: False keeps the seed's answer when nothing fits (see MultiGpuConfig)."""
        return self._set(strict=strict)

    def config(self) -> MultiGpuConfig:
        """A copy of the configuration built so far."""
        return self._config.copy()

    def build(self) -> MultiGpuCoordinator:
        """A MultiGpuCoordinator with this configuration (records only, as in the seed)."""
        return MultiGpuCoordinator(self._config.copy())
