"""A GPU-to-GPU copy of buffers in chunks whose CRC32 is computed as each lands.

A move's check compares the CRC32 of what left the source with the CRC32 of
what arrived. Hashing the destination after the whole copy puts one full pass
over the bytes behind the copy on the move's path; here each buffer is cut
into chunks (`plan_chunks`), each chunk is its own transfer job, and the
destination's hash of a chunk is queued behind that chunk's landing (its
timeline point: the host engine's thread or the device waits, not the
caller), so chunk i is hashed while chunk i+1 is copied and only the last
chunk's hash follows the copy. The source's hashes (its bytes no longer
change: the kernel is quiesced) run meanwhile. Both sides hash the very same
ranges and `mismatches()` names the buffer and chunk that differ.

The CRC32 engines are those of `Lifecycle.crc(device)`: the host engine
(host_crc.py) hashes a chunk as soon as its point is reached; the GPU shader's
(gpu_crc.py) job for a chunk is submitted once that chunk's copy is submitted
(`hash_landings`: an in-order queue cannot run a wait placed before its
signal), which the caller does when no step is queued behind it.

Between two CPU devices (lavapipe: both engines are the host's, HostCrc) the
host copies the chunks itself (`HostChunkedCopy`, same surface): the two
devices' memory is the host's, so a chunk is copied and hashed on both sides
block by block while the block is in cache, by the pool's threads side by
side, instead of the device copy and two more passes over memory.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..._core.checks import is_int

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
        raise ValueError(f"size must be a non-negative int, got {size!r}"[:120])
    if not is_int(chunk) or chunk < 1:
        raise ValueError(f"chunk must be a positive int, got {chunk!r}"[:120])
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
    construction; so are the source's hashes and, for the host engine, the
    destination's."""

    def __init__(self, eng: Any, pairs: Sequence[tuple[Any, Any]], src_crc: Any = None, dst_crc: Any = None,
                 chunk: int | None = None, names: Sequence[str] | None = None):
        if (src_crc is None) != (dst_crc is None):
            raise ValueError("pass both CRC32 engines (a check) or neither (a copy only)")
        self.pairs = list(pairs)
        for a, b in self.pairs:
            if a.size != b.size:
                raise ValueError(f"a {a.size}-byte buffer cannot be copied whole into a {b.size}-byte one")
        self.names = list(names) if names is not None else [f"buffer{i}" for i in range(len(self.pairs))]
        self.plans = [plan_chunks(a.size, chunk_for(a.size) if chunk is None else chunk) for a, _ in self.pairs]
        self.verify = src_crc is not None
        self._src_crc, self._dst_crc = src_crc, dst_crc
        #: (pair index, offset, bytes, ticket) per chunk, in copy order
        self.chunks: list[tuple[int, int, int, Any]] = []
        self.jobs: list[Any] = []        # every CRC job made (closed on failure)
        self._src_job: Any = None
        self._dst_jobs: list[Any] = []   # one per chunk, in order
        try:
            early = self.verify and getattr(dst_crc, "kind", "shader") == "host"
            for i, ((a, b), plan) in enumerate(zip(self.pairs, self.plans)):
                for off, n in plan:
                    t = eng.submit(src_buffer=a, dst_buffer=b, src_offset=off, dst_offset=off, size=n)
                    self.chunks.append((i, off, n, t))
                    if early:   # hashed by a host thread as soon as the chunk's point is reached
                        self._hash_landing(b, off, n, t)
            if self.verify:   # the source's bytes no longer change: hashed while the copies run
                self._src_job = src_crc.submit([(self.pairs[i][0], off, n) for i, off, n, _ in self.chunks])
                self.jobs.append(self._src_job)
        except BaseException:
            self.close(_CLOSE_TIMEOUT)
            raise

    @property
    def tickets(self) -> list[Any]:
        """The transfer tickets of the chunks, in copy order."""
        return [t for *_, t in self.chunks]

    @property
    def bytes(self) -> int:
        return sum(n for _, _, n, _ in self.chunks)

    def _hash_landing(self, dst: Any, off: int, n: int, ticket: Any) -> None:
        job = self._dst_crc.submit([(dst, off, n)], [ticket.dst_ready])
        self.jobs.append(job)
        self._dst_jobs.append(job)

    def hash_landings(self, timeout: float) -> None:
        """Queue the destination's hashes not queued yet (the GPU shader's: each after its
        chunk's copy is submitted, then ordered behind its landing on the device)."""
        if not self.verify or len(self._dst_jobs) == len(self.chunks):
            return
        for i, off, n, t in self.chunks[len(self._dst_jobs):]:
            t.wait_submitted(timeout)
            self._hash_landing(self.pairs[i][1], off, n, t)

    def wait(self, timeout: float) -> None:
        """Wait until every chunk has landed."""
        for t in self.tickets:
            t.wait(timeout)

    def mismatches(self, timeout: float) -> list[str]:
        """The chunks whose CRC32 differs on the two sides ('name[offset:end]'), [] when
        all match; waits for the hashes (hash_landings() first for a shader)."""
        if not self.verify:
            return []
        self.hash_landings(timeout)
        want = self._src_job.result(timeout)
        got = [job.result(timeout)[0] for job in self._dst_jobs]
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

    def hash_landings(self, timeout: float) -> None:
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
