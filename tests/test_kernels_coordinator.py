"""MultiGpuCoordinator beyond the seed's own tests: each fixed seed defect,
the strategies' rules and ties, bad input, listeners and threads."""
from __future__ import annotations

import threading

import pytest

from vkmulti import (Backend, BackendUnavailableError, CoordinatorEventKind, DeviceInfo, DeviceNotAvailableError,
                     GpuConnection, GpuTopology, InterconnectType, InvalidConfigError, KernelId, KernelMode,
                     KernelNotFoundError, LaunchOptions, LoadBalancingStrategy, MigrationError, MultiGpuBuilder,
                     MultiGpuConfig, MultiGpuCoordinator, VkmError)
from vkmulti import errors

S = LoadBalancingStrategy
BUILT_IN = [S.FIRST_AVAILABLE, S.LEAST_LOADED, S.ROUND_ROBIN, S.MEMORY_BASED, S.COMPUTE_CAPABILITY]


def make(n=2, strategy=S.LEAST_LOADED, **config):
    coord = MultiGpuCoordinator(MultiGpuConfig(load_balancing=strategy, **config))
    for i in range(n):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA))
    return coord


def consistent(coord):
    """The registry's invariants: counts equal the map, offline devices hold nothing."""
    kmap = coord.kernel_map()
    total = 0
    for st in coord.get_all_status():
        i = st.info.index
        on = [k for k, d in kmap.items() if d == i]
        assert st.kernel_count == len(st.kernels) == len(on) >= 0, (i, st.kernel_count, st.kernels, on)
        assert sorted(st.kernels) == sorted(on)
        if not st.online:
            assert st.kernel_count == 0 and not st.available
        total += st.kernel_count
    assert coord.stats().total_kernels == total == len(kmap)


# ---- fixed seed defects ----

@pytest.mark.parametrize("strategy", BUILT_IN)
def test_nothing_fits_raises_for_every_strategy(strategy):
    """Seed: silently returns device 0 (or a full first candidate)."""
    coord = make(2, strategy, max_kernels_per_device=1)
    coord.assign_kernel("a", 0)
    coord.assign_kernel("b", 1)
    with pytest.raises(DeviceNotAvailableError, match="full"):
        coord.select_device()
    with pytest.raises(DeviceNotAvailableError):
        coord.place_kernel("c")
    assert coord.get_kernel_device("c") is None
    consistent(coord)


@pytest.mark.parametrize("strategy", BUILT_IN)
def test_strict_false_keeps_the_seed_answer(strategy):
    coord = make(3, strategy, max_kernels_per_device=1, strict=False, preferred_devices=[2, 1])
    for i in range(3):
        coord.assign_kernel(f"k{i}", i)
    expect = 1 if strategy in (S.FIRST_AVAILABLE, S.ROUND_ROBIN) else 0   # first candidate, else device 0
    assert coord.select_device() == expect


def test_strict_false_never_returns_an_offline_device():
    coord = make(2, S.LEAST_LOADED, max_kernels_per_device=1, strict=False)
    coord.assign_kernel("a", 1)
    coord.unregister_device(0)                 # "a" stays on 1, device 0 offline
    with pytest.raises(DeviceNotAvailableError):
        coord.select_device()                  # the seed would answer 0


def test_reassign_moves_the_count():
    """Seed: re-assigning a kernel leaves the old device's count up (drift)."""
    coord = make(2)
    coord.assign_kernel("k", 0)
    coord.assign_kernel("k", 1)
    assert [s.kernel_count for s in coord.get_all_status()] == [0, 1]
    coord.assign_kernel("k", 1)
    assert [s.kernel_count for s in coord.get_all_status()] == [0, 1]
    assert coord.stats().kernels_launched == 3   # every assign_kernel call counts
    consistent(coord)


def test_counters_never_go_negative():
    """Seed: complete_migration subtracts from the source even for an unmapped
    kernel (u64 wrap); remove_kernel of an unknown id is a no-op."""
    coord = make(2)
    coord.assign_kernel("k", 0)
    req = coord.request_migration("k", 1)
    coord.remove_kernel("k")
    with pytest.raises(KernelNotFoundError):
        coord.complete_migration(req)
    assert coord.remove_kernel("k") is None
    assert [s.kernel_count for s in coord.get_all_status()] == [0, 0]
    consistent(coord)


def test_complete_migration_is_idempotent_and_rejects_stale_requests():
    coord = make(3)
    coord.assign_kernel("k", 0)
    req = coord.request_migration("k", 1)
    coord.complete_migration(req)
    coord.complete_migration(req)      # done already: nothing moves twice
    assert [s.kernel_count for s in coord.get_all_status()] == [0, 1, 0]
    coord.assign_kernel("k", 2)
    with pytest.raises(MigrationError, match="stale"):
        coord.complete_migration(req)
    consistent(coord)


@pytest.mark.parametrize("bad", [0, -1])
def test_max_kernels_per_device_below_one_is_rejected(bad):
    """Seed: 0 is accepted and divides by zero in the load."""
    with pytest.raises(InvalidConfigError, match="max_kernels_per_device"):
        MultiGpuBuilder().max_kernels_per_device(bad)
    with pytest.raises(InvalidConfigError):
        MultiGpuConfig(max_kernels_per_device=bad)
    b = MultiGpuBuilder().max_kernels_per_device(3)
    with pytest.raises(InvalidConfigError):
        b.max_kernels_per_device(bad)
    assert b.config().max_kernels_per_device == 3   # the builder stays as it was
    cfg = MultiGpuConfig()
    cfg.max_kernels_per_device = 0
    with pytest.raises(InvalidConfigError):
        MultiGpuCoordinator(cfg)


def test_unregister_plans_greedily_so_load_spreads():
    """Seed: every kernel goes to the device least loaded at call time."""
    coord = make(4)
    coord.assign_kernel("x", 3)
    for i in range(6):
        coord.assign_kernel(f"k{i}", 0)
    result = coord.unregister_device(0)
    targets = [p.target_device for p in result.kernels_to_migrate]
    assert targets == [1, 2, 1, 2, 3, 1]   # each to the then least loaded, ties to the lowest index
    assert [s.kernel_count for s in coord.get_all_status()] == [0, 3, 2, 2]
    assert [p.kernel_id for p in result.kernels_to_migrate] == [f"k{i}" for i in range(6)]
    consistent(coord)


def test_unregister_respects_capacity_and_orphans_the_rest():
    coord = make(2, max_kernels_per_device=2)
    for i in range(3):
        coord.assign_kernel(f"k{i}", 0)   # explicit assignment may exceed the cap
    coord.assign_kernel("y", 1)
    result = coord.unregister_device(0)
    assert [p.kernel_id for p in result.kernels_to_migrate] == ["k0"]
    assert result.orphaned_kernels == ["k1", "k2"]
    assert coord.get_kernel_device("k1") is None
    consistent(coord)


@pytest.mark.parametrize("strategy", BUILT_IN)
def test_offline_devices_and_placeholders_are_never_selected(strategy):
    """Seed: an unregistered slot still reports available=True and placeholders can be selected."""
    coord = MultiGpuCoordinator(MultiGpuConfig(load_balancing=strategy))
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA, available_memory=1, compute_capability=(7, 0)))
    coord.register_device(DeviceInfo(3, "GPU 3", Backend.CUDA, available_memory=5, compute_capability=(9, 0)))
    assert coord.device_count() == 4
    assert coord.device(1).name == "Unknown" and coord.device(1).backend == Backend.CPU
    st = coord.get_all_status()
    assert [s.online for s in st] == [True, False, False, True]
    assert [s.available for s in st] == [True, False, False, True]
    coord.unregister_device(3)
    assert {coord.select_device() for _ in range(6)} == {0}
    coord.unregister_device(0)
    with pytest.raises(DeviceNotAvailableError, match="offline"):
        coord.select_device()
    with pytest.raises(DeviceNotAvailableError, match="offline"):
        coord.assign_kernel("k", 0)
    with pytest.raises(DeviceNotAvailableError, match="not a registered device"):
        coord.assign_kernel("k", 1)


def test_unregister_marks_name_once_and_register_brings_it_back():
    coord = make(2)
    coord.unregister_device(1)
    coord.unregister_device(1)
    assert coord.device(1).name == "GPU 1 (unregistered)"
    assert coord.device(1).available_memory == 0
    assert not coord.is_device_online(1) and coord.online_devices() == [0]
    assert not coord.unregister_device(5).success
    coord.register_device(DeviceInfo(1, "GPU 1", Backend.CUDA))
    assert coord.is_device_online(1) and coord.online_devices() == [0, 1]
    coord.assign_kernel("k", 0)
    assert coord.select_device() == 1


def test_topology_cache_is_invalidated_by_register_and_unregister():
    """Seed: topology() keeps the first discovered topology forever."""
    coord = MultiGpuCoordinator()
    for i in range(2):
        d = DeviceInfo(i, f"GPU {i}", Backend.CUDA, p2p_capable=True)
        coord.register_device(d)
    assert coord.topology().device_count == 2
    d = DeviceInfo(2, "GPU 2", Backend.CUDA, p2p_capable=True)
    coord.register_device(d)
    topo = coord.topology()
    assert topo.device_count == 3 and topo.get_connection(0, 2).interconnect == InterconnectType.PCIE
    coord.unregister_device(1)
    topo = coord.topology()
    assert topo.get_connection(0, 1) is None and topo.neighbors(0) == [2]


def test_set_topology_survives_unregister_without_the_offline_links():
    coord = MultiGpuCoordinator()
    for i in range(3):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA))
    topo = GpuTopology(3)
    topo.set_connection(GpuConnection(0, 1, InterconnectType.NVLINK).with_bandwidth(400.0))
    topo.set_connection(GpuConnection(1, 2, InterconnectType.NVLINK).with_bandwidth(350.0))
    topo.set_numa_node(0, 1)
    topo.mark_probed()
    coord.set_topology(topo)
    assert coord.topology() == topo
    coord.unregister_device(2)
    view = coord.topology()
    assert view.probed and view.get_connection(0, 1).bandwidth_gbps == 400.0
    assert view.get_connection(1, 2) is None and view.numa_nodes[0] == 1
    coord.register_device(DeviceInfo(3, "GPU 3", Backend.CUDA))   # not measured: estimated, no longer "probed"
    view = coord.topology()
    assert view.device_count == 4 and not view.probed
    assert view.get_connection(0, 3).interconnect == InterconnectType.NONE
    assert coord.discover_topology().get_connection(0, 1).interconnect == InterconnectType.NONE
    assert coord.topology().get_connection(0, 1).bandwidth_gbps == 16.0   # discover replaced the set one


def test_k2k_selection_skips_full_devices():
    """Seed: scores neighbours by bandwidth / (load + 0.1) without checking room."""
    coord = make(3, max_kernels_per_device=2)
    topo = GpuTopology(3)
    topo.set_connection(GpuConnection(0, 1, InterconnectType.NVLINK))
    topo.set_connection(GpuConnection(0, 2, InterconnectType.PCIE))
    coord.set_topology(topo)
    coord.assign_kernel("src", 0)
    assert coord.select_device_for_k2k("src") == 1
    coord.assign_kernel("a", 1)
    assert coord.select_device_for_k2k("src") == 1   # 300 / 0.6 beats 32 / 0.1
    coord.assign_kernel("b", 1)
    assert coord.select_device_for_k2k("src") == 2   # 1 is full
    coord.assign_kernel("c", 2)
    coord.assign_kernel("d", 2)
    assert coord.select_device_for_k2k("src") == 0   # no neighbour has room: select_device
    coord.assign_kernel("e", 0)
    with pytest.raises(DeviceNotAvailableError):
        coord.select_device_for_k2k("src")           # and then nothing has room


def test_k2k_ties_go_to_the_lowest_index_and_unplaced_source_falls_back():
    coord = make(3)
    topo = GpuTopology(3)
    topo.set_connection(GpuConnection(0, 1, InterconnectType.NVLINK))
    topo.set_connection(GpuConnection(0, 2, InterconnectType.NVLINK))
    coord.set_topology(topo)
    coord.assign_kernel("src", 0)
    assert coord.select_device_for_k2k("src") == 1   # seed: the last of equal scores (2)
    assert coord.select_device_for_k2k("nobody") == 1  # select_device: LEAST_LOADED -> 1


def test_best_path_is_the_widest_over_p2p_hops():
    """Seed: at most one intermediate, chosen among links of any kind, NONE included."""
    topo = GpuTopology(5)
    topo.set_connection(GpuConnection(0, 1, InterconnectType.NVLINK).with_bandwidth(300.0))
    topo.set_connection(GpuConnection(1, 2, InterconnectType.NVLINK).with_bandwidth(300.0))
    topo.set_connection(GpuConnection(2, 3, InterconnectType.NVLINK).with_bandwidth(300.0))
    topo.set_connection(GpuConnection(0, 4, InterconnectType.PCIE).with_bandwidth(32.0))
    topo.set_connection(GpuConnection(4, 3, InterconnectType.PCIE).with_bandwidth(32.0))
    topo.set_connection(GpuConnection(0, 3, InterconnectType.NONE))
    assert topo.best_path(0, 3) == [0, 1, 2, 3]       # three hops, 300 GB/s, beats [0, 4, 3] at 32
    assert topo.hop_count(0, 3) == 2
    assert topo.path_figures([0, 1, 2, 3]) == (300.0, 3.0)
    # host-mediated links are never hops: a seed-style all-NONE topology stays direct
    none = GpuTopology(3)
    for a, b in ((0, 1), (1, 2), (0, 2)):
        none.set_connection(GpuConnection(a, b, InterconnectType.NONE))
    assert none.best_path(0, 2) == [0, 2]
    assert none.hop_count(0, 2) is None
    assert topo.best_path(0, 9) == [0, 9]


def test_best_path_ties_prefer_fewer_hops_then_lowest_indices():
    topo = GpuTopology(5)
    for a, b in ((0, 2), (2, 4), (0, 1), (1, 4), (0, 3), (3, 1)):
        topo.set_connection(GpuConnection(a, b, InterconnectType.NVLINK))
    assert topo.best_path(0, 4) == [0, 1, 4]          # equal width, 2 hops, [0,1,4] < [0,2,4]
    topo.set_connection(GpuConnection(0, 1, InterconnectType.PCIE))
    assert topo.best_path(0, 4) == [0, 2, 4]          # the narrower 0-1 link loses
    topo.set_connection(GpuConnection(0, 2, InterconnectType.PCIE))
    assert topo.best_path(0, 4) == [0, 3, 1, 4]       # the only 300 GB/s path, three hops


def test_request_migration_uses_the_path_figures():
    coord = make(3)
    topo = GpuTopology(3)
    topo.set_connection(GpuConnection(0, 1, InterconnectType.NVLINK).with_latency(2.0))
    topo.set_connection(GpuConnection(1, 2, InterconnectType.PCIE))
    coord.set_topology(topo)
    coord.assign_kernel("k", 0)
    req = coord.request_migration("k", 2)
    assert req.path == [0, 1, 2] and req.estimated_bandwidth_gbps == 32.0 and req.estimated_latency_us == 7.0
    req = coord.request_migration("k", 1)
    assert req.path == [0, 1] and req.estimated_bandwidth_gbps == 300.0
    coord.unregister_device(2)
    with pytest.raises(DeviceNotAvailableError, match="offline"):
        coord.request_migration("k", 2)
    with pytest.raises(DeviceNotAvailableError, match="Device 7 not available"):
        coord.request_migration("k", 7)
    with pytest.raises(KernelNotFoundError, match="nobody"):
        coord.request_migration("nobody", 1)


# ---- strategy rules and ties ----

def test_ties_go_to_the_lowest_index():
    """Seed: MEMORY_BASED and COMPUTE_CAPABILITY took the last of equal maxima."""
    for strategy in BUILT_IN:
        assert make(3, strategy).select_device() == 0, strategy


def test_memory_and_compute_strategies():
    coord = make(3, S.MEMORY_BASED)
    coord.update_device_memory(1, 10)
    coord.update_device_memory(2, 10)
    assert coord.select_device() == 1
    coord.update_device_memory(2, 11)
    assert coord.select_device() == 2
    coord = MultiGpuCoordinator(MultiGpuConfig(load_balancing=S.COMPUTE_CAPABILITY))
    for i, cc in enumerate([(8, 6), None, (9, 0), (9, 0)]):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA, compute_capability=cc))
    assert coord.select_device() == 2


def test_first_available_skips_full_devices():
    """Seed: FIRST_AVAILABLE returns the first candidate even when it is full."""
    coord = make(3, S.FIRST_AVAILABLE, max_kernels_per_device=1)
    coord.assign_kernel("a", 0)
    assert coord.select_device() == 1


def test_round_robin_over_devices_with_room_and_preferred():
    coord = make(4, S.ROUND_ROBIN, preferred_devices=[3, 1, 2], max_kernels_per_device=1)
    assert [coord.select_device() for _ in range(4)] == [1, 2, 3, 1]
    coord.assign_kernel("a", 2)
    assert [coord.select_device() for _ in range(2)] == [1, 3]   # counter 4, 5 over [1, 3] (the seed's rule)


def test_preferred_devices_that_do_not_exist():
    coord = make(2, preferred_devices=[5])
    with pytest.raises(BackendUnavailableError, match="preferred"):
        coord.select_device()
    with pytest.raises(BackendUnavailableError, match="No GPU devices"):
        MultiGpuCoordinator().select_device()


def test_speed_weights_for_least_loaded():
    coord = make(2)
    coord.set_device_speed(1, 3.0)
    picks = [coord.place_kernel(f"k{i}") for i in range(8)]
    assert picks.count(1) == 6 and picks.count(0) == 2
    assert coord.device_speed(1) == 3.0
    with pytest.raises(ValueError):
        coord.set_device_speed(0, 0.0)


def test_custom_selector():
    coord = make(3, S.CUSTOM)
    with pytest.raises(InvalidConfigError, match="set_custom_selector"):
        coord.select_device()
    seen = []

    def pick_last(statuses, options):
        seen.append((len(statuses), options))
        return statuses[-1].info.index
    coord.set_custom_selector(pick_last)
    opts = LaunchOptions.single_block(128)
    assert coord.select_device(opts) == 2
    assert seen[-1] == (3, opts)
    assert coord.place_kernel("k") == 2 and coord.get_kernel_device("k") == 2
    assert isinstance(seen[-1][1], LaunchOptions)   # default options when none given


@pytest.mark.parametrize("answer, match", [(7, "does not exist"), (-1, "does not exist"), ("0", "not a device"),
                                           (True, "not a device"), (None, "not a device")])
def test_custom_selector_bad_answers(answer, match):
    coord = make(2, S.CUSTOM)
    coord.set_custom_selector(lambda statuses, options: answer)
    with pytest.raises(DeviceNotAvailableError, match=match):
        coord.select_device()
    with pytest.raises(DeviceNotAvailableError):
        coord.place_kernel("k")
    assert coord.kernel_map() == {}
    consistent(coord)


def test_custom_selector_that_raises_or_picks_offline_or_full():
    coord = make(2, S.CUSTOM, max_kernels_per_device=1)

    def boom(statuses, options):
        raise RuntimeError("selector bug")
    coord.set_custom_selector(boom)
    with pytest.raises(DeviceNotAvailableError, match="RuntimeError: selector bug") as info:
        coord.select_device()
    assert isinstance(info.value.__cause__, RuntimeError)
    coord.set_custom_selector(lambda s, o: 1)
    coord.unregister_device(1)
    with pytest.raises(DeviceNotAvailableError, match="offline"):
        coord.select_device()
    coord.set_custom_selector(lambda s, o: 0)
    coord.assign_kernel("a", 0)
    with pytest.raises(DeviceNotAvailableError, match="full"):
        coord.select_device()
    with pytest.raises(TypeError):
        coord.set_custom_selector(42)


# ---- bad input ----

def test_bad_input_is_typed_and_named():
    coord = make(2)
    with pytest.raises(TypeError, match="kernel_id must be a str"):
        coord.assign_kernel(42, 0)
    with pytest.raises(TypeError, match="kernel id must be a str"):
        KernelId(3.5)
    with pytest.raises(TypeError, match="device_index must be an int"):
        coord.assign_kernel("k", "0")
    with pytest.raises(TypeError):
        coord.assign_kernel("k", True)
    with pytest.raises(ValueError, match="-1"):
        coord.assign_kernel("k", -1)
    with pytest.raises(DeviceNotAvailableError, match="device 9"):
        coord.assign_kernel("k", 9)
    with pytest.raises(DeviceNotAvailableError, match="device 9"):
        coord.update_device_memory(9, 1)
    with pytest.raises(ValueError, match="-5"):
        coord.update_device_memory(0, -5)
    with pytest.raises(ValueError, match="-1"):
        DeviceInfo(0, "x", Backend.CUDA, total_memory=-1)
    d = DeviceInfo(0, "x", Backend.CUDA, total_memory=100)
    d.available_memory = -3
    with pytest.raises(ValueError, match="-3"):
        coord.register_device(d)
    with pytest.raises(ValueError, match="exceeds"):
        coord.update_device_memory(0, 1) or coord.register_device(DeviceInfo(0, "x", Backend.CUDA, total_memory=5)) \
            or coord.update_device_memory(0, 6)
    with pytest.raises(TypeError, match="DeviceInfo"):
        coord.register_device({"index": 0})
    with pytest.raises(TypeError, match="backend"):
        DeviceInfo(0, "x", "cuda")
    with pytest.raises(TypeError):
        MultiGpuBuilder().load_balancing("least")
    with pytest.raises(TypeError):
        coord.select_device(options={"grid_size": 1})
    with pytest.raises(TypeError):
        coord.unregister_device("0")
    with pytest.raises(TypeError):
        coord.kernels_on_device(None)
    with pytest.raises(TypeError):
        coord.set_topology("topo")
    with pytest.raises(TypeError):
        coord.complete_migration("k")
    assert coord.kernels_on_device(99) == [] and coord.device(99) is None and coord.get_device_status(99) is None
    coord.assign_kernel("k", 1)
    assert coord.select_device() == 0
    consistent(coord)


def test_plain_str_and_kernel_id_are_interchangeable():
    coord = make(1)
    coord.assign_kernel("k", 0)
    assert coord.get_kernel_device(KernelId("k")) == 0
    ids = coord.kernels_on_device(0)
    assert ids == ["k"] and type(ids[0]) is KernelId and ids[0].as_str() == "k"
    assert type(ids[0].as_str()) is str
    assert {KernelId("a"): 1}["a"] == 1 and repr(KernelId("a")) == "KernelId('a')"
    assert KernelId(KernelId("a")) == "a"


def test_errors_are_vkm_errors_of_the_right_builtin_kinds():
    for name, base in [("BackendUnavailableError", None), ("KernelNotFoundError", KeyError),
                       ("InvalidConfigError", ValueError), ("DeviceNotAvailableError", None),
                       ("K2KDestinationNotFoundError", None), ("MigrationError", None),
                       ("KernelValidationError", ValueError)]:
        cls = getattr(errors, name)
        assert issubclass(cls, VkmError)
        if base is not None:
            assert issubclass(cls, base)
    assert str(KernelNotFoundError("kernel 'x' is not assigned")) == "kernel 'x' is not assigned"


# ---- config, options, stats ----

def test_defaults_and_builder():
    cfg = MultiGpuConfig()
    assert (cfg.load_balancing, cfg.auto_select_device, cfg.max_kernels_per_device, cfg.enable_p2p,
            cfg.preferred_devices, cfg.strict) == (S.LEAST_LOADED, True, 64, True, [], True)
    b = MultiGpuBuilder()
    assert b.load_balancing(S.ROUND_ROBIN) is b
    coord = (b.auto_select_device(False).max_kernels_per_device(8).enable_p2p(False).preferred_devices([1])
             .strict(False).build())
    got = coord.config
    assert (got.load_balancing, got.auto_select_device, got.max_kernels_per_device, got.enable_p2p,
            got.preferred_devices, got.strict) == (S.ROUND_ROBIN, False, 8, False, [1], False)
    got.max_kernels_per_device = 1
    assert coord.config.max_kernels_per_device == 8


def test_launch_options_defaults_and_setters():
    o = LaunchOptions()
    assert (o.mode, o.grid_size, o.block_size, o.input_queue_capacity, o.output_queue_capacity,
            o.shared_memory_size, o.auto_activate, o.cooperative, o.enable_k2k, o.scheduler_config) == \
        (KernelMode.PERSISTENT, 1, 256, 1024, 1024, 0, True, False, False, None)
    o2 = (LaunchOptions.multi_block(4, 64).with_queue_capacity(16).with_shared_memory(1024).without_auto_activate()
          .with_k2k(True).with_cooperative(True).with_mode(KernelMode.EVENT_DRIVEN).with_priority(3))
    assert (o2.grid_size, o2.block_size, o2.input_queue_capacity, o2.output_queue_capacity, o2.shared_memory_size,
            o2.auto_activate, o2.enable_k2k, o2.cooperative, o2.mode) == \
        (4, 64, 16, 16, 1024, False, True, True, KernelMode.EVENT_DRIVEN)
    assert o == LaunchOptions()   # setters return copies
    with pytest.raises(ValueError):
        LaunchOptions(block_size=0)


def test_stats_status_and_p2p():
    coord = MultiGpuCoordinator(MultiGpuConfig(max_kernels_per_device=4))
    coord.register_device(DeviceInfo(0, "a", Backend.CUDA, total_memory=100, available_memory=40, p2p_capable=True))
    coord.register_device(DeviceInfo(1, "b", Backend.CUDA, total_memory=50, available_memory=50, p2p_capable=True))
    coord.register_device(DeviceInfo(2, "c", Backend.CUDA, total_memory=50, available_memory=50))
    coord.assign_kernel("k", 0)
    st = coord.get_device_status(0)
    assert (st.kernel_count, st.kernels, st.available, st.load, st.online) == (1, ["k"], True, 0.25, True)
    assert coord.device(0).memory_utilization() == pytest.approx(0.6)
    s = coord.stats()
    assert (s.device_count, s.total_kernels, s.total_memory, s.available_memory, s.kernels_launched) == \
        (3, 1, 200, 140, 1)
    assert coord.can_p2p(0, 1) and not coord.can_p2p(0, 2) and not coord.can_p2p(0, 9)
    coord.unregister_device(1)
    assert not coord.can_p2p(0, 1)
    off = MultiGpuBuilder().enable_p2p(False).build()
    off.register_device(DeviceInfo(0, "a", Backend.CUDA, p2p_capable=True))
    off.register_device(DeviceInfo(1, "b", Backend.CUDA, p2p_capable=True))
    assert not off.can_p2p(0, 1)


def test_returned_records_are_copies():
    coord = make(1)
    info = DeviceInfo(1, "mine", Backend.CUDA)
    coord.register_device(info)
    info.name = "changed"
    assert coord.device(1).name == "mine"
    coord.device(1).name = "also changed"
    assert coord.devices()[1].name == "mine"
    topo = coord.topology()
    topo.set_connection(GpuConnection(0, 1, InterconnectType.NVLINK))
    assert coord.topology().get_connection(0, 1).interconnect == InterconnectType.NONE


# ---- listeners and threads ----

def test_listeners_see_every_change():
    coord = make(2)
    events = []
    coord.add_listener(events.append)
    coord.add_listener(lambda ev: 1 / 0)   # a failing listener is logged, never raised
    coord.assign_kernel("a", 0)
    coord.assign_kernel("a", 1)
    req = coord.request_migration("a", 0)
    coord.complete_migration(req)
    coord.assign_kernel("b", 0)
    coord.remove_kernel("b")
    result = coord.unregister_device(0)
    coord.register_device(DeviceInfo(2, "GPU 2", Backend.CUDA))
    kinds = [e.kind for e in events]
    K = CoordinatorEventKind
    assert kinds == [K.KERNEL_ASSIGNED, K.KERNEL_ASSIGNED, K.KERNEL_MIGRATED, K.KERNEL_ASSIGNED, K.KERNEL_REMOVED,
                     K.DEVICE_UNREGISTERED, K.DEVICE_REGISTERED]
    assert (events[1].device_index, events[1].previous_device) == (1, 0)
    assert events[5].result is result and result.kernels_to_migrate[0].kernel_id == "a"
    coord.remove_listener(events.append)
    with pytest.raises(ValueError):
        coord.remove_listener(events.append)


def test_many_threads_place_kernels_at_once(run_threads):
    coord = make(4, max_kernels_per_device=50)
    placed: list[int] = []
    lock = threading.Lock()

    def worker(k):
        for i in range(60):
            try:
                d = coord.place_kernel(f"t{k}-{i}")
            except DeviceNotAvailableError:
                continue
            with lock:
                placed.append(d)
            if i % 7 == 0:
                coord.remove_kernel(f"t{k}-{i}")
                with lock:
                    placed.remove(d)
    errors_ = run_threads(worker, n=6)
    assert not errors_
    counts = [s.kernel_count for s in coord.get_all_status()]
    assert all(c <= 50 for c in counts) and sum(counts) == len(placed)
    assert max(counts) - min(counts) <= 1 or sum(counts) == 200
    consistent(coord)


def test_threads_mixing_selection_assignment_and_unregister(run_threads):
    coord = make(6, S.ROUND_ROBIN, max_kernels_per_device=1000)

    def worker(k):
        for i in range(200):
            try:
                d = coord.select_device()
                coord.assign_kernel(f"{k}-{i}", d)
            except DeviceNotAvailableError:
                pass   # the device went offline between select and assign
            if k == 0 and i == 50:
                coord.unregister_device(3)
            if k == 1 and i == 120:
                coord.unregister_device(4)
    assert not run_threads(worker, n=4)
    assert coord.kernels_on_device(3) == [] and coord.kernels_on_device(4) == []
    consistent(coord)


def test_discovered_connections_are_the_seeds_bidirectional_ones():
    """Seed: GpuConnection(src, dst, type) is bidirectional and discovery mirrors each
    connection. Before: estimated links were made with bidirectional=False, so a
    discovered link differed from GpuConnection(0, 1, NVLINK)."""
    coord = MultiGpuCoordinator()
    for i in range(2):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA, compute_capability=(9, 0), p2p_capable=True))
    topo = coord.discover_topology()
    for a, b in ((0, 1), (1, 0)):
        assert topo.get_connection(a, b) == GpuConnection(a, b, InterconnectType.NVLINK)
        assert topo.get_connection(a, b).bidirectional
