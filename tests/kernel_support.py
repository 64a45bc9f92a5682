"""Helpers for the kernel runtime's tests: the coordinator of a manager."""
from __future__ import annotations

from typing import Any


def make_coordinator(manager: Any) -> Any:
    """A MultiGpuCoordinator with one registered device per slot of `manager`."""
    from vkmulti.kernels import MultiGpuCoordinator

    return MultiGpuCoordinator.from_manager(manager)
