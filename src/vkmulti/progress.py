"""Progress on a terminal for long benches and the demo's many-frame runs.

Uses `rich` when installed, else `tqdm`, else shows nothing (both optional:
pip install 'vkmulti[progress]'). Shown only when stderr is a terminal and
the caller did not ask for machine output (`quiet`, e.g. --json), so piped
and JSON output stay clean.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

__all__ = ["progress"]


def _enabled(quiet: bool) -> bool:
    return not quiet and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


@contextmanager
def progress(total: int, description: str, *, quiet: bool = False) -> Iterator[Callable[[int], None]]:
    """A context giving `advance(n=1)`; draws a bar of `total` steps on stderr when
    that is a terminal and `quiet` is false, else does nothing."""
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise ValueError(f"total must be an int >= 0, got {total!r}"[:120])
    if not _enabled(quiet):
        yield lambda n=1: None
        return
    try:
        from rich.progress import Progress
    except ImportError:
        Progress = None
    if Progress is not None:
        from rich.console import Console

        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield lambda n=1: None
        return
    bar: Any = tqdm(total=total, desc=description, file=sys.stderr, leave=False)
    try:
        yield lambda n=1: bar.update(n)
    finally:
        bar.close()
