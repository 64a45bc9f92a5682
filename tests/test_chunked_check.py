"""The chunked copy of a move (kernels/lifecycle/chunked_copy.py) on the virtual
GPU pair: buffers cut into chunks, each chunk copied GPU to GPU and hashed on
both devices as it lands. The bytes arrive whole for sizes that are not a
multiple of the chunk and at the edges (0, 1, 4 bytes, one chunk exactly, one
chunk and a word); a chunk damaged on the way is found and named (buffer and
byte range), the other chunks match; with the GPU shader's engine and the
host's (CPU devices)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import vulkan as vk

from kernel_support import runtime_fixture
from vkmulti import Buffer
from vkmulti.kernels.engine.device_context import MappedBuffer
from vkmulti.kernels.lifecycle import HostCrc
from vkmulti.kernels.lifecycle.chunked_copy import CHUNK_ALIGN, ChunkedCopy, HostChunkedCopy, chunk_for, plan_chunks, MAX_CHUNKS

runtime = runtime_fixture(max_kernels=8)
CHUNK = 4096


def test_plans_cover_the_buffer_in_aligned_chunks():
    assert plan_chunks(0, CHUNK) == []
    assert plan_chunks(1, CHUNK) == [(0, 1)]
    assert plan_chunks(CHUNK, CHUNK) == [(0, CHUNK)]
    assert plan_chunks(CHUNK + 4, CHUNK) == [(0, CHUNK), (CHUNK, 4)]
    assert plan_chunks(1000, 100) == [(0, 256), (256, 256), (512, 256), (768, 232)]   # rounded up to CHUNK_ALIGN
    for size in (1, 255, 4096, 10 ** 6 + 4, 3 << 20):
        plan = plan_chunks(size, chunk_for(size))
        assert len(plan) <= MAX_CHUNKS and sum(n for _, n in plan) == size
        assert all(off % CHUNK_ALIGN == 0 for off, _ in plan)
        assert [off for off, _ in plan] == [sum(n for _, n in plan[:i]) for i in range(len(plan))]
    for bad in (-1, 1.5, "4"):
        with pytest.raises(ValueError):
            plan_chunks(bad, CHUNK)
    with pytest.raises(ValueError):
        plan_chunks(16, 0)


def _engines(runtime, kind):
    if kind == "host" and not all(HostCrc.suits(runtime.manager.slot(i)) for i in (0, 1)):
        pytest.skip("the host CRC32 engine is for CPU devices")
    runtime.migration_crc = kind
    life = runtime._lifecycle
    return life.engines.get(0, 1)[1], life.crc(0), life.crc(1)


def _put(runtime, buf, data):
    ctx = runtime._context(buf.slot.index)
    staging = MappedBuffer(buf.slot, -(-data.nbytes // 4) * 4)
    try:
        staging.bytes[:data.nbytes] = data
        ctx.run_once(lambda cmd: vk.vkCmdCopyBuffer(cmd, staging.handle, buf.handle, 1, [
            vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=data.nbytes)]))
    finally:
        staging.destroy()


def _filled_pairs(runtime, sizes, rng, made):
    """(source on GPU 0 filled with random bytes, destination on GPU 1) per size, and
    the bytes; every buffer made is appended to `made` (freed by the caller)."""
    pairs, datas = [], []
    for n in sizes:
        a, b = Buffer(runtime.manager.slot(0), n), Buffer(runtime.manager.slot(1), n)
        made += [a, b]
        data = rng.integers(0, 256, n, dtype=np.uint8)
        _put(runtime, a, data)
        pairs.append((a, b))
        datas.append(data.tobytes())
    return pairs, datas


def _get(runtime, buf):
    ctx = runtime._context(buf.slot.index)
    staging = MappedBuffer(buf.slot, -(-buf.size // 4) * 4)
    try:
        ctx.run_once(lambda cmd: vk.vkCmdCopyBuffer(cmd, buf.handle, staging.handle, 1, [
            vk.VkBufferCopy(srcOffset=0, dstOffset=0, size=buf.size)]))
        return staging.bytes[:buf.size].tobytes()
    finally:
        staging.destroy()


@pytest.mark.parametrize("kind", ["shader", "host"])
def test_the_bytes_arrive_whole_and_every_chunk_matches(runtime, kind):
    eng, src_crc, dst_crc = _engines(runtime, kind)
    sizes = [4, CHUNK, CHUNK + 4, 3 * CHUNK + 260] + ([1, 7] if kind == "host" else [])
    rng = np.random.default_rng(25)
    made = []
    try:
        pairs, datas = _filled_pairs(runtime, sizes, rng, made)
        copy = ChunkedCopy(eng, pairs, src_crc, dst_crc, chunk=CHUNK, names=[f"b{n}" for n in sizes])
        assert [len(p) for p in copy.plans] == [-(-n // CHUNK) for n in sizes]
        copy.submit_landings(60)
        copy.wait(60)
        assert copy.mismatches(60) == []
        assert copy.bytes == sum(sizes)
        # the shader's: a transfer job per buffer, as a raw copy; the host's: one per chunk, hashed as it lands
        assert len(copy.tickets) == (len(sizes) if kind == "shader" else len(copy.chunks))
        for (_, b), data in zip(pairs, datas):
            assert _get(runtime, b) == data
        # the chunks' hashes are zlib's CRC32 of the chunks themselves
        want = copy._src_jobs[0][0].result(60)
        assert want == [zlib.crc32(datas[i][off:off + n]) for i, off, n, _ in copy.chunks]
    finally:
        for buf in made:
            buf.destroy()


def test_a_copy_without_a_check_hashes_nothing(runtime):
    eng, _, _ = _engines(runtime, "shader")
    a, b = Buffer(runtime.manager.slot(0), 2 * CHUNK), Buffer(runtime.manager.slot(1), 2 * CHUNK)
    try:
        _put(runtime, a, np.arange(2 * CHUNK, dtype=np.uint8))
        copy = ChunkedCopy(eng, [(a, b)], chunk=CHUNK)
        copy.wait(60)
        assert copy.jobs == [] and copy.mismatches(60) == []
        assert _get(runtime, b) == np.arange(2 * CHUNK, dtype=np.uint8).tobytes()
    finally:
        a.destroy()
        b.destroy()
    with pytest.raises(ValueError, match="both CRC32 engines"):
        ChunkedCopy(eng, [], runtime._lifecycle.crc(0), None)


@pytest.mark.parametrize("kind", ["shader", "host"])
def test_a_chunk_damaged_on_the_way_is_found_and_named(runtime, kind):
    """One chunk's transfer carries other bytes (its source range shifted): that
    chunk's CRC32s differ, the others match, the error names buffer and range."""
    eng, src_crc, dst_crc = _engines(runtime, kind)
    n = 3 * CHUNK + 8
    a, b = Buffer(runtime.manager.slot(0), n), Buffer(runtime.manager.slot(1), n)

    class Damaging:   # the transfer engine, the second chunk landing with the first's bytes
        def submit(self, *, src_buffer, dst_buffer, size, src_offset=0, dst_offset=0):
            t = eng.submit(src_buffer=src_buffer, dst_buffer=dst_buffer, src_offset=src_offset,
                           dst_offset=dst_offset, size=size)
            if src_offset <= CHUNK < src_offset + size:   # (a job per chunk, or one for the buffer)
                t = eng.submit(src_buffer=src_buffer, dst_buffer=dst_buffer, src_offset=0, dst_offset=CHUNK,
                               size=min(CHUNK, src_offset + size - CHUNK))
            return t
    try:
        _put(runtime, a, np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8))
        copy = ChunkedCopy(Damaging(), [(a, b)], src_crc, dst_crc, chunk=CHUNK, names=["state1"])
        copy.submit_landings(60)
        copy.wait(60)
        bad = copy.mismatches(60)
        assert len(bad) == 1 and bad[0].startswith(f"state1[{CHUNK}:{2 * CHUNK}]")
    finally:
        a.destroy()
        b.destroy()


def test_a_move_checks_its_state_chunk_by_chunk(runtime, monkeypatch):
    """A migration of a kernel whose state spans several chunks: every chunk
    hashed on both devices, the state byte-identical after the move."""
    from vkmulti.kernels import KernelSpec, counter_kernel
    from vkmulti.kernels.lifecycle import chunked_copy
    from vkmulti.kernels.reference import counter_initial_state

    monkeypatch.setattr(chunked_copy, "CHECK_CHUNK_BYTES", CHUNK)
    seen = []
    for cls in (ChunkedCopy, HostChunkedCopy):   # (the host's between two CPU devices)
        def spy(self, *args, real=cls.__init__, **kw):
            real(self, *args, **kw)
            seen.append(self)
        monkeypatch.setattr(cls, "__init__", spy)
    base = counter_kernel(max_sources=8)
    extra = np.random.default_rng(3).integers(0, 256, 5 * CHUNK + 12, dtype=np.uint8)
    spec = KernelSpec("chunky", base.spirv, state_sizes=(base.state_sizes[0], extra.nbytes))
    k = runtime.launch(spec, "k", device=0, state=[counter_initial_state(8), extra])
    r = runtime.migrate(k, 1)
    assert r.checksum_match and k.device_index == 1
    # control block and inbox first, then the state buffers (staging batches would follow)
    assert seen[0].names[:4] == ["control", "inbox", "state0", "state1"]
    assert [len(p) for p in seen[0].plans][:4] == [-(-b.size // CHUNK) for b in (k.control, k.inbox)] + \
        [-(-spec.state_sizes[0] // CHUNK), 6]
    assert np.array_equal(runtime.read_state(k, 1), extra)


def test_the_host_copies_between_cpu_devices_hashing_both_sides(runtime):
    """Two CPU devices: HostChunkedCopy copies by the host, block by block (sizes
    around the block and the chunk), each chunk's two CRC32s zlib's of its bytes."""
    from vkmulti.kernels.lifecycle.host_crc import COPY_BLOCK_BYTES
    _, src_crc, dst_crc = _engines(runtime, "host")
    sizes = [1, 7, CHUNK, CHUNK + 4, COPY_BLOCK_BYTES + 12, 2 * COPY_BLOCK_BYTES]
    rng = np.random.default_rng(26)
    made = []
    try:
        pairs, datas = _filled_pairs(runtime, sizes, rng, made)
        copy = HostChunkedCopy(pairs, src_crc, dst_crc, chunk=3 * CHUNK, names=[f"b{n}" for n in sizes])
        assert [len(p) for p in copy.plans] == [-(-n // (3 * CHUNK)) for n in sizes]
        copy.submit_landings(60)
        copy.wait(60)
        assert copy.mismatches(60) == [] and copy.bytes == sum(sizes)
        for (_, b), data in zip(pairs, datas):
            assert _get(runtime, b) == data
        for i, off, n, job in copy.chunks:
            assert job.result(60) == [zlib.crc32(datas[i][off:off + n])] * 2
        plain = HostChunkedCopy(pairs[:1], src_crc, dst_crc, verify=False)
        plain.wait(60)
        assert plain.mismatches(60) == [] and [j.result(60) for j in plain.jobs] == [[]]
    finally:
        for buf in made:
            buf.destroy()


def test_a_block_damaged_by_the_host_copy_is_found_and_named(runtime, monkeypatch):
    _, src_crc, dst_crc = _engines(runtime, "host")
    n = 3 * CHUNK + 8
    a, b = Buffer(runtime.manager.slot(0), n), Buffer(runtime.manager.slot(1), n)
    real = np.copyto
    calls = []

    def damaging(dst, src, *args, **kw):   # the second chunk lands with one byte flipped
        real(dst, src, *args, **kw)
        calls.append(1)
        if len(calls) == 2:
            dst[5] ^= 0xFF
    try:
        _put(runtime, a, np.random.default_rng(8).integers(0, 256, n, dtype=np.uint8))
        monkeypatch.setattr(np, "copyto", damaging)
        copy = HostChunkedCopy([(a, b)], src_crc, dst_crc, chunk=CHUNK, names=["state1"])
        copy.wait(60)
        monkeypatch.setattr(np, "copyto", real)
        bad = copy.mismatches(60)
        assert len(bad) == 1 and "state1[" in bad[0], bad
    finally:
        a.destroy()
        b.destroy()


def test_host_copy_arguments_are_checked(runtime):
    _, src_crc, dst_crc = _engines(runtime, "host")
    a, b = Buffer(runtime.manager.slot(0), 64), Buffer(runtime.manager.slot(1), 64)
    try:
        with pytest.raises(TypeError, match="HostCrc"):
            src_crc.copy_to(object(), [(a, b, 0, 64)])
        with pytest.raises(TypeError, match="source, destination, offset, size"):
            src_crc.copy_to(dst_crc, [(a, b, 0)])
        with pytest.raises(ValueError, match="within the buffer"):
            src_crc.copy_to(dst_crc, [(a, b, 0, 65)])
        with pytest.raises(ValueError, match="multiple of 4"):
            src_crc.copy_to(dst_crc, [(a, b, 2, 4)])
        with pytest.raises(ValueError, match="given as one of GPU"):
            src_crc.copy_to(dst_crc, [(b, a, 0, 64)])
        with pytest.raises(ValueError, match="cannot be copied whole"):
            HostChunkedCopy([(a, _Sized(32))], src_crc, dst_crc)
        job, = src_crc.copy_to(dst_crc, [(a, b, 0, 64)])   # the engines stay usable
        assert len(job.result(60)) == 2
    finally:
        a.destroy()
        b.destroy()


class _Sized:
    """Not a buffer of the right size: refused before any copy starts."""

    def __init__(self, size):
        self.size = size


class _Queue:
    def __init__(self, handle):
        self.handle = handle

    def __int__(self):
        return self.handle


class _Slot:
    """Queues by handle: graphics 3, universal copy 1, copy 2 (a GPU: three queues),
    or one queue for everything (a CPU device)."""

    def __init__(self, one_queue):
        g, u, c = (1, 1, 1) if one_queue else (3, 1, 2)
        self.graphics_queue, self.universal_copy_queue, self.copy_queue = _Queue(g), _Queue(u), _Queue(c)


def test_whether_a_link_shares_the_step_queue():
    from vkmulti.kernels.engine.device_context import shares_step_queue, step_queue

    gpu, cpu = _Slot(False), _Slot(True)
    assert int(step_queue(gpu)) == 3 and int(step_queue(cpu)) == 1
    assert not shares_step_queue(gpu, "dmabuf") and not shares_step_queue(gpu, "cuda_peer")
    assert shares_step_queue(cpu, "dmabuf") and shares_step_queue(cpu, "cuda_peer")
    two = _Slot(False)
    two.graphics_queue = _Queue(1)   # no graphics queue of its own: steps on the universal one, as CUDA_PEER
    assert shares_step_queue(two, "cuda_peer") and not shares_step_queue(two, "host_shared")


@pytest.mark.parametrize("one_queue", [True, False])
def test_the_landings_hash_waits_for_the_copies_submits_only_on_a_shared_queue(one_queue):
    """The destination's hashes wait on the GPU for the copies' points; the host first
    waits for the copies' submission only where both go to one queue."""
    from types import SimpleNamespace

    from vkmulti.kernels.lifecycle.chunked_copy import ChunkedCopy

    calls = []

    class Ticket:
        def __init__(self, n):
            self.dst_ready = SimpleNamespace(semaphore=7, value=n)

        def wait_submitted(self, timeout):
            calls.append(("wait_submitted", self.dst_ready.value))

    class Eng:
        method = "dmabuf"

        def __init__(self):
            self.n = 0

        def submit(self, **kw):
            self.n += 1
            return Ticket(self.n)

    class Crc:
        kind = "shader"

        def __init__(self):
            self.ctx = SimpleNamespace(slot=_Slot(one_queue))

        def submit(self, ranges, waits=()):
            calls.append(("hash", [p.value for p in waits]))
            return SimpleNamespace(close=lambda timeout: None)

    copy = ChunkedCopy(Eng(), [(_Sized(64), _Sized(64)), (_Sized(128), _Sized(128))], Crc(), Crc())
    calls.clear()
    copy.submit_landings(5.0)
    assert calls == ([("wait_submitted", 2)] if one_queue else []) + [("hash", [2])]
