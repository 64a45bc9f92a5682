"""`launch(state=...)` with an entry shorter than its state buffer (issue 23, smaller
items): zero-padded to the buffer's size, as docs/reference/kernels.md says; longer is a
ValueError."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernel_support import runtime_fixture
from vkmulti.kernels import KernelSpec, pingpong_kernel

runtime = runtime_fixture(max_kernels=8)
DOCS = Path(__file__).resolve().parent.parent / "docs" / "reference" / "kernels.md"


def test_the_padding_is_documented():
    text = " ".join(DOCS.read_text().split())
    assert "an entry shorter than its buffer is zero-padded to the buffer's size" in text
    assert "an entry longer than its buffer is a `ValueError`" in text


def test_a_short_state_is_zero_padded(runtime):
    spec = KernelSpec("pp", pingpong_kernel().spirv, state_sizes=(16, 8))
    k = runtime.launch(spec, device=0, state=[b"\x07\0\0"])
    assert runtime.read_state(k, 0).tobytes() == b"\x07" + bytes(15)
    assert runtime.read_state(k, 1).tobytes() == bytes(8)
    with pytest.raises(ValueError, match=r"state\[0\] holds 17 bytes; the state buffer has 16"):
        runtime.launch(spec, device=0, state=[bytes(17)])
    with pytest.raises(ValueError, match="3 initial states for 2 state buffers"):
        runtime.launch(spec, device=0, state=[b"", b"", b""])
    assert len(list(runtime.kernels)) == 1
