"""A live migration checked by the GPU shader's CRC32 makes as many GPU submits
and host waits whatever the chunk count of its state (issue #25): on a GPU each
submit and each host wait costs as much as a chunk's copy. Counted on the
moving thread through the one door for Python's submits (vkapi.queue_submit),
the CRC32 engine's submit, and every host wait of the Python layer on GPU
work (a GPU job's timeline, a transfer's landing or its submission); so are
the descriptor sets it makes (one per buffer hashed, not per chunk)."""
from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from kernel_support import runtime_fixture
from vkmulti._core import vkapi
from vkmulti.kernels import KernelSpec, counter_kernel
from vkmulti.kernels.engine.device_context import DeviceContext
from vkmulti.kernels.engine.gpu_jobs import GpuJobs
from vkmulti.kernels.lifecycle import chunked_copy
from vkmulti.kernels.lifecycle.gpu_crc import GpuCrc
from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter
from vkmulti.transfer.link import TransferTicket

runtime = runtime_fixture(max_kernels=8)
CHUNK = 4096
MAX = 8


class MoveCalls:
    """Calls made on this thread, by name, while `counting` is set."""

    def __init__(self, monkeypatch):
        self.calls: Counter[str] = Counter()
        self.counting = False
        self.thread = threading.get_ident()
        real_submit = vkapi.queue_submit

        def queue_submit(*args, **kw):
            self._note("queue_submit")
            return real_submit(*args, **kw)
        monkeypatch.setattr(vkapi, "queue_submit", queue_submit)
        for cls, name, label in ((GpuJobs, "wait", "wait"), (TransferTicket, "wait", "wait"),
                                 (TransferTicket, "wait_submitted", "wait"), (TransferTicket, "_gpu_wait", "wait"),
                                 (GpuCrc, "submit", "crc_submit"), (DeviceContext, "descriptor_set", "sets")):
            monkeypatch.setattr(cls, name, self._counted(getattr(cls, name), label))

    def _note(self, label: str) -> None:
        if self.counting and threading.get_ident() == self.thread:
            self.calls[label] += 1

    def _counted(self, fn, label):
        def call(*args, **kw):
            self._note(label)
            return fn(*args, **kw)
        return call

    def move(self, rt, k, target) -> dict:
        rt.ready_twins.wait_idle(60)   # (the twins built ahead in the background: not the move's)
        rt.prebuild.wait_idle(60)
        self.calls.clear()
        self.counting = True
        try:
            r = rt.migrate(k, target)
        finally:
            self.counting = False
        assert r.checksum_match is True and k.device_index == target
        return dict(self.calls)


def _kernel(rt, name, chunks):
    base = counter_kernel(max_sources=MAX)
    extra = np.random.default_rng(chunks).integers(0, 256, chunks * CHUNK - 12, dtype=np.uint8)
    spec = KernelSpec(f"calls{chunks}", base.spirv, state_sizes=(base.state_sizes[0], extra.nbytes))
    return rt.launch(spec, name, device=0, state=[counter_initial_state(MAX), extra]), extra


def test_a_moves_submits_and_waits_do_not_grow_with_its_chunks(runtime, monkeypatch):
    runtime.migration_crc = "shader"
    monkeypatch.setattr(chunked_copy, "CHECK_CHUNK_BYTES", CHUNK)
    seen: list = []
    real_init = chunked_copy.ChunkedCopy.__init__

    def spy(self, *args, **kw):
        real_init(self, *args, **kw)
        seen.append(self)
    monkeypatch.setattr(chunked_copy.ChunkedCopy, "__init__", spy)
    few, few_bytes = _kernel(runtime, "few", 1)
    many, many_bytes = _kernel(runtime, "many", 12)
    calls = MoveCalls(monkeypatch)
    counts = {}
    for k in (few, many):
        runtime.send(k, np.array([1], np.uint32), tag=COUNTER_TAG_ADD)
        runtime.step(k)
        calls.move(runtime, k, 1)   # warm: pipelines and CRC32 engines on both devices
        calls.move(runtime, k, 0)
        seen.clear()
        counts[k.id] = calls.move(runtime, k, 1)
        assert len(seen) == 1
        assert seen[0].names[:2] == ["control", "inbox"]   # (copied with the state, first)
        chunks = sum(len(plan) for plan in seen[0].plans[2:4])   # the state's
        assert chunks == (13 if k is many else 2)
    assert counts["few"] == counts["many"], counts
    c = counts["many"]
    # the source's control block, inbox and state in one job, the destination's every chunk in one
    # (nothing was staged: no job for staging batches at the switch)
    assert c.get("crc_submit", 0) == 2, c
    assert c.get("wait", 0) <= 6 and c.get("queue_submit", 0) <= 4, c   # (before: 16 submits, 46 waits)
    for k, extra in ((few, few_bytes), (many, many_bytes)):
        assert np.array_equal(runtime.read_state(k, 1), extra)
        runtime.send(k, np.array([2], np.uint32), tag=COUNTER_TAG_ADD)
        runtime.step(k)
        runtime.synchronize()
        counter = read_counter(runtime.read_state(k))
        assert counter.sum == 3 and counter.fifo_errors == 0


@pytest.mark.parametrize("verify", [True, False])
def test_a_move_without_the_shader_or_the_check_still_lands_whole(runtime, monkeypatch, verify):
    """The copy-only path waits for one landing per link too, and the state arrives whole."""
    runtime.migration_crc = "shader"
    monkeypatch.setattr(chunked_copy, "CHECK_CHUNK_BYTES", CHUNK)
    k, extra = _kernel(runtime, "plain", 9)
    for target in (1, 0, 1):
        r = runtime.migrate(k, target, verify=verify)
        assert k.device_index == target and r.checksum_match is (True if verify else None)
        assert np.array_equal(runtime.read_state(k, 1), extra)
