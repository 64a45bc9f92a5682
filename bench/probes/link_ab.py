"""A/B of link shapes in one process, interleaved so that machine drift hits
every variant alike: each round times one job of every (variant, case) in turn.
Variants are CUDA_PEER links GPU0 -> GPU1, one per ring shape in --cuda-shapes
(with --cuda-bounce also on the bounce ring), and HOST_SHARED links GPU1 -> GPU0,
one per ring shape in --host-shapes and queue in --host-queues; the first variant
of each kind is its ratio's baseline.

    python bench/probes/link_ab.py [--rounds 40] [--cuda-shapes 16x8 8x16] [--cuda-bounce]
                            [--host-shapes 8x8 4x16] [--host-queues copy universal] [--virtual 2]

A shape is SLOT_MIBxSLOTS (a ring of SLOTS slots of SLOT_MIB MiB).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import vulkan as vk

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
from cuda_peer import DirectLink  # noqa: E402


def shape(text: str) -> tuple[int, int]:
    try:
        mib, slots = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a ring shape is SLOT_MIBxSLOTS, e.g. 16x8; got {text!r}") from None
    if mib < 1 or slots < 1:
        raise argparse.ArgumentTypeError(f"a ring shape needs positive numbers, got {text!r}")
    return mib, slots


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--cuda-shapes", nargs="*", type=shape, default=[(16, 8)], help="CUDA_PEER ring shapes")
    ap.add_argument("--cuda-bounce", action="store_true", help="also each CUDA_PEER shape on the bounce ring")
    ap.add_argument("--host-shapes", nargs="*", type=shape, default=[(8, 8)], help="HOST_SHARED ring shapes")
    ap.add_argument("--host-queues", nargs="*", default=["copy"], choices=["copy", "universal"],
                    help="the queue each host link copies on: the copy queue or the universal copy queue")
    ap.add_argument("--virtual", type=int, default=0, help="use N virtual lavapipe GPUs (no CUDA there)")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    from vkmulti import MultiDeviceManager
    from vkmulti._core import _native
    from vkmulti import Buffer, Image
    from vkmulti.testing import use_virtual_if_no_gpu

    note = use_virtual_if_no_gpu(a.virtual)
    f = vk.VK_FORMAT_R16G16B16A16_SFLOAT
    results: dict[str, list[float]] = {}
    with MultiDeviceManager.create(enabled=True, validation=False) as mgr:
        s, d = mgr.slot(0), mgr.slot(1)
        owned: list[Any] = []

        def image(slot: Any, w: int, h: int) -> Any:
            owned.append(Image(slot, w, h, f))
            return owned[-1]

        def buffer(slot: Any, n: int) -> Any:
            owned.append(Buffer(slot, n))
            return owned[-1]

        cases = {  # name: (forward kwargs GPU0 -> GPU1, backward kwargs GPU1 -> GPU0)
            "4K": ({"src_image": image(s, 3840, 2160), "dst_image": image(d, 3840, 2160)},
                   {"src_image": image(d, 3840, 2160), "dst_image": image(s, 3840, 2160)}),
            "1080p": ({"src_image": image(s, 1920, 1080), "dst_image": image(d, 1920, 1080)},
                      {"src_image": image(d, 1920, 1080), "dst_image": image(s, 1920, 1080)}),
            "256MiB": ({"src_buffer": buffer(s, 256 << 20), "dst_buffer": buffer(d, 256 << 20)},
                       {"src_buffer": buffer(d, 256 << 20), "dst_buffer": buffer(s, 256 << 20)}),
        }
        links: dict[str, tuple[DirectLink, int]] = {}
        try:
            if not a.virtual and note is None:
                for mib, k in a.cuda_shapes:
                    for bounce in (False, True) if a.cuda_bounce else (False,):
                        ring = "bounce" if bounce else "landing"
                        links[f"cuda_peer {mib}x{k} {ring}"] = (DirectLink(s, d, mib << 20, k, bounce=bounce), 0)
            for mib, k in a.host_shapes:
                for qn in a.host_queues:
                    links[f"host_shared {mib}x{k} queue={qn}"] = (
                        DirectLink(d, s, mib << 20, k, ring=_native.RING_SHARED_HOST, queue=qn), 1)
            for name, (link, way) in links.items():  # warm-up
                for kw in cases.values():
                    link.run(**kw[way], timeout=60)
            for _ in range(a.rounds):
                for name, (link, way) in links.items():
                    for case, kw in cases.items():
                        t0 = time.perf_counter()
                        link.run(**kw[way], timeout=60)
                        results.setdefault(f"{name} {case}", []).append(time.perf_counter() - t0)
        finally:
            for link, _ in links.values():
                link.destroy()
            for x in owned:
                x.destroy()
    out = {"machine": note or "real GPUs", "rounds": a.rounds,
           "median_ms": {k: round(statistics.median(v) * 1e3, 4) for k, v in results.items()},
           "min_ms": {k: round(min(v) * 1e3, 4) for k, v in results.items()}}
    print(json.dumps(out, indent=2))
    ratios = []
    for kind in ("cuda_peer", "host_shared"):
        names = [n for n in links if n.startswith(kind)]
        for other in names[1:]:
            for case in cases:
                base_t, t = out["median_ms"][f"{names[0]} {case}"], out["median_ms"][f"{other} {case}"]
                ratios.append(f"{case} {other} vs {names[0][len(kind) + 1:]}: {base_t / t:.3f}x")
    print("ratio (speed-up over each kind's first variant): " + (", ".join(ratios) or "one variant per kind"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
