"""The measured topology: facts (PCI bus, NUMA node, NVLink) plus bandwidth and
latency per ordered device pair, measured with vkmulti's own best transfer
method; cached per machine so a second run does not measure again.

Cache: one JSON file per set of devices, keyed by their UUIDs, driver UUIDs,
driver versions and PCI buses, in $VKMULTI_CACHE_DIR, else
$XDG_CACHE_HOME/vkmulti, else ~/.cache/vkmulti; a folder someone else can
change (_core.files.open_private_dir) is neither read nor written. Its bytes
are untrusted: only a regular file is read, opened without following links
and sized before a byte is read (at most MAX_CACHE_BYTES); a file that cannot
be read, does not parse or does not describe this machine's devices is
ignored with one warning and measured anew.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from typing import Any

from ..._core.checks import check_count, short_repr
from ..._core.lifetime import Deadline, destroy_idle
from ..._core.files import open_private_dir, read_regular_file, replace_file
from ..._version import __version__
from ...device.capabilities import DeviceCapabilities
from ...device.manager import MultiDeviceManager
from ...errors import TimeoutError as VkmTimeout, VkmError
from ...memory.image import Buffer
from ...transfer.cross_device import CrossDeviceTransfer
from ...transfer.methods import TransferMethod, cuda_peer_auto
from .device_facts import nvlink_links, numa_node, pair_transfer_methods
from .topology import GpuConnection, GpuTopology, InterconnectType

log = logging.getLogger(__name__)

__all__ = ["probe_topology", "cache_dir", "cache_path", "cache_key", "format_topology", "CACHE_ENV",
           "CACHE_FORMAT", "MAX_CACHE_BYTES"]

CACHE_ENV = "VKMULTI_CACHE_DIR"
CACHE_FORMAT = 1
#: bytes per bandwidth measurement: 64 MiB between GPUs, 8 MiB where a CPU device takes part
GPU_BYTES = 64 << 20
CPU_BYTES = 8 << 20
#: bytes of the latency measurement (one small transfer, submit to landed)
LATENCY_BYTES = 4096
DEFAULT_REPS = 5
_PEER = ("cuda_peer", "dmabuf")
#: The largest topology cache file read (bytes): a measured 64-device matrix takes ~3 MiB.
MAX_CACHE_BYTES = 16 << 20


def cache_dir() -> str:
    """Where topology measurements are cached ($VKMULTI_CACHE_DIR, else
    $XDG_CACHE_HOME/vkmulti, else ~/.cache/vkmulti)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "vkmulti")


def _key_material(manager: Any) -> list[dict[str, Any]]:
    out = []
    for slot in manager.slots:
        c: DeviceCapabilities = slot.capabilities
        out.append({"index": slot.index, "name": c.name, "device_uuid": c.device_uuid, "driver_uuid": c.driver_uuid,
                    "driver_version": c.driver_version, "driver_info": c.driver_info, "pci_bus": c.pci_bus,
                    "enabled_extensions": sorted(slot.enabled_extensions)})
    return [{"vkmulti": __version__, "cuda_peer_auto": cuda_peer_auto()}] + out


def cache_key(manager: Any) -> str:
    """16 hex digits naming this machine's device set (UUIDs, drivers, order)."""
    blob = json.dumps(_key_material(manager), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_path(manager: Any, directory: str | None = None) -> str:
    return os.path.join(directory or cache_dir(), f"topology-{cache_key(manager)}.json")


def _load(path: str, dir_fd: int, material: list[dict[str, Any]], device_count: int) -> GpuTopology | None:
    """The cached topology at `path` (in the folder of `dir_fd`) for these devices, or
    None (one warning when a file is there but unusable or not this machine's)."""
    try:
        raw = read_regular_file(os.path.basename(path), MAX_CACHE_BYTES, dir_fd=dir_fd)
        if raw is None:
            return None
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        log.warning("ignoring the unreadable topology cache %s: %s", path, exc)
        return None
    try:
        if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT:
            log.warning("ignoring the topology cache %s: not a format-%d vkmulti topology cache", path, CACHE_FORMAT)
            return None
        if doc.get("key") != material:
            log.warning("ignoring the topology cache %s: it was measured for other devices or drivers", path)
            return None
        body = doc["topology"]
        count = body["device_count"] if isinstance(body, dict) else None
        if isinstance(count, bool) or count != device_count:
            log.warning("ignoring the topology cache %s: it describes %r devices, the manager has %d", path,
                        count, device_count)
            return None
        topo = GpuTopology.from_dict(body)
        if not isinstance(topo.details, dict):
            raise ValueError("details is not an object")
        return topo
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        log.warning("ignoring the malformed topology cache %s: %s", path, exc)
        return None


def _save(path: str, dir_fd: int, material: list[dict[str, Any]], topo: GpuTopology) -> bool:
    """Write the cache atomically into the folder of `dir_fd` (False, one warning, when it fails)."""
    text = json.dumps({"format": CACHE_FORMAT, "key": material, "topology": topo.to_dict()}, indent=1)
    try:
        replace_file(os.path.basename(path), text.encode(), dir_fd=dir_fd)
        return True
    except OSError as exc:
        log.warning("could not write the topology cache %s: %s", path, exc)
        return False


def probe_topology(manager: MultiDeviceManager, *, force: bool = False, cache: bool = True, cache_directory: str | None = None,
                   nbytes: int | None = None, reps: int = DEFAULT_REPS, sysfs_root: str = "/sys",
                   timeout: float | None = 300.0) -> GpuTopology:
    """The measured topology of `manager`'s devices, marked probed.

    From the cache when an entry for these devices exists (unless `force`),
    else measured and cached (`cache=False`: neither read nor written). Per
    ordered pair: the interconnect (SAME_DEVICE for one device listed twice,
    NVLINK/NVSWITCH where NVML reports links, PCIE for a peer method
    (CUDA_PEER, DMABUF), NONE when data goes through host memory), bandwidth
    (`nbytes` per transfer, median of `reps`) and latency (a 4 KiB transfer,
    submit to landed) measured with the method select_transfer_method picks.
    `details` records PCI buses, NUMA nodes, NVLink counts, where the figures
    came from, and notes on what could not be read. `timeout`: for the whole
    measurement (None: no limit), behind whatever else the GPUs run.
    """
    deadline = Deadline(timeout)   # (checks it)
    if not isinstance(manager, MultiDeviceManager):
        raise TypeError(f"manager must be a MultiDeviceManager, got {type(manager).__name__}")
    if nbytes is not None:
        check_count(nbytes, "nbytes", 4)
        if nbytes % 4:
            raise ValueError(f"nbytes must be a multiple of 4, got {short_repr(nbytes)}")
    check_count(reps, "reps", 1)
    material = _key_material(manager)
    folder = cache_directory or cache_dir()
    path = os.path.join(folder, f"topology-{cache_key(manager)}.json")
    dir_fd = None
    if cache:
        try:
            dir_fd = open_private_dir(folder, create=True)
        except ValueError as exc:
            log.warning("not using the topology cache folder %s: only a folder no one else can change is used: %s",
                        folder, exc)
    try:
        if dir_fd is not None and not force:
            cached = _load(path, dir_fd, material, len(manager.slots))
            if cached is not None:
                cached.details["source"] = "cache"
                cached.details["cache_file"] = path
                return cached
        topo = measure_topology(manager, nbytes=nbytes, reps=reps, sysfs_root=sysfs_root, timeout=deadline.left())
        if cache:
            topo.details["cache_file"] = path if dir_fd is not None and _save(path, dir_fd, material, topo) else None
        return topo
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


def measure_topology(manager: Any, *, nbytes: int | None = None, reps: int = DEFAULT_REPS,
                     sysfs_root: str = "/sys", timeout: float | None = 300.0) -> GpuTopology:
    """Read the facts and measure every ordered pair now (no cache), within `timeout` s."""
    deadline = Deadline(timeout)
    slots = manager.slots
    n = len(slots)
    caps = [s.capabilities for s in slots]
    topo = GpuTopology(n)
    notes: list[str] = []
    devices = []
    for slot, c in zip(slots, caps):
        node = numa_node(c.pci_bus, sysfs_root)
        if node is not None:
            topo.set_numa_node(slot.index, node)
        if c.pci_bus is None:
            notes.append(f"GPU {slot.index} ({c.name}): no VK_EXT_pci_bus_info, PCI bus and NUMA node unknown")
        devices.append({"index": slot.index, "name": c.name, "device_type": c.device_type,
                        "device_uuid": c.device_uuid, "pci_bus": c.pci_bus, "numa_node": node,
                        "driver": f"{c.driver_name} {c.driver_info}".strip()})
    if any(c.vendor_id == 0x10DE for c in caps):
        links, why = nvlink_links([c.device_uuid for c in caps], [c.pci_bus for c in caps])
        if why:
            notes.append(why)
    else:
        links, why = {}, None
        if n > 1:
            notes.append("no NVIDIA device: NVLink (NVML) not probed")
    methods = pair_transfer_methods(manager)
    measured: dict[str, Any] = {}
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            method = methods[(a, b)]
            size = nbytes or (CPU_BYTES if "cpu" in (caps[a].device_type, caps[b].device_type) else GPU_BYTES)
            try:
                bw, lat = _measure_pair(slots[a], slots[b], method, size, reps, deadline)
            except VkmTimeout:
                raise
            except VkmError as exc:
                if method == TransferMethod.STAGING_COPY:
                    raise
                notes.append(f"GPU {a} -> GPU {b}: {method} failed ({type(exc).__name__}: {exc}); "
                             f"measured with {TransferMethod.STAGING_COPY} instead")
                method = TransferMethod.STAGING_COPY
                bw, lat = _measure_pair(slots[a], slots[b], method, size, reps, deadline)
            kind = _interconnect(caps[a], caps[b], method, links.get((a, b)))
            topo.set_connection(GpuConnection(a, b, kind, bandwidth_gbps=bw, latency_us=lat, bidirectional=False,
                                              method=method))
            measured[f"{a}->{b}"] = {"method": method, "bytes": size, "gbps": round(bw, 3),
                                     "latency_us": round(lat, 2)}
    topo.details = {"source": "measured", "measured_at": time.time(), "reps": reps, "devices": devices,
                    "pairs": measured, "notes": notes,
                    "nvlink": {f"{a}->{b}": {"links": f.links, "nominal_gbps": f.gbps, "switch": f.switch}
                               for (a, b), f in links.items()}}
    topo.mark_probed()
    return topo


def _interconnect(a: DeviceCapabilities, b: DeviceCapabilities, method: str, nvlink: Any) -> InterconnectType:
    if a.device_uuid == b.device_uuid and a.driver_uuid == b.driver_uuid:
        return InterconnectType.SAME_DEVICE
    if nvlink is not None:
        return InterconnectType.NVSWITCH if nvlink.switch else InterconnectType.NVLINK
    return InterconnectType.PCIE if method in _PEER else InterconnectType.NONE


def _measure_pair(src: Any, dst: Any, method: str, nbytes: int, reps: int,
                  deadline: Deadline) -> tuple[float, float]:
    """(GB/s for `nbytes`, latency in us of a 4 KiB transfer) from src to dst with `method`,
    within `deadline`. A measurement that gives up (a timeout, Ctrl-C, a failure) frees what
    no transfer uses any more; the rest stays to its manager's destroy(), which waits for it."""
    made: list[Any] = [Buffer(src, nbytes)]
    try:
        made.append(Buffer(dst, nbytes))
        a, b = made
        x = CrossDeviceTransfer(src, dst, method)
        made.insert(0, x)

        def once(size: int) -> float:
            t0 = time.perf_counter()
            x.submit(src_buffer=a, dst_buffer=b, size=size).wait(deadline.left())
            return time.perf_counter() - t0

        once(nbytes)   # warm-up: makes the link and its ring
        big = statistics.median(once(nbytes) for _ in range(reps))
        small = statistics.median(once(LATENCY_BYTES) for _ in range(max(2 * reps, 5)))
    except BaseException:
        destroy_idle(made)   # (the transfer first: the buffers' destroy waits for its jobs)
        raise
    for obj in made:
        obj.destroy(deadline.left())
    return nbytes / big / 1e9, small * 1e6


# ---- printing ---------------------------------------------------------------------

def format_topology(topo: GpuTopology, names: list[str] | None = None) -> str:
    """The matrix as text: one table of bandwidth and one of latency (row = source)."""
    if not isinstance(topo, GpuTopology):
        raise TypeError(f"topo must be a GpuTopology, got {type(topo).__name__}")
    n = topo.device_count
    devs = {d["index"]: d for d in topo.details.get("devices", [])}
    lines = []
    for i in range(n):
        d = devs.get(i, {})
        name = (names[i] if names and i < len(names) else None) or d.get("name") or f"device {i}"
        where = []
        if d.get("pci_bus"):
            where.append(f"PCI {d['pci_bus']}")
        node = topo.numa_nodes[i]
        where.append(f"NUMA {node}" if node is not None else "NUMA n/a")
        lines.append(f"GPU {i}: {name}  [{', '.join(where)}]")
    lines.append("")
    src = topo.details.get("source", "estimated" if not topo.probed else "measured")
    lines.append(f"Topology ({'measured' if topo.probed else 'estimated'}; source: {src}"
                 + (f", {topo.details['cache_file']}" if topo.details.get("cache_file") else "") + ")")
    width = 28
    header = (" " * 8 + "".join(f"{'-> GPU ' + str(j):<{width}}" for j in range(n))).rstrip()

    def table(title: str, cell: Any) -> None:
        lines.append("")
        lines.append(title)
        lines.append(header)
        for i in range(n):
            row = f"GPU {i:<4}"
            for j in range(n):
                c = topo.get_connection(i, j)
                text = "-" if i == j else ("no link" if c is None else cell(c))
                row += f"{text:<{width}}"
            lines.append(row.rstrip())

    table("bandwidth GB/s, link, method", lambda c: f"{c.bandwidth_gbps:.1f} {c.interconnect.name.lower()}"
          + (f" ({c.method})" if c.method else ""))
    table("latency us", lambda c: f"{c.latency_us:.1f}")
    for note in topo.details.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)
