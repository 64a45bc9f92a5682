"""CUDA_PEER: NVLink peer copies of Vulkan memory through CUDA external-memory interop.

Without NVIDIA GPUs (CI, the virtual pair) the method must be reported
unavailable with a clear reason, never chosen, and refused when forced. The
link itself also runs here against a stand-in CUDA driver (mock_libcuda.c,
host-sync mode, in subprocesses). Tests marked gpu run on two real GPUs joined
by NVLink (VKMULTI_REAL_GPUS=1).
"""
from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import vulkan as vk

import vkmulti
from vkmulti import UnsupportedError
from vkmulti._core import _native
from vkmulti.device.capabilities import EXT_MEMORY_FD, EXT_SEMAPHORE_FD
from vkmulti import Buffer, Image
from vkmulti import TransferMethod, supported_methods
from vkmulti.transfer import method_support
from vkmulti.transfer import CrossDeviceTransfer, select_transfer_method

HERE = Path(__file__).resolve().parent
NATIVE = HERE.parent / "native"
F = vk.VK_FORMAT_R16G16B16A16_SFLOAT


class Assignment:
    def __init__(self, device_index):
        self.device_index = device_index


def _cc() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


# ---- no CUDA here: unavailable, with a reason; never chosen; refused when forced ----

@pytest.mark.virtual
def test_reported_unavailable_with_reason(manager):
    a, b = manager.slot(1), manager.slot(0)
    why = method_support(TransferMethod.CUDA_PEER, a.capabilities, b.capabilities, a.enabled_extensions,
                         b.enabled_extensions)
    assert isinstance(why, str) and len(why) > 20
    status = _native.cuda_status()
    if status is not None:   # no driver: the reason is the driver's absence
        assert why == status
        assert "libcuda.so.1" in why or "cuInit" in why
    else:                    # a driver, but lavapipe is no CUDA device
        assert "is not a CUDA device" in why
    assert TransferMethod.CUDA_PEER not in supported_methods(a.capabilities, b.capabilities)
    assert TransferMethod.CUDA_PEER in TransferMethod.ALL
    assert TransferMethod.CROSS_DEVICE[0] == TransferMethod.CUDA_PEER


@pytest.mark.virtual
def test_select_falls_back(manager):
    caps = manager.capabilities
    assert select_transfer_method(Assignment(1), caps) == TransferMethod.DMABUF
    assert select_transfer_method(Assignment(1), caps, prefer_dmabuf=False) == TransferMethod.HOST_SHARED
    assert select_transfer_method(Assignment(0), caps, dst_index=1) == TransferMethod.DMABUF


@pytest.mark.virtual
def test_forcing_raises_unsupported(manager):
    """CUDA_PEER forced where CUDA cannot serve the pair is refused when the transfer
    is made, with CUDA's reason and the methods the pair does support."""
    s, d = manager.slot(1), manager.slot(0)
    with pytest.raises(UnsupportedError, match="cuda_peer.*GPU 1.*GPU 0") as info:
        CrossDeviceTransfer(s, d, TransferMethod.CUDA_PEER)
    why = method_support(TransferMethod.CUDA_PEER, s.capabilities, d.capabilities)
    assert why in str(info.value)
    assert str(info.value).endswith(f"this pair supports {vkmulti.pair_methods(s, d)}")


@pytest.mark.virtual
def test_native_link_refuses_with_reason(manager):
    s, d = manager.slot(1), manager.slot(0)
    cuda = _native.RING_CUDA_PEER
    with pytest.raises(UnsupportedError, match="CUDA_PEER is not possible from 'llvmpipe.*' to 'llvmpipe.*': .+"):
        _native.Link(s.native, s.copy_queue.lock, d.native, d.copy_queue.lock, cuda, 1 << 20, 4)
    with pytest.raises(ValueError, match="slot_size"):
        _native.Link(s.native, s.copy_queue.lock, d.native, d.copy_queue.lock, cuda, 0, 4)
    with pytest.raises(TypeError):
        _native.Link(None, s.copy_queue.lock, d.native, d.copy_queue.lock, cuda, 1 << 20, 4)


def test_probe_functions_without_cuda():
    import vkmulti

    if vkmulti.cuda_status() is None:
        pytest.skip("a CUDA driver is present")
    assert vkmulti.cuda_devices() == []
    why = _native.cuda_peer_reason(b"\1" * 16, b"\2" * 16, "a", "b")
    assert why == vkmulti.cuda_status()
    with pytest.raises(ValueError, match="16 bytes"):
        _native.cuda_peer_reason(b"\1" * 15, b"\2" * 16)


def _with_cuda_extensions(caps):
    """The pair's capabilities as if both devices had the CUDA_PEER extensions enabled."""
    ext = {EXT_MEMORY_FD, EXT_SEMAPHORE_FD}
    devices = tuple(dataclasses.replace(d, extensions=d.extensions | ext) for d in caps.devices)
    enabled = tuple(e | ext for e in caps.enabled_extensions)
    return dataclasses.replace(caps, devices=devices, enabled_extensions=enabled)


@pytest.mark.virtual
def test_policy_prefers_cuda_peer_when_the_probe_allows(manager, monkeypatch):
    """Selection is policy: with CUDA saying yes, CUDA_PEER comes first; the extensions still count."""
    import vkmulti.device.cuda

    caps = _with_cuda_extensions(manager.capabilities)
    monkeypatch.setattr(vkmulti.device.cuda, "cuda_peer_reason", lambda a, b: None)
    monkeypatch.setenv("VKMULTI_CUDA_PEER", "0")
    assert select_transfer_method(Assignment(1), caps) == TransferMethod.DMABUF   # opted out
    monkeypatch.delenv("VKMULTI_CUDA_PEER", raising=False)
    assert select_transfer_method(Assignment(1), caps) == TransferMethod.CUDA_PEER
    assert select_transfer_method(Assignment(1), caps, prefer_dmabuf=False) == TransferMethod.CUDA_PEER
    a, b = caps.devices[1], caps.devices[0]
    assert supported_methods(a, b)[0] == TransferMethod.CUDA_PEER
    no_fd = frozenset(caps.enabled_extensions[1] - {EXT_MEMORY_FD})
    assert method_support(TransferMethod.CUDA_PEER, a, b, no_fd, caps.enabled_extensions[0]).startswith(
        f"{a.name!r} has {EXT_MEMORY_FD} but its VkDevice was created without it")
    no_sem = frozenset(caps.enabled_extensions[1] - {EXT_SEMAPHORE_FD})   # not needed: the link orders itself
    assert method_support(TransferMethod.CUDA_PEER, a, b, no_sem, caps.enabled_extensions[0]) is None
    # an explicit probe overrides the driver's answer
    assert method_support(TransferMethod.CUDA_PEER, a, b, cuda_probe=lambda x, y: "no NVLink here") == \
        "no NVLink here"
    monkeypatch.setattr(vkmulti.device.cuda, "cuda_peer_reason", lambda a, b: "CUDA reports no peer access")
    assert select_transfer_method(Assignment(1), caps) == TransferMethod.DMABUF


# ---- the declarations in vkm_cuda.h against a real cuda.h, where one is installed ----

def _cuda_include() -> str | None:
    roots = [os.environ.get(k) for k in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    roots += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for r in roots:
        if r and os.path.isfile(os.path.join(r, "include", "cuda.h")):
            return os.path.join(r, "include")
    return "/usr/include" if os.path.isfile("/usr/include/cuda.h") else None


_LAYOUT_C = r"""
#include <stddef.h>
#include <cuda.h>
#define VKM_CUDA_API_ONLY
#include "vkm_cuda.h"
#define SAME(a, b) _Static_assert(sizeof(a) == sizeof(b) && _Alignof(a) == _Alignof(b), #a)
#define OFF(a, b, f) _Static_assert(offsetof(a, f) == offsetof(b, f), #a "." #f)
SAME(vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CUDA_EXTERNAL_MEMORY_HANDLE_DESC);
OFF(vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CUDA_EXTERNAL_MEMORY_HANDLE_DESC, type);
OFF(vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CUDA_EXTERNAL_MEMORY_HANDLE_DESC, handle.fd);
OFF(vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CUDA_EXTERNAL_MEMORY_HANDLE_DESC, size);
OFF(vkm_CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CUDA_EXTERNAL_MEMORY_HANDLE_DESC, flags);
SAME(vkm_CUDA_EXTERNAL_MEMORY_BUFFER_DESC, CUDA_EXTERNAL_MEMORY_BUFFER_DESC);
OFF(vkm_CUDA_EXTERNAL_MEMORY_BUFFER_DESC, CUDA_EXTERNAL_MEMORY_BUFFER_DESC, offset);
OFF(vkm_CUDA_EXTERNAL_MEMORY_BUFFER_DESC, CUDA_EXTERNAL_MEMORY_BUFFER_DESC, size);
OFF(vkm_CUDA_EXTERNAL_MEMORY_BUFFER_DESC, CUDA_EXTERNAL_MEMORY_BUFFER_DESC, flags);
SAME(vkm_CUuuid, CUuuid);
SAME(vkm_CUdeviceptr, CUdeviceptr);
SAME(vkm_CUdevice, CUdevice);
SAME(vkm_CUresult, CUresult);
_Static_assert((int)VKM_CUDA_ERROR_NOT_READY == (int)CUDA_ERROR_NOT_READY, "NOT_READY");
_Static_assert((int)VKM_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED == (int)CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "704");
_Static_assert((int)VKM_CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD == (int)CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD, "fd");
_Static_assert((int)VKM_CUDA_EXTERNAL_MEMORY_DEDICATED == (int)CUDA_EXTERNAL_MEMORY_DEDICATED, "dedicated");
_Static_assert((int)VKM_CU_STREAM_NON_BLOCKING == (int)CU_STREAM_NON_BLOCKING, "non-blocking");
_Static_assert((int)VKM_CU_EVENT_DISABLE_TIMING == (int)CU_EVENT_DISABLE_TIMING, "disable timing");
SAME(vkm_CUmemLocation, CUmemLocation);
OFF(vkm_CUmemLocation, CUmemLocation, id);
SAME(vkm_CUmemAllocationProp, CUmemAllocationProp);
OFF(vkm_CUmemAllocationProp, CUmemAllocationProp, requestedHandleTypes);
OFF(vkm_CUmemAllocationProp, CUmemAllocationProp, location);
OFF(vkm_CUmemAllocationProp, CUmemAllocationProp, win32HandleMetaData);
OFF(vkm_CUmemAllocationProp, CUmemAllocationProp, allocFlags);
SAME(vkm_CUmemAccessDesc, CUmemAccessDesc);
OFF(vkm_CUmemAccessDesc, CUmemAccessDesc, flags);
SAME(vkm_CUmemGenericAllocationHandle, CUmemGenericAllocationHandle);
_Static_assert((int)VKM_CU_MEM_ALLOCATION_TYPE_PINNED == (int)CU_MEM_ALLOCATION_TYPE_PINNED, "pinned");
_Static_assert((int)VKM_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == (int)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
               "posix fd");
_Static_assert((int)VKM_CU_MEM_LOCATION_TYPE_DEVICE == (int)CU_MEM_LOCATION_TYPE_DEVICE, "device");
_Static_assert((int)VKM_CU_MEM_ACCESS_FLAGS_PROT_READWRITE == (int)CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "rw");
_Static_assert((int)VKM_CU_MEM_ALLOC_GRANULARITY_MINIMUM == (int)CU_MEM_ALLOC_GRANULARITY_MINIMUM, "granularity");
int main(void) { return 0; }
"""

_SIGNATURES_C = r"""
#include <stdio.h>
#include <string.h>
#include <cuda.h>
#define VKM_CUDA_API_ONLY
#define VKM_CUDA_TYPES_FROM_CUDA_H
#include "vkm_cuda.h"
#define STR(x) #x
#define XSTR(x) STR(x)
#define CHECK(field, symbol, fallback, params) \
    _Static_assert(__builtin_types_compatible_p(vkm_CUresult(*) params, __typeof__(&symbol)), #symbol);
VKM_CUDA_FUNCTIONS(CHECK)
int main(void) {
    int bad = 0;
    /* the name looked up must be the exported symbol, not a name cuda.h maps to a versioned one */
#define NAME(field, symbol, fallback, params) \
    if (strcmp(#symbol, XSTR(symbol)) != 0) { printf("%s is cuda.h's name for %s\n", #symbol, XSTR(symbol)); bad = 1; }
    VKM_CUDA_FUNCTIONS(NAME)
    return bad;
}
"""


@pytest.mark.parametrize("source", ["layout", "signatures"])
def test_declarations_match_cuda_h(tmp_path, source):
    inc, cc = _cuda_include(), _cc()
    if inc is None or cc is None:
        pytest.skip("needs a CUDA toolkit's cuda.h and a C compiler")
    src = tmp_path / f"{source}.c"
    src.write_text(_LAYOUT_C if source == "layout" else _SIGNATURES_C)
    exe = tmp_path / source
    r = subprocess.run([cc, "-std=gnu11", f"-I{inc}", f"-I{NATIVE}", str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


# ---- the link against the stand-in driver (subprocesses: the driver loads once per process) ----

# scenarios of cuda_mock_scenarios.py, by process: the driver is loaded once per
# process; stream_fault leaves a stuck stream behind, so it runs last
MOCK_RUNS = {
    "two_gpus": (["roundtrip", "many_in_flight", "copy_fails", "import_fails", "stream_fault"], {}),
    "one_gpu": (["unsupported"], {"MOCK_CUDA_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"}),
}


@pytest.fixture(scope="module")
def mock_runs(tmp_path_factory):
    """Run the scenarios against the stand-in driver: {scenario: (passed, output)}."""
    if os.environ.get("VKMULTI_REAL_GPUS") == "1":
        pytest.skip("runs on the virtual lavapipe pair")
    cc = _cc()
    if cc is None:
        pytest.skip("needs a C compiler for the stand-in CUDA driver")
    lib = tmp_path_factory.mktemp("cuda") / "libcuda_mock.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(HERE / "mock_libcuda.c"), "-lpthread"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = {}
    for names, env in MOCK_RUNS.values():
        full = {**os.environ, **env, "VKMULTI_LIBCUDA": str(lib)}
        try:
            p = subprocess.run([sys.executable, str(HERE / "cuda_mock_scenarios.py"), *names], env=full,
                               capture_output=True, text=True, timeout=600)
            text = p.stdout[-2000:] + p.stderr[-4000:]
        except subprocess.TimeoutExpired as exc:
            text = f"timed out: {exc}"
            p = None
        for name in names:
            out[name] = (p is not None and f"{name} ok" in p.stdout.splitlines(), text)
    return out


@pytest.mark.virtual
@pytest.mark.parametrize("scenario", [n for names, _ in MOCK_RUNS.values() for n in names])
def test_link_with_stand_in_driver(mock_runs, scenario):
    """Chunking, ring reuse, images, many in flight, failures and teardown of the real link,
    with validation on, no fd or CUDA object leaked (host-sync mode: lavapipe has no
    exportable semaphores)."""
    passed, text = mock_runs[scenario]
    assert passed, text


# ---- two real GPUs joined by NVLink ----

def _routed() -> bool:
    """Does CrossDeviceTransfer hand CUDA_PEER to the CUDA ring (transfer.py)?"""
    from vkmulti.transfer import link
    return link._RING.get(TransferMethod.CUDA_PEER) == _native.RING_CUDA_PEER


def _universal(slot):
    """A queue of the universal family (fast device-local copies): vkmulti's own copy
    queue when it is of that family, else the graphics queue."""
    q = slot.dedicated_copy_queue
    return (q if q is not None and q.family == slot.graphics_queue.family else slot.graphics_queue).lock


class _Direct:
    """The link driven directly, with endpoints made exactly as CrossDeviceTransfer makes them."""

    def __init__(self, manager, src, dst, **kw):
        s, d = manager.slot(src), manager.slot(dst)
        self.s, self.d = s, d
        self.x = CrossDeviceTransfer(s, d, TransferMethod.STAGING_COPY)
        kw.setdefault("spin", 200e-6)
        if kw.pop("bounce", False):
            kw["tuning"] = _native._LinkTuning(cuda_bounce_ring=True)
        self.link = _native.Link(s.native, _universal(s), d.native, _universal(d), _native.RING_CUDA_PEER,
                                 kw.pop("slot_size", 4 << 20), kw.pop("slot_count", 8), **kw)

    def submit(self, *, src_image=None, dst_image=None, src_buffer=None, dst_buffer=None, src_offset=0,
               dst_offset=0, size=None):
        if src_image is not None:
            es, n = self.x._image_endpoint(src_image, self.s, "src_image", None, None, None)
            ed, _ = self.x._image_endpoint(dst_image, self.d, "dst_image", None, None, None)
        else:
            n = size if size is not None else src_buffer.size - src_offset
            es = self.x._buffer_endpoint(src_buffer, self.s, "src_buffer", src_offset, None)
            ed = self.x._buffer_endpoint(dst_buffer, self.d, "dst_buffer", dst_offset, None)
        t, sdone, dready = self.link.submit(es, ed, n)
        return _Ticket(self.link, t, dready)

    def destroy(self):
        self.link.destroy()
        self.x.destroy()


class _Ticket:
    def __init__(self, link, t, dready):
        self.link, self.t, self.dready = link, t, dready

    def wait(self, timeout=None):
        self.link.wait(self.t, self.dready, timeout)


def _mover(manager, via, src, dst, **kw):
    if via == "transfer":
        if not _routed():
            pytest.skip("transfer.py does not route CUDA_PEER to the CUDA link yet")
        return CrossDeviceTransfer(manager.slot(src), manager.slot(dst), TransferMethod.CUDA_PEER, **kw)
    return _Direct(manager, src, dst, **kw)


def _require_cuda_peer(manager, src=0, dst=1):
    s, d = manager.slot(src), manager.slot(dst)
    why = method_support(TransferMethod.CUDA_PEER, s.capabilities, d.capabilities, s.enabled_extensions,
                         d.enabled_extensions)
    if why is not None:
        pytest.fail(f"CUDA_PEER is not available between GPU {src} and GPU {dst}: {why}")


@pytest.mark.two_gpus
def test_gpu_available_and_selected(manager, monkeypatch):
    monkeypatch.delenv("VKMULTI_CUDA_PEER", raising=False)   # chosen by default
    for src, dst in ((0, 1), (1, 0)):
        _require_cuda_peer(manager, src, dst)
        assert select_transfer_method(Assignment(src), manager.capabilities, dst_index=dst) == \
            TransferMethod.CUDA_PEER


@pytest.mark.two_gpus
@pytest.mark.parametrize("landing", [True, False])
def test_gpu_landing_ring(manager, landing):
    """By default the NVLink copy lands in the destination ring itself (CUDA memory imported
    into Vulkan); asked, the link uses its bounce ring and says why."""
    _require_cuda_peer(manager)
    m = _Direct(manager, 0, 1, bounce=not landing)
    try:
        assert m.link.ring_note.startswith("landing ring" if landing else "bounce ring"), m.link.ring_note
    finally:
        m.destroy()


@pytest.mark.two_gpus
@pytest.mark.parametrize("via", ["link", "transfer"])
@pytest.mark.parametrize("src, dst", [(0, 1), (1, 0)])
@pytest.mark.parametrize("n, src_off, dst_off", [(1, 0, 0), (4097, 3, 5), ((3 << 20) + 7, 0, 0),
                                                 ((64 << 20) + 13, 256, 4), ((256 << 20) + 13, 0, 0)])
def test_gpu_buffer_roundtrip(manager, via, src, dst, n, src_off, dst_off):
    _require_cuda_peer(manager, src, dst)
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    m = _mover(manager, via, src, dst)
    try:
        with Buffer(manager.slot(src), n + src_off) as a, Buffer(manager.slot(dst), n + dst_off + 3) as b:
            a.upload(data, src_off)
            m.submit(src_buffer=a, dst_buffer=b, src_offset=src_off, dst_offset=dst_off, size=n).wait(60)
            np.testing.assert_array_equal(b.download(n, dst_off), data)
            np.testing.assert_array_equal(a.download(n, src_off), data)
    finally:
        m.destroy()


@pytest.mark.two_gpus
@pytest.mark.parametrize("via", ["link", "transfer"])
@pytest.mark.parametrize("src, dst", [(0, 1), (1, 0)])
@pytest.mark.parametrize("w, h, fmt", [(1, 1, F), (1023, 7, F), (97, 131, F), (3840, 2160, F),
                                       (61, 29, vk.VK_FORMAT_R8_UNORM), (1920, 1080, vk.VK_FORMAT_B8G8R8A8_UNORM),
                                       (333, 77, vk.VK_FORMAT_R32G32B32A32_SFLOAT)])
def test_gpu_image_roundtrip(manager, via, src, dst, w, h, fmt):
    _require_cuda_peer(manager, src, dst)
    m = _mover(manager, via, src, dst)
    a, b = Image(manager.slot(src), w, h, fmt), Image(manager.slot(dst), w, h, fmt)
    try:
        px = np.random.default_rng(w * 7919 + h).integers(0, 256, (h, w, a.bytes_per_pixel), dtype=np.uint8)
        a.upload(px)
        m.submit(src_image=a, dst_image=b).wait(60)
        np.testing.assert_array_equal(b.download(), px)
        np.testing.assert_array_equal(a.download(), px)
    finally:
        m.destroy()
        a.destroy()
        b.destroy()


@pytest.mark.two_gpus
@pytest.mark.parametrize("landing", [True, False])
def test_gpu_small_ring_wraps(manager, landing):
    """Slots far smaller than the data: every ring (source, landing or bounce, destination) wraps many
    times, with a landing ring and with a bounce ring."""
    _require_cuda_peer(manager)
    m = _Direct(manager, 0, 1, slot_size=64 << 10, slot_count=3, bounce=not landing)
    try:
        assert m.link.ring_note.startswith("landing ring" if landing else "bounce ring"), m.link.ring_note
        for n in (1, (1 << 20) + 1, (5 << 20) + 3):
            data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
            with Buffer(manager.slot(0), n) as a, Buffer(manager.slot(1), n) as b:
                a.upload(data)
                m.submit(src_buffer=a, dst_buffer=b).wait(60)
                np.testing.assert_array_equal(b.download(), data)
        with Image(manager.slot(0), 517, 333) as a, Image(manager.slot(1), 517, 333) as b:
            px = np.random.default_rng(3).integers(0, 256, (333, 517, 8), dtype=np.uint8)
            a.upload(px)
            m.submit(src_image=a, dst_image=b).wait(60)
            np.testing.assert_array_equal(b.download(), px)
    finally:
        m.destroy()


@pytest.mark.two_gpus
@pytest.mark.parametrize("via", ["link", "transfer"])
def test_gpu_many_in_flight(manager, via, run_threads):
    """Four threads, both directions, 48 jobs in flight on two shared links."""
    _require_cuda_peer(manager)
    rng = np.random.default_rng(11)
    movers = {(0, 1): _mover(manager, via, 0, 1, slot_size=1 << 20, slot_count=4),
              (1, 0): _mover(manager, via, 1, 0, slot_size=1 << 20, slot_count=4)}
    jobs = []
    for i in range(48):
        src, dst = (0, 1) if i % 2 == 0 else (1, 0)
        n = int(rng.integers(1, 6 << 20))
        data = rng.integers(0, 256, n, dtype=np.uint8)
        a, b = Buffer(manager.slot(src), n), Buffer(manager.slot(dst), n)
        a.upload(data)
        jobs.append(((src, dst), a, b, data))
    def worker(k):
        tickets = [movers[p].submit(src_buffer=a, dst_buffer=b) for p, a, b, _ in jobs[k::4]]
        for t in tickets:
            t.wait(120)
    errors = run_threads(worker)
    try:
        assert not errors, errors
        for _, a, b, data in jobs:
            np.testing.assert_array_equal(b.download(), data)
    finally:
        for _, a, b, _ in jobs:
            a.destroy()
            b.destroy()
        for m in movers.values():
            m.destroy()


@pytest.mark.two_gpus
def test_gpu_dst_ready_orders_gpu_work(manager):
    """A readback on GPU 1 waits for dst_ready on the GPU; no host wait on the transfer."""
    _require_cuda_peer(manager)
    m = _Direct(manager, 0, 1)
    a, b = Image(manager.slot(0), 1920, 1080), Image(manager.slot(1), 1920, 1080)
    try:
        px = np.random.default_rng(5).integers(0, 256, (1080, 1920, 8), dtype=np.uint8)
        a.upload(px)
        es, n = m.x._image_endpoint(a, m.s, "src_image", None, None, None)
        ed, _ = m.x._image_endpoint(b, m.d, "dst_image", None, None, None)
        t, _, dready = m.link.submit(es, ed, n)
        m.link.wait(t, dready, 30, True)   # submitted (the readback may share the queue)
        np.testing.assert_array_equal(b.download(waits=[(m.link.dst_timeline, dready)]), px)
    finally:
        m.destroy()
        a.destroy()
        b.destroy()


@pytest.mark.two_gpus
def test_gpu_destroy_with_jobs_in_flight(manager):
    _require_cuda_peer(manager)
    m = _Direct(manager, 1, 0)
    n = 64 << 20
    data = np.random.default_rng(2).integers(0, 256, n, dtype=np.uint8)
    with Buffer(manager.slot(1), n) as a, Buffer(manager.slot(0), n) as b:
        a.upload(data)
        for _ in range(6):
            m.submit(src_buffer=a, dst_buffer=b)
        m.destroy()   # finishes every queued job first
        np.testing.assert_array_equal(b.download(), data)
        with pytest.raises(Exception, match="after destroy"):
            m.submit(src_buffer=a, dst_buffer=b)
