"""The machine's VkPipelineCache blobs on disk, beside the topology cache
(coordinator.probe.cache_dir): one file per driver cache identity (vendorID,
deviceID, pipelineCacheUUID), so every device of the machine whose identity
matches starts from the same blob, and a second run compiles nothing its
first run compiled (where the driver's cache holds pipelines).

The file is untrusted: read only from a folder this user alone can change
(_core.files.open_private_dir), opened without following a symlink
(O_NOFOLLOW, then fstat: regular files only; O_NONBLOCK, so a FIFO never
blocks the open), read up to a bound, and its Vulkan cache header (length,
version, vendorID, deviceID, pipelineCacheUUID) checked before the driver sees
a byte of it. A file or folder that fails any of these is ignored, with one
warning per file and reason. Saves are atomic (_core.files.replace_file).
VKMULTI_PIPELINE_CACHE=0 turns reading and writing off.
"""
from __future__ import annotations

import logging
import os
import threading

from ..._core.files import open_private_dir, read_regular_file, replace_file
from ...device.pipeline_helper import HEADER, CacheIdentity, check_header, identity_of
from ..coordinator.probe import cache_dir

log = logging.getLogger(__name__)

__all__ = ["PipelineCacheFiles", "CacheIdentity", "identity_of", "check_header", "FILES", "ENV", "MAX_BYTES",
           "HEADER"]

ENV = "VKMULTI_PIPELINE_CACHE"
#: Largest cache file read or written (a larger one is ignored).
MAX_BYTES = 64 << 20


class PipelineCacheFiles:
    """Reads and writes the cache files in `directory` (default: cache_dir() at
    each call) under the hardening of the module docstring."""

    def __init__(self, directory: str | None = None, limit: int = MAX_BYTES):
        self.directory = directory
        self.limit = limit
        self._lock = threading.Lock()
        self._warned: set[tuple[str, str]] = set()
        #: files ignored so far (unreadable, not regular, too large, a bad header)
        self.ignored = 0

    def enabled(self) -> bool:
        """Whether caches are read and written (VKMULTI_PIPELINE_CACHE is not "0")."""
        return os.environ.get(ENV, "1") != "0"

    def path(self, ident: CacheIdentity) -> str:
        """The file of the devices of `ident`."""
        vendor, device, uuid = ident
        return os.path.join(self.directory or cache_dir(), f"pipelines-{vendor:08x}-{device:08x}-{uuid.hex()}.bin")

    def _ignore(self, path: str, why: str) -> None:
        with self._lock:
            self.ignored += 1
            first = (path, why) not in self._warned
            self._warned.add((path, why))
        if first:
            log.warning("ignoring the pipeline cache %s: %s", path, why)

    def _folder(self, create: bool) -> int | None:
        """A descriptor of the cache folder (None: missing, or ignored with one warning)."""
        folder = self.directory or cache_dir()
        try:
            return open_private_dir(folder, create=create)
        except ValueError as exc:
            self._ignore(f"folder {folder}", f"only a folder no one else can change is used: {exc}")
            return None

    def load(self, ident: CacheIdentity) -> bytes | None:
        """The checked blob for devices of `ident`, or None (no file, or one ignored)."""
        if not self.enabled():
            return None
        path = self.path(ident)
        dir_fd = self._folder(create=False)
        if dir_fd is None:
            return None
        try:
            data = read_regular_file(os.path.basename(path), self.limit, dir_fd=dir_fd)
        except ValueError as exc:
            self._ignore(path, str(exc))
            return None
        finally:
            os.close(dir_fd)
        if data is None:
            return None
        why = check_header(data, ident)
        if why is not None:
            self._ignore(path, why)
            return None
        return data

    def save(self, ident: CacheIdentity, data: bytes) -> bool:
        """Write `data` (a cache of a device of `ident`) atomically; False when it was not written."""
        if not self.enabled() or check_header(data, ident) is not None or len(data) > self.limit:
            return False
        path = self.path(ident)
        dir_fd = self._folder(create=True)
        if dir_fd is None:
            return False
        try:
            replace_file(os.path.basename(path), data, dir_fd=dir_fd)   # (a symlink at `path` is replaced)
            return True
        except OSError as exc:
            log.warning("could not write the pipeline cache %s: %s", path, exc)
            return False
        finally:
            os.close(dir_fd)


#: The files DeviceContext reads its initial pipeline cache from and saves it to.
FILES = PipelineCacheFiles()
