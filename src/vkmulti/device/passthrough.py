"""The seed's passthrough over placeholder handles: an engine's GPU-less unit test
builds a MultiDeviceManager from objects that are not Vulkan handles; it holds
them as given in one slot and makes no Vulkan call."""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from .._core.checks import is_int

log = logging.getLogger(__name__)

__all__ = ["has_placeholders", "is_placeholder_primary", "skip_placeholder_secondaries"]


def has_placeholders(*handles: Any) -> bool:
    """True when a physical device is neither a `vulkan` package handle nor an int
    (a GPU-less test's placeholder object): the passthrough then makes no Vulkan
    call. With real physical devices every handle must be real."""
    flat = [h for x in handles for h in (x if isinstance(x, (list, tuple)) else (x,))]
    return any(not (is_int(h) or type(h).__module__ == "_cffi_backend") for h in flat)


def is_placeholder_primary(pd: Any, primary: Any) -> bool:
    """Whether placeholder `pd` is the primary (the same object, or equal to it)."""
    return pd is primary or pd == primary


def skip_placeholder_secondaries(primary: Any, physical_devices: Sequence[Any],
                                 find_queue_families: Callable[[Any], Any] | None) -> None:
    """The seed's secondaries over placeholders: each one the resolver gives no queue
    families (or with no resolver) is skipped with a warning, as the seed skips it;
    one it resolves would need a real device: TypeError."""
    for pd in physical_devices:
        if is_placeholder_primary(pd, primary):
            continue
        qf = find_queue_families(pd) if find_queue_families is not None else None
        if qf is None:
            log.warning("no graphics queue family resolved for %s; skipping", "<unknown>")
            continue
        raise TypeError(f"find_queue_families resolved a placeholder physical device ({type(pd).__name__}): a "
                        f"secondary needs a real VkPhysicalDevice handle (a `vulkan` package handle or an int)")
