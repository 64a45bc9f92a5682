"""A test's script run in a child process, so that a hang fails the test after a bound
and a crash is one failure, not the end of the run; then what it printed, in order."""
from __future__ import annotations

import subprocess
import sys

import pytest


def run_script(script: str, case: str, timeout: float, cwd: str) -> subprocess.CompletedProcess:
    """`script` run by this interpreter in `cwd`; the test fails if it still runs after `timeout` s."""
    try:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                              cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"{case}: still blocked after {timeout:.0f} s; output so far:\n{out[-3000:]}")


def printed_in_order(p: subprocess.CompletedProcess, wanted: list[str], case: str) -> None:
    """Each of `wanted` in the child's output, in this order, and the child exited 0."""
    out, at = p.stdout, 0
    for want in wanted:
        found = out.find(want, at)
        assert found >= 0, f"{case}: {want!r} missing (in order) from:\n{out[-4000:]}\n{p.stderr[-3000:]}"
        at = found + len(want)
    assert p.returncode == 0, (p.returncode, out[-2000:], p.stderr[-3000:])
