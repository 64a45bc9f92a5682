"""The pipeline helper process (vkmulti.device.pipeline_helper): builds off the step path
(a launch's builds on the other devices, a reload's) are compiled by a child process and
made here from its cache blob; a helper that fails, hangs, dies or answers out of bounds
or with another device's blob is stopped and the pipeline compiled here, with a warning."""
from __future__ import annotations

import logging
import os
import sys
import textwrap
import time
from types import SimpleNamespace as types_ns

import numpy as np
import pytest

from child_runs import printed_in_order, run_script
from kernel_support import runtime_fixture
from vkmulti import HotReloadConfig, HotReloadManager, KernelCodeSource
from vkmulti.device import pipeline_helper as ph
from vkmulti.kernels import counter_kernel
from vkmulti.kernels.engine.device_context import KERNEL_PUSH, kernel_types
from vkmulti.kernels.reference import COUNTER_TAG_ADD, counter_initial_state, read_counter

runtime = runtime_fixture(max_kernels=32)


@pytest.fixture
def helper(monkeypatch):
    """A fresh PipelineHelper in place of the process's, used on every device."""
    h = ph.PipelineHelper()
    monkeypatch.setattr(ph, "HELPER", h)
    monkeypatch.setenv(ph.ENV, "1")
    monkeypatch.setattr(ph, "START_SECONDS", 0.0)   # (not ready once a call's wait ends: failed)
    monkeypatch.setattr(ph, "READY_WAIT", 60.0)     # (a call waits for the helper's start)
    monkeypatch.setattr(ph, "_warned", set())       # (each test sees its warnings)
    yield h
    h.close()


def _fresh(spirv: bytes, tag: int) -> KernelCodeSource:
    raw = bytearray(spirv)
    raw[8:12] = tag.to_bytes(4, "little")
    return KernelCodeSource.from_spirv(bytes(raw))


def _request(ctx):
    spec = counter_kernel(max_sources=32)
    return ctx.cache_identity, spec.spirv, spec.entry_point, kernel_types(len(spec.state_sizes)), KERNEL_PUSH


def test_builds_off_the_step_path_are_compiled_by_the_helper(runtime, helper):
    spec = counter_kernel(max_sources=32)
    k = runtime.launch(spec, "k", device=0, state=[counter_initial_state(32)])
    runtime.prebuild.wait_idle(60)
    assert helper.compiles >= 1 and helper.failures == 0   # (GPU 1's pipeline, built ahead)
    before = helper.compiles
    reloads = HotReloadManager(HotReloadConfig().with_validate_before_swap(False).with_preserve_state(True))
    runtime.send(k, np.array([4], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    reloads.reload(k, _fresh(spec.spirv, 0xC001))
    assert helper.compiles == before + 2 and helper.failures == 0   # (the new code on both devices)
    runtime.send(k, np.array([5], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    runtime.migrate(k, 1, timeout=60)
    runtime.send(k, np.array([6], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    runtime.synchronize(30)
    st = read_counter(runtime.read_state(k))
    assert (st.count, st.sum) == (3, 15)


def test_the_helper_answers_a_blob_of_the_device(runtime, helper):
    k = runtime.launch(counter_kernel(max_sources=32), "k", device=0, state=[counter_initial_state(32)])
    runtime.prebuild.wait_idle(60)
    n = helper.compiles
    blob = helper.compile(*_request(k.ctx), timeout=60)
    assert ph.check_header(blob, k.ctx.cache_identity) is None
    pid = helper._proc.pid
    assert helper.compile(*_request(k.ctx), timeout=60) and helper.compiles == n + 2 and helper._proc.pid == pid
    with pytest.raises(ph.HelperError, match="could not compile.*no physical device"):
        helper.compile((1, 2, b"\0" * 16), counter_kernel().spirv, "main", [7, 7, 7], KERNEL_PUSH, timeout=60)
    assert helper.compile(*_request(k.ctx), timeout=60) and helper._proc.pid == pid   # (still serving)


FAKES = {
    "exits": "import sys; sys.exit(0)",
    "garbage header": """
        import sys, struct
        sys.stdout.buffer.write(struct.pack('<I', 1 << 30)); sys.stdout.buffer.flush()
        sys.stdin.buffer.read()
    """,
    "not json": """
        import sys, struct
        sys.stdout.buffer.write(struct.pack('<I', 4) + b'{{{{'); sys.stdout.buffer.flush()
        sys.stdin.buffer.read()
    """,
    "nested header": """
        import sys, struct
        h = b'[' * 4000
        sys.stdout.buffer.write(struct.pack('<I', len(h)) + h + struct.pack('<Q', 0)); sys.stdout.buffer.flush()
        sys.stdin.buffer.read()
    """,
    "huge body": """
        import sys, struct
        sys.stdout.buffer.write(struct.pack('<I', 14) + b'{"hello":true}' + struct.pack('<Q', 1 << 40))
        sys.stdout.buffer.flush()
        sys.stdin.buffer.read()
    """,
    "no hello": """
        import sys
        from vkmulti.device.pipeline_helper import _write_frame
        _write_frame(sys.stdout.buffer, {"hello": False, "error": "no Vulkan here"}, b"")
        sys.stdin.buffer.read()
    """,
    "bad answer": """
        import sys, struct
        from vkmulti.device.pipeline_helper import _write_frame
        _write_frame(sys.stdout.buffer, {"hello": True}, b"")
        sys.stdin.buffer.read(1)
        sys.stdout.buffer.write(struct.pack('<I', 2) + b'[]' + struct.pack('<Q', 0)); sys.stdout.buffer.flush()
        sys.stdin.buffer.read()
    """,
    "another device": """
        import sys
        from vkmulti.device.pipeline_helper import _write_frame, HEADER
        _write_frame(sys.stdout.buffer, {"hello": True}, b"")
        sys.stdin.buffer.read(1)
        _write_frame(sys.stdout.buffer, {"ok": True}, HEADER.pack(32, 1, 0x1234, 0x5678, b"x" * 16))
        sys.stdin.buffer.read()
    """,
    "hangs": "import time; time.sleep(600)",
}


@pytest.mark.parametrize("name", list(FAKES))
def test_a_helper_that_misbehaves_is_stopped_and_the_pipeline_compiled_here(runtime, helper, name, caplog,
                                                                          monkeypatch):
    monkeypatch.setenv(ph.ENV, "0")   # (the launch's builds ahead: not through the fake)
    k = runtime.launch(counter_kernel(max_sources=32), "k", device=0, state=[counter_initial_state(32)])
    runtime.prebuild.wait_idle(60)
    helper.argv = [sys.executable, "-c", textwrap.dedent(FAKES[name])]
    ctx = k.ctx
    ctx.use_helper = True
    t0 = time.monotonic()
    code = _fresh(counter_kernel(max_sources=32).spirv, 0xD000 + len(name)).code
    with caplog.at_level(logging.WARNING):
        made = ctx.pipeline(code, "main", kernel_types(1), KERNEL_PUSH, timeout=1.0 if name == "hangs" else 60.0,
                            elsewhere=True)
    assert made.pipeline is not None   # (compiled here)
    assert time.monotonic() - t0 < 60
    assert any("pipeline helper" in r.getMessage() for r in caplog.records)
    if name == "another device":   # (the helper answered; its blob is refused before the driver sees it)
        assert (helper.failures, helper.compiles) == (0, 1)
        assert any("not one of this device" in r.getMessage() for r in caplog.records)
    else:
        assert (helper.failures, helper.compiles) == (1, 0)
        assert helper._proc is None   # (stopped: the next call starts another)
    runtime.send(k, np.array([2], np.uint32), tag=COUNTER_TAG_ADD)
    runtime.step(k)
    runtime.synchronize(30)
    assert read_counter(runtime.read_state(k)).sum == 2


def test_the_helper_refuses_a_module_over_its_bound(helper):
    with pytest.raises(ph.HelperError, match="more than"):
        helper.compile((1, 2, b"\0" * 16), b"\0" * (ph.MAX_CODE + 4), "main", [7], 16, timeout=1)
    assert helper._proc is None   # (refused before starting anything)


def test_a_helper_that_stops_reading_fails_the_request_in_time(helper):
    """A helper that said hello and never reads its stdin: a request larger than the pipe
    holds is refused once the call's timeout passed (the write is bounded too), and the
    helper is stopped."""
    helper.argv = [sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from vkmulti.device.pipeline_helper import _write_frame
        _write_frame(sys.stdout.buffer, {"hello": True}, b"")
        time.sleep(600)
    """)]
    helper.start()   # (its hello waited for here, not within the 2 s: a loaded machine starts it slowly)
    assert helper._reader is not None and helper._reader.sel.select(120)
    t0 = time.monotonic()
    with pytest.raises(ph.HelperError, match="in time"):
        helper.compile((1, 2, b"\0" * 16), b"\3\2\x23\7" * (256 << 10), "main", [7], 16, timeout=2.0)
    assert time.monotonic() - t0 < 30
    assert helper._proc is None


def test_a_compile_waits_for_another_threads_compile_within_its_timeout(helper):
    """Another thread's compile holds the helper: a call waits for it only within its own
    timeout (then HelperStarting: compile here), and refuses a bad timeout; before, it
    waited for the lock without a bound, and Ctrl-C could not end the wait."""
    import threading

    taken, done = threading.Event(), threading.Event()

    def busy():
        with helper._lock:   # (what a compile in another thread holds)
            taken.set()
            done.wait(60)
    t = threading.Thread(target=busy, daemon=True)
    t.start()
    assert taken.wait(10)
    try:
        t0 = time.monotonic()
        with pytest.raises(ph.HelperStarting, match="busy"):
            helper.compile((1, 2, b"\0" * 16), b"\3\2\x23\7" * 8, "main", [7], 16, timeout=0.2)
        assert time.monotonic() - t0 < 20
        for bad in (-1, float("nan"), "5", True):
            with pytest.raises(ValueError):
                helper.compile((1, 2, b"\0" * 16), b"\3\2\x23\7" * 8, "main", [7], 16, timeout=bad)
    finally:
        done.set()
        t.join(10)
    assert helper._proc is None and helper.failures == 0   # (nothing started, nothing counted)


def test_a_compile_after_waiting_for_another_threads_compile_keeps_one_timeout(helper, monkeypatch):
    """The wait for another thread's compile comes out of the call's timeout: the compile
    that follows must end by the call's own deadline (before, it was given the whole
    timeout again from when the lock was obtained: up to twice the timeout in all)."""
    import threading

    inner, waiting = threading.Lock(), threading.Event()

    class Watched:   # the helper's lock, telling when the compile starts to wait for it
        def acquire(self, *args, **kwargs):
            waiting.set()
            return inner.acquire(*args, **kwargs)

        def release(self):
            inner.release()

        def __enter__(self):
            return inner.__enter__()

        def __exit__(self, *exc):
            return inner.__exit__(*exc)

    helper._lock = Watched()
    helper._ready = True
    monkeypatch.setattr(helper, "_start", lambda: (types_ns(stdin=types_ns(fileno=lambda: -1)), None))
    deadlines = []

    def send(fd, header, body, deadline):
        deadlines.append(deadline)
        raise ph.HelperError("not sent (test)")
    monkeypatch.setattr(ph, "_send_frame", send)
    released = []
    inner.acquire()   # (another thread's compile)

    def let_go():
        waiting.wait(30)
        released.append(time.monotonic())
        inner.release()
    t = threading.Thread(target=let_go, daemon=True)
    t.start()
    timeout = 30.0
    with pytest.raises(ph.HelperError, match="not sent"):
        helper.compile((1, 2, b"\0" * 16), b"\3\2\x23\7" * 8, "main", [7], 16, timeout=timeout)
    t.join(10)
    assert deadlines and deadlines[0] < released[0] + timeout, (deadlines, released)


def test_the_helper_is_used_only_when_asked(monkeypatch):
    monkeypatch.delenv(ph.ENV, raising=False)
    assert not ph.helper_wanted("discrete-gpu") and not ph.helper_wanted("cpu")
    monkeypatch.setenv(ph.ENV, "gpu")
    assert ph.helper_wanted("discrete-gpu") and not ph.helper_wanted("cpu")
    monkeypatch.setenv(ph.ENV, "1")
    assert ph.helper_wanted("cpu") and ph.helper_wanted("integrated-gpu")
    monkeypatch.setenv(ph.ENV, "0")
    assert not ph.helper_wanted("discrete-gpu")


SIGPIPE_SCRIPT = textwrap.dedent('''
    import signal, sys
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    from vkmulti.device import pipeline_helper as ph
    ph.READY_WAIT = 30.0
    child = "import sys; from vkmulti.device.pipeline_helper import _write_frame; " \\
            "_write_frame(sys.stdout.buffer, {'hello': True}, b'')"
    h = ph.PipelineHelper([sys.executable, "-c", child])
    try:
        h.compile((1, 2, bytes(16)), bytes.fromhex("03022307") * (256 << 10), "main", [7], 16, timeout=20)
    except ph.HelperError as exc:
        print("HelperError", exc, flush=True)
    print("ALIVE", h.failures, h._proc is None, flush=True)
''')


def test_a_helper_that_died_cannot_end_a_process_that_left_sigpipe_at_its_default():
    """A process that restored SIGPIPE's default action (as command-line programs do, to end
    quietly in a closed pipeline) and whose helper said hello and died: the request gets
    EPIPE, a HelperError. Before, writing it to the helper's stdin pipe raised SIGPIPE and
    ended the whole process (exit status 141; a child process here)."""
    p = run_script(SIGPIPE_SCRIPT, "SIGPIPE", 120, os.path.dirname(os.path.abspath(__file__)))
    printed_in_order(p, ["HelperError the pipeline helper is gone", "ALIVE 1 True"], "SIGPIPE")


def test_what_a_driver_prints_to_stdout_does_not_corrupt_the_helpers_answers(runtime, helper):
    """Before: the helper's answers shared stdout with whatever the child's driver or layers
    printed there, and a line printed while its Vulkan instance was made read as a
    0x76697264-byte header: the helper was stopped as broken on every start."""
    k = runtime.launch(counter_kernel(max_sources=32), "k", device=0, state=[counter_initial_state(32)])
    runtime.prebuild.wait_idle(60)
    helper.argv = [sys.executable, "-c", textwrap.dedent("""
        import sys
        from vkmulti.device import pipeline_helper as ph
        made = ph.Instance
        def noisy(**kw):
            print("driver noise", flush=True)
            return made(**kw)
        ph.Instance = noisy
        sys.exit(ph.main())
    """)]
    helper.close()   # (the launch's builds ahead started one with the usual command)
    blob = helper.compile(*_request(k.ctx), timeout=60)
    assert ph.check_header(blob, k.ctx.cache_identity) is None and helper.failures == 0


def test_a_ctrl_c_during_a_request_stops_the_helper(helper, monkeypatch):
    """A Ctrl-C while a request is out (its answer not read): the helper is stopped, so the
    next call cannot read the interrupted request's answer as its own (before, the child
    stayed with the unread answer and every later call got the blob of the one before)."""
    helper.argv = [sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from vkmulti.device.pipeline_helper import _Reader, _write_frame
        _write_frame(sys.stdout.buffer, {"hello": True}, b"")
        reader = _Reader(0)
        while True:
            head, _ = reader.frame(time.monotonic() + 600, 1 << 20)
            time.sleep(0.5)
            _write_frame(sys.stdout.buffer, {"ok": True}, head["entry"].encode())
    """)]
    helper.start()
    assert helper._reader is not None and helper._reader.sel.select(120)
    frame = ph._Reader.frame

    def interrupted(self, deadline, limit):   # Ctrl-C while the first answer is awaited (after the hello)
        if limit == 0:
            return frame(self, deadline, limit)
        raise KeyboardInterrupt
    monkeypatch.setattr(ph._Reader, "frame", interrupted)
    with pytest.raises(KeyboardInterrupt):
        helper.compile((1, 2, b"\0" * 16), b"\3\2\x23\7" * 8, "first", [7], 16, timeout=60)
    monkeypatch.setattr(ph._Reader, "frame", frame)
    assert helper._proc is None and helper.failures == 0
    assert helper.compile((1, 2, b"\0" * 16), b"\3\2\x23\7" * 8, "second", [7], 16, timeout=60) == b"second"
