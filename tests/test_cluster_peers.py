"""What the cluster's agents send the driver is a peer's data: ClusterManager checks each
reply (describe, measured throughput, link timings, stencil set-up, validation reports)
before using it. An agent that answers malformed is skipped or lost with the reason,
the others carry on, and no reply crashes the manager or poisons its plans.

Runs without Ray: `FakeRay` answers every call at once from in-process stand-in agents
(the manager's code is the real one; only Ray's transport is replaced).
"""
from __future__ import annotations

import math
import sys
import types
from types import SimpleNamespace as NS

import numpy as np
import pytest

from vkmulti import ReferenceSRU
from vkmulti.cluster import manager as cluster_manager_module
from vkmulti.cluster import ClusterManager


class _Ref:
    """A call made at once: its value, or the error it raised."""

    def __init__(self, fn, *args):
        try:
            self.value, self.error = fn(*args), None
        except Exception as exc:   # what Ray would carry back as a task error
            self.value, self.error = None, exc


class _Method:
    def __init__(self, agent, name):
        self._fn = getattr(agent, name)

    def remote(self, *args):
        return _Ref(self._fn, *args)

    def options(self, num_returns=1):
        fn = self._fn

        def remote(*args):
            ref = _Ref(fn, *args)
            if ref.error is not None:
                return tuple(ref for _ in range(num_returns))
            return tuple(_Ref(lambda v=v: v) for v in ref.value)
        return NS(remote=remote)


class _Handle:
    def __init__(self, agent):
        self.agent = agent

    def __getattr__(self, name):
        return _Method(self.agent, name)


class FakeRay(types.ModuleType):
    """The part of `ray` ClusterManager uses, over stand-in agents (one node each, no local node)."""

    class exceptions:   # noqa: N801 - Ray's spelling
        class RayError(Exception):
            pass

        class GetTimeoutError(RayError, TimeoutError):
            pass

        class RayTaskError(RayError):
            pass

    def __init__(self, agents):
        super().__init__("ray")
        self.agents = list(agents)
        self.killed: list = []
        self.util = types.ModuleType("ray.util")

    def is_initialized(self):
        return True

    def get_runtime_context(self):
        return NS(get_node_id=lambda: "driver")

    def nodes(self):
        return [{"Alive": True, "NodeID": f"node{i}-0000", "NodeManagerAddress": f"10.0.0.{i}",
                 "Resources": {"vk_gpu": 1.0}} for i in range(len(self.agents))]

    def remote(self, cls):
        made = iter(self.agents)

        class Actor:
            @staticmethod
            def options(**kw):
                return Actor

            @staticmethod
            def remote(**kw):
                return _Handle(next(made))
        return Actor

    def get(self, ref, timeout=None):
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if ref.error is not None:
            err = self.exceptions.RayTaskError(f"{type(ref.error).__name__}: {ref.error}")
            err.cause = ref.error
            raise err
        return ref.value

    def wait(self, refs, num_returns=1, timeout=None, fetch_local=True):
        return list(refs[:num_returns]), list(refs[num_returns:])

    def kill(self, handle, no_restart=True):
        self.killed.append(handle.agent.node_id)


class Agent:
    """A node agent that answers as NodeAgent does: one GPU, images of zeros, a stencil slab
    that does not change."""

    def __init__(self, node_id):
        self.node_id, self.slab = node_id, None

    def describe(self, topology=False):
        return {"node_id": self.node_id, "address": "10.0.0.9", "hostname": "h", "pid": 4242, "error": None,
                "devices": [{"index": 0, "name": "gpu", "type": "cpu"}], "topology": None, "topology_note": None,
                "nice": 0, "nice_note": None}

    def measure_throughput(self):
        return [1.0e6]

    def ping(self):
        return 0.0

    def payload(self, nbytes):
        return np.zeros(16, np.uint8)

    def fetch(self, refs):
        return 0.001

    def render(self, group):
        return {"node_id": self.node_id, "images": {s.sru_id: np.zeros((s.height, s.width, 8), np.uint8)
                                                   for s in group},
                "gpu": {s.sru_id: 0 for s in group}, "render_s": 0.01, "readback_s": 0.01, "total_s": 0.02,
                "lost_gpus": {}, "predicted_s": None}

    def stencil_setup(self, slab, above, below, payload_size=256):
        self.slab = slab.copy()
        return {0: len(slab)}

    def stencil_step(self, above, below):
        return self.slab[0], self.slab[-1]

    def stencil_field(self):
        return self.slab.copy()

    def stencil_teardown(self):
        self.slab = None

    def validation_errors(self):
        return []

    def shutdown(self):
        pass


def _hostile(method, reply):
    """An Agent whose `method` returns `reply` (called with the agent's own reply when callable)."""
    class Hostile(Agent):
        pass

    def answer(self, *args, **kw):
        return reply(getattr(Agent, method)(self, *args, **kw)) if callable(reply) else reply
    setattr(Hostile, method, answer)
    return Hostile


@pytest.fixture
def cluster(monkeypatch):
    """cluster(bad_agent_class, **manager options): a ClusterManager over a good node and a
    node of `bad_agent_class`, through FakeRay."""
    made = []

    def make(bad, **options):
        ray = FakeRay([Agent("good"), bad("bad")])
        pg = types.ModuleType("ray.util.placement_group")
        pg.placement_group = lambda bundles, strategy: NS(ready=lambda: _Ref(lambda: True))
        pg.remove_placement_group = lambda group: None
        strategies = types.ModuleType("ray.util.scheduling_strategies")
        strategies.PlacementGroupSchedulingStrategy = lambda group, placement_group_bundle_index: None
        for name, mod in (("ray", ray), ("ray.util", ray.util), ("ray.util.placement_group", pg),
                          ("ray.util.scheduling_strategies", strategies)):
            monkeypatch.setitem(sys.modules, name, mod)
        monkeypatch.setattr(cluster_manager_module, "require_ray", lambda: ray)
        cm = ClusterManager(timeout=5.0, start_timeout=5.0, topology=False, agent_nice=None, **options)
        made.append(cm)
        return cm, ray
    yield make
    for cm in made:
        cm.destroy()


def _frame_renders_on_the_good_node(cm):
    srus = [ReferenceSRU(k, 8, 8, x=8 * k) for k in range(4)]
    frame = cm.render_frame(srus, 32, 8)
    assert list(frame.nodes) == ["good"] and frame.pixels.shape == (8, 32, 8)


BAD_DESCRIPTIONS = {
    "not a dict": None,
    "a list": ["node", "devices"],
    "no node id": lambda d: {k: v for k, v in d.items() if k != "node_id"},
    "node id not a str": lambda d: dict(d, node_id=12345678),
    "huge node id": lambda d: dict(d, node_id="n" * (1 << 20)),
    "devices not a list": lambda d: dict(d, devices="gpu"),
    "device without a name": lambda d: dict(d, devices=[{"index": 0}]),
    "no devices": lambda d: dict(d, devices=[]),
    "pid not an int": lambda d: dict(d, pid="1"),
    "topology not a dict": lambda d: dict(d, topology=[1, 2]),
    "error not a str": lambda d: dict(d, error=["x"]),
}


@pytest.mark.parametrize("name", list(BAD_DESCRIPTIONS))
def test_a_node_describing_itself_malformed_is_skipped(cluster, name):
    """Before: ClusterManager() died of the KeyError / TypeError the reply raised (or kept a
    node whose topology broke describe(), or a megabyte id in every message)."""
    cm, ray = cluster(_hostile("describe", BAD_DESCRIPTIONS[name]), measure=False)
    assert list(cm.nodes) == ["good"] and ray.killed == ["bad"]
    (label, why), = cm.skipped.items()
    assert "malformed" in why and len(label) + len(why) < 400, (label, why)
    assert cm.describe()["nodes"][0]["node_id"] == "good"
    _frame_renders_on_the_good_node(cm)


BAD_THROUGHPUTS = {
    "none": None, "a str": "fast", "a str in it": ["1e6"], "nan": [math.nan], "inf": [math.inf],
    "negative": [-1.0e6], "a bool": [True], "too many GPUs": [1.0e6, 1.0e6], "none at all": [],
    "overflowing": [1e308, 1e308][:1] * 1 + [1e308],
}


@pytest.mark.parametrize("name", list(BAD_THROUGHPUTS))
def test_a_node_measuring_its_gpus_malformed_is_lost(cluster, name):
    """Before: None or a str crashed ClusterManager() (TypeError), and an infinite throughput
    was kept: every later frame's plan refused it (ValueError), so no frame rendered."""
    cm, ray = cluster(_hostile("measure_throughput", BAD_THROUGHPUTS[name]))
    assert list(cm.lost) == ["bad"] and "measuring its GPUs failed" in cm.lost["bad"]
    assert all(math.isfinite(n.throughput) and n.throughput > 0 for k, n in cm.nodes.items() if k not in cm.lost)
    _frame_renders_on_the_good_node(cm)


@pytest.mark.parametrize("reply", ["slow", math.nan, -1.0, None, [0.1]])
def test_a_node_timing_a_link_malformed_is_lost(cluster, reply):
    """Before: measure_node_links() died of the TypeError (a str, None, a list) or kept a
    link fitted from NaN or negative seconds."""
    cm, ray = cluster(_hostile("fetch", reply))
    links = cm.measure_node_links(2 * 2 ** 20)
    assert "bad" in cm.lost and "link" in cm.lost["bad"]
    assert all(math.isfinite(ln.latency) and ln.latency >= 0 and ln.bandwidth > 0 for ln in links.values())
    _frame_renders_on_the_good_node(cm)


@pytest.mark.parametrize("reply", [None, [(0, 4)], {0: "four"}, {"gpu": 4}, {0: -4}, "rows"])
def test_a_node_setting_up_its_stencil_slab_malformed_is_lost(cluster, reply):
    """Before: dict(reply) of a None or a str crashed run_stencil (TypeError / ValueError),
    and a mapping of anything was kept as the run's report."""
    cm, ray = cluster(_hostile("stencil_setup", lambda rows: reply), measure=False)
    f = np.arange(40, dtype=np.int32).reshape(8, 5)
    run = cm.run_stencil(f, np.zeros(5, np.int32), np.zeros(5, np.int32), 4, checkpoint_every=2)
    assert list(cm.lost) == ["bad"] and "stencil" in cm.lost["bad"]
    assert np.array_equal(run.field, f) and list(run.nodes) == ["good"]


@pytest.mark.parametrize("reply", [None, "x" * (1 << 20), ["y" * (1 << 20)] * 3, [1, None], ["ok"] * 100000])
def test_validation_reports_are_bounded_strs(cluster, reply):
    cm, ray = cluster(_hostile("validation_errors", reply), measure=False)
    got = cm.validation_errors()
    assert got["good"] == []
    texts = got["bad"]
    assert isinstance(texts, list) and all(isinstance(t, str) for t in texts)
    assert sum(map(len, texts)) < 64 << 10
