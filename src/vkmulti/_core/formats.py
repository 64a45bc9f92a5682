"""Bytes per pixel of uncompressed colour formats, derived from the format names."""
from __future__ import annotations

import re

import vulkan as vk
from .checks import is_int, short_repr

_EXCLUDE = re.compile(r"BLOCK|_BC\d|ETC2|EAC|ASTC|PVRTC|PLANE|_422|_420|_444|^VK_FORMAT_D\d|^VK_FORMAT_S8|^VK_FORMAT_X8"
                      r"|_KHR$|_EXT$|_IMG$|UNDEFINED|MAX_ENUM|RANGE_SIZE|BEGIN_RANGE|END_RANGE")


def _table() -> dict[int, tuple[str, int]]:
    out: dict[int, tuple[str, int]] = {}
    for name in dir(vk):
        if not name.startswith("VK_FORMAT_") or _EXCLUDE.search(name):
            continue
        value = getattr(vk, name)
        if not isinstance(value, int) or value in out:
            continue
        pack = re.search(r"_PACK(\d+)$", name)
        if pack:
            bits = int(pack.group(1))
        else:
            comps = re.findall(r"([RGBA])(\d+)", name.split("_")[2])
            bits = sum(int(n) for _, n in comps)
        if bits and bits % 8 == 0:
            out[value] = (name[len("VK_FORMAT_"):], bits // 8)
    return out


COLOR_FORMATS = _table()


def bytes_per_pixel(fmt: int) -> int:
    """Bytes per texel of an uncompressed colour format; ValueError otherwise."""
    if not is_int(fmt):
        raise TypeError(f"format must be a VkFormat int, got {type(fmt).__name__}")
    try:
        return COLOR_FORMATS[fmt][1]
    except KeyError:
        raise ValueError(f"format {short_repr(fmt)} is not an uncompressed single-plane colour format; "
                         "transfers support those only") from None


def format_name(fmt: int) -> str:
    return COLOR_FORMATS.get(fmt, (str(fmt), 0))[0]
