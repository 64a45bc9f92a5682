"""The step loop of a KernelRuntime (Stepping) and what one step submitted
(StepTicket): per device, the kernels there run in one submit that signals the
device's timeline; the K2K router's listeners see the step's batches; a lost
device is failed over and its kernels' step made on the survivors."""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Iterable

from ..._core import _native
from ..._core.checks import U64_MAX, is_int, short_repr, timeout_seconds
from ..._core.timeline import as_wait_points
from ...errors import DeviceLostError, KernelMessageError
from ...errors import TimeoutError as VkmTimeout
from ..._core.timeline import TimelinePoint
from ..engine.device_context import DeviceContext
from ..engine.kernel import Kernel, OutboxBatch
from ..engine.stepper import DeviceStepper
from ..lifecycle.failover import Failover
from ..lifecycle.lifecycle import Lifecycle

__all__ = ["RunTicket", "StepTicket", "Stepping"]

log = logging.getLogger(__name__)

#: Whether run() submits the quiet steps of its kernels natively (record and submit in C, read
#: back only what was not quiet; engine/stepper.py's quiet_run): False makes every step a
#: step() (tests and benches compare the two).
QUIET_RUNS = True
#: Seconds one native run of quiet steps holds the steps' gate and its devices' locks at most:
#: a migration, a reload or another thread's step waits at most about this long for its turn.
QUIET_RUN_BUDGET = 0.005
#: The most steps a run makes one by one before it tries a native run again, after tries in a row
#: that found steps that are not quiet (1, 3, 7, ... steps after each).
QUIET_RETRY_STEPS = 31


class StepTicket:
    """What one `step()` submitted: a timeline point per device, the kernels
    that ran, those held back (with the reason) and their new outbox batches."""

    count = 1   # steps it stands for (a run's quiet steps: several, `launched` lists each kernel per step)

    def __init__(self, steps: "Stepping", points: dict[int, TimelinePoint], launched: list[Kernel],
                 deferred: list[tuple[Kernel, str]], batches: list[OutboxBatch]):
        self._steps, self.points, self.launched, self.deferred, self.batches = steps, points, launched, deferred, \
            batches

    def wait(self, timeout: float | None = None) -> None:
        """Block (no GIL) until every device of the step is done; vkmulti.TimeoutError after `timeout` s."""
        self._steps.wait_points(self.points.values(), timeout_seconds(timeout))

    def done(self) -> bool:
        """True when every device's part of the step is finished (never blocks)."""
        return all(self._steps.context(p.device_index).completed() >= p.value for p in self.points.values())

    def __repr__(self) -> str:
        return (f"StepTicket(devices={sorted(self.points)}, launched={_ids(k.id for k in self.launched)}, "
                f"deferred={_ids(k.id for k, _ in self.deferred)})")


def _ids(ids: Iterable[Any]) -> str:
    """A repr's list of kernel ids, cut short (a step may launch hundreds)."""
    return short_repr([str(i) for i in ids], 70)


def keep_latest(points: dict[int, TimelinePoint], dev: int, p: TimelinePoint) -> None:
    """Keep in `points` (device -> point) the later of `p` and the point already there for `dev`."""
    if dev not in points or p.value > points[dev].value:
        points[dev] = p


class RunTicket:
    """What one `run()` submitted: `steps` steps one after the other. `points`
    holds the latest timeline point per device, `launched` how many of the
    steps each kernel (by id) ran, `deferred` every step's held-back kernels
    with the reason, `batches` the outbox batches of the last step."""

    def __init__(self, steps: "Stepping"):
        self._steps, self.steps = steps, 0
        self.points: dict[int, TimelinePoint] = {}
        self.launched: dict[str, int] = {}
        self.deferred: list[tuple[Kernel, str]] = []
        self.batches: list[OutboxBatch] = []

    def add(self, ticket: StepTicket) -> None:
        """Count the step(s) of the run one ticket stands for."""
        self.steps += ticket.count
        for dev, p in ticket.points.items():
            keep_latest(self.points, dev, p)
        for k in ticket.launched:
            self.launched[k.id] = self.launched.get(k.id, 0) + 1
        self.deferred += ticket.deferred
        self.batches = ticket.batches

    def wait(self, timeout: float | None = None) -> None:
        """Block (no GIL) until every device's last step of the run is done; vkmulti.TimeoutError after `timeout` s."""
        self._steps.wait_points(self.points.values(), timeout_seconds(timeout))

    def done(self) -> bool:
        """True when every step of the run is finished (never blocks)."""
        return all(self._steps.context(p.device_index).completed() >= p.value for p in self.points.values())

    def __repr__(self) -> str:
        return f"RunTicket(steps={self.steps}, devices={sorted(self.points)}, launched={self.launched})"


class RunTargets(list):
    """The kernels of a run(), checked once for the run: live Kernels of this
    runtime, each once, in the order first given. Each step still skips those
    lost with their device and raises for a destroyed one, as step() does."""


class Stepping:
    """The step loop of one KernelRuntime. `check` raises once the runtime is
    destroyed, `resolve` turns a Kernel or id into a live kernel, `live()` lists
    the live kernels, `registry` is the runtime's id -> kernel map, `device`
    gives a device's (DeviceContext, DeviceStepper); `step_hooks()` gives the
    step listeners that see each step's batches, how many retain them, and the
    hooks run before it, `listeners_quiet(kernels)` whether those listeners have
    nothing to do for steps of `kernels` that send nothing (run()'s native path);
    `life.policy_state` is the checkpoint policy's state or None (read at each
    device's step, as a policy installed meanwhile applies)."""

    def __init__(self, check: Callable[[], None], resolve: Callable[..., Kernel], live: Callable[[], list[Kernel]],
                 registry: dict, device: Callable[[int], tuple[DeviceContext, DeviceStepper]],
                 lock: threading.RLock, step_hooks: Callable[[], tuple[list, int, list]], failover: Failover,
                 life: Lifecycle, listeners_quiet: Callable[[list[Kernel]], bool] = lambda kernels: False):
        self._check, self._resolve, self._live, self._kernels = check, resolve, live, registry
        self._device, self._lock, self._failover, self._life = device, lock, failover, life
        self._step_hooks, self._listeners_quiet = step_hooks, listeners_quiet

    def context(self, index: int) -> DeviceContext:
        """The DeviceContext of device `index`."""
        return self._device(index)[0]

    def targets(self, kernels: Any) -> list[Kernel]:
        """The live kernels a step of `kernels` steps (see KernelRuntime.step): None for
        every live one; a Kernel, an id, or a list of them, each once in the order first
        given; RunTargets as they are. Kernels lost with their device are left out."""
        if kernels is None:
            targets = self._live()
        elif kernels.__class__ is RunTargets:   # (resolved once for the run)
            targets = [k for k in kernels if not self._was_lost(k)] if self._failover.lost_kernels else kernels
            for k in targets:
                k.check()
        elif isinstance(kernels, (Kernel, str)):
            targets = [] if self._was_lost(kernels) else [self._resolve(kernels)]
        else:
            resolve = self._resolve
            try:
                if self._failover.lost_kernels:
                    targets = [resolve(k, "kernels item") for k in kernels if not self._was_lost(k)]
                else:   # (none lost: no item names a lost kernel)
                    targets = [resolve(k, "kernels item") for k in kernels]
            except TypeError as exc:
                if "not iterable" in str(exc):
                    raise TypeError(f"kernels must be a Kernel, an id, a list of them or None, "
                                    f"got {type(kernels).__name__}") from None
                raise
            if len(targets) > 1:   # each kernel once, in the order first given
                targets = list({id(k): k for k in targets}.values())
        return targets

    def step(self, kernels: Any, *, wait: Any, timeout: float | None) -> StepTicket:
        """One step of `kernels` (see KernelRuntime.step)."""
        self._check()
        timeout = timeout_seconds(timeout)
        self._failover.sync_lost_devices()   # PrimaryDeviceLostError when GPU 0 is gone
        targets = self.targets(kernels)
        by_device: dict[int, list[Kernel]] = defaultdict(list)
        for k in targets:
            by_device[k.device_index].append(k)
        waits: dict[int, list[TimelinePoint]] = {}
        if wait is not None:
            given = [wait] if isinstance(wait, TimelinePoint) else list(wait)
            for p in given:
                if not isinstance(p, TimelinePoint):
                    raise TypeError(f"wait must be TimelinePoints, got {short_repr(p)}")
                if p.device_index not in by_device:
                    raise ValueError(f"wait point {short_repr(p)} is on GPU {short_repr(p.device_index)}, where no kernel of this step runs")
                waits.setdefault(p.device_index, []).append(p)
        self._raise_errors(targets)
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        listeners, retain, preparers = self._step_hooks()   # retaining listeners release each batch once
        for prepare in preparers:   # e.g. the router lets go of batches other devices finished reading
            prepare(targets, None if timeout is None else max(0.0, deadline - time.monotonic()))
        points: dict[int, TimelinePoint] = {}
        launched: list[Kernel] = []
        deferred: list[tuple[Kernel, str]] = []
        batches: list[OutboxBatch] = []
        stepped: dict[int, tuple[Any, Any]] = {}
        queue = sorted(by_device.items())
        try:
            for dev, ks in queue:   # (devices added to the queue meanwhile come after the others)
                for k in ks:
                    if k.destroyed or k.device_index != dev:   # (else all of them step here, as they are)
                        ks = self._still_here(dev, ks, queue)
                        break
                if not ks:
                    continue
                try:
                    ctx, stepper = self._device(dev)
                    # devices stepped before whose steps are done since: read them back (read in place here)
                    for src in (stepper.surveys_awaited() & stepped.keys() if stepped else ()):
                        octx, ostepper = stepped[src]
                        with octx.lock:
                            if octx.alive:
                                ostepper.harvest()
                    stepped[dev] = (ctx, stepper)
                    policy = self._life.policy_state
                    here_waits = waits.get(dev)
                    gpu_waits = as_wait_points(here_waits, dev, native=ctx.slot.native) if here_waits else ()
                    with ctx.lock:   # (a checkpoint policy's replay log copies what each step consumed, in the step)
                        point, ran, held, new = stepper.step(ks, gpu_waits, deadline, retain,
                                                             policy.plan if policy is not None else None)
                except DeviceLostError as exc:
                    policy = self._life.policy_state
                    if policy is not None and launched:   # what survivors sent in this call is logged first
                        policy.replay.after_step(launched)
                    if self._failover.step_failed(dev, exc):   # a lost secondary: failed over, the others go on
                        moved: dict[int, list[Kernel]] = defaultdict(list)
                        for k in ks:   # restored on a survivor: they make this step there
                            if not k.destroyed and k.device_index != dev and \
                                    not self._failover.device_lost(k.device_index):
                                moved[k.device_index].append(k)
                        queue += sorted(moved.items())
                        continue
                    raise
                if point is not None:
                    keep_latest(points, dev, point)
                launched += ran
                deferred += held
                batches += new
        except BaseException as exc:   # (Ctrl-C, a failed submit): what the devices stepped so far sent still
            if batches:                 # goes to the listeners, which retain it until they route it
                for listener in listeners:
                    try:
                        listener(batches)
                    except Exception as more:   # the step's own error is the one raised
                        log.warning("a step listener failed after the step failed (%s): %s", exc, more)
            raise
        for listener in listeners:   # also without new batches: a router may have moves waiting
            listener(batches)
        return StepTicket(self, points, launched, deferred, batches)

    def run(self, gated: Callable[..., StepTicket], steps: Any, kernels: Any, timeout: float | None) -> RunTicket:
        """`steps` steps of `kernels` (see KernelRuntime.run), each made by `gated(step,
        kernels, wait, timeout)` (the lifecycle's gated_step, as step() makes one),
        gathered in one ticket. The arguments are checked once for the run."""
        if not is_int(steps) or not 1 <= steps <= U64_MAX:
            raise ValueError(f"steps must be an int >= 1 (and below 2**64), got {short_repr(steps)}")
        self._check()
        timeout = timeout_seconds(timeout)
        targets = self.run_targets(kernels)
        ticket = RunTicket(self)
        step, add = self.step, ticket.add
        left = steps
        wait, since = 0, 0   # steps made one by one before the next native try, and since the last
        while left > 0:
            if QUIET_RUNS and since >= wait:
                t = gated(functools.partial(self._quiet_steps, left), targets, None, timeout)
                # (none: steps go one by one for a while, longer after each try in a row that found none)
                wait, since = (0, 0) if t.count else (min(2 * wait + 1, QUIET_RETRY_STEPS), 0)
            else:
                t = gated(step, targets, None, timeout)
                since += 1
            add(t)
            left -= t.count
        return ticket

    def _quiet_steps(self, limit: int, kernels: Any, *, wait: Any, timeout: float | None) -> StepTicket:
        """Up to `limit` steps of `kernels` as one native run of quiet steps (engine/stepper.py's
        quiet_run), for as long as QUIET_RUN_BUDGET s, where every device's next steps are
        quiet ones; an empty ticket (count 0) where they are not or the run stopped before
        its first step. Runs under the gate, as a step does."""
        empty = StepTicket(self, {}, [], [], [])
        empty.count = 0
        if wait is not None:
            return empty
        self._check()
        listeners, retain, _ = self._step_hooks()
        if self._life.policy_state is not None:
            return empty
        lost = self._failover.sync_lost_devices()
        targets = self.targets(kernels)
        if not targets or any(self._life.is_held(k) or k.errors for k in targets) \
                or not self._listeners_quiet(targets):
            return empty
        by_device: dict[int, list[Kernel]] = defaultdict(list)
        for k in targets:
            by_device[k.device_index].append(k)
        if lost and not lost.isdisjoint(by_device):
            return empty
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        pairs = [self._device(dev) for dev in sorted(by_device)]
        try:   # (steps in flight read back first, one device's lock at a time: see read_back_for_quiet)
            for ctx, stepper in pairs:
                with ctx.lock:
                    stepper.read_back_for_quiet(by_device[ctx.index], deadline)
        except DeviceLostError:
            return empty   # (a step fails over from it)
        with contextlib.ExitStack() as locks:
            for ctx, _ in pairs:
                locks.enter_context(ctx.lock)
            runs = []
            try:
                for ctx, stepper in pairs:
                    run = stepper.quiet_run(by_device[ctx.index], deadline, wait=len(pairs) == 1)
                    if run is None:
                        return empty
                    runs.append(run)
            except DeviceLostError:
                return empty   # (a step fails over from it)
            try:
                rc, at, exc = _native.run_quiet_steps(runs, limit, QUIET_RUN_BUDGET)
            except BaseException as signalled:   # (a signal raised as the call returned: its steps stand)
                rc, at, exc = _native.RUN_INTERRUPTED, -1, signalled
            failed = runs[at].result if rc == _native.RUN_FAILED else 0
            points: dict[int, TimelinePoint] = {}
            launched: list[Kernel] = []
            batches: list[OutboxBatch] = []   # (the last step's, for the ticket)
            handed: list[OutboxBatch] = []    # (those of every step left in flight, for the listeners)
            count = 0
            for (ctx, stepper), run in zip(pairs, runs):
                ks = by_device[ctx.index]
                point, n, new, every = stepper.settle_run(run, ks, retain)
                if point is not None:
                    points[ctx.index] = point
                launched += ks * n
                batches += new
                handed += every
                count = max(count, n)
            if rc == _native.RUN_NOT_QUIET:   # (that step is done: read back here, its regions are not reused)
                ctx, stepper = pairs[at]
                try:
                    stepper.harvest()
                except DeviceLostError:
                    pass
        for listener in listeners:   # (each batch retained once per retaining listener)
            try:
                listener(handed)
            except Exception as more:
                if exc is None:
                    raise
                log.warning("a step listener failed after the run was interrupted (%s): %s", exc, more)
        if exc is not None:
            raise exc
        if failed:   # (the devices before it submitted one step more) raised as step() raises a failed submit
            try:
                _native.result_check(failed, "vkQueueSubmit (a native run of quiet steps)")
            except DeviceLostError:
                pass   # (the next step fails over from it)
        ticket = StepTicket(self, points, launched, [], batches)
        ticket.count = count
        return ticket

    def run_targets(self, kernels: Any) -> Any:
        """`kernels` (a Kernel or a list or tuple of them, all live in this runtime) as
        RunTargets; anything else as given (resolved at each step, as step() does)."""
        if isinstance(kernels, Kernel):
            items: Any = (kernels,)
        elif type(kernels) is list or type(kernels) is tuple:
            items = kernels
        else:
            return kernels
        registry = self._kernels
        for k in items:
            if not isinstance(k, Kernel) or k.destroyed or registry.get(k.id) is not k:
                return kernels   # (an id, another runtime's kernel, a destroyed one: as step() finds them)
        return RunTargets({id(k): k for k in items}.values())

    def poll(self, pairs: list[tuple[DeviceContext, DeviceStepper]]) -> None:
        """Harvest what completed on each device without waiting. A device found lost
        here is skipped: the next step or wait fails over from it (poll() also runs
        inside a step, from the K2K router's listener, where no loss may surface)."""
        for ctx, stepper in pairs:
            with ctx.lock:
                if not ctx.alive:
                    continue
                try:
                    stepper.harvest()
                except DeviceLostError:
                    if not self._failover.device_lost(ctx.index):
                        raise

    @staticmethod
    def _still_here(dev: int, ks: list[Kernel], queue: list[tuple[int, list[Kernel]]]) -> list[Kernel]:
        """Those of `ks` (queued for device `dev`) that are live and still there; those
        restored elsewhere by a failover since the step began are queued for their device."""
        here: list[Kernel] = []
        elsewhere: dict[int, list[Kernel]] = defaultdict(list)
        for k in ks:
            if k.destroyed:
                continue
            at = k.device_index
            if at == dev:
                here.append(k)
            else:
                elsewhere[at].append(k)
        if elsewhere:
            queue += sorted(elsewhere.items())
        return here

    def _raise_errors(self, kernels: list[Kernel]) -> None:
        for k in kernels:
            if k.errors:
                problems, k.errors = k.errors, []
                raise KernelMessageError(k.id, problems)

    def _was_lost(self, kernel: Any) -> bool:
        """Whether `kernel` (a Kernel or an id) was on a device that was lost."""
        kid = kernel.id if isinstance(kernel, Kernel) else kernel
        return isinstance(kid, str) and kid in self._failover.lost_kernels and kid not in self._kernels

    def wait_points(self, points: Iterable[TimelinePoint], timeout: float | None) -> None:
        """Wait until every point is reached, skipping (and failing over from) lost devices."""
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        lost = self._failover.sync_lost_devices()
        for p in points:
            if p.device_index in lost:
                continue   # the work of a lost device never completes; its kernels were failed over
            try:
                self.wait_point(p, deadline, timeout)
            except DeviceLostError as exc:
                if not self._failover.step_failed(p.device_index, exc):
                    raise

    def wait_point(self, p: TimelinePoint, deadline: float, timeout: float | None) -> None:
        """Wait (harvesting) until `p` is reached; vkmulti.TimeoutError at `deadline`."""
        ctx, stepper = self._device(p.device_index)
        with ctx.lock:
            while True:
                stepper.harvest()
                ctx.check()
                if ctx.completed() >= p.value:
                    stepper.harvest()
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise VkmTimeout(f"GPU {p.device_index}: kernel step {p.value} not done within {timeout} s "
                                     f"({stepper.stalled()})")
                try:
                    ctx.wait_unlocked(p.value, min(left, 0.25))
                except VkmTimeout:
                    pass
