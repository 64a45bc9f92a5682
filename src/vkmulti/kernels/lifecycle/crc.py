"""Which CRC32 engine checks a live migration on a device (runtime.migration_crc).

"shader": the GPU shader (gpu_crc.GpuCrc) on the device's own queue, always
available. "host": zlib over the device's own mapped memory (host_crc.HostCrc),
only for a CPU device whose memory is all host-visible (lavapipe), where the
"GPU" is the host's cores anyway and zlib is several times faster than the
shader there. "auto" (the default) takes "host" where it suits, else "shader".
"""
from __future__ import annotations

import threading
from typing import Any

__all__ = ["CHOICES", "check_choice", "crc_engine"]

CHOICES = ("auto", "shader", "host")


def check_choice(choice: Any) -> str:
    if not isinstance(choice, str) or choice not in CHOICES:
        raise ValueError(f"migration_crc must be 'auto', 'shader' or 'host', got {choice!r}"[:120])
    return choice


def crc_engine(extras: Any, ctx: Any, choice: str, lock: threading.Lock) -> Any:
    """The engine of kind `choice` for the device of `ctx`, made once and kept in
    `extras.crc` (kind -> engine); the shader's jobs get their own timeline."""
    from ..engine.gpu_jobs import GpuJobs
    from .host_crc import HostCrc

    kind = "shader" if choice == "shader" or (choice == "auto" and not HostCrc.suits(ctx.slot)) else "host"
    eng = extras.crc.get(kind)
    if eng is None:
        with lock:
            eng = extras.crc.get(kind)
            if eng is None:
                if kind == "host":
                    eng = extras.crc[kind] = HostCrc(ctx)
                else:
                    from .gpu_crc import GpuCrc
                    if extras.crc_jobs is None:
                        extras.crc_jobs = GpuJobs(ctx.slot, ctx.queue)
                    eng = extras.crc[kind] = GpuCrc(ctx, extras.crc_jobs)
    return eng
