"""Joining or starting Ray for vkmulti: the optional import, address checks, a local Ray for 'auto'.

Nodes offer their Vulkan GPUs to Ray as the custom resource `vk_gpu` (the
node's Vulkan device count), never as `num_gpus`: Ray ties `GPU` to
CUDA_VISIBLE_DEVICES, which would hide GPUs from the CUDA interop path.
Start a node with ``ray start ... --resources='{"vk_gpu": N}'`` (N from
`vk_gpu_count()` on that node).
"""
from __future__ import annotations

import ipaddress
import math
import os
import socket
import sys
from dataclasses import dataclass
import types
from typing import Any

from ..device.instance import Instance
from .errors import ClusterAddressError, ClusterConnectionError, ClusterError, RayMissingError
from .._core.checks import is_int, short_repr
from .._core.reprs import compact_repr

__all__ = ["VK_GPU", "RayAddress", "Connection", "require_ray", "parse_address", "vk_gpu_count",
           "node_resources", "connect"]

#: The custom Ray resource a node offers per Vulkan GPU.
VK_GPU = "vk_gpu"
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain"}
#: Ray turns a loopback address into the machine's "external" IP unless this is 0
#: (on a machine whose external IP is unreachable that hangs); see connect().
_RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def require_ray(what: str = "vkmulti.cluster") -> types.ModuleType:
    """The `ray` module, or RayMissingError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise RayMissingError(what) from None
    return ray


@dataclass(frozen=True)
class RayAddress:
    """A parsed --ray address: 'auto' (start a local Ray), HOST:PORT (a GCS) or ray://HOST:PORT (Ray Client)."""

    __repr__ = compact_repr

    kind: str                 # "auto", "gcs" or "client"
    host: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        if self.kind == "auto":
            return "auto"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"{'ray://' if self.kind == 'client' else ''}{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        """True when the address names this machine's loopback interface."""
        if self.host is None:
            return False
        if self.host.lower() in _LOOPBACK_NAMES:
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_address(address: str) -> RayAddress:
    """'auto', 'HOST:PORT' or 'ray://HOST:PORT' -> RayAddress; ClusterAddressError names a bad one."""
    if not isinstance(address, str):
        raise ClusterAddressError(f"a Ray address must be a str ('auto', HOST:PORT or ray://HOST:PORT), "
                                  f"got {type(address).__name__}")
    text = address.strip()
    if text == "auto":
        return RayAddress("auto")
    kind, rest = ("client", text[len("ray://"):]) if text.startswith("ray://") else ("gcs", text)
    why = None
    if "://" in rest or any(c.isspace() for c in rest) or "/" in rest:
        why = "expected 'auto', HOST:PORT or ray://HOST:PORT"
    host, port = None, None
    if why is None:
        if rest.startswith("["):                       # [IPv6]:PORT
            end = rest.find("]")
            host, tail = (rest[1:end], rest[end + 1:]) if end > 0 else (None, "")
            port_text = tail[1:] if tail.startswith(":") else None
        else:
            host, sep, port_text = rest.rpartition(":")
            if not sep:
                host, port_text = rest, None
        if not host:
            why = "the host is missing"
        elif port_text is None or not (port_text.isascii() and port_text.isdigit()):
            # ASCII only: str.isdigit() takes '²' (int() refuses it) and other scripts' digits
            why = "the port is missing or not a number (the head's GCS port, 6379 by default)"
        elif len(port_text.lstrip("0")) > 5 or not 0 < int(port_text.lstrip("0") or "0") < 65536:
            why = f"port {port_text[:12]} is outside 1..65535"   # (checked by length first: int() of 4300+ digits raises)
        else:
            port = int(port_text.lstrip("0"))
    if why is not None:
        raise ClusterAddressError(f"bad Ray address {short_repr(address, 120)}: {why}")
    return RayAddress(kind, host, port)


def vk_gpu_count() -> int:
    """Vulkan physical devices this machine's agent would drive (what to offer as `vk_gpu`)."""
    inst = Instance(validation=False)
    try:
        return len(inst.physical_devices())
    finally:
        inst.destroy()


def node_resources() -> dict[str, float]:
    """The resources this node should offer Ray: {'vk_gpu': its Vulkan device count}."""
    return {VK_GPU: float(vk_gpu_count())}


@dataclass
class Connection:
    """The Ray connection connect() made or found; close() undoes what it did (idempotent)."""

    __repr__ = compact_repr

    address: str
    started_local: bool = False
    joined: bool = False

    def close(self) -> None:
        """Shut down Ray in this process if this connection started or joined it (idempotent)."""
        if self.started_local or self.joined:
            import ray

            ray.shutdown()
            self.started_local = self.joined = False

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_reachable(addr: RayAddress, timeout: float) -> None:
    try:
        with socket.create_connection((addr.host, addr.port), timeout=timeout):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        if isinstance(exc, socket.gaierror):
            why = f"cannot resolve {addr.host!r} ({exc.strerror})"
        elif isinstance(exc, (socket.timeout, TimeoutError)):
            why = f"no answer within {timeout:g} s"
        raise ClusterConnectionError(
            f"no Ray cluster at {addr}: {why}. Start one with `ray start --head "
            f"--resources='{{\"{VK_GPU}\": N}}'` (N = the node's Vulkan GPUs), or pass 'auto' to start a local "
            f"Ray") from None


def connect(address: str, *, timeout: float = 10.0, object_store_memory: int | None = None,
            num_cpus: int | None = None, vk_gpu: int | None = None, log_to_driver: bool = True) -> Connection:
    """Join the Ray cluster at `address`, or start a local Ray for 'auto'.

    'auto' starts a single-node Ray on 127.0.0.1 offering `vk_gpu` (default:
    this machine's Vulkan device count; ClusterError when it has none). HOST:PORT
    joins a running cluster's GCS, ray://HOST:PORT goes through Ray Client;
    ClusterConnectionError within `timeout` s when nothing answers there. When
    this process is already connected to Ray, that connection is used as is.
    """
    addr = parse_address(address)
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and math.isfinite(timeout)
            and timeout > 0):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {short_repr(timeout)}")
    if object_store_memory is not None and (not is_int(object_store_memory) or object_store_memory < 2**20):
        raise ValueError(f"object_store_memory must be an int of bytes >= 1 MiB, got {short_repr(object_store_memory)}")
    if num_cpus is not None and (not is_int(num_cpus) or num_cpus < 0):
        raise ValueError(f"num_cpus must be an int >= 0, got {short_repr(num_cpus)}")
    if vk_gpu is not None and (not is_int(vk_gpu) or vk_gpu < 1):
        raise ValueError(f"vk_gpu must be an int >= 1, got {short_repr(vk_gpu)}")
    if (addr.kind == "auto" or addr.loopback) and "ray" not in sys.modules:
        # a cluster on this machine's loopback: keep Ray's own addresses there too
        os.environ.setdefault(_RAY_LOOPBACK_ENV, "0")
    ray = require_ray()
    if ray.is_initialized():
        return Connection(str(addr))
    if addr.kind == "auto":
        count = vk_gpu if vk_gpu is not None else vk_gpu_count()
        if count < 1:
            raise ClusterError("this machine has no Vulkan device, so a local Ray would have no vk_gpu to offer; "
                               "install a Vulkan driver (or Mesa's lavapipe and pass --virtual 2)")
        # address="local": a new Ray even when RAY_ADDRESS or a recent cluster on this machine is around
        ray.init(address="local", resources={VK_GPU: float(count)}, num_cpus=num_cpus,
                 object_store_memory=object_store_memory, include_dashboard=False, log_to_driver=log_to_driver,
                 _node_ip_address="127.0.0.1")
        return Connection("auto", started_local=True)
    _check_reachable(addr, min(timeout, 10.0))
    try:
        ray.init(address=str(addr), log_to_driver=log_to_driver)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterConnectionError(f"Ray at {addr} refused the connection: {exc}") from exc
    return Connection(str(addr), joined=True)
