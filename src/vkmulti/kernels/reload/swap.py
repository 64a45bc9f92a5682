"""Hot reload of runtime kernels: check new SPIR-V against the kernels it is for,
build its pipeline on each of their devices (bounded by the reload's
timeout), swap pipeline and descriptor set at a step boundary of the runtime.
HotReloadManager (manager.py) drives these phases; apply_code runs them all
for one kernel (the runtime's side of Kernel.apply_code).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import vulkan as vk

from ..._core.checks import timeout_seconds, short_repr
from ..._core.lifetime import SLICE_SECONDS, Deadline
from ...errors import KernelValidationError, UnsupportedError, TimeoutError as VkmTimeout
from ..engine.device_context import KERNEL_PUSH, WHOLE_SIZE, ComputePass, kernel_types
from ..engine.gate import gate_of
from ..engine.prebuild import lower_priority
from ..engine.kernel import Kernel
from ..engine.spirv import check_kernel_abi, reflect
from ..engine.spirv_gate import target_env_of, validate_kernel_spirv
from .code_source import KernelCodeFormat, KernelCodeSource, validate_code

log = logging.getLogger(__name__)

__all__ = ["drain", "check_for_kernels", "compile_on_devices", "swap", "clear_state", "apply_code",
           "kernel_set", "put_pass", "let_steps_in", "MAX_SPIRV_FOR_API", "BUILD_WAIT", "STEP_PAUSE"]

#: The newest SPIR-V version a Vulkan 1.x core takes, by minor API version.
MAX_SPIRV_FOR_API = {0: (1, 0), 1: (1, 3), 2: (1, 5), 3: (1, 6)}


def _by_runtime(targets: list[Kernel]) -> dict[int, tuple[Any, list[Kernel]]]:
    out: dict[int, tuple[Any, list[Kernel]]] = {}
    for k in targets:
        out.setdefault(id(k.runtime), (k.runtime, []))[1].append(k)
    return out


def drain(targets: list[Kernel], left: Callable[[], float]) -> None:
    """Wait until the kernels' submitted steps are done."""
    for rt, ks in _by_runtime(targets).values():
        points = [k.ctx.point(k.last_value) for k in ks if k.last_value]
        if points:
            rt._wait_points(points, left())


def check_for_kernels(code: KernelCodeSource, targets: list[Kernel], *, spirv_val: bool,
                      timeout: Callable[[], float]) -> None:
    """KernelValidationError / UnsupportedError unless `code` can replace the targets' code:
    SPIR-V, the kernel ABI of every target, a version each device takes, and the
    SPIR-V gate (spirv-val for each device's target environment, always run)."""
    if not isinstance(code, KernelCodeSource):
        raise TypeError(f"code must be a KernelCodeSource, got {type(code).__name__}")
    if code.format is not KernelCodeFormat.SPIRV:
        k = targets[0]
        raise UnsupportedError(f"{code.format.name} code cannot run on a Vulkan kernel ({short_repr(k.id)} on GPU "
                               f"{k.device_index}, {k.ctx.slot.name!r}); give SPIR-V: KernelCodeSource.from_spirv "
                               f"or from_glsl", device=k.ctx.slot.name)
    validate_code(code)
    mod = reflect(code.code, "the new SPIR-V")
    for n_state in sorted({len(k.states) for k in targets}):
        check_kernel_abi(mod, code.entry_point, n_state, KERNEL_PUSH, "the new SPIR-V")
    apis = {}
    for k in targets:
        props = vk.vkGetPhysicalDeviceProperties(k.ctx.slot.physical_device)
        apis[k.device_index] = (int(props.apiVersion), k.ctx.slot.name)
    for index, (api, name) in sorted(apis.items()):
        top = MAX_SPIRV_FOR_API.get(min((api >> 12) & 0x3FF, 3), (1, 6))
        if mod.version > top:
            raise UnsupportedError(f"the new SPIR-V is version {mod.version[0]}.{mod.version[1]}; GPU {index} "
                                   f"({name!r}, Vulkan 1.{(api >> 12) & 0x3FF}) takes up to {top[0]}.{top[1]}: "
                                   f"compile for an older target (glslc --target-env)", device=name)
    # The SPIR-V gate (spirv-val included) runs whatever `spirv_val` is: no module reaches a
    # driver unvalidated.
    _gate_in_background(code, {(len(k.states), target_env_of(k.ctx.slot)) for k in targets}, timeout)


def _gate_in_background(code: KernelCodeSource, gates: set[tuple[int, str]], timeout: Callable[[], float]) -> None:
    """The SPIR-V gate of `code` for each (state buffers, target environment), in_background."""
    def check() -> None:
        for n, env in sorted(gates):
            validate_kernel_spirv(code.code, code.entry_point, n, KERNEL_PUSH, env, timeout=timeout(),
                                  label="the new SPIR-V")
    in_background(check, timeout())


def in_background(fn: Callable[[], Any], timeout: float) -> Any:
    """fn() on a thread of lowered CPU priority, waited for (in slices: Ctrl-C stops
    the wait) up to `timeout` s; its result, or its exception. The SPIR-V
    validator runs there: the child process inherits the thread's priority, so
    a reload's validation leaves the cores to the steps like its compile."""
    out: list[Any] = []

    def run() -> None:
        lower_priority()
        try:
            out.append((True, fn()))
        except BaseException as exc:   # re-raised in the caller
            out.append((False, exc))
    t = threading.Thread(target=run, name="vkmulti-reload-check", daemon=True)
    t.start()
    end = time.monotonic() + max(0.0, timeout)
    while t.is_alive():
        t.join(min(0.05, max(0.0, end - time.monotonic())))
        if t.is_alive() and time.monotonic() >= end:
            raise VkmTimeout(f"checking the new code did not finish within {timeout:.1f} s")
    ok, value = out[0]
    if not ok:
        raise value
    return value


#: The longest a reload's build waits for another thread's build of the same pipeline.
BUILD_WAIT = 300.0
#: How long a reload's caller pauses between its phases (let_steps_in).
STEP_PAUSE = 100e-6


def let_steps_in() -> None:
    """Pause the calling thread for STEP_PAUSE s without the interpreter lock. A thread
    that steps kernels needs the lock back after each native call of its step; while a
    reload runs Python on another thread it would get it only when that thread is told
    to drop it (the interpreter's switch interval, 5 ms by default): a pause between the
    reload's phases hands it over at once."""
    time.sleep(STEP_PAUSE)


def _build(ctx: Any, code: bytes, entry: str, n_state: int) -> ComputePass:
    """The kernel pipeline for `code` on `ctx`, built outside the device lock into the
    device's cache (another thread's build of it waited for, not repeated)."""
    return ctx.kernel_pass(code, entry, n_state, locked=False, timeout=BUILD_WAIT)


def _ahead(k: Kernel) -> list[tuple[int, Any]]:
    """(device, context) where k's runtime builds k's pipelines ahead (its prebuild
    policy) and already has a context: a reload makes no new context (that would
    compile the runtime's own passes under the runtime's lock)."""
    rt = k.runtime
    prebuild = getattr(rt, "prebuild", None)
    if prebuild is None:
        return []
    with rt._lock:  # type: ignore[attr-defined]
        made = {index: pair[0] for index, pair in rt._contexts.items()}  # type: ignore[attr-defined]
    return [(d, made[d]) for d in prebuild.targets(k) if d in made and made[d].alive]


def compile_on_devices(code: KernelCodeSource, targets: list[Kernel], left: Callable[[], float]) -> dict[int, Any]:
    """Build the new pipeline on every device the targets live on (once the code
    passed the SPIR-V gate for each) and on those of their runtimes' contexts the
    prebuild policy would move them to (so a move after the reload compiles
    nothing), each in a thread, while steps go on with the old code; waiting at
    most left() s (vkmulti.TimeoutError after; a build still running then
    finishes into the device's pipeline cache). {device: pass} of the targets'
    own devices and of those built ahead (a target may move there before the swap)."""
    jobs: dict[int, tuple[Any, int]] = {}
    for k in targets:
        jobs.setdefault(k.device_index, (k.ctx, len(k.states)))
    own = set(jobs)
    for k in targets:
        for index, ctx in _ahead(k):
            jobs.setdefault(index, (ctx, len(k.states)))
    if len({n for _, n in jobs.values()}) > 1 or len({len(k.states) for k in targets}) > 1:
        raise KernelValidationError("the kernels of one reload must have the same number of state buffers")
    _gate_in_background(code, {(n_state, target_env_of(ctx.slot)) for ctx, n_state in jobs.values()}, left)
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}

    def build(index: int, ctx: Any, n_state: int) -> None:
        try:
            if not ctx.has_pass(code.code, code.entry_point, kernel_types(n_state), KERNEL_PUSH):
                lower_priority()   # a compile, on a thread of its own: the steps keep the cores
            if index in own:
                results[index] = _build(ctx, code.code, code.entry_point, n_state)
            else:
                results[index] = ctx.kernel_pass(code.code, code.entry_point, n_state, locked=False,
                                                 timeout=BUILD_WAIT)
        except BaseException as exc:   # reported by the caller
            errors[index] = exc
    threads = [threading.Thread(target=build, args=(i, c, n), name=f"vkmulti-reload-compile-{i}", daemon=True)
               for i, (c, n) in sorted(jobs.items())]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive() and left() > 0:   # in slices: Ctrl-C ends the wait
            t.join(min(SLICE_SECONDS, left()))
        if t.is_alive():
            raise VkmTimeout(f"building the new pipeline on GPU {t.name.rsplit('-', 1)[-1]} did not finish within "
                             f"the reload's time (reload_timeout); it completes in the background into that "
                             f"device's pipeline cache")
    for index in set(errors) - own:   # a device the kernels do not run on: a move there builds it
        log.warning("building the new pipeline ahead on GPU %d failed: %s", index, errors.pop(index))
    if errors:
        index, exc = sorted(errors.items())[0]
        raise exc
    return dict(results)


def swap(targets: list[Kernel], passes: dict[int, Any], code: KernelCodeSource, left: Callable[[], float]) -> None:
    """Give each target the new pipeline at a step boundary of its runtime (its gate
    held exclusively); the old descriptor sets are freed once the steps that used
    them are done. State buffers are not touched. A target that a migration moved
    since the build to a device `passes` lacks gets the pipeline built there first,
    outside the gate (no step waits for that compile), and the swap is tried again."""
    for rt, ks in sorted(_by_runtime(targets).values(), key=lambda p: id(p[0])):
        while True:
            for k in ks:
                if k.device_index not in passes:
                    k.check()
                    passes[k.device_index] = _build(k.ctx, code.code, code.entry_point, len(k.states))
            with gate_of(rt).exclusive(left(), "a hot reload's swap"):
                if all(k.device_index in passes for k in ks):   # (no move runs while the gate is held)
                    _swap_locked(rt, ks, passes, code)
                    break


def kernel_set(k: Kernel, p: ComputePass) -> tuple[Any, Any]:
    """A descriptor set of kernel pipeline `p` (held for k: ctx.hold or hold_pass) over k's
    buffers (inbox, outbox, states), as (pool, set); k.ctx.lock held by the caller. Where
    it cannot be made (the context gone among the reasons), p's hold is let go."""
    ctx = k.ctx
    try:
        ctx.check()
        return ctx.descriptor_set(p, [(k.inbox.handle, 0, WHOLE_SIZE), (k.outbox.handle, 0, k.outbox_bytes)]
                                  + [(s.handle, 0, WHOLE_SIZE) for s in k.states])
    except BaseException:
        ctx.release_pass(p, 0)
        raise


def put_pass(k: Kernel, p: ComputePass, new_set: tuple[Any, Any], spec: Any) -> tuple[Any, Any]:
    """Give k pipeline `p` (held for it: ctx.hold_pass) with its set `new_set` (made by
    kernel_set) and `spec`, letting go of the old pipeline (k.ctx.lock held; nothing here
    raises); returns k's old kernel set, for the caller to free once no step that bound it
    can still run."""
    old = next(s for s in k.sets if s[1] is k.kernel_set)
    k.sets[k.sets.index(old)] = new_set
    k.ctx.let_go(k.residency)
    k.kernel_pass, k.kernel_set = p, new_set[1]
    k.spec = spec
    return old


def _swap_locked(rt: Any, ks: list[Kernel], passes: dict[int, Any], code: KernelCodeSource) -> None:
    """swap()'s work for the kernels `ks` of runtime `rt`, its gate held."""
    made: list[tuple[Kernel, Any, Any]] = []
    try:
        for k in ks:
            ctx = k.ctx
            p = passes[k.device_index]
            with ctx.lock:
                k.check()
                if not ctx.hold(p):   # (let go and destroyed since it was built: built again)
                    p = ctx.hold_pass(code.code, code.entry_point, len(k.states))
                new_set = kernel_set(k, p)
            made.append((k, p, new_set))
    except BaseException:
        for k, p, s in made:
            with k.ctx.lock:
                k.ctx.free_set(s)
                k.ctx.release_pass(p, 0)
        raise
    for k, p, new_set in made:   # nothing below raises: all kernels swap together
        ctx = k.ctx
        with ctx.lock:
            old = put_pass(k, p, new_set, dataclasses.replace(k.spec, spirv=code.code, entry_point=code.entry_point))
            rt._device(k.device_index)[1].retired.append((k.last_value, old))
    twins = getattr(rt, "ready_twins", None)
    if twins is not None:
        for k in ks:   # their ready twins run the old code: given the new pipeline (built there ahead)
            twins.request(k)


def clear_state(targets: list[Kernel]) -> None:
    """Zero the targets' state buffers (a reload that does not preserve state),
    ordered after their submitted steps and before later ones."""
    for k in targets:
        ctx = k.ctx
        with ctx.lock:
            k.check()
            ctx.run_once(lambda cmd, ss=list(k.states): [vk.vkCmdFillBuffer(cmd, s.handle, 0, WHOLE_SIZE, 0)  # type: ignore[arg-type, misc]
                                                        for s in ss])


def apply_code(kernel: Kernel, code: KernelCodeSource, timeout: float | None = 30.0) -> None:
    """Run `code` on `kernel` from its next step on, state kept: checked, built and
    swapped as a hot reload does, all within `timeout` s (None: no limit; ValueError
    for a bad one; vkmulti.TimeoutError after)."""
    deadline = Deadline(timeout_seconds(timeout))

    def left() -> float:
        rest = deadline.left()
        if rest is None:
            return threading.TIMEOUT_MAX
        if rest <= 0:
            raise VkmTimeout(f"apply_code on {short_repr(kernel.id)} did not finish within {timeout} s")
        return min(rest, threading.TIMEOUT_MAX)
    check_for_kernels(code, [kernel], spirv_val=True, timeout=left)
    swap([kernel], compile_on_devices(code, [kernel], left), code, left)
