"""Generated hostile input for the public entry points: only typed errors or correct results.

hypothesis draws arguments for the constructors and calls of MultiDeviceManager,
Buffer, Image, CrossDeviceTransfer (and its submit), InterGpuTransfer,
assign_srus, select_transfer_method and SRUOffloadCoordinator: wrong types,
out-of-range and huge numbers, NaN, empty and odd containers, arrays of
Python objects, null and mistyped handles, waits on other devices. A call
must either raise a typed error (ValueError, TypeError, IndexError or a
vkmulti.VkmError, with a short message) or do its job, which is checked
(bytes moved, pixels kept, plans equal to the reference partitioner). The
validation layer is on: a bad value that reaches the driver fails the test.

Not drawn: raw non-null handles (ints in handle positions), and raw
(semaphore, value) pairs whose semaphore belongs to another device. Vulkan
cannot check a raw handle and neither can vkmulti: they are trusted, as
documented. (TimelinePoints carry their device and are checked.)

CI runs a fixed, derandomized sample of about 2,800 cases (~10 s on the CPU VM).
The long profile, on demand: ``VKMULTI_FUZZ=long pytest tests/test_fuzz.py``
runs 25 times as many cases with fresh random seeds (set
``VKMULTI_FUZZ_SCALE=N`` for another factor).
"""
from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import vulkan as vk
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import vkmulti
from vkmulti import (DestroyedError, InterGpuTransfer, MultiDeviceManager, ReferenceRenderer, ReferenceSRU,
                     SRUOffloadCoordinator, TimelinePoint, TransferMethod, VkmError, assign_srus,
                     select_transfer_method)
from vkmulti import QueueFamilies
from vkmulti import Buffer, Image
from vkmulti.device.instance import drain_all_validation_messages
from vkmulti.errors import TimeoutError as VkmTimeout
from vkmulti.offload import assign_srus_reference
from vkmulti import CrossDeviceTransfer

from gates import Gate

LONG = os.environ.get("VKMULTI_FUZZ") == "long"
SCALE = int(os.environ.get("VKMULTI_FUZZ_SCALE", "25" if LONG else "1"))
TYPED = (ValueError, TypeError, IndexError, VkmError)


def fuzz(n: int):
    return settings(max_examples=n * SCALE, derandomize=not LONG, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


def mostly(good, bad):
    """Good values seven times out of eight, so that enough cases with several
    arguments get past the first check (st.one_of flattens nested one_ofs and
    would let the many kinds of junk win)."""
    return st.integers(0, 7).flatmap(lambda k: bad if k == 7 else good)


def typed(fn):
    """(True, result) or (False, error) for a typed error with a short message; anything else propagates."""
    try:
        return True, fn()
    except TYPED as exc:
        assert len(str(exc)) < 600, f"error message of {len(str(exc))} chars: {str(exc)[:200]}..."
        return False, exc


# -- strategies -------------------------------------------------------------------------

#: Lists of small ints, except [h, v] with h > 0: in a wait's place that is a raw (semaphore,
#: value) pair with a non-null raw handle, which is trusted (not drawn: see the docstring; the
#: validation layer itself crashes on a made-up semaphore handle in a submit's waits).
_int_lists = st.lists(st.integers(-3, 3), max_size=3).filter(lambda v: len(v) != 2 or v[0] <= 0)
junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=4), st.binary(max_size=4), _int_lists,
                 st.tuples(st.integers(-3, 3)), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
                 st.builds(object), st.just(float("nan")), st.just(np.int64(-1)), st.just(np.float32(2.5)))
#: Anything but a usable raw handle: junk, null, negative, past 64 bits.
not_handle = st.one_of(junk, st.sampled_from([0, -1, -(2**63), 2**64, 2**70]))
any_int = st.one_of(st.integers(-10, 70_000), st.sampled_from([2**31, 2**32, 2**63 - 1, 2**63, 2**64, 2**64 + 1,
                                                               -(2**63), 10**30]))
number = st.one_of(any_int, st.floats(allow_nan=True, allow_infinity=True), junk)
timeouts = st.one_of(st.none(), st.sampled_from([0, 0.0, 0.05, 5.0, -1, -0.5, float("nan"), float("inf"), True,
                                                 "1", 1e300]))


class World:
    """The module's manager, gates (timelines signalled to 100 on each slot) and resources."""

    def __init__(self):
        self.mgr = MultiDeviceManager.create()
        self.slots = self.mgr.slots
        self.gates = [Gate(s) for s in self.slots]
        for g in self.gates:
            vk.vkSignalSemaphore(g.slot.device, vk.VkSemaphoreSignalInfo(
                sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", g.sem),
                value=100))
        rng = np.random.default_rng(0)
        self.bytes = [rng.integers(0, 256, 4096, dtype=np.uint8) for _ in self.slots]
        self.buffers = [Buffer(s, 4096) for s in self.slots]
        for b, data in zip(self.buffers, self.bytes):
            b.upload(data)
        self.pixels = [rng.integers(0, 256, (16, 16, 8), dtype=np.uint8) for _ in self.slots]
        self.images = [Image(s, 16, 16) for s in self.slots]
        for img, px in zip(self.images, self.pixels):
            img.upload(px)

    def waits(self, slot):
        """Wait points, good and bad, for use on `slot`: raw pairs on its gate (values
        <= 100 are reached), honest TimelinePoints of any device (another device's
        is refused), null and mistyped handles, junk."""
        mine = self.gates[slot.index].sem if slot in self.slots else self.gates[0].sem
        point = st.builds(lambda v: (mine, v), st.integers(0, 100))
        tp = st.builds(lambda g, v: TimelinePoint(self.gates[g].sem, v, g), st.integers(0, len(self.gates) - 1),
                       st.integers(0, 100))
        stray = st.builds(lambda g, v, d: TimelinePoint(self.gates[g].sem, v, d),
                          st.integers(0, len(self.gates) - 1), st.integers(0, 100), st.sampled_from([-1, 3, 99]))
        bad = st.tuples(not_handle, st.integers(0, 100))
        one = mostly(st.one_of(point, tp), st.one_of(stray, bad, junk))
        return mostly(st.one_of(st.none(), st.lists(st.one_of(point, tp), max_size=2)),
                      st.one_of(one, st.lists(one, max_size=3)))

    def point(self, slot):
        """One wait point (a transfer's src_wait/dst_wait) for use on `slot`: mostly none or good."""
        mine = self.gates[slot.index].sem if slot in self.slots else self.gates[0].sem
        good = st.one_of(st.none(), st.builds(lambda v: (mine, v), st.integers(0, 100)),
                         st.builds(lambda v: TimelinePoint(mine, v, slot.index), st.integers(0, 100))
                         if slot in self.slots else st.none())
        return mostly(good, st.one_of(self.waits(slot), st.tuples(not_handle, st.integers(0, 100)), junk))

    def slot(self):
        return mostly(st.sampled_from(self.slots), junk)

    def destroy(self):
        for obj in self.buffers + self.images:
            obj.destroy()
        for g in self.gates:
            g.destroy()
        self.mgr.destroy()


@pytest.fixture(scope="module")
def world():
    w = World()
    yield w
    if not w.mgr.destroyed:
        w.destroy()


def _same_device(waits, slot_index, world):
    """Whether every wait point in `waits` is a good one on `slot_index` (so the call must work)."""
    items = [] if waits is None else [waits] if isinstance(waits, TimelinePoint) else waits
    if not isinstance(items, list):
        return False   # a single (semaphore, value) pair is not a list of them
    for w in items:
        if isinstance(w, TimelinePoint):
            if w.device_index != slot_index or w.semaphore != world.gates[slot_index].sem:
                return False
        elif not (isinstance(w, tuple) and len(w) == 2 and w[0] == world.gates[slot_index].sem
                  and isinstance(w[1], int) and not isinstance(w[1], bool)):
            return False
    return True


# -- the partitioner and method selection (no GPU work) ------------------------------------

sru = st.one_of(
    st.builds(SimpleNamespace, sru_id=st.one_of(st.integers(-5, 5), st.text(max_size=2), junk),
              instances=st.one_of(st.lists(st.none(), max_size=4), st.none(), junk),
              offloadable=st.one_of(st.booleans(), junk)),
    st.builds(SimpleNamespace, render_cost=number),
    junk)


@fuzz(800)
@given(srus=st.one_of(st.lists(sru, max_size=8), junk), device_count=st.one_of(any_int, junk),
       weights=st.one_of(st.none(), st.lists(number, max_size=4), junk),
       transfer=st.sampled_from([None, lambda s: 1.5, lambda s: -1.0, lambda s: float("nan"), lambda s: "x"]),
       previous=st.one_of(st.none(), st.dictionaries(st.integers(-3, 3), any_int, max_size=3), junk),
       hysteresis=number)
def test_fuzz_assign_srus(srus, device_count, weights, transfer, previous, hysteresis):
    kw = dict(weights=weights, transfer_cost=transfer, previous=previous, hysteresis=hysteresis)
    ok, out = typed(lambda: assign_srus(srus, device_count, **kw))
    if ok:
        assert out == assign_srus_reference(srus, device_count, **kw)
        assert all(0 <= a.device_index < max(device_count, 1) for a in out)   # 1 or less: all on GPU 0


@fuzz(200)
@given(index=st.one_of(any_int, junk), dst=st.one_of(any_int, junk), caps=st.one_of(st.none(), junk),
       real_caps=st.booleans(), prefer=st.booleans())
def test_fuzz_select_transfer_method(world, index, dst, caps, real_caps, prefer):
    caps = world.mgr.capabilities if real_caps else caps
    ok, out = typed(lambda: select_transfer_method(SimpleNamespace(device_index=index), caps,
                                                   prefer_dmabuf=prefer, dst_index=dst))
    if ok:
        assert out in TransferMethod.ALL


# -- buffers and images ------------------------------------------------------------------------


@fuzz(400)
@given(data=st.data(), size=mostly(st.integers(1024, 9000), st.one_of(st.integers(-2, 1024), any_int, junk)),
       usage=mostly(st.sampled_from([0x1 | 0x2, 0x3 | 0x20, 0x1ff, 0x2]),
                    st.one_of(st.sampled_from([0, -1, 1 << 40, 0x20000, 1 << 29, 0x400]), junk)),
       host_visible=mostly(st.booleans(), junk),
       offset=mostly(st.integers(0, 64), st.one_of(st.integers(-5, 9000), any_int, junk)),
       nbytes=mostly(st.integers(1, 1024), st.integers(0, 9000)),
       timeout=mostly(st.sampled_from([None, 30.0]), timeouts))
def test_fuzz_buffer(world, data, size, usage, host_visible, offset, nbytes, timeout):
    slot = data.draw(world.slot())
    ok, buf = typed(lambda: Buffer(slot, size, usage=usage, host_visible=host_visible))
    if not ok:
        return
    try:
        payload = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
        up, _ = typed(lambda: buf.upload(payload, offset, timeout=timeout))
        event(f"upload {'ran' if up else 'refused'}")
        if up and buf.usage & vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT:
            got_ok, got = typed(lambda: buf.download(nbytes, offset, timeout=30))
            assert got_ok and bytes(got) == payload.tobytes()
    finally:
        buf.destroy()


formats = st.sampled_from([vk.VK_FORMAT_R16G16B16A16_SFLOAT, vk.VK_FORMAT_R8G8B8A8_UNORM, vk.VK_FORMAT_R32_UINT,
                           vk.VK_FORMAT_R32G32B32A32_SFLOAT, vk.VK_FORMAT_R8_UNORM, vk.VK_FORMAT_D32_SFLOAT,
                           vk.VK_FORMAT_BC1_RGB_UNORM_BLOCK, vk.VK_FORMAT_R8G8B8_SSCALED, 0, -1, 10**6])
layouts = st.one_of(st.sampled_from([0, 1, 2, 3, 5, 6, 7, 8, 99, 1000001002, -1]), junk)
usages = st.one_of(st.sampled_from([vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT
                                    | vk.VK_IMAGE_USAGE_SAMPLED_BIT, 0x1 | 0x2, 0x10 | 0x1 | 0x2, 0x20, 0x40, 0x8,
                                    0xff, 0, 1 << 31]), junk)


@fuzz(300)
@given(data=st.data(), w=mostly(st.integers(1, 40), st.one_of(st.integers(-1, 0), any_int, junk)),
       h=mostly(st.integers(1, 40), junk),
       fmt=mostly(st.sampled_from([vk.VK_FORMAT_R16G16B16A16_SFLOAT, vk.VK_FORMAT_R8G8B8A8_UNORM]),
                  st.one_of(formats, junk)),
       usage=mostly(st.just(vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT
                            | vk.VK_IMAGE_USAGE_SAMPLED_BIT), usages),
       layout=mostly(st.sampled_from([5, 1, 6, 7]), layouts), exclusive=st.booleans(),
       kernel=st.booleans(), timeout=mostly(st.sampled_from([None, 30.0]), timeouts))
def test_fuzz_image(world, data, w, h, fmt, usage, layout, exclusive, kernel, timeout):
    slot = data.draw(world.slot())
    ok, img = typed(lambda: Image(slot, w, h, fmt, usage=usage, layout=layout, exclusive=exclusive,
                                  kernel_copies=kernel))
    if not ok:
        return
    try:
        waits = data.draw(world.waits(slot))
        px = np.random.default_rng(w * h).integers(0, 256, img.nbytes + data.draw(st.sampled_from([0, 0, 1, -1])),
                                                   dtype=np.uint8)
        up, _ = typed(lambda: img.upload(px, timeout=timeout))
        event(f"image upload {'ran' if up else 'refused'}")
        readable = img.usage & vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT
        down, got = typed(lambda: img.download(waits=waits, timeout=30))
        if _same_device(waits, slot.index, world) and readable:
            assert down, got
            if up:
                assert got.tobytes() == px.tobytes()
    finally:
        img.destroy()


# -- cross-device transfers --------------------------------------------------------------------


@fuzz(500)
@given(data=st.data(), method=mostly(st.sampled_from(TransferMethod.ALL), st.one_of(st.text(max_size=3), junk)),
       slot_size=mostly(st.sampled_from([4096, 65536, 1 << 20]), st.one_of(any_int, junk)),
       slot_count=mostly(st.integers(1, 6), st.one_of(st.integers(-1, 0), any_int, junk)),
       width=mostly(st.integers(0, 20), st.one_of(st.integers(-1, 0), junk)),
       bpp=mostly(st.sampled_from([8, 8, 4, 0]), st.one_of(st.integers(-1, 40), junk)),
       images=st.booleans(), src_off=mostly(st.integers(0, 64), st.one_of(st.integers(-2, 4100), any_int, junk)),
       dst_off=mostly(st.integers(0, 64), st.one_of(st.integers(-2, 4100), any_int, junk)),
       size=mostly(st.one_of(st.none(), st.integers(1, 2048)), st.one_of(st.integers(-2, 4200), any_int, junk)),
       layouts=mostly(st.just([]), st.lists(st.one_of(st.sampled_from([0, 5, 6, 7, 1]), layouts), max_size=4)))
def test_fuzz_cross_device_transfer(world, data, method, slot_size, slot_count, width, bpp, images, src_off,
                                    dst_off, size, layouts):
    src = data.draw(world.slot())
    other = st.just(world.slots[1 - src.index]) if src in world.slots else st.sampled_from(world.slots)
    dst = data.draw(mostly(other, world.slot()))
    ok, x = typed(lambda: CrossDeviceTransfer(src, dst, method, width=width, height=width, bytes_per_pixel=bpp,
                                              slot_size=slot_size, slot_count=slot_count))
    if not ok:
        return
    try:
        src_wait, dst_wait = data.draw(world.point(src)), data.draw(world.point(dst))
        kw = dict(src_wait=src_wait, dst_wait=dst_wait)
        def pick(pool, slot):
            good = st.just(pool[slot.index]) if slot in world.slots else st.sampled_from(pool)
            return data.draw(mostly(good, st.one_of(st.sampled_from(pool), not_handle)))
        if images:
            a, b = pick(world.images, src), pick(world.images, dst)
            names = ("src_layout", "dst_layout", "src_final_layout", "dst_final_layout")
            kw.update({k: v for k, v in zip(names, layouts)})
            ok, t = typed(lambda: x.submit(src_image=a, dst_image=b, **kw))
            event(f"image submit {'ran' if ok else type(t).__name__}")
        else:
            a, b = pick(world.buffers, src), pick(world.buffers, dst)
            ok, t = typed(lambda: x.submit(src_buffer=a, dst_buffer=b, src_offset=src_off, dst_offset=dst_off,
                                           size=size, **kw))
        event(f"submit {'ran' if ok else type(t).__name__}")
        if ok:
            done, err = typed(lambda: t.wait(30))
            assert done, err
            if not images:
                n = size if size is not None else a.size - src_off
                got = b.download(n, dst_off)
                want = world.bytes[a.slot.index][src_off:src_off + n].copy()
                world.bytes[b.slot.index][dst_off:dst_off + n] = want
                assert bytes(got) == want.tobytes()
            else:
                world.pixels[b.slot.index][...] = world.pixels[a.slot.index]
                assert b.download(timeout=30).tobytes() == world.pixels[b.slot.index].tobytes()
        info_ok, info = typed(lambda: x.ensure_staging())
        if info_ok:
            assert info["method"] == method
    finally:
        x.destroy(timeout=30)


# -- InterGpuTransfer --------------------------------------------------------------------------


host_data = mostly(
    st.one_of(st.binary(min_size=1, max_size=600),
              st.builds(lambda n, t: np.arange(n, dtype=t), st.integers(1, 200),
                        st.sampled_from([np.uint8, np.float32, np.int64]))),
    st.one_of(st.just(b""), st.builds(lambda n: np.array([object()] * n, dtype=object), st.integers(1, 4)),
              st.builds(lambda n: np.zeros((n, 4), np.uint8)[:, ::2], st.integers(1, 20)), junk))


def _index(value: object) -> bool:
    """Whether a drawn device index is a real one (0 or 1; 0.0, True and np.int64 junk are not)."""
    return type(value) is int and value in (0, 1)


@fuzz(400)
@given(data=st.data(), op=st.sampled_from(["copy", "broadcast", "gather", "gather_to", "register"]),
       src=mostly(st.integers(0, 1), st.one_of(st.integers(-1, 2), junk)),
       dst=mostly(st.integers(0, 1), st.one_of(st.integers(-1, 2), junk)), payload=host_data,
       use_buffer=st.booleans(), dst_offset=mostly(st.just(0), st.one_of(st.sampled_from([8, 300]), any_int, junk)),
       timeout=mostly(st.sampled_from([None, 30.0]), timeouts),
       size_bytes=mostly(st.one_of(st.none(), st.integers(1, 5000)), st.one_of(any_int, junk)),
       reuse=st.booleans(), host_import=mostly(st.sampled_from([None, False]), st.sampled_from([True, 1, "x"])))
def test_fuzz_inter_gpu_transfer(world, data, op, src, dst, payload, use_buffer, dst_offset, timeout, size_bytes,
                                 reuse, host_import):
    ok, xfer = typed(lambda: InterGpuTransfer(world.mgr, host_import=host_import))
    if not ok:
        return
    timed_out = False   # a blocking call gave up waiting: its copy still lands (documented), later
    try:
        target = data.draw(mostly(st.one_of(st.none(), st.sampled_from(world.buffers)), not_handle))
        if op == "register":
            buf = data.draw(st.one_of(st.sampled_from(world.buffers), not_handle, st.none()))
            slot = world.slots[src] if _index(src) else None
            typed(lambda: xfer.set_device_buffer(src, buf, size_bytes, ready=data.draw(world.point(slot))))
        elif op == "copy":
            own = st.just(world.buffers[src]) if _index(src) \
                else st.sampled_from(world.buffers)
            source = data.draw(mostly(own, st.sampled_from(world.buffers))) if use_buffer else payload
            ok, out = typed(lambda: xfer.copy_buffer_blocking(src, dst, source, dst_buffer=target,
                                                              dst_offset=dst_offset, timeout=timeout))
            event(f"copy {'ran' if ok else type(out).__name__}")
            timed_out = not ok and isinstance(out, VkmTimeout)
            if ok:
                if use_buffer:
                    want = world.bytes[source.slot.index].copy()
                else:
                    want = np.frombuffer(memoryview(payload).cast("B"), np.uint8).copy()
                off = dst_offset if target is not None else 0
                assert out.download(len(want), off).tobytes() == want.tobytes()
                if target is not None:
                    world.bytes[target.slot.index][off:off + len(want)] = want
        elif op == "broadcast":
            ok, outs = typed(lambda: xfer.broadcast_blocking(payload, src_device=src, timeout=timeout))
            if ok:
                want = np.frombuffer(memoryview(payload).cast("B"), np.uint8)
                for out in outs:
                    assert out.download().tobytes() == want.tobytes()
        elif op == "gather":
            typed(lambda: xfer.set_device_buffer(1, world.buffers[1]))
            out = data.draw(st.one_of(st.none(), st.lists(st.one_of(st.none(), host_data), max_size=2), junk))
            ok, got = typed(lambda: xfer.gather_blocking(dst, out=out, reuse=reuse, timeout=timeout))
            if ok and dst == 0:
                assert bytes(np.asarray(got[0]).view(np.uint8).reshape(-1)) == world.bytes[1].tobytes()
        else:
            typed(lambda: xfer.set_device_buffer(0, world.buffers[0]))
            ok, g = typed(lambda: xfer.gather_to_device_blocking(dst, dst_buffer=target, timeout=timeout))
            timed_out = not ok and isinstance(g, VkmTimeout)
            if ok:
                got = g.buffer.download(g.sizes[0], g.offsets[0])
                assert got.tobytes() == world.bytes[0].tobytes()
                if target is not None:   # a buffer of the world was written
                    world.bytes[target.slot.index][g.offsets[0]:g.offsets[0] + g.sizes[0]] = world.bytes[0]
    finally:
        xfer.destroy(timeout=30)   # (waits for what is still queued)
    if timed_out and isinstance(target, Buffer):   # what landed after the call gave up is the world's now
        world.bytes[target.slot.index] = target.download(timeout=30)


# -- the coordinator and the manager ----------------------------------------------------------


@fuzz(150)
@given(data=st.data(), devices=mostly(st.sampled_from([None, [0, 1], [0]]),
                                       st.one_of(st.lists(st.integers(-1, 3), max_size=3), junk)),
       weights=mostly(st.sampled_from([None, [1.0, 2.0]]), st.one_of(st.lists(number, max_size=3), junk)),
       hysteresis=mostly(st.sampled_from([None, 0.0, 0.5]), number),
       timeout=mostly(st.just(30.0), number), scale=mostly(st.just((1.0, 1.0)), st.one_of(st.tuples(number, number), junk)),
       factory=mostly(st.just(lambda ctx: ReferenceRenderer(ctx.slot)), st.sampled_from([None, 3])),
       render=st.booleans())
def test_fuzz_sru_offload_coordinator(world, data, devices, weights, hysteresis, timeout, scale, factory, render):
    ok, c = typed(lambda: SRUOffloadCoordinator(world.mgr, devices=devices, weights=weights, hysteresis=hysteresis,
                                                timeout=timeout, content_scale=scale,
                                                secondary_renderer_factory=factory))
    if not ok:
        return
    try:
        srus = data.draw(st.one_of(st.lists(sru, max_size=4), junk))
        ok, routes = typed(lambda: c.plan(srus))
        event(f"plan {'ran' if ok else 'refused'}")
        if ok:
            assert len(routes) == len(srus)
        if render and factory is not None and callable(factory):
            tiles = [ReferenceSRU(i, 8, 8, x=8 * i, iterations=2) for i in range(3)]
            frame = Image(world.mgr.primary, 24, 8)
            try:
                ok, rep = typed(lambda: c.render_frame(tiles, frame))
                # (a coordinator accepted renders its frame; one given a timeout too short for a
                # frame's waits may time out instead, as its waits say, and is still destroyed below)
                assert ok or (isinstance(rep, VkmTimeout) and c.timeout < 5.0), rep
            finally:
                frame.destroy()
    finally:
        c.destroy(timeout=30)


@fuzz(25)
@given(enabled=st.one_of(st.booleans(), junk), indices=st.one_of(st.none(), st.lists(st.integers(-1, 3), max_size=3),
                                                                   junk),
       instance=st.one_of(st.none(), junk), families=st.one_of(st.builds(QueueFamilies, number, number), junk),
       handle=not_handle)
def test_fuzz_manager(world, enabled, indices, instance, families, handle):
    ok, mgr = typed(lambda: MultiDeviceManager.create(enabled=enabled, device_indices=indices, instance=instance))
    if ok:
        assert mgr.device_count >= 1
        mgr.destroy()
    pds = world.mgr.instance.physical_devices()
    p = world.mgr.primary
    ok, mgr = typed(lambda: MultiDeviceManager(
        primary_physical_device=pds[0], primary_queue_families=families, primary_device=handle,
        primary_graphics_queue=p.graphics_queue, primary_present_queue=p.present_queue, physical_devices=pds,
        enabled=False))
    assert not ok


def test_fuzz_world_destroys_clean(world):
    """Last: everything the examples made was freed (the validation layer reports leaks here)."""
    drain_all_validation_messages()
    world.destroy()
    errors = [t for sev, t in drain_all_validation_messages() if sev == "error"]
    assert not errors, errors[0][:300]
    with pytest.raises(DestroyedError):
        world.buffers[0].upload(b"x")
