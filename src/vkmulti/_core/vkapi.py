"""The one door to the `vulkan` (cffi) package for calls that can fail.

``vkapi.vkCreateBuffer(device, info, None)`` is ``vulkan.vkCreateBuffer`` whose
failures come out of `errors.raise_for_result` (OutOfDeviceMemoryError,
DeviceLostError, UnsupportedError, ...) like the native layer's, instead of
that package's own exception classes. Any ``vk*`` function of the package is
available under its name. Functions that return void in the C API (vkDestroy*,
vkCmd*, property getters) cannot fail and may be called on the package
directly; tests/test_error_path.py keeps every other call coming through here.
"""
from __future__ import annotations

from typing import Any, Callable

import vulkan as vk

from ..errors import UnsupportedError, VulkanError, raise_for_result
from .checks import is_int

__all__ = ["raise_from_vulkan", "device_function", "queue_submit", "pipeline_cache_data"]

_CODES: dict[type, int] = {cls: code for code, cls in vk.exception_codes.items()}
_FAILURES = (vk.VkError, vk.VkException)


def raise_from_vulkan(exc: BaseException, call: str) -> None:
    """Raise vkmulti's exception for an exception of the `vulkan` package from `call`."""
    code = _CODES.get(type(exc))
    if code is not None:
        raise_for_result(code, call)
    if isinstance(exc, (vk.ProcedureNotFoundError, vk.ExtensionNotSupportedError)):
        raise UnsupportedError(f"{call}: the driver does not provide it ({exc})")
    raise VulkanError(-13, call, f"{call} failed: {type(exc).__name__}")


def _unknown_result(exc: KeyError) -> int | None:
    """The VkResult of a KeyError the package raises for a code missing from its
    table (``raise exception_codes[result]``), else None."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or not tb.tb_frame.f_code.co_filename.endswith(("vulkan/_vulkan.py", "vulkan\\_vulkan.py")):
        return None
    code = exc.args[0] if exc.args else None
    return code if is_int(code) else None


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except _FAILURES as exc:
            failure: BaseException = exc
        except KeyError as exc:
            code = _unknown_result(exc)
            if code is None:
                raise
            raise_for_result(code, name)
            raise
        raise_from_vulkan(failure, name)   # outside the except block: no chained package traceback

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"vulkan.{name}, failures raised as vkmulti errors (see vkmulti.vkapi)."
    return call


def __getattr__(name: str) -> Callable[..., Any]:
    """vkapi.vkXxx: the package's vkXxx, wrapped once and cached here."""
    if not (name.startswith("vk") and name[2:3].isupper()):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    fn = getattr(vk, name, None)
    if not callable(fn):
        raise AttributeError(f"the vulkan package has no function {name!r}")
    wrapped = globals()[name] = _wrap(name, fn)
    return wrapped


def device_function(device: Any, name: str) -> Callable[..., Any]:
    """An extension function of `device` (vkGetDeviceProcAddr), wrapped like the rest;
    UnsupportedError when the driver lacks it."""
    try:
        fn = vk.vkGetDeviceProcAddr(device, name)
    except (vk.ProcedureNotFoundError, vk.ExtensionNotSupportedError) as exc:
        raise UnsupportedError(f"{name} is not available on this device ({exc})") from None
    return _wrap(name, fn)


def queue_submit(native: Any, queue: Any, submits: list[Any], fence: Any = None, *,
                 call: str = "vkQueueSubmit", lock_timeout: float | None = None) -> None:
    """vkQueueSubmit of `submits` (VkSubmitInfo structs, or one cffi pointer to
    them) to `queue` (a devices.Queue) under the queue's lock, through the lost
    flag of `native` (the device's _native.Device): on a device marked lost it
    raises DeviceLostError without calling the driver, exactly as the native
    core's submits do, and a VK_ERROR_DEVICE_LOST from the driver marks the
    device lost for every later submit and wait. The one door for Python's
    submits (tests/test_error_path.py keeps it so). vkmulti.TimeoutError when
    another thread holds the queue's lock past `lock_timeout` s (None: no bound)."""
    fence = vk.VK_NULL_HANDLE if fence is None else fence
    failure: BaseException | None = None
    code: int | None = None
    queue.lock.acquire(lock_timeout)
    try:
        if native is not None:
            native.check_alive(call)
        try:
            if isinstance(submits, list):
                vk.vkQueueSubmit(queue.handle, len(submits), submits or None, fence)
            else:   # a cffi VkSubmitInfo* the caller built: the package's lib, result by value
                code = vk.lib.vkQueueSubmit(queue.handle, 1, submits, vk.ffi.NULL if isinstance(fence, int) and fence == 0 else fence)
        except _FAILURES as exc:
            failure = exc
    finally:
        queue.lock.release()
    if code:
        if code == _DEVICE_LOST and native is not None:
            native.mark_lost()
        raise_for_result(code, call)
    if failure is not None:
        if _CODES.get(type(failure)) == _DEVICE_LOST and native is not None:
            native.mark_lost()
        raise_from_vulkan(failure, call)


_DEVICE_LOST = -4
_INCOMPLETE = 5


def pipeline_cache_data(device: Any, cache: Any, limit: int) -> bytes | None:
    """vkGetPipelineCacheData of `cache` (a VkPipelineCache of `device`; the `vulkan`
    package lacks the call): its blob, or None when it is over `limit` bytes."""
    size = vk.ffi.new("size_t*")
    for _ in range(3):   # (a cache another thread grows between the two calls: asked again)
        code = vk.lib.vkGetPipelineCacheData(device, cache, size, vk.ffi.NULL)
        if code < 0:
            raise_for_result(code, "vkGetPipelineCacheData")
        if size[0] > limit:
            return None
        buf = vk.ffi.new("char[]", max(1, size[0]))
        code = vk.lib.vkGetPipelineCacheData(device, cache, size, buf)
        if code < 0:
            raise_for_result(code, "vkGetPipelineCacheData")
        if code != _INCOMPLETE:
            return bytes(vk.ffi.buffer(buf, size[0]))
    return None
