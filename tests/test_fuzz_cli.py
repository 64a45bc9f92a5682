"""Hostile command lines for every `vkmulti` subcommand: exit 0 or 2 with one short line, no traceback.

The work behind each command (rendering, the stencil, the bench, info,
topology) is replaced by a marker, so only the parsing and the checks made
before any GPU work run; a line that passes them reaches the marker.
"""
from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vkmulti.apps import benchmarks, cli, cluster_demo, demo, failover_drill, stencil_demo, stencil_drill


class Reached(Exception):
    """The command line passed every check and would now start its work."""


def _reach(*args, **kwargs):
    raise Reached()


@pytest.fixture(scope="module", autouse=True)
def no_work():
    with pytest.MonkeyPatch.context() as mp:
        for mod in (demo, cluster_demo, failover_drill, stencil_demo, stencil_drill):
            mp.setattr(mod, "main", _reach)
        mp.setattr(cli, "run_topology_command", _reach)
        mp.setattr(cli, "_info", _reach)
        mp.setattr(benchmarks, "use_virtual_if_no_gpu", _reach)
        yield


VALUES = ["", "-1", "0", "1", "3", "17", "99999999999999999999", "1e3", "nan", "inf", "-5x10", "0x0", "3x3",
          "1x2x3", "x", "1@2", "0@0", "1@-1", "0,1", "0,0", "1,,2", "-1,0", "/", "/dev/null", "/dev/stdout",
          "/nonexistent/x.png", "a\x00b.png", "\x00", "é", "9" * 5000, "١x١", "1_0", " 4 ", "a,b", "memcpy",
          "staging,zzz", "x.png", "x.json", "ray://", "ray://h:99999"]
FLAGS = ["--srus", "--size", "--frames", "--devices", "--heavy", "--json", "--lose-gpu", "--ray", "--plot", "--output",
         "--steps", "--warmup", "--checkpoint-every", "--virtual", "--measure", "--bytes", "--reps", "--src", "--dst",
         "--quick", "--small", "--slot-size", "--slot-count", "--methods", "--quiet", "--no-torch"]
HEADS = [["info"], ["demo"], ["demo", "stencil"], ["topology"], ["bench", "transfer"], ["bench"], [], ["zzz"]]


@settings(max_examples=400, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(head=st.sampled_from(HEADS), pairs=st.lists(st.tuples(st.sampled_from(FLAGS), st.sampled_from(VALUES)),
                                                   max_size=4))
@example(head=["demo"], pairs=[("--output", "a\x00b.png")])
@example(head=["demo", "stencil"], pairs=[("--output", "a\x00b.png")])
@example(head=["bench", "transfer"], pairs=[("--json", "a\x00b")])
@example(head=["info"], pairs=[("--heavy", "9" * 5000)])
def test_hostile_command_lines_exit_2_with_one_short_line(tmp_path, monkeypatch, head, pairs):
    monkeypatch.chdir(tmp_path)   # (relative outputs such as x.png would be checked against the checkout)
    argv = head + [x for p in pairs for x in p]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            cli.main(argv)
    except SystemExit as exc:
        assert exc.code in (0, 2), (argv, exc.code)
        if exc.code == 2:
            lines = err.getvalue().strip().splitlines()
            assert len(lines) == 1 and len(lines[0]) < 400, lines[:3]
    except Reached:
        pass
