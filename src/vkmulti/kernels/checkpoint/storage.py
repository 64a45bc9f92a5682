"""Checkpoint storage: ringkernel's `CheckpointStorage` protocol (save, load, list,
delete, exists) with `MemoryStorage` and `FileStorage`.

FileStorage writes atomically: the bytes go to a temporary file in the same
folder, which is fsync'ed and renamed over the name (then the folder is
fsync'ed), so a crash mid-save leaves the old checkpoint or none, never half
of one. Names are checked so that none reaches outside the folder.
"""
from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ...errors import CheckpointNotFoundError, CheckpointStorageError, InvalidCheckpointError
from .format import Checkpoint
from .header import MAX_CHECKPOINT_SIZE
from ..._core.checks import short_repr, short_str

try:
    import fcntl
except ImportError:   # (no advisory locks: stale temporary files are left alone)
    fcntl = None   # type: ignore[assignment]

__all__ = ["CheckpointStorage", "MemoryStorage", "FileStorage", "check_checkpoint_name"]

#: File suffix of a stored checkpoint (the seed's).
SUFFIX = ".rkcp"
_MAX_NAME = 200
_BAD = re.compile(r"[\x00-\x1f/\\:*?\"<>|]")
#: Bytes in one file name (POSIX NAME_MAX on the file systems vkmulti runs on).
_NAME_MAX = 255
_TMP_PREFIX, _TMP_SUFFIX = ".rkcp-", ".tmp"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, what in ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return what
    return f"file of mode 0o{mode:o}"


def _lock(fd: int, blocking: bool) -> bool:
    """Take the advisory exclusive lock of an open file; False when another holds it."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


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
        raise ValueError(f"checkpoint name {short_repr(name)} contains {what}: names may not reach outside the storage "
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
            raise CheckpointNotFoundError(f"Checkpoint not found: {short_repr(name)}")
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
                raise CheckpointNotFoundError(f"Checkpoint not found: {short_repr(name)}")

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
            raise CheckpointNotFoundError(f"Checkpoint not found: {short_repr(name)}")
        return len(raw)

    def __repr__(self) -> str:
        return f"MemoryStorage({len(self._data)} checkpoint(s))"


class FileStorage:
    """Checkpoints as `<name>.rkcp` files in folder `path` (made on first save).

    Only regular files count: an entry is opened without following a symbolic
    link (O_NOFOLLOW), checked with fstat and sized before a byte is read, so a
    link, FIFO, device or folder under a checkpoint's name is refused at once
    (CheckpointStorageError) and never followed or waited on; list() and
    exists() name regular files only. A name must fit one file name of the
    file system (NAME_MAX bytes with the suffix, as encoded by os.fsencode).
    Temporary files left by a save that was killed are removed by later saves
    once they are STALE_TMP_SECONDS old and no save holds their lock.
    """

    #: Age (s) after which an unlocked temporary file is taken as a killed save's.
    STALE_TMP_SECONDS = 60.0

    def __init__(self, path: str | os.PathLike) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or path-like, got {type(path).__name__}")
        self.base_path = Path(path)
        try:
            is_file = self.base_path.exists() and not self.base_path.is_dir()
        except OSError as exc:   # (a name too long for the file system, say)
            raise CheckpointStorageError(f"checkpoint folder {short_repr(str(self.base_path), 200)} cannot be "
                                         f"used: {short_str(exc)}") from None
        if is_file:
            raise ValueError(f"checkpoint folder {short_repr(str(self.base_path), 200)} exists and is not a folder")

    def checkpoint_path(self, name: str) -> Path:
        """The file a name is stored in (the name checked, its file name within NAME_MAX bytes)."""
        name = check_checkpoint_name(name)
        file_name = name + SUFFIX
        try:
            size = len(os.fsencode(file_name))
        except UnicodeEncodeError:
            raise ValueError(f"checkpoint name {name[:40]!r}... cannot be encoded as a file name") from None
        if size > _NAME_MAX:
            raise ValueError(f"checkpoint name {name[:40]!r}... makes a {size}-byte file name; the file system "
                             f"takes at most {_NAME_MAX} bytes (with {SUFFIX!r}): use a shorter name")
        return self.base_path / file_name

    def save(self, checkpoint: Checkpoint, name: str) -> None:
        """Store `checkpoint` under `name` in the folder (replacing what was there)."""
        path = self.checkpoint_path(name)
        _check_checkpoint(checkpoint)
        try:
            self.base_path.mkdir(parents=True, exist_ok=True)
            self._clean_stale()
            fd, tmp = tempfile.mkstemp(dir=self.base_path, prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX)
        except OSError as exc:
            raise CheckpointStorageError(f"Failed to create checkpoint file for {short_repr(name)} in "
                                         f"{short_repr(str(self.base_path), 200)}: {short_str(exc)}") from exc
        try:
            with os.fdopen(fd, "wb") as f:
                _lock(f.fileno(), blocking=True)   # held until closed: cleaners leave a save's file alone
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
                raise CheckpointStorageError(f"Failed to write checkpoint {short_repr(name)}: {short_str(exc)}") from exc
            raise
        self._sync_folder()

    def _clean_stale(self) -> int:
        """Remove temporary files of killed saves: regular, older than STALE_TMP_SECONDS
        and not locked by a save in progress. Returns how many went."""
        if fcntl is None:
            return 0
        removed = 0
        now = time.time()
        with os.scandir(self.base_path) as entries:
            for e in entries:
                if not (e.name.startswith(_TMP_PREFIX) and e.name.endswith(_TMP_SUFFIX)):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < self.STALE_TMP_SECONDS:
                        continue
                    fd = os.open(e.path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
                except OSError:
                    continue
                try:
                    if not _lock(fd, blocking=False):
                        continue   # a save is writing it
                    try:
                        same = os.path.samestat(os.fstat(fd), os.stat(e.path, follow_symlinks=False))
                    except OSError:
                        continue
                    if same:
                        os.unlink(e.path)
                        removed += 1
                except OSError:
                    pass
                finally:
                    os.close(fd)
        return removed

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

    def _read(self, name: str, path: Path) -> bytes:
        """The bytes of a regular file at `path`, opened without following links, at most
        MAX_CHECKPOINT_SIZE of them (checked before reading)."""
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"Checkpoint not found: {short_repr(name)} (no {short_repr(str(path), 200)})") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CheckpointStorageError(f"checkpoint {short_repr(name)}: {short_repr(str(path), 200)} is a symbolic link; links are "
                                             f"never followed") from None
            raise CheckpointStorageError(f"Failed to read checkpoint {short_repr(name)}: {short_str(exc)}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointStorageError(f"checkpoint {short_repr(name)}: {short_repr(str(path), 200)} is not a regular file (a "
                                             f"{_kind(st.st_mode)}); only regular files are read")
            if st.st_size > MAX_CHECKPOINT_SIZE:
                raise InvalidCheckpointError(f"Checkpoint too large: {short_repr(str(path), 200)} is {st.st_size} bytes (max: "
                                             f"{MAX_CHECKPOINT_SIZE})")
            raw = bytearray(st.st_size)
            view, got = memoryview(raw), 0
            while got < st.st_size:
                n = os.readv(fd, [view[got:]])
                if n == 0:
                    raise CheckpointStorageError(f"checkpoint {short_repr(name)} shrank while being read ({got} of "
                                                 f"{st.st_size} bytes)")
                got += n
            if os.read(fd, 1):
                raise CheckpointStorageError(f"checkpoint {short_repr(name)} grew while being read (past {st.st_size} bytes)")
            return bytes(raw)
        except CheckpointStorageError:
            raise
        except OSError as exc:
            raise CheckpointStorageError(f"Failed to read checkpoint {short_repr(name)}: {short_str(exc)}") from exc
        finally:
            os.close(fd)

    def load(self, name: str) -> Checkpoint:
        """The checkpoint stored under `name`, checked (CheckpointNotFoundError if none)."""
        path = self.checkpoint_path(name)
        return Checkpoint.from_bytes(self._read(name, path))

    def list(self) -> list[str]:
        """The stored names (regular files only), sorted."""
        names = []
        try:
            with os.scandir(self.base_path) as entries:
                for e in entries:
                    if e.name.endswith(SUFFIX) and not e.name.startswith(".") and e.is_file(follow_symlinks=False):
                        names.append(e.name[:-len(SUFFIX)])
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CheckpointStorageError(f"Failed to read checkpoint directory {short_repr(str(self.base_path), 200)}: "
                                         f"{short_str(exc)}") from exc
        return sorted(names)

    def delete(self, name: str) -> None:
        """Remove `name` (CheckpointNotFoundError if none)."""
        path = self.checkpoint_path(name)
        try:
            path.unlink()
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"Checkpoint not found: {short_repr(name)}") from None
        except OSError as exc:
            raise CheckpointStorageError(f"Failed to delete checkpoint {short_repr(name)}: {short_str(exc)}") from exc

    def exists(self, name: str) -> bool:
        """Whether a regular file is stored under `name` (False for an invalid name)."""
        try:
            path = self.checkpoint_path(name)
        except (TypeError, ValueError):
            return False
        try:
            return stat.S_ISREG(os.lstat(path).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:   # (the folder's path and the name past PATH_MAX)
                return False
            raise CheckpointStorageError(f"Failed to look up checkpoint {short_repr(name)}: {short_str(exc)}") from exc

    def __repr__(self) -> str:
        path = str(self.base_path)
        return f"FileStorage({(path if len(path) <= 150 else '...' + path[-147:])!r})"
