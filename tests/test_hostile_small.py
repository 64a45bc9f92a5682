"""The smaller misuse defects of issue 23: wrong types name the type, out-of-memory
says the size and device, timeout messages print rounded seconds, a node agent's
payload is bounded by the frame it serves, a destroyed KernelRuntime says so."""
from __future__ import annotations

import re

import numpy as np
import pytest

import vkmulti
from vkmulti.errors import OutOfDeviceMemoryError
from vkmulti import Buffer
from vkmulti import InterGpuTransfer
from vkmulti.transfer import method_problem
from vkmulti import supported_methods

from gates import Gate


def test_supported_methods_of_a_wrong_type_is_a_type_error(manager):
    """Before: AttributeError: 'str' object has no attribute 'name'."""
    caps = manager.slot(0).capabilities
    for a, b, who in (("x", caps, "a"), (caps, 3, "b")):
        with pytest.raises(TypeError, match=f"{who} must be DeviceCapabilities .*got {type(a if who == 'a' else b).__name__}"):
            supported_methods(a, b)
        with pytest.raises(TypeError, match="DeviceCapabilities"):
            method_problem(vkmulti.TransferMethod.HOST_SHARED, a, b)
    assert supported_methods(caps, manager.slot(1).capabilities)   # the right types still answer


@pytest.mark.parametrize("bad", ["GPU 0", 0, b"x", None, object()])
def test_buffer_on_something_that_is_not_a_slot_names_its_type(bad):
    """Before: ValueError 'slot has no live device (destroyed, ...)'."""
    with pytest.raises(TypeError, match=f"slot must be a DeviceSlot .*got {type(bad).__name__}"):
        Buffer(bad, 16)


def test_buffer_on_a_destroyed_slot_still_says_no_live_device():
    mgr = vkmulti.MultiDeviceManager.create()
    slot = mgr.slot(1)
    mgr.destroy()
    with pytest.raises(ValueError, match="no live device"):
        Buffer(slot, 16)


def test_a_buffer_too_big_for_the_device_says_the_size_and_the_device(manager):
    """Before: OutOfDeviceMemoryError 'vkCreateBuffer failed: VK_ERROR_OUT_OF_DEVICE_MEMORY (-2)'."""
    slot = manager.slot(0)
    with pytest.raises(OutOfDeviceMemoryError) as info:
        Buffer(slot, 1 << 40)
    msg = str(info.value)
    assert str(1 << 40) in msg and f"GPU 0 ({slot.name!r})" in msg and "VK_ERROR_OUT_OF_DEVICE_MEMORY" in msg
    assert info.value.result == -2 and isinstance(info.value, MemoryError)
    b = Buffer(slot, 16)          # the slot is fine afterwards
    b.destroy()


def test_upload_and_download_refuse_a_buffer_a_copy_may_not_write_or_read(manager):
    """Found by the long fuzz profile: upload() into a buffer made without
    TRANSFER_DST (or download() from one without TRANSFER_SRC) recorded an invalid
    vkCmdCopyBuffer (a validation error; undefined on a driver). Images the same."""
    import vulkan as vk
    from vkmulti import Image

    data = np.arange(64, dtype=np.uint8)
    with Buffer(manager.slot(0), 64, usage=vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT) as src_only:
        with pytest.raises(ValueError, match=r"upload\(\): the buffer lacks VK_BUFFER_USAGE_TRANSFER_DST_BIT \(usage 0x1\)"):
            src_only.upload(data)
        assert src_only.download().nbytes == 64   # (what it may do still works)
    with Buffer(manager.slot(0), 64, usage=vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT) as dst_only:
        dst_only.upload(data)
        with pytest.raises(ValueError, match="download\\(\\): the buffer lacks VK_BUFFER_USAGE_TRANSFER_SRC_BIT"):
            dst_only.download()
    sampled = vk.VK_IMAGE_USAGE_SAMPLED_BIT
    pixels = np.zeros((4, 4, 8), np.uint8)
    with Image(manager.slot(0), 4, 4, usage=sampled | vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT) as no_dst:
        with pytest.raises(ValueError, match="upload\\(\\): the image lacks VK_IMAGE_USAGE_TRANSFER_DST_BIT"):
            no_dst.upload(pixels)
        assert no_dst.download().shape == (4, 4, 8)
    with Image(manager.slot(0), 4, 4, usage=sampled | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT) as no_src:
        no_src.upload(pixels)
        with pytest.raises(ValueError, match="download\\(\\): the image lacks VK_IMAGE_USAGE_TRANSFER_SRC_BIT"):
            no_src.download()


@pytest.mark.parametrize("path", ["same-device", "gather"])
def test_timeout_messages_print_rounded_seconds(manager, path):
    """Before: 'copies on ... not done within 0.09870598399993469 s' (the remainder of
    the caller's deadline, unrounded)."""
    slot = manager.slot(1)
    gate = Gate(slot)
    x = InterGpuTransfer(manager)
    src = Buffer(slot, 4096)
    try:
        x.set_device_buffer(1, src, ready=gate.point)
        with pytest.raises(vkmulti.TimeoutError) as info:
            if path == "same-device":
                x.copy_buffer_blocking(1, 1, timeout=0.1)
            else:
                x.gather_blocking(0, timeout=0.1)
        numbers = re.findall(r"within (\S+) s", str(info.value))
        assert numbers, str(info.value)
        for n in numbers:
            assert re.fullmatch(r"\d+(\.\d{1,3})?", n), str(info.value)
    finally:
        gate.open()
        x.destroy()
        gate.destroy()
        src.destroy()


def test_seconds_text_rounds_to_the_millisecond():
    from vkmulti._core.checks import seconds_text
    assert seconds_text(0.09870598399993469) == "0.099"
    assert seconds_text(30.0) == "30" and seconds_text(2) == "2" and seconds_text(None) == "unbounded"


def test_node_agent_payload_is_bounded_by_the_frame_it_serves():
    """Before: payload(1 << 50) tried to allocate a PiB (MemoryError, or the node swapped)."""
    from vkmulti.cluster import NodeAgent
    agent = NodeAgent()
    try:
        most = agent.max_payload_bytes()
        assert most == 16384 * 16384 * 8 or most > 0
        for bad in (0, -1, most + 1, 1 << 50, 1.5, "8"):
            with pytest.raises(ValueError, match="largest frame this node serves"):
                agent.payload(bad)
        assert agent.payload(1024).nbytes == 1024
    finally:
        agent.shutdown()


def test_kernel_runtime_repr_says_destroyed():
    """Before: the repr of a destroyed runtime read exactly like a live one."""
    mgr = vkmulti.MultiDeviceManager.create()
    try:
        coord = vkmulti.MultiGpuCoordinator.from_manager(mgr)
        rt = vkmulti.KernelRuntime(coord)
        assert "destroyed" not in repr(rt)
        rt.destroy()
        assert "destroyed" in repr(rt)
    finally:
        mgr.destroy()


def test_a_timeout_beyond_any_float_means_no_limit(manager):
    """An int timeout too large for a float (10**400) is a wait without limit; a negative one
    is a ValueError. Both raised OverflowError after the copy was submitted."""
    from vkmulti import Image
    from vkmulti._core.lifetime import Deadline

    huge = 10**400
    assert Deadline(huge).left() == float("inf")
    with Image(manager.slot(0), 4, 4) as img, Buffer(manager.slot(0), 64) as buf:
        img.upload(np.arange(img.nbytes, dtype=np.uint8), timeout=huge)
        assert img.download(timeout=huge).reshape(-1)[5] == 5
        buf.upload(np.ones(8, np.uint8), timeout=huge)
        assert buf.download(8, timeout=huge).sum() == 8
        with pytest.raises(ValueError, match="timeout"):
            img.download(timeout=-huge)
        img.destroy(timeout=huge)


@pytest.mark.parametrize("size", [1, 5, 6, 7, 8])
def test_a_mapped_buffer_of_any_size(manager, size):
    """MappedBuffer of a size that is not a multiple of 4 raised numpy's ValueError after it
    was made and mapped (left alive until the manager's destroy); `words` are its whole words."""
    from vkmulti.memory.buffer import MappedBuffer

    b = MappedBuffer(manager.slot(0), size)
    try:
        assert b.bytes.shape == (size,) and b.words.shape == (size // 4,)
        b.bytes[:] = 0xFF
        assert (b.words == 0xFFFFFFFF).all()
    finally:
        b.destroy()
    assert b.destroyed
