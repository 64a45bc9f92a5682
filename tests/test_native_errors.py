"""The native core's errors: each code of vkm_errors.h once, each mapped to a
typed Python error with a message that says what happened; and bad arguments
to the native link refused with a clear error, never a crash."""
from __future__ import annotations

import os

import pytest

import vkmulti
from vkmulti._core import _native
from vkmulti import errors
from vkmulti._core.handles import handle_int
from vkmulti.transfer import CrossDeviceTransfer, TransferMethod
from vkmulti.transfer.cross_device import _Endpoint

U64 = (1 << 64) - 1


# ---- the code table ---------------------------------------------------------------

def test_native_codes_are_distinct_and_match_the_python_table():
    native = _native.native_results()
    assert set(native) == {"VKM_ERROR_INVALID_ARGUMENT", "VKM_ERROR_LINK_STALLED", "VKM_ERROR_CUDA",
                           "VKM_ERROR_UNSUPPORTED", "VKM_ERROR_QUEUE_LOCK_HELD"}
    values = [v for v, _ in native.values()]
    assert len(set(values)) == len(values), native
    assert not set(values) & set(errors._RESULT_NAMES) - set(errors._NATIVE_RESULTS), "a Vulkan code reused"
    assert {name: value for name, (value, _) in native.items()} == \
        {name: code for code, (name, _) in errors._NATIVE_RESULTS.items()}
    for name, (value, what) in native.items():
        assert what and errors.result_name(value) == name


@pytest.mark.parametrize("code, cls", [(errors.INVALID_ARGUMENT, ValueError),
                                       (errors.LINK_STALLED, errors.LinkStalledError),
                                       (errors.CUDA_FAILED, errors.CudaError),
                                       (errors.UNSUPPORTED, vkmulti.UnsupportedError),
                                       (errors.QUEUE_LOCK_HELD, RuntimeError)])
def test_each_native_code_raises_its_typed_error_with_the_message(code, cls):
    with pytest.raises(cls) as info:
        errors.raise_for_result(code, "somewhere", "what happened, in words")
    assert str(info.value) == "what happened, in words" and info.value.call == "somewhere"
    with pytest.raises(cls, match="somewhere"):   # no message: the call and the code's name
        errors.raise_for_result(code, "somewhere")
    assert issubclass(errors.LinkStalledError, vkmulti.TransferError)
    assert issubclass(errors.CudaError, vkmulti.TransferError)


def test_a_vulkan_code_with_a_message_says_what_happened_then_the_call():
    with pytest.raises(vkmulti.OutOfDeviceMemoryError) as info:
        errors.raise_for_result(-2, "vkAllocateMemory(staging ring)", "allocating the staging ring")
    assert str(info.value) == "allocating the staging ring (vkAllocateMemory(staging ring) returned " \
                              "VK_ERROR_OUT_OF_DEVICE_MEMORY)"
    assert info.value.call == "vkAllocateMemory(staging ring)" and info.value.result == -2


# ---- the link's arguments -------------------------------------------------------------

def _args(manager, ring=_native.RING_STAGING):
    s, d = manager.slot(1), manager.slot(0)
    return [s.native, s.copy_queue.lock, d.native, d.copy_queue.lock, ring, 1 << 20, 4]


@pytest.mark.parametrize("position", [0, 1, 2, 3])
def test_link_refuses_none_for_typed_arguments(manager, position):
    """_native.Link(None, ...) used to dereference None."""
    args = _args(manager)
    args[position] = None
    with pytest.raises(TypeError):
        _native.Link(*args)


def test_other_native_entry_points_refuse_none(manager):
    with pytest.raises(TypeError):
        _native.result_check(0, None)
    with pytest.raises(TypeError):
        _native.cuda_peer_reason(b"\1" * 16, b"\2" * 16, None)
    with pytest.raises(TypeError):
        _native.plan_chunks(None, 256, 256)
    link = _native.Link(*_args(manager))
    try:
        with pytest.raises(TypeError):
            link.submit(None, _Endpoint(buffer=1), 16)
    finally:
        link.destroy()
    with pytest.raises(ValueError, match="non-null"):
        manager.slot(0).native.wait_timeline(0, 1)
    with pytest.raises(ValueError, match="non-null"):
        manager.slot(0).native.timeline_value(0)


@pytest.mark.parametrize("slot_size, slot_count, match", [
    (1 << 63, 4, "more than 2\\^64"),             # the product wraps 64 bits
    (U64, 1, "rounded up"),                        # rounding the slot up wraps
    (U64 // 3 + 1, 3, "more than 2\\^64"),
    (1 << 40, 4096, "more than 2\\^64|maxMemoryAllocationSize"),
    (1 << 30, 8, "maxMemoryAllocationSize"),       # 8 GiB: more than one allocation may be on lavapipe
    (1 << 20, 1 << 32, "slot_count"),              # was a conversion error
    (1 << 20, 4097, "slot_count"),
    (0, 4, "slot_size"), (1 << 64, 4, "slot_size"), (1 << 20, 0, "slot_count"), (-1, 4, "slot_size"),
])
@pytest.mark.parametrize("ring", [_native.RING_STAGING, _native.RING_SHARED_HOST])
def test_rings_that_wrap_or_cannot_be_allocated_are_refused(manager, ring, slot_size, slot_count, match):
    """Defect E, native side: slot_size x slot_count wrapping 64 bits crashed in staging creation."""
    args = _args(manager, ring)
    args[5:7] = [slot_size, slot_count]
    with pytest.raises(ValueError, match=match):
        _native.Link(*args)


def test_link_refuses_bad_kinds_timeouts_and_tuning(manager):
    args = _args(manager)
    for ring in (-1, 4, 99):
        with pytest.raises(ValueError, match="ring must be one of"):
            _native.Link(*args[:4], ring, *args[5:])
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="stall_timeout"):
            _native.Link(*args, stall_timeout=bad)
    for bad in (-1.0, float("nan"), float("inf"), 2.0):
        with pytest.raises(ValueError, match="spin"):
            _native.Link(*args, spin=bad)
    with pytest.raises(TypeError, match="tuning"):
        _native.Link(*args, tuning={"cuda_bounce_ring": True})
    with pytest.raises(ValueError, match="cuda_ordinals"):
        _native._LinkTuning(cuda_ordinals=(0, -1))
    with pytest.raises(ValueError, match="trace"):
        _native.Link(*args, trace="x" * 600)


def _device_without(slot, **flags):
    """A second native view of the slot's VkDevice that believes `flags` extensions are off."""
    return _native.Device(handle_int(slot.physical_device, "VkPhysicalDevice"), slot.native.handle, **flags)


@pytest.mark.virtual
def test_missing_extensions_are_unsupported_naming_extension_and_device(manager):
    s, d = manager.slot(1), manager.slot(0)
    bare = _device_without(s)
    with pytest.raises(vkmulti.UnsupportedError, match="VK_EXT_external_memory_host is not enabled on 'llvmpipe") \
            as info:
        _native.Link(bare, s.copy_queue.lock, d.native, d.copy_queue.lock, _native.RING_SHARED_HOST, 1 << 20, 4)
    assert (info.value.extension, info.value.device) == ("VK_EXT_external_memory_host", s.name)   # carried too
    assert not str(info.value).startswith("vkm_link_create")   # the message is what happened, not where
    with pytest.raises(vkmulti.UnsupportedError, match="VK_KHR_external_memory_fd is not enabled on 'llvmpipe") \
            as info:
        _native.Link(bare, s.copy_queue.lock, d.native, d.copy_queue.lock, _native.RING_EXPORTED, 1 << 20, 4)
    assert (info.value.extension, info.value.device) == ("VK_KHR_external_memory_fd", s.name)
    with pytest.raises(vkmulti.UnsupportedError, match="VK_EXT_external_memory_dma_buf is not enabled on"):
        _native.Link(s.native, s.copy_queue.lock, d.native, d.copy_queue.lock, _native.RING_EXPORTED, 1 << 20, 4,
                     0x200)
    with pytest.raises(ValueError, match="export_type 0x3"):
        _native.Link(s.native, s.copy_queue.lock, d.native, d.copy_queue.lock, _native.RING_EXPORTED, 1 << 20, 4, 3)


@pytest.mark.parametrize("ring", [_native.RING_STAGING, _native.RING_SHARED_HOST, _native.RING_EXPORTED])
def test_jobs_the_ring_cannot_carry_are_refused_and_the_link_stays_usable(manager, ring):
    from vkmulti import Buffer, Image

    s, d = manager.slot(1), manager.slot(0)
    link = _native.Link(s.native, s.copy_queue.lock, d.native, d.copy_queue.lock, ring, 64 << 10, 4)
    a, b = Buffer(s, 1 << 16), Buffer(d, 1 << 16)
    ia, ib = Image(s, 64, 16), Image(d, 64, 16)
    x = CrossDeviceTransfer(s, d, TransferMethod.STAGING_COPY)
    try:
        ea, eb = x._buffer_endpoint(a, s, "src", 0, None), x._buffer_endpoint(b, d, "dst", 0, None)
        ia_e, n = x._image_endpoint(ia, s, "src_image", None, None, None)
        ib_e, _ = x._image_endpoint(ib, d, "dst_image", None, None, None)
        for size, match in ((0, "size"), (-5, "size"), (1 << 64, "size")):
            with pytest.raises(ValueError, match=match):
                link.submit(ea, eb, size)
        with pytest.raises(ValueError, match="names neither a buffer nor an image"):
            link.submit(_Endpoint(), eb, 16)
        with pytest.raises(ValueError, match="wraps past 2\\^64"):
            link.submit(_Endpoint(buffer=a.handle_int, offset=U64 - 8), eb, 16)
        with pytest.raises(ValueError, match="not a whole number of the source image's rows"):
            link.submit(ia_e, ib_e, n - 1)
        with pytest.raises(ValueError, match="not a whole number"):
            link.submit(ia_e, ib_e, n + 64 * 8)      # one row more than the image has
        wide = _Endpoint(image=ia.handle_int, width=1 << 14, height=1, bytes_per_pixel=8)
        with pytest.raises(ValueError, match="larger than a ring slot"):
            link.submit(wide, eb, 1 << 17)
        t, _, dready = link.submit(ia_e, ib_e, n)   # still usable
        link.wait(t, dready, 30)
        t, _, dready = link.submit(ea, eb, 1 << 16)
        link.wait(t, dready, 30)
        assert link.ring_note and link.kernel_bytes == 0
    finally:
        link.destroy()
        x.destroy()
        for o in (a, b, ia, ib):
            o.destroy()


def test_trace_environment_is_read_in_python_and_passed_down(manager, tmp_path, monkeypatch):
    from vkmulti import Buffer

    path = tmp_path / "trace.csv"
    monkeypatch.setenv(_native.TRACE_ENV, str(path))
    s, d = manager.slot(1), manager.slot(0)
    with Buffer(s, 1 << 16) as a, Buffer(d, 1 << 16) as b:
        with CrossDeviceTransfer(s, d, TransferMethod.STAGING_COPY, slot_size=1 << 15) as x:
            x.submit(src_buffer=a, dst_buffer=b).wait(30)
    lines = path.read_text().splitlines()   # written when the link went, with its transfer
    assert any(line.startswith("staging,") and ",submit," in line for line in lines), lines[:5]
    assert any(line.startswith("staging,") and ",waited," in line for line in lines), lines[:5]


def test_no_environment_variable_is_read_in_c():
    native = os.path.join(os.path.dirname(__file__), "..", "native")
    if not os.path.isdir(native):
        pytest.skip("needs the source tree (native/)")
    for name in os.listdir(native):
        if name.endswith((".c", ".h")):
            with open(os.path.join(native, name)) as f:
                assert "getenv" not in f.read(), f"{name} reads the environment"


def test_a_link_whose_device_was_released_refuses_work(manager):
    """A link outliving its device's release raises DestroyedError instead of
    submitting to a destroyed VkDevice; destroy() still frees it."""
    s, d = manager.slot(1), manager.slot(0)
    view = _device_without(s, external_memory_host=True)
    link = _native.Link(view, s.copy_queue.lock, d.native, d.copy_queue.lock, _native.RING_STAGING, 1 << 20, 4)
    view.release()
    try:
        with pytest.raises(vkmulti.DestroyedError, match="device was released"):
            link.submit(_Endpoint(buffer=1), _Endpoint(buffer=1), 16)
        with pytest.raises(vkmulti.DestroyedError):
            link.poll(1, 1)
        assert link.alive
    finally:
        link.destroy()
    assert not link.alive
