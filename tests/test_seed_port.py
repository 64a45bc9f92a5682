"""Code written for SimVX's multi_device ports unchanged (issue 23): SimVX's own
QueueFamilies and RenderCapabilities objects are taken by their fields, slot(-1)
is the last slot as in the seed's list indexing, and a passthrough manager over a
GPU-less unit test's placeholder handles works without a Vulkan call. (assign_srus's
leniencies: test_partition.py; the deliberate differences: docs/explanation/seed-defects.md.)"""
from __future__ import annotations

import dataclasses

import pytest

import vkmulti
from vkmulti import MultiDeviceManager, select_transfer_method
from vkmulti import QueueFamilies, RenderCapabilities
from vkmulti import create_logical_device
from vkmulti.device.logical import destroy_logical_device
from vkmulti import Instance
from vkmulti.offload import SRUAssignment


@dataclasses.dataclass
class SeedQueueFamilies:
    """SimVX's simvx.graphics.gpu.device.QueueFamilies: two fields only."""
    graphics: int
    present: int


@dataclasses.dataclass(frozen=True)
class SeedRenderCapabilities:
    """SimVX's simvx.graphics.gpu.capabilities.RenderCapabilities (its fields and defaults)."""
    free_threaded: bool = False
    gil_disabled_build: bool = False
    physical_device_count: int = 1
    device_group: bool = False
    external_memory_fd: bool = False
    external_memory_fd_enabled: bool = False
    dedicated_compute_qf: int | None = None
    dedicated_transfer_qf: int | None = None
    gpu_timing: bool = False
    multi_draw_indirect: bool = False
    image_cube_array: bool = False
    fill_mode_non_solid: bool = False
    independent_blend: bool = False
    texture_compression_bc: bool = False
    texture_compression_etc2: bool = False
    texture_compression_astc_ldr: bool = False
    limits: dict = dataclasses.field(default_factory=dict)


@pytest.fixture
def engine():
    inst = Instance()
    pds = inst.physical_devices()
    ld = create_logical_device(pds[0])
    yield inst, pds, ld
    destroy_logical_device(ld.device, ld.native, ld.queues())
    inst.destroy()


def _seed_kwargs(pds, ld, **over):
    kw = dict(primary_physical_device=pds[0],
              primary_queue_families=SeedQueueFamilies(ld.queue_families.graphics, ld.queue_families.present),
              primary_device=ld.device, primary_graphics_queue=ld.graphics_queue.handle,
              primary_present_queue=ld.present_queue.handle, physical_devices=pds, enabled=True,
              primary_extensions=ld.enabled_extensions)
    kw.update(over)
    return kw


def test_the_seeds_queue_families_and_capabilities_objects_are_accepted(engine):
    """Before: TypeError 'primary_queue_families must be QueueFamilies, got SeedQueueFamilies'
    and 'capabilities must be RenderCapabilities, got SeedRenderCapabilities'."""
    inst, pds, ld = engine
    caps = SeedRenderCapabilities(physical_device_count=len(pds), external_memory_fd=True, limits={"x": 1})
    mgr = MultiDeviceManager(**_seed_kwargs(pds, ld, capabilities=caps))
    try:
        assert mgr.multi_gpu and mgr.device_count == 2
        assert isinstance(mgr.primary.queue_families, QueueFamilies)
        assert mgr.primary.queue_families.graphics == ld.queue_families.graphics
        assert isinstance(mgr.capabilities, RenderCapabilities)
        assert mgr.capabilities.external_memory_fd and mgr.capabilities.limits == {"x": 1}
        assert len(mgr.capabilities.devices) == 2
    finally:
        mgr.destroy()


@pytest.mark.parametrize("bad, match", [
    (object(), "must have int fields graphics and present"),
    (SeedQueueFamilies(-1, 0), "graphics must be a non-negative int"),
    (SeedQueueFamilies(0, "0"), "present must be a non-negative int"),
])
def test_queue_families_without_the_fields_are_a_type_error(bad, match):
    pd, q = object(), object()
    with pytest.raises(TypeError, match=match):
        MultiDeviceManager(primary_physical_device=pd, primary_queue_families=bad, primary_device=object(),
                           primary_graphics_queue=q, primary_present_queue=q, physical_devices=[pd], enabled=False)


def test_select_transfer_method_takes_the_seeds_capabilities():
    """Before: TypeError 'capabilities must be RenderCapabilities or None, got
    SeedRenderCapabilities'. The seed's answers: NONE on GPU 0, STAGING_COPY for an
    offloaded SRU (its capabilities do not describe the devices)."""
    caps = SeedRenderCapabilities(physical_device_count=2, external_memory_fd_enabled=True)
    assert select_transfer_method(SRUAssignment(1, 0), caps) == vkmulti.TransferMethod.NONE
    assert select_transfer_method(SRUAssignment(1, 1), caps) == vkmulti.TransferMethod.STAGING_COPY
    with pytest.raises(TypeError, match="capabilities must be RenderCapabilities"):
        select_transfer_method(SRUAssignment(1, 1), object())


def test_slot_minus_one_is_the_last_slot_as_in_the_seed(manager):
    """Before: IndexError 'slot index -1 out of range: 2 slot(s)'."""
    assert manager.slot(-1) is manager.slot(1) and manager.slot(-2) is manager.primary
    with pytest.raises(IndexError, match="slot index -3 out of range"):
        manager.slot(-3)


@pytest.mark.parametrize("enabled, count", [(False, 2), (True, 1), (False, 1)])
def test_a_passthrough_manager_over_placeholder_handles(enabled, count):
    """An engine's GPU-less unit test builds the passthrough from placeholder objects.
    Before: TypeError 'VkPhysicalDevice handle expected (a `vulkan` package handle or
    an int), got object'. Now one slot holding them as given, named "<unknown>" as
    the seed names a device it cannot ask, and destroy() (twice) does nothing."""
    pds = [object() for _ in range(count)]
    dev, gq, pq = object(), object(), object()
    mgr = MultiDeviceManager(primary_physical_device=pds[0], primary_queue_families=SeedQueueFamilies(0, 0),
                             primary_device=dev, primary_graphics_queue=gq, primary_present_queue=pq,
                             physical_devices=pds, enabled=enabled, capabilities=SeedRenderCapabilities())
    assert not mgr.multi_gpu and mgr.device_count == 1 and mgr.secondaries == []
    p = mgr.primary
    assert p.is_primary and p.device is dev and p.graphics_queue is gq and p.present_queue is pq
    assert p.physical_device is pds[0] and p.name == "<unknown>" and mgr.slot(-1) is p
    with pytest.raises(IndexError):
        mgr.slot(1)
    assert not mgr.external_memory_fd_enabled
    calls = []
    mgr.register_teardown(lambda: calls.append(1))
    mgr.destroy()
    mgr.destroy()
    assert calls == [1] and mgr.destroyed
    with pytest.raises(ValueError, match="not among physical_devices"):
        MultiDeviceManager(primary_physical_device=object(), primary_queue_families=SeedQueueFamilies(0, 0),
                           primary_device=dev, primary_graphics_queue=gq, primary_present_queue=pq,
                           physical_devices=pds, enabled=enabled)
    with pytest.raises(vkmulti.errors.DestroyedError):   # a deliberate difference: docs/explanation/seed-defects.md
        mgr.device_count


def test_real_physical_devices_need_real_handles(engine):
    """The placeholder passthrough is for GPU-less tests only: with real physical
    devices a placeholder device is still a TypeError (never cast and called)."""
    inst, pds, ld = engine
    with pytest.raises(TypeError, match="VkDevice handle expected"):
        MultiDeviceManager(**_seed_kwargs(pds, ld, primary_device=object(), enabled=False))


def test_placeholders_with_multi_gpu_asked_skip_every_secondary_as_the_seed(caplog):
    """enabled=True over several placeholder devices: the seed resolves each
    secondary's queue families, skips (WARNING) every one it cannot resolve and
    runs on one GPU. Before: TypeError 'VkPhysicalDevice handle expected'. One
    resolved placeholder would need a real device: TypeError."""
    pds = [object(), object(), object()]
    kw = dict(primary_physical_device=pds[0], primary_queue_families=SeedQueueFamilies(0, 0),
              primary_device=object(), primary_graphics_queue=object(), primary_present_queue=object(),
              physical_devices=pds, enabled=True)
    asked = []
    for resolver in (None, lambda pd: asked.append(pd)):
        caplog.clear()
        with caplog.at_level("WARNING"):
            mgr = MultiDeviceManager(**kw, find_queue_families=resolver)
        assert not mgr.multi_gpu and mgr.device_count == 1 and mgr.secondaries == []
        assert [r.getMessage() for r in caplog.records].count(
            "no graphics queue family resolved for <unknown>; skipping") == 2
        mgr.destroy()
    assert asked == pds[1:]   # the primary is not a secondary
    with pytest.raises(TypeError, match="placeholder physical device"):
        MultiDeviceManager(**kw, find_queue_families=lambda pd: SeedQueueFamilies(0, 0))


def test_placeholder_passthrough_says_why_when_multi_gpu_was_asked(caplog):
    """enabled=True with one device: the seed's INFO line, on the placeholder path too."""
    pd = object()
    with caplog.at_level("INFO"):
        mgr = MultiDeviceManager(primary_physical_device=pd, primary_queue_families=SeedQueueFamilies(0, 0),
                                 primary_device=object(), primary_graphics_queue=object(),
                                 primary_present_queue=object(), physical_devices=[pd], enabled=True)
    assert any("multi-GPU requested but only 1 physical device" in r.getMessage() for r in caplog.records)
    assert mgr.device_count == 1
    mgr.destroy()


def test_transfer_on_hand_made_slots_as_the_seed():
    """A NONE transfer's run() returns at once whatever its slots hold; a staging copy
    without images is a ValueError before anything else is looked at (the seed's
    order); ensure_staging's dict has the seed's keys. Before: DestroyedError 'the src
    device of this transfer is destroyed' for both runs, and no src_buf/... keys."""
    s0 = vkmulti.DeviceSlot(index=0, physical_device=object(), queue_families=QueueFamilies(0, 0))
    s1 = vkmulti.DeviceSlot(index=1, physical_device=object(), queue_families=QueueFamilies(0, 0))
    none = vkmulti.CrossDeviceTransfer(src=s1, dst=s0, method=vkmulti.TransferMethod.NONE)
    assert none.run() is None
    staging = vkmulti.CrossDeviceTransfer(src=s1, dst=s0, method=vkmulti.TransferMethod.STAGING_COPY,
                                          width=4, height=4)
    for run in (staging.run, staging.run_staging_copy):
        with pytest.raises(ValueError, match="src_image .* and dst_image .* are needed"):
            run()
        with pytest.raises(ValueError, match="are needed"):
            run(src_image=1)
    with pytest.raises(vkmulti.errors.DestroyedError, match="src device"):   # images given: now the devices
        staging.run(src_image=1, dst_image=2)
    none.destroy()
    with pytest.raises(vkmulti.errors.DestroyedError, match="used after destroy"):   # its own lifetime
        none.run()
    staging.destroy()


def test_ensure_staging_dict_has_the_seed_keys(manager):
    t = vkmulti.CrossDeviceTransfer(manager.slot(1), manager.slot(0), vkmulti.TransferMethod.STAGING_COPY,
                                    width=4, height=2)
    try:
        info = t.ensure_staging(None, None)
        assert {"size", "src_buf", "src_mem", "dst_buf", "dst_mem", "src_pool", "dst_pool"} <= set(info)
        assert info["size"] == 4 * 2 * 8 and t.extra["staging"] is info
    finally:
        t.destroy()


def test_ensure_staging_keeps_its_dict_for_the_same_size(manager):
    """The seed caches the staging dict: a second call for the same size updates only its
    two pools and returns the same dict; a new size gives a new dict. Before: a new dict
    on every call."""
    t = vkmulti.CrossDeviceTransfer(manager.slot(1), manager.slot(0), vkmulti.TransferMethod.STAGING_COPY,
                                    width=4, height=2)
    try:
        first = t.ensure_staging(None, None)
        again = t.ensure_staging(11, 12)
        assert again is first and t.extra["staging"] is first
        assert (first["src_pool"], first["dst_pool"]) == (11, 12) and first["size"] == 64
        t.width = 8
        bigger = t.ensure_staging(None, None)
        assert bigger is not first and bigger["size"] == 128 and t.extra["staging"] is bigger
    finally:
        t.destroy()
    assert "staging" not in t.extra


def test_select_transfer_method_reads_only_the_dmabuf_gate_of_a_capabilities_object():
    """The seed reads capabilities.external_memory_fd_enabled and nothing else. Before: an
    object without physical_device_count was a TypeError."""
    from types import SimpleNamespace
    assert select_transfer_method(SRUAssignment(1, 1), SimpleNamespace(external_memory_fd_enabled=False)) == \
        vkmulti.TransferMethod.STAGING_COPY
    assert select_transfer_method(SRUAssignment(1, 0), SimpleNamespace(external_memory_fd_enabled=True)) == \
        vkmulti.TransferMethod.NONE
    with pytest.raises(TypeError, match="external_memory_fd_enabled"):
        select_transfer_method(SRUAssignment(1, 1), SimpleNamespace(physical_device_count=2))
    with pytest.raises(TypeError, match="physical_device_count"):
        select_transfer_method(SRUAssignment(1, 1), SimpleNamespace(external_memory_fd_enabled=True,
                                                                    physical_device_count=-1))
