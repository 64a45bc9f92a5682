"""Progress on a terminal for long benches and the demo's many-frame runs.

Uses `rich` when installed, else `tqdm`, else shows nothing (both optional:
pip install 'vkmulti[progress]'). Shown only when stderr is a terminal and
the caller did not ask for machine output (`quiet`, e.g. --json), so piped
and JSON output stay clean. Lines a bench prints on the way go through
`Progress.say`, above the bar.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator

from .._core.checks import is_int, short_repr

__all__ = ["progress", "Progress"]


class Progress:
    """What `progress()` yields: call it (`advance(n=1)`) after each step; `say(text)`
    prints a line on stderr above the bar."""

    def __init__(self, bar: Any = None, kind: str = "none", task: Any = None):
        self._bar, self._kind, self._task = bar, kind, task

    def __call__(self, n: int = 1) -> None:
        """Count `n` more steps done."""
        if self._kind == "rich":
            self._bar.advance(self._task, n)
        elif self._kind == "tqdm":
            self._bar.update(n)

    def say(self, text: str) -> None:
        """Print one line on stderr without breaking the bar."""
        if self._kind == "rich":
            self._bar.console.print(text, markup=False, highlight=False)
        elif self._kind == "tqdm":
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def __repr__(self) -> str:
        return f"Progress({self._kind})"


def _enabled(quiet: bool) -> bool:
    return not quiet and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


@contextmanager
def progress(total: int | None, description: str, *, quiet: bool = False) -> Iterator[Progress]:
    """A Progress for `total` steps (None: unknown), drawn on stderr when that is a
    terminal and `quiet` is false; otherwise it only prints what `say` gets."""
    if total is not None and (not is_int(total) or total < 0):
        raise ValueError(f"total must be an int >= 0 or None, got {short_repr(total)}")
    if not _enabled(quiet):
        yield Progress()
        return
    try:
        from rich.console import Console
        from rich.progress import Progress as RichProgress
    except ImportError:
        RichProgress = None  # type: ignore[assignment, misc]
    if RichProgress is not None:
        with RichProgress(console=Console(stderr=True), transient=True) as bar:
            yield Progress(bar, "rich", bar.add_task(description, total=total))
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield Progress()
        return
    bar = tqdm(total=total, desc=description, file=sys.stderr, leave=False)
    try:
        yield Progress(bar, "tqdm")
    finally:
        bar.close()
