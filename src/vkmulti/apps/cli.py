"""Command line: `python -m vkmulti info [--json] [--virtual N]`, `python -m vkmulti demo ...`,
`python -m vkmulti demo stencil ...` (the K2K stencil across GPUs),
`python -m vkmulti topology [--json] [--measure] [--virtual N]`, `python -m vkmulti bench transfer ...`.

Every command and subcommand answers --help (exit 0); bad input ends with one line on
stderr and exit status 2; without a GPU the virtual lavapipe pair is used (one line says so)."""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from .._version import __version__
from ..device.capabilities import probe_device
from ..device.instance import Instance
from ..device.manager import MultiDeviceManager
from ..device.virtual import use_virtual_if_no_gpu
from ..errors import VkmError
from ..kernels.coordinator.probe import format_topology, probe_topology
from ..memory.resource import MAX_BYTES
from ..transfer.methods import TransferMethod, method_support, supported_methods
from . import cluster_demo, demo, failover_drill, stencil, stencil_demo, stencil_drill
from .benchmarks import main as bench_main
from .cli_args import Parser, add_virtual_argument, positive_int


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def gather_info() -> dict[str, Any]:
    """What `vkmulti info` prints: every device's capabilities and the transfer methods per pair."""
    inst = Instance(validation=False)
    try:
        caps = [probe_device(p) for p in inst.physical_devices()]
    finally:
        inst.destroy()
    pairs = []
    for i, a in enumerate(caps):
        for j, b in enumerate(caps):
            if i == j:
                continue
            pairs.append({
                "src": i, "dst": j, "methods": supported_methods(a, b),
                "unavailable": {m: method_support(m, a, b) for m in TransferMethod.CROSS_DEVICE
                                if method_support(m, a, b) is not None},
            })
    return {"vkmulti": __version__, "devices": [dict(index=i, **c.to_dict()) for i, c in enumerate(caps)],
            "pairs": pairs}


def _print_info(info: dict[str, Any]) -> None:
    devs = info["devices"]
    print(f"vkmulti {info['vkmulti']}: {len(devs)} Vulkan device(s)\n")
    for d in devs:
        print(f"GPU {d['index']}: {d['name']}  [{d['device_type']}, {d['vendor']}]")
        rows = [
            ("driver", f"{d['driver_name']} ({d['driver_info']})"),
            ("Vulkan API", d["api_version"]),
            ("deviceUUID", d["device_uuid"]),
            ("driverUUID", d["driver_uuid"]),
            ("PCI bus", d["pci_bus"] or "n/a (no VK_EXT_pci_bus_info)"),
            ("host import align", d["min_imported_host_pointer_alignment"] or "n/a"),
            ("timeline / sync2", f"{d['timeline_semaphore']} / {d['synchronization2']}"),
            ("shader features", " ".join(d["shader_features"]) or "none of int64/float64/int16"),
        ]
        for h in d["memory_heaps"]:
            rows.append((f"heap {h['index']}", f"{_gib(h['size'])}{' device-local' if h['device_local'] else ''}"))
        for k, v in rows:
            print(f"  {k:<18} {v}")
        print(f"  {'queue families':<18} {'idx':>3}  {'count':>5}  flags")
        for q in d["queue_families"]:
            role = []
            if q["index"] == d["graphics_family"]:
                role.append("universal")
            if q["index"] == d["dedicated_compute_family"]:
                role.append("dedicated compute")
            if q["index"] == d["dedicated_transfer_family"]:
                role.append("dedicated transfer")
            print(f"  {'':<18} {q['index']:>3}  {q['queue_count']:>5}  {'+'.join(q['flags'])}"
                  f"{'  <- ' + ', '.join(role) if role else ''}")
        print(f"  {'extensions':<18} " + "  ".join(f"{'+' if v else '-'}{k}" for k, v in d["extensions"].items()))
        print()
    if info["pairs"]:
        print("Transfer methods per pair (best first):")
        print(f"  {'src -> dst':<10} {'methods':<40} why others are unavailable")
        for p in info["pairs"]:
            why = "; ".join(f"{m}: {r}" for m, r in p["unavailable"].items()) or "-"
            print(f"  {p['src']} -> {p['dst']:<5} {', '.join(p['methods']):<40} {why}")
    else:
        print("One device: no cross-device transfers.")


#: Benches `vkmulti bench NAME` runs (each parses its own options).
BENCHES = {"transfer": "every transfer method against the seed's serial staging copy, same run"}


def build_parser() -> argparse.ArgumentParser:
    """The `vkmulti` command's parser (every subcommand's --help comes from here)."""
    parser = Parser(prog="vkmulti", description="vkmulti: several GPUs through Vulkan. Without a GPU every "
                                                "command uses the virtual lavapipe GPU pair and says so.")
    parser.add_argument("--version", action="version", version=f"vkmulti {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_info = sub.add_parser("info", help="list devices, capabilities and transfer methods per pair")
    p_info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_virtual_argument(p_info)
    p_demo = sub.add_parser("demo", help="render a frame of many SRUs across every GPU and on one GPU "
                                         "('demo stencil --help': heat diffusion with K2K halos across GPUs)",
                            epilog="`vkmulti demo stencil [options]` runs the compute demo instead: a 2D heat "
                                   "grid split over every GPU, halo rows as kernel-to-kernel messages.")
    demo.add_arguments(p_demo)
    p_topo = sub.add_parser("topology", help="measure (or read the cached) bandwidth and latency between every "
                                             "pair of GPUs and print the matrix")
    p_topo.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p_topo.add_argument("--measure", action="store_true", help="measure again even if this machine's "
                                                               "measurement is cached")
    add_virtual_argument(p_topo)
    p_topo.add_argument("--bytes", type=positive_int, default=None, metavar="N",
                        help="bytes per bandwidth transfer (default 64 MiB between GPUs, 8 MiB with a CPU device)")
    p_topo.add_argument("--reps", type=positive_int, default=5, metavar="N", help="transfers per figure (median)")
    p_bench = sub.add_parser("bench", help="run a bench: " + ", ".join(BENCHES),
                             description="Run a bench; `vkmulti bench NAME --help` lists its options.")
    p_bench.add_argument("which", choices=list(BENCHES), metavar="NAME",
                         help="; ".join(f"{k}: {v}" for k, v in BENCHES.items()))
    parser.set_defaults(demo_parser=p_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m vkmulti COMMAND ...`: returns the exit status (2 for bad input, one line on stderr)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["demo", "stencil"]:   # its own options; plain `demo` stays the SRU demo
        return _guarded("demo stencil", _stencil, argv[2:])
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] in BENCHES:   # the bench parses its own options
        return _guarded("bench " + argv[1], bench_main, argv[2:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench":   # pragma: no cover - `bench NAME` is dispatched above
        return 2
    if args.command == "demo":
        return _guarded("demo", _demo, args, args.demo_parser)
    if args.command == "topology":
        if args.bytes is not None and args.bytes % 4:
            parser.error(f"--bytes must be a multiple of 4, got {args.bytes}")
        if args.bytes is not None and args.bytes > MAX_BYTES:
            parser.error(f"--bytes must be at most 2**62 (a buffer's largest size), got {args.bytes}")
        return _guarded("topology", run_topology_command, args)
    return _guarded("info", _info, args)


def _demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`demo`: the SRU demo, its lost-GPU drill (--lose-gpu) or its cluster form (--ray)."""
    demo.check_arguments(args, parser)   # before any rendering
    if args.ray is not None:
        return cluster_demo.main(args, parser)
    if args.lose_gpu is not None:
        return failover_drill.main(args, parser)
    return demo.main(args, parser)


def _stencil(argv: list[str]) -> int:
    """`demo stencil`: the heat-grid demo, or its lost-GPU drill (--lose-gpu)."""
    parser, args = stencil.parse_arguments(argv)
    app = stencil_drill if args.lose_gpu is not None else stencil_demo
    return app.main(args, parser)


def _info(args: argparse.Namespace) -> int:
    note = use_virtual_if_no_gpu(args.virtual)
    info = gather_info()
    if note:
        info["note"] = note
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
    else:
        if note:
            print(f"note: {note}\n")
        _print_info(info)
    return 0


def run_topology_command(args: argparse.Namespace) -> int:
    """`python -m vkmulti topology [--json] [--measure] [--virtual N] [--bytes N] [--reps N]`."""
    note = use_virtual_if_no_gpu(args.virtual)
    with MultiDeviceManager.create(enabled=True) as mgr:
        topo = probe_topology(mgr, force=args.measure, nbytes=args.bytes, reps=args.reps)
    if args.json:
        doc = topo.to_dict()
        if note:
            doc["note"] = note
        print(json.dumps(doc, indent=2))
    else:
        if note:
            print(f"note: {note}\n")
        print(format_topology(topo))
    return 0


_DESTROY_HINT = re.compile(r"[;,]?\s*\(?call destroy\(\) again[^)]*\)?")


def _for_a_user(message: str) -> str:
    """A library message as a command prints it: the advice to call destroy() again is
    for programs; a command that ends leaves the GPU work it waited for to the driver."""
    if not _DESTROY_HINT.search(message):
        return message
    return _DESTROY_HINT.sub("", message).rstrip(" ;,") + "; the GPU work was still running when the command ended"


def _guarded(what: str, fn: Any, *args: Any) -> int:
    """Run a command; a vkmulti error (no device, a device lost, ...) ends it with one
    line on stderr and exit status 1, Ctrl-C with status 130, never a traceback."""
    try:
        return int(fn(*args) or 0)
    except VkmError as exc:
        print(f"vkmulti {what}: error: {type(exc).__name__}: {_for_a_user(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"vkmulti {what}: interrupted", file=sys.stderr)
        return 130
