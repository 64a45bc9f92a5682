"""What a node agent sends the driver, checked before the driver uses any of it.

An agent is a peer: a bug, a version skew or a node gone wrong can send anything
back. Each check returns why a reply is not in the shape the agent's method
returns (None when it is), so the caller skips or loses that node with the reason
and goes on with the others; a reply never raises inside the driver, never puts a
NaN or an infinite throughput into a plan, and never carries a megabyte string
into every later message. (Ray itself moves these replies with pickle: checking
their shape is not a security boundary; see docs/explanation/cluster.md.)
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._core.checks import is_int, short_repr
from .planner import IMAGE_BYTES_PER_PIXEL

__all__ = ["seconds_ok", "render_reply_problem", "description_problem", "throughput_problem", "link_time_problem",
           "gpu_rows_problem", "validation_texts", "note", "MAX_TEXT", "MAX_DEVICES"]

#: The longest str a reply may carry where the driver keeps or shows it (ids, names, notes).
MAX_TEXT = 256
#: The most devices a node may report (and GPUs in a stencil split).
MAX_DEVICES = 1024
#: The most validation messages kept per node and call, and characters kept of each.
MAX_REPORTS, MAX_REPORT_TEXT = 64, 1000
#: The most links a node's measured topology may list.
MAX_CONNECTIONS = 1 << 16


def seconds_ok(value: Any) -> bool:
    """Whether `value` is a finite number of seconds >= 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _text_problem(value: Any, what: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not value and not optional) or len(value) > MAX_TEXT:
        return f"{what} is {short_repr(value)}, not a str of 1 to {MAX_TEXT} characters"
    return None


def note(value: Any) -> str | None:
    """A note of a reply (a str, shortened) or None."""
    return value[:300] if isinstance(value, str) and value else None


def description_problem(d: Any) -> str | None:
    """Why a NodeAgent.describe() reply is malformed (None when it is not)."""
    if not isinstance(d, dict):
        return f"a {type(d).__name__}, not a dict"
    for key in ("node_id", "address", "hostname"):
        if (why := _text_problem(d.get(key), key)) is not None:
            return why
    if not is_int(d.get("pid")) or d["pid"] <= 0:
        return f"pid is {short_repr(d.get('pid'))}, not a process id"
    for key in ("error", "topology_note", "nice_note"):
        if d.get(key) is not None and not isinstance(d[key], str):
            return f"{key} is {short_repr(d[key])}, not a str or None"
    if d.get("error"):
        return None   # (a node that reports why it has no device: skipped with that reason)
    devices = d.get("devices")
    if not isinstance(devices, list) or not 1 <= len(devices) <= MAX_DEVICES:
        return f"devices is {short_repr(devices)}, not a list of 1 to {MAX_DEVICES} devices"
    for i, dev in enumerate(devices):
        if not isinstance(dev, dict) or (why := _text_problem(dev.get("name"), f"device {i}'s name")) is not None:
            return why or f"device {i} is {short_repr(dev)}, not a dict"
    topology = d.get("topology")
    if topology is not None:
        links = topology.get("connections", []) if isinstance(topology, dict) else None
        if not isinstance(links, list) or len(links) > MAX_CONNECTIONS or not all(isinstance(c, dict) for c in links):
            return f"topology is {short_repr(topology)}, not a measured topology (a dict of connections)"
    return None


def throughput_problem(r: Any, devices: int) -> str | None:
    """Why a NodeAgent.measure_throughput() reply for a node of `devices` GPUs is malformed."""
    if not isinstance(r, (list, tuple)) or len(r) != devices:
        return f"a reply of {short_repr(r)}, not a list of {devices} throughput(s)"
    if not all(seconds_ok(x) for x in r) or not math.isfinite(math.fsum(r)):
        return f"throughputs {short_repr(list(r))}, not finite numbers >= 0"
    if not any(x > 0 for x in r):
        return "no GPU rendered the calibration SRU"
    return None


def link_time_problem(t: Any) -> str | None:
    """Why a NodeAgent.fetch() reply (seconds to get objects) is malformed."""
    return None if seconds_ok(t) else f"a time of {short_repr(t)}, not a finite number of seconds >= 0"


def gpu_rows_problem(r: Any, rows: int) -> str | None:
    """Why a NodeAgent.stencil_setup() reply (GPU index -> its rows) for a slab of `rows`
    rows is malformed."""
    if not isinstance(r, dict) or not 1 <= len(r) <= MAX_DEVICES:
        return f"a reply of {short_repr(r)}, not a dict of GPU index -> rows"
    if not all(is_int(g) and g >= 0 and is_int(n) and n >= 1 for g, n in r.items()) or sum(r.values()) != rows:
        return f"rows per GPU {short_repr(r)}, not GPU indices -> rows that add up to the slab's {rows}"
    return None


def validation_texts(r: Any) -> list[str]:
    """A NodeAgent.validation_errors() reply as at most MAX_REPORTS strs of at most
    MAX_REPORT_TEXT characters each (one line saying so for a malformed reply)."""
    if not isinstance(r, list) or not all(isinstance(t, str) for t in r[:MAX_REPORTS]):
        return [f"(a malformed report: {short_repr(r)})"]
    out = [t[:MAX_REPORT_TEXT] for t in r[:MAX_REPORTS]]
    if len(r) > MAX_REPORTS:
        out.append(f"(and {len(r) - MAX_REPORTS} more)")
    return out


def render_reply_problem(r: Any, group: list) -> str | None:
    """Why an agent's render() result is not in the shape render() returns (None when it is).

    What a node sends is checked before any of it is used: a NaN or negative time would
    turn its throughput into one every later plan refuses, and a missing or wrongly sized
    image would fail the frame or be composited at the wrong size."""
    if not isinstance(r, dict):
        return f"a {type(r).__name__}, not a dict"
    for key in ("render_s", "readback_s", "total_s"):
        if not seconds_ok(r.get(key)):
            return f"{key} is {short_repr(r.get(key))}, not a finite number of seconds >= 0"
    if r.get("predicted_s") is not None and not seconds_ok(r["predicted_s"]):
        return f"predicted_s is {short_repr(r['predicted_s'])}"
    images, gpu = r.get("images"), r.get("gpu")
    if not isinstance(images, dict) or not isinstance(gpu, dict):
        return "its images or gpu entry is not a dict"
    for s in group:
        img, want = images.get(s.sru_id), (s.height, s.width, IMAGE_BYTES_PER_PIXEL)
        if not isinstance(img, np.ndarray) or img.dtype != np.uint8 or img.shape != want:
            what = (f"{img.dtype} {img.shape}" if isinstance(img, np.ndarray) else type(img).__name__)[:80]
            return f"SRU {short_repr(s.sru_id)}: image {what}, not {want} uint8"
        if not is_int(gpu.get(s.sru_id)):
            return f"SRU {short_repr(s.sru_id)}: GPU index {short_repr(gpu.get(s.sru_id))}"
    return None
