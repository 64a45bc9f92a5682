"""The seeds' documents, statement by statement: SimVX's multi_device
(shared/seeds/simvx_multi_device_api.md, reference/simvx_multi_device.md) and
oxigdal's InterGpuTransfer (seeds/oxigdal_inter_gpu_transfer.txt,
reference/rust_seeds.md part B.4). Each test quotes what it checks; the
deliberate differences are pinned here too (docs/explanation/seed-defects.md)."""
from __future__ import annotations

import asyncio
import dataclasses
import inspect

import numpy as np
import pytest
import vulkan as vk

import vkmulti
from vkmulti import (Buffer, CrossDeviceTransfer, DeviceSlot, Image, InterGpuTransfer, MultiDeviceManager,
                     OffloadRoute, QueueFamilies, ReferenceRenderer, ReferenceSRU, SRUAssignment,
                     SRUOffloadCoordinator, TransferMethod, assign_srus, select_transfer_method)
from vkmulti.errors import InvalidBufferError
from vkmulti.offload import SRU_IMAGE_USAGE


@pytest.fixture
def xfer(manager):
    t = InterGpuTransfer(manager)
    yield t
    t.destroy()


# ---- oxigdal's InterGpuTransfer -------------------------------------------------------------------

@pytest.mark.parametrize("call, seed_text", [
    # "Returns GpuError::InvalidBuffer when device_idx is out of range"
    (lambda t, n: t.set_device_buffer(n, None), "device_idx out of range"),
    # copy_buffer: 'InvalidBuffer("Invalid source device")' / '... ("Invalid destination device")'
    (lambda t, n: t.copy_buffer_blocking(n, 0, b"abcd"), "Invalid source device"),
    (lambda t, n: t.copy_buffer_blocking(0, n, b"abcd"), "Invalid destination device"),
    (lambda t, n: asyncio.run(t.copy_buffer(n, 0, b"abcd")), "Invalid source device"),
    # gather: 'InvalidBuffer("dst_device X is out of range (num_devices = N)")'
    (lambda t, n: t.gather_blocking(n), "dst_device {n} is out of range (num_devices = {n})"),
    (lambda t, n: asyncio.run(t.gather(n + 1)), "dst_device {n1} is out of range (num_devices = {n})"),
])
def test_out_of_range_devices_carry_the_seeds_messages(xfer, manager, call, seed_text):
    n = manager.device_count
    with pytest.raises(InvalidBufferError) as info:
        call(xfer, n)
    assert seed_text.format(n=n, n1=n + 1) in str(info.value)


def test_gather_is_the_seeds_readback(xfer, manager):
    """'one entry per source device (ordered by ascending device index, skipping dst_device).
    Devices that have no registered buffer produce an empty Vec<u8>'; set_device_buffer
    'overwrit[es] the previous one'; gather_blocking is 'the synchronous wrapper'."""
    n = manager.device_count
    with Buffer(manager.slot(1), 8) as first, Buffer(manager.slot(1), 4) as second:
        first.upload(np.arange(8, dtype=np.uint8))
        second.upload(np.array([9, 8, 7, 6], np.uint8))
        xfer.set_device_buffer(1, first, 8)
        xfer.set_device_buffer(1, second, 4)
        got = xfer.gather_blocking(0)
        assert len(got) == n - 1 and got[0].tolist() == [9, 8, 7, 6]
        assert [a.tolist() for a in asyncio.run(xfer.gather(0))] == [a.tolist() for a in got]
        own = xfer.gather_blocking(1)      # GPU 1's own buffer is skipped; GPU 0 registered nothing
        assert len(own) == n - 1 and own[0].size == 0 and own[0].dtype == np.uint8


def test_a_buffer_without_transfer_source_usage_is_refused_when_registered(xfer, manager):
    """'The buffer must have at least BufferUsages::COPY_SRC so that gather can issue a
    copy-to-staging command'; the seed fails in gather ('the staging buffer cannot be
    mapped'). vkmulti refuses at set_device_buffer (seed-defects.md) and registers nothing."""
    with Buffer(manager.slot(1), 16, usage=vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT) as b:
        with pytest.raises(ValueError, match="transfer-source usage"):
            xfer.set_device_buffer(1, b, 16)
    assert xfer.registered(1) is None
    assert xfer.gather_blocking(0)[0].size == 0


def test_broadcast_takes_the_seeds_argument_name(xfer, manager):
    """'pub async fn broadcast(&self, data: &[u8])': the argument is `data`."""
    assert list(inspect.signature(InterGpuTransfer.broadcast).parameters)[1] == "data"
    assert list(inspect.signature(InterGpuTransfer.broadcast_blocking).parameters)[1] == "data"
    payload = np.arange(12, dtype=np.uint8)
    out = asyncio.run(xfer.broadcast(data=payload))
    out += xfer.broadcast_blocking(data=payload)
    assert len(out) == 2 * manager.device_count
    for b in out:
        assert b.download().tolist() == payload.tolist()
        b.destroy()


# ---- SimVX's CrossDeviceTransfer --------------------------------------------------------------------

def test_run_names_an_unknown_method_before_anything_else(manager):
    """run(): 'Any other value raises ValueError (unknown cross-device transfer method, repr of
    the value)'. A method set after construction, with or without images."""
    t = CrossDeviceTransfer(manager.slot(1), manager.primary, TransferMethod.STAGING_COPY, width=4, height=4)
    try:
        t.method = "bogus"
        for kw in ({}, {"src_image": 1, "dst_image": 2}):
            with pytest.raises(ValueError, match="unknown cross-device transfer method 'bogus'"):
                t.run(**kw)
    finally:
        t.destroy()


def test_an_unknown_method_is_refused_when_the_transfer_is_made(manager):
    """The seed accepts any method at construction and fails in run(); vkmulti refuses it
    at once, with the seed's message (seed-defects.md)."""
    with pytest.raises(ValueError, match="unknown cross-device transfer method 'bogus'"):
        CrossDeviceTransfer(manager.slot(1), manager.primary, "bogus")


def test_run_staging_copy_needs_no_ensure_staging(manager):
    """The seed's run_staging_copy raises RuntimeError ('staging buffers not allocated; call
    ensure_staging(src_pool, dst_pool) first') without it; vkmulti makes the pair's ring
    on first use (seed-defects.md). Its checks before that keep the seed's order."""
    src = Image(manager.slot(1), 8, 4)
    dst = Image(manager.primary, 8, 4)
    pixels = np.arange(8 * 4 * 8, dtype=np.uint8).reshape(4, 8, 8)
    t = CrossDeviceTransfer(manager.slot(1), manager.primary, TransferMethod.STAGING_COPY, width=8, height=4)
    other = CrossDeviceTransfer(manager.slot(1), manager.primary, TransferMethod.NONE)
    try:
        src.upload(pixels)
        assert "staging" not in t.extra
        with pytest.raises(ValueError, match="run_staging_copy called for method 'none'"):
            other.run_staging_copy(src_image=src, dst_image=dst)
        with pytest.raises(ValueError, match="src_image .* and dst_image .* are needed"):
            t.run_staging_copy(src_image=src)
        t.run_staging_copy(src_image=src, dst_image=dst)
        np.testing.assert_array_equal(dst.download(), pixels)
    finally:
        t.destroy()
        other.destroy()
        src.destroy()
        dst.destroy()


# ---- SimVX's SRUOffloadCoordinator ------------------------------------------------------------------

def _factory(ctx):
    return ReferenceRenderer(ctx.slot)


def test_render_sru_offloaded_returns_once_the_image_is_on_the_primary(manager):
    """'ensure_staging(...) and run(src_image=target.colour_image, dst_image=primary_dst_image),
    and returns True': run() is synchronous, so when True comes back the image is on the
    primary. wait=False is vkmulti's asynchronous form (the ticket's dst_ready)."""
    srus = [ReferenceSRU(0, 256, 256, seed=1, iterations=64), ReferenceSRU(1, 256, 256, seed=2, iterations=64)]
    dsts = {s.sru_id: Image(manager.primary, 256, 256, usage=SRU_IMAGE_USAGE) for s in srus}
    r0 = ReferenceRenderer(manager.primary)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=_factory)
    try:
        routes = c.plan(srus)
        off = next(s for s, r in zip(srus, routes) if r.offloaded)
        assert c.render_sru_offloaded(off, dsts[off.sru_id]) is True
        assert c.ticket_for(off.sru_id).done()
        direct = r0.make_target(off)
        r0.wait(r0.render(off, direct), timeout=60)
        np.testing.assert_array_equal(dsts[off.sru_id].download(), direct.download())
        direct.destroy()
        assert c.render_sru_offloaded(off, dsts[off.sru_id], wait=False) is True
        c.ticket_for(off.sru_id).wait(60)
        home = next(s for s, r in zip(srus, routes) if not r.offloaded)
        assert c.render_sru_offloaded(home, dsts[home.sru_id]) is False
    finally:
        c.destroy()
        r0.destroy()
        for d in dsts.values():
            d.destroy()


# ---- the seeds' names, fields and signatures ----------------------------------------------------------

SIMVX_ALL = ["DeviceSlot", "MultiDeviceManager", "SRUAssignment", "assign_srus", "CrossDeviceTransfer",
             "TransferMethod", "OffloadRoute", "SRUOffloadCoordinator"]


def test_the_simvx_modules_names_are_exported():
    """'__all__ lists DeviceSlot, MultiDeviceManager, SRUAssignment, assign_srus,
    CrossDeviceTransfer, TransferMethod, OffloadRoute, SRUOffloadCoordinator'; plus
    select_transfer_method (the module's other function)."""
    assert set(SIMVX_ALL) | {"select_transfer_method", "InterGpuTransfer"} <= set(vkmulti.__all__)


@pytest.mark.parametrize("name, value", [("NONE", "none"), ("STAGING_COPY", "staging_copy"), ("DMABUF", "dmabuf")])
def test_transfer_method_constants(name, value):
    assert getattr(TransferMethod, name) == value


@pytest.mark.parametrize("cls, fields", [
    (DeviceSlot, [("index", None), ("physical_device", None), ("queue_families", None), ("device", None),
                  ("graphics_queue", None), ("present_queue", None), ("compute_queue", None),
                  ("transfer_queue", None), ("name", ""), ("renderer", None)]),
    (CrossDeviceTransfer, [("src", None), ("dst", None), ("method", None), ("src_done", None),
                           ("dst_ready", None), ("width", 0), ("height", 0), ("bytes_per_pixel", 8),
                           ("extra", dict)]),
    (SRUAssignment, [("sru_id", None), ("device_index", None)]),
    (OffloadRoute, [("sru_id", None), ("device_index", None), ("transfer", None)]),
])
def test_dataclass_fields_in_the_seeds_order_with_its_defaults(cls, fields):
    got = dataclasses.fields(cls)[:len(fields)]
    assert [f.name for f in got] == [name for name, _ in fields]
    for f, (name, default) in zip(got, fields):
        if default is dict:
            assert f.default_factory is dict, name
        elif f.name in ("index", "physical_device", "queue_families", "src", "dst", "method", "sru_id",
                        "device_index", "transfer"):
            assert f.default is dataclasses.MISSING, name      # required, as in the seed
        else:
            assert f.default == default, name


@pytest.mark.parametrize("cls, args, prop", [(SRUAssignment, (7,), "needs_transfer"),
                                             (OffloadRoute, (7,), "offloaded")])
@pytest.mark.parametrize("device, expected", [(0, False), (1, True), (3, True)])
def test_frozen_records_and_their_property(cls, args, prop, device, expected):
    """SRUAssignment and OffloadRoute are 'frozen, slots' dataclasses; needs_transfer / offloaded
    is true when device_index != 0."""
    rec = cls(*args, device, *(["staging_copy"] if cls is OffloadRoute else []))
    assert getattr(rec, prop) is expected and not hasattr(rec, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.device_index = 0


KW, POS = inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
REQ = inspect.Parameter.empty


@pytest.mark.parametrize("fn, params", [
    (MultiDeviceManager.__init__, [("primary_physical_device", KW, REQ), ("primary_queue_families", KW, REQ),
                                   ("primary_device", KW, REQ), ("primary_graphics_queue", KW, REQ),
                                   ("primary_present_queue", KW, REQ), ("physical_devices", KW, REQ),
                                   ("enabled", KW, REQ), ("capabilities", KW, None),
                                   ("primary_compute_queue", KW, None), ("primary_transfer_queue", KW, None),
                                   ("find_queue_families", KW, None)]),
    (MultiDeviceManager.slot, [("index", POS, REQ)]),
    (MultiDeviceManager.attach_renderer, [("index", POS, REQ), ("renderer", POS, REQ)]),
    (MultiDeviceManager.register_teardown, [("hook", POS, REQ)]),
    (assign_srus, [("srus", POS, REQ), ("device_count", POS, REQ), ("sru_id", KW, None), ("cost", KW, None)]),
    (select_transfer_method, [("assignment", POS, REQ), ("capabilities", POS, REQ), ("prefer_dmabuf", KW, True)]),
    (CrossDeviceTransfer.run, [("src_image", KW, None), ("dst_image", KW, None)]),
    (CrossDeviceTransfer.run_staging_copy, [("src_image", KW, None), ("dst_image", KW, None)]),
    (CrossDeviceTransfer.run_dmabuf, [("src_image", KW, None), ("dst_image", KW, None)]),
    (CrossDeviceTransfer.ensure_staging, [("src_command_pool", POS, None), ("dst_command_pool", POS, None)]),
    (SRUOffloadCoordinator.__init__, [("manager", POS, REQ), ("capabilities", POS, None),
                                      ("prefer_dmabuf", KW, True), ("content_scale", KW, (1.0, 1.0)),
                                      ("secondary_renderer_factory", KW, None)]),
    (SRUOffloadCoordinator.plan, [("srus", POS, REQ), ("sru_id", KW, None), ("cost", KW, None)]),
    (SRUOffloadCoordinator.route_for, [("sru_id", POS, REQ)]),
    (SRUOffloadCoordinator.transfer_for, [("route", POS, REQ), ("width", KW, 0), ("height", KW, 0)]),
    (SRUOffloadCoordinator.render_offloaded, [("route", POS, REQ)]),
    (SRUOffloadCoordinator.render_sru_offloaded, [("sru", POS, REQ), ("primary_dst_image", POS, REQ)]),
    (InterGpuTransfer.__init__, [("manager", POS, REQ)]),
    (InterGpuTransfer.set_device_buffer, [("device_idx", POS, REQ), ("buffer", POS, REQ), ("size_bytes", POS, None)]),
    (InterGpuTransfer.copy_buffer, [("src_device", POS, REQ), ("dst_device", POS, REQ), ("data", POS, None)]),
    (InterGpuTransfer.gather, [("dst_device", POS, REQ)]),
    (InterGpuTransfer.gather_blocking, [("dst_device", POS, REQ)]),
])
def test_signatures_keep_the_seeds_parameters(fn, params):
    """Names, kinds and defaults as documented, in order (vkmulti's additions come after;
    the seed's required ensure_staging pools and set_device_buffer size may be left out)."""
    got = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"][:len(params)]
    assert [(p.name, p.kind, p.default) for p in got] == params


# ---- assign_srus: the seed's rule (vkmulti's model of it) and vkmulti's ---------------------------------

class _S:
    def __init__(self, sru_id, n=0, skinned=0):
        self.sru_id = sru_id
        if n:
            self.instances = [None] * n
        if skinned:
            self.skinned_instances = [None] * skinned


def test_the_seeds_rule_as_documented():
    """'Only the first n_secondary entries of that sorted list are offloaded: the heaviest to
    device 1, the second heaviest to device 2 ... Every other SRU stays on device 0'; 'with 2
    devices and a single SRU, that one SRU is offloaded to GPU 1'; 'Output keeps the input
    order'; cost 'len(instances) + len(skinned_instances) ... A total of 0 becomes 1'."""
    from vkmulti.offload import seed_top_n_minus_1 as seed
    lone = _S(1, 2)
    assert [a.device_index for a in seed([lone], 2)] == [1]
    srus = [_S(1, 1), _S(2, 3, 2), _S(3, 0, 3), _S(4)]          # costs 1, 5, 3, 1 (empty: 1)
    assert [(a.sru_id, a.device_index) for a in seed(srus, 3)] == [(1, 0), (2, 1), (3, 2), (4, 0)]
    assert [a.device_index for a in seed(srus, 1)] == [0, 0, 0, 0] == [a.device_index for a in seed(srus, 0)]
    assert seed([], 4) == []
    assert [a.device_index for a in seed([lone, lone], 2)] == [1, 1]


def test_vkmulti_keeps_a_lone_sru_on_gpu0():
    """Where the seed offloads a lone SRU, vkmulti's partitioner keeps it on GPU 0: ties go to
    GPU 0 and nothing is gained by moving it (seed-defects.md, the first row)."""
    assert [a.device_index for a in assign_srus([_S(1, 2)], 2)] == [0]
    assert [a.device_index for a in assign_srus([_S(1, 2), _S(2, 2)], 2)] == [0, 1]


# ---- the coordinator on one GPU, and its teardown ------------------------------------------------------

def test_an_inactive_coordinator_plans_every_sru_home():
    """'When the coordinator is inactive, every route is (id, 0, NONE)'; 'route_for(sru_id): the
    cached route, or None'; active 'returns manager.multi_gpu'."""
    with MultiDeviceManager.create(enabled=False) as mgr:
        c = SRUOffloadCoordinator(mgr)
        assert c.active is False is mgr.multi_gpu
        routes = c.plan([_S(1, 9), _S(2, 1)])
        assert routes == [OffloadRoute(1, 0, TransferMethod.NONE), OffloadRoute(2, 0, TransferMethod.NONE)]
        assert c.route_for(2) == routes[1] and c.route_for(99) is None
        assert c.plan([_S(3)]) == [OffloadRoute(3, 0, TransferMethod.NONE)] and c.route_for(1) is None
    assert c.destroyed


def test_the_coordinator_goes_with_the_managers_destroy(manager):
    """The constructor 'calls manager.register_teardown(self.destroy)': destroy() 'runs
    automatically as the manager's first teardown hook', before hooks registered after it
    (an engine's, freeing what the coordinator's transfers write into)."""
    seen = []
    manager.register_teardown(lambda: seen.append(("before", c.destroyed)))
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=_factory)
    manager.register_teardown(lambda: seen.append(("after", c.destroyed)))
    early = SRUOffloadCoordinator(manager)
    early.destroy()                       # destroyed by its user: its hook does nothing
    manager.destroy()
    assert c.destroyed and seen == [("before", False), ("after", True)]


def test_ensure_staging_size_is_at_least_one(manager):
    """'size = max(1, width*height*bytes_per_pixel)'."""
    t = CrossDeviceTransfer(manager.slot(1), manager.primary, TransferMethod.STAGING_COPY)
    try:
        assert t.ensure_staging(None, None)["size"] == 1
        t.width, t.height, t.bytes_per_pixel = 3, 5, 4
        assert t.ensure_staging(None, None)["size"] == 60
    finally:
        t.destroy()
