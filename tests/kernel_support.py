"""Helpers for the kernel runtime's tests: the coordinator of a manager, and the
counter kernels, runtimes and K2K routers the K2K path tests share."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import pytest

#: max_kernels of the K2K path tests' runtimes (and the counters' FIFO tables)
MAX = 32


def make_coordinator(manager: Any) -> Any:
    """A MultiGpuCoordinator with one registered device per slot of `manager`."""
    from vkmulti.kernels import MultiGpuCoordinator

    return MultiGpuCoordinator.from_manager(manager)


@contextmanager
def routed_runtime(manager: Any, method: str | None) -> Iterator[tuple[Any, Any]]:
    """A runtime with a K2K router across the pair, moving with `method` both ways
    (None: the pair's best, dmabuf: in place); both are let go after."""
    from vkmulti import CrossGpuK2KRouter
    from vkmulti.kernels import KernelRuntime

    rt = KernelRuntime(make_coordinator(manager), manager, max_kernels=MAX)
    methods = {(0, 1): method, (1, 0): method} if method else None
    router = CrossGpuK2KRouter(rt.coordinator, rt, transfer_methods=methods)
    try:
        yield rt, router
    finally:
        router.detach()
        rt.destroy()


def runtime_fixture(**options: Any) -> Callable:
    """A `runtime` fixture: a KernelRuntime over the test's manager (KernelRuntime
    `options`, e.g. max_kernels), destroyed after the test."""
    @pytest.fixture
    def runtime(manager: Any) -> Iterator[Any]:
        from vkmulti.kernels import KernelRuntime

        rt = KernelRuntime(make_coordinator(manager), manager, **options)
        try:
            yield rt
        finally:
            rt.destroy()
    return runtime


def routed_fixture(paths: dict[str, str | None]) -> Callable:
    """A `routed` fixture over `paths` (test id -> transfer method, None: the pair's best):
    (runtime, router) from routed_runtime, once per path."""
    @pytest.fixture(params=list(paths))
    def routed(manager: Any, request: Any) -> Iterator[tuple[Any, Any]]:
        with routed_runtime(manager, paths[request.param]) as pair:
            yield pair
    return routed


def counter(rt: Any, name: str, device: int, *, inbox: int = 8, outbox: int = 8, max_sources: int = MAX,
            **kw: Any) -> Any:
    """A counter kernel with small rings (they wrap often) and a FIFO table of `max_sources`."""
    from vkmulti.kernels import counter_kernel
    from vkmulti.kernels.reference import counter_initial_state

    return rt.launch(counter_kernel(max_sources=max_sources, inbox_capacity=inbox, outbox_capacity=outbox), name,
                     device=device, state=[counter_initial_state(max_sources)], **kw)


@pytest.fixture
def router(runtime: Any) -> Iterator[Any]:
    """A CrossGpuK2KRouter over the test module's `runtime` fixture, detached after."""
    from vkmulti import CrossGpuK2KRouter

    r = CrossGpuK2KRouter(runtime.coordinator, runtime)
    try:
        yield r
    finally:
        r.detach()


def words(*values: int) -> np.ndarray:
    return np.array(values, np.uint32)


def settle(rt: Any, kernels: list, done: Any, limit: int = 300) -> None:
    """Step until done() (at most `limit` steps), then three more, then synchronize."""
    for _ in range(limit):
        rt.step(kernels)
        if done():
            break
    for _ in range(3):
        rt.step(kernels)
    rt.synchronize()


def state(rt: Any, k: Any) -> Any:
    """The counter's decoded state."""
    from vkmulti.kernels.reference import read_counter

    return read_counter(rt.read_state(k))


def call_in_thread(fn: Callable[[], Any], name: str | None = None) -> tuple[threading.Thread, dict]:
    """A thread (not started) that calls fn(), and the dict it leaves its "result" or
    "error" (any exception, for the test to report) in."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:   # reported by the test
            out["error"] = exc
    return threading.Thread(target=run, name=name), out



@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """Python's own SIGINT handler (KeyboardInterrupt) for the test: a process started in the
    background by a non-interactive shell inherits SIGINT ignored, and then
    _thread.interrupt_main() does nothing."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
