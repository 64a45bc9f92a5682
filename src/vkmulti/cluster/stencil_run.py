"""The Jacobi stencil across a Ray cluster, driven from the driver.

The grid's rows are split into one contiguous slab per node, in proportion
to the nodes' measured throughput (the stencil's cost is per cell, so a node
of twice the throughput takes twice the rows); each agent splits its slab over
its GPUs the same way (cluster/stencil.py). Every step each node needs the
edge rows its neighbours produced in the step before: the driver submits a
whole run of steps up front as actor calls whose arguments are the
neighbours' previous results, so Ray moves each halo row straight from one
agent to the next through the object store and no step waits for the driver.

Every `checkpoint_every` steps the driver collects the field. When a node is
lost (its agent dies, raises, or makes no progress within the manager's
`timeout`), the run goes back to the last checkpoint, re-splits the rows over
the nodes that are left and goes on; integer arithmetic makes the result
bit-identical to jacobi_reference whatever the split.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .._core.reprs import compact_repr
from .errors import ClusterError, NoAgentError, caller_error, short_error
from .planner import NodeInfo
from .replies import gpu_rows_problem
from .stencil import split_rows_weighted
from .._core.checks import is_int, short_repr

__all__ = ["StencilRun", "run_stencil"]


@dataclass
class StencilRun:
    """The result of a cluster stencil run and what it took."""

    __repr__ = compact_repr

    field: np.ndarray                                    # (height, width) int32 after `steps` steps
    steps: int
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # type: ignore[operator] # node id -> {'rows': (row0, n), 'gpu_rows': {gpu: n}}
    step_s: float = 0.0                                  # wall time per step (steps only, last split)
    total_s: float = 0.0
    setup_s: float = 0.0
    halo_bytes_per_step: int = 0                         # edge rows that cross between nodes each step
    restarts: list[dict[str, Any]] = field(default_factory=list)  # type: ignore[operator] # {'lost': {node: why}, 'from_step': k}

    def to_dict(self) -> dict[str, Any]:
        """The run's figures as plain JSON-ready data (the field by its shape)."""
        return {"steps": self.steps, "shape": list(self.field.shape),
                "nodes": {n: {"rows": list(v["rows"]), "gpu_rows": {str(g): r for g, r in v["gpu_rows"].items()}}
                          for n, v in self.nodes.items()},
                "step_ms": self.step_s * 1e3, "total_ms": self.total_s * 1e3, "setup_ms": self.setup_s * 1e3,
                "halo_bytes_per_step": self.halo_bytes_per_step, "restarts": self.restarts}


def _check_problem(field_: Any, top: Any, bottom: Any, steps: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    f = np.asarray(field_)
    if f.ndim != 2 or f.dtype != np.int32:
        raise TypeError(f"field must be a 2D int32 array, got {f.dtype} of shape {f.shape}")
    h, w = f.shape
    if h < 1 or w < 3:
        raise ValueError(f"field must have >= 1 row and >= 3 columns, got shape {f.shape}")
    rows = []
    for label, r in (("top", top), ("bottom", bottom)):
        a = np.asarray(r)
        if a.shape != (w,) or a.dtype != np.int32:
            raise ValueError(f"{label} must be a ({w},) int32 row, got {a.dtype} of shape {a.shape}")
        rows.append(np.ascontiguousarray(a))
    if not is_int(steps) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {short_repr(steps)}")
    return np.ascontiguousarray(f), rows[0], rows[1]


def _check_payload(payload_size: Any, width: int) -> None:
    if not is_int(payload_size) or not 16 <= payload_size <= 65536 \
            or payload_size % 16:
        raise ValueError(f"payload_size must be a multiple of 16 in [16, 65536], got {short_repr(payload_size)}")
    if -(-width * 4 // payload_size) > 255:
        raise ValueError(f"a {width}-cell row needs more than 255 messages of {payload_size} bytes; "
                         f"raise payload_size to at least {-(-width * 4 // 255 // 16) * 16}")


def run_stencil(cm: Any, field_: Any, top: Any, bottom: Any, steps: int, *, nodes: Sequence[str] | None = None,
                checkpoint_every: int = 32, payload_size: int = 256,
                on_dispatch: Callable[[int, dict[str, tuple[int, int]]], object] | None = None) -> StencilRun:
    """`steps` Jacobi steps of `field_` (int32, fixed `top`/`bottom` rows and outer columns) across
    the cluster; see the module docstring. `on_dispatch(first_step, split)` is called after each
    run of steps is submitted (split: node id -> (row0, rows))."""
    state, top, bottom = _check_problem(field_, top, bottom, steps)
    if not is_int(checkpoint_every) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be an int >= 1, got {short_repr(checkpoint_every)}")
    if on_dispatch is not None and not callable(on_dispatch):
        raise TypeError("on_dispatch must be callable or None")
    h, w = state.shape
    _check_payload(payload_size, w)
    run = StencilRun(state.copy(), steps)
    if steps == 0:
        return run
    t_start = time.perf_counter()
    done = 0
    while True:
        live = [n for n in cm._usable(nodes) if n.node_id not in cm.lost]
        if not live:
            raise NoAgentError(f"every node was lost during the stencil run: {cm.lost}")
        order = sorted(live, key=lambda n: (not n.local, n.node_id))
        parts = [(n, r0, k) for n, (r0, k) in zip(order, split_rows_weighted(h, [n.throughput for n in order]))
                 if k > 0]
        t0 = time.perf_counter()
        failed = _setup(cm, parts, state, top, bottom, payload_size, run)
        run.setup_s += time.perf_counter() - t0
        if failed:
            _restart(cm, run, failed, done, parts)
            continue
        run.halo_bytes_per_step = 2 * (len(parts) - 1) * w * 4
        if done >= steps:
            break
        chunk = min(checkpoint_every, steps - done)
        t0 = time.perf_counter()
        fields, failed = _advance(cm, parts, chunk, on_dispatch, done, w)
        if failed:
            _restart(cm, run, failed, done, parts)
            continue
        run.step_s = (time.perf_counter() - t0) / chunk
        state = np.vstack([fields[n.node_id] for n, _, _ in parts])
        done += chunk
    for n, _, _ in parts:
        cm._agents[n.node_id].stencil_teardown.remote()
    run.field = state
    run.total_s = time.perf_counter() - t_start
    return run


def _setup(cm: Any, parts: list[tuple[NodeInfo, int, int]], state: np.ndarray, top: np.ndarray,
           bottom: np.ndarray, payload_size: int, run: StencilRun) -> dict[str, str]:
    """Hand every node its slab; returns the nodes that failed (node id -> why)."""
    h = state.shape[0]
    refs = {}
    for n, r0, k in parts:
        above = state[r0 - 1] if r0 > 0 else top
        below = state[r0 + k] if r0 + k < h else bottom
        refs[cm._agents[n.node_id].stencil_setup.remote(state[r0:r0 + k], above, below, payload_size)] = n.node_id
    got = cm._gather(refs, cm.timeout, "set up its stencil slab")
    run.nodes = {}
    failed = {}
    for n, r0, k in parts:
        r = got[n.node_id]
        if isinstance(r, BaseException) and caller_error(r) is not None:
            raise caller_error(r)  # type: ignore[misc]
        if isinstance(r, BaseException):
            failed[n.node_id] = _why(r)
        elif (why := gpu_rows_problem(r, k)) is not None:   # (a peer's reply: checked before it is kept)
            failed[n.node_id] = f"it set up its stencil slab but answered malformed: {why}"
        else:
            run.nodes[n.node_id] = {"rows": (r0, k), "gpu_rows": dict(r)}
    return failed


def _advance(cm: Any, parts: list[tuple[NodeInfo, int, int]], chunk: int,
             on_dispatch: Callable[[int, dict[str, tuple[int, int]]], object] | None, first_step: int,
             width: int) -> tuple[dict, dict[str, str]]:
    """Submit `chunk` steps on every node (halo rows flow agent to agent), then each slab's field;
    returns ({node id: rows}, failed nodes). A slab that is not the node's (rows, `width`) int32
    counts as the node's failure: stacked as it came, it would change the field's shape or type."""
    ray = cm._ray
    agents = [cm._agents[n.node_id] for n, _, _ in parts]
    last = len(parts) - 1
    prev: list[Any] = [None] * len(parts)
    pending: dict[Any, str] = {}
    every: list[Any] = []
    for s in range(chunk):
        cur = []
        for i, a in enumerate(agents):
            above = prev[i - 1][1] if i > 0 and prev[i - 1] is not None else None
            below = prev[i + 1][0] if i < last and prev[i + 1] is not None else None
            refs = a.stencil_step.options(num_returns=2).remote(above, below)
            cur.append(refs)
            pending[refs[0]] = parts[i][0].node_id
            every += refs
        prev = cur
    field_refs = {a.stencil_field.remote(): n.node_id for a, (n, _, _) in zip(agents, parts)}
    pending.update(field_refs)
    if on_dispatch is not None:
        on_dispatch(first_step, {n.node_id: (r0, k) for n, r0, k in parts})
    fields: dict[str, np.ndarray] = {}
    errors: dict[str, BaseException] = {}
    rows = {n.node_id: k for n, _, k in parts}
    todo = list(pending)
    deadline = time.monotonic() + cm.timeout
    while todo:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, todo = ray.wait(todo, num_returns=1, timeout=min(0.5, left))
        if ready:
            deadline = time.monotonic() + cm.timeout         # progress: the clock starts again
        for ref in ready:
            try:
                value = ray.get(ref)
            except ray.exceptions.RayError as exc:
                errors.setdefault(pending[ref], exc)
                continue
            if ref in field_refs:
                node_id, want = field_refs[ref], (rows[field_refs[ref]], width)
                if isinstance(value, np.ndarray) and value.dtype == np.int32 and value.shape == want:
                    fields[node_id] = value
                else:
                    got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
                    errors.setdefault(node_id, ClusterError(f"sent a malformed slab ({got[:80]}, not {want} "
                                                            f"int32)"))
    if not todo and not errors:
        return fields, {}
    failed = _blame(cm, parts, errors, {pending[r] for r in todo})
    for n in failed:
        cm._lose(n, failed[n])
    _settle(ray, every + list(field_refs))
    return fields, failed


def _settle(ray: Any, refs: list) -> None:
    """Get what the failed run's calls come to (errors, once the lost agents are killed), so
    Ray does not report each as an unhandled error; bounded."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=5.0)
    for ref in ready:
        try:
            ray.get(ref)
        except ray.exceptions.RayError:
            pass


def _blame(cm: Any, parts: list, errors: dict[str, BaseException], silent: set[str]) -> dict[str, str]:
    """Which nodes failed: agents that no longer answer, else the one whose own code raised,
    else those that made no progress. (A node's steps also fail when a neighbour's did, as
    they take its rows.)"""
    ray = cm._ray
    out: dict[str, str] = {}
    for n, _, _ in parts:
        try:
            ray.get(cm._agents[n.node_id].ping.remote(), timeout=min(10.0, cm.timeout))
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
            out[n.node_id] = _why(errors.get(n.node_id, exc))
    if out:
        return out
    pids = {p: n for n, p in cm._pids.items()}
    for node_id, exc in errors.items():  # type: ignore[misc]
        if getattr(exc, "pid", None) in pids and pids[exc.pid] == node_id:  # type: ignore[misc]
            out[node_id] = _why(exc)  # type: ignore[misc]
    if out:
        return out
    if silent:
        return {n: f"made no progress within {cm.timeout:g} s" for n in silent}
    return {n: _why(e) for n, e in errors.items()}


def _restart(cm: Any, run: StencilRun, failed: dict[str, str], done: int, parts: list) -> None:
    for node_id, why in failed.items():
        if node_id not in cm.lost:
            cm._lose(node_id, why)
    for n, _, _ in parts:
        if n.node_id not in cm.lost:
            cm._agents[n.node_id].stencil_teardown.remote()
    run.restarts.append({"lost": dict(failed), "from_step": done})


def _why(exc: BaseException) -> str:
    return short_error(exc)
