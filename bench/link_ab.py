"""A/B of link shapes in one process, interleaved so that machine drift hits
every variant alike: each round times one job of every (variant, case) in turn.
Variants are CUDA_PEER links GPU0 -> GPU1, one per chunk ramp in --cuda-ramps
and source batch in --cuda-batch, and HOST_SHARED links GPU1 -> GPU0, one per
ramp in --host-ramps, chunk count in --host-parts and queue in --host-queues; the first variant of
each kind is its ratio's baseline.

    python bench/link_ab.py [--rounds 40] [--cuda-ramps 0 2] [--cuda-batch 0]
                            [--host-ramps 0 2] [--host-parts 0]
                            [--host-queues copy universal] [--virtual 2]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_peer import DirectLink  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--cuda-ramps", nargs="*", type=int, default=[0, 2])
    ap.add_argument("--cuda-batch", nargs="*", type=int, default=[0], help="source chunks per submit; 0: default")
    ap.add_argument("--host-ramps", nargs="*", type=int, default=[0, 2])
    ap.add_argument("--host-parts", nargs="*", type=int, default=[0], help="chunks per mid-sized job; 0: default")
    ap.add_argument("--host-queues", nargs="*", default=["copy"], choices=["copy", "universal"],
                    help="the queue each host link copies on: the copy queue or the universal copy queue")
    ap.add_argument("--virtual", type=int, default=0, help="use N virtual lavapipe GPUs (no CUDA there)")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds must be >= 1")
    from vkmulti import MultiDeviceManager, _native
    from vkmulti.images import Buffer, Image
    from vkmulti.testing import use_virtual_if_no_gpu
    from vkmulti.transfer import DEFAULT_SLOT_COUNT, DEFAULT_SLOT_SIZE

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
                for r in a.cuda_ramps:
                    for b in a.cuda_batch:
                        links[f"cuda_peer ramps={r} batch={b}"] = (DirectLink(s, d, 16 << 20, 8, ramps=r,
                                                                              src_batch=b), 0)
            for r in a.host_ramps:
                for n in a.host_parts:
                    for qn in a.host_queues:
                        links[f"host_shared ramps={r} parts={n} queue={qn}"] = (
                            DirectLink(d, s, DEFAULT_SLOT_SIZE, DEFAULT_SLOT_COUNT, ramps=r, parts=n,
                                       ring=_native.RING_SHARED_HOST, queue=qn), 1)
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
    print("ratio (speed-up over each kind's first variant): " + ", ".join(ratios))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
