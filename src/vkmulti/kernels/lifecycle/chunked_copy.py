"""A GPU-to-GPU copy of buffers in chunks, each chunk's CRC32 checked on both sides.

A move's check compares the CRC32 of what left the source with the CRC32 of
what arrived, chunk by chunk: each buffer is cut into chunks (`plan_chunks`),
both sides hash the very same ranges, so `mismatches()` names the buffer and
chunk that differ. With the GPU shader's engine (or no check) a buffer is one
transfer job (the link cuts it for its ring, as a raw copy); with the host
engine each chunk is its own, hashed as it lands. The source's hashes
(its bytes no longer change: the kernel is quiesced) run meanwhile, as one
job per group of buffers (`follow()` appends a move's staging batches at the
switch, where messages were staged).

The CRC32 engines are those of `Lifecycle.crc(device)`: the host engine
(host_crc.py) hashes a chunk as soon as its timeline point is reached (a host
thread waits, not the caller); the GPU shader's (gpu_crc.py) destination
hashes are one job for every chunk (`submit_landings`), whose waits are the
chunks' landing points: the device orders it behind the copies. Where the
copies land on the queue the job goes to (a device with one queue), the host
first waits for the last chunk's submission (an in-order queue cannot run a
wait placed before its signal; a link's worker takes jobs in order), which
the caller does when no step is queued behind it; on a GPU, whose copies
run on its copy queue, the job is queued at once. A move makes the same
number of GPU submits and host waits whatever its chunk count: on a GPU each
more would cost as much as a chunk's copy.

Between two CPU devices (lavapipe: both engines are the host's, HostCrc) the
host copies the chunks itself (`HostChunkedCopy`, same surface): the two
devices' memory is the host's, so a chunk is copied and hashed on both sides
block by block while the block is in cache, by the pool's threads side by
side, instead of the device copy and two more passes over memory.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..._core.checks import is_int, short_repr
from ..engine.device_context import shares_step_queue

__all__ = ["ChunkedCopy", "HostChunkedCopy", "chunked_copy", "plan_chunks", "chunk_for", "CHECK_CHUNK_BYTES", "MAX_CHUNKS", "CHUNK_ALIGN"]

#: The bytes of one checked chunk: small enough that the last chunk's hash is a
#: small part of the copy, large enough that a chunk's own job costs little
#: beside its bytes (16 MiB of state: 4 jobs).
CHECK_CHUNK_BYTES = 4 << 20
#: A buffer is cut into at most this many chunks (larger ones get larger chunks).
MAX_CHUNKS = 16
#: Chunk boundaries fall on multiples of this (the CRC ranges need offsets that
#: are multiples of 4; copies run best on whole cache lines).
CHUNK_ALIGN = 256
_CLOSE_TIMEOUT = 30.0


def plan_chunks(size: int, chunk: int = CHECK_CHUNK_BYTES) -> list[tuple[int, int]]:
    """[(offset, bytes)] covering [0, size) in chunks of `chunk` bytes (rounded up to
    CHUNK_ALIGN), the last one shorter; [] for size 0."""
    if not is_int(size) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {short_repr(size)}")
    if not is_int(chunk) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {short_repr(chunk)}")
    chunk = -(-chunk // CHUNK_ALIGN) * CHUNK_ALIGN
    return [(at, min(chunk, size - at)) for at in range(0, size, chunk)]


def chunk_for(size: int) -> int:
    """The chunk a buffer of `size` bytes is checked in: CHECK_CHUNK_BYTES, or larger
    so that there are at most MAX_CHUNKS."""
    return max(CHECK_CHUNK_BYTES, -(-size // MAX_CHUNKS))


class ChunkedCopy:
    """Buffers copied from one device to another in chunks (see the module docstring).

    `eng`: the pair's CrossDeviceTransfer; `pairs`: (source buffer, destination
    buffer) of equal sizes; `src_crc`, `dst_crc`: the CRC32 engines of the two
    devices (None for both: copy only, no check); `chunk`: the chunk's bytes
    (None: chunk_for each buffer's size). The copies are queued at
    construction; so are the source's hashes (one job) and, for the host
    engine, the destination's. `follow()` appends more buffers to the move;
    `submit_landings()` queues the GPU shader's destination hashes, all of
    them as one job. A move makes the same number of CRC32 submits and host
    waits whatever its chunk count."""

    def __init__(self, eng: Any, pairs: Sequence[tuple[Any, Any]], src_crc: Any = None, dst_crc: Any = None,
                 chunk: int | None = None, names: Sequence[str] | None = None):
        if (src_crc is None) != (dst_crc is None):
            raise ValueError("pass both CRC32 engines (a check) or neither (a copy only)")
        self._eng, self._chunk = eng, chunk
        self.verify = src_crc is not None
        self._src_crc, self._dst_crc = src_crc, dst_crc
        self._early = self.verify and getattr(dst_crc, "kind", "shader") == "host"
        self.pairs: list[tuple[Any, Any]] = []
        self.names: list[str] = []
        self.plans: list[list[tuple[int, int]]] = []
        #: (pair index, offset, bytes, ticket) per chunk, in copy order
        self.chunks: list[tuple[int, int, int, Any]] = []
        self.jobs: list[Any] = []        # every CRC job made (closed on failure)
        #: the source's jobs, each with the number of chunks it hashes (in order)
        self._src_jobs: list[tuple[Any, int]] = []
        #: the destination's, likewise: one per chunk (the host's), or one for every chunk (the shader's)
        self._dst_jobs: list[tuple[Any, int]] = []
        try:
            self.follow(pairs, names)
        except BaseException:
            self.close(_CLOSE_TIMEOUT)
            raise

    def follow(self, pairs: Sequence[tuple[Any, Any]], names: Sequence[str] | None = None) -> None:
        """Append `pairs` to the move: their copies queued behind those already queued
        (same transfer engine: its jobs run in order), the source's hash of them
        as one more job (their bytes must not change from now on), the host
        engine's destination hashes behind each chunk's landing."""
        pairs = list(pairs)
        for a, b in pairs:
            if a.size != b.size:
                raise ValueError(f"a {a.size}-byte buffer cannot be copied whole into a {b.size}-byte one")
        names = list(names) if names is not None else [f"buffer{i}" for i in range(len(self.pairs),
                                                                                  len(self.pairs) + len(pairs))]
        if len(names) != len(pairs):
            raise ValueError(f"{len(names)} name(s) for {len(pairs)} buffer pair(s)")
        first_pair, first_chunk = len(self.pairs), len(self.chunks)
        self.pairs += pairs
        self.names += names
        plans = [plan_chunks(a.size, chunk_for(a.size) if self._chunk is None else self._chunk) for a, _ in pairs]
        self.plans += plans
        for i, ((a, b), plan) in enumerate(zip(pairs, plans), first_pair):
            if not self._early and plan:   # one job for the buffer (the link cuts it for its ring)
                t = self._eng.submit(src_buffer=a, dst_buffer=b, size=a.size)
                self.chunks += [(i, off, n, t) for off, n in plan]
                continue
            for off, n in plan:   # a job per chunk, hashed by a host thread as soon as its point is reached
                t = self._eng.submit(src_buffer=a, dst_buffer=b, src_offset=off, dst_offset=off, size=n)
                self.chunks.append((i, off, n, t))
                job = self._dst_crc.submit([(b, off, n)], [t.dst_ready])
                self.jobs.append(job)
                self._dst_jobs.append((job, 1))
        added = self.chunks[first_chunk:]
        if self.verify and added:   # the source's bytes no longer change: hashed while the copies run
            job = self._src_crc.submit([(self.pairs[i][0], off, n) for i, off, n, _ in added])
            self.jobs.append(job)
            self._src_jobs.append((job, len(added)))

    @property
    def tickets(self) -> list[Any]:
        """The transfer tickets, in copy order (one per buffer, or per chunk for the host engine)."""
        out: list[Any] = []
        for *_, t in self.chunks:
            if not out or out[-1] is not t:
                out.append(t)
        return out

    @property
    def bytes(self) -> int:
        return sum(n for _, _, n, _ in self.chunks)

    def _hashed(self) -> int:
        return sum(n for _, n in self._dst_jobs)

    def _lasts(self, tickets: Sequence[Any]) -> list[Any]:
        """The last ticket of each transfer link among `tickets` (keyed by its destination
        timeline): a link's worker submits its jobs in order, its timeline only grows."""
        last: dict[int, Any] = {}
        for t in tickets:
            last[t.dst_ready.semaphore] = t
        return list(last.values())

    def submit_landings(self, timeout: float) -> None:
        """Queue the destination's hashes not queued yet (the GPU shader's) as one job
        whose waits are the chunks' landing points. Its submit waits on its own
        queue, which a single-queue device shares with the copies: their GPU work
        is submitted first (the last chunk's of each link: the worker takes jobs in
        order)."""
        if not self.verify or self._hashed() == len(self.chunks):
            return
        todo = self.chunks[self._hashed():]
        lasts = self._lasts([t for *_, t in todo])   # (a link's jobs land in order: its last one, last)
        if self._landings_share_queue():
            for t in lasts:
                t.wait_submitted(timeout)
        job = self._dst_crc.submit([(self.pairs[i][1], off, n) for i, off, n, _ in todo],
                                   [t.dst_ready for t in lasts])
        self.jobs.append(job)
        self._dst_jobs.append((job, len(todo)))

    def _landings_share_queue(self) -> bool:
        """Whether the destination's hashes go to the queue the copies land on (a device
        with one queue): then they are submitted after the copies' own submits; on
        another queue (a GPU's copy queue) at once, their waits holding them back on
        the GPU (a failed link signals its points: nothing waits for good)."""
        ctx = getattr(self._dst_crc, "ctx", None)
        return ctx is None or shares_step_queue(ctx.slot, getattr(self._eng, "method", None))

    def wait(self, timeout: float) -> None:
        """Wait until every chunk has landed: one wait per link (its last chunk), then
        each ticket asked without blocking (a failed job raises its error)."""
        tickets = self.tickets
        for t in self._lasts(tickets):
            t.wait(timeout)
        for t in tickets:
            if not t.done():
                t.wait(timeout)

    def mismatches(self, timeout: float) -> list[str]:
        """The chunks whose CRC32 differs on the two sides ('name[offset:end]'), [] when
        all match; waits for the hashes (submit_landings() first for a shader)."""
        if not self.verify:
            return []
        self.submit_landings(timeout)
        got = [v for job, _ in self._dst_jobs for v in job.result(timeout)]
        want = [v for job, _ in self._src_jobs for v in job.result(timeout)]
        return [f"{self.names[i]}[{off}:{off + n}] (source {w:#010x}, destination {g:#010x})"
                for (i, off, n, _), w, g in zip(self.chunks, want, got) if w != g]

    def close(self, timeout: float) -> None:
        """Let go of the CRC jobs once nothing reads the buffers (after a failure)."""
        for job in self.jobs:
            job.close(timeout)


class HostChunkedCopy:
    """Buffers of one CPU device copied by the host into those of another, chunk by
    chunk, each chunk hashed on both sides by the pass that copies it (see the
    module docstring). `src_crc`, `dst_crc`: the two devices' HostCrc engines;
    `verify`: hash (True) or copy only. Same surface as ChunkedCopy: the copies
    are queued at construction, `tickets` wait for them, `mismatches()` compares."""

    def __init__(self, pairs: Sequence[tuple[Any, Any]], src_crc: Any, dst_crc: Any, verify: bool = True,
                 chunk: int | None = None, names: Sequence[str] | None = None):
        self.pairs = list(pairs)
        for a, b in self.pairs:
            if a.size != b.size:
                raise ValueError(f"a {a.size}-byte buffer cannot be copied whole into a {b.size}-byte one")
        self.names = list(names) if names is not None else [f"buffer{i}" for i in range(len(self.pairs))]
        self.verify = bool(verify)
        self.plans = [plan_chunks(a.size, chunk_for(a.size) if chunk is None else chunk) for a, _ in self.pairs]
        ranges = [(i, off, n) for i, plan in enumerate(self.plans) for off, n in plan]
        self.jobs = src_crc.copy_to(dst_crc, [(self.pairs[i][0], self.pairs[i][1], off, n) for i, off, n in ranges],
                                    hash=self.verify)
        #: (pair index, offset, bytes, job) per chunk, in copy order
        self.chunks = [(i, off, n, job) for (i, off, n), job in zip(ranges, self.jobs)]

    @property
    def tickets(self) -> list[Any]:
        return list(self.jobs)

    @property
    def bytes(self) -> int:
        return sum(n for _, _, n, _ in self.chunks)

    def submit_landings(self, timeout: float) -> None:
        """Nothing to queue: each chunk's pass hashes both sides."""

    def wait(self, timeout: float) -> None:
        for job in self.jobs:
            job.wait(timeout)

    def mismatches(self, timeout: float) -> list[str]:
        if not self.verify:
            return []
        out = []
        for i, off, n, job in self.chunks:
            want, got = job.result(timeout)
            if want != got:
                out.append(f"{self.names[i]}[{off}:{off + n}] (source {want:#010x}, destination {got:#010x})")
        return out

    def close(self, timeout: float) -> None:
        for job in self.jobs:
            job.close(timeout)


def chunked_copy(eng: Any, pairs: Sequence[tuple[Any, Any]], src_crc: Any, dst_crc: Any, verify: bool,
                 names: Sequence[str] | None = None) -> ChunkedCopy | HostChunkedCopy:
    """The chunked copy for a move: by the host where both engines are the host's
    (two CPU devices), else by the pair's transfer engine `eng` (checked with the
    engines where `verify`)."""
    if getattr(src_crc, "kind", None) == "host" and getattr(dst_crc, "kind", None) == "host":
        return HostChunkedCopy(pairs, src_crc, dst_crc, verify, names=names)
    if not verify:
        src_crc = dst_crc = None
    return ChunkedCopy(eng, pairs, src_crc, dst_crc, names=names)
