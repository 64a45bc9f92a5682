"""Where does a CUDA_PEER transfer spend its time? Runs the native link in a few
shapes (landing ring vs bounce ring, slot sizes) with a trace file each, times
256 MiB / 4K image / 256x256 jobs, and prints each trace's median job event by
event (bench/trace_report.py). Then the same for HOST_SHARED's 4K frame
GPU1 -> GPU0.

    python bench/probes/cuda_probe.py OUTDIR [--reps 10] [--only landing_16x8 ...]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import vulkan as vk

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # bench/
from cuda_peer import DirectLink, timed  # noqa: E402
from trace_report import main as report  # noqa: E402

VARIANTS = {  # name: (bounce ring, slot MiB, slots)
    "bounce_16x8": (True, 16, 8),
    "landing_8x8": (False, 8, 8),
    "landing_16x8": (False, 16, 8),
    "landing_8x16": (False, 8, 16),
    "landing_32x8": (False, 32, 8),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--only", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    a = ap.parse_args(argv)
    from vkmulti import MultiDeviceManager
    from vkmulti import Buffer, Image

    os.makedirs(a.out, exist_ok=True)
    with MultiDeviceManager.create(enabled=True, validation=False) as mgr:
        s, d = mgr.slot(0), mgr.slot(1)
        bufs = Buffer(s, 256 << 20), Buffer(d, 256 << 20)
        f = vk.VK_FORMAT_R16G16B16A16_SFLOAT
        big = Image(s, 3840, 2160, f), Image(d, 3840, 2160, f)
        small = Image(s, 256, 256, f), Image(d, 256, 256, f)
        px = np.random.default_rng(1).integers(0, 256, (2160, 3840, 8), dtype=np.uint8)
        big[0].upload(px)
        cases = {"256MiB": dict(src_buffer=bufs[0], dst_buffer=bufs[1]),
                 "4K": dict(src_image=big[0], dst_image=big[1]),
                 "256x256": dict(src_image=small[0], dst_image=small[1])}
        for name in a.only:
            bounce, mib, k = VARIANTS[name]
            for case, kw in cases.items():
                path = os.path.join(a.out, f"trace_{name}_{case}.csv")
                if os.path.exists(path):
                    os.remove(path)
                link = DirectLink(s, d, mib << 20, k, bounce=bounce, trace=path)
                landed = link.native_link.ring_note.startswith("landing")
                if case == "256MiB":
                    print(f"   ring: {link.native_link.ring_note}", flush=True)
                try:
                    link.run(**kw, timeout=60)
                    ok = case != "4K" or np.array_equal(big[1].download(), px)
                    if case == "256MiB":
                        data = np.random.default_rng(2).integers(0, 256, 256 << 20, dtype=np.uint8)
                        bufs[0].upload(data)
                        link.run(**kw, timeout=60)
                        ok = np.array_equal(bufs[1].download(), data)
                    t = timed(lambda: link.run(**kw, timeout=60), a.reps)
                finally:
                    link.destroy()
                print(f"== {name} {case}: landing={landed} exact={ok} {t['median_s'] * 1e3:.3f} ms median "
                      f"{t['min_s'] * 1e3:.3f} min", flush=True)
                report([path, "--jobs", "1"])
        # HOST_SHARED 4K, GPU1 -> GPU0 as in bench/transfer.py (issue 3's target case)
        from vkmulti._core import _native
        from vkmulti.transfer import DEFAULT_SLOT_COUNT, DEFAULT_SLOT_SIZE
        back = Image(d, 3840, 2160, f), Image(s, 3840, 2160, f)
        path = os.path.join(a.out, "trace_host_shared_4K.csv")
        if os.path.exists(path):
            os.remove(path)
        x = DirectLink(d, s, DEFAULT_SLOT_SIZE, DEFAULT_SLOT_COUNT, ring=_native.RING_SHARED_HOST, trace=path)
        try:
            x.run(src_image=back[0], dst_image=back[1], timeout=60)
            t = timed(lambda: x.run(src_image=back[0], dst_image=back[1], timeout=60), 3 * a.reps)
        finally:
            x.destroy()
        print(f"== host_shared 4K GPU1->GPU0: {t['median_s'] * 1e3:.3f} ms median {t['min_s'] * 1e3:.3f} min",
              flush=True)
        report([path, "--jobs", "1"])
        for x in (*back,):
            x.destroy()
        for x in (*bufs, *big, *small):
            x.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
