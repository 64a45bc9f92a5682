"""Forged runtime-kernel checkpoints (issue 23, A and I): CRC-valid bytes whose chunks
or metadata do not fit the kernel they describe are refused with
InvalidCheckpointError before a byte is copied or a kernel is launched.

Every case is first run in a child process (a regression may write past a
buffer and crash it), then in-process for the assertions on the runtime.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import kernel_support
from kernel_support import runtime_fixture
from vkmulti import Checkpoint
from vkmulti.errors import InvalidCheckpointError
from vkmulti.kernels.checkpoint import ChunkType
from vkmulti.kernels.checkpoint.restorable import MAX_RESTORE_GROUPS, check_restore_groups
from vkmulti.kernels.lifecycle import INBOX_CHUNK
from vkmulti.kernels.reference import COUNTER_TAG_ADD

HERE = os.path.dirname(os.path.abspath(__file__))
runtime = runtime_fixture(max_kernels=8)


def _forge(cp: Checkpoint, how: str) -> Checkpoint:
    """A copy of `cp` changed as `how` says, its CRCs recomputed by to_bytes()."""
    cp = Checkpoint.from_bytes(cp.to_bytes())
    custom = cp.metadata.custom

    def chunk(kind, cid=None):
        return next(c for c in cp.chunks if c.chunk_type() is kind and (cid is None or c.header.chunk_id == cid))
    if how == "inbox+16":
        c = chunk(ChunkType.CUSTOM, INBOX_CHUNK)
        c.data += bytes(16)
    elif how == "inbox+4MB":
        c = chunk(ChunkType.CUSTOM, INBOX_CHUNK)
        c.data += b"\xab" * (4 << 20)
    elif how == "inbox-short":
        c = chunk(ChunkType.CUSTOM, INBOX_CHUNK)
        c.data = c.data[:100]
    elif how == "control-3":
        chunk(ChunkType.CONTROL_BLOCK).data = b"abc"
    elif how == "control-ragged":
        chunk(ChunkType.CONTROL_BLOCK).data += b"\0" * 5
    elif how == "k2h-ragged":
        chunk(ChunkType.K2H_QUEUE).data += b"\1" * 7
    elif how == "h2k-ragged":
        chunk(ChunkType.H2K_QUEUE).data += b"\1" * 7
    elif how == "state-long":
        chunk(ChunkType.DEVICE_MEMORY).data += bytes(64)
    elif how == "two-inboxes":
        cp.chunks.append(chunk(ChunkType.CUSTOM, INBOX_CHUNK))
    elif how == "nested-json":
        custom["vkm.spec"] = "[" * 100000 + "]" * 100000
    elif how == "nested-params":
        custom["vkm.params"] = "[" * 5000 + "]" * 5000
    elif how == "spec-not-object":
        custom["vkm.spec"] = "[1, 2]"
    elif how in ("groups-huge", "groups-axis", "groups-bad"):
        import json
        spec = json.loads(custom["vkm.spec"])
        spec["groups"] = {"groups-huge": [65535, 65535, 1], "groups-axis": [1, 1 << 17, 1],
                          "groups-bad": [1, "x", 1]}[how]
        custom["vkm.spec"] = json.dumps(spec)
    elif how == "payload-odd":
        custom["vkm.payload_size"] = "13"
    elif how == "payload-superscript":   # "²⁵⁶".isdigit() is True, int() of it a ValueError
        custom["vkm.payload_size"] = "\u00b2\u2075\u2076"
    elif how == "address-huge":
        custom["vkm.address"] = "9" * 30
    elif how == "params-huge":
        custom["vkm.params"] = "[4294967296]"
    else:
        raise AssertionError(how)
    return Checkpoint.from_bytes(cp.to_bytes())


CASES = ["inbox+16", "inbox+4MB", "inbox-short", "control-3", "control-ragged", "k2h-ragged", "h2k-ragged",
         "state-long", "two-inboxes", "nested-json", "nested-params", "spec-not-object", "groups-huge",
         "groups-axis", "groups-bad", "payload-odd", "payload-superscript", "address-huge", "params-huge"]


def _made(rt):
    k = kernel_support.counter(rt, "k", device=0, max_sources=8)
    rt.send(k, np.array([5], np.uint32), tag=COUNTER_TAG_ADD)
    rt.step(k)
    rt.send(k, np.array([7], np.uint32), tag=COUNTER_TAG_ADD)   # waits on the host: an H2K slot
    rt.synchronize()
    return k


def body(cases: list[str]) -> None:
    """Each forged case on one manager: restored as new and into; prints what each did
    (so that a crash names the case it died in)."""
    from vkmulti import MultiDeviceManager
    from vkmulti.kernels import KernelRuntime

    mgr = MultiDeviceManager.create()
    try:
        rt = KernelRuntime(kernel_support.make_coordinator(mgr), mgr, max_kernels=8)
        try:
            k = _made(rt)
            cp = k.create_checkpoint()
            for how in cases:
                print("CASE", how, flush=True)
                forged = _forge(cp, how)
                out = []
                for kw in ({"kernel_id": "copy", "device": 1}, {"into": k, "device": 1}, {"into": k}):
                    try:
                        rt.restore(forged, **kw)
                        out.append("restored")
                    except InvalidCheckpointError:
                        out.append("refused")
                print("RESULT", how, ",".join(out), flush=True)
        finally:
            rt.destroy()
    finally:
        mgr.destroy()


def test_forged_checkpoints_in_a_child_process():
    """The child exits 0 and every restore of every case was refused (before: SIGSEGV or a
    heap abort for an inbox past its buffer, numpy ValueError after a launch, ...)."""
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import test_checkpoint_forged as t; t.body({CASES!r})")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280, cwd=HERE)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    for how in CASES:
        assert f"RESULT {how} refused,refused,refused" in p.stdout, p.stdout[-3000:]


@pytest.mark.parametrize("how", ["inbox+16", "control-3", "k2h-ragged", "nested-json", "groups-huge", "groups-axis"])
def test_forged_checkpoint_launches_nothing(runtime, how):
    """Refused before any kernel is launched or any byte copied; the runtime and the
    kernel the restore targeted stay usable."""
    k = _made(runtime)
    before = runtime.read_state(k).copy()
    forged = _forge(k.create_checkpoint(), how)
    kernels = list(runtime.kernels)
    launches = []
    real = runtime.launch
    runtime.launch = lambda *a, **kw: launches.append(a) or real(*a, **kw)
    try:
        with pytest.raises(InvalidCheckpointError):
            runtime.restore(forged, kernel_id="copy", device=1)
        with pytest.raises(InvalidCheckpointError):
            runtime.restore(forged, kernel_id="copy")   # any device: checked against all of them
        with pytest.raises(InvalidCheckpointError):
            runtime.restore(forged, into=k, device=1)
    finally:
        del runtime.launch
    assert launches == []
    assert list(runtime.kernels) == kernels
    assert k.device_index == 0 and np.array_equal(runtime.read_state(k), before)
    copy = runtime.restore(k.create_checkpoint(), kernel_id="copy", device=1)   # a true one still restores
    assert np.array_equal(runtime.read_state(copy), before)


def test_workgroup_bounds():
    check_restore_groups((64, 64, 1), "k", [(65535, 65535, 65535)])
    with pytest.raises(InvalidCheckpointError, match="maxComputeWorkGroupCount"):
        check_restore_groups((70000, 1, 1), "k", [(65535, 65535, 65535)])
    with pytest.raises(InvalidCheckpointError, match="workgroups per step"):
        check_restore_groups((MAX_RESTORE_GROUPS, 2, 1), "k", [((1 << 31) - 1, 65535, 65535)])
