"""A/B of two vkmulti builds on small transfers: are build A's as fast as build B's?

Runs the small cases of the transfer bench (a 256x256 RGBA16F image and a 64 KiB
buffer, every method, each transfer timed alone; `vkmulti.apps.benchmarks.run_transfer_bench`,
which older builds have too) in child processes, A and B in turn, `--pairs` times,
so that machine drift hits both alike. Prints each case's median (us) per build and
the median of the pairwise ratios A/B as JSON, then a ratio line.

    python bench/probes/small_ab.py --a PYTHON[:PYTHONPATH] --b PYTHON[:PYTHONPATH] [--pairs 6] [--reps 1000]
                                    [--virtual 2]

e.g. the lavapipe pair, this tree against 244d0bf installed in another venv:
    python bench/probes/small_ab.py --a .venv/bin/python --b /opt/venv-old/bin/python --virtual 2
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def child(reps: int, virtual: int) -> None:
    """One run of the small cases in this interpreter: {case method: median us} on stdout."""
    if virtual:
        from vkmulti.testing import install_virtual_gpus

        install_virtual_gpus(virtual)
    from vkmulti.apps.benchmarks import run_transfer_bench
    from vkmulti import MultiDeviceManager

    with MultiDeviceManager.create(enabled=True, validation=False) as mgr:
        res = run_transfer_bench(mgr, reps=reps, buffer_reps=reps, sizes=((256, 256),), buffer_bytes=64 << 10,
                                 torch=False)
    out = {}
    for c in res["cases"]:   # older builds name the buffer case "buffer 0 MiB"
        case = c["case"] if c["case"].startswith("image") else f"buffer {c['bytes'] >> 10} KiB"
        out[f"{case} {c['method']}"] = round(c["median_s"] * 1e6, 2)
    print(json.dumps(out))


def build(text: str) -> tuple[str, dict[str, str]]:
    """'PYTHON[:PYTHONPATH]' -> (interpreter, environment)."""
    python, _, path = text.partition(":")
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = path
    return python, env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", help="build A: PYTHON[:PYTHONPATH] (the candidate)")
    p.add_argument("--b", help="build B: PYTHON[:PYTHONPATH] (the baseline)")
    p.add_argument("--pairs", type=int, default=6, help="A/B runs in turn (default %(default)s)")
    p.add_argument("--reps", type=int, default=1000,
                   help="transfers per case and method in a run (default %(default)s)")
    p.add_argument("--virtual", type=int, default=0, metavar="N", help="use N virtual lavapipe GPUs")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.pairs < 1 or args.reps < 1:
        p.error("--pairs and --reps must be >= 1")
    if args.child:
        child(args.reps, args.virtual)
        return 0
    if not args.a or not args.b:
        p.error("--a and --b are needed")
    runs: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for _ in range(args.pairs):
        for side in ("a", "b"):
            python, env = build(getattr(args, side))
            cmd = [python, os.path.abspath(__file__), "--child", "--reps", str(args.reps), "--virtual",
                   str(args.virtual)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            runs[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
    cases = [k for k in runs["a"][0] if k in runs["b"][0]]
    res = {k: {"a_us": statistics.median(r[k] for r in runs["a"]), "b_us": statistics.median(r[k] for r in runs["b"]),
               "a_over_b": statistics.median(x[k] / y[k] for x, y in zip(runs["a"], runs["b"]))} for k in cases}
    print(json.dumps({"pairs": args.pairs, "reps": args.reps, "cases": res}, indent=2))
    print("ratio: " + ", ".join(f"{k} A/B = {v['a_over_b']:.3f}x" for k, v in res.items()
                                if not k.endswith("seed_baseline")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
