"""Command line: `python -m vkmulti info [--json] [--virtual N]`, `python -m vkmulti demo ...`,
`python -m vkmulti demo stencil ...` (the K2K stencil across GPUs),
`python -m vkmulti topology [--json] [--measure] [--virtual N]`, `python -m vkmulti bench transfer ...`."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import __version__


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def gather_info() -> dict[str, Any]:
    from .capabilities import probe_device
    from .instance import Instance
    from .methods import method_support, supported_methods, TransferMethod

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["demo", "stencil"]:   # its own options; plain `demo` stays the SRU demo
        from .stencil_demo import main as stencil_main
        return stencil_main(argv[2:])
    parser = argparse.ArgumentParser(prog="vkmulti", description="vkmulti: several GPUs through Vulkan")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="list devices, capabilities and transfer methods per pair")
    p_info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p_info.add_argument("--virtual", type=int, default=0, metavar="N",
                        help="use N virtual lavapipe GPUs instead of the real ones")
    p_demo = sub.add_parser("demo", help="render a frame of many SRUs across every GPU and on one GPU "
                                         "('demo stencil --help': heat diffusion with K2K halos across GPUs)",
                            epilog="`vkmulti demo stencil [options]` runs the compute demo instead: a 2D heat "
                                   "grid split over every GPU, halo rows as kernel-to-kernel messages.")
    from .demo import add_arguments as demo_arguments
    demo_arguments(p_demo)
    p_topo = sub.add_parser("topology", help="measure (or read the cached) bandwidth and latency between every "
                                             "pair of GPUs and print the matrix")
    p_topo.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p_topo.add_argument("--measure", action="store_true", help="measure again even if this machine's "
                                                               "measurement is cached")
    p_topo.add_argument("--virtual", type=int, default=0, metavar="N",
                        help="use N virtual lavapipe GPUs instead of the real ones")
    p_topo.add_argument("--bytes", type=int, default=None, metavar="N",
                        help="bytes per bandwidth transfer (default 64 MiB between GPUs, 8 MiB with a CPU device)")
    p_topo.add_argument("--reps", type=int, default=5, metavar="N", help="transfers per figure (median)")
    p_bench = sub.add_parser("bench", help="run a bench (transfer)", add_help=False)
    p_bench.add_argument("which", choices=["transfer"])
    p_bench.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "bench":
        from .benchmarks import main as bench_main
        return bench_main(args.rest)
    if args.command == "demo":
        from .demo import main as demo_main
        return demo_main(args, p_demo)
    if args.command == "topology":
        if args.virtual < 0:
            parser.error("--virtual must be >= 0")
        if args.reps < 1:
            parser.error("--reps must be >= 1")
        if args.bytes is not None and (args.bytes < 4 or args.bytes % 4):
            parser.error("--bytes must be a multiple of 4, at least 4")
        from .kernels.probe import run_topology_command
        return run_topology_command(args)
    if args.command == "info":
        if args.virtual < 0:
            parser.error("--virtual must be >= 0")
        from .testing import use_virtual_if_no_gpu
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
    return 2  # pragma: no cover - argparse enforces the choices
