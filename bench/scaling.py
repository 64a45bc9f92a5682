"""Stencil scaling bench: the Jacobi stencil demo (one slab per GPU, halos as K2K
messages) on 2, 3 ... N GPUs, each run against the one-GPU run of the same grid
measured in that run (`vkmulti demo stencil --json`: step_ms_single and
step_ms_multi), so every speed-up is a ratio of one sitting.

Each GPU count runs in its own process (a fresh manager on exactly those
devices). Every run must end with the field the one-GPU run computes
("identical") and every run's checksum must be the same: a speed-up of a wrong
answer is not one. Goals (issue 27): >= 1.9x on 2 GPUs, >= 3.6x on 4.

Prints figures as JSON, then a line starting with "ratio:"; --plot draws the
speed-up against the GPU count beside the ideal (a PNG; matplotlib when
installed, else Pillow). Exit status 1 when a run failed or a field differed.

    python bench/scaling.py [--max-gpus N] [--heavy | --size WxH --steps S] [--virtual N]
                            [--json FILE] [--plot FILE.png]
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

GOALS = {2: 1.9, 4: 3.6}
RUN_TIMEOUT = 600.0   # seconds a GPU count's run may take (a --heavy grid on real GPUs: about a minute)


def run_count(n: int, args: Any) -> dict[str, Any]:
    """The stencil demo on GPUs 0 .. n-1 in a process of its own; its JSON figures."""
    cmd = [sys.executable, "-m", "vkmulti", "demo", "stencil", "--json", "--output", "",
           "--devices", ",".join(str(i) for i in range(n))]
    if args.heavy:
        cmd.append("--heavy")
    if args.size:
        cmd += ["--size", f"{args.size[0]}x{args.size[1]}"]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    if args.virtual:
        cmd += ["--virtual", str(args.virtual)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"gpus": n, "error": f"did not finish within {RUN_TIMEOUT:.0f} s"}
    text = done.stdout
    start, end = text.find("{"), text.rfind("}")
    if done.returncode != 0 or start < 0:
        tail = (done.stderr or text).strip().splitlines()[-3:]
        return {"gpus": n, "error": f"exit status {done.returncode}: {' / '.join(tail)}"[:400]}
    try:
        fig = json.loads(text[start:end + 1])
    except ValueError as exc:
        return {"gpus": n, "error": f"no JSON figures in its output ({exc})"}
    return {"gpus": n, "devices": [d["name"] for d in fig.get("devices", [])],
            "step_ms_single": fig["step_ms_single"], "step_ms_multi": fig["step_ms_multi"],
            "speedup": fig["speedup"], "host_share_multi": fig.get("host_share_multi"),
            "identical": bool(fig.get("identical")), "checksum": fig.get("checksum"),
            "size": fig.get("size"), "steps": fig.get("steps")}


def plot(runs: list[dict[str, Any]], path: str, machine: str) -> str:
    """Speed-up per GPU count beside the ideal, as a PNG at `path`."""
    from vkmulti.apps.charts import bar_chart

    groups = ["1 GPU"] + [f"{r['gpus']} GPUs" for r in runs]
    values = {("1 GPU", "measured"): 1.0, ("1 GPU", "ideal"): 1.0}
    for r, g in zip(runs, groups[1:]):
        values[(g, "ideal")] = float(r["gpus"])
        if "speedup" in r:
            values[(g, "measured")] = float(r["speedup"])
    return bar_chart(groups, ["measured", "ideal"], values, title="Jacobi stencil: speed-up over one GPU",
                     ylabel="speed-up (x)", xlabel="GPUs (one slab each)", path=path, machine=machine)


def main(argv: list[str] | None = None) -> int:
    from vkmulti.apps.cli_args import (Parser, add_output_argument, add_virtual_argument, parse_size, positive_int,
                                       print_figures)

    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-gpus", type=positive_int, default=None,
                   help="the largest GPU count (default: every GPU vkmulti lists)")
    p.add_argument("--heavy", action="store_true", help="the demo's grid and step count for real GPUs")
    p.add_argument("--size", type=parse_size, default=None, metavar="WxH",
                   help="grid size (the demo's default without it)")
    p.add_argument("--steps", type=positive_int, default=None, help="Jacobi steps (the demo's default without it)")
    add_virtual_argument(p)
    add_output_argument(p, "--json", image=False, default=None, metavar="FILE", help="also write the figures here")
    add_output_argument(p, "--plot", image=True, default=None, metavar="FILE.png",
                        help="draw the speed-up against the GPU count here")
    args = p.parse_args(argv)
    if args.heavy and (args.size or args.steps):
        p.error("--heavy sets the grid and the steps: give either it or --size/--steps")
    available = args.virtual if args.virtual else _device_count()
    top = min(args.max_gpus or available, available)
    if top < 2:
        print(f"bench/scaling.py needs two devices or more (vkmulti lists {available})", file=sys.stderr)
        return 2
    runs = [run_count(n, args) for n in range(2, top + 1)]
    ok = [r for r in runs if "error" not in r]
    checksums = {r["checksum"] for r in ok}
    identical = bool(ok) and len(ok) == len(runs) and all(r["identical"] for r in ok) and len(checksums) == 1 \
        and None not in checksums
    res: dict[str, Any] = {"runs": runs, "goals": {str(k): v for k, v in GOALS.items()},
                           "fields_identical": identical}
    machine = ", ".join(sorted(set(ok[0]["devices"]))) if ok else "no run finished"
    if args.plot and ok:
        res["plot"] = {"path": args.plot, "drawn_with": plot(runs, args.plot, machine)}
    print_figures(res, args.json)
    parts = []
    for r in runs:
        if "error" in r:
            parts.append(f"{r['gpus']} GPUs failed ({r['error']})")
            continue
        goal = GOALS.get(r["gpus"])
        parts.append(f"{r['gpus']} GPUs {r['speedup']:.2f}x the one-GPU step ({r['step_ms_single']:.2f} -> "
                     f"{r['step_ms_multi']:.2f} ms" + (f"; goal >= {goal}" if goal else "") + ")")
    parts.append("fields identical in every run" if identical else "FIELDS DIFFER OR A RUN FAILED")
    print("ratio: stencil speed-up: " + "; ".join(parts))
    return 0 if identical else 1


def _device_count() -> int:
    """How many devices vkmulti would use (real GPUs, else the virtual pair)."""
    code = ("import vkmulti; m = vkmulti.MultiDeviceManager.create(enabled=True); print(m.device_count); "
            "m.destroy()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    try:
        return int(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


if __name__ == "__main__":
    sys.exit(main())
