"""CUDA_PEER link scenarios on the virtual lavapipe pair with the stand-in driver (mock_libcuda.c).

Run by tests/test_cuda_peer.py in subprocesses (the CUDA driver is loaded once
per process, so a different device count needs its own):

    VKMULTI_LIBCUDA=/path/libcuda_mock.so python tests/cuda_mock_scenarios.py SCENARIO [SCENARIO...]

Prints "SCENARIO ok" for each scenario that holds; the first failure raises.
"""
from __future__ import annotations

import ctypes
import os
import sys

from vkmulti.testing import install_virtual_gpus

install_virtual_gpus(2)
os.environ.setdefault("VKMULTI_VALIDATION", "1")

import numpy as np  # noqa: E402
import vulkan as vk  # noqa: E402

from vkmulti import MultiDeviceManager, TransferError, UnsupportedError
from vkmulti._core import _native  # noqa: E402
from vkmulti import Buffer, Image  # noqa: E402
from vkmulti.device.instance import drain_all_validation_messages  # noqa: E402
from vkmulti import TransferMethod
from vkmulti.transfer import method_support  # noqa: E402
from vkmulti import CrossDeviceTransfer  # noqa: E402

MOCK = ctypes.CDLL(os.environ["VKMULTI_LIBCUDA"])
MOCK.mock_cuda_report.restype = ctypes.c_char_p
MOCK.mock_cuda_configure.argtypes = [ctypes.c_char_p, ctypes.c_long]
FAULTS = {"copy_fails": (b"cuMemcpyPeerAsync:3", -1), "import_fails": (b"cuImportExternalMemory:2", -1),
          "stream_fault": (b"", 5)}
CLEAN = "streams=0 events=0 ext_mem=0 allocs=0 mapped=0 ctx_refs=0 violations=0"


def report() -> str:
    return MOCK.mock_cuda_report().decode()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def link(mgr, src=1, dst=0, slot_size=4 << 20, slot_count=8, **kw):
    s, d = mgr.slot(src), mgr.slot(dst)
    return _native.Link(s.native, s.copy_queue.lock, d.native, d.copy_queue.lock, _native.RING_CUDA_PEER, slot_size,
                        slot_count, tuning=_native._LinkTuning(cuda_ordinals=(src, dst)), **kw)


def endpoints(mgr, a, b, src=1, dst=0, **kw):
    """The endpoints exactly as CrossDeviceTransfer builds them."""
    x = CrossDeviceTransfer(mgr.slot(src), mgr.slot(dst), TransferMethod.STAGING_COPY, **kw)
    if isinstance(a, Image):
        es, n = x._image_endpoint(a, mgr.slot(src), "src_image", None, None, None)
        ed, _ = x._image_endpoint(b, mgr.slot(dst), "dst_image", None, None, None)
        return es, ed, n
    raise TypeError(a)


def buffer_endpoints(mgr, a, b, src_off, dst_off, src=1, dst=0):
    x = CrossDeviceTransfer(mgr.slot(src), mgr.slot(dst), TransferMethod.STAGING_COPY)
    return (x._buffer_endpoint(a, mgr.slot(src), "src_buffer", src_off, None),
            x._buffer_endpoint(b, mgr.slot(dst), "dst_buffer", dst_off, None))


def check_validation() -> None:
    errors = [t for sev, t in drain_all_validation_messages() if sev == "error"]
    assert not errors, "validation errors:\n" + "\n".join(errors[:5])


def roundtrip_buffer(mgr, lk, n, src_off=0, dst_off=0, src=1, dst=0, rng=np.random.default_rng(1)):
    data = rng.integers(0, 256, n, dtype=np.uint8)
    with Buffer(mgr.slot(src), n + src_off) as a, Buffer(mgr.slot(dst), n + dst_off) as b:
        a.upload(data, src_off)
        es, ed = buffer_endpoints(mgr, a, b, src_off, dst_off, src, dst)
        t, sdone, dready = lk.submit(es, ed, n)
        lk.wait(t, dready, 60)
        got = b.download(n, dst_off)
        assert np.array_equal(got, data), f"buffer of {n} B (offsets {src_off}, {dst_off}) differs"
        assert np.array_equal(a.download(n, src_off), data), "source changed"
        return sdone, dready


def roundtrip_image(mgr, lk, w, h, fmt=vk.VK_FORMAT_R16G16B16A16_SFLOAT, src=1, dst=0, kernel_copies=True):
    a = Image(mgr.slot(src), w, h, fmt, kernel_copies=kernel_copies)
    b = Image(mgr.slot(dst), w, h, fmt, kernel_copies=kernel_copies)
    try:
        px = np.random.default_rng(w * 31 + h).integers(0, 256, (h, w, a.bytes_per_pixel), dtype=np.uint8)
        a.upload(px)
        es, ed, n = endpoints(mgr, a, b, src, dst)
        t, _, dready = lk.submit(es, ed, n)
        lk.wait(t, dready, 60)
        assert np.array_equal(b.download(), px), f"image {w}x{h} differs"
        assert np.array_equal(a.download(), px), "source image changed"
    finally:
        a.destroy()
        b.destroy()


def scenario_roundtrip() -> None:
    fds = open_fds()
    with MultiDeviceManager.create(enabled=True) as mgr:
        assert _native.cuda_status() is None
        assert [d[2] for d in _native.cuda_devices()] == ["Mock CUDA GPU 0", "Mock CUDA GPU 1"]
        a, b = mgr.slot(1).capabilities, mgr.slot(0).capabilities
        why = method_support(TransferMethod.CUDA_PEER, a, b)
        assert why is not None and "is not a CUDA device" in why and "llvmpipe" in why, why
        for src, dst in ((1, 0), (0, 1)):
            lk = link(mgr, src, dst)
            try:
                assert lk.ring_note.startswith("bounce ring") and "CUDA_ERROR_NOT_SUPPORTED" in lk.ring_note, \
                    lk.ring_note
                last = (0, 0)
                for n, so, do in ((1, 0, 0), (4097, 3, 5), ((3 << 20) + 7, 0, 0), ((40 << 20) + 13, 256, 1)):
                    sd, dr = roundtrip_buffer(mgr, lk, n, so, do, src, dst)
                    assert sd > last[0] and dr > last[1], (sd, dr, last)
                    last = (sd, dr)
                assert lk.kernel_bytes > 0, "buffers made with STORAGE usage go by compute kernels"
                before = lk.kernel_bytes
                roundtrip_image(mgr, lk, 640, 480, src=src, dst=dst)
                assert lk.kernel_bytes - before == 2 * 640 * 480 * 8, "both sides of the image go by kernels"
                before = lk.kernel_bytes
                roundtrip_image(mgr, lk, 64, 48, src=src, dst=dst, kernel_copies=False)
                assert lk.kernel_bytes == before, "an image without a kernel view goes by copy commands"
            finally:
                lk.destroy()
        # small slots: images span many chunks and wrap the ring many times
        lk = link(mgr, slot_size=16 << 10, slot_count=3)
        try:
            for w, h in ((1, 1), (1023, 7), (97, 131)):
                roundtrip_image(mgr, lk, w, h)
            for fmt in (vk.VK_FORMAT_R8_UNORM, vk.VK_FORMAT_B8G8R8A8_UNORM, vk.VK_FORMAT_R32G32B32A32_SFLOAT):
                roundtrip_image(mgr, lk, 61, 29, fmt)
            roundtrip_buffer(mgr, lk, (1 << 20) + 3)
        finally:
            lk.destroy()
        lk.destroy()   # idempotent
        check_validation()
    assert report() == CLEAN, report()
    assert open_fds() == fds, f"file descriptors leaked: {fds} -> {open_fds()}"


def scenario_many_in_flight() -> None:
    fds = open_fds()
    with MultiDeviceManager.create(enabled=True) as mgr:
        lk = link(mgr, slot_size=64 << 10, slot_count=4, spin=50e-6)   # the GPU-host polling paths too
        rng = np.random.default_rng(7)
        jobs = []
        try:
            for i in range(24):
                n = int(rng.integers(1, 300_000))
                data = rng.integers(0, 256, n, dtype=np.uint8)
                a, b = Buffer(mgr.slot(1), n), Buffer(mgr.slot(0), n)
                a.upload(data)
                es, ed = buffer_endpoints(mgr, a, b, 0, 0)
                jobs.append((lk.submit(es, ed, n), a, b, data))
            t, _, dready = jobs[-1][0]
            lk.wait(t, dready, 60, True)          # all submitted
            for (t, _, dready), a, b, data in jobs:
                lk.wait(t, dready, 60)
                assert lk.poll(t, dready)
                assert np.array_equal(b.download(), data), "a job in flight delivered wrong bytes"
        finally:
            lk.destroy()
            for _, a, b, _ in jobs:
                a.destroy()
                b.destroy()
        check_validation()
    assert report() == CLEAN, report()
    assert open_fds() == fds, f"file descriptors leaked: {fds} -> {open_fds()}"


def scenario_copy_fails() -> None:
    """A CUDA call failing mid-job: TransferError with the call named, nothing hangs or leaks."""
    fds = open_fds()
    with MultiDeviceManager.create(enabled=True) as mgr:
        lk = link(mgr, slot_size=64 << 10, slot_count=2)
        n = 1 << 20
        with Buffer(mgr.slot(1), n) as a, Buffer(mgr.slot(0), n) as b:
            es, ed = buffer_endpoints(mgr, a, b, 0, 0)
            t, sdone, dready = lk.submit(es, ed, n)
            try:
                lk.wait(t, dready, 60)
                raise AssertionError("the failed copy was reported complete")
            except TransferError as exc:
                assert "cuMemcpyPeerAsync" in str(exc), exc
            # GPU work waiting on the failed job's points is released, not left hanging
            for sem, value, dev in ((lk.src_timeline, sdone, mgr.slot(1)), (lk.dst_timeline, dready, mgr.slot(0))):
                dev.native.wait_timeline(sem, value, 10)   # raises TimeoutError if never reached
            try:
                lk.submit(es, ed, n)
                raise AssertionError("a failed link took a new job")
            except TransferError:
                pass
            lk.destroy()
        check_validation()
    assert report() == CLEAN, report()
    assert open_fds() == fds, f"file descriptors leaked: {fds} -> {open_fds()}"


def scenario_stream_fault() -> None:
    """A CUDA stream failing on the GPU (sticky error): reported, and destroy() returns
    within the stall timeout. The other stream stays blocked on the dead one's event,
    so the link's memory is left allocated rather than freed under it."""
    import time
    with MultiDeviceManager.create(enabled=True) as mgr:
        lk = link(mgr, slot_size=64 << 10, slot_count=2, stall_timeout=3.0)
        n = 1 << 20
        with Buffer(mgr.slot(1), n) as a, Buffer(mgr.slot(0), n) as b:
            es, ed = buffer_endpoints(mgr, a, b, 0, 0)
            t, _, dready = lk.submit(es, ed, n)
            try:
                lk.wait(t, dready, 60)
                raise AssertionError("a faulted stream was reported complete")
            except TransferError as exc:
                assert "ILLEGAL_ADDRESS" in str(exc), exc
            t0 = time.monotonic()
            lk.destroy()
            assert time.monotonic() - t0 < 3.0 * 2 + 2, "destroy() was not bounded by the stall timeout"
        check_validation()
    assert report().endswith("violations=0"), report()


def scenario_import_fails() -> None:
    """The second memory import fails: creation raises, the exported fd is closed, all is released."""
    fds = open_fds()
    with MultiDeviceManager.create(enabled=True) as mgr:
        try:
            link(mgr)
            raise AssertionError("link creation succeeded with a failing import")
        except TransferError as exc:
            assert "cuImportExternalMemory" in str(exc), exc
        check_validation()
    assert report() == CLEAN, report()
    assert open_fds() == fds, f"file descriptors leaked: {fds} -> {open_fds()}"


def scenario_unsupported() -> None:
    """One CUDA device: no link, and the reasons say why."""
    with MultiDeviceManager.create(enabled=True) as mgr:
        try:
            link(mgr)
            raise AssertionError("a link was made with one CUDA device")
        except UnsupportedError as exc:
            assert "CUDA sees 1" in str(exc), exc
        s, d = mgr.slot(1), mgr.slot(0)
        try:
            _native.Link(s.native, s.copy_queue.lock, d.native, d.copy_queue.lock, _native.RING_CUDA_PEER, 1 << 20, 2)
            raise AssertionError("a link was made for devices CUDA does not see")
        except UnsupportedError as exc:
            assert "is not a CUDA device" in str(exc) and "llvmpipe" in str(exc), exc
            # the environment is read in Python and passed down to the message
            assert "CUDA_VISIBLE_DEVICES=0" in str(exc), exc
        check_validation()
    assert report() == CLEAN, report()


if __name__ == "__main__":
    for name in sys.argv[1:]:
        MOCK.mock_cuda_configure(*FAULTS.get(name, (b"", -1)))
        globals()["scenario_" + name]()
        print(name, "ok", flush=True)
