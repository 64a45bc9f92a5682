"""SRUOffloadCoordinator: plans, offloaded frames, fallback, caches, the demo (virtual pair and real GPUs)."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import vulkan as vk

import vkmulti
from vkmulti.apps import cli
from vkmulti import (DestroyedError, MultiDeviceManager, OffloadRoute, ReferenceRenderer, ReferenceSRU,
                     SRUOffloadCoordinator, TransferMethod, select_transfer_method)
from vkmulti.offload import make_srus
from vkmulti import Image
from vkmulti import RendererMissingError
from vkmulti.offload import SecondaryRenderContext
from vkmulti import SRUAssignment
from vkmulti.offload import SRU_IMAGE_USAGE
from vkmulti import CrossDeviceTransfer


def factory(ctx: SecondaryRenderContext) -> ReferenceRenderer:
    assert ctx.command_pool is not None      # its own pool, made before the renderer
    return ReferenceRenderer(ctx.slot)


def tiles(n=12, w=240, h=120, seed=5, iters=(4, 40)):
    """n ReferenceSRUs tiling a w x h frame with varied costs."""
    rng = np.random.default_rng(seed)
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    tw, th = w // cols, h // rows
    return [ReferenceSRU(i, tw, th, x=(i % cols) * tw, y=(i // cols) * th, seed=int(rng.integers(2**32)),
                         iterations=int(rng.integers(iters[0], iters[1] + 1))) for i in range(n)]


def render_single(manager, srus, w, h, **kw):
    """The frame rendered on GPU 0 alone (the reference)."""
    with SRUOffloadCoordinator(manager, secondary_renderer_factory=factory, devices=[0], **kw) as c:
        frame = Image(manager.primary, w, h)
        try:
            rep = c.render_frame(srus, frame)
            assert not any(r.offloaded for r in rep.routes)
            return frame.download()
        finally:
            frame.destroy()


def test_offloaded_frame_is_pixel_identical(manager):
    srus = tiles()
    ref = render_single(manager, srus, 240, 120)
    with SRUOffloadCoordinator(manager, secondary_renderer_factory=factory) as c:
        assert c.active
        frame = Image(manager.primary, 240, 120)
        try:
            for _ in range(3):            # the first frame makes targets; later ones reuse them
                rep = c.render_frame(srus, frame)
                assert not rep.fallbacks and c.unavailable == {}
                on1 = [i for i, d in rep.rendered_on.items() if d == 1]
                assert on1 and len(on1) < len(srus)
                assert rep.transferred_bytes == sum(s.width * s.height * 8 for s in srus if s.sru_id in on1)
                np.testing.assert_array_equal(frame.download(), ref)
                for i in on1:
                    assert c.ticket_for(i).done()
        finally:
            frame.destroy()


def test_frame_without_waiting_and_content_scale(manager):
    srus = tiles(6, 120, 60)
    ref = render_single(manager, srus, 240, 120, content_scale=(2.0, 2.0))
    with SRUOffloadCoordinator(manager, secondary_renderer_factory=factory, content_scale=(2, 2)) as c:
        frame = Image(manager.primary, 240, 120)
        try:
            rep = c.render_frame(srus, frame, wait=False)
            assert rep.done.device_index == 0
            c.wait_frame(60)
            np.testing.assert_array_equal(frame.download(), ref)
        finally:
            frame.destroy()


def loads(routes, costs, n=2):
    load = [0.0] * n
    for r in routes:
        load[r.device_index] += costs[r.sru_id]
    return load


def test_plan_is_balanced_and_uses_select_transfer_method(manager):
    rng = np.random.default_rng(11)
    srus = [SimpleNamespace(sru_id=i, render_cost=float(c)) for i, c in enumerate(rng.lognormal(3, 1, 40))]
    costs = {s.sru_id: s.render_cost for s in srus}
    c = SRUOffloadCoordinator(manager)
    try:
        routes = c.plan(srus)
        assert [r.sru_id for r in routes] == list(range(40))          # input order
        bound = max(max(costs.values()), sum(costs.values()) / 2)
        assert max(loads(routes, costs)) <= bound * 1.05
        for r in routes:
            assert isinstance(r, OffloadRoute) and r.offloaded == (r.device_index == 1)
            expected = select_transfer_method(SRUAssignment(r.sru_id, r.device_index), manager.capabilities)
            assert r.transfer == expected
            assert (r.transfer == TransferMethod.NONE) == (r.device_index == 0)
            assert c.route_for(r.sru_id) == r
        assert c.route_for(999) is None
        c.plan(srus[:3])                                                # the cache is replaced
        assert c.route_for(10) is None
        with pytest.raises(TypeError):
            c.plan([SimpleNamespace(sru_id=0.5, render_cost=1)])
        # the seed's default cost: instance counts
        seedlike = [SimpleNamespace(sru_id=i, instances=[0] * (i + 1), skinned_instances=[]) for i in range(6)]
        assert max(loads(c.plan(seedlike), {i: i + 1 for i in range(6)})) == 11
    finally:
        c.destroy()


def test_plan_is_deterministic(manager):
    srus = [SimpleNamespace(sru_id=i, render_cost=float(1 + i % 3)) for i in range(15)]
    c = SRUOffloadCoordinator(manager)
    try:
        first = c.plan(srus)
        assert c.plan(srus) == first
        shuffled = list(reversed(srus))
        by_id = {r.sru_id: r for r in c.plan(shuffled)}
        assert all(by_id[r.sru_id] == r for r in first)
    finally:
        c.destroy()


def test_plan_pinning_and_weights(manager):
    srus = [SimpleNamespace(sru_id=i, render_cost=10.0, offloadable=i % 2 == 0) for i in range(8)]
    with SRUOffloadCoordinator(manager) as c:
        for r in c.plan(srus):
            if r.sru_id % 2:
                assert r.device_index == 0 and not r.offloaded
    srus = [SimpleNamespace(sru_id=i, render_cost=1.0) for i in range(40)]
    with SRUOffloadCoordinator(manager, weights=[1.0, 3.0]) as c:
        on1 = sum(r.offloaded for r in c.plan(srus))
        assert on1 == 30
    with SRUOffloadCoordinator(manager) as c:      # a transfer cost keeps cheap SRUs home
        assert not any(r.offloaded for r in c.plan(srus[:4], transfer_cost=lambda s: 5.0))


def test_plan_stickiness(manager):
    a = [SimpleNamespace(sru_id=i, render_cost=c) for i, c in enumerate([10.0, 9.0, 8.0, 7.0])]
    b = [SimpleNamespace(sru_id=i, render_cost=c) for i, c in enumerate([10.0, 11.0, 8.0, 7.0])]
    with SRUOffloadCoordinator(manager) as plain, SRUOffloadCoordinator(manager, hysteresis=0.2) as sticky:
        p1, s1 = plain.plan(a), sticky.plan(a)
        assert p1 == s1
        moved = plain.plan(b)
        kept = sticky.plan(b)
        assert [r.device_index for r in moved] != [r.device_index for r in p1]   # a fresh plan moves SRUs
        assert [r.device_index for r in kept] == [r.device_index for r in s1]    # within hysteresis: kept
        big = [SimpleNamespace(sru_id=i, render_cost=c) for i, c in enumerate([1.0, 50.0, 50.0, 1.0])]
        assert sticky.plan(big) == plain.plan(big)       # a large gain beats stickiness


def test_inactive_coordinator_keeps_everything_home():
    with MultiDeviceManager.create(enabled=False) as mgr:
        c = SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory)
        assert not c.active
        routes = c.plan([SimpleNamespace(sru_id=i, render_cost=5.0) for i in range(4)])
        assert all(r == OffloadRoute(r.sru_id, 0, TransferMethod.NONE) for r in routes)
        srus = tiles(4, 64, 32)
        frame = Image(mgr.primary, 64, 32)
        try:
            rep = c.render_frame(srus, frame)
            assert set(rep.rendered_on.values()) == {0} and rep.transferred_bytes == 0
        finally:
            frame.destroy()
    assert c._destroyed     # the manager's teardown destroyed it


class FailingRenderer:
    """Renders fine for `ok` calls, then raises (a broken renderer or a lost device)."""

    def __init__(self, slot, ok=0, exc=RuntimeError("shader blew up")):
        self.inner = ReferenceRenderer(slot)
        self.ok, self.exc, self.calls = ok, exc, 0

    def render(self, sru, target, *, wait=None):
        self.calls += 1
        if self.calls > self.ok:
            raise self.exc
        return self.inner.render(sru, target, wait=wait)

    def destroy(self):
        self.inner.destroy()


@pytest.mark.parametrize("ok, exc", [(0, RuntimeError("shader blew up")), (2, vkmulti.DeviceLostError(-4, "vkQueueSubmit"))])
def test_fallback_when_secondary_renderer_raises(manager, caplog, ok, exc):
    """The attached renderer is used; when it raises, its SRUs render on GPU 0 and GPU 1 is left out."""
    srus = tiles(10, 200, 100)
    ref = render_single(manager, srus, 200, 100)
    broken = FailingRenderer(manager.slot(1), ok=ok, exc=exc)
    manager.attach_renderer(1, broken)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=factory)
    frame = Image(manager.primary, 200, 100)
    try:
        planned = [r.sru_id for r in c.plan(srus) if r.offloaded]
        with caplog.at_level(logging.ERROR, logger="vkmulti.offload.coordinator"):
            rep = c.render_frame(srus, frame)
        assert broken.calls == ok + 1                      # the attached renderer, not the factory's
        assert sorted(rep.fallbacks) == sorted(planned[ok:])
        assert all(rep.rendered_on[i] == 0 for i in rep.fallbacks)
        assert sum(d == 1 for d in rep.rendered_on.values()) == ok
        assert 1 in c.unavailable and "renderer raised" in c.unavailable[1]
        assert any("GPU 1" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
        np.testing.assert_array_equal(frame.download(), ref)   # the frame is never lost
        rep2 = c.render_frame(srus, frame)                     # later plans leave GPU 1 out
        assert not any(r.offloaded for r in rep2.routes) and not rep2.fallbacks
        np.testing.assert_array_equal(frame.download(), ref)
        assert c.usable_devices() == [0]
        c.restore_device(1)
        manager.attach_renderer(1, None)
        rep3 = c.render_frame(srus, frame)
        assert any(d == 1 for d in rep3.rendered_on.values())
        np.testing.assert_array_equal(frame.download(), ref)
    finally:
        c.destroy()
        frame.destroy()
        manager.attach_renderer(1, None)
        broken.destroy()


class SeedRecorder:
    """The seed's recorder protocol only: render_sru_offscreen(sru, target), complete on return."""

    def __init__(self, slot):
        self.inner = ReferenceRenderer(slot)
        self.calls = 0

    def render_sru_offscreen(self, sru, target):
        self.calls += 1
        self.inner.wait(self.inner.render(sru, target), timeout=60)

    def destroy(self):
        self.inner.destroy()


def test_seed_style_recorder_is_used_synchronously(manager):
    srus = tiles(8, 160, 80)
    ref = render_single(manager, srus, 160, 80)
    rec = SeedRecorder(manager.slot(1))
    manager.attach_renderer(1, rec)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=factory)
    frame = Image(manager.primary, 160, 80)
    try:
        for _ in range(2):
            rep = c.render_frame(srus, frame)
            assert not rep.fallbacks
            np.testing.assert_array_equal(frame.download(), ref)
        assert rec.calls == 2 * sum(d == 1 for d in rep.rendered_on.values()) > 0
    finally:
        c.destroy()
        frame.destroy()
        manager.attach_renderer(1, None)
        rec.destroy()


def test_fallback_when_transfer_fails(manager, monkeypatch):
    srus = tiles(8, 160, 80)
    ref = render_single(manager, srus, 160, 80)
    real_submit = CrossDeviceTransfer.submit

    def lost(self, **kw):
        if self.src.index == 1:
            raise vkmulti.DeviceLostError(-4, "vkQueueSubmit(transfer)")
        return real_submit(self, **kw)
    monkeypatch.setattr(CrossDeviceTransfer, "submit", lost)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=factory)
    frame = Image(manager.primary, 160, 80)
    try:
        rep = c.render_frame(srus, frame)
        assert rep.fallbacks and set(rep.rendered_on.values()) == {0}
        assert "transfer" in c.unavailable[1]
        np.testing.assert_array_equal(frame.download(), ref)
    finally:
        c.destroy()
        frame.destroy()


def test_fallback_when_secondary_factory_raises(manager, caplog):
    def picky(ctx):
        if ctx.slot.index == 1:
            raise vkmulti.OutOfDeviceMemoryError(-2, "vkAllocateMemory")
        return ReferenceRenderer(ctx.slot)
    srus = tiles(6, 120, 60)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=picky)
    frame = Image(manager.primary, 120, 60)
    try:
        with caplog.at_level(logging.ERROR, logger="vkmulti.offload.coordinator"):
            rep = c.render_frame(srus, frame)
        assert rep.fallbacks and set(rep.rendered_on.values()) == {0} and 1 in c.unavailable
        np.testing.assert_array_equal(frame.download(), render_single(manager, srus, 120, 60))
    finally:
        c.destroy()
        frame.destroy()


def test_resizing_frees_old_targets(manager):
    """Targets and transfers are cached per SRU and replaced (old ones freed) only on a size change;
    the validation layer reports any leak when the devices are destroyed."""
    srus = tiles(6, 180, 90)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=factory)
    frame = Image(manager.primary, 180, 90)
    try:
        cost = lambda s: float(s.iterations)     # a resize leaves the plan alone
        c.render_frame(srus, frame, cost=cost)
        before = {i: (e.target, e.landing, e.transfer) for i, e in c._cache.entries.items()}
        c.render_frame(srus, frame, cost=cost)
        assert {i: (e.target, e.landing, e.transfer) for i, e in c._cache.entries.items()} == before  # reused
        grown = [dataclasses.replace(s, width=s.width - 7, height=s.height + 3) if s.sru_id % 2 else s
                 for s in srus]
        c.render_frame(grown, frame, cost=cost)
        for s in grown:
            e = c._cache.entries[s.sru_id]
            old_target, old_landing, old_transfer = before[s.sru_id]
            if s.sru_id % 2:
                assert old_target.handle is None and (e.target.width, e.target.height) == (s.width, s.height)
                if old_landing is not None:
                    assert old_landing.handle is None
                if old_transfer is not None:
                    assert old_transfer._destroyed and e.transfer is not old_transfer
            else:
                assert e.target is old_target and old_target.handle is not None
        np.testing.assert_array_equal(frame.download(), render_single(manager, grown, 180, 90))
        c.render_frame(grown[:2], frame, cost=cost)                 # SRUs that left the frame are freed
        assert set(c._cache.entries) == {0, 1}
    finally:
        c.destroy()
        frame.destroy()


def test_seed_render_sru_offloaded(manager):
    srus = tiles(4, 128, 64)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=factory)
    r0 = ReferenceRenderer(manager.primary)
    dsts = {s.sru_id: Image(manager.primary, s.width, s.height, usage=SRU_IMAGE_USAGE) for s in srus}
    try:
        routes = c.plan(srus)
        assert any(r.offloaded for r in routes)
        for s, r in zip(srus, routes):
            started = c.render_sru_offloaded(s, dsts[s.sru_id])
            assert started == r.offloaded
            if not started:
                assert c.ticket_for(s.sru_id) is None
                r0.wait(r0.render(s, dsts[s.sru_id]), timeout=60)
        for s, r in zip(srus, routes):
            if r.offloaded:
                t = c.ticket_for(s.sru_id)
                assert t.dst_ready.device_index == 0
                t.wait(60)
            direct = r0.make_target(s)
            r0.wait(r0.render(s, direct), timeout=60)
            np.testing.assert_array_equal(dsts[s.sru_id].download(), direct.download())
            direct.destroy()
        assert not c.render_sru_offloaded(SimpleNamespace(sru_id=99, width=4, height=4), dsts[0])   # no route
        x = c.transfer_for(next(r for r in routes if r.offloaded), width=8, height=8)
        assert (x.src.index, x.dst.index, x.bytes_per_pixel) == (1, 0, 8)
        x.destroy()
    finally:
        c.destroy()
        r0.destroy()
        for d in dsts.values():
            d.destroy()


def test_missing_renderer(manager):
    c = SRUOffloadCoordinator(manager)     # no factory, nothing attached
    try:
        srus = tiles(4, 64, 32)
        routes = c.plan(srus)
        route = next(r for r in routes if r.offloaded)
        with pytest.raises(RendererMissingError, match="attach_renderer") as info:
            c.render_offloaded(route)
        assert isinstance(info.value, NotImplementedError)
        sru = next(s for s in srus if s.sru_id == route.sru_id)
        dst = Image(manager.primary, sru.width, sru.height)
        try:
            with pytest.raises(RendererMissingError):
                c.render_sru_offloaded(sru, dst)
        finally:
            dst.destroy()
        assert c.unavailable == {}                  # a configuration error, not a device failure
    finally:
        c.destroy()


def test_bad_input(manager):
    with pytest.raises(TypeError, match="MultiDeviceManager"):
        SRUOffloadCoordinator(object())
    with pytest.raises(ValueError, match="starting with 0"):
        SRUOffloadCoordinator(manager, devices=[1])
    with pytest.raises(IndexError, match="5"):
        SRUOffloadCoordinator(manager, devices=[0, 5])
    with pytest.raises(ValueError, match="weights"):
        SRUOffloadCoordinator(manager, weights=[1.0])
    with pytest.raises(ValueError, match="hysteresis"):
        SRUOffloadCoordinator(manager, hysteresis=1.5)
    with pytest.raises(ValueError, match="content_scale"):
        SRUOffloadCoordinator(manager, content_scale=(-1, 1))
    with pytest.raises(TypeError, match="factory"):
        SRUOffloadCoordinator(manager, secondary_renderer_factory=42)
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=factory)
    frame = Image(manager.primary, 64, 64)
    wrong = Image(manager.slot(1), 64, 64)
    uint_frame = Image(manager.primary, 64, 64, vk.VK_FORMAT_R32_UINT)
    try:
        with pytest.raises(ValueError, match="duplicate sru_id 1"):
            c.plan([SimpleNamespace(sru_id=1, render_cost=1), SimpleNamespace(sru_id=1, render_cost=2)])
        with pytest.raises(ValueError, match="cost"):
            c.plan([SimpleNamespace(sru_id=1, render_cost=-1.0)])
        with pytest.raises(TypeError, match="x"):
            c.render_frame([SimpleNamespace(sru_id=1, width=8, height=8, y=0)], frame)
        with pytest.raises(ValueError, match="width"):
            c.render_frame([SimpleNamespace(sru_id=1, width=0, height=8, x=0, y=0)], frame)
        with pytest.raises(TypeError, match="width and height"):
            c.render_frame([SimpleNamespace(sru_id=1, x=0, y=0)], frame)
        with pytest.raises(ValueError, match="GPU 1"):
            c.render_frame(tiles(2, 64, 64), wrong)
        with pytest.raises(ValueError, match="R32_UINT"):   # SRU images cannot be blitted into it
            c.render_frame(tiles(2, 64, 64), uint_frame)
        with pytest.raises(TypeError):
            c.transfer_for("route")
        with pytest.raises(TypeError, match="dst_wait"):
            c.plan(tiles(4, 64, 64))
            sru = next(s for s in tiles(4, 64, 64) if c.route_for(s.sru_id).offloaded)
            c.render_sru_offloaded(sru, frame, dst_wait=(1, 2))
        c.render_frame(tiles(4, 64, 64), frame)       # still fine after all that
    finally:
        c.destroy()
        frame.destroy()
        wrong.destroy()
        uint_frame.destroy()
    c.destroy()    # idempotent
    with pytest.raises(DestroyedError):
        c.plan([])


@pytest.mark.parametrize("adaptive", [False, True])
def test_timeout_beyond_any_float_is_no_limit(manager, adaptive):
    """SRUOffloadCoordinator(timeout=10**400) was accepted, then every frame and destroy()
    raised OverflowError (the timeout reached float conversions in waits)."""
    c = SRUOffloadCoordinator(manager, secondary_renderer_factory=factory, timeout=10**400, adaptive=adaptive)
    frame = Image(manager.primary, 64, 64)
    try:
        assert c.timeout == math.inf
        for _ in range(2):
            rep = c.render_frame(tiles(4, 64, 64, iters=(2, 4)), frame)
            assert len(rep.rendered_on) == 4 and not rep.fallbacks and not c.unavailable
        c.wait_frame()
    finally:
        c.destroy()
        frame.destroy()
    assert c.destroyed


def test_demo_srus_tile_the_frame():
    srus = make_srus(7, 301, 203)
    assert len(srus) == 7 and len({s.sru_id for s in srus}) == 7
    cover = np.zeros((203, 301), int)
    for s in srus:
        cover[s.y:s.y + s.height, s.x:s.x + s.width] += 1
    assert (cover == 1).all()
    assert len({s.iterations for s in srus}) > 1          # varied costs
    with pytest.raises(ValueError):
        make_srus(0, 10, 10)
    with pytest.raises(ValueError, match="too small"):
        make_srus(16, 3, 3)
    for bad in (True, 2.5, "3", None):   # bools and floats made odd tiles or odd errors
        with pytest.raises(TypeError, match="count"):
            make_srus(bad, 64, 64)
    with pytest.raises(TypeError, match="width"):
        make_srus(4, 64.0, 64)
    with pytest.raises(ValueError, match="seed"):
        make_srus(4, 64, 64, seed=-1)
    with pytest.raises(TypeError, match="heavy"):
        make_srus(4, 64, 64, heavy="no")
    assert make_srus(np.int64(4), np.int64(64), 64) == make_srus(4, 64, 64)   # numpy integers are ints


def run_demo(tmp_path, *args, validation=True):
    png = tmp_path / "frame.png"
    env = dict(os.environ)
    if not validation:
        env.pop("VKMULTI_VALIDATION", None)
    r = subprocess.run([sys.executable, "-m", "vkmulti", "demo", "--json", "--output", str(png), *args],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), png


def test_demo_cli(tmp_path, capsys):
    out, png = run_demo(tmp_path, "--srus", "5", "--size", "200x120", "--frames", "1")
    assert out["identical"] and not out["fallbacks"]
    assert sum(len(d["srus"]) for d in out["devices"]) == 5
    assert len(out["devices"]) >= 2 and out["transfers"]
    for t in out["transfers"].values():
        assert t["gbps"] > 0 and t["method"] in TransferMethod.CROSS_DEVICE
    from PIL import Image as PILImage
    with PILImage.open(png) as im:
        assert im.size == (200, 120) and im.mode == "RGB"
    # the text report, in this process (validation layer on)
    assert cli.main(["demo", "--srus", "3", "--size", "90x60", "--frames", "1", "--output", ""]) == 0
    text = capsys.readouterr().out
    assert "speed-up" in text and "GB/s" in text and "identical to the one-GPU frame: yes" in text


@pytest.mark.parametrize("args, what", [(["--srus", "0"], "--srus"), (["--size", "10"], "size"),
                                        (["--frames", "0"], "--frames"), (["--devices", "a"], "devices"),
                                        (["--devices", "0,9"], "out of range")])
def test_demo_cli_bad_arguments(args, what, capsys):
    try:
        code = cli.main(["demo", "--output", "", *args])
    except SystemExit as exc:
        code = exc.code
    assert code == 2 and what in capsys.readouterr().err


@pytest.mark.two_gpus
def test_demo_speedup_on_two_gpus(tmp_path):
    """The issue's proof: render-heavy SRUs run >= 1.8x faster per frame on 2 GPUs than on 1."""
    out, png = run_demo(tmp_path, "--heavy", "--devices", "0,1", "--frames", "5", validation=False)
    print(json.dumps(out, indent=2))
    assert out["identical"] and not out["fallbacks"]
    assert out["speedup"] >= 1.8, out
    assert png.stat().st_size > 0


def test_manager_destroy_frees_a_live_coordinator_without_warnings(caplog):
    """The manager's destroy() tears down a coordinator still in use: its teardown
    asks the manager which devices are lost (while the manager is being destroyed)
    and frees every SRU's resources itself, with nothing logged."""
    srus = tiles()
    with caplog.at_level(logging.WARNING):
        with MultiDeviceManager.create() as mgr:
            assert mgr.device_lost(1) is False
            coord = SRUOffloadCoordinator(mgr, secondary_renderer_factory=factory)
            frame = Image(mgr.primary, 240, 120)
            coord.render_frame(srus, frame)
        assert coord.destroyed and frame.destroyed
        assert mgr.device_lost(1) is True      # a destroyed device runs nothing
        with pytest.raises(TypeError):
            mgr.device_lost("1")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
