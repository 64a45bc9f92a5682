"""Files the package does not trust and files it writes, in one place.

Reading (read_regular_file): a regular file only, never through a symbolic
link, never opening a FIFO or device, and never more than a bound,
checked before reading and again while reading (the file may grow).

Cache folders (open_private_dir): only a folder this user alone can change is
used (owned by the effective user, not group- or world-writable, not a link);
a cache in a shared folder could be planted by anyone. Files in it are opened
relative to the folder's descriptor, so swapping the folder afterwards changes
nothing.

Writing (replace_file): a new file beside the name, synced and renamed over it,
so a reader sees the old file or the new one, a failed write (a full disk)
leaves the old one, and a link or FIFO at the name is replaced, never
followed or opened.
"""
from __future__ import annotations

import errno
import os
import secrets
import stat

__all__ = ["read_regular_file", "read_named_file", "open_private_dir", "replace_file"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | _CLOEXEC
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
_CHUNK = 1 << 20


def read_regular_file(path: str | os.PathLike, limit: int, *, dir_fd: int | None = None,
                      follow_links: bool = False) -> bytes | None:
    """The bytes of the regular file at `path` (relative to `dir_fd` when given; None
    when there is none), opened without following links unless `follow_links` (a
    path the caller named) and sized before reading; ValueError naming what is
    wrong with anything else (a link, a FIFO, a device, a folder, too many bytes). Anything
    but a regular file is refused before it is opened (opening a device may act on it: a
    terminal would become the controlling one), and checked again once open."""
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_links)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(_reason(exc)) from None
    if stat.S_ISLNK(st.st_mode):
        raise ValueError("it is a symbolic link; links are never followed")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("it is not a regular file; only regular files are read")
    try:
        fd = os.open(path, _OPEN_FLAGS | (0 if follow_links else _NOFOLLOW), dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise ValueError("it is a symbolic link; links are never followed") from None
        raise ValueError(_reason(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("it is not a regular file; only regular files are read")
        if st.st_size > limit:
            raise ValueError(f"it is {st.st_size} bytes; at most {limit} are read")
        parts: list[bytes] = []
        got = 0
        while True:
            part = os.read(fd, min(_CHUNK, limit + 1 - got))
            if not part:
                return b"".join(parts)
            got += len(part)
            if got > limit:
                raise ValueError(f"it grew past {limit} bytes while being read")
            parts.append(part)
    except OSError as exc:
        raise ValueError(_reason(exc)) from None
    finally:
        os.close(fd)


def _reason(exc: OSError) -> str:
    """What went wrong, without the path (str(exc) repeats it, however long it is; callers name it)."""
    return exc.strerror or type(exc).__name__


def read_named_file(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """The bytes of a regular file the caller named (links followed: the caller chose
    the path), at most `limit`: FileNotFoundError when there is none, ValueError
    (naming `what` and the path) for a FIFO, device, folder or too many bytes."""
    shown = os.fsdecode(path)[:200]
    try:
        data = read_regular_file(path, limit, follow_links=True)
    except ValueError as exc:
        raise ValueError(f"{what} {shown!r}: {exc}") from None
    if data is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), shown)
    return data


def _untrusted(st: os.stat_result) -> str | None:
    """Why a folder of stat `st` may be changed by someone else (None: only by this user)."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is not None and st.st_uid != geteuid():
        return f"it belongs to user {st.st_uid}, not to this user ({geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others may write to it (mode 0o{stat.S_IMODE(st.st_mode):o})"
    return None


def open_private_dir(path: str, *, create: bool) -> int | None:
    """A descriptor of folder `path` that only this user can change: made (0o700,
    parents as the umask gives) when missing and `create`, else None when missing;
    ValueError naming why it is not used (a link, not a folder, another owner,
    writable by others). The caller closes it."""
    path = path.rstrip(os.sep) or os.sep   # (a trailing separator would follow a link)
    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"it cannot be made: {_reason(exc)}") from None
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        if create:
            raise ValueError("it vanished as it was made") from None
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("it is a symbolic link; cache folders are never followed through links") from None
        if exc.errno == errno.ENOTDIR:
            raise ValueError("it is not a folder") from None
        raise ValueError(_reason(exc)) from None
    try:
        st = os.fstat(fd)
        why = "it is not a folder" if not stat.S_ISDIR(st.st_mode) else _untrusted(st)
    except OSError as exc:
        why = _reason(exc)
    if why is not None:
        os.close(fd)
        raise ValueError(why)
    return fd


def replace_file(path: str | os.PathLike, data: bytes, *, dir_fd: int | None = None, mode: int = 0o600) -> None:
    """Write `data` to `path` (relative to `dir_fd` when given) atomically: a new
    file (permissions `mode` less the umask) beside it, synced and renamed over
    it. OSError when that fails, the new file removed and the old one kept."""
    folder, name = os.path.split(os.fsdecode(path))
    stem = os.fsdecode(os.fsencode(name)[:200])   # (bytes: the new name must stay within NAME_MAX, 255)
    tmp = os.path.join(folder, f".{stem}.{secrets.token_hex(6)}.tmp")
    ours = True   # (the open inside the try: a Ctrl-C raised as it returns still removes the file)
    try:
        try:
            fd = os.open(tmp, _WRITE_FLAGS, mode, dir_fd=dir_fd)
        except FileExistsError:
            ours = False   # (someone else's file of that name: left alone)
            raise
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        if ours:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
        raise
