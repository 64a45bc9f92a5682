"""The reference SRU renderer, its shipped SPIR-V, and the compositor."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import vulkan as vk

from vkmulti import DestroyedError, TimelinePoint
from vkmulti.memory import IMAGE_USAGE
from vkmulti import Image
from vkmulti._core.shaders import shader_path
from vkmulti.offload import SRU_IMAGE_USAGE, Compositor, ReferenceRenderer, ReferenceSRU
from script_support import load_script

REPO = Path(__file__).resolve().parent.parent
SHADERS = REPO / "native" / "shaders"
#: the shader sources and their manifest are in the checkout, not in an installed wheel
needs_source = pytest.mark.skipif(not (SHADERS / "spirv-manifest.json").is_file(),
                                  reason="needs the source tree (native/shaders)")


def _build_module():
    return load_script(SHADERS / "build_spirv.py", "build_spirv")


def _manifest() -> dict:
    return json.loads((SHADERS / "spirv-manifest.json").read_text())


@needs_source
def test_committed_spirv_belongs_to_its_source():
    """The manifest ties each committed .spv to the exact GLSL source it was built from."""
    m = _manifest()
    assert m["shaders"], "no shaders in the manifest"
    for name, s in m["shaders"].items():
        assert hashlib.sha256((SHADERS / name).read_bytes()).hexdigest() == s["source_sha256"], (
            f"{name} changed since its SPIR-V was built: run python native/shaders/build_spirv.py")
        spv = REPO / s["spirv"]
        assert hashlib.sha256(spv.read_bytes()).hexdigest() == s["spirv_sha256"], f"{spv} was modified by hand"
        assert shader_path(spv.name).read_bytes() == spv.read_bytes()   # what the package loads


@needs_source
def test_kernel_header_holds_the_committed_spirv():
    """native/vkm_kcopy_spv.h embeds exactly the committed SPIR-V of the copy kernels."""
    build, m = _build_module(), _manifest()
    header = REPO / m["header"]["path"]
    assert header.read_text() == build.c_header(), "stale header: run python native/shaders/build_spirv.py"
    assert hashlib.sha256(header.read_bytes()).hexdigest() == m["header"]["sha256"]


@needs_source
def test_spirv_recompiles_identically(tmp_path):
    glslc = shutil.which("glslc")
    if glslc is None:
        pytest.skip("glslc is not installed (Debian: apt-get install glslc)")
    build = _build_module()
    m = _manifest()
    version = build.glslc_version(glslc)
    for name, s in m["shaders"].items():
        out = tmp_path / f"{name}.spv"
        build.compile_shader(glslc, SHADERS / name, out)
        if version != m["glslc"]:
            assert out.stat().st_size > 0
            pytest.skip(f"glslc here is {version!r}, the SPIR-V was built with {m['glslc']!r}: "
                        f"compiled fine, bytes not comparable")
        assert out.read_bytes() == (REPO / s["spirv"]).read_bytes(), (
            f"{name}: committed SPIR-V differs from a fresh compile; run python native/shaders/build_spirv.py")
    val = shutil.which("spirv-val")
    if val:
        for s in m["shaders"].values():
            subprocess.run([val, "--target-env", "vulkan1.1", str(REPO / s["spirv"])], check=True)


def render_pixels(slot, sru, renderer=None):
    own = renderer is None
    r = renderer or ReferenceRenderer(slot)
    t = r.make_target(sru)
    try:
        r.wait(r.render(sru, t), timeout=60)
        return t.download()
    finally:
        t.destroy()
        if own:
            r.destroy()


def test_bit_identical_across_devices(manager):
    sru = ReferenceSRU(1, 97, 61, seed=12345, iterations=40)
    a = render_pixels(manager.slot(0), sru)
    b = render_pixels(manager.slot(1), sru)
    assert a.shape == (61, 97, 8)
    np.testing.assert_array_equal(a, b)
    f = a.view(np.float16).reshape(61, 97, 4)
    assert np.isfinite(f).all() and (f[..., 3] == 1).all()
    assert f[..., :3].std() > 0.01          # a picture, not a flat fill


def test_parameters_change_the_picture(manager):
    slot = manager.slot(0)
    r = ReferenceRenderer(slot)
    try:
        base = ReferenceSRU(1, 64, 48, seed=1, iterations=48)
        ref = render_pixels(slot, base, r)
        np.testing.assert_array_equal(ref, render_pixels(slot, base, r))      # deterministic
        for other in (ReferenceSRU(1, 64, 48, seed=2, iterations=48),
                      ReferenceSRU(1, 64, 48, seed=1, iterations=48, color_a=(0.2, 0.9, 0.3)),
                      ReferenceSRU(1, 64, 48, seed=1, iterations=48, color_b=(0.5, 0.0, 0.0)),
                      ReferenceSRU(1, 64, 48, seed=1, iterations=4)):
            assert not np.array_equal(ref, render_pixels(slot, other, r)), other
    finally:
        r.destroy()


def test_cost_model():
    a = ReferenceSRU(1, 100, 50, iterations=10)
    assert a.render_cost == 100 * 50 * 10
    assert ReferenceSRU(1, 100, 50, iterations=100).render_cost == 10 * a.render_cost
    assert len(a.push_constants()) == 48


def test_render_is_asynchronous(manager):
    """render() returns before the GPU has run it: here it waits on a semaphore we signal later."""
    slot = manager.slot(1)
    sem = slot.native.create_timeline(0)
    r = ReferenceRenderer(slot)
    sru = ReferenceSRU(3, 40, 30, seed=9, iterations=16)
    t = r.make_target(sru)
    try:
        point = r.render(sru, t, wait=TimelinePoint(sem, 1, slot.index))
        assert point.device_index == 1 and point.value >= 1
        assert slot.native.timeline_value(point.semaphore) < point.value
        vk.vkSignalSemaphore(slot.device, vk.VkSemaphoreSignalInfo(
            sType=vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, semaphore=vk.ffi.cast("VkSemaphore", sem), value=1))
        r.wait(point, timeout=60)
        np.testing.assert_array_equal(t.download(), render_pixels(manager.slot(0), sru))
    finally:
        t.destroy()
        r.destroy()
        vk.vkDestroySemaphore(slot.device, vk.ffi.cast("VkSemaphore", sem), None)


def test_renderers_on_both_devices_run_at_once(manager):
    """Submit on both devices, then wait: the results match sequential renders."""
    rs = [ReferenceRenderer(manager.slot(i)) for i in range(2)]
    srus = [ReferenceSRU(i, 80 + i, 50, seed=100 + i, iterations=32) for i in range(6)]
    targets = [rs[i % 2].make_target(s) for i, s in enumerate(srus)]
    try:
        points = [rs[i % 2].render(s, targets[i]) for i, s in enumerate(srus)]
        for i, p in enumerate(points):
            rs[i % 2].wait(p, timeout=60)
        for i, s in enumerate(srus):
            np.testing.assert_array_equal(targets[i].download(), render_pixels(manager.slot(0), s))
    finally:
        for t in targets:
            t.destroy()
        for r in rs:
            r.destroy()


def test_many_renders_recycle_command_buffers(manager):
    slot = manager.slot(0)
    r = ReferenceRenderer(slot)
    sru = ReferenceSRU(1, 16, 16, iterations=2)
    t = r.make_target(sru)
    try:
        for _ in range(150):        # more than the in-flight cap
            p = r.render(sru, t)
        r.wait(p, timeout=60)
        assert r.last == p
    finally:
        t.destroy()
        r.destroy()
    r.destroy()   # idempotent
    with pytest.raises(DestroyedError):
        r.render(sru, t)


@pytest.mark.parametrize("kw, exc", [
    (dict(width=0), ValueError), (dict(height=-3), ValueError), (dict(width=1.5), ValueError),
    (dict(iterations=0), ValueError), (dict(iterations=1 << 30), ValueError), (dict(seed=-1), ValueError),
    (dict(seed=2**32), ValueError), (dict(color_a=(1, 2)), ValueError), (dict(color_b="red"), TypeError),
    (dict(color_a=(1, float("nan"), 0)), ValueError), (dict(color_a=5), TypeError), (dict(border=-1), ValueError),
    (dict(border=2**32), ValueError),   # the push constants hold it as a uint32
    (dict(x=1.0), TypeError), (dict(sru_id=1.5), TypeError), (dict(sru_id=None), TypeError),
])
def test_sru_bad_input(kw, exc):
    args = dict(sru_id=1, width=8, height=8)
    args.update(kw)
    with pytest.raises(exc):
        ReferenceSRU(**args)


def test_render_bad_input(manager):
    r = ReferenceRenderer(manager.slot(0))
    sru = ReferenceSRU(1, 32, 16)
    good = r.make_target(sru)
    wrong_size = Image(manager.slot(0), 16, 16, usage=SRU_IMAGE_USAGE)
    no_storage = Image(manager.slot(0), 32, 16, usage=IMAGE_USAGE, kernel_copies=False)
    other_dev = Image(manager.slot(1), 32, 16, usage=SRU_IMAGE_USAGE)
    try:
        with pytest.raises(ValueError, match="16x16"):
            r.render(sru, wrong_size)
        with pytest.raises(ValueError, match="STORAGE"):
            r.render(sru, no_storage)
        with pytest.raises(ValueError, match="GPU 1"):
            r.render(sru, other_dev)
        with pytest.raises(TypeError, match="ReferenceSRU"):
            r.render(object(), good)
        with pytest.raises(TypeError, match="Image"):
            r.render(sru, 1234)
        with pytest.raises(ValueError, match="GPU 1"):
            r.render(sru, good, wait=TimelinePoint(1, 1, 1))
        with pytest.raises(TypeError):
            r.render(sru, good, wait=[(1, 1)])
        with pytest.raises(ValueError, match="not signalled"):
            r.wait(TimelinePoint(1, 1, 0))
        r.wait(r.render(sru, good), timeout=60)   # still usable after all that
    finally:
        for img in (good, wrong_size, no_storage, other_dev):
            img.destroy()
        r.destroy()
    with pytest.raises(DestroyedError):
        r.render(sru, good)


def _solid(slot, w, h, rgba):
    img = Image(slot, w, h, usage=SRU_IMAGE_USAGE)
    px = np.empty((h, w, 4), np.float16)
    px[:] = rgba
    img.upload(px)
    return img


def _pixels(img):
    return img.download().view(np.float16).reshape(img.height, img.width, 4)


def test_compositor_places_exactly(manager):
    slot = manager.slot(0)
    c = Compositor(slot)
    rng = np.random.default_rng(3)
    src = Image(slot, 20, 10, usage=SRU_IMAGE_USAGE)
    pattern = rng.random((10, 20, 4)).astype(np.float16)
    src.upload(pattern)
    frame = Image(slot, 64, 32)
    try:
        c.wait(c.composite(frame, [(src, 5, 7), (src, 50, 25)], clear=(0.25, 0.5, 0.75, 1.0)), timeout=60)
        f = _pixels(frame)
        np.testing.assert_array_equal(f[7:17, 5:25], pattern)
        np.testing.assert_array_equal(f[25:32, 50:64], pattern[:7, :14])          # clipped at the edges
        assert (f[0, 0] == np.array([0.25, 0.5, 0.75, 1.0], np.float16)).all()
        assert (f[20, 40] == np.array([0.25, 0.5, 0.75, 1.0], np.float16)).all()
        c.wait(c.composite(frame, [(src, -10, -5)], clear=None), timeout=60)      # draws over, clipped
        f2 = _pixels(frame)
        np.testing.assert_array_equal(f2[0:5, 0:10], pattern[5:10, 10:20])
        np.testing.assert_array_equal(f2[7:17, 10:25], pattern[:, 5:20])         # the rest stayed
    finally:
        src.destroy()
        frame.destroy()
        c.destroy()


def test_compositor_honours_content_scale(manager):
    slot = manager.slot(0)
    c = Compositor(slot, content_scale=(2.0, 1.5))
    a = _solid(slot, 8, 4, (1.0, 0.0, 0.0, 1.0))
    b = _solid(slot, 4, 4, (0.0, 1.0, 0.0, 1.0))
    frame = Image(slot, 40, 20)
    try:
        c.wait(c.composite(frame, [(a, 0, 0), (b, 10, 6)]), timeout=60)
        f = _pixels(frame)
        red, green, black = (np.array(v, np.float16) for v in ((1, 0, 0, 1), (0, 1, 0, 1), (0, 0, 0, 1)))
        assert (f[0:6, 0:16] == red).all()                 # 8x4 at scale (2, 1.5) -> 16x6
        assert (f[6:9, 0:16] == black).all() and (f[0:6, 16:20] == black).all()
        assert (f[9:15, 20:28] == green).all()             # (10, 6) -> (20, 9), 4x4 -> 8x6
        assert (f[15:, 20:28] == black).all()
    finally:
        for img in (a, b, frame):
            img.destroy()
        c.destroy()


def test_compositor_bad_input(manager):
    slot = manager.slot(0)
    with pytest.raises(ValueError, match="content_scale"):
        Compositor(slot, content_scale=(0, 1))
    with pytest.raises(TypeError, match="content_scale"):
        Compositor(slot, content_scale="big")
    c = Compositor(slot)
    src = Image(slot, 4, 4, usage=SRU_IMAGE_USAGE)
    frame = Image(slot, 8, 8)
    other = Image(manager.slot(1), 8, 8)
    try:
        with pytest.raises(ValueError, match="GPU 1"):
            c.composite(other, [(src, 0, 0)])
        with pytest.raises(ValueError, match="GPU 1"):
            c.composite(frame, [(other, 0, 0)])
        with pytest.raises(TypeError, match="placement 0"):
            c.composite(frame, [(src, 0)])
        with pytest.raises(TypeError, match="x must be an int"):
            c.composite(frame, [(src, 0.5, 0)])
        with pytest.raises(ValueError, match="frame itself"):
            c.composite(frame, [(frame, 0, 0)])
        with pytest.raises(ValueError, match="clear"):
            c.composite(frame, [(src, 0, 0)], clear=(1, 1, 1))
        with pytest.raises(TypeError, match="Image"):
            c.composite("frame", [])
        c.wait(c.composite(frame, []), timeout=60)   # nothing to place: just the clear
    finally:
        for img in (src, frame, other):
            img.destroy()
        c.destroy()


def test_compositor_refuses_formats_a_blit_cannot_convert(manager):
    """A float image placed into an integer frame (or the reverse) is invalid Vulkan for
    vkCmdBlitImage: refused with ValueError before any command is recorded."""
    slot = manager.slot(0)
    c = Compositor(slot)
    src = Image(slot, 4, 4, usage=SRU_IMAGE_USAGE)
    uint_frame = Image(slot, 8, 8, vk.VK_FORMAT_R32_UINT)
    uint_src = Image(slot, 4, 4, vk.VK_FORMAT_R32_UINT)
    frame = Image(slot, 8, 8)
    try:
        with pytest.raises(ValueError, match="R32_UINT"):
            c.composite(uint_frame, [(src, 0, 0)])
        with pytest.raises(ValueError, match="R32_UINT"):
            c.composite(frame, [(uint_src, 0, 0)])
        with pytest.raises(ValueError, match="beyond any frame"):
            c.composite(frame, [(src, 10**400, 0)])
        c.wait(c.composite(uint_frame, [(uint_src, 2, 2)]), timeout=60)   # integer into integer: fine
        c.wait(c.composite(frame, [(src, 0, 0)]), timeout=60)             # still usable
    finally:
        for img in (src, uint_frame, uint_src, frame):
            img.destroy()
        c.destroy()
