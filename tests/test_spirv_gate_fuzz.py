"""The SPIR-V gate under fuzzing (issue 23, "In CI"): a fixed seed, a few thousand
mutated kernel modules (bit flips, words set to edge values, truncations,
instruction word counts changed) of the counter and ping-pong kernels.

Each case goes through the gate (no driver involved): it is either refused with
KernelValidationError or passed, nothing else. Every case the gate passes is
then launched on the virtual pair's driver (pipeline built, kernel destroyed)
in a child process, so a module that crashes the driver fails its case
instead of pytest: the child reports each case, and the parent starts a new
child after the one a crash ended. Bounded to about a minute on the CPU VM.
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from vkmulti import KernelValidationError
from vkmulti.kernels import counter_kernel, pingpong_kernel
from vkmulti.kernels.engine.device_context import KERNEL_PUSH
from vkmulti.kernels.engine.spirv_gate import SpirvGate

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 23
CASES = 4000
#: Gate-passed cases launched on the driver (each builds a pipeline: ~50 ms on lavapipe).
DRIVER_CASES = 200
ENV = "vulkan1.3"


def _bases() -> list[tuple[bytes, int]]:
    return [(counter_kernel(max_sources=8).spirv, 1), (pingpong_kernel().spirv, 1)]


def case(i: int) -> tuple[bytes, int]:
    """Case `i`: (module bytes, state buffers of its kernel), the same on every run."""
    rng = np.random.default_rng([SEED, i])
    base, n_state = _bases()[i % 2]
    w = list(struct.unpack(f"<{len(base) // 4}I", base))
    kind = int(rng.integers(0, 10))
    if kind < 6:                                  # one to three bits flipped past the header
        for _ in range(int(rng.integers(1, 4))):
            j = int(rng.integers(5, len(w)))
            w[j] ^= 1 << int(rng.integers(0, 32))
    elif kind < 8:                                # a word set to an edge value
        j = int(rng.integers(0, len(w)))
        w[j] = int(rng.choice([0, 1, 0xFFFF, 0x10000, 0x7FFFFFFF, 0xFFFFFFFF, w[3], w[3] - 1, w[3] + 1]))
    elif kind == 8:                               # truncated
        w = w[:int(rng.integers(5, len(w)))]
    else:                                         # an instruction's word count changed
        starts, k = [], 5
        while k < len(w) and w[k] >> 16:
            starts.append(k)
            k += w[k] >> 16
        j = starts[int(rng.integers(0, len(starts)))]
        w[j] = (int(rng.integers(0, 64)) << 16) | (w[j] & 0xFFFF)
    return struct.pack(f"<{len(w)}I", *w), n_state


def child(indices: list[int]) -> None:
    """Launch each case on the driver (through launch, the gate included) and print
    it, so that a crash names its case."""
    from vkmulti import MultiDeviceManager
    from vkmulti.kernels import KernelRuntime, KernelSpec
    from vkmulti.device.instance import drain_all_validation_messages
    import kernel_support

    mgr = MultiDeviceManager.create()
    try:
        rt = KernelRuntime(kernel_support.make_coordinator(mgr), mgr, max_kernels=8)
        try:
            for i in indices:
                print("CASE", i, flush=True)
                code, n_state = case(i)
                try:
                    spec = KernelSpec(f"fuzz{i}", code, state_sizes=(16 + 16 * 8,) * n_state)
                    rt.destroy_kernel(rt.launch(spec, device=i % 2))
                    what = "launched"
                except (ValueError, TypeError, KernelValidationError) as exc:
                    what = f"refused {type(exc).__name__}"
                except Exception as exc:   # noqa: BLE001 - a typed vkmulti error from the driver is fine
                    what = f"driver {type(exc).__name__}"
                errors = [t for sev, t in drain_all_validation_messages() if sev == "error"]
                print("RESULT", i, what, "validation:" + (errors[0][:200] if errors else ""), flush=True)
        finally:
            rt.destroy()
    finally:
        mgr.destroy()


def _driver(indices: list[int]) -> dict[int, str]:
    """{case: what happened} for each index, one child at a time; a case that ends its
    child is reported as "crashed (exit N)" and the next child starts after it."""
    out: dict[int, str] = {}
    left = list(indices)
    while left:
        code = f"import sys; sys.path.insert(0, {HERE!r}); import test_spirv_gate_fuzz as t; t.child({left!r})"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=HERE)
        current = None
        for line in p.stdout.splitlines():
            parts = line.split(" ", 2)
            if parts[0] == "CASE":
                current = int(parts[1])
            elif parts[0] == "RESULT":
                out[int(parts[1])] = parts[2]
                current = None
        if current is None and p.returncode == 0:
            break
        if current is None:   # died before its first case or after its last
            raise AssertionError(f"the driver child exited {p.returncode}:\n{p.stderr[-3000:]}")
        out[current] = f"crashed (exit {p.returncode})"
        left = left[left.index(current) + 1:]
    return out


@pytest.mark.virtual
def test_the_gate_refuses_or_passes_every_mutant_and_the_driver_survives_what_it_passes():
    gate = SpirvGate()
    passed, refused, other = [], 0, []
    for i in range(CASES):
        code, n_state = case(i)
        try:
            gate.check_kernel(code, "main", n_state, KERNEL_PUSH, ENV)
            passed.append(i)
        except KernelValidationError:
            refused += 1
        except Exception as exc:   # noqa: BLE001 - the assertion below names it
            other.append((i, f"{type(exc).__name__}: {exc}"))
    assert not other, f"the gate raised something other than KernelValidationError: {other[:5]}"
    assert refused > CASES // 2 and passed, (refused, len(passed))
    results = _driver(passed[:DRIVER_CASES])
    crashed = {i: r for i, r in results.items() if r.startswith("crashed")}
    flagged = {i: r for i, r in results.items() if not r.endswith("validation:")}
    assert not crashed, f"modules the gate passed crashed the driver: {crashed}"
    assert not flagged, f"modules the gate passed drew validation errors: {dict(list(flagged.items())[:5])}"
    assert len(results) == min(len(passed), DRIVER_CASES)
