"""Soak: 300 create/transfer/destroy cycles leave no growth behind.

Each cycle makes buffers, an image pair, a CrossDeviceTransfer (a new native
link and its worker thread, since the last user of a link frees it) and an
InterGpuTransfer, moves data with each, checks it, and destroys it all. After
a warm-up, 300 cycles may grow the resident set by less than 1 MB, and must
not grow the thread count (native threads included) or the open file
descriptors, nor produce any validation message (warnings too).
(The warm-up is long because driver and layer caches keep growing for a few
hundred cycles before they level off; measured on the CPU VM: +550 kB over
cycles 20-320, +4 kB over cycles 320-1200.) Managers are made and destroyed
in a second loop checked for threads, descriptors and messages: a new
instance moves the resident set by +-400 kB of allocator noise, without a
trend, so RSS is not bounded there. `VKMULTI_SOAK_CYCLES` runs more cycles
(the RSS bound scales with them).

The cycles run in a child process of their own: the test process's resident
set also holds what earlier tests left running (a Ray driver's threads, thread
pools) and grows with them, whatever this test does. Free heap memory is given
back (malloc_trim) before each reading, so the bound sees what is still
allocated, not how the allocator's arenas were left.
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from vkmulti import InterGpuTransfer, MultiDeviceManager, TransferMethod
from vkmulti import Buffer, Image
from vkmulti.device.instance import drain_all_validation_messages
from vkmulti import CrossDeviceTransfer

CYCLES = int(os.environ.get("VKMULTI_SOAK_CYCLES", "300"))
#: Under AddressSanitizer (the second CI run preloads it) freed memory sits in
#: its quarantine, so the resident set says nothing about leaks there: the RSS
#: bound is checked on the normal build only.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "") or "ASAN_OPTIONS" in os.environ
DATA = np.arange(1 << 16, dtype=np.uint8)
PIXELS = np.random.default_rng(3).integers(0, 256, (16, 16, 8), dtype=np.uint8)


def _rss() -> int:
    """The resident set once free heap memory is given back to the system."""
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _counts() -> tuple[int, int, int]:
    return threading.active_count(), len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def _no_growth(before: tuple[int, ...], after: tuple[int, ...]) -> bool:
    """Nothing grew (threads of earlier tests may still be ending: fewer is fine)."""
    return all(a <= b for a, b in zip(after, before))


def _cycle(mgr: MultiDeviceManager, k: int) -> None:
    s0, s1 = mgr.slot(0), mgr.slot(1)
    method = (TransferMethod.HOST_SHARED, TransferMethod.STAGING_COPY)[k % 2]
    a, b = Buffer(s1, DATA.nbytes), Buffer(s0, DATA.nbytes)
    i1, i0 = Image(s1, 16, 16), Image(s0, 16, 16)
    x = CrossDeviceTransfer(s1, s0, method)
    xfer = InterGpuTransfer(mgr)
    try:
        a.upload(DATA)
        i1.upload(PIXELS)
        x.submit(src_buffer=a, dst_buffer=b)
        x.run(src_image=i1, dst_image=i0, timeout=30)
        out = xfer.copy_buffer_blocking(0, 1, b, timeout=30)
        np.testing.assert_array_equal(out.download(), DATA)
        np.testing.assert_array_equal(i0.download(timeout=30), PIXELS)
    finally:
        xfer.destroy(timeout=30)
        x.destroy(timeout=30)
        for obj in (a, b, i1, i0):
            obj.destroy(timeout=30)


def _soak(cycles: int) -> dict:
    """The child's side: warm up, run `cycles` cycles, report what grew."""
    mgr = MultiDeviceManager.create()
    try:
        for k in range(200):   # warm-up: driver, layer and allocator caches
            _cycle(mgr, k)
        drain_all_validation_messages()
        rss0, counts0 = _rss(), _counts()
        for k in range(cycles):
            _cycle(mgr, k)
        grown = _rss() - rss0
        messages = [m[1][:300] for m in drain_all_validation_messages()]
        return dict(grown=grown, counts0=counts0, counts=_counts(), messages=messages)
    finally:
        mgr.destroy()


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_soak_create_transfer_destroy():
    here = os.path.dirname(os.path.abspath(__file__))
    child = (f"import json, sys; sys.path.insert(0, {here!r}); import test_soak; "
             f"print('SOAK ' + json.dumps(test_soak._soak({CYCLES})))")
    # (the environment the conftest set up, the virtual pair and the validation layer, goes with it)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"the soak's process failed ({done.returncode}):\n{done.stderr[-3000:]}"
    r = json.loads(done.stdout.rsplit("SOAK ", 1)[1])
    assert not r["messages"], f"{len(r['messages'])} validation message(s), first: {r['messages'][0]}"
    assert _no_growth(r["counts0"], r["counts"]), \
        f"threads, native threads, fds: {r['counts0']} before, {r['counts']} after"
    if not UNDER_ASAN:
        assert r["grown"] < (1 << 20) * max(1, CYCLES // 300), \
            f"RSS grew by {r['grown'] / 1024:.0f} kB over {CYCLES} cycles"


def test_soak_managers():
    for _ in range(2):   # warm-up
        with MultiDeviceManager.create() as mgr:
            _cycle(mgr, 0)
    gc.collect()
    drain_all_validation_messages()
    counts0 = _counts()
    for k in range(10):
        with MultiDeviceManager.create() as mgr:
            _cycle(mgr, k)
    gc.collect()
    messages = drain_all_validation_messages()
    assert not messages, f"{len(messages)} validation message(s), first: {messages[0][1][:300]}"
    assert _no_growth(counts0, _counts()), f"threads, native threads, fds: {counts0} before, {_counts()} after"
