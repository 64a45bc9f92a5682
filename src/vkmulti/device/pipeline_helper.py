"""Compute pipelines made, and compiled in a child process.

`create_compute_pipeline` makes a compute pipeline with its set layout and
pipeline layout (one storage or uniform buffer binding per entry of `types`,
`push` bytes of push constants) from a VkPipelineCache: the one place vkmulti
builds them.

A pipeline compile holds the driver for milliseconds, and a driver may make the
process's queue submits wait for it (NVIDIA's: a step's vkQueueSubmit beside a
compile of the same process was seen spinning 1.5-3 ms, or blocked ~0.4 ms). So
a compile off the step path can be made elsewhere: `PipelineHelper.compile`
hands the SPIR-V to a child process (this module's `main()`, started once and
kept), which builds the same pipeline on a VkDevice of its own
on a physical device of the same pipeline cache identity (vendorID, deviceID,
pipelineCacheUUID) and returns its pipeline cache blob. Built from that blob,
the pipeline is a cache hit here (~0.1 ms on NVIDIA's driver). It is opt-in
(VKMULTI_PIPELINE_HELPER=gpu: GPUs; =1: every device; unset or 0: none): on an
H100 it cut a cold reload's longest step gap by a fifth to a third, but the
child holds a context on the GPU, and migrations measured beside it were
slower (bench/RESULTS.md, session 22). Drivers whose cache keeps nothing
(lavapipe's) gain nothing from it.

The child's stdin is one end of a socket pair (a request to a child that died
fails with EPIPE, never with a SIGPIPE that would end a process which left that
signal at its default action), its stdout a pipe. They carry frames of a 4-byte
length and a JSON header (at most 4 KiB),
then an 8-byte length and the bytes (SPIR-V to the child, at most MAX_CODE;
the cache blob back, at most MAX_BLOB); every read is bounded by the caller's
timeout, and a helper that times out, dies or answers out of bounds is killed
(HelperError; the caller compiles in-process). The blob is checked (its cache
header names the device's identity) before a driver sees it.
"""
from __future__ import annotations

import atexit
import json
import logging
import math
import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any, BinaryIO

import vulkan as vk

from .._core import vkapi
from .._core.checks import timeout_seconds, wait_bound
from ..errors import VulkanError
from .instance import Instance

log = logging.getLogger(__name__)

__all__ = ["create_compute_pipeline", "compiled_cache", "cache_from_blob", "PipelineHelper", "HelperError",
           "HelperStarting", "HELPER", "helper_wanted", "use_helper", "identity_of", "check_header", "CacheIdentity",
           "HEADER", "ENV", "MAX_CODE", "MAX_BLOB"]

ENV = "VKMULTI_PIPELINE_HELPER"
#: The largest SPIR-V module and cache blob the pipe carries.
MAX_CODE = 16 << 20
MAX_BLOB = 64 << 20
_MAX_HEADER = 4096
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_COMPUTE = vk.VK_SHADER_STAGE_COMPUTE_BIT
#: Seconds a helper may take to start (Python and its Vulkan instance) before it counts as failed.
START_SECONDS = 30.0
#: Seconds a compile waits for a helper that is still starting (0: it compiles elsewhere meanwhile).
READY_WAIT = 0.0


#: VkPipelineCacheHeaderVersionOne: headerSize, headerVersion, vendorID, deviceID, pipelineCacheUUID
HEADER = struct.Struct("<IIII16s")
_VERSION_ONE = 1

#: (vendorID, deviceID, pipelineCacheUUID) of a physical device's pipeline caches
CacheIdentity = tuple[int, int, bytes]


def identity_of(physical_device: Any) -> CacheIdentity:
    """The cache identity of `physical_device` (vkGetPhysicalDeviceProperties)."""
    props = vk.vkGetPhysicalDeviceProperties(physical_device)
    uuid = bytes(bytearray(int(b) & 0xFF for b in props.pipelineCacheUUID))
    return int(props.vendorID), int(props.deviceID), uuid


def check_header(data: bytes, ident: CacheIdentity) -> str | None:
    """Why `data` is not a pipeline cache of a device of `ident` (None: it is one)."""
    if len(data) < HEADER.size:
        return f"{len(data)} bytes, shorter than a cache header ({HEADER.size})"
    size, version, vendor, device, uuid = HEADER.unpack_from(data)
    if size != HEADER.size:   # (VkPipelineCacheHeaderVersionOne: headerSize must be 32)
        return f"a header length of {size}, not {HEADER.size}"
    if version != _VERSION_ONE:
        return f"header version {version}, not {_VERSION_ONE}"
    if (vendor, device, uuid) != ident:
        return (f"made by another driver or device (vendor {vendor:#x}, device {device:#x}, "
                f"pipelineCacheUUID {uuid.hex()})")
    return None


def cache_from_blob(device: Any, blob: bytes | None) -> Any:
    """A VkPipelineCache of `device`, starting from `blob` (a cache's data, checked by the
    caller; None or b"": empty)."""
    if not blob:
        return vkapi.vkCreatePipelineCache(device, vk.VkPipelineCacheCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO), None)
    data = vk.ffi.from_buffer(blob)   # (held by a name until the call returns)
    info = vk.VkPipelineCacheCreateInfo(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
                                        initialDataSize=len(blob), pInitialData=data)
    return vkapi.vkCreatePipelineCache(device, info, None)


class HelperError(Exception):
    """The child process could not compile the pipeline (the caller compiles it itself)."""


def create_compute_pipeline(device: Any, cache: Any, code: bytes, entry: str, types: list[int],
                            push: int) -> tuple[Any, Any, Any]:
    """(set layout, pipeline layout, pipeline) of a compute shader `code` (entry point
    `entry`) whose set 0 has one binding of each descriptor type in `types`, with
    `push` bytes of push constants, through `cache` (a VkPipelineCache or None).
    Nothing is left behind on an error."""
    dsl = layout = None
    try:
        dsl = vkapi.vkCreateDescriptorSetLayout(device, vk.VkDescriptorSetLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, bindingCount=len(types),
            pBindings=[vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=t, descriptorCount=1,
                                                       stageFlags=_COMPUTE) for i, t in enumerate(types)]), None)
        layout = vkapi.vkCreatePipelineLayout(device, vk.VkPipelineLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, setLayoutCount=1, pSetLayouts=[dsl],
            pushConstantRangeCount=1, pPushConstantRanges=[vk.VkPushConstantRange(
                stageFlags=_COMPUTE, offset=0, size=push)]), None)
        module = vkapi.vkCreateShaderModule(device, vk.VkShaderModuleCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(code), pCode=code), None)
        try:
            stage = vk.VkPipelineShaderStageCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, stage=_COMPUTE, module=module,
                pName=entry)
            pipeline = vkapi.vkCreateComputePipelines(device, cache if cache is not None else vk.VK_NULL_HANDLE, 1,
                                                      [vk.VkComputePipelineCreateInfo(
                                                          sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
                                                          stage=stage, layout=layout)], None)[0]
            del stage
        finally:
            vk.vkDestroyShaderModule(device, module, None)
    except BaseException:
        if layout is not None:
            vk.vkDestroyPipelineLayout(device, layout, None)
        if dsl is not None:
            vk.vkDestroyDescriptorSetLayout(device, dsl, None)
        raise
    return dsl, layout, pipeline


def helper_wanted(device_type: str) -> bool:
    """Whether compiles off the step path on a device of this type go to the helper
    (VKMULTI_PIPELINE_HELPER: "1" every device, "gpu" GPUs but not CPU devices, else
    none: the helper is opt-in, see the module docstring)."""
    mode = os.environ.get(ENV, "0")
    return mode == "1" or (mode == "gpu" and device_type != "cpu")


def compiled_cache(device: Any, identity: CacheIdentity, code: bytes, entry: str, types: list[int], push: int,
                   timeout: float, where: str) -> Any:
    """A VkPipelineCache of `device` (of cache identity `identity`, named `where` in a
    warning) holding the pipeline create_compute_pipeline makes from these arguments,
    compiled by HELPER; None where there is none (the helper is starting, or it failed:
    one warning per reason; the caller compiles it)."""
    try:
        blob = HELPER.compile(identity, code, entry, types, push, timeout)
        why = check_header(blob, identity)
        if why is not None:
            raise HelperError(f"its cache blob is not one of this device: {why}")
        return cache_from_blob(device, blob)
    except HelperStarting:
        return None
    except (HelperError, VulkanError) as exc:
        text = f"{where}: {exc}"
        with _warned_lock:
            first = text not in _warned
            _warned.add(text)
        if first:
            log.warning("%s: the pipeline helper process did not compile a pipeline (%s); compiling it here",
                        where, exc)
        return None


_warned: set[str] = set()
_warned_lock = threading.Lock()


def use_helper(device_type: str) -> bool:
    """helper_wanted(device_type), and HELPER started where it is (not waited for: builds
    compile elsewhere until it is ready)."""
    if not helper_wanted(device_type):
        return False
    HELPER.start()
    return True


# -- the pipe -------------------------------------------------------------------------------

def _frame_head(header: dict, body: bytes) -> bytes:
    """What precedes a frame's body: the JSON header's length, the header, the body's length."""
    head = json.dumps(header).encode()
    return _U32.pack(len(head)) + head + _U64.pack(len(body))


def _write_frame(out: BinaryIO, header: dict, body: bytes) -> None:
    out.write(_frame_head(header, body))
    out.write(body)
    out.flush()


#: send() flags that turn a write to a child that is gone into EPIPE, never SIGPIPE (which kills
#: a process that left SIGPIPE at its default action, as command-line programs often do).
_NO_SIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)


def _send_frame(sock: socket.socket, header: dict, body: bytes, deadline: float) -> None:
    """_write_frame on the non-blocking socket of the child's stdin, before a deadline (a
    child that stops reading never blocks the caller past it: HelperError; one that is
    gone: BrokenPipeError, never a signal)."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_WRITE)
    try:
        for part in (_frame_head(header, body), body):
            view = memoryview(part)
            while view:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HelperError("the pipeline helper did not take the request in time")
                if not sel.select(min(left, 0.25)):
                    continue
                try:
                    view = view[sock.send(view[:1 << 20], _NO_SIGNAL):]
                except BlockingIOError:
                    continue
    finally:
        sel.close()


class _Reader:
    """Reads exact byte counts from a pipe before a deadline (selectors: no read blocks past it)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.sel = selectors.DefaultSelector()
        self.sel.register(fd, selectors.EVENT_READ)

    def read(self, n: int, deadline: float) -> bytes:
        parts, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(min(left, 0.25)):
                if time.monotonic() >= deadline:
                    raise HelperError("the pipeline helper did not answer in time")
                continue
            chunk = os.read(self.fd, min(n - got, 1 << 20))
            if not chunk:
                raise HelperError("the pipeline helper closed its pipe")
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def frame(self, deadline: float, limit: int) -> tuple[dict, bytes]:
        (size,) = _U32.unpack(self.read(_U32.size, deadline))
        if size > _MAX_HEADER:
            raise HelperError(f"the pipeline helper sent a {size}-byte header (at most {_MAX_HEADER})")
        try:
            header = json.loads(self.read(size, deadline))
        except (ValueError, RecursionError) as exc:   # (RecursionError: a header of deeply nested arrays)
            raise HelperError(f"the pipeline helper sent a header that is not JSON: {exc}") from None
        if not isinstance(header, dict):
            raise HelperError("the pipeline helper sent a header that is not an object")
        (length,) = _U64.unpack(self.read(_U64.size, deadline))
        if length > limit:
            raise HelperError(f"the pipeline helper sent {length} bytes (at most {limit})")
        return header, self.read(length, deadline)

    def close(self) -> None:
        self.sel.close()


class HelperStarting(HelperError):
    """The child is not ready yet (started, its hello not read), or busy with another thread's
    compile for longer than the caller waits: compile elsewhere this time."""



class PipelineHelper:
    """The child process that compiles pipelines (see the module docstring): started by
    start() or the first compile, ready once its hello frame is read (its Vulkan
    instance made), one compile at a time, kept until close() (at exit). After
    MAX_FAILURES failed calls it is not started again."""

    MAX_FAILURES = 3

    def __init__(self, argv: list[str] | None = None):
        self.argv = argv or [sys.executable, "-c", "import sys; from vkmulti.device.pipeline_helper import main; "
                                                   "sys.exit(main())"]
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None   # the child's stdin (a socket pair's end)
        self._reader: _Reader | None = None
        self._ready = False
        self._started_at = 0.0
        self.compiles = 0      # blobs received
        self.failures = 0      # calls that raised HelperError (not HelperStarting)

    def start(self) -> None:
        """Start the child if it is not running (without waiting for it)."""
        with self._lock:
            if self.failures < self.MAX_FAILURES:
                try:
                    self._start()
                except HelperError as exc:
                    self.failures += 1
                    log.warning("%s", exc)

    def compile(self, identity: tuple[int, int, bytes], code: bytes, entry: str, types: list[int], push: int,
                timeout: float | None) -> bytes:
        """The pipeline cache blob of the pipeline create_compute_pipeline makes from these
        arguments, compiled by the child on a physical device of `identity` (vendorID,
        deviceID, pipelineCacheUUID). HelperStarting while the child is not ready
        (waited for READY_WAIT s at most, within `timeout`; not ready after START_SECONDS:
        a failure);
        HelperError when it cannot (the helper is then stopped; a later call starts
        another, up to MAX_FAILURES; `timeout` None: no limit). One `timeout` bounds the whole
        call: the wait for another thread's compile (HelperStarting once it is spent: compile
        elsewhere), then this one."""
        limit = timeout_seconds(timeout)
        timeout = math.inf if limit is None else limit
        deadline = time.monotonic() + timeout   # (one bound for the wait for the lock and the compile)
        if len(code) > MAX_CODE:
            raise HelperError(f"a {len(code)}-byte module is more than the helper takes ({MAX_CODE})")
        vendor, device, uuid = identity
        header = {"vendor": vendor, "device": device, "uuid": uuid.hex(), "entry": entry, "types": list(types),
                  "push": push}
        bound = wait_bound(max(0.0, deadline - time.monotonic()))
        if not self._lock.acquire(timeout=-1 if bound is None else bound):   # (Ctrl-C ends the wait)
            raise HelperStarting(f"the pipeline helper was busy with another compile for {timeout:.3g} s")
        try:
            if self.failures >= self.MAX_FAILURES:
                raise HelperError(f"the pipeline helper failed {self.failures} times: not used any more")
            try:
                sock, reader = self._start()
                if not self._ready:
                    self._await_hello(reader, min(READY_WAIT, max(0.0, deadline - time.monotonic())))
                _send_frame(sock, header, code, deadline)
                answer, blob = reader.frame(deadline, MAX_BLOB)
            except HelperStarting:
                raise
            except HelperError:
                self.failures += 1
                self._stop()
                raise
            except (OSError, ValueError) as exc:   # (a broken pipe: the child is gone)
                self.failures += 1
                self._stop()
                raise HelperError(f"the pipeline helper is gone: {exc}") from None
            except BaseException:   # (Ctrl-C mid-request: its answer would be read as the next one's)
                self._stop()
                raise
            if not answer.get("ok"):
                self.failures += 1
                raise HelperError(f"the pipeline helper could not compile it: {str(answer.get('error'))[:300]}")
            self.compiles += 1
            return blob
        finally:
            self._lock.release()

    def _await_hello(self, reader: _Reader, wait: float) -> None:
        """Read the child's hello if it came (waiting `wait` s at most)."""
        if not reader.sel.select(wait):
            if time.monotonic() - self._started_at >= START_SECONDS:
                raise HelperError(f"the pipeline helper did not start within {START_SECONDS} s")
            raise HelperStarting("the pipeline helper is starting")
        hello, _ = reader.frame(time.monotonic() + max(wait, 5.0), 0)
        if not hello.get("hello"):
            raise HelperError(f"the pipeline helper did not start: {str(hello.get('error'))[:300]}")
        self._ready = True

    def _start(self) -> tuple[socket.socket, _Reader]:
        """The running child's request socket and answer reader, the child started first if needed.
        Its stdin is one end of a socket pair, not a pipe: a request to a child that died fails
        with EPIPE (send with MSG_NOSIGNAL) and never raises SIGPIPE in this process."""
        if self._proc is not None and self._proc.poll() is None and self._reader is not None \
                and self._sock is not None:
            return self._sock, self._reader
        self._stop()
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(self.argv, stdin=theirs.fileno(), stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, close_fds=True)
        except OSError as exc:
            ours.close()
            raise HelperError(f"could not start the pipeline helper: {exc}") from None
        finally:
            theirs.close()
        ours.setblocking(False)   # (_send_frame: bounded writes)
        if not _NO_SIGNAL and hasattr(socket, "SO_NOSIGPIPE"):   # (where send() has no MSG_NOSIGNAL)
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_NOSIGPIPE, 1)
        self._proc, self._sock, self._reader = proc, ours, _Reader(proc.stdout.fileno())  # type: ignore[union-attr]
        self._ready, self._started_at = False, time.monotonic()
        return ours, self._reader

    def _stop(self) -> None:
        proc, reader, self._proc, self._reader, self._ready = self._proc, self._reader, None, None, False
        sock, self._sock = self._sock, None
        if reader is not None:
            reader.close()
        if sock is not None:
            sock.close()
        if proc is None:
            return
        try:
            proc.stdout.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            proc.wait(2.0)   # (its stdin closed: it ends)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                log.warning("the pipeline helper (pid %d) did not exit after SIGKILL", proc.pid)

    def close(self) -> None:
        """Stop the child (idempotent)."""
        with self._lock:
            self._stop()


#: The process's helper (stopped at exit).
HELPER = PipelineHelper()
atexit.register(HELPER.close)


# -- the child ------------------------------------------------------------------------------

class _Compiler:
    """The child's side: one VkDevice per cache identity, made at its first request."""

    def __init__(self) -> None:
        self.instance = Instance(app_name="vkmulti-pipeline-helper")
        self.devices: dict[CacheIdentity, Any] = {}

    def device(self, key: CacheIdentity) -> Any:
        dev = self.devices.get(key)
        if dev is not None:
            return dev
        for pd in self.instance.physical_devices():
            if identity_of(pd) != key:
                continue
            families = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
            family = next(i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT)
            # (every array the driver reads held by a name until the call returns: a cdata made
            # inside another struct's constructor may be freed before the call)
            prio = vk.ffi.new("float[]", [1.0])
            queues = [vk.VkDeviceQueueCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                                 queueFamilyIndex=family, queueCount=1, pQueuePriorities=prio)]
            info = vk.VkDeviceCreateInfo(sType=vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, queueCreateInfoCount=1,
                                         pQueueCreateInfos=queues)
            dev = vkapi.vkCreateDevice(pd, info, None)
            del info, queues, prio
            self.devices[key] = dev
            return dev
        vendor, device, uuid = key
        raise LookupError(f"no physical device of vendor {vendor:#x}, device {device:#x}, pipelineCacheUUID "
                          f"{uuid.hex()}")

    def compile(self, header: dict, code: bytes) -> bytes:
        key = (int(header["vendor"]), int(header["device"]), bytes.fromhex(str(header["uuid"])))
        entry, push = str(header["entry"]), int(header["push"])
        types = [int(t) for t in header["types"]]
        dev = self.device(key)
        cache = cache_from_blob(dev, None)
        try:
            dsl, layout, pipeline = create_compute_pipeline(dev, cache, code, entry, types, push)
            vk.vkDestroyPipeline(dev, pipeline, None)
            vk.vkDestroyPipelineLayout(dev, layout, None)
            vk.vkDestroyDescriptorSetLayout(dev, dsl, None)
            errors = [text for severity, text in self.instance.validation_messages() if severity == "error"]
            if errors:
                raise RuntimeError(f"validation: {errors[0][:200]}")
            blob = vkapi.pipeline_cache_data(dev, cache, MAX_BLOB)
            if blob is None:
                raise RuntimeError(f"the cache blob is over {MAX_BLOB} bytes")
            return blob
        finally:
            vk.vkDestroyPipelineCache(dev, cache, None)


def main() -> int:
    """Say hello once ready, then serve compile requests on stdin until it closes (the
    parent went, or stopped us). The answers go out on a copy of stdout; stdout itself
    then goes where stderr goes, so what a driver or layer prints cannot corrupt them."""
    reader = _Reader(sys.stdin.fileno())
    sys.stdout.flush()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        compiler = _Compiler()
    except Exception as exc:   # (told to the parent, which compiles everything itself)
        _write_frame(out, {"hello": False, "error": f"{type(exc).__name__}: {exc}"}, b"")
        return 1
    _write_frame(out, {"hello": True}, b"")
    while True:
        try:
            header, code = reader.frame(float("inf"), MAX_CODE)
        except HelperError:
            return 0
        try:
            blob = compiler.compile(header, code)
            _write_frame(out, {"ok": True}, blob)
        except Exception as exc:   # (told to the parent, which compiles it itself)
            _write_frame(out, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, b"")


if __name__ == "__main__":
    sys.exit(main())
