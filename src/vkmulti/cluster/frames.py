"""SRU frames across the cluster: plan over the nodes, render on their agents, composite here.

Each round plans the SRUs still to render over the live nodes (planner.plan_nodes),
sends every node its share, and takes the images as they arrive; a node that
fails is lost and its SRUs go into the next round on the others. The images
are composited on the driver in input order once all are in.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .._core.reprs import compact_repr
from .errors import NoAgentError, caller_error, short_error
from .planner import NodeInfo, NodePlan, composite_frame, plan_nodes
from .replies import render_reply_problem

if TYPE_CHECKING:
    from ..offload.types import SruId

__all__ = ["ClusterFrame", "NodeFrameReport", "render_frame"]

#: Frames where a node was busy less than this do not adjust its throughput (overhead, not work).
_MIN_OBSERVED_S = 0.005


@dataclass
class NodeFrameReport:
    """One node's part of a frame."""

    __repr__ = compact_repr

    node_id: str
    srus: list[SruId] = field(default_factory=list)     # SRU ids it rendered (all rounds)
    gpu: dict[SruId, int] = field(default_factory=dict)  # sru_id -> the node's GPU index
    render_s: float = 0.0                                # agent: submit to all renders done
    readback_s: float = 0.0                              # agent: images GPU -> host
    agent_s: float = 0.0                                 # agent: whole call
    round_trip_s: float = 0.0                            # driver: dispatch to images here
    nbytes: int = 0                                      # image bytes returned
    local: bool = False                                  # on the driver's node (shared memory)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data (times in ms)."""
        return {"node_id": self.node_id, "srus": list(self.srus), "gpu": {str(k): v for k, v in self.gpu.items()},
                "render_ms": self.render_s * 1e3, "readback_ms": self.readback_s * 1e3,
                "agent_ms": self.agent_s * 1e3, "round_trip_ms": self.round_trip_s * 1e3,
                "bytes": self.nbytes, "local": self.local}


@dataclass
class ClusterFrame:
    """A frame rendered on the cluster: the pixels and what each node did."""

    __repr__ = compact_repr

    pixels: np.ndarray                                   # (height, width, 8) uint8 (RGBA16F)
    nodes: dict[str, NodeFrameReport]
    plans: list[NodePlan]                                # one per round (more than one after a loss)
    replanned: dict[SruId, str] = field(default_factory=dict)   # sru_id -> node id it was first sent to
    lost: dict[str, str] = field(default_factory=dict)   # node id -> why, lost during this frame
    total_s: float = 0.0
    composite_s: float = 0.0

    @property
    def bytes_moved(self) -> int:
        """Image bytes that crossed the network (from nodes other than the driver's)."""
        return sum(r.nbytes for r in self.nodes.values() if not r.local)

    @property
    def bytes_zero_copy(self) -> int:
        """Image bytes read from the driver's own node through shared memory."""
        return sum(r.nbytes for r in self.nodes.values() if r.local)


def render_frame(cm: Any, srus: list, width: int, height: int, clear: Any, candidates: list[NodeInfo],
                 on_dispatch: Callable[[int, NodePlan], object] | None) -> ClusterFrame:
    """One frame over `candidates` (ClusterManager.render_frame has checked the arguments)."""
    t0 = time.perf_counter()
    images: dict[Any, np.ndarray] = {}
    frame = ClusterFrame(np.empty(0, np.uint8), {}, [])
    first_node: dict[SruId, str] = {}
    todo, rnd = srus, 0
    while todo:
        live = [n for n in candidates if n.node_id not in cm.lost]
        if not live:
            raise NoAgentError(f"every node was lost during the frame: {cm.lost}")
        plan = plan_nodes(todo, live, cm.links)
        frame.plans.append(plan)
        refs = {}
        for node_id, group in plan.srus.items():
            if group:
                refs[cm._agents[node_id].render.remote(group)] = (node_id, group, time.perf_counter())
                for s in group:
                    first_node.setdefault(s.sru_id, node_id)
        if on_dispatch is not None:
            on_dispatch(rnd, plan)
        todo = _collect(cm, refs, images, frame)
        rnd += 1
    final = {sid: node_id for node_id, rep in frame.nodes.items() for sid in rep.srus}
    frame.replanned = {sid: n for sid, n in first_node.items() if final[sid] != n}
    t1 = time.perf_counter()
    frame.pixels = composite_frame(width, height, [(images[s.sru_id], s.x, s.y) for s in srus], clear)
    frame.composite_s = time.perf_counter() - t1
    frame.total_s = time.perf_counter() - t0
    return frame


def _collect(cm: Any, refs: dict, images: dict, frame: ClusterFrame) -> list[Any]:
    """Wait for one round's results; returns the SRUs of nodes that failed (to re-plan)."""
    ray = cm._ray
    pending = list(refs)
    retry: list[Any] = []
    bad: BaseException | None = None
    deadline = time.monotonic() + cm.timeout
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            for ref in pending:
                node_id, group, _ = refs[ref]
                cm._lose(node_id, f"did not answer within {cm.timeout:g} s", frame)
                retry += group
            break
        ready, pending = ray.wait(pending, num_returns=1, timeout=min(0.5, left))
        for ref in ready:
            node_id, group, sent = refs[ref]
            try:
                r = ray.get(ref)
            except ray.exceptions.RayError as exc:
                if caller_error(exc) is not None:     # the input's fault, not the node's
                    bad = bad or caller_error(exc)
                    continue
                cm._lose(node_id, short_error(exc), frame)
                retry += group
                continue
            why = render_reply_problem(r, group)
            if why is not None:
                cm._lose(node_id, f"sent a malformed result: {why}", frame)
                retry += group
                continue
            _observe(cm, node_id, r)
            rep = frame.nodes.setdefault(node_id, NodeFrameReport(node_id, local=cm.nodes[node_id].local))
            rep.round_trip_s += time.perf_counter() - sent
            rep.render_s += r["render_s"]
            rep.readback_s += r["readback_s"]
            rep.agent_s += r["total_s"]
            for s in group:
                img = r["images"][s.sru_id]
                images[s.sru_id] = img
                rep.srus.append(s.sru_id)
                rep.gpu[s.sru_id] = r["gpu"][s.sru_id]
                rep.nbytes += img.nbytes
    if bad is not None:
        raise bad
    return retry


def _observe(cm: Any, node_id: str, r: dict) -> None:
    """Move the node's throughput toward what this frame showed (exponential average with
    weight `adapt`), so a calibration off by contention or clocks corrects itself."""
    busy, predicted = r["render_s"] + r["readback_s"], r.get("predicted_s")
    if not cm.adapt or not predicted or busy < _MIN_OBSERVED_S:
        return
    info, calibrated = cm.nodes[node_id], cm._calibrated.get(node_id)
    if calibrated is None:
        return
    shown = sum(calibrated) * predicted / busy          # the agent predicted with the calibration
    total = (1.0 - cm.adapt) * info.throughput + cm.adapt * shown
    cm.nodes[node_id] = dataclasses.replace(
        info, gpu_throughput=tuple(x * total / sum(calibrated) for x in calibrated))
