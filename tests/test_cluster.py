"""vkmulti.cluster: planning and compositing (no Ray), the node agent in-process, and a local
Ray cluster of a head and two worker nodes, each with the virtual lavapipe pair.

The cluster tests share one Ray cluster per test session (every address on
127.0.0.1, small object stores). They skip when Ray is not installed, and
when VKMULTI_SKIP_CLUSTER=1 or the run is under AddressSanitizer (LD_PRELOAD
holding libasan: Ray's own binaries would load it too).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

# Ray would turn 127.0.0.1 into this machine's external address (unreachable here): keep it on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from vkmulti import MultiDeviceManager, ReferenceRenderer, ReferenceSRU, SRUOffloadCoordinator  # noqa: E402
from vkmulti.cluster import (ClusterAddressError, ClusterConnectionError, ClusterError, LinkInfo,  # noqa: E402
                             NodeAgent, NodeInfo, RayMissingError, composite_frame, parse_address, plan_nodes)
from vkmulti.offload import make_srus  # noqa: E402
from vkmulti.errors import DeviceLostError  # noqa: E402
from vkmulti import Image  # noqa: E402
from vkmulti.offload import Compositor  # noqa: E402

HAVE_RAY = importlib.util.find_spec("ray") is not None
SKIP_CLUSTER = os.environ.get("VKMULTI_SKIP_CLUSTER") == "1" or "asan" in os.environ.get("LD_PRELOAD", "")
cluster = pytest.mark.skipif(SKIP_CLUSTER or not HAVE_RAY,
                             reason="Ray is not installed (pip install 'vkmulti[cluster]')" if not HAVE_RAY else
                             "cluster tests off (VKMULTI_SKIP_CLUSTER=1 or ASan run)")

W, H = 384, 256


def single_machine_frame(srus, width=W, height=H):
    """The frame as vkmulti renders it on this machine's GPUs alone (SRUOffloadCoordinator)."""
    with MultiDeviceManager.create(enabled=True) as mgr:
        frame = Image(mgr.primary, width, height)
        co = SRUOffloadCoordinator(mgr, secondary_renderer_factory=lambda ctx: ReferenceRenderer(ctx.slot))
        try:
            co.render_frame(srus, frame)
            return frame.download()
        finally:
            co.destroy()
            frame.destroy()


def stencil_problem(h, w, seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 1 << 24, size=(h, w), dtype=np.int32), rng.integers(0, 1 << 24, size=w, dtype=np.int32),
            np.zeros(w, np.int32))


@pytest.fixture(scope="module")
def srus():
    return make_srus(12, W, H)


@pytest.fixture(scope="module")
def reference(srus):
    return single_machine_frame(srus)


# -- addresses and a missing Ray ---------------------------------------------------------------

@pytest.mark.parametrize("text,kind,host,port", [
    ("auto", "auto", None, None), ("127.0.0.1:6379", "gcs", "127.0.0.1", 6379),
    ("ray://head.example:10001", "client", "head.example", 10001), ("[::1]:6379", "gcs", "::1", 6379),
])
def test_parse_address(text, kind, host, port):
    a = parse_address(text)
    assert (a.kind, a.host, a.port) == (kind, host, port)
    assert str(parse_address(str(a))) == str(a)


@pytest.mark.parametrize("bad", ["", "head", "head:", ":6379", "head:port", "head:0", "head:70000",
                                 "http://head:80", "head:6379/x", "a b:1", "[::1]6379",
                                 "head:\u00b2", "head:\u0661\u0662\u0663", "head:" + "1" * 5000,
                                 "head:" + "0" * 5000])
def test_bad_address_names_it(bad):
    with pytest.raises(ClusterAddressError, match="bad Ray address") as e:
        parse_address(bad)
    assert repr(bad)[:100] in str(e.value) and isinstance(e.value, ValueError)


def test_address_must_be_a_str():
    with pytest.raises(ClusterAddressError, match="must be a str"):
        parse_address(6379)


def test_missing_ray_says_how_to_install(monkeypatch, capsys):
    from vkmulti.apps import cli
    from vkmulti.cluster import ClusterManager, connect

    monkeypatch.setitem(sys.modules, "ray", None)        # `import ray` now fails as if not installed
    for call in (lambda: connect("auto"), lambda: ClusterManager()):
        with pytest.raises(RayMissingError, match=r"pip install 'vkmulti\[cluster\]'") as e:
            call()
        assert isinstance(e.value, ImportError)
    assert cli.main(["demo", "--ray", "127.0.0.1:6379", "--output", ""]) == 2
    assert "pip install 'vkmulti[cluster]'" in capsys.readouterr().err


# -- level-1 planning and the driver's composite -------------------------------------------------

def _node(name, throughput, local=False, gpus=2):
    return NodeInfo(name, "10.0.0." + name[-1], name, ("gpu",) * gpus, (throughput / gpus,) * gpus, local=local)


def test_plan_weights_nodes_by_throughput_and_link(srus):
    fast, slow = _node("n1", 3e9), _node("n2", 1e9)
    links = {n.node_id: LinkInfo(n.node_id, "driver", 1e12, 0.0) for n in (fast, slow)}
    plan = plan_nodes(srus, [slow, fast], links)
    cost = {n: sum(s.render_cost for s in v) for n, v in plan.srus.items()}
    assert sorted(s.sru_id for v in plan.srus.values() for s in v) == [s.sru_id for s in srus]
    assert cost["n1"] > 2 * cost["n2"]                  # ~3x the throughput, ~3x the work
    # a slow network keeps the work on the driver's own node
    local = _node("n0", 1e9, local=True)
    links_slow = {"n1": LinkInfo("n1", "driver", 1e3, 0.5)}
    plan = plan_nodes(srus, [_node("n1", 3e9), local], links_slow)
    assert len(plan.srus["n0"]) == len(srus) and not plan.srus["n1"]
    assert plan.predicted["n0"] == pytest.approx(sum(s.render_cost for s in srus) / 1e9)
    # two remote nodes alike but for their links: the better-connected one takes more
    a, b = _node("n1", 1e9), _node("n2", 1e9)
    links = {"n1": LinkInfo("n1", "driver", 1e9, 0.0), "n2": LinkInfo("n2", "driver", 2e6, 0.0)}
    plan = plan_nodes(srus, [a, b], links)
    assert len(plan.srus["n1"]) > len(plan.srus["n2"])
    assert plan.predicted["n2"] == pytest.approx(sum(s.render_cost / 1e9 + s.width * s.height * 8 / 2e6
                                                     for s in plan.srus["n2"]))


@pytest.mark.parametrize("t_small, t_big", [(2e-3, 1e-3), (1e-3, 1e-3), (1e-3, 0.0)])
def test_a_link_timed_in_noise_is_never_infinitely_fast(t_small, t_big):
    """A big object no slower than the small one (a loaded machine): a finite bandwidth, not the
    infinite one that stands for the same node's shared memory."""
    from vkmulti.cluster.manager import _fit_link
    link = _fit_link("a", "b", 1024, t_small, 8 << 20, t_big)
    assert 0 < link.bandwidth < math.inf and link.latency >= 0
    fitted = _fit_link("a", "b", 1024, 1e-3, 8 << 20, 9e-3)
    assert fitted.bandwidth == pytest.approx(((8 << 20) - 1024) / 8e-3) and fitted.latency > 0


def test_plan_rejects_bad_input(srus):
    with pytest.raises(ValueError, match="no node"):
        plan_nodes(srus, [], {})
    with pytest.raises(ValueError, match="no measured link"):
        plan_nodes(srus, [_node("n1", 1e9), _node("n2", 1e9)], {"n1": LinkInfo("n1", "driver", 1e9, 0.0)})
    assert LinkInfo("a", "driver", math.inf, 0.001).seconds(10**9) == 0.001


class _FakeRay:
    """What frames.render_frame uses of Ray: every call answered at once."""

    class exceptions:   # noqa: N801 - Ray's spelling
        RayError, GetTimeoutError = RuntimeError, TimeoutError

    def wait(self, pending, num_returns=1, timeout=None):
        return pending[:1], pending[1:]

    def get(self, ref, timeout=None):
        return ref()


def _frame_result(group):
    return {"images": {s.sru_id: np.zeros((s.height, s.width, 8), np.uint8) for s in group},
            "gpu": {s.sru_id: 0 for s in group}, "render_s": 0.01, "readback_s": 0.01, "total_s": 0.02,
            "predicted_s": 0.02}


@pytest.mark.parametrize("spoil", [
    lambda r: r.update(render_s=math.nan), lambda r: r.update(predicted_s=-1.0),
    lambda r: r.update(readback_s="0.1"), lambda r: r["images"].popitem(),
    lambda r: r["images"].update({k: np.zeros((1, 1, 8), np.uint8) for k in r["images"]}),
    lambda r: r["gpu"].update({k: None for k in r["gpu"]}), lambda r: r.clear()])
def test_a_node_sending_a_malformed_result_is_lost_and_its_srus_replanned(spoil):
    """What an agent sends back is checked before use: a bad time would poison the node's
    throughput for every later frame, a bad image would fail or spoil the composite."""
    from types import SimpleNamespace

    from vkmulti.cluster.frames import render_frame

    def agent(bad):
        def render(group):
            r = _frame_result(group)
            if bad:
                spoil(r)
            return lambda: r
        return SimpleNamespace(render=SimpleNamespace(remote=render))
    nodes = {n: NodeInfo(n, "10.0.0.1", n, ("gpu",), (1.0,)) for n in ("good", "bad")}
    cm = SimpleNamespace(_ray=_FakeRay(), lost={}, timeout=5.0, adapt=0.3, nodes=dict(nodes),
                         links={n: LinkInfo(n, "driver", 1e9, 1e-4) for n in nodes},
                         _calibrated={n: (1.0,) for n in nodes},
                         _agents={"good": agent(False), "bad": agent(True)})
    cm._lose = lambda node_id, why, frame=None: (cm.lost.__setitem__(node_id, why), frame.lost.__setitem__(node_id, why))
    srus = [ReferenceSRU(k, 8, 8, x=8 * k) for k in range(4)]
    frame = render_frame(cm, srus, 32, 8, (0, 0, 0, 1), list(nodes.values()), None)
    assert list(frame.lost) == ["bad"] and "malformed result" in frame.lost["bad"]
    assert sorted(frame.nodes["good"].srus) == [0, 1, 2, 3] and frame.pixels.shape == (8, 32, 8)
    assert cm.nodes["good"].throughput > 0 and math.isfinite(cm.nodes["good"].throughput)


@pytest.mark.parametrize("spoil", [lambda s: np.vstack([s, s[:1]]), lambda s: s.astype(np.int64), lambda s: "x"])
def test_a_node_sending_a_malformed_stencil_slab_is_lost(spoil):
    """A slab of the wrong shape or type is the node's failure (the run goes on from the last
    checkpoint without it), never stacked into the field. The stand-in agents keep their slab."""
    from types import SimpleNamespace as NS

    from vkmulti.cluster.stencil_run import run_stencil

    def agent(bad):
        me = NS(slab=None)
        call = lambda fn: NS(remote=lambda *a: (lambda v=fn(*a): lambda: v)())   # noqa: E731
        me.stencil_setup = call(lambda slab, *_: (setattr(me, "slab", slab.copy()), {0: len(slab)})[1])
        me.stencil_step = NS(options=lambda num_returns: NS(remote=lambda *_: (lambda: me.slab[0], lambda: me.slab[-1])))
        me.stencil_field = call(lambda: spoil(me.slab.copy()) if bad else me.slab.copy())
        me.stencil_teardown = me.ping = call(lambda: None)
        return me
    cm = NS(_ray=_FakeRay(), lost={}, timeout=5.0, _pids={}, _agents={"good": agent(False), "bad": agent(True)},
            nodes={n: NodeInfo(n, "10.0.0.1", n, ("gpu",), (1.0,)) for n in ("good", "bad")})
    cm._usable = lambda nodes: [i for n, i in cm.nodes.items() if n not in cm.lost]
    cm._gather = lambda refs, timeout, what: {v: r() for r, v in refs.items()}
    cm._lose = lambda node_id, why: cm.lost.__setitem__(node_id, why)
    f = np.arange(40, dtype=np.int32).reshape(8, 5)
    run = run_stencil(cm, f, np.zeros(5, np.int32), np.zeros(5, np.int32), 4, checkpoint_every=2)
    assert list(cm.lost) == ["bad"] and "malformed slab" in cm.lost["bad"]
    assert run.field.dtype == np.int32 and np.array_equal(run.field, f)


def test_composite_matches_the_gpu_compositor(manager):
    """composite_frame places images exactly as vkmulti.Compositor does (overlaps, clipping)."""
    srus = [ReferenceSRU(0, 40, 30, x=-10, y=-5, seed=1, iterations=4), ReferenceSRU(1, 50, 40, x=20, y=10, seed=2,
            iterations=4), ReferenceSRU(2, 30, 30, x=W - 20, y=H - 12, seed=3, iterations=4),
            ReferenceSRU(3, 10, 10, x=W + 5, y=0, seed=4, iterations=4)]
    renderer, comp = ReferenceRenderer(manager.primary), Compositor(manager.primary)
    frame = Image(manager.primary, W, H)
    targets = [renderer.make_target(s) for s in srus]
    try:
        points = [renderer.render(s, t) for s, t in zip(srus, targets)]
        comp.wait(comp.composite(frame, [(t, s.x, s.y) for s, t in zip(srus, targets)], wait=points,
                                 clear=(0.25, 0.5, 0.75, 1.0)))
        images = [t.download() for t in targets]
        ours = composite_frame(W, H, [(img, s.x, s.y) for s, img in zip(srus, images)], (0.25, 0.5, 0.75, 1.0))
        assert np.array_equal(ours, frame.download())
    finally:
        for obj in targets + [frame, comp, renderer]:
            obj.destroy()


@pytest.mark.parametrize("height,weights,rows", [
    (10, [1, 3], [3, 7]), (2, [1, 1, 1], [1, 1, 0]), (7, [1, 1, 1], [3, 2, 2]), (5, [100, 1], [4, 1]),
    (1, [1, 5], [0, 1]),
])
def test_split_rows_weighted(height, weights, rows):
    from vkmulti.cluster import split_rows_weighted

    parts = split_rows_weighted(height, weights)
    assert [n for _, n in parts] == rows
    assert [r0 for r0, _ in parts] == [sum(rows[:i]) for i in range(len(rows))]


def test_split_rows_weighted_rejects_bad_input():
    from vkmulti.cluster import split_rows_weighted

    for h, w in ((0, [1]), (3, []), (3, [1, 0]), (3, [float("nan")])):
        with pytest.raises(ValueError):
            split_rows_weighted(h, w)


def test_stencil_slabs_in_one_process_match_numpy(manager):
    """Two StencilSlabs (two 'nodes', each over both GPUs) exchanging edge rows by hand."""
    from vkmulti.cluster import StencilSlab
    from vkmulti.kernels.reference import jacobi_reference

    field, top, bottom = stencil_problem(24, 70, 2)
    a = StencilSlab(manager, field[:10], top, field[10], [1, 1], payload_size=128)
    b = StencilSlab(manager, field[10:], field[9], bottom, [1, 2], payload_size=128)
    try:
        ra = rb = (None, None)
        for _ in range(9):
            ra, rb = a.step(None, rb[0]), b.step(ra[1], None)
        assert np.array_equal(np.vstack([a.field(), b.field()]), jacobi_reference(field, top, bottom, 9))
        assert a.gpu_rows == {0: 5, 1: 5} and b.gpu_rows == {0: 5, 1: 9}
        assert a.router.batches > 0            # halo rows between the node's two GPUs took the GPU path
    finally:
        a.destroy()
        b.destroy()


@pytest.mark.parametrize("spoil", [lambda r: r.astype(np.float64) + np.nan, lambda r: r.astype(np.int64) << 40,
                                   lambda r: r[:-1], lambda r: np.concatenate([r, r]), lambda r: r.tolist(),
                                   lambda r: "row"])
def test_a_malformed_halo_row_from_a_neighbouring_node_is_refused(manager, spoil):
    """A neighbour's edge row is a peer's data: before, any array was cast to int32 and
    reshaped, so NaNs or 64-bit values went into the field as garbage without an error."""
    from vkmulti.cluster import ClusterError, StencilSlab
    from vkmulti.kernels.reference import jacobi_reference

    field, top, bottom = stencil_problem(12, 40, 3)
    a = StencilSlab(manager, field[:6], top, field[6], [1, 1], payload_size=128)
    b = StencilSlab(manager, field[6:], field[5], bottom, [1], payload_size=128)
    try:
        ra, rb = a.step(None, None), b.step(None, None)
        with pytest.raises(ClusterError, match="halo row from the neighbouring node"):
            a.step(None, spoil(rb[0]))
        for _ in range(3):
            ra, rb = a.step(None, rb[0]), b.step(ra[1], None)
        assert np.array_equal(np.vstack([a.field(), b.field()]), jacobi_reference(field, top, bottom, 4))
    finally:
        a.destroy()
        b.destroy()


# -- the node agent in-process -------------------------------------------------------------------

def test_agent_in_process_renders_the_same_frame(srus, reference):
    agent = NodeAgent()
    try:
        d = agent.describe()
        assert d["error"] is None and len(d["devices"]) == 2
        assert all(t > 0 for t in agent.measure_throughput(repeats=1))
        r = agent.render(srus)
        assert set(r["gpu"].values()) == {0, 1}          # both GPUs of the node took part
        pixels = composite_frame(W, H, [(r["images"][s.sru_id], s.x, s.y) for s in srus])
        assert np.array_equal(pixels, reference)
        assert agent.validation_errors() == []
    finally:
        agent.shutdown()


def test_agent_renders_a_failed_gpus_srus_on_the_others(srus, reference):
    agent = NodeAgent()
    try:
        agent.render(srus[:2])                           # renderers exist now
        broken = agent._renderer(1)

        def lost(*a, **k):
            raise DeviceLostError(-4, "vkQueueSubmit")
        broken.render = lost
        r = agent.render(srus)
        assert set(r["gpu"].values()) == {0} and 1 in r["lost_gpus"]
        pixels = composite_frame(W, H, [(r["images"][s.sru_id], s.x, s.y) for s in srus])
        assert np.array_equal(pixels, reference)
    finally:
        agent.shutdown()


def test_agent_devices_from_the_node_environment(monkeypatch):
    monkeypatch.setenv("VKMULTI_AGENT_DEVICES", "1")
    agent = NodeAgent()
    try:
        assert [d["index"] for d in agent.describe()["devices"]] == [0]     # one slot: physical device 1
    finally:
        agent.shutdown()
    monkeypatch.setenv("VKMULTI_AGENT_DEVICES", "0,x")
    agent = NodeAgent()
    assert "VKMULTI_AGENT_DEVICES='0,x'" in agent.describe()["error"]
    agent.shutdown()


def test_agent_without_vulkan_reports_why(monkeypatch):
    monkeypatch.setenv("VK_DRIVER_FILES", "/nonexistent/vkmulti-none.json")
    monkeypatch.setenv("VK_ICD_FILENAMES", "/nonexistent/vkmulti-none.json")
    agent = NodeAgent()
    assert agent.describe()["error"].startswith("no Vulkan device")
    with pytest.raises(ClusterError, match="no usable Vulkan device"):
        agent.render([])
    agent.shutdown()


# -- a local Ray cluster: head + two workers ---------------------------------------------------------

NODE = dict(node_ip_address="127.0.0.1", num_cpus=1, resources={"vk_gpu": 2}, object_store_memory=80 * 2**20)


@pytest.fixture(scope="module")
def ray_cluster():
    """A head and two worker nodes on 127.0.0.1, each offering the virtual pair as vk_gpu=2 (for this
    module's tests only: the later tests get the machine's cores and a process without Ray's threads)."""
    if SKIP_CLUSTER or not HAVE_RAY:
        pytest.skip("no Ray, or cluster tests off")
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
    try:
        workers = [c.add_node(**NODE) for _ in range(2)]
        ray.init(address=c.address, log_to_driver=False)
        c.wait_for_nodes(timeout=60)
        yield c, workers
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="class")
def cluster_manager(ray_cluster):
    """One manager for the tests of a class (a manager holds every node's vk_gpu until destroyed)."""
    from vkmulti.cluster import ClusterManager

    cm = ClusterManager(timeout=60.0, link_bytes=4 * 2**20)
    yield cm
    cm.destroy()


@cluster
class TestOneManager:
    def test_cluster_frame_is_the_single_machine_frame(self, cluster_manager, srus, reference):
        cm = cluster_manager
        assert len(cm.nodes) == 3 and not cm.skipped
        assert sum(n.local for n in cm.nodes.values()) == 1
        assert all(len(n.devices) == 2 and n.throughput > 0 for n in cm.nodes.values())
        # each agent measured its GPUs' topology (vkmulti.kernels)
        assert all({(g["source"], g["destination"]) for g in n.gpu_links()} == {(0, 1), (1, 0)}
                   for n in cm.nodes.values())
        remote = [n for n, i in cm.nodes.items() if not i.local]
        assert all(0 < cm.links[n].bandwidth < math.inf for n in remote)
        f = cm.render_frame(srus, W, H, nodes=None)
        assert np.array_equal(f.pixels, reference)
        assert sorted(i for r in f.nodes.values() for i in r.srus) == sorted(s.sru_id for s in srus)
        # several nodes rendered, and inside a node its share was split over its GPUs
        assert len(f.nodes) >= 2 and not f.replanned and not f.lost
        assert len({(n, g) for n, r in f.nodes.items() for g in r.gpu.values()}) > len(f.nodes)
        assert f.bytes_moved > 0 and f.bytes_zero_copy > 0
        assert f.bytes_moved + f.bytes_zero_copy == sum(s.width * s.height * 8 for s in srus)
        # one node alone gives the same frame
        g = cm.render_frame(srus, W, H, nodes=remote[:1])
        assert list(g.nodes) == remote[:1] and np.array_equal(g.pixels, reference)
        assert cm.validation_errors() == {n: [] for n in cm.nodes}

    def test_stencil_across_nodes_is_identical(self, cluster_manager):
        """Row slabs on three nodes (and on one): halo rows agent to agent, bit-identical result."""
        from vkmulti.kernels.reference import jacobi_reference

        field, top, bottom = stencil_problem(40, 150, 5)
        want = jacobi_reference(field, top, bottom, 21)
        run = cluster_manager.run_stencil(field, top, bottom, 21, checkpoint_every=8)
        assert np.array_equal(run.field, want)
        assert len(run.nodes) == 3 and not run.restarts
        assert sum(v["rows"][1] for v in run.nodes.values()) == 40
        assert all(sum(v["gpu_rows"].values()) == v["rows"][1] for v in run.nodes.values())
        assert all(len(v["gpu_rows"]) == 2 for v in run.nodes.values())   # two GPUs per node: the router's path
        assert run.halo_bytes_per_step == 2 * 2 * 150 * 4
        local = [n for n, i in cluster_manager.nodes.items() if i.local]
        one = cluster_manager.run_stencil(field, top, bottom, 21, nodes=local)
        assert list(one.nodes) == local and np.array_equal(one.field, want) and one.halo_bytes_per_step == 0
        assert np.array_equal(cluster_manager.run_stencil(field, top, bottom, 0).field, field)
        assert cluster_manager.validation_errors() == {n: [] for n in cluster_manager.nodes}

    def test_bad_input_is_the_callers_error_not_a_lost_node(self, cluster_manager, srus, reference):
        cm = cluster_manager
        huge = ReferenceSRU(99, 70000, 8, iterations=1)          # past any GPU's image extent (16384-32768)
        with pytest.raises(ValueError, match="maximum image extent"):
            cm.render_frame([huge], 64, 64)
        with pytest.raises(TypeError, match="ReferenceSRU"):
            cm.render_frame(["not an sru"], 64, 64)
        with pytest.raises(ValueError, match="unknown node id"):
            cm.render_frame(srus, W, H, nodes=["nope"])
        field, top, bottom = stencil_problem(8, 40, 1)
        with pytest.raises(ValueError, match="payload_size"):
            cm.run_stencil(field, top, bottom, 3, payload_size=20)
        with pytest.raises(TypeError, match="int32"):
            cm.run_stencil(field.astype(np.float32), top, bottom, 3)
        assert not cm.lost
        assert np.array_equal(cm.render_frame(srus, W, H).pixels, reference)

    def test_node_links_are_measured(self, cluster_manager):
        links = cluster_manager.measure_node_links(2 * 2**20)
        assert len(links) == 6
        assert all(ln.bandwidth > 0 and ln.latency >= 0 for ln in links.values())


@cluster
def test_agents_lost_mid_run_frames_complete_identically(ray_cluster, srus, reference):
    """One worker's agent is killed while it renders, the other's hangs: both frames still
    complete, identical, on the nodes that are left."""
    from vkmulti.cluster import ClusterManager

    cm = ClusterManager(timeout=3.0, measure=False)      # equal weights: every node gets work
    killed, hung = sorted(n for n, i in cm.nodes.items() if not i.local)
    stopped = []
    try:
        def fail(rnd, plan):
            victim = hung if killed in cm.lost else killed
            if rnd == 0 and victim not in cm.lost and victim not in stopped:
                assert plan.srus[victim], "the victim had no work to fail in the middle of"
                os.kill(cm.agent_pid(victim), signal.SIGKILL if victim == killed else signal.SIGSTOP)
                if victim == hung:
                    stopped.append(victim)
        frames = [cm.render_frame(srus, W, H, on_dispatch=fail) for _ in range(3)]
        for f in frames:
            assert np.array_equal(f.pixels, reference)
        assert set(cm.lost) == {killed, hung}
        assert "did not answer within 3 s" in cm.lost[hung]
        assert set(frames[-1].nodes) == set(cm.nodes) - {killed, hung}
        moved = {n for f in frames for n in f.replanned.values()}
        assert moved == {killed, hung}                   # their SRUs went to the node that is left
        assert set(cm.plan(srus).srus) == set(cm.nodes) - {killed, hung}
    finally:
        if stopped:
            os.kill(cm.agent_pid(hung), signal.SIGCONT)
        cm.destroy()


@cluster
def test_stencil_survives_a_killed_agent(ray_cluster):
    """An agent dies in the second run of steps: the run goes back to the checkpoint, re-splits
    the rows over the two nodes left and ends with the same field."""
    from vkmulti.cluster import ClusterManager
    from vkmulti.kernels.reference import jacobi_reference

    field, top, bottom = stencil_problem(30, 96, 8)
    cm = ClusterManager(timeout=30.0, measure=False)
    try:
        victim = next(n for n, i in cm.nodes.items() if not i.local)

        def kill(first_step, split):
            if first_step == 6 and victim not in cm.lost:
                assert split[victim][1] > 0
                os.kill(cm.agent_pid(victim), signal.SIGKILL)
        run = cm.run_stencil(field, top, bottom, 15, checkpoint_every=6, on_dispatch=kill)
        assert np.array_equal(run.field, jacobi_reference(field, top, bottom, 15))
        assert [r["from_step"] for r in run.restarts] == [6] and victim in run.restarts[0]["lost"]
        assert victim in cm.lost and victim not in run.nodes and len(run.nodes) == 2
    finally:
        cm.destroy()


@cluster
def test_node_without_vulkan_is_skipped_with_a_message(ray_cluster, srus, reference, caplog, monkeypatch):
    from vkmulti.cluster import ClusterManager

    c, _ = ray_cluster
    bad = c.add_node(**dict(NODE, resources={"vk_gpu": 1},
                            env_vars={"VK_DRIVER_FILES": "/nonexistent/none.json",
                                      "VK_ICD_FILENAMES": "/nonexistent/none.json"}))
    try:
        c.wait_for_nodes(timeout=60)
        import ray

        # and a (pretend) CPU-only node that offers no vk_gpu at all
        real_nodes = ray.nodes
        cpu_only = {"Alive": True, "NodeID": "c" * 56, "NodeManagerAddress": "127.0.0.9", "Resources": {"CPU": 4.0}}
        monkeypatch.setattr(ray, "nodes", lambda: real_nodes() + [cpu_only])
        with caplog.at_level("WARNING", logger="vkmulti.cluster.manager"):
            cm = ClusterManager(timeout=60.0, measure=False, topology=False)
        try:
            assert len(cm.nodes) == 3 and len(cm.skipped) == 2
            label, why = next((k, v) for k, v in cm.skipped.items() if bad.node_id[:8] in k)
            assert "127.0.0.1" in label
            assert why.startswith("no Vulkan device") and "VK_ERROR_INCOMPATIBLE_DRIVER" in why
            assert f"{label} skipped: {why}" in caplog.text
            assert "offers no vk_gpu resource" in cm.skipped["node cccccccc (127.0.0.9)"]
            assert np.array_equal(cm.render_frame(srus, W, H).pixels, reference)
        finally:
            cm.destroy()
    finally:
        c.remove_node(bad)


@cluster
def test_unreachable_address_fails_fast(ray_cluster):
    from vkmulti.cluster import ClusterManager, connect

    import ray

    ray.shutdown()         # connect() reuses a live connection; ask it about a dead address instead
    try:
        with pytest.raises(ClusterConnectionError, match=r"no Ray cluster at 127\.0\.0\.1:1: .*'auto'"):
            connect("127.0.0.1:1", timeout=5)
        with pytest.raises(ClusterError, match=r"not connected to Ray: call vkmulti\.cluster\.connect"):
            ClusterManager()
    finally:
        ray.init(address=ray_cluster[0].address, log_to_driver=False)


@cluster
def test_demo_cli_on_the_cluster(ray_cluster, capsys):
    from vkmulti.apps import cli
    from vkmulti.apps.cluster_demo import print_report

    address = ray_cluster[0].address
    assert cli.main(["demo", "--ray", address, "--srus", "6", "--size", "192x128", "--frames", "1",
                     "--output", "", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["identical"] and len(r["cluster"]["nodes"]) == 3
    assert sorted(i for a in r["assignment"] for i in a["srus"]) == list(range(6))
    assert r["bytes_network_per_frame"] + r["bytes_shared_memory_per_frame"] == 192 * 128 * 8
    print_report(r)
    text = capsys.readouterr().out
    assert "assignment (last cluster frame)" in text and "identical to the one-node frame: yes" in text
    for n in r["cluster"]["nodes"]:
        assert n["node_id"][:8] in text
    with pytest.raises(SystemExit) as e:          # --devices is for one machine
        cli.main(["demo", "--ray", address, "--devices", "0"])
    assert e.value.code == 2 and "--devices" in capsys.readouterr().err


@cluster
def test_demo_cli_auto_starts_a_local_ray(tmp_path):
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    p = subprocess.run([sys.executable, "-m", "vkmulti", "demo", "--ray", "auto", "--srus", "4", "--size",
                        "128x96", "--frames", "1", "--output", str(tmp_path / "f.png")],
                       capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "on 1 node(s), 2 GPU(s)" in p.stdout and "identical to the one-node frame: yes" in p.stdout
    assert (tmp_path / "f.png").stat().st_size > 0
