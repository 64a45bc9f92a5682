"""Checkpoint storage: ringkernel's `CheckpointStorage` protocol (save, load, list,
delete, exists) with `MemoryStorage` and `FileStorage`.

FileStorage writes atomically: the bytes go to a temporary file in the same
folder, which is fsync'ed and renamed over the name (then the folder is
fsync'ed), so a crash mid-save leaves the old checkpoint or none, never half
of one. Names are checked so that none reaches outside the folder.
"""
from __future__ import annotations

import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ...errors import CheckpointNotFoundError, CheckpointStorageError
from .format import Checkpoint

__all__ = ["CheckpointStorage", "MemoryStorage", "FileStorage", "check_checkpoint_name"]

#: File suffix of a stored checkpoint (the seed's).
SUFFIX = ".rkcp"
_MAX_NAME = 200
_BAD = re.compile(r"[\x00-\x1f/\\:*?\"<>|]")


def check_checkpoint_name(name: Any) -> str:
    """A storage name: a non-empty str of at most 200 characters, no path separators,
    control characters or characters Windows forbids, not starting with '.'."""
    if not isinstance(name, str):
        raise TypeError(f"a checkpoint name must be a str, got {type(name).__name__}")
    if not name or len(name) > _MAX_NAME:
        raise ValueError(f"a checkpoint name must have 1 to {_MAX_NAME} characters, got {len(name)}")
    bad = _BAD.search(name)
    if bad or name.startswith("."):
        what = f"character {bad.group()!r}" if bad else "a leading '.'"
        raise ValueError(f"checkpoint name {name!r} contains {what}: names may not reach outside the storage "
                         f"(no path separators, control characters or leading dots)")
    return name


def _check_checkpoint(checkpoint: Any) -> Checkpoint:
    if not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"save() takes a Checkpoint, got {type(checkpoint).__name__}")
    return checkpoint


@runtime_checkable
class CheckpointStorage(Protocol):
    """Where checkpoints are kept, by name."""

    def save(self, checkpoint: Checkpoint, name: str) -> None:
        """Store `checkpoint` under `name` (replacing what was there)."""

    def load(self, name: str) -> Checkpoint:
        """The checkpoint stored under `name` (CheckpointNotFoundError if none)."""

    def list(self) -> list[str]:
        """The stored names, sorted."""

    def delete(self, name: str) -> None:
        """Remove `name` (CheckpointNotFoundError if none)."""

    def exists(self, name: str) -> bool:
        """Whether something is stored under `name`."""


class MemoryStorage:
    """Checkpoints kept serialised in memory (thread-safe); load() parses and checks them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, bytes] = {}

    def save(self, checkpoint: Checkpoint, name: str) -> None:
        """Store `checkpoint` under `name` in memory (replacing what was there)."""
        name = check_checkpoint_name(name)
        raw = _check_checkpoint(checkpoint).to_bytes()
        with self._lock:
            self._data[name] = raw

    def load(self, name: str) -> Checkpoint:
        """The checkpoint stored under `name`, checked (CheckpointNotFoundError if none)."""
        name = check_checkpoint_name(name)
        with self._lock:
            raw = self._data.get(name)
        if raw is None:
            raise CheckpointNotFoundError(f"Checkpoint not found: {name!r}")
        return Checkpoint.from_bytes(raw)

    def list(self) -> list[str]:
        """The stored names, sorted."""
        with self._lock:
            return sorted(self._data)

    def delete(self, name: str) -> None:
        """Remove `name` (CheckpointNotFoundError if none)."""
        name = check_checkpoint_name(name)
        with self._lock:
            if self._data.pop(name, None) is None:
                raise CheckpointNotFoundError(f"Checkpoint not found: {name!r}")

    def exists(self, name: str) -> bool:
        """Whether something is stored under `name` (False for an invalid name)."""
        try:
            name = check_checkpoint_name(name)
        except (TypeError, ValueError):
            return False
        with self._lock:
            return name in self._data

    def size(self, name: str) -> int:
        """Bytes stored under `name`."""
        name = check_checkpoint_name(name)
        with self._lock:
            raw = self._data.get(name)
        if raw is None:
            raise CheckpointNotFoundError(f"Checkpoint not found: {name!r}")
        return len(raw)

    def __repr__(self) -> str:
        return f"MemoryStorage({len(self._data)} checkpoint(s))"


class FileStorage:
    """Checkpoints as `<name>.rkcp` files in folder `path` (made on first save)."""

    def __init__(self, path: str | os.PathLike) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or path-like, got {type(path).__name__}")
        self.base_path = Path(path)
        if self.base_path.exists() and not self.base_path.is_dir():
            raise ValueError(f"checkpoint folder {str(self.base_path)!r} exists and is not a folder")

    def checkpoint_path(self, name: str) -> Path:
        """The file a name is stored in (the name checked)."""
        return self.base_path / (check_checkpoint_name(name) + SUFFIX)

    def save(self, checkpoint: Checkpoint, name: str) -> None:
        """Store `checkpoint` under `name` in the folder (replacing what was there)."""
        path = self.checkpoint_path(name)
        _check_checkpoint(checkpoint)
        try:
            self.base_path.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.base_path, prefix=f".{name}.", suffix=".tmp")
        except OSError as exc:
            raise CheckpointStorageError(f"Failed to create checkpoint file for {name!r} in "
                                         f"{str(self.base_path)!r}: {exc}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                checkpoint.write_to(f.write)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise CheckpointStorageError(f"Failed to write checkpoint {name!r}: {exc}") from exc
            raise
        self._sync_folder()

    def _sync_folder(self) -> None:
        try:
            fd = os.open(self.base_path, os.O_RDONLY)
        except OSError:
            return   # (a platform without folder fds: the rename is as durable as it gets)
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def load(self, name: str) -> Checkpoint:
        """The checkpoint stored under `name`, checked (CheckpointNotFoundError if none)."""
        path = self.checkpoint_path(name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"Checkpoint not found: {name!r} (no {str(path)!r})") from None
        except OSError as exc:
            raise CheckpointStorageError(f"Failed to read checkpoint {name!r}: {exc}") from exc
        return Checkpoint.from_bytes(raw)

    def list(self) -> list[str]:
        """The stored names, sorted."""
        try:
            entries = list(self.base_path.iterdir())
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CheckpointStorageError(f"Failed to read checkpoint directory {str(self.base_path)!r}: "
                                         f"{exc}") from exc
        return sorted(p.name[:-len(SUFFIX)] for p in entries
                      if p.name.endswith(SUFFIX) and not p.name.startswith(".") and p.is_file())

    def delete(self, name: str) -> None:
        """Remove `name` (CheckpointNotFoundError if none)."""
        path = self.checkpoint_path(name)
        try:
            path.unlink()
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"Checkpoint not found: {name!r}") from None
        except OSError as exc:
            raise CheckpointStorageError(f"Failed to delete checkpoint {name!r}: {exc}") from exc

    def exists(self, name: str) -> bool:
        """Whether something is stored under `name` (False for an invalid name)."""
        try:
            return self.checkpoint_path(name).is_file()
        except (TypeError, ValueError):
            return False

    def __repr__(self) -> str:
        path = str(self.base_path)
        return f"FileStorage({(path if len(path) <= 150 else '...' + path[-147:])!r})"
