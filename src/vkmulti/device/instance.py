"""Vulkan instance creation, validation messages and physical-device enumeration."""
from __future__ import annotations

import logging
import os
import threading
import weakref

import vulkan as vk

from .._core import _native, vkapi
from .._core.handles import cstr
from .._core.vktypes import VkInstance, VkPhysicalDevice
from ..errors import DestroyedError, UnsupportedError
from .._core.checks import short_repr

log = logging.getLogger(__name__)

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
DEBUG_UTILS = "VK_EXT_debug_utils"
#: Setting this environment variable to 1 turns validation on for every
#: Instance created without an explicit `validation=` (the test suite does).
VALIDATION_ENV = "VKMULTI_VALIDATION"

_live: "weakref.WeakSet[Instance]" = weakref.WeakSet()
_orphan_messages: list[tuple[str, str]] = []
_orphan_lock = threading.Lock()


def available_layers() -> set[str]:
    return {cstr(p.layerName) for p in vkapi.vkEnumerateInstanceLayerProperties()}


def available_instance_extensions() -> set[str]:
    return {cstr(p.extensionName) for p in vkapi.vkEnumerateInstanceExtensionProperties(None)}


class Instance:
    """A VkInstance made by vkmulti (Vulkan 1.3 requested), optionally validated.

    With validation on, a debug-utils messenger (C callback, no GIL needed)
    collects warnings and errors; `validation_messages()` drains them.
    """

    def __init__(self, *, validation: bool | None = None, app_name: str = "vkmulti",
                 extensions: tuple[str, ...] = ()):
        if validation is None:
            validation = os.environ.get(VALIDATION_ENV, "") == "1"
        if not isinstance(app_name, str):
            raise TypeError(f"app_name must be str, got {type(app_name).__name__}")
        self.validation = bool(validation)
        self._messenger = None
        self._handle = None
        layers: list[str] = []
        exts = list(dict.fromkeys(extensions))
        if self.validation:
            if VALIDATION_LAYER not in available_layers():
                raise UnsupportedError(
                    f"validation was requested but the layer {VALIDATION_LAYER} is not installed; "
                    "install it (Debian: apt-get install vulkan-validationlayers) or pass validation=False",
                    extension=VALIDATION_LAYER)
            layers.append(VALIDATION_LAYER)
            if DEBUG_UTILS not in exts:
                exts.append(DEBUG_UTILS)
        have = available_instance_extensions()   # (once: a long list must not ask the loader per name)
        missing = [e for e in exts if e not in have and e != DEBUG_UTILS]
        if missing:
            raise UnsupportedError(f"instance extensions not available: {short_repr(missing, 200)}",
                                   extension=missing[0])
        app = vk.VkApplicationInfo(
            sType=vk.VK_STRUCTURE_TYPE_APPLICATION_INFO,
            pApplicationName=app_name, applicationVersion=1,
            pEngineName="vkmulti", engineVersion=1,
            apiVersion=vk.VK_MAKE_VERSION(1, 3, 0))
        info = vk.VkInstanceCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, pApplicationInfo=app,
            enabledLayerCount=len(layers), ppEnabledLayerNames=layers or None,
            enabledExtensionCount=len(exts), ppEnabledExtensionNames=exts or None)
        self._handle = vkapi.vkCreateInstance(info, None)
        self.extensions = frozenset(exts)
        if self.validation:
            self._messenger = _native.Messenger(self.handle_int)
        _live.add(self)

    @property
    def handle(self) -> VkInstance:
        """The VkInstance (a `vulkan` package handle); DestroyedError after destroy()."""
        if self._handle is None:
            raise DestroyedError("Instance used after destroy()")
        return self._handle

    @property
    def handle_int(self) -> int:
        """The VkInstance handle as an int."""
        return int(vk.ffi.cast("uintptr_t", self.handle))

    @property
    def destroyed(self) -> bool:
        """True once destroy() was called."""
        return self._handle is None

    def physical_devices(self) -> list[VkPhysicalDevice]:
        """Every physical device, in the loader's order."""
        return list(vkapi.vkEnumeratePhysicalDevices(self.handle))

    def validation_messages(self) -> list[tuple[str, str]]:
        """Drain the collected (severity, text) messages (warnings and errors)."""
        return self._messenger.drain() if self._messenger is not None else []

    def destroy(self) -> None:
        """Destroy the instance (idempotent). Its devices must be destroyed first."""
        if self._handle is None:
            return
        if self._messenger is not None:
            pending = self._messenger.drain()
            with _orphan_lock:
                _orphan_messages.extend(pending)
            self._messenger.destroy()
            self._messenger = None
        vk.vkDestroyInstance(self._handle, None)
        self._handle = None

    def __enter__(self) -> "Instance":
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def drain_all_validation_messages() -> list[tuple[str, str]]:
    """Messages of every live instance, plus those left by destroyed ones."""
    out: list[tuple[str, str]] = []
    with _orphan_lock:
        out.extend(_orphan_messages)
        _orphan_messages.clear()
    for inst in list(_live):
        if not inst.destroyed:
            out.extend(inst.validation_messages())
    return out
