"""Hot reload: kernel code sources and their validation, the swap, HotReloadManager."""
from .code_source import KernelCodeFormat, KernelCodeSource, validate_code
from .manager import HotReloadManager
from .types import (HotReloadConfig, HotReloadState, HotReloadRequest, HotReloadResult, HotReloadStats,
                    HotReloadStatsSnapshot)

__all__ = ["KernelCodeFormat", "KernelCodeSource", "HotReloadConfig", "HotReloadState", "HotReloadRequest",
           "HotReloadResult", "HotReloadStats", "HotReloadStatsSnapshot", "HotReloadManager", "validate_code"]
