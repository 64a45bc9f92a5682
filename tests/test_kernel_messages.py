"""Kernel messages without a device: the envelope layout, the hybrid logical
clock, K2KMessage and KernelSpec validation, and the kernel shaders' sources."""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vkmulti.kernels import HlcTimestamp, HybridLogicalClock, K2KMessage, KernelSpec, MessageEnvelope
from vkmulti.kernels.messages import ENVELOPE_BYTES, check_payload_size, slot_bytes

REPO = Path(__file__).resolve().parent.parent
SHADERS = REPO / "native" / "shaders"
U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)


def test_envelope_is_twelve_words_in_the_documented_order():
    env = MessageEnvelope(1, 2, 3 + (4 << 32), HlcTimestamp(5 + (6 << 32), 7), 8, 9, 10, 11, 12)
    assert ENVELOPE_BYTES == 48
    assert struct.unpack("<12I", env.pack()) == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)


@given(U32, U32, U64, U64, U32, U32, U32, U32, U32, U32)
def test_envelope_round_trips(src, dst, seq, phys, logical, length, tag, tenant, hops, flags):
    env = MessageEnvelope(src, dst, seq, HlcTimestamp(phys, logical), length, tag, tenant, hops, flags)
    assert MessageEnvelope.unpack(env.pack()) == env


def test_payload_size_rules():
    assert check_payload_size(256) == 256
    assert slot_bytes(256) == 304
    for bad in (0, 8, 24, 1 << 17, -16):
        with pytest.raises(ValueError, match="payload_size"):
            check_payload_size(bad)
    for bad in (256.0, "256", True):
        with pytest.raises(TypeError):
            check_payload_size(bad)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000

    def __call__(self) -> int:
        return self.now


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(["tick", "recv", "advance", "back"]), st.integers(0, 3000),
                          st.integers(0, 5)), max_size=40))
def test_hlc_is_monotonic_and_causal(events):
    clock = FakeClock()
    hlc = HybridLogicalClock(clock)
    last = hlc.current
    for kind, a, b in events:
        if kind == "advance":
            clock.now += a
            continue
        if kind == "back":   # physical time may step backwards: the HLC never does
            clock.now = max(0, clock.now - a)
            continue
        if kind == "tick":
            ts = hlc.tick()
        else:
            seen = HlcTimestamp(a, b)
            ts = hlc.update(seen)
            assert ts > seen
        assert ts > last
        assert ts.physical_us >= clock.now   # never behind physical time
        last = ts


def test_hlc_bad_input():
    with pytest.raises(TypeError):
        HybridLogicalClock(5)
    with pytest.raises(TypeError):
        HybridLogicalClock().update((1, 2))
    for bad in (-1, 2**64, 1.5, True):
        with pytest.raises(ValueError, match="physical_us"):
            HlcTimestamp(bad)
    with pytest.raises(ValueError, match="logical"):
        HlcTimestamp(0, 2**32)


def test_k2k_message_validation():
    m = K2KMessage("a", "b", bytearray(b"xyz"), tag=3)
    assert m.payload == b"xyz" and m.payload_len == 3 and m.id == ("a", "b", 0)
    assert list(m.payload_words()) == [int.from_bytes(b"xyz\0", "little")]
    with pytest.raises(TypeError, match="source_kernel"):
        K2KMessage(1, "b")
    with pytest.raises(TypeError, match="payload"):
        K2KMessage("a", "b", 5)
    with pytest.raises(ValueError, match="tag"):
        K2KMessage("a", "b", tag=-1)
    with pytest.raises(ValueError, match="priority"):
        K2KMessage("a", "b", priority=256)
    with pytest.raises(TypeError, match="timestamp"):
        K2KMessage("a", "b", timestamp=(1, 2))


def _spirv() -> bytes:
    return (REPO / "src" / "vkmulti" / "shaders" / "kernel_counter.comp.spv").read_bytes()


def test_kernel_spec_validation():
    code = _spirv()
    spec = KernelSpec("k", code, state_sizes=[64, 128])
    assert spec.state_sizes == (64, 128) and spec.sha256 == hashlib.sha256(code).hexdigest()
    with pytest.raises(ValueError, match="magic"):
        KernelSpec("k", b"\0" * 20)
    with pytest.raises(ValueError, match="not a SPIR-V module"):
        KernelSpec("k", code[:-2])
    with pytest.raises(TypeError, match="spirv"):
        KernelSpec("k", 12)
    with pytest.raises(TypeError, match="kernel_type"):
        KernelSpec("", code)
    with pytest.raises(ValueError, match="multiple of 4"):
        KernelSpec("k", code, state_sizes=(6,))
    with pytest.raises(ValueError, match="state_sizes"):
        KernelSpec("k", code, state_sizes=(0,))
    with pytest.raises(ValueError, match="1 to 16"):
        KernelSpec("k", code, state_sizes=())
    with pytest.raises(ValueError, match="inbox_capacity"):
        KernelSpec("k", code, inbox_capacity=0)
    with pytest.raises(ValueError, match="outbox_capacity"):
        KernelSpec("k", code, outbox_capacity=1 << 20)
    with pytest.raises(ValueError, match="groups"):
        KernelSpec("k", code, groups=(1, 1))
    with pytest.raises(ValueError, match="groups"):
        KernelSpec("k", code, groups=(1, 0, 1))


def test_kernel_shaders_and_their_include_are_in_the_manifest():
    """The kernel GLSL sources and the ABI header they #include are tied to the committed SPIR-V."""
    m = json.loads((SHADERS / "spirv-manifest.json").read_text())
    for name in ("kernel_finish.comp", "kernel_deliver.comp", "kernel_survey.comp", "kernel_counter.comp",
                 "kernel_pingpong.comp", "kernel_stencil.comp", "kernel_burst.comp"):
        assert name in m["shaders"]
    assert m["includes"], "no includes recorded"
    for name, digest in m["includes"].items():
        assert hashlib.sha256((SHADERS / name).read_bytes()).hexdigest() == digest, (
            f"{name} changed since the SPIR-V was built: run python native/shaders/build_spirv.py")
