"""The cluster manager on the driver: node agents, measured links, two-level placement, frames.

`ClusterManager` finds the nodes that offer `vk_gpu`, reserves one bundle per
node in a STRICT_SPREAD placement group and starts a NodeAgent in each (so
exactly one agent per node), asks each for its devices, measures each node's
render throughput and its link to the driver through Ray's object store, and
runs the two workloads: SRU frames (frames.py: SRUs planned over the nodes,
each agent splits its share over its GPUs, the images come back as numpy
arrays through the object store, shared memory from the driver's own node,
and are composited on the driver) and the Jacobi stencil (stencil_run.py).
A node whose agent dies or stops answering is left out and its work is
re-planned on the others, so the run still completes and is the same.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from .agent import NodeAgent
from .connection import VK_GPU, Connection, connect, require_ray
from .errors import ClusterError, NoAgentError, short_error
from .frames import ClusterFrame, render_frame
from .planner import LinkInfo, NodeInfo, NodePlan, check_srus, plan_nodes
from .replies import description_problem, link_time_problem, note, throughput_problem, validation_texts
from .stencil_run import run_stencil
from .._core.checks import is_int, short_repr

if TYPE_CHECKING:
    from numpy.typing import ArrayLike
    from ..offload.render import ReferenceSRU
    from .stencil_run import StencilRun

log = logging.getLogger(__name__)

__all__ = ["ClusterManager"]

#: Payload of the small link probe: above Ray's 100 KiB inline limit, so it goes through the object store.
_SMALL_PROBE = 256 * 1024


def _positive(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{what} must be a finite number > 0, got {short_repr(v)}")
    return float(v)


class ClusterManager:
    """vkmulti over a Ray cluster (this process must be connected to Ray: see connect()).

    `virtual_gpus` > 0 makes every agent expose that many lavapipe CPU
    devices (tests, machines without GPUs). `timeout`: seconds a frame round
    may take before a silent node is declared lost; `start_timeout`: for
    reserving the nodes and starting the agents. `measure`: time each GPU's
    render throughput and each node's link to the driver (else every GPU
    weighs 1 and links are taken as 1 GB/s). `topology`: ask each agent for
    vkmulti.kernels' measured GPU topology, where that layer is installed.
    `adapt`: after each frame a node's throughput moves this fraction of the way
    toward what the frame showed (0: keep the start-up measurement).
    `agent_nice`: the agents' niceness (Ray starts workers at 15, so on a busy
    node the CPU side of GPU work would wait behind everything else; None
    keeps Ray's).
    Nodes that offer no `vk_gpu`, or whose agent finds no Vulkan device, are
    skipped and listed in `skipped` with the reason.
    """

    def __init__(self, *, virtual_gpus: int = 0, timeout: float = 120.0, start_timeout: float = 120.0,
                 measure: bool = True, topology: bool = True, link_bytes: int = 8 * 2**20, adapt: float = 0.3,
                 agent_nice: int | None = 0):
        if not is_int(virtual_gpus) or virtual_gpus < 0:
            raise ValueError(f"virtual_gpus must be an int >= 0, got {short_repr(virtual_gpus)}")
        if not is_int(link_bytes) or link_bytes < 2 * _SMALL_PROBE:
            raise ValueError(f"link_bytes must be an int >= {2 * _SMALL_PROBE}, got {short_repr(link_bytes)}")
        if isinstance(adapt, bool) or not isinstance(adapt, (int, float)) or not 0.0 <= adapt <= 1.0:
            raise ValueError(f"adapt must be a number in [0, 1], got {short_repr(adapt)}")
        self.adapt = float(adapt)
        if agent_nice is not None and (not is_int(agent_nice) or not -20 <= agent_nice <= 19):
            raise ValueError(f"agent_nice must be None or an int in [-20, 19], got {short_repr(agent_nice)}")
        self.timeout = _positive(timeout, "timeout")
        self.start_timeout = _positive(start_timeout, "start_timeout")
        ray = require_ray()
        if not ray.is_initialized():
            raise ClusterError("this process is not connected to Ray: call vkmulti.cluster.connect(ADDRESS) "
                               "first, or use ClusterManager.connect(ADDRESS)")
        self._ray = ray
        self._connection: Connection | None = None
        self._pg: Any = None
        self._agents: dict[str, Any] = {}
        self._pids: dict[str, int] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self._calibrated: dict[str, tuple[float, ...]] = {}
        self.links: dict[str, LinkInfo] = {}
        self.node_links: dict[tuple[str, str], LinkInfo] = {}
        self.call_latency: float = 0.0
        self.skipped: dict[str, str] = {}
        self.lost: dict[str, str] = {}
        self.topology_notes: dict[str, str] = {}
        self.driver_node_id: str = ray.get_runtime_context().get_node_id()
        self._destroyed = False
        self._lock = threading.RLock()     # one frame or measurement at a time
        self._agent_nice = agent_nice
        try:
            self._start(virtual_gpus, topology)
            if measure:
                self.measure(link_bytes)
            else:
                self.links = {n: LinkInfo(n, "driver", math.inf if i.local else 1e9, 0.0)
                              for n, i in self.nodes.items()}
        except BaseException:
            self.destroy()
            raise

    @classmethod
    def connect(cls, address: str, *, connect_timeout: float = 10.0, object_store_memory: int | None = None,
                **options: Any) -> "ClusterManager":
        """connect(address) then ClusterManager(**options); destroy() also closes what connect opened."""
        conn = connect(address, timeout=connect_timeout, object_store_memory=object_store_memory)
        try:
            mgr = cls(**options)
        except BaseException:
            conn.close()
            raise
        mgr._connection = conn
        return mgr

    # -- start-up ----------------------------------------------------------------------

    def _start(self, virtual_gpus: int, topology: bool) -> None:
        ray = self._ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        offer = []
        for n in ray.nodes():
            if not n.get("Alive"):
                continue
            label = f"node {n['NodeID'][:8]} ({n.get('NodeManagerAddress', '?')})"
            count = int(n.get("Resources", {}).get(VK_GPU, 0))
            if count < 1:
                self._skip(label, f"offers no {VK_GPU} resource (start it with ray start "
                                  f"--resources='{{\"{VK_GPU}\": N}}', N = its Vulkan GPUs)")
            else:
                offer.append(count)
        if not offer:
            raise NoAgentError(f"no node of the Ray cluster offers {VK_GPU}: {self._skipped_text()}")
        offer.sort(reverse=True)      # largest first: each bundle then finds a node that has it
        self._pg = placement_group([{VK_GPU: float(c)} for c in offer], strategy="STRICT_SPREAD")
        try:
            ray.get(self._pg.ready(), timeout=self.start_timeout)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self._pg)
            self._pg = None
            raise ClusterError(f"could not reserve {VK_GPU} on {len(offer)} node(s) within {self.start_timeout:g} s "
                               f"(is another vkmulti cluster manager holding them?)") from None
        actor = ray.remote(NodeAgent)
        handles = [actor.options(
            num_cpus=0, resources={VK_GPU: float(c)}, max_restarts=0, max_task_retries=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=i),
        ).remote(virtual_gpus=virtual_gpus, timeout=self.timeout, nice=self._agent_nice)
            for i, c in enumerate(offer)]
        described = self._gather({h.describe.remote(topology): h for h in handles}, self.start_timeout,
                                 "describe its devices")
        for i, h in enumerate(handles):
            d = described.get(h)
            why = short_error(d) if isinstance(d, BaseException) else description_problem(d)
            if why is not None:   # (what it sent is a peer's: checked before any of it is used)
                self._skip(f"agent {i}", f"its agent failed to start: {why}" if isinstance(d, BaseException)
                           else f"its agent described itself malformed: {why}")
                ray.kill(h, no_restart=True)
                continue
            assert isinstance(d, dict)
            node_id, label = d["node_id"], f"node {d['node_id'][:8]} ({d['address']})"
            if d["error"] or node_id in self.nodes:
                self._skip(label, note(d["error"]) or "a second agent of the node")
                ray.kill(h, no_restart=True)
                continue
            self._agents[node_id], self._pids[node_id] = h, d["pid"]
            if note(d.get("topology_note")):
                self.topology_notes[node_id] = note(d["topology_note"])  # type: ignore[assignment]
            if note(d.get("nice_note")):
                log.warning("vkmulti cluster: %s: %s", label, note(d["nice_note"]))
            self.nodes[node_id] = NodeInfo(node_id, d["address"], d["hostname"], tuple(x["name"] for x in d["devices"]),
                                           tuple(1.0 for _ in d["devices"]), local=node_id == self.driver_node_id,
                                           topology=d.get("topology"))
        if not self.nodes:
            raise NoAgentError(f"no node of the Ray cluster has a usable Vulkan device: {self._skipped_text()}")

    def _skip(self, label: str, why: str) -> None:
        self.skipped[label] = why
        log.warning("vkmulti cluster: %s skipped: %s", label, why)

    def _skipped_text(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in self.skipped.items()) or "(no node answered)"

    def _gather(self, refs: dict, timeout: float, what: str) -> dict:
        """ray.get every ref (interruptible, bounded): {value of refs[ref]: result or the exception}."""
        ray = self._ray
        out: dict = {}
        pending = list(refs)
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=min(0.5, left))
            for ref in ready:
                try:
                    out[refs[ref]] = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    out[refs[ref]] = exc
        for ref in pending:
            out[refs[ref]] = ClusterError(f"did not {what} within {timeout:g} s")
        return out

    # -- measurements ------------------------------------------------------------------

    def measure(self, link_bytes: int = 8 * 2**20) -> None:
        """Measure every node's GPU throughput and its link to the driver (the planner's inputs)."""
        with self._lock:
            self._measure(link_bytes)

    def _measure(self, link_bytes: int) -> None:
        self._check()
        ray = self._ray
        got = self._gather({a.measure_throughput.remote(): n for n, a in self._agents.items()},
                           self.start_timeout, "measure its GPUs")
        for node_id, r in got.items():
            why = short_error(r) if isinstance(r, BaseException) else \
                throughput_problem(r, len(self.nodes[node_id].devices))
            if why is not None:
                self._lose(node_id, f"measuring its GPUs failed: {why}")
                continue
            self._calibrated[node_id] = tuple(float(x) for x in r)
            self.nodes[node_id] = dataclasses.replace(self.nodes[node_id], gpu_throughput=self._calibrated[node_id])
        t = []
        for node_id, a in self._live_agents().items():
            try:
                for _ in range(3):
                    t0 = time.perf_counter()
                    ray.get(a.ping.remote(), timeout=self.start_timeout)
                    t.append(time.perf_counter() - t0)
            except ray.exceptions.RayError as exc:
                self._lose(node_id, f"it did not answer a ping: {short_error(exc)}")
        self.call_latency = min(t) if t else 0.0
        for node_id in list(self._live_agents()):
            try:
                self.links[node_id] = self._measure_link(node_id, link_bytes)
            except ray.exceptions.RayError as exc:
                self._lose(node_id, f"its link could not be measured: {short_error(exc)}")
        if not self._live_agents():
            raise NoAgentError(f"every node was lost while measuring: {self.lost}")

    def _timed_get(self, ref: Any) -> float:
        ray = self._ray
        ray.wait([ref], fetch_local=False, timeout=self.start_timeout)
        t0 = time.perf_counter()
        ray.get(ref, timeout=self.start_timeout)
        return time.perf_counter() - t0

    def _measure_link(self, node_id: str, nbytes: int) -> LinkInfo:
        """Latency and bandwidth of one node's objects reaching the driver (best of 3 per size)."""
        a = self._agents[node_id]
        small = min(self._timed_get(a.payload.remote(_SMALL_PROBE)) for _ in range(3))
        if self.nodes[node_id].local:
            return LinkInfo(node_id, "driver", math.inf, small)
        big = min(self._timed_get(a.payload.remote(nbytes)) for _ in range(3))
        return _fit_link(node_id, "driver", _SMALL_PROBE, small, nbytes, big)

    def measure_node_links(self, nbytes: int = 8 * 2**20) -> dict[tuple[str, str], LinkInfo]:
        """Measure the link between every ordered pair of live nodes (one agent fetching the other's
        object); stored in `node_links` and returned."""
        if not is_int(nbytes) or nbytes < 2 * _SMALL_PROBE:
            raise ValueError(f"nbytes must be an int >= {2 * _SMALL_PROBE}, got {short_repr(nbytes)}")
        with self._lock:
            self._check()
            return self._measure_node_links(nbytes)

    def _measure_node_links(self, nbytes: int) -> dict[tuple[str, str], LinkInfo]:
        ray = self._ray
        live = self._live_agents()
        for src, a in live.items():
            for dst, b in live.items():
                if src == dst or src in self.lost or dst in self.lost:
                    continue
                times = {}
                try:
                    for size in (_SMALL_PROBE, nbytes):
                        best = math.inf
                        for _ in range(3):
                            ref = a.payload.remote(size)
                            ray.wait([ref], fetch_local=False, timeout=self.start_timeout)
                            took = ray.get(b.fetch.remote([ref]), timeout=self.start_timeout)
                            if (why := link_time_problem(took)) is not None:
                                raise ClusterError(f"it timed the link from {src[:8]} malformed: {why}")
                            best = min(best, took)
                        times[size] = best
                except (ray.exceptions.RayError, ClusterError) as exc:
                    self._lose(dst, f"its link could not be measured: {short_error(exc)}")
                    continue
                self.node_links[(src, dst)] = _fit_link(src, dst, _SMALL_PROBE, times[_SMALL_PROBE],
                                                        nbytes, times[nbytes])
        return {pair: link for pair, link in self.node_links.items() if not set(pair) & set(self.lost)}

    # -- frames ----------------------------------------------------------------------

    def plan(self, srus: Iterable[ReferenceSRU], nodes: Sequence[str] | None = None) -> NodePlan:
        """The node-level plan the next frame would use (level 1 of the placement)."""
        return plan_nodes(check_srus(srus), self._usable(nodes), self.links)

    def render_frame(self, srus: Iterable[ReferenceSRU], width: int, height: int, *,
                     clear: Sequence[float] | None = (0.0, 0.0, 0.0, 1.0), nodes: Sequence[str] | None = None,
                     on_dispatch: Callable[[int, NodePlan], object] | None = None) -> ClusterFrame:
        """Render `srus` (ReferenceSRUs placed at their x, y) across the nodes and composite a
        width x height RGBA16F frame on the driver.

        `nodes`: node ids to use (default: every live node). `on_dispatch(round,
        plan)` is called right after each round's work is sent (to log it, or to
        inject a failure in tests). A node that fails is left out of this and
        later frames and its SRUs are re-planned on the others; NoAgentError
        when none is left.
        """
        self._check()
        srus = check_srus(srus)
        for label, v in (("width", width), ("height", height)):
            if not is_int(v) or v <= 0:
                raise ValueError(f"{label} must be a positive int, got {short_repr(v)}")
        if on_dispatch is not None and not callable(on_dispatch):
            raise TypeError("on_dispatch must be callable or None")
        with self._lock:
            self._check()
            return render_frame(self, srus, width, height, clear, self._usable(nodes), on_dispatch)

    def run_stencil(self, field: ArrayLike, top: ArrayLike, bottom: ArrayLike, steps: int, *,
                    nodes: Sequence[str] | None = None, checkpoint_every: int = 32, payload_size: int = 256,
                    on_dispatch: Callable[[int, dict[str, tuple[int, int]]], object] | None = None) -> StencilRun:
        """`steps` steps of the reference Jacobi stencil (int32 `field`, fixed `top`/`bottom` rows)
        in row slabs across the nodes, halo rows passed agent to agent; a lost node's rows are
        re-split over the others from the last checkpoint. Returns a StencilRun
        (cluster/stencil_run.py); its field is bit-identical to kernels.reference.jacobi_reference."""
        with self._lock:
            self._check()
            return run_stencil(self, field, top, bottom, steps, nodes=nodes, checkpoint_every=checkpoint_every,
                               payload_size=payload_size, on_dispatch=on_dispatch)

    # -- nodes -------------------------------------------------------------------------

    def _check(self) -> None:
        if self._destroyed:
            raise ClusterError("ClusterManager used after destroy()")

    def _live_agents(self) -> dict[str, Any]:
        return {n: a for n, a in self._agents.items() if n not in self.lost}

    def _usable(self, nodes: Sequence[str] | None) -> list[NodeInfo]:
        live = [i for n, i in self.nodes.items() if n not in self.lost]
        if nodes is not None:
            if isinstance(nodes, str):
                raise TypeError("nodes must be a list of node ids, not one str")
            wanted = list(nodes)
            if not wanted:
                raise ValueError("nodes must name at least one node (or be None for all)")
            for n in wanted:
                if n not in self.nodes:
                    raise ValueError(f"unknown node id {short_repr(n)} (known: {[k[:8] for k in self.nodes]})")
            live = [i for i in live if i.node_id in wanted]
        if not live:
            raise NoAgentError(f"no live node to render on (lost: {self.lost}; skipped: {self._skipped_text()})")
        return live

    def _lose(self, node_id: str, why: str, frame: ClusterFrame | None = None) -> None:
        label = self.nodes[node_id].label if node_id in self.nodes else node_id
        self.lost[node_id] = why
        if frame is not None:
            frame.lost[node_id] = why
        log.error("vkmulti cluster: %s lost (%s); its work is re-planned on the other nodes", label, why)
        try:
            self._ray.kill(self._agents[node_id], no_restart=True)
        except Exception as exc:   # already gone, most likely
            log.warning("vkmulti cluster: killing the agent of %s failed (%r)", label, exc)

    def agent_pid(self, node_id: str) -> int:
        """The process id of a node's agent (on that node)."""
        return self._pids[node_id]

    def validation_errors(self) -> dict[str, list[str]]:
        """Validation-layer errors each live agent saw since the last call (node id -> texts)."""
        self._check()
        got = self._gather({a.validation_errors.remote(): n for n, a in self._live_agents().items()},
                           self.timeout, "report validation errors")
        return {n: [f"(could not ask: {short_error(r)[:300]})"] if isinstance(r, BaseException) else validation_texts(r)
                for n, r in got.items()}

    def destroy(self) -> None:
        """Shut the agents down, free the placement group, close a connection connect() opened (idempotent)."""
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
            self._teardown()

    def _teardown(self) -> None:
        ray = self._ray
        live = self._live_agents()
        if live:
            self._gather({a.shutdown.remote(): n for n, a in live.items()}, 30.0, "shut down")
        for node_id, a in self._agents.items():
            try:
                ray.kill(a, no_restart=True)
            except Exception as exc:   # already gone, most likely
                log.warning("vkmulti cluster: killing the agent of node %s failed (%r)", node_id, exc)
        self._agents.clear()
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._pg)
            except Exception as exc:   # the cluster may be gone already
                log.warning("vkmulti cluster: removing the placement group failed: %r", exc)
            self._pg = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> "ClusterManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def describe(self) -> dict[str, Any]:
        """Nodes, links, skipped and lost nodes, as plain data (for JSON and the CLI)."""
        return {"driver_node": self.driver_node_id,
                "nodes": [dict(i.to_dict(), link=self.links[n].to_dict() if n in self.links else None,
                               lost=self.lost.get(n), topology_note=self.topology_notes.get(n))
                          for n, i in self.nodes.items()],
                "call_latency_ms": self.call_latency * 1e3,
                "node_links": [v.to_dict() for v in self.node_links.values()],
                "skipped": dict(self.skipped), "lost": dict(self.lost)}


def _fit_link(src: str, dst: str, small: int, t_small: float, big: int, t_big: float) -> LinkInfo:
    """Latency and bandwidth from the times of a small and a big object: t = latency + n / bandwidth.
    Where a loaded machine made the big object no slower than the small one, the bandwidth is what the big
    one's time alone gives (a lower bound), never infinite: that stands for the same node's shared memory."""
    if t_big > t_small:
        bw = (big - small) / (t_big - t_small)
        return LinkInfo(src, dst, bw, max(t_small - small / bw, 0.0))
    return LinkInfo(src, dst, big / max(t_big, 1e-9), 0.0)
