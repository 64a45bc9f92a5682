"""MultiDeviceManager and DeviceSlot: passthrough, multi-GPU, teardown and bad input."""
from __future__ import annotations

import numpy as np
import vulkan as vk
import pytest

import vkmulti
from vkmulti import DestroyedError, MultiDeviceManager, QueueFamilies
from vkmulti import create_logical_device
from vkmulti.device.logical import destroy_logical_device
from vkmulti import Instance
from vkmulti.device.instance import drain_all_validation_messages


@pytest.fixture
def engine():
    """What an engine owns: an instance and its primary device."""
    inst = Instance()
    pds = inst.physical_devices()
    ld = create_logical_device(pds[0])
    yield inst, pds, ld
    destroy_logical_device(ld.device, ld.native, ld.queues())
    inst.destroy()


def engine_kwargs(pds, ld, **over):
    kw = dict(primary_physical_device=pds[0], primary_queue_families=ld.queue_families,
              primary_device=ld.device, primary_graphics_queue=ld.graphics_queue.handle,
              primary_present_queue=ld.present_queue.handle, physical_devices=pds, enabled=True,
              primary_extensions=ld.enabled_extensions)
    kw.update(over)
    return kw


def test_virtual_pair_has_two_devices():
    with Instance() as inst:
        assert len(inst.physical_devices()) == 2


def test_create_multi_gpu(manager):
    assert manager.multi_gpu
    assert manager.device_count == 2
    assert manager.primary.is_primary and manager.primary.index == 0
    assert [s.index for s in manager.secondaries] == [1]
    assert manager.slot(1).device is not None
    assert manager.slot(1).copy_queue is not None
    assert manager.external_memory_fd_enabled  # lavapipe has VK_KHR_external_memory_fd
    caps = manager.capabilities
    assert len(caps.devices) == 2 and len(caps.enabled_extensions) == 2
    assert caps.external_memory_fd_enabled


def test_passthrough_when_disabled(engine):
    inst, pds, ld = engine
    mgr = MultiDeviceManager(**engine_kwargs(pds, ld, enabled=False))
    assert not mgr.multi_gpu and mgr.device_count == 1 and mgr.secondaries == []
    assert mgr.primary.device is ld.device
    assert not mgr.external_memory_fd_enabled
    mgr.destroy()
    mgr.destroy()  # idempotent


def test_passthrough_single_device(engine):
    inst, pds, ld = engine
    mgr = MultiDeviceManager(**engine_kwargs(pds, ld, physical_devices=pds[:1]))
    assert not mgr.multi_gpu and mgr.device_count == 1
    mgr.destroy()


def test_engine_primary_recognised_by_handle_value(engine):
    """A fresh enumeration hands out new cffi objects; the primary must still be skipped."""
    inst, pds, ld = engine
    fresh = inst.physical_devices()
    assert fresh[0] is not pds[0]
    mgr = MultiDeviceManager(**engine_kwargs(pds, ld, physical_devices=fresh))
    try:
        assert mgr.device_count == 2   # not 3: the primary got no second device
    finally:
        mgr.destroy()


def test_integer_handles_accepted(engine):
    inst, pds, ld = engine
    as_int = lambda h: int(vk.ffi.cast("uintptr_t", h))
    mgr = MultiDeviceManager(**engine_kwargs(
        pds, ld, primary_physical_device=as_int(pds[0]), primary_device=as_int(ld.device),
        primary_graphics_queue=as_int(ld.graphics_queue.handle),
        primary_present_queue=as_int(ld.present_queue.handle),
        physical_devices=[as_int(p) for p in pds]))
    try:
        assert mgr.multi_gpu and mgr.device_count == 2
    finally:
        mgr.destroy()


def test_engine_primary_not_destroyed(engine):
    inst, pds, ld = engine
    mgr = MultiDeviceManager(**engine_kwargs(pds, ld))
    mgr.destroy()
    # the engine's device is still alive and usable
    vk.vkDeviceWaitIdle(ld.device)


def test_find_queue_families_none_skips(engine):
    inst, pds, ld = engine
    mgr = MultiDeviceManager(**engine_kwargs(pds, ld, find_queue_families=lambda pd: None))
    assert not mgr.multi_gpu and mgr.device_count == 1
    mgr.destroy()


def test_attach_renderer_and_teardown_order(manager):
    calls = []
    manager.attach_renderer(1, "R1")
    assert manager.slot(1).renderer == "R1"
    manager.register_teardown(lambda: calls.append("a"))
    manager.register_teardown(lambda: calls.append("b"))
    manager.destroy()
    assert calls == ["a", "b"]
    manager.destroy()
    assert calls == ["a", "b"]


def test_failing_teardown_hook_still_destroys(manager):
    def boom():
        raise RuntimeError("hook failed")
    manager.register_teardown(boom)
    with pytest.raises(RuntimeError, match="hook failed"):
        manager.destroy()
    assert manager.destroyed
    manager.destroy()


def test_use_after_destroy(manager):
    manager.destroy()
    assert not manager.multi_gpu
    for call in (lambda: manager.slot(0), lambda: manager.attach_renderer(0, None),
                 lambda: manager.register_teardown(lambda: None), lambda: manager.primary,
                 lambda: manager.device_count, lambda: manager.slots):
        with pytest.raises(DestroyedError):
            call()


@pytest.mark.parametrize("index, exc", [(2, IndexError), (-3, IndexError), ("0", TypeError), (1.0, TypeError),
                                        (True, TypeError)])
def test_bad_slot_index(manager, index, exc):
    with pytest.raises(exc, match="slot index"):
        manager.slot(index)
    assert manager.slot(0).is_primary   # still usable


def test_bad_constructor_input(engine):
    inst, pds, ld = engine
    with pytest.raises(ValueError, match="physical_devices is empty"):
        MultiDeviceManager(**engine_kwargs(pds, ld, physical_devices=[]))
    with pytest.raises(TypeError, match="VkPhysicalDevice"):
        MultiDeviceManager(**engine_kwargs(pds, ld, primary_physical_device=ld.device))
    with pytest.raises(TypeError, match="VkDevice"):
        MultiDeviceManager(**engine_kwargs(pds, ld, primary_device="device"))
    with pytest.raises(ValueError, match="null"):
        MultiDeviceManager(**engine_kwargs(pds, ld, primary_device=0))
    with pytest.raises(TypeError, match="QueueFamilies"):
        MultiDeviceManager(**engine_kwargs(pds, ld, primary_queue_families=(0, 0)))
    with pytest.raises(ValueError, match="not among"):
        MultiDeviceManager(**engine_kwargs(pds, ld, physical_devices=pds[1:]))
    with pytest.raises(TypeError, match="physical_devices"):
        MultiDeviceManager(**engine_kwargs(pds, ld, physical_devices=None))


def test_create_bad_device_indices():
    with pytest.raises(IndexError, match="out of range"):
        MultiDeviceManager.create(device_indices=[0, 5])
    with pytest.raises(ValueError, match="duplicates"):
        MultiDeviceManager.create(device_indices=[1, 1])
    with pytest.raises(ValueError, match="non-empty"):
        MultiDeviceManager.create(device_indices=[])


def test_create_with_primary_on_second_gpu():
    with MultiDeviceManager.create(device_indices=[1, 0]) as mgr:
        assert mgr.device_count == 2 and mgr.multi_gpu


def test_create_disabled_is_passthrough():
    with MultiDeviceManager.create(enabled=False) as mgr:
        assert not mgr.multi_gpu and mgr.device_count == 1 and mgr.primary.device is not None


def test_bad_queue_families_for_device():
    with Instance() as inst:
        pd = inst.physical_devices()[0]
        with pytest.raises(ValueError, match="out of range"):
            create_logical_device(pd, QueueFamilies(graphics=7, present=7))


@pytest.mark.allow_validation_errors
def test_validation_guard_sees_leaks():
    """The guard's source of truth: a leaked semaphore is reported at device destruction."""
    mgr = MultiDeviceManager.create()
    drain_all_validation_messages()
    mgr.slot(1).native.create_timeline(0)   # leaked on purpose
    mgr.destroy()
    errors = [t for s, t in drain_all_validation_messages() if s == "error"]
    assert any("VkSemaphore" in t for t in errors), errors


def test_timeline_wait_times_out_and_stays_usable(manager):
    nat = manager.slot(1).native
    sem = nat.create_timeline(0)
    try:
        with pytest.raises(vkmulti.TimeoutError):
            nat.wait_timeline(sem, 1, timeout=0.05)
        with pytest.raises(TimeoutError):    # also the builtin
            nat.wait_timeline(sem, 1, timeout=0)
        for bad in (-1, float("nan"), True, "5", b"5", np.bool_(True), [1]):   # (never taken as seconds)
            with pytest.raises(ValueError, match="timeout"):
                nat.wait_timeline(sem, 1, timeout=bad)
        nat.wait_timeline(sem, 0, timeout=1)
        nat.wait_timeline(sem, 0, timeout=np.float32(1))   # (numpy numbers are seconds too)
        nat.wait_timeline(sem, 0, timeout=np.int64(1))
        assert nat.timeline_value(sem) == 0
    finally:
        vk.vkDestroySemaphore(manager.slot(1).device, vk.ffi.cast("VkSemaphore", sem), None)


def test_render_capabilities_probe_and_meets():
    with Instance() as inst:
        pd = inst.physical_devices()[0]
        caps = vkmulti.RenderCapabilities.probe(inst, pd)
        assert caps.physical_device_count == 2 and caps.external_memory_fd
        assert caps.meets() and caps.meets(features=["external_memory_fd"])
        assert not caps.meets(features=["no_such_feature"])
        assert caps.meets(limits={"maxImageDimension2D": 1024})
        assert not caps.meets(limits={"maxImageDimension2D": 10**9})
        assert not caps.meets(limits={"unknown_limit": 1})


def test_a_failed_create_raises_its_own_error_when_its_teardown_fails_too(monkeypatch):
    """create() failing after it made the primary device tears that device down; a
    failure of that teardown is logged, and the error that stopped create() is raised."""
    from vkmulti.device import logical
    from vkmulti.errors import TimeoutError as VkmTimeout

    real = logical.destroy_logical_device

    def destroy_then_fail(*a, **kw):
        real(*a, **kw)
        raise VkmTimeout("the teardown timed out")

    def refuse(self, **kw):
        raise RuntimeError("the manager could not be made")
    from vkmulti.device import manager as manager_module
    monkeypatch.setattr(logical, "destroy_logical_device", destroy_then_fail)
    monkeypatch.setattr(manager_module, "destroy_logical_device", destroy_then_fail)
    monkeypatch.setattr(MultiDeviceManager, "__init__", refuse)
    with pytest.raises(RuntimeError, match="could not be made"):
        MultiDeviceManager.create(enabled=True)
