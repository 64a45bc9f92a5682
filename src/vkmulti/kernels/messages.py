"""Kernel messages: the envelope every message slot starts with, the hybrid
logical clock that orders them, and `K2KMessage`, the host's view of one.

A message slot in device memory is a 48-byte envelope (12 little-endian
32-bit words, `ENVELOPE`) followed by the payload; the payload size is fixed
per runtime (default 256 bytes). The layout is the kernel ABI of
native/shaders/vkm_kernel_abi.glsl and docs/reference/kernels.md.
"""
from __future__ import annotations

import struct
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .._core.checks import is_int, short_repr
from .._core.reprs import compact_repr

if TYPE_CHECKING:
    from .._core.protocols import HostData

__all__ = ["HOST_ADDRESS", "HOST_KERNEL_ID", "DEFAULT_PAYLOAD_SIZE", "ENVELOPE", "ENVELOPE_BYTES",
           "RING_HEADER_BYTES", "HlcTimestamp", "HybridLogicalClock", "MessageEnvelope", "K2KMessage",
           "check_payload_size", "slot_bytes"]

#: The address of the host: messages to it go to the host receive queue.
HOST_ADDRESS = 0
#: The kernel id the host sends as, and the id of messages a kernel sends to the host.
HOST_KERNEL_ID = "host"
DEFAULT_PAYLOAD_SIZE = 256
#: source, dest, sequence (u64), HLC physical us (u64), HLC logical, payload length, tag, tenant, hops, flags
ENVELOPE = struct.Struct("<IIQQIIIIII")
ENVELOPE_BYTES = ENVELOPE.size
ENV_WORDS = ENVELOPE_BYTES // 4
#: Ring and batch buffers start with a 16-word header.
RING_HEADER_BYTES = 64
FLAG_DELIVERED = 1
_PRIORITY_SHIFT = 8
MAX_PAYLOAD_SIZE = 1 << 16
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1


def check_payload_size(size: Any) -> int:
    """A valid payload size: an int multiple of 16 in [16, 65536]."""
    if not is_int(size):
        raise TypeError(f"payload_size must be an int, got {type(size).__name__}")
    if not 16 <= size <= MAX_PAYLOAD_SIZE or size % 16:
        raise ValueError(f"payload_size must be a multiple of 16 in [16, {MAX_PAYLOAD_SIZE}], got {short_repr(size)}")
    return size


def slot_bytes(payload_size: int) -> int:
    """Bytes of one message slot: envelope plus payload."""
    return ENVELOPE_BYTES + payload_size


@dataclass(frozen=True, order=True)
class HlcTimestamp:
    """A hybrid logical clock reading: physical microseconds since the epoch,
    then a logical counter that orders events within one microsecond."""

    __repr__ = compact_repr
    physical_us: int
    logical: int = 0

    def __post_init__(self) -> None:
        for label, v, top in (("physical_us", self.physical_us, _U64), ("logical", self.logical, _U32)):
            if not is_int(v) or not 0 <= v <= top:
                raise ValueError(f"HlcTimestamp.{label} must be an int in [0, {top}], got {short_repr(v)}")

    @classmethod
    def zero(cls) -> "HlcTimestamp":
        """The timestamp before every other (0, 0)."""
        return cls(0, 0)

    @classmethod
    def from_words(cls, low: int, high: int, logical: int) -> "HlcTimestamp":
        """The timestamp a kernel wrote as three u32 words (physical low and high
        words, logical): in range by construction, so made without the check (a
        harvest makes one per kernel step)."""
        ts = _new(cls)
        fields = ts.__dict__
        fields["physical_us"], fields["logical"] = low | high << 32, logical
        return ts


_new = object.__new__


def _now_us() -> int:
    return time.time_ns() // 1000


class HybridLogicalClock:
    """The host's HLC (thread-safe). `tick()` is a local or send event, `update(ts)`
    a receive event: the result is later than both the clock and `ts`, so
    timestamps respect causality across kernels and the host."""

    def __init__(self, clock: Callable[[], int] = _now_us):
        if not callable(clock):
            raise TypeError(f"clock must be callable (returning microseconds), got {type(clock).__name__}")
        self._clock = clock
        self._lock = threading.Lock()
        self._last = HlcTimestamp(0, 0)

    @property
    def current(self) -> HlcTimestamp:
        """The latest timestamp handed out or seen."""
        return self._last

    def tick(self) -> HlcTimestamp:
        """A new timestamp for a local event or a send, after every one given before."""
        with self._lock:
            now = int(self._clock())
            last = self._last
            self._last = HlcTimestamp(now, 0) if now > last.physical_us else \
                HlcTimestamp(last.physical_us, last.logical + 1)
            return self._last

    def update(self, seen: HlcTimestamp) -> HlcTimestamp:
        """Merge a timestamp seen on a received message; returns one after both."""
        if not isinstance(seen, HlcTimestamp):
            raise TypeError(f"update() takes an HlcTimestamp, got {type(seen).__name__}")
        with self._lock:
            now = int(self._clock())
            last = self._last
            p = max(now, last.physical_us, seen.physical_us)
            if p == last.physical_us and p == seen.physical_us:
                logical = max(last.logical, seen.logical) + 1
            elif p == last.physical_us:
                logical = last.logical + 1
            elif p == seen.physical_us:
                logical = seen.logical + 1
            else:
                logical = 0
            self._last = HlcTimestamp(p, logical)
            return self._last


@dataclass(frozen=True)
class MessageEnvelope:
    """The 48-byte header of a message slot, by kernel address (0 = host)."""

    __repr__ = compact_repr

    source_address: int
    dest_address: int
    sequence: int
    timestamp: HlcTimestamp
    payload_len: int
    tag: int = 0
    tenant: int = 0
    hops: int = 0
    flags: int = 0

    def pack(self) -> bytes:
        """The envelope as the bytes of a slot header (native/shaders/vkm_kernel_abi.glsl)."""
        return ENVELOPE.pack(self.source_address, self.dest_address, self.sequence, self.timestamp.physical_us,
                             self.timestamp.logical, self.payload_len, self.tag, self.tenant, self.hops, self.flags)

    @classmethod
    def unpack(cls, data: HostData) -> "MessageEnvelope":
        """The envelope packed at the start of `data`."""
        src, dst, seq, phys, logical, length, tag, tenant, hops, flags = ENVELOPE.unpack_from(data)  # type: ignore[arg-type]
        return cls(src, dst, seq, HlcTimestamp(phys, logical), length, tag, tenant, hops, flags)

    @property
    def priority(self) -> int:
        """The message's priority (flags bits 8-15)."""
        return (self.flags >> _PRIORITY_SHIFT) & 0xFF


@dataclass(frozen=True)
class K2KMessage:
    """One message as the host sees it: who sent it to whom, its place in that
    pair's order (`sequence`, from 0), its HLC `timestamp` and its payload.

    Built by hand it is a message to send (`KernelRuntime.send` fills the
    sequence and timestamp); received ones carry all fields.
    """

    __repr__ = compact_repr

    source_kernel: str
    dest_kernel: str
    payload: bytes = b""
    tag: int = 0
    sequence: int = 0
    timestamp: HlcTimestamp = field(default_factory=HlcTimestamp.zero)
    tenant: int = 0
    hops: int = 0
    priority: int = 0

    def __post_init__(self) -> None:
        for label in ("source_kernel", "dest_kernel"):
            if not isinstance(getattr(self, label), str):
                raise TypeError(f"K2KMessage.{label} must be a str (a kernel id), "
                                f"got {type(getattr(self, label)).__name__}")
        if not isinstance(self.payload, bytes):
            try:
                object.__setattr__(self, "payload", memoryview(self.payload).tobytes())
            except TypeError:
                raise TypeError(f"K2KMessage.payload must be bytes or a buffer-protocol object, "
                                f"got {type(self.payload).__name__}") from None
        for label, top in (("tag", _U32), ("tenant", _U32), ("hops", _U32), ("sequence", _U64), ("priority", 255)):
            v = getattr(self, label)
            if not is_int(v) or not 0 <= v <= top:
                raise ValueError(f"K2KMessage.{label} must be an int in [0, {top}], got {short_repr(v)}")
        if not isinstance(self.timestamp, HlcTimestamp):
            raise TypeError(f"K2KMessage.timestamp must be an HlcTimestamp, got {type(self.timestamp).__name__}")

    @property
    def id(self) -> tuple[str, str, int]:
        """(source, destination, sequence): unique per message of a runtime."""
        return (self.source_kernel, self.dest_kernel, self.sequence)

    @property
    def payload_len(self) -> int:
        """Payload bytes."""
        return len(self.payload)

    def payload_words(self) -> np.ndarray:
        """The payload as little-endian uint32 words (zero-padded to a whole word)."""
        pad = (-len(self.payload)) % 4
        return np.frombuffer(self.payload + b"\0" * pad, dtype="<u4")

    def envelope(self, source_address: int, dest_address: int) -> MessageEnvelope:
        """The message's envelope between the given kernel addresses (what a slot's header holds)."""
        return MessageEnvelope(source_address, dest_address, self.sequence, self.timestamp, len(self.payload),
                               self.tag, self.tenant, self.hops, self.priority << _PRIORITY_SHIFT)
