"""Hot reload: kernel code sources and their validation, the swap, HotReloadManager."""
from .code_source import KernelCodeFormat, KernelCodeSource
from .manager import (HotReloadConfig, HotReloadState, HotReloadRequest, HotReloadResult, HotReloadStats,
                      HotReloadStatsSnapshot, HotReloadManager, validate_code)
from .types import (HotReloadConfig, HotReloadState, HotReloadRequest, HotReloadResult, HotReloadStats,
                    HotReloadStatsSnapshot, validate_code)

__all__ = ["KernelCodeFormat", "KernelCodeSource", "HotReloadConfig", "HotReloadState", "HotReloadRequest",
           "HotReloadResult", "HotReloadStats", "HotReloadStatsSnapshot", "HotReloadManager", "validate_code"]
