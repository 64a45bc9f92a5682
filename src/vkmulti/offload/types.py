"""The plain parts of SRU offload: routes, frame reports, the per-SRU cache entry,
renderer contexts and the argument checks of SRUOffloadCoordinator."""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeAlias, TypeVar

import vulkan as vk

from .._core import vkapi
from .._core.checks import is_int, short_repr
from ..errors import DestroyedError, RendererMissingError
from ..memory.image import Image
from ..device.manager import DeviceSlot
from .._core.timeline import TimelinePoint
from ..transfer.cross_device import CrossDeviceTransfer
from ..transfer.link import TransferTicket
from .compositor import scale_pair
from .partition import sru_cost
from .._core.reprs import compact_repr

__all__ = ["OffloadRoute", "RendererMissingError", "SecondaryRenderContext", "FrameReport", "SruEntry",
           "default_cost", "int_list", "check_weights", "sru_size", "SizedSRU", "AsyncRenderer", "SeedRenderer",
           "weak_hook", "check_frame_srus"]

if TYPE_CHECKING:
    from .._core.timeline import Points
    from ..device.capabilities import RenderCapabilities, RenderCapabilitiesLike
    from .._core.vktypes import VkCommandPool, VkDevice
    #: An SRU's id (the seed's `sru.sru_id`): all ints or all strs in one plan.
    SruId: TypeAlias = int | str
    #: What renders an SRU on one device (a renderer factory's result, MultiDeviceManager.attach_renderer).
    Renderer: TypeAlias = "AsyncRenderer | SeedRenderer"
    S = TypeVar("S")                      # the caller's SRU objects, handed to its accessors as given
    SS = TypeVar("SS", bound="SizedSRU")  # ... those render_frame draws: they have a width and height


class SizedSRU(Protocol):
    """What SRUOffloadCoordinator reads of every SRU it renders: its image size (and, in
    render_frame, `x` and `y`, its place in the frame; `sru_id` unless an accessor is given)."""

    @property
    def width(self) -> int: ...
    @property
    def height(self) -> int: ...


class AsyncRenderer(Protocol):
    """A renderer that submits and returns the point that marks the render done (ReferenceRenderer).
    The SRUs are the caller's own objects, handed through as given: hence `sru: Any`."""

    def render(self, sru: Any, target: Image, *, wait: Points = None) -> TimelinePoint: ...


class SeedRenderer(Protocol):
    """The seed's renderer: done when render_sru_offscreen returns (or at the TimelinePoint it returns)."""

    def render_sru_offscreen(self, sru: Any, target: Image) -> TimelinePoint | None: ...


@dataclass(frozen=True, slots=True)
class OffloadRoute:
    """Where one SRU renders this frame and how its image reaches the primary."""

    __repr__ = compact_repr

    sru_id: int | str
    device_index: int
    transfer: str

    @property
    def offloaded(self) -> bool:
        """True when the SRU renders on a secondary (its image is transferred to GPU 0)."""
        return self.device_index != 0


class SecondaryRenderContext:
    """What a renderer factory gets for one device: the slot and a command pool of its own.

    vkmulti has no engine facade; renderers build their pipelines from `slot`
    (device, queues, capabilities). The context owns the renderer the factory
    returns (destroyed with it when it has destroy()), never the device.
    """

    def __init__(self, slot: DeviceSlot, *, capabilities: RenderCapabilities | RenderCapabilitiesLike | None = None,
                 content_scale: tuple[float, float] = (1.0, 1.0)):
        if not isinstance(slot, DeviceSlot):
            raise TypeError(f"slot must be a DeviceSlot, got {type(slot).__name__}")
        self.slot = slot
        self.capabilities = capabilities
        self.content_scale = scale_pair(content_scale)
        self.command_pool: VkCommandPool | None = None
        self.renderer: Renderer | None = None

    @classmethod
    def _made(cls, slot: DeviceSlot, factory: Callable[[SecondaryRenderContext], Renderer], *,
              capabilities: RenderCapabilities | RenderCapabilitiesLike | None = None,
              content_scale: tuple[float, float] = (1.0, 1.0)) -> SecondaryRenderContext:
        """A context with its command pool and the renderer `factory(context)` returns (the
        context is destroyed again when the factory raises)."""
        ctx = cls(slot, capabilities=capabilities, content_scale=content_scale)
        ctx.ensure_command_pool()
        try:
            ctx.attach_renderer(factory(ctx))
        except BaseException:
            ctx.destroy()
            raise
        return ctx

    @property
    def device(self) -> VkDevice | None:
        return self.slot.device

    def ensure_command_pool(self) -> VkCommandPool:
        """This context's command pool on the slot's universal family (made once)."""
        if self.command_pool is None:
            if self.slot.device is None:
                raise DestroyedError(f"GPU {self.slot.index} is destroyed")
            self.command_pool = vkapi.vkCreateCommandPool(self.slot.device, vk.VkCommandPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                queueFamilyIndex=self.slot.graphics_queue.family), None)  # type: ignore[union-attr]
        return self.command_pool

    def attach_renderer(self, renderer: Renderer | None) -> None:
        self.renderer = renderer

    def destroy(self) -> None:
        """Destroy the renderer (if it has destroy()) and the command pool; idempotent."""
        renderer, self.renderer = self.renderer, None
        if renderer is not None and callable(getattr(renderer, "destroy", None)):
            renderer.destroy()  # type: ignore[union-attr]
        if self.command_pool is not None and self.slot.device is not None:
            vk.vkDestroyCommandPool(self.slot.device, self.command_pool, None)
        self.command_pool = None


@dataclass(frozen=True)
class FrameReport:
    """What render_frame did: the plan, where each SRU really rendered, and the frame's done point."""

    __repr__ = compact_repr

    routes: list[OffloadRoute]
    rendered_on: dict[SruId, int]
    fallbacks: list[SruId]
    done: TimelinePoint
    transferred_bytes: int
    #: adaptive mode with wait=True: seconds from each device's first submit of the frame until its share
    #: was on GPU 0
    device_seconds: dict[int, float] = field(default_factory=dict)
    #: devices found lost while making this frame (left out of this and later plans)
    lost: list[int] = field(default_factory=list)
    #: True when images that never arrived (a device lost mid-frame) were rendered on the primary
    #: and the frame composited again
    repaired: bool = False

    def device_loads(self, device_count: int) -> list[list[SruId]]:
        """SRU ids per device, as rendered."""
        out: list[list[SruId]] = [[] for _ in range(device_count)]
        for sid, d in self.rendered_on.items():
            out[d].append(sid)
        return out


@dataclass
class SruEntry:
    """Cached per-SRU resources: target on its device, landing image on the primary, transfer."""

    __repr__ = compact_repr

    sru_id: SruId
    device_index: int
    width: int
    height: int
    target: Image | None = None
    landing: Image | None = None
    fallback: Image | None = None
    transfer: CrossDeviceTransfer | None = None
    ticket: TransferTicket | None = None
    points: list[TimelinePoint] = field(default_factory=list)


def default_cost(sru: Any) -> float:
    """`sru.render_cost` when the SRU has one (ReferenceSRU), else the seed's instance count."""
    c = getattr(sru, "render_cost", None)
    return sru_cost(sru) if c is None else c


def int_list(values: Any, label: str) -> list[int]:
    """`values` as a list of ints (never bools); TypeError otherwise."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{label} must be a sequence of ints, got {type(values).__name__}")
    try:
        out = list(values)
    except TypeError:
        raise TypeError(f"{label} must be a sequence of ints, got {type(values).__name__}") from None
    for v in out:
        if not is_int(v):
            raise TypeError(f"{label} must hold ints, got {type(v).__name__} {short_repr(v)}")
    return out


def check_weights(values: Any, count: int) -> list[float]:
    """`values` as one finite speed weight > 0 per device (`count`); TypeError / ValueError otherwise."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"weights must be a sequence of numbers, got {type(values).__name__}")
    try:
        out = [float(w) for w in values]
    except (TypeError, ValueError, OverflowError):
        raise TypeError("weights must be a sequence of numbers (one per device)") from None
    if len(out) != count:
        raise ValueError(f"weights has {len(out)} entries for {count} devices")
    for d, w in enumerate(out):
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"weight of device {d} must be a finite number > 0, got {w!r}")
    return out


def sru_size(sru: SizedSRU) -> tuple[int, int]:
    """The SRU's (width, height): positive ints; TypeError without them, ValueError when not positive."""
    try:
        w, h = sru.width, sru.height
    except AttributeError:
        raise TypeError(f"an SRU needs width and height attributes, got a {type(sru).__name__}") from None
    for label, v in (("width", w), ("height", h)):
        if not is_int(v) or v <= 0:
            raise ValueError(f"SRU {short_repr(getattr(sru, 'sru_id', sru))}: {label} must be a positive int, "
                             f"got {short_repr(v)}")
    return w, h


def check_frame_srus(srus: list[Any], key: Callable[[Any], Any]) -> None:
    """Each SRU's size (sru_size) and its place in the frame, int `x` and `y` (TypeError naming the SRU)."""
    for s in srus:
        sru_size(s)
        for label in ("x", "y"):
            v = getattr(s, label, None)
            if not is_int(v):
                raise TypeError(f"SRU {short_repr(key(s))}: {label} (its place in the frame) must be an int, "
                                f"got {short_repr(v)}")


def weak_hook(method: Callable[[], object]) -> Callable[[], None]:
    """A zero-argument hook calling the bound `method` while its object exists (keeps none alive)."""
    ref = weakref.WeakMethod(method)

    def hook() -> None:
        bound = ref()
        if bound is not None:
            bound()
    return hook
