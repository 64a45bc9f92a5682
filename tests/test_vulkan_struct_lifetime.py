"""What the `vulkan` package returns for a physical device's properties owns its
memory; a sub-struct of it (`limits`) or a char array (`deviceName`) points into
that memory without keeping it alive. Every reader keeps the returned object for
as long as it reads through one. The query is patched here so that the parent's
memory is zeroed the moment the parent goes away: a read through a dangling
sub-struct then sees zeros every time, instead of now and then (a restore that
found maxComputeWorkGroupCount (0, 0, 0) on lavapipe, once, in CI)."""
from __future__ import annotations

import pytest
import vulkan as vk

from vkmulti.device import manager as manager_module
from vkmulti.kernels.checkpoint.restorable import device_group_limits
from vkmulti.kernels.coordinator import device_facts


class _Zeroed:
    """The package's return value, its memory zeroed when this wrapper is freed."""

    def __init__(self, props):
        self._props = props

    def __getattr__(self, name):
        return getattr(self._props, name)

    def __del__(self):
        raw = self._props.__dict__.get("obj", self._props)   # (the package wraps it in a StrWrap)
        vk.ffi.memmove(vk.ffi.addressof(raw), b"\0" * vk.ffi.sizeof(raw), vk.ffi.sizeof(raw))


@pytest.fixture
def zeroing(monkeypatch):
    real = vk.vkGetPhysicalDeviceProperties
    monkeypatch.setattr(vk, "vkGetPhysicalDeviceProperties", lambda pd, *a: _Zeroed(real(pd, *a)))


def test_the_patch_exposes_a_dangling_read(manager, zeroing):
    lim = vk.vkGetPhysicalDeviceProperties(manager.slot(0).physical_device).limits   # parent gone at once
    assert int(lim.maxComputeWorkGroupCount[0]) == 0


def test_readers_keep_the_properties_while_reading_through_them(manager, zeroing):
    limits = device_group_limits(manager, None)
    assert all(min(x) >= 65535 for x in limits)   # (Vulkan's minimum maxComputeWorkGroupCount)
    assert device_facts._max_threads_per_block(manager.slot(0)) >= 128
    assert manager_module._device_name(manager.slot(0).physical_device) == manager.slot(0).name
