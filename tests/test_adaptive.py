"""Adaptive SRU planning: SpeedMeter's arithmetic, the slowdown hook, and convergence on an unequal pair."""
from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest

from vkmulti import ReferenceRenderer, ReferenceSRU, SRUOffloadCoordinator
from vkmulti.offload import SpeedMeter
from vkmulti.errors import TimeoutError, TransferError
from vkmulti import Image
from vkmulti.transfer import TimelinePoint

# ---- SpeedMeter without a GPU ----------------------------------------------------------------------


def test_fold_damps_and_limits_each_step():
    m = SpeedMeter(3, lambda p, t: None, damping=0.5)
    assert m.seconds_per_cost_unit == [None, None, None] and m.relative_speeds == [None, None, None]
    m._fold(0, 2.0)
    m._fold(1, 1.0)
    assert m.seconds_per_cost_unit == [2.0, 1.0, None]
    m._fold(0, 4.0)                                   # halfway: 2 + 0.5 * (4 - 2)
    assert m.seconds_per_cost_unit[0] == 3.0
    m._fold(1, 100.0)                                 # one frame moves it at most MAX_STEP x
    assert m.seconds_per_cost_unit[1] == 1.0 + 0.5 * (1.0 * SpeedMeter.MAX_STEP - 1.0)
    assert m.relative_speeds == [pytest.approx(2.5 / 3.0), 1.0, None]
    m.reset()
    assert m.seconds_per_cost_unit == [None] * 3


def test_weights_for_scales_unmeasured_devices_by_their_prior():
    m = SpeedMeter(3, lambda p, t: None)
    assert m.weights_for([0, 1, 2]) is None
    assert m.weights_for([0, 2], [1.0, 2.0, 4.0]) == [1.0, 4.0]
    m._fold(0, 0.5)                                   # device 0: 2 cost units per second
    assert m.weights_for([0, 1, 2]) == [2.0, 2.0, 2.0]
    assert m.weights_for([0, 1, 2], [1.0, 3.0, 0.5]) == [2.0, 6.0, 1.0]
    m._fold(1, 0.125)                                 # device 1: 8 units per second
    w = m.weights_for([0, 1, 2], [1.0, 1.0, 1.0])
    assert w[:2] == [2.0, 8.0] and w[2] == pytest.approx(5.0)


def test_damping_is_checked():
    m = SpeedMeter(2, lambda p, t: None)
    for bad in (0, -0.5, 1.5, math.nan):
        with pytest.raises(ValueError, match="damping must be in"):
            m.damping = bad
    for bad in ("0.5", None, True):
        with pytest.raises(TypeError, match="damping must be a number"):
            m.damping = bad
    m.damping = 1
    assert m.damping == 1.0


def test_frames_are_timed_from_each_devices_first_work():
    waits = {}

    def wait_point(p, timeout):
        time.sleep(waits[p.value])

    waits.update({1: 0.02, 2: 0.02, 3: 0.06})
    m = SpeedMeter(2, wait_point, damping=1.0)
    m.begin()
    m.watch(0, [TimelinePoint(1, 1, 0)])
    m.watch(1, [TimelinePoint(1, 2, 0), TimelinePoint(1, 3, 0)])
    m.end({0: 10.0, 1: 20.0})
    seconds = m.settle()
    assert seconds[0] >= 0.02 and seconds[1] >= 0.08
    spc = m.seconds_per_cost_unit
    assert spc[0] == pytest.approx(seconds[0] / 10.0) and spc[1] == pytest.approx(seconds[1] / 20.0)
    assert m.settle() == {}                           # nothing pending any more
    m.close()


def test_a_failed_wait_or_an_unfinished_frame_updates_nothing(caplog):
    def wait_point(p, timeout):
        if p.value == 2:
            raise TimeoutError("no")

    m = SpeedMeter(2, wait_point)
    m.SLICE = 0.001
    m.begin()
    m.watch(0, [TimelinePoint(1, 1, 0)])
    m.watch(1, [TimelinePoint(1, 2, 0)])
    m.end({0: 1.0, 1: 1.0})
    seconds = m.settle()
    assert set(seconds) == {0} and m.seconds_per_cost_unit[1] is None
    assert "GPU 1: its share of the frame was not seen done" in caplog.text
    m.begin()                                         # a frame that raised before end(): its waiters stop
    m.watch(0, [TimelinePoint(1, 1, 0)])
    m.begin()
    m.close()
    assert m.seconds_per_cost_unit[0] is not None


# ---- the slowdown hook -------------------------------------------------------------------------------

def test_slowdown_renders_the_same_pixels(manager):
    sru = ReferenceSRU(1, 40, 24, seed=7, iterations=50)
    images = []
    for slowdown in (1, 3):
        with ReferenceRenderer(manager.primary, slowdown=slowdown) as r:
            assert r.slowdown == slowdown
            target = r.make_target(sru)
            try:
                r.wait(r.render(sru, target))
                images.append(target.download())
            finally:
                target.destroy()
    np.testing.assert_array_equal(images[0], images[1])
    with ReferenceRenderer(manager.primary) as r:
        assert r.slowdown == 1
        for bad in (0, -1, 1.5, True, "2", 10**6):
            with pytest.raises(ValueError, match="slowdown must be an int"):
                r.slowdown = bad
        assert r.slowdown == 1


# ---- the coordinator ---------------------------------------------------------------------------------

SLOW = 6      # device 1 dispatches every SRU this many times
#: real GPUs render the light tiles in microseconds (the frame would be bound by submission): heavier ones there
REAL_GPUS = os.environ.get("VKMULTI_REAL_GPUS") == "1"


def unequal_factory(ctx):
    return ReferenceRenderer(ctx.slot, slowdown=SLOW if ctx.slot.index == 1 else 1)


def heavy_tiles(n=16, w=320, h=120, seed=3, iterations=(256, 1024)):
    rng = np.random.default_rng(seed)
    cols = 8
    tw, th = w // cols, h // math.ceil(n / cols)
    return [ReferenceSRU(i, tw, th, x=(i % cols) * tw, y=(i // cols) * th, seed=int(rng.integers(2**32)),
                         iterations=int(rng.integers(*iterations))) for i in range(n)]


def test_adaptive_arguments_and_default(manager):
    with SRUOffloadCoordinator(manager) as c:
        assert c.adaptive is False and c.adaptive_damping == 0.5
        assert c.measured_weights == [None, None] and c.seconds_per_cost_unit == [None, None]
        c.adaptive = True
        with pytest.raises(TypeError, match="adaptive must be a bool"):
            c.adaptive = 1
        assert c.adaptive is True
        with pytest.raises(ValueError, match="damping must be in"):
            c.adaptive_damping = 0.0
        assert c.adaptive_damping == 0.5
    with pytest.raises(TypeError, match="adaptive must be a bool"):
        SRUOffloadCoordinator(manager, adaptive="yes")
    with pytest.raises(ValueError, match="damping must be in"):
        SRUOffloadCoordinator(manager, adaptive=True, adaptive_damping=2.0)


def test_plans_stay_pure_without_adaptive(manager):
    srus = heavy_tiles(8, 160, 60)
    with SRUOffloadCoordinator(manager, secondary_renderer_factory=unequal_factory) as c:
        frame = Image(manager.primary, 160, 60)
        try:
            first = c.plan(srus)
            for _ in range(2):
                rep = c.render_frame(srus, frame)
                assert rep.device_seconds == {}
            assert c.plan(srus) == first and c.measured_weights == [None, None]
        finally:
            frame.destroy()


def frame_ms(c, srus, frame):
    t0 = time.perf_counter()
    rep = c.render_frame(srus, frame)
    return (time.perf_counter() - t0) * 1e3, rep


def test_adaptive_converges_below_the_equal_split_on_an_unequal_pair(manager):
    """Device 1 renders every SRU SLOW times over: the adaptive plan learns it and moves work to GPU 0.

    Both coordinators render frames in turn, so machine load hits both alike; the best of the last
    frames of each (load on a shared machine only ever adds time)."""
    w, h = (1920, 540) if REAL_GPUS else (320, 120)
    srus = heavy_tiles(w=w, h=h, iterations=(20_000, 60_000) if REAL_GPUS else (512, 2048))
    reference = Image(manager.primary, w, h)
    with SRUOffloadCoordinator(manager, secondary_renderer_factory=unequal_factory, devices=[0]) as alone:
        alone.render_frame(srus, reference)
        expected = reference.download()
    reference.destroy()
    equal = SRUOffloadCoordinator(manager, secondary_renderer_factory=unequal_factory)
    adaptive = SRUOffloadCoordinator(manager, secondary_renderer_factory=unequal_factory, adaptive=True)
    frames = [Image(manager.primary, w, h) for _ in range(2)]
    try:
        times = {"equal": [], "adaptive": []}
        for k in range(14):
            ms, rep_e = frame_ms(equal, srus, frames[0])
            times["equal"].append(ms)
            ms, rep_a = frame_ms(adaptive, srus, frames[1])
            times["adaptive"].append(ms)
            assert set(rep_a.device_seconds) <= {0, 1} and all(s > 0 for s in rep_a.device_seconds.values())
        np.testing.assert_array_equal(frames[1].download(), expected)
        np.testing.assert_array_equal(frames[0].download(), expected)
        weights = adaptive.measured_weights
        assert weights[0] == 1.0 and weights[1] < 0.75, weights
        on1 = {name: sum(d == 1 for d in rep.rendered_on.values()) for name, rep in
               (("equal", rep_e), ("adaptive", rep_a))}
        assert on1["adaptive"] < on1["equal"], on1
        last = {name: min(t[-8:]) for name, t in times.items()}
        assert last["adaptive"] < last["equal"], (last, times)
    finally:
        adaptive.destroy()
        equal.destroy()
        for f in frames:
            f.destroy()


@pytest.mark.virtual   # a pair of equal devices: the virtual one (a GPU host's pair may be unequal)
def test_an_equal_pair_measures_equal(manager):
    """A secondary's share is timed by its renders, on its own device: timed until its images were on
    GPU 0 (dst_ready), it was charged GPU 0's renders queued ahead of them, and an equal pair
    measured GPU 1 at 0.4-0.5 of GPU 0's speed here (0.22 without the validation layer), the plan
    moving work off it."""
    srus = heavy_tiles(iterations=(512, 2048))
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=lambda ctx: ReferenceRenderer(ctx.slot),
                              adaptive=True)
    frame = Image(manager.primary, 320, 120)
    try:
        ratios = []
        for _ in range(8):
            c.render_frame(srus, frame)
            w = c.measured_weights
            ratios.append(w[1] / w[0])
        # The bug measured 0.4-0.5; the bounds leave room for two CPU devices sharing a loaded
        # machine (1.54 seen beside a full test run), not for the bias.
        assert 0.55 < sorted(ratios)[len(ratios) // 2] < 1 / 0.55, ratios
    finally:
        c.destroy()
        frame.destroy()


def test_resources_are_made_before_any_render_and_devices_start_together(manager, monkeypatch):
    """Making an image waits on its device's queue: every SRU's images are made before the frame's
    first render is queued, and the devices' renders are submitted interleaved."""
    from vkmulti.memory import image as images
    from vkmulti.offload import coordinator as offload

    events = []
    made = images.Image.__init__
    render = ReferenceRenderer.render

    def making(self, slot, *a, **kw):
        events.append(("image", slot.index))
        made(self, slot, *a, **kw)

    def rendering(self, sru, target, **kw):
        events.append(("render", self.slot.index))
        return render(self, sru, target, **kw)

    srus = heavy_tiles(8, 160, 60)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=lambda ctx: ReferenceRenderer(ctx.slot))
    frame = Image(manager.primary, 160, 60)
    monkeypatch.setattr(images.Image, "__init__", making)
    monkeypatch.setattr(offload.Image, "__init__", making)
    monkeypatch.setattr(ReferenceRenderer, "render", rendering)
    try:
        c.render_frame(srus, frame)
        kinds = [k for k, _ in events]
        assert "image" in kinds and kinds.index("render") > max(i for i, k in enumerate(kinds) if k == "image")
        renders = [d for k, d in events if k == "render"]
        assert sorted(set(renders)) == [0, 1] and renders[:2] in ([0, 1], [1, 0]), renders
    finally:
        monkeypatch.undo()
        c.destroy()
        frame.destroy()


def test_a_replan_reuses_the_resources_of_moved_srus(manager, monkeypatch):
    """SRUs that move device leave their images and transfer as spares: moving back and forth
    makes no new image once both directions were seen, and the frame stays right."""
    from vkmulti.offload import coordinator as offload

    made = []
    init = offload.Image.__init__

    def counting(self, slot, *a, **kw):
        made.append(slot.index)
        init(self, slot, *a, **kw)

    srus = heavy_tiles(8, 160, 60, iterations=(64, 256))
    frame = Image(manager.primary, 160, 60)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=lambda ctx: ReferenceRenderer(ctx.slot))
    try:
        c.render_frame(srus, frame)
        expected = frame.download()
        monkeypatch.setattr(offload.Image, "__init__", counting)
        counts = []
        for weights in ([1.0, 8.0], [8.0, 1.0], [1.0, 8.0], [8.0, 1.0]):
            c.weights = weights
            made.clear()
            rep = c.render_frame(srus, frame)
            counts.append(len(made))
            np.testing.assert_array_equal(frame.download(), expected)
        assert sum(d == 1 for d in rep.rendered_on.values()) < 4 and counts[1:] == [0, 0, 0], counts
        assert c._cache.spares
    finally:
        monkeypatch.undo()
        c.destroy()
        frame.destroy()
    assert c._cache.spares == {}


def test_interleaved_submission_order():
    from types import SimpleNamespace

    from vkmulti.offload.partition import interleaved

    jobs = [(i, SimpleNamespace(device_index=d), None) for i, d in enumerate([1, 1, 0, 0, 0, 0, 1, 2])]
    order = [j[0] for j in interleaved(jobs)]
    # device 0 has 4 (at 1/8, 3/8, ...), device 1 has 3 (1/6, 1/2, 5/6), device 2 one (1/2)
    assert order == [2, 0, 3, 1, 7, 4, 6, 5]
    assert interleaved([]) == []


def test_adaptive_frames_without_waiting_and_teardown(manager):
    srus = heavy_tiles(8, 160, 60)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=unequal_factory, adaptive=True,
                              adaptive_damping=1.0)
    frame = Image(manager.primary, 160, 60)
    try:
        for _ in range(3):
            rep = c.render_frame(srus, frame, wait=False)
            assert rep.device_seconds == {}
        c.wait_frame(60)
        c.render_frame(srus, frame, wait=False)      # pending when destroyed: its timers are joined
        assert all(v is not None for v in c.seconds_per_cost_unit)
        c.reset_measurements()
        assert c.seconds_per_cost_unit == [None, None]
    finally:
        c.destroy()
        frame.destroy()


class NeverTicket:
    """A transfer whose dst_ready never comes: wait_submitted fails as a stalled link does."""

    def __init__(self, primary_semaphore, secondary_semaphore):
        self.dst_ready = TimelinePoint(primary_semaphore, 10**9, 0)
        self.src_done = TimelinePoint(secondary_semaphore, 10**9, 1)

    def wait_submitted(self, timeout=None):
        raise TransferError("transfer link stalled (test)")

    wait = wait_submitted

    def done(self):
        return False


def test_a_transfer_that_never_lands_does_not_hold_up_the_frame(manager, monkeypatch, caplog):
    import vulkan as vk

    from vkmulti import CrossDeviceTransfer

    sems = [(manager.slot(d), manager.slot(d).native.create_timeline(0)) for d in (0, 1)]
    monkeypatch.setattr(CrossDeviceTransfer, "submit", lambda self, **kw: NeverTicket(sems[0][1], sems[1][1]))
    srus = heavy_tiles(8, 160, 60)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=unequal_factory, adaptive=True, timeout=60.0)
    frame = Image(manager.primary, 160, 60)
    try:
        t0 = time.perf_counter()
        rep = c.render_frame(srus, frame)
        assert time.perf_counter() - t0 < 30.0           # not the 60 s timeout: the waiter was stopped
        assert rep.fallbacks and set(rep.rendered_on.values()) == {0} and 1 in c.unavailable
        assert set(rep.device_seconds) == {0}
        assert c.seconds_per_cost_unit[1] is None and c.seconds_per_cost_unit[0] is not None
    finally:
        c.destroy()
        frame.destroy()
        for slot, s in sems:
            vk.vkDestroySemaphore(slot.device, vk.ffi.cast("VkSemaphore", s), None)


def _bench():
    from pathlib import Path

    from script_support import load_script

    return load_script(Path("bench/placement.py"), "placement_bench_adaptive")


def test_placement_bench_adaptive_section(capsys):
    import json

    bench = _bench()
    before = os.environ.get("LP_NUM_THREADS")
    args = ["--section", "adaptive", "--srus", "8", "--size", "160x90", "--warmup", "3", "--rounds", "2",
            "--threads-per-device", "1", "--iterations", "20000,40000" if REAL_GPUS else "64,256"]
    assert bench.main(args) == 0
    assert os.environ.get("LP_NUM_THREADS") == before          # the bench's setting does not leak
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith("ratio: adaptive SRU mode ") and "the better of the equal split" in out[-1]
    assert "threads per device" in out[-1] and "render-only bound" in out[-1]
    fig = json.loads("\n".join(out[:-1]))
    assert fig["adaptive_identical_frames"] is True and not fig["adaptive_fallbacks"]
    for k in ("frame_ms_gpu0_alone", "frame_ms_equal_split", "frame_ms_adaptive", "render_only_render_ms_gpu0_alone",
              "render_only_render_ms_gpu1_alone", "render_only_render_ms_both_at_once"):
        assert fig[f"adaptive_{k}"] > 0
    layout = fig["adaptive_thread_layout"]
    assert layout["lp_num_threads"] == 1 and layout["source"] == "--threads-per-device"
    assert len(layout["devices"]) == 2 and len(fig["adaptive_render_only_render_ms_all"]["both"]) == 2
    assert 0 < fig["adaptive_render_only_ideal_ratio"] < 1 and fig["adaptive_iterations"][0] >= 64
    assert fig["adaptive_cost_share_equal"][1] > 0 and len(fig["adaptive_speed_ratio_per_round"]) == 5
    assert len(fig["adaptive_srus_moved_per_timed_round"]) == 2
    for bad in (["--rounds", "0"], ["--iterations", "5,1"], ["--threads-per-device", "0"],
                ["--slow-device", "0"]):
        with pytest.raises(SystemExit):
            bench.main(["--section", "adaptive", "--srus", "4", "--size", "64x32", "--warmup", "0", "--rounds", "1",
                        "--no-render-only"] + bad)
    assert os.environ.get("LP_NUM_THREADS") == before


def test_placement_bench_thread_layout(monkeypatch, tmp_path):
    """LP_NUM_THREADS: --threads-per-device, else the environment's, else the CPUs over the lavapipe devices."""
    import argparse
    import json

    bench = _bench()
    monkeypatch.setattr(os, "environ", dict(os.environ))   # the process's own environment is not touched
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)
    monkeypatch.setattr(bench, "_cpus", lambda: 16)
    args = argparse.Namespace(virtual=2, threads_per_device=None)
    assert bench.thread_layout(args)["lp_num_threads"] == 7 and os.environ["LP_NUM_THREADS"] == "7"
    monkeypatch.delenv("LP_NUM_THREADS")
    manifests = []
    for name, lib in (("nv.json", "libGLX_nvidia.so.0"), ("lvp.json", "/tmp/mesa/libvulkan_lvp.so")):
        (tmp_path / name).write_text(json.dumps({"ICD": {"library_path": lib}}))
        manifests.append(str(tmp_path / name))
    monkeypatch.setenv("VK_DRIVER_FILES", os.pathsep.join(manifests))
    layout = bench.thread_layout(argparse.Namespace(virtual=None, threads_per_device=None))
    assert layout["lavapipe_devices_expected"] == 1 and layout["lp_num_threads"] == 15
    monkeypatch.setenv("LP_NUM_THREADS", "3")
    assert bench.thread_layout(argparse.Namespace(virtual=2, threads_per_device=None))["lp_num_threads"] == 3
    layout = bench.thread_layout(argparse.Namespace(virtual=2, threads_per_device=12))
    assert layout["lp_num_threads"] == 12 and layout["oversubscribed"] and os.environ["LP_NUM_THREADS"] == "12"
    monkeypatch.setattr(bench, "_cpus", lambda: 2)
    monkeypatch.delenv("LP_NUM_THREADS")
    assert bench.thread_layout(argparse.Namespace(virtual=2, threads_per_device=None))["lp_num_threads"] == 1
