"""Reading a file the package does not trust (a cache on disk): a regular file only, never through a
symbolic link, never blocking on a FIFO or device, and never more than a bound, checked before reading
and again while reading (the file may grow)."""
from __future__ import annotations

import errno
import os
import stat

__all__ = ["read_regular_file"]

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_CHUNK = 1 << 20


def read_regular_file(path: str, limit: int) -> bytes | None:
    """The bytes of the regular file at `path` (None when there is none), opened
    without following links and sized before reading; ValueError naming what
    is wrong with anything else (a link, a FIFO, a device, too many bytes)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("it is a symbolic link; links are never followed") from None
        raise ValueError(str(exc)) from None
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
        raise ValueError(str(exc)) from None
    finally:
        os.close(fd)
