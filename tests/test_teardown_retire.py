"""Teardown frees a timeline semaphore only once the device's queues retired the submits before it.

Seeing a submit's signal does not mean the driver is done with the semaphores
that submit waited on: lavapipe (Mesa's emulated timelines) lets go of them on
the queue's submit thread after the signal is visible. The README's offload
example crashed about one run in eight (SIGSEGV in libvulkan_lvp.so) when the
coordinator's teardown destroyed GPU 0's renderer timeline while that thread
still released the compositor's wait on it (core dump: the fault is the
release of a wait point into the freed timeline's free list).

The first tests hold a queue with a submit that cannot retire yet (it waits on
a host-signalled gate) and check that destroy() does not free the semaphore
meanwhile: it times out and keeps the object, then frees it once the gate is
opened. The last one runs the README's create / render / destroy loop in a
child process beside CPU hogs, so that the crash (when it comes back) fails
one test instead of ending the run.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import numpy as np
import pytest
import vulkan as vk

import vkmulti
from vkmulti import TransferMethod
from vkmulti._core import vkapi
from vkmulti.errors import TimeoutError as VkmTimeoutError
from vkmulti import Buffer, Image
from vkmulti.offload import SRU_IMAGE_USAGE, Compositor, ReferenceRenderer, ReferenceSRU
from vkmulti import CrossDeviceTransfer


@contextlib.contextmanager
def held_queues(slot):
    """Every queue of `slot` holds a submit waiting on a host-signalled gate (not retired)
    until the block ends; the gate opens then and the queues are drained."""
    gate = slot.native.create_timeline(0)
    handle = vk.ffi.cast("VkSemaphore", gate)
    try:
        for q in slot.queues():
            chain = vk.VkTimelineSemaphoreSubmitInfo(
                sType=vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO, waitSemaphoreValueCount=1,
                pWaitSemaphoreValues=[1])
            info = vk.VkSubmitInfo(sType=vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, pNext=chain, waitSemaphoreCount=1,
                                   pWaitSemaphores=[handle],
                                   pWaitDstStageMask=[vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT])
            vkapi.queue_submit(slot.native, q, [info])
        yield
    finally:
        vk.vkSignalSemaphore(slot.device, vk.VkSemaphoreSignalInfo(
            sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=handle, value=1))
        assert slot.native.drain_queues_raw([q.lock for q in slot.queues()], 30.0)
        vk.vkDestroySemaphore(slot.device, handle, None)


def test_renderer_and_compositor_keep_their_timelines_until_the_queue_retired(manager):
    slot = manager.primary
    sru = ReferenceSRU(sru_id="a", width=64, height=48)
    renderer, compositor = ReferenceRenderer(slot), Compositor(slot)
    with Image(slot, 64, 48, usage=SRU_IMAGE_USAGE) as target, Image(slot, 64, 48) as frame:
        done = compositor.composite(frame, [(target, 0, 0)], wait=renderer.render(sru, target))
        compositor.wait(done, 30.0)   # both signals seen: all that remains is the driver letting go
        with held_queues(slot):
            for sub in (renderer, compositor):
                with pytest.raises(VkmTimeoutError):
                    sub.destroy(timeout=0.3)
                assert not sub.destroyed
        renderer.destroy()
        compositor.destroy()
    assert renderer.destroyed and compositor.destroyed


@pytest.mark.parametrize("method", [TransferMethod.STAGING_COPY, TransferMethod.HOST_SHARED])
def test_transfer_link_keeps_its_timelines_until_both_queues_retired(manager, method):
    src, dst = manager.slot(1), manager.slot(0)
    data = np.arange(1 << 14, dtype=np.uint32)
    with Buffer(src, data.nbytes) as a, Buffer(dst, data.nbytes) as b:
        a.upload(data)
        x = CrossDeviceTransfer(src, dst, method)
        ticket = x.submit(src_buffer=a, dst_buffer=b)
        ticket.wait(30.0)
        for held in (dst, src):
            with held_queues(held):
                with pytest.raises(VkmTimeoutError):
                    x.destroy(timeout=0.3)
        x.destroy()
        assert np.array_equal(b.download().view(np.uint32), data)


def test_a_buffer_a_queued_gpu_job_reads_is_freed_only_once_the_job_ran(manager):
    """The kernels' GPU jobs (replay-log and checkpoint captures, CRC checks, staging
    passes) copy out of a kernel's buffers on their own timeline, after its step. A
    kernel destroyed once its steps are done must not free the buffers while such a
    job is still queued: lavapipe then ran the copy on a freed buffer (SIGSEGV in
    its queue thread, the failover tests about one run in eight on a loaded machine)."""
    from vkmulti.kernels.engine import GpuJobs
    from vkmulti.kernels.engine import recording

    slot = manager.primary
    jobs = GpuJobs(slot, slot.queues()[0])
    gate = slot.native.create_timeline(0)
    handle = vk.ffi.cast("VkSemaphore", gate)
    data = np.arange(1 << 12, dtype=np.uint32)
    try:
        src, dst = Buffer(slot, data.nbytes), Buffer(slot, data.nbytes)
        src.upload(data)
        point = jobs.submit(lambda cmd: recording.copy(cmd, src.handle, dst.handle, 0, 0, data.nbytes), [(gate, 1)],
                            users=[src, dst])
        for b in (src, dst):
            with pytest.raises(VkmTimeoutError):
                b.destroy(timeout=0.3)
            assert not b.destroyed
        vk.vkSignalSemaphore(slot.device, vk.VkSemaphoreSignalInfo(
            sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=handle, value=1))
        jobs.wait(point, 30.0)
        assert np.array_equal(dst.download().view(np.uint32), data)
        src.destroy()
        dst.destroy()
        assert src.destroyed and dst.destroyed
    finally:
        vk.vkSignalSemaphore(slot.device, vk.VkSemaphoreSignalInfo(
            sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=handle, value=2))
        jobs.destroy(30.0)
        vk.vkDestroySemaphore(slot.device, handle, None)


_LOOP = """
import os, sys
from vkmulti.testing import install_virtual_gpus
install_virtual_gpus(2)
import vkmulti
from vkmulti.offload import make_srus
from vkmulti.memory.image import Image
for i in range(int(sys.argv[1])):
    with vkmulti.MultiDeviceManager.create(validation=False) as mgr:
        coord = vkmulti.SRUOffloadCoordinator(
            mgr, secondary_renderer_factory=lambda ctx: vkmulti.ReferenceRenderer(ctx.slot))
        with Image(mgr.primary, 1280, 720) as frame:
            coord.render_frame(make_srus(16, 1280, 720), frame)
    print("frame", i, flush=True)
"""


@pytest.mark.virtual   # (the lavapipe submit thread is what lagged)
def test_offload_frames_torn_down_in_a_loop_do_not_crash():
    """The README's offload example, made and torn down 32 times in a child process
    while CPU hogs make the driver's submit threads lag (the crash needed that)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(min(4, max(2, os.cpu_count() or 2)))]
    try:
        proc = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _LOOP, "32"], capture_output=True,
                              text=True, timeout=300)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    frames = sum(line.startswith("frame ") for line in proc.stdout.splitlines())
    assert proc.returncode == 0 and frames == 32, (
        f"child exited with {proc.returncode} (negative: the signal that killed it) after {frames} frames\n"
        f"{proc.stderr[-3000:]}")
