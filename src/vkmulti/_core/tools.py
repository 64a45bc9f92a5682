"""External tools (glslc, spirv-val) run to completion within a timeout.

The wait is cut into slices, so that a Ctrl-C ends it wherever the signal
lands: a SIGINT sent to this process alone (`kill -INT`) may be taken by
another of its threads, and a wait for the tool with no time limit would
then never see it. A tool given up on (a timeout, Ctrl-C) is killed and
reaped.
"""
from __future__ import annotations

import subprocess
from typing import Sequence

from ..errors import TimeoutError as VkmTimeout
from .checks import seconds_text
from .lifetime import Deadline

__all__ = ["run_tool"]


def run_tool(argv: Sequence[str], timeout: float | None, what: str) -> subprocess.CompletedProcess:
    """Run `argv` (its output captured as text) and wait up to `timeout` s (None: no
    limit); vkmulti.TimeoutError naming `what` after that."""
    deadline = Deadline(timeout)
    with subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            while True:
                try:
                    out, err = proc.communicate(timeout=deadline.slice())
                    break
                except subprocess.TimeoutExpired:
                    if deadline.expired():
                        raise VkmTimeout(f"{what} did not finish within {seconds_text(timeout)} s") from None
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
