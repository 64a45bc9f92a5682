"""The node agent: one long-lived Ray actor per node that owns that node's GPUs.

It holds the node's MultiDeviceManager, a ReferenceRenderer per GPU and the
SRU render targets between frames, measures each GPU's render throughput,
reports its devices (and the measured topology of vkmulti.kernels where that
layer is installed), renders the SRUs the driver sends (partitioned over its
GPUs with assign_srus) and returns their images as numpy arrays, which Ray
keeps in the node's shared-memory object store. A GPU that fails is left out
and its SRUs rendered on the node's other GPUs, as SRUOffloadCoordinator does.

The class is plain Python (the cluster manager wraps it with ray.remote), so
it also runs in-process without Ray.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Sequence

import numpy as np
import vulkan as vk

from .._core.checks import check_number, is_int, short_repr
from ..device.instance import drain_all_validation_messages
from ..device.manager import MultiDeviceManager
from ..device.virtual import install_virtual_gpus
from ..errors import DeviceLostError, TimeoutError, TransferError, UnsupportedError, VkmError, VulkanError
from ..kernels import MultiGpuCoordinator
from ..offload.partition import assign_srus
from ..offload.render import MAX_ITERATIONS, ReferenceRenderer, ReferenceSRU
from .errors import ClusterError
from .readback import BatchReadback

#: Bytes a pixel of an SRU image (SRU_FORMAT, R16G16B16A16_SFLOAT).
SRU_BYTES_PER_PIXEL = 8
_DEFAULT_MAX_DIMENSION = 16384
from .stencil import StencilSlab

log = logging.getLogger(__name__)

__all__ = ["NodeAgent"]

#: Errors of a GPU that make the agent leave it out and render its SRUs on the others.
_DEVICE_ERRORS = (VulkanError, TransferError, UnsupportedError, TimeoutError)
#: Render targets unused for this many render calls are freed.
_KEEP_CALLS = 8


def _calibration_sru(iterations: int) -> Any:
    return ReferenceSRU("calibration", 256, 256, seed=7, iterations=iterations)


#: A node's environment can restrict its agent to some of its Vulkan devices ("0,2").
DEVICES_ENV = "VKMULTI_AGENT_DEVICES"


def _env_devices() -> list[int] | None:
    """The device indices VKMULTI_AGENT_DEVICES names, or None (all); ValueError names a bad value."""
    text = os.environ.get(DEVICES_ENV, "").strip()
    if not text:
        return None
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or any(v < 0 for v in out) or len(set(out)) != len(out):
        raise ValueError(f"{DEVICES_ENV}={short_repr(text)}: expected distinct device indices like '0,1'")
    return out


def _whereami() -> tuple[str, str]:
    """(node id, node IP) from Ray when this runs in a Ray worker, else ('local', hostname's IP)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "local", "127.0.0.1"


class NodeAgent:
    """One node's vkmulti: its MultiDeviceManager, renderers and render targets.

    `virtual_gpus` > 0 exposes that many lavapipe CPU devices first (tests,
    machines without GPUs). A node whose Vulkan devices cannot be opened keeps
    running with `error` set (describe() reports it; the driver skips the node).
    `device_indices` (default: VKMULTI_AGENT_DEVICES of the node's environment,
    else all) picks the node's devices by enumeration index. `timeout`: seconds
    (finite, > 0) each wait of a call may take; Ctrl-C ends any of them in-process.
    """

    def __init__(self, *, virtual_gpus: int = 0, validation: bool | None = None,
                 device_indices: Sequence[int] | None = None, timeout: float = 60.0, nice: int | None = None):
        if not is_int(virtual_gpus) or virtual_gpus < 0:
            raise ValueError(f"virtual_gpus must be an int >= 0, got {short_repr(virtual_gpus)}")
        self.timeout = check_number(timeout, "timeout", positive=True)
        if nice is not None and (not is_int(nice) or not -20 <= nice <= 19):
            raise ValueError(f"nice must be None or an int in [-20, 19], got {short_repr(nice)}")
        self.nice_note: str | None = None
        if nice is not None:
            self._set_nice(nice)
        self.node_id, self.address = _whereami()
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self.error: str | None = None
        self.manager: Any = None
        self._renderers: dict[int, Any] = {}
        self._readbacks: dict[int, BatchReadback] = {}
        self._targets: dict[tuple, list] = {}      # (gpu, sru_id, w, h) -> [Image, last call]
        self._lost: dict[int, str] = {}
        self._abandoned: list[Any] = []             # targets of GPUs that failed other than by loss
        self._stencil: StencilSlab | None = None
        self._throughput: list[float] | None = None
        self._calls = 0
        if device_indices is None:
            try:
                device_indices = _env_devices()
            except ValueError as exc:
                self.error = f"bad node set-up: {exc}"
                log.warning("vkmulti agent on %s (%s): %s", self.node_id[:8], self.address, self.error)
                return
        try:
            if virtual_gpus:
                install_virtual_gpus(virtual_gpus)
            self.manager = MultiDeviceManager.create(
                enabled=True, validation=validation,
                device_indices=list(device_indices) if device_indices is not None else None)
        except Exception as exc:   # reported, not raised: the driver skips this node with the reason
            self.error = f"no Vulkan device: {exc}"
            log.warning("vkmulti agent on %s (%s): %s", self.node_id[:8], self.address, self.error)

    def _set_nice(self, nice: int) -> None:
        """Run at `nice` (Ray starts workers at 15, which starves the CPU side of GPU work on a busy
        node); without the right to lower it, keep Ray's and say so."""
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError as exc:
            self.nice_note = f"kept Ray's niceness {os.getpriority(os.PRIO_PROCESS, 0)} ({exc.strerror})"
            log.warning("vkmulti agent: could not set niceness %d: %s", nice, exc)

    # -- what the driver asks first -------------------------------------------------

    @property
    def label(self) -> str:
        """'node ID8 (address)', for messages."""
        return f"node {self.node_id[:8]} ({self.address})"

    def ping(self) -> float:
        """A no-op call (the driver times round trips with it)."""
        return time.perf_counter()

    def describe(self, topology: bool = False) -> dict[str, Any]:
        """Node id, address, pid, devices and (with `topology`) the measured GPU topology, or the error."""
        out: dict[str, Any] = {"node_id": self.node_id, "address": self.address, "hostname": self.hostname,
                               "pid": self.pid, "error": self.error, "devices": [], "topology": None,
                               "topology_note": None, "nice": os.getpriority(os.PRIO_PROCESS, 0),
                               "nice_note": self.nice_note}
        if self.manager is None:
            return out
        out["devices"] = [{"index": s.index, "name": s.name,
                           "type": getattr(s.capabilities, "device_type", None)} for s in self.manager.slots]
        if topology:
            out["topology"], out["topology_note"] = self._topology()
        return out

    def _topology(self) -> tuple[dict | None, str | None]:
        """vkmulti.kernels' measured topology of this node's GPUs, or (None, why not)."""
        try:
            topo = MultiGpuCoordinator.from_manager(self.manager).probe_topology()
            return topo.to_dict(), None
        except Exception as exc:   # a probe that fails leaves the throughput model in charge
            log.warning("%s: topology probe failed: %r", self.label, exc)
            return None, f"topology probe failed: {exc!r}"

    def measure_throughput(self, repeats: int = 3, min_seconds: float = 0.02) -> list[float]:
        """Each GPU's throughput in cost units (ReferenceSRU.render_cost) per second of render and
        read-back, measured with every GPU of the node busy at once, as in a frame.

        The calibration SRU's steps per pixel grow until a render takes `min_seconds`
        (so fast GPUs are timed on real work, not on submit overhead); then the best
        of `repeats`. A GPU whose calibration fails is left out (throughput 0).
        """
        self._check()
        if not is_int(repeats) or repeats < 1:
            raise ValueError(f"repeats must be an int >= 1, got {short_repr(repeats)}")
        min_seconds = float(min_seconds)
        if not 0.0 <= min_seconds <= 10.0:
            raise ValueError(f"min_seconds must be in [0, 10], got {short_repr(min_seconds)}")
        sru = _calibration_sru(64)
        while True:
            took = self._calibrate(sru, 1)
            if not took or min(took.values()) >= min_seconds or sru.iterations * 4 > MAX_ITERATIONS:
                break
            sru = _calibration_sru(sru.iterations * 4)
        best = self._calibrate(sru, repeats) if took else {}
        out = [sru.render_cost / best[g] if g in best else 0.0 for g in range(self.manager.device_count)]
        self._drop_targets(keep_call=self._calls + 1)       # the calibration targets
        self._throughput = out
        return list(out)

    def _calibrate(self, sru: Any, repeats: int) -> dict[int, float]:
        """Best seconds per GPU to render `sru` and read it back, all GPUs at once (after one warm-up)."""
        gpus = [g for g in range(self.manager.device_count) if g not in self._lost]
        best = {g: float("inf") for g in gpus}
        self._calls += 1
        for rep in range(repeats + 1):
            order = gpus[rep % len(gpus):] + gpus[:rep % len(gpus)] if gpus else []   # no GPU always waited first
            t0 = time.perf_counter()
            points, took = {}, {}
            for g in order:
                try:
                    points[g] = self._renderer(g).render(sru, self._target(g, sru))
                except _DEVICE_ERRORS as exc:
                    self._lose(g, "its calibration render failed", exc)
            for g in list(points):
                try:
                    self._renderers[g].wait(points[g], self.timeout)
                    took[g] = time.perf_counter() - t0
                except _DEVICE_ERRORS as exc:
                    self._lose(g, "its calibration render failed", exc)
            for g in list(took):
                t1 = time.perf_counter()
                try:
                    self._readback(g).read([self._target(g, sru)], timeout=self.timeout)
                except _DEVICE_ERRORS as exc:
                    self._lose(g, "its calibration read-back failed", exc)
                    continue
                if rep:
                    best[g] = min(best[g], took[g] + time.perf_counter() - t1)
        return {g: t for g, t in best.items() if g not in self._lost and t < float("inf")}

    # -- frames ----------------------------------------------------------------------

    def render(self, srus: Sequence[ReferenceSRU]) -> dict[str, Any]:
        """Render `srus` (ReferenceSRUs) over this node's GPUs; returns their images and where/how long.

        {'node_id', 'images': {sru_id: (h, w, 8) uint8}, 'gpu': {sru_id: slot index},
        'render_s', 'readback_s', 'total_s', 'lost_gpus': {slot: reason}, 'predicted_s': what the
        measured throughputs predicted for render + read-back (None before measure_throughput)}.
        ClusterError when every GPU of the node has failed.
        """
        self._check()
        t0 = time.perf_counter()
        self._calls += 1
        images: dict[Any, np.ndarray] = {}
        where: dict[Any, int] = {}
        render_s = readback_s = 0.0
        todo = list(srus)
        predicted = None
        while todo:
            usable = [g for g in range(self.manager.device_count) if g not in self._lost]
            if not usable:
                raise ClusterError(f"{self.label}: every GPU has failed: {self._lost}")
            weights = None
            if self._throughput is not None:
                weights = [self._throughput[g] if self._throughput[g] > 0 else 1e-9 for g in usable]
            assigned = assign_srus(todo, len(usable), cost=lambda s: s.render_cost, weights=weights)
            by_gpu: dict[int, list[Any]] = {}
            for s, a in zip(todo, assigned):
                by_gpu.setdefault(usable[a.device_index], []).append(s)
            if predicted is None and self._throughput is not None:
                predicted = max(sum(s.render_cost for s in group) / self._throughput[g]
                                for g, group in by_gpu.items())
            todo = []
            done, r_s, d_s = self._render_groups(by_gpu, todo)
            render_s += r_s
            readback_s += d_s
            for g, sid, img in done:
                images[sid], where[sid] = img, g
        self._drop_targets(keep_call=self._calls - _KEEP_CALLS)
        return {"node_id": self.node_id, "images": images, "gpu": where, "render_s": render_s,
                "readback_s": readback_s, "total_s": time.perf_counter() - t0, "lost_gpus": dict(self._lost),
                "predicted_s": predicted}

    def _render_groups(self, by_gpu: dict[int, list[Any]], retry: list[Any]) -> tuple[list, float, float]:
        """Submit every GPU's renders, wait for them all, then read each image back. SRUs of a GPU
        that fails go to `retry` and the GPU is left out of later plans."""
        t0 = time.perf_counter()
        submitted: list[tuple[int, Any, Any, Any]] = []
        for g, group in by_gpu.items():
            try:
                renderer = self._renderer(g)
                for s in group:
                    target = self._target(g, s)
                    submitted.append((g, s, target, renderer.render(s, target)))
            except _DEVICE_ERRORS as exc:
                self._lose(g, "a render could not be submitted", exc)
        failed = set(self._lost)
        for g, s, target, point in submitted:
            if g in failed:
                continue
            try:
                self._renderers[g].wait(point, self.timeout)
            except _DEVICE_ERRORS as exc:
                self._lose(g, "a render failed", exc)
                failed.add(g)
        t1 = time.perf_counter()
        out = []
        for g in by_gpu:
            if g in failed:
                continue
            mine = [(s, target, point) for h, s, target, point in submitted if h == g]
            try:
                pixels = self._readback(g).read([t for _, t, _ in mine], timeout=self.timeout,
                                                waits=[(mine[-1][2].semaphore, mine[-1][2].value)] if mine else ())
            except _DEVICE_ERRORS as exc:
                self._lose(g, "a read-back failed", exc)
                failed.add(g)
                continue
            out += [(g, s.sru_id, img) for (s, _, _), img in zip(mine, pixels)]
        got = {sid for _, sid, _ in out}
        for group in by_gpu.values():
            retry.extend(s for s in group if s.sru_id not in got)
        return out, t1 - t0, time.perf_counter() - t1

    # -- GPUs, renderers, targets ----------------------------------------------------------

    def _check(self) -> None:
        if self.manager is None:
            raise ClusterError(f"{self.label} has no usable Vulkan device: {self.error}")

    def _renderer(self, g: int) -> Any:
        r = self._renderers.get(g)
        if r is None:
            r = self._renderers[g] = ReferenceRenderer(self.manager.slot(g))
        return r

    def _readback(self, g: int) -> BatchReadback:
        r = self._readbacks.get(g)
        if r is None:
            r = self._readbacks[g] = BatchReadback(self.manager.slot(g))
        return r

    def _target(self, g: int, sru: Any) -> Any:
        key = (g, sru.sru_id, sru.width, sru.height)
        entry = self._targets.get(key)
        if entry is None:
            entry = self._targets[key] = [self._renderer(g).make_target(sru), self._calls]
        entry[1] = self._calls
        return entry[0]

    def _drop_targets(self, keep_call: int) -> None:
        """Free targets last used before call number `keep_call`."""
        for key in [k for k, (_, used) in self._targets.items() if used < keep_call]:
            img, _ = self._targets.pop(key)
            try:
                img.destroy(self.timeout)
            except VkmError as exc:
                log.warning("%s: freeing a render target failed: %r", self.label, exc)

    def _lose(self, g: int, why: str, exc: BaseException) -> None:
        self._lost[g] = f"{why}: {exc!r}"
        log.error("%s: GPU %d left out of later renders, %s", self.label, g, why, exc_info=exc)
        for key in [k for k in self._targets if k[0] == g]:
            img, _ = self._targets.pop(key)
            if isinstance(exc, DeviceLostError):
                img.destroy(1.0)           # nothing runs on a lost device: its objects can be freed now
            else:
                self._abandoned.append(img)   # the GPU may still be using it: freed at shutdown

    # -- links -------------------------------------------------------------------------

    def payload(self, nbytes: int) -> np.ndarray:
        """`nbytes` of data, stored in this node's object store (for link measurements).

        At most one frame this node can serve (max_payload_bytes()): a link is measured
        with what it carries, and a caller cannot make the node allocate more."""
        most = self.max_payload_bytes()
        if not is_int(nbytes) or not 1 <= nbytes <= most:
            raise ValueError(f"nbytes must be an int in [1, {most}] (the largest frame this node serves), "
                             f"got {short_repr(nbytes)}")
        return np.full(nbytes, 0x5A, dtype=np.uint8)

    def max_payload_bytes(self) -> int:
        """The bytes of the largest SRU image this node's GPUs can render and read back
        (maxImageDimension2D squared, SRU_FORMAT's 8 bytes a pixel); 16384 x 16384
        (Vulkan's common maximum) when the node has no devices."""
        dims = []
        for slot in getattr(self.manager, "slots", None) or ():
            if slot.physical_device is not None:
                props = vk.vkGetPhysicalDeviceProperties(slot.physical_device)   # (kept: owns `limits`)
                dims.append(int(props.limits.maxImageDimension2D))
        dim = max(dims) if dims else _DEFAULT_MAX_DIMENSION
        return dim * dim * SRU_BYTES_PER_PIXEL

    def fetch(self, refs: list[object]) -> float:
        """Seconds this node takes to get the objects behind `refs` (a list, so Ray passes them unresolved)."""
        import ray

        t0 = time.perf_counter()
        ray.get(list(refs), timeout=self.timeout)  # type: ignore[arg-type, unused-ignore]
        return time.perf_counter() - t0

    # -- the stencil -------------------------------------------------------------------

    def stencil_setup(self, slab: np.ndarray, above: np.ndarray, below: np.ndarray,
                      payload_size: int = 256) -> dict[int, int]:
        """Take rows of a Jacobi grid (a StencilSlab over this node's GPUs, rows in proportion to
        their throughput); returns rows per GPU. Replaces the slab of an earlier run."""
        self._check()
        self.stencil_teardown()
        n = self.manager.device_count
        t = self._throughput or [1.0] * n
        weights = [0.0 if g in self._lost else (t[g] if t[g] > 0 else 0.0) for g in range(n)]
        if not any(weights):
            raise ClusterError(f"{self.label}: every GPU has failed: {self._lost}")
        self._stencil = StencilSlab(self.manager, slab, above, below, weights, payload_size=payload_size,
                                    timeout=self.timeout)
        return dict(self._stencil.gpu_rows)

    def stencil_step(self, above: np.ndarray | None, below: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """One step of the slab with the neighbours' edge rows; returns its new first and last row."""
        return self._slab().step(above, below)

    def stencil_field(self) -> np.ndarray:
        """The slab's rows as of its latest step."""
        return self._slab().field()

    def stencil_teardown(self) -> None:
        """Free the slab's kernels (idempotent)."""
        slab, self._stencil = self._stencil, None
        if slab is not None:
            slab.destroy()

    def _slab(self) -> StencilSlab:
        if self._stencil is None:
            raise ClusterError(f"{self.label} holds no stencil slab: call stencil_setup first")
        return self._stencil

    # -- health and teardown ------------------------------------------------------------

    def validation_errors(self) -> list[str]:
        """Validation-layer errors this agent's Vulkan instances reported since the last call."""
        return [text for sev, text in drain_all_validation_messages() if sev == "error"]

    def shutdown(self) -> None:
        """Free the stencil slab, targets, renderers and the manager (idempotent), each within
        the agent's timeout; vkmulti.TimeoutError while its GPUs still run work (call again)."""
        try:
            self.stencil_teardown()
        except VkmError as exc:
            log.warning("%s: stencil teardown failed: %r", self.label, exc)
        self._drop_targets(keep_call=1 << 62)
        for img in self._abandoned:
            try:
                img.destroy(self.timeout)
            except VkmError as exc:
                log.warning("%s: freeing a failed GPU's render target failed: %r", self.label, exc)
        self._abandoned.clear()
        for r in self._renderers.values():
            try:
                r.destroy(self.timeout)
            except VkmError as exc:
                log.warning("%s: renderer teardown failed: %r", self.label, exc)
        self._renderers.clear()
        for rb in self._readbacks.values():
            try:
                rb.destroy(self.timeout)
            except VkmError as exc:
                log.warning("%s: read-back buffer teardown failed: %r", self.label, exc)
        self._readbacks.clear()
        if self.manager is not None:
            self.manager.destroy(self.timeout)
            self.manager = None
            self.error = "shut down"
