"""The destroy-racing-use matrix of test_kernel_destroy_races.py, run in a child
process (child(), matrix(destroyer, rounds), child_done()): it ends with "ok",
or exits with what went wrong; and the lost-GPU matrix (loss_matrix(loser,
timeout, rounds)), whose runtime restores the lost GPU's kernel on the survivor.

Each round builds a runtime with a K2K router over the virtual pair (a sink on
GPU 0, a forwarder on GPU 1 sending to it), lines up four user threads and the
destroyer on a barrier, lets the users loop over their calls with small random
pauses, destroys after a random pause, and then checks: every user call did its
job or raised a vkmulti error, no thread hangs, the runtime still works (or is
cleanly destroyed), the sink saw no message out of order, and the validation
layer reported nothing (leaks included, at the manager's destroy)."""
from __future__ import annotations

import os
import random
import sys
import threading
import time
import traceback
from typing import Any, Callable

#: the destroyers, by name (see destroyers())
DESTROYERS = ("rt.destroy", "destroy_kernel", "router.detach", "mgr.destroy", "migrate", "reload", "lose_device",
              "report_device_lost")
#: the destroyers that always end what they destroy (no error of theirs is let pass; a migration
#: or a reload may be refused, a lost device's drain may time out)
MUST_END = ("rt.destroy", "destroy_kernel", "router.detach", "mgr.destroy", "report_device_lost")
MAX = 32
#: user threads per round (round r races users USERS*r .. USERS*r + USERS-1 of the list, cyclically)
USERS = 4
JOIN = 60.0


class World:
    """One round's runtime, router and kernels; `cp` a checkpoint of the forwarder."""

    def __init__(self, mgr: Any, policy: Any = None):
        import numpy as np
        from vkmulti import CrossGpuK2KRouter
        from vkmulti.kernels import KernelRuntime, MultiGpuCoordinator
        from vkmulti.kernels.reference import COUNTER_TAG_FORWARD

        self.mgr = mgr
        self.rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr, max_kernels=MAX)
        if policy is not None:   # (before the launches: each kernel is captured at once)
            self.rt.set_checkpoint_policy(policy)
        self.router = CrossGpuK2KRouter(self.rt.coordinator, self.rt)
        self.sink = self.counter("sink", 0)
        self.fwd = self.counter("fwd", 1, params=[self.sink.address])
        self.rt.send(self.fwd, np.array([1], np.uint32), tag=COUNTER_TAG_FORWARD)
        self.ticket = self.rt.step()
        self.cp = self.rt.checkpoint(self.fwd)

    def counter(self, name: str, device: int, **kw: Any) -> Any:
        from vkmulti.kernels import counter_kernel
        from vkmulti.kernels.reference import counter_initial_state

        return self.rt.launch(counter_kernel(max_sources=MAX, inbox_capacity=8, outbox_capacity=8), name,
                              device=device, state=[counter_initial_state(MAX)], **kw)


def destroyers(w: World) -> dict[str, Callable[[], Any]]:
    from vkmulti import HotReloadConfig, HotReloadManager, KernelCodeSource
    from vkmulti.testing import lose_device

    def reload() -> None:
        reloads = HotReloadManager(HotReloadConfig().with_preserve_state(True).with_validate_before_swap(False)
                                   .with_timeout(30.0))
        reloads.register_runtime_kernel(w.fwd)
        raw = bytearray(w.fwd.spec.spirv)
        raw[8:12] = random.randrange(0xC000, 0xD000).to_bytes(4, "little")   # new bytes: a cold compile
        reloads.reload(w.fwd, KernelCodeSource.from_spirv(bytes(raw)))
    return {
        "rt.destroy": lambda: w.rt.destroy(),
        "destroy_kernel": lambda: w.rt.destroy_kernel(w.fwd),
        "router.detach": lambda: w.router.detach(),
        "mgr.destroy": lambda: w.mgr.destroy(),
        "migrate": lambda: w.rt.migrate(w.fwd, 1 - w.fwd.device_index, timeout=30),
        "reload": reload,
        "lose_device": lambda: lose_device(w.mgr, 1),
        "report_device_lost": lambda: w.mgr.report_device_lost(1, "kernel_races"),
    }


def users(w: World) -> list[tuple[str, Callable[[], Any]]]:
    import numpy as np
    from vkmulti.kernels.reference import COUNTER_TAG_FORWARD, COUNTER_TAG_QUERY

    rt, router, one = w.rt, w.router, np.array([1], np.uint32)

    def receive() -> None:
        rt.send(w.fwd, one, tag=COUNTER_TAG_QUERY, timeout=5)
        rt.step(w.fwd)
        rt.receive(w.fwd, timeout=5)

    def restore() -> None:
        k = rt.restore(w.cp, kernel_id=f"r{random.randrange(1 << 30)}", device=random.randrange(2))
        rt.destroy_kernel(k)

    def coordinator() -> None:
        c = rt.coordinator
        c.kernel_map(), c.get_kernel_device("fwd"), c.kernels_on_device(1), c.get_all_status(), c.stats()
        c.select_device_for_k2k("fwd")

    def tickets() -> None:
        rt.step().wait(10)
        w.ticket.wait(10)
        w.ticket.done()
    return [
        ("step", lambda: rt.step()),
        ("run", lambda: rt.run(4)),
        ("run of two", lambda: rt.run(4, [w.fwd, w.sink])),
        ("send", lambda: rt.send(w.fwd, one, tag=COUNTER_TAG_FORWARD, timeout=5)),
        ("receive", receive),
        ("pending_receives", lambda: rt.pending_receives(w.fwd)),
        ("read_state", lambda: rt.read_state(w.fwd)),
        ("write_state", lambda: rt.write_state(w.fwd, 0, np.zeros(4, np.uint8), offset=64)),
        ("checkpoint", lambda: rt.checkpoint(w.fwd)),
        ("latest_checkpoint", lambda: rt.latest_checkpoint(w.fwd)),
        ("restore", restore),
        ("restore into", lambda: rt.restore(w.cp, into=w.fwd)),
        ("migrate", lambda: rt.migrate(w.fwd, 1 - w.fwd.device_index, timeout=30)),
        ("route_message", lambda: router.route_message("fwd", "sink", one, timeout=1)),
        ("router queries", lambda: (router.stats(), router.idle(), router.flush(), router.edge_traffic())),
        ("tickets", tickets),
        ("coordinator", coordinator),
        ("is_held", lambda: rt.is_held(w.fwd)),
        ("synchronize", lambda: (rt.synchronize(10), rt.poll())),
        ("lookups", lambda: (rt.kernels, rt.kernel("fwd"), repr(rt), repr(w.fwd), repr(router))),
    ]


def start_users(uses: list[tuple[str, Callable[[], Any]]], rng: random.Random, problems: list[str],
                stop: threading.Event) -> list[threading.Thread]:
    """A thread per (name, call) calling it in a loop, with short random pauses, until `stop`
    is set (a vkmulti error is an answer; anything else goes into `problems` and ends that
    thread); returns the threads once all of them are running."""
    from vkmulti.errors import VkmError

    barrier = threading.Barrier(len(uses) + 1)

    def loop(name: str, use: Callable[[], Any]) -> None:
        barrier.wait(JOIN)
        while not stop.is_set():
            try:
                use()
            except VkmError:
                pass
            except BaseException:   # reported
                problems.append(f"{name}: {traceback.format_exc()}")
                return
            time.sleep(rng.uniform(0, 0.002))
    threads = [threading.Thread(target=loop, args=u, name=u[0], daemon=True) for u in uses]
    for t in threads:
        t.start()
    barrier.wait(JOIN)
    return threads


def stop_users(threads: list[threading.Thread], stop: threading.Event, problems: list[str], after: str) -> None:
    """Stop start_users' threads; one that still runs JOIN s later is a hang, reported as such."""
    stop.set()
    for t in threads:
        t.join(JOIN)
        if t.is_alive():
            problems.append(f"{t.name} still runs {JOIN} s after {after}")


def race(destroyer: str, round_: int, mgr: Any, rng: random.Random) -> list[str]:
    """One round; returns what went wrong."""
    from vkmulti.errors import VkmError

    w = World(mgr)
    listed = users(w)
    chosen = [listed[(USERS * round_ + j) % len(listed)] for j in range(USERS)]
    destroy = destroyers(w)[destroyer]
    problems: list[str] = []
    stop = threading.Event()
    threads = start_users(chosen, rng, problems, stop)
    time.sleep(rng.uniform(0, 0.03))
    try:
        destroy()
    except VkmError:
        if destroyer in MUST_END:
            problems.append(f"{destroyer}: {traceback.format_exc()}")
    except BaseException:   # reported
        problems.append(f"{destroyer}: {traceback.format_exc()}")
    time.sleep(0.01)
    stop_users(threads, stop, problems, f"the {destroyer} (a hang)")
    if not problems:
        problems += after(w, destroyer)
    return problems


def after(w: World, destroyer: str) -> list[str]:
    """Still usable, or cleanly destroyed."""
    from vkmulti import DestroyedError, KernelMessageError
    from vkmulti.kernels.reference import read_counter

    try:
        if w.mgr.destroyed or w.rt.device_lost(1) or destroyer == "rt.destroy":
            try:
                w.rt.step()
                if destroyer in ("rt.destroy", "mgr.destroy"):
                    return ["the runtime still steps after its destroy"]
            except DestroyedError:
                pass
        else:
            try:
                w.rt.step()
            except KernelMessageError:   # (a sender whose messages the router dropped is told once)
                w.rt.step()
            w.rt.synchronize(30)
            if read_counter(w.rt.read_state(w.sink)).fifo_errors:
                return ["the sink saw messages out of order"]
        w.router.detach()
        w.rt.destroy()
    except Exception:   # reported
        return [f"after the {destroyer}: {traceback.format_exc()}"]
    return []


def child() -> None:
    """A child process's set-up: the validation layer on, the virtual pair, the device
    locks' order checked; past VKMULTI_CHILD_HANG_S s every thread's stack goes to stderr
    and the child ends."""
    import faulthandler

    os.environ["VKMULTI_VALIDATION"] = "1"
    faulthandler.enable()   # (a crash shows every thread's stack)
    hang = float(os.environ.get("VKMULTI_CHILD_HANG_S", "0"))
    if hang > 0:
        faulthandler.dump_traceback_later(hang, exit=True)
    import lock_order

    lock_order.install()
    from vkmulti.testing import install_virtual_gpus

    install_virtual_gpus(2)


def child_done() -> None:
    """A child process's end: no validation error (leaks included), no device lock taken
    out of order (lock_order.py: no cycle of lock classes), then "ok"."""
    from vkmulti.device.instance import drain_all_validation_messages

    import lock_order

    errors = [text for sev, text in drain_all_validation_messages() if sev == "error"]
    if errors:
        sys.exit("validation errors:\n" + "\n".join(errors[:3]))
    if lock_order.problems:
        sys.exit("locks taken out of order (a deadlock waiting to happen):\n" + "\n".join(lock_order.problems[:2]))
    print("ok", flush=True)


def matrix(destroyer: str, rounds: int) -> None:
    """`rounds` races of `destroyer` against USERS users each; a failure ends the process
    with what went wrong."""
    from vkmulti import MultiDeviceManager
    from vkmulti.device.instance import drain_all_validation_messages

    rng = random.Random(f"{destroyer}{rounds}")
    mgr = None
    for r in range(rounds):
        if mgr is None or mgr.destroyed or destroyer in ("lose_device", "report_device_lost"):
            if mgr is not None:
                mgr.destroy()
            mgr = MultiDeviceManager.create(enabled=True)
        problems = race(destroyer, r, mgr, rng)
        problems += [text for sev, text in drain_all_validation_messages() if sev == "error"][:3]
        if problems:
            sys.exit("\n".join([f"{destroyer}, round {r}:", *problems]))
    if mgr is not None:
        mgr.destroy()


# -- a lost GPU whose kernel the failover moves to the survivor ----------------------------------

#: how a round loses GPU 1: the fault hook (its work drained), or a loss reported as a real one
LOSERS = ("lose_device", "report_device_lost")
#: users raced against the loss, each round all of them at once
LOSS_USERS = ("read_state", "write_state", "step", "run", "receive", "checkpoint", "migrate", "synchronize",
              "restore into")
#: bytes of the counter's state that no step reads or writes (its header's padding): write_state's target
PAD = 48


def loss_users(w: World, timeout: float | None, queries: list[int]) -> dict[str, Callable[[], Any]]:
    """The calls raced against the loss, each with `timeout` (None: no limit); `queries`
    counts the replies the receive user got."""
    import numpy as np
    from vkmulti.kernels.reference import COUNTER_TAG_FORWARD, COUNTER_TAG_QUERY

    rt, one = w.rt, np.array([1], np.uint32)

    def receive() -> None:   # a query whose step ran gets its one reply, whatever the loss did meanwhile
        rt.send(w.fwd, one, tag=COUNTER_TAG_QUERY, timeout=timeout)
        ticket = rt.step(w.fwd, timeout=timeout)
        if any(k is w.fwd for k in ticket.launched):
            rt.receive(w.fwd, timeout=timeout)
            queries.append(1)
        else:   # (held back: a move or a restore of the other users)
            rt.step(w.fwd, timeout=timeout)
    return {
        "read_state": lambda: rt.read_state(w.fwd, timeout=timeout),
        "write_state": lambda: rt.write_state(w.fwd, 0, np.zeros(4, np.uint8), offset=PAD, timeout=timeout),
        "step": lambda: (rt.send(w.fwd, one, tag=COUNTER_TAG_FORWARD, timeout=timeout), rt.step(timeout=timeout)),
        "run": lambda: rt.run(3, timeout=timeout),
        "receive": receive,
        "checkpoint": lambda: rt.checkpoint(w.fwd, timeout=timeout),
        "migrate": lambda: rt.migrate(w.fwd, 1 - w.fwd.device_index, timeout=timeout),
        "synchronize": lambda: (rt.synchronize(timeout), rt.poll()),
        "restore into": lambda: rt.restore(w.cp, into=w.fwd, timeout=timeout),
    }


def loss_race(loser: str, timeout: float | None, mgr: Any, rng: random.Random, users: tuple[str, ...]) -> list[str]:
    """One round: `users` loop over their calls while GPU 1 is lost (by `loser`); returns
    what went wrong. Every call does its job or raises a vkmulti error and ends (a hang is
    reported after JOIN s); then the forwarder is on the survivor, restored or listed
    lost and destroyed (never left on the lost GPU), and the runtime steps on."""
    from vkmulti.errors import VkmError
    from vkmulti.kernels import CheckpointPolicy
    from vkmulti.testing import lose_device

    w = World(mgr, CheckpointPolicy(every_steps=2))
    queries: list[int] = []
    calls = loss_users(w, timeout, queries)
    problems: list[str] = []
    stop = threading.Event()
    threads = start_users([(u, calls[u]) for u in users], rng, problems, stop)
    time.sleep(rng.uniform(0, 0.04))
    try:
        if loser == "lose_device":
            lose_device(mgr, 1)
        else:
            mgr.report_device_lost(1, "kernel_races")
    except VkmError:   # (the hook's drain may time out: the device stays marked lost)
        pass
    time.sleep(rng.uniform(0, 0.05))
    stop_users(threads, stop, problems, f"the {loser} (timeout={timeout}): a hang")
    if not problems:
        problems += after_loss(w)
    return problems


def after_loss(w: World) -> list[str]:
    """The forwarder restored on the survivor or lost (destroyed), never on the lost GPU;
    the runtime steps, reads and tears down."""
    from vkmulti.kernels.reference import read_counter

    rt, fwd = w.rt, w.fwd
    try:
        rt.step(timeout=30)
        rt.synchronize(30)
        if not fwd.destroyed and rt.device_lost(fwd.device_index):
            return [f"fwd is left on lost GPU {fwd.device_index} (restored: {dict(rt.restored_kernels)}, lost: "
                    f"{dict(rt.lost_kernels)})"]
        if fwd.destroyed != (fwd.id in rt.lost_kernels):
            return [f"fwd destroyed={fwd.destroyed}, lost kernels {dict(rt.lost_kernels)}"]
        if not fwd.destroyed:
            rt.read_state(fwd, timeout=30)
        read_counter(rt.read_state(w.sink, timeout=30))
        w.router.detach()
        rt.destroy(timeout=30)
    except Exception:   # reported
        return [f"after the loss: {traceback.format_exc()}"]
    return []


def loss_matrix(loser: str, timeout: float | None, rounds: int) -> None:
    """`rounds` races of a loss (by `loser`) against the users of LOSS_USERS (all but one or
    two of them in turn), each call with `timeout`; a failure ends the process with what
    went wrong. "receive" and "restore into" take turns: a restore into the forwarder from
    its lost GPU, before the failover, rolls it back past the steps the GPU ran and never
    reported (their replies are dropped with that GPU, as without a checkpoint policy)."""
    from vkmulti import MultiDeviceManager
    from vkmulti.device.instance import drain_all_validation_messages

    rng = random.Random(f"{loser}{timeout}{rounds}")
    for r in range(rounds):
        left_out = ("restore into" if r % 2 else "receive", LOSS_USERS[r // 2 % len(LOSS_USERS)])
        users = tuple(u for u in LOSS_USERS if u not in left_out)
        mgr = MultiDeviceManager.create(enabled=True)
        try:
            problems = loss_race(loser, timeout, mgr, rng, users)
        finally:
            mgr.destroy(timeout=30)
        problems += [text for sev, text in drain_all_validation_messages() if sev == "error"][:3]
        if problems:
            sys.exit("\n".join([f"{loser}, timeout={timeout}, round {r}, users {users}:", *problems]))
