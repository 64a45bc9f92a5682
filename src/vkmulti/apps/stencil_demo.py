"""`python -m vkmulti demo stencil`: 2D heat diffusion (Jacobi) across every GPU.

The grid is split into row slabs, one stencil kernel per GPU; halo rows cross
GPUs every step as K2K messages moved by the CrossGpuK2KRouter. Prints the
per-step time on all GPUs and on one, the speed-up, the halo traffic and GB/s
per GPU pair, checks that the result is bit-identical to the one-GPU run, and
writes the final field as a PNG with a colour map. With no GPU it runs on the
virtual lavapipe pair (whose two "GPUs" share the CPU: no speed-up there).
"""
from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from ..device.manager import MultiDeviceManager
from ..device.virtual import use_virtual_if_no_gpu
from ..kernels.stencil import run_stencil
from .stencil import HEAVY_SIZE, HEAVY_STEPS, LIGHT_SIZE, LIGHT_STEPS, initial_field, rate_text, report, write_field_png

__all__ = ["run", "print_report", "main"]


def run(args: argparse.Namespace, note: str | None) -> dict[str, Any]:
    """Run the grid on every GPU and on one; returns the figures (the JSON form)."""
    width, height = args.size or (HEAVY_SIZE if args.heavy else LIGHT_SIZE)
    steps = args.steps or (HEAVY_STEPS if args.heavy else LIGHT_STEPS)
    field, top, bottom = initial_field(width, height)
    mgr = MultiDeviceManager.create(enabled=True, device_indices=args.devices)
    try:
        n = mgr.device_count
        if height < n:
            raise ValueError(f"a {height}-row grid cannot be split into {n} slabs (one per GPU)")
        single = run_stencil(mgr, field, steps, [0], top=top, bottom=bottom, warmup=args.warmup)
        multi = run_stencil(mgr, field, steps, list(range(n)), top=top, bottom=bottom, warmup=args.warmup)
        names = [s.name for s in mgr.slots]
    finally:
        mgr.destroy()
    identical = bool(np.array_equal(single.field, multi.field))
    pairs = []
    for (a, b), e in sorted(multi.edges.items()):
        pairs.append({"from": a, "to": b, "method": e["method"], "moves": e["moves"], "bytes": e["bytes"],
                      "bytes_per_step": e["bytes"] / steps if steps else 0,
                      "seconds": multi.seconds,
                      "gbps": e["bytes"] / multi.seconds / 1e9 if multi.seconds > 0 and e["bytes"] else None})
    out: dict[str, Any] = {
        "note": note, "virtual": note is not None, "size": [width, height], "steps": steps,
        "devices": [{"index": i, "name": nm, "rows": list(multi.slabs[i])} for i, nm in enumerate(names)],
        "payload_size": multi.payload_size,
        "step_ms_single": single.step_ms, "step_ms_multi": multi.step_ms,
        "speedup": single.step_ms / multi.step_ms if multi.step_ms else 0.0,
        "host_share_multi": multi.host_share,
        "pairs": pairs, "identical": identical,
        "checksum": int(multi.field.astype(np.int64).sum()),
    }
    if args.output:
        write_field_png(multi.field, args.output)
        out["png"] = args.output
    return out


def print_report(r: dict[str, Any]) -> None:
    """Print the stencil demo's figures (the JSON form has the same keys)."""
    w, h = r["size"]
    print(f"vkmulti demo stencil: {w}x{h} int32 heat grid, {r['steps']} Jacobi steps, "
          f"{len(r['devices'])} GPU{'s' if len(r['devices']) != 1 else ''}")
    if r["note"]:
        print(f"note: {r['note']}")
    print("\nslabs:")
    for d in r["devices"]:
        r0, n = d["rows"]
        print(f"  GPU {d['index']} {d['name']:<32} rows {r0}-{r0 + n - 1} ({n})")
    print("\nper-step time:")
    print(f"  {len(r['devices'])} GPUs (halo rows as K2K messages)  {r['step_ms_multi']:9.3f} ms")
    print(f"  one GPU                            {r['step_ms_single']:9.3f} ms")
    print(f"  speed-up                           {r['speedup']:9.2f}x")
    if r["virtual"]:
        print("  (the virtual GPUs share this machine's CPU cores: no speed-up is expected from them)")
    if r["pairs"]:
        print(f"\nhalo traffic per GPU pair ({r['payload_size']}-byte payloads; whole outbox batches move):")
        for p in r["pairs"]:
            print(f"  GPU {p['from']} -> GPU {p['to']}  {p['method'] or '-':<13} {p['bytes_per_step'] / 1e3:9.1f} kB/step"
                  f"  {rate_text(p['bytes'], p['seconds']):>14} over the run  ({p['moves']} moves)")
    else:
        print("\none GPU: no halo traffic between GPUs")
    print(f"\nresult bit-identical to the one-GPU run: {'yes' if r['identical'] else 'NO'}"
          f"  (field checksum {r['checksum']})")
    if r.get("png"):
        print(f"wrote {r['png']}")


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`vkmulti demo stencil [options]` without --lose-gpu (options from stencil.parse_arguments);
    exit 1 if the field differs from one GPU's."""
    note = use_virtual_if_no_gpu(args.virtual)
    return report(parser, args, print_report, lambda: run(args, note))
