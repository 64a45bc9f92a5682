"""Statements of the ringkernel `multi_gpu` seed documents
(shared/seeds/ringkernel_multi_gpu.txt, reference/rust_seeds.md part A) that no
other test pins, each checked as documented (Python spelling)."""
from __future__ import annotations

import pytest

import vkmulti
from vkmulti import (Backend, CrossGpuK2KRouter, DeviceInfo, GpuTopology, HlcTimestamp, HotReloadConfig,
                     HotReloadManager, HotReloadState, InterconnectType, K2KMessage, KernelCodeFormat,
                     KernelCodeSource, KernelId, KernelMigrator, LoadBalancingStrategy, MemoryStorage,
                     MessageEnvelope, MigrationPriority, MigrationState, MigrationStats, MultiGpuBuilder,
                     MultiGpuConfig, RoutingKind)
from vkmulti.kernels import CrossDeviceTransfer, HotReloadStats
from test_migration_seed import MockCheckpointableKernel, two_gpus


def p2p_pair():
    coord = MultiGpuBuilder().load_balancing(LoadBalancingStrategy.LEAST_LOADED).enable_p2p(True).build()
    for i in range(2):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA, p2p_capable=True))
    coord.assign_kernel(KernelId("source_kernel"), 0)
    coord.assign_kernel(KernelId("dest_kernel"), 1)
    return coord


# ---- the module example ----------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: K2KMessage("source_kernel", "dest_kernel", b"payload", timestamp=HlcTimestamp(1, 42)),
    # `router.route_message(source_kernel, dest_kernel, envelope)`: an envelope without payload
    lambda: MessageEnvelope(1, 2, 0, HlcTimestamp(1, 42), 0, tag=7),
], ids=["k2k_message", "envelope"])
def test_module_example_runs(make):
    """Example: MultiGpuBuilder::new().load_balancing(LeastLoaded).enable_p2p(true).build();
    coordinator.discover_topology(); CrossGpuK2KRouter::new(coordinator.clone());
    router.route_message(source_kernel, dest_kernel, envelope)."""
    coordinator = p2p_pair()
    topology = coordinator.discover_topology()
    assert isinstance(topology, GpuTopology) and topology.get_connection(0, 1).interconnect is InterconnectType.PCIE
    router = CrossGpuK2KRouter(coordinator)
    decision = router.route_message(KernelId("source_kernel"), KernelId("dest_kernel"), make())
    assert (decision.kind, decision.source_device, decision.dest_device) == (RoutingKind.DIRECT_P2P, 0, 1)
    [pending] = router.drain_pending(0, 1)
    assert (pending.source_kernel, pending.dest_kernel, pending.hops) == ("source_kernel", "dest_kernel", 1)


def test_an_envelope_with_a_payload_length_is_refused():
    router = CrossGpuK2KRouter(p2p_pair())
    with pytest.raises(ValueError, match="payload_len 8"):
        router.route_message("source_kernel", "dest_kernel", MessageEnvelope(1, 2, 0, HlcTimestamp(1, 0), 8))
    assert router.stats().messages_pending == 0


def test_an_envelope_keeps_its_tag_timestamp_and_priority():
    router = CrossGpuK2KRouter(p2p_pair())
    env = MessageEnvelope(1, 2, 0, HlcTimestamp(5, 6), 0, tag=9, flags=3 << 8)
    router.route_message("source_kernel", "dest_kernel", env)
    [pending] = router.drain_pending(0, 1)
    m = pending.message
    assert (m.payload, m.tag, m.timestamp, m.priority) == (b"", 9, HlcTimestamp(5, 6), 3)


# ---- names ------------------------------------------------------------------------

@pytest.mark.parametrize("seed, python", [
    ("BackendUnavailable", "BackendUnavailableError"), ("KernelNotFound", "KernelNotFoundError"),
    ("InvalidConfig", "InvalidConfigError"), ("DeviceNotAvailable", "DeviceNotAvailableError"),
    ("K2KDestinationNotFound", "K2KDestinationNotFoundError"), ("MigrationFailed", "MigrationFailedError"),
    ("ValidationError", "ValidationError"),
])
def test_error_variants_keep_the_seeds_spelling(seed, python):
    """A.0: errors `BackendUnavailable`, `KernelNotFound`, `InvalidConfig`, `DeviceNotAvailable`,
    `K2KDestinationNotFound`, `MigrationFailed`, `ValidationError` (Python: the name + "Error")."""
    cls = getattr(vkmulti, python)
    assert issubclass(cls, vkmulti.VkmError) and getattr(vkmulti.errors, python) is cls


@pytest.mark.parametrize("enum, names", [
    (LoadBalancingStrategy, "FIRST_AVAILABLE LEAST_LOADED ROUND_ROBIN MEMORY_BASED COMPUTE_CAPABILITY CUSTOM"),
    (MigrationPriority, "LOW NORMAL HIGH CRITICAL"),
    (MigrationState, "PENDING QUIESCING CHECKPOINTING TRANSFERRING RESTORING COMPLETED FAILED CANCELLED"),
    (HotReloadState, "IDLE DRAINING CHECKPOINTING COMPILING VALIDATING SWAPPING RESTORING COMPLETED FAILED "
                     "ROLLING_BACK"),
    (KernelCodeFormat, "PTX CUBIN SPIRV WGSL MSL METALLIB SOURCE"),
    (InterconnectType, "NONE PCIE NVLINK NVSWITCH INFINITY_FABRIC XE_LINK SAME_DEVICE"),
    (RoutingKind, "SAME_DEVICE DIRECT_P2P MULTI_HOP HOST_MEDIATED"),
])
def test_enum_variants_as_documented(enum, names):
    assert [m.name for m in enum] == names.split()


# ---- records and defaults -----------------------------------------------------------

@pytest.mark.parametrize("field, default", [
    ("total_memory", 0), ("available_memory", 0), ("compute_capability", None), ("max_threads_per_block", 1024),
    ("multiprocessor_count", 1), ("p2p_capable", False),
])
def test_device_info_defaults(field, default):
    assert getattr(DeviceInfo(3, "x", Backend.CPU), field) == default


def test_preferred_devices_is_a_candidate_filter_duplicates_included():
    """A.1: `preferred_devices` list[int], default [], a candidate filter in select_device."""
    assert MultiGpuConfig(preferred_devices=[1, 1]).preferred_devices == [1, 1]
    coord = MultiGpuBuilder().preferred_devices([1, 2, 1]).build()
    for i in range(3):
        coord.register_device(DeviceInfo(i, "g", Backend.CUDA))
    coord.assign_kernel("k", 1)
    assert coord.select_device() == 2


def test_cross_device_transfer_is_a_descriptor():
    """A.12: CrossDeviceTransfer(source, dest, size) has use_p2p=True; without_p2p() sets it False."""
    t = CrossDeviceTransfer(0, 1, 4096)
    assert (t.source_device, t.dest_device, t.size, t.use_p2p) == (0, 1, 4096, True)
    assert t.without_p2p().use_p2p is False and t.use_p2p is True


# ---- migration ----------------------------------------------------------------------

class NamingStorage(MemoryStorage):
    def __init__(self):
        super().__init__()
        self.saved: list[str] = []

    def save(self, checkpoint, name):
        self.saved.append(name)
        return super().save(checkpoint, name)


def test_migrate_with_checkpoint_stores_under_the_seeds_name_then_deletes_it():
    """A.10: saved under "migration_{kernel}_{src}_{dst}"; bytes += size; the stored copy deleted;
    coordinator() returns the coordinator."""
    coord = two_gpus()
    coord.assign_kernel("mk", 0)
    storage = NamingStorage()
    migrator = KernelMigrator.with_storage(coord, storage)
    kernel = MockCheckpointableKernel("mk", 300)
    request = coord.request_migration("mk", 1)
    result = migrator.migrate_with_checkpoint(kernel, request)
    assert storage.saved == ["migration_mk_0_1"] and storage.list() == []
    assert migrator.coordinator() is coord
    assert result.checkpoint_size == len(kernel.create_checkpoint().to_bytes()) == migrator.stats().bytes_transferred
    assert request.state is MigrationState.COMPLETED and request.started_at is not None
    assert coord.get_kernel_device("mk") == 1


@pytest.mark.parametrize("successful, failed", [(0, 0), (3, 0), (2, 2), (0, 4)])
def test_migration_averages_divide_by_successful_plus_failed(successful, failed):
    """A.9: the averages divide by successful + failed and are 0 when both are zero."""
    stats = MigrationStats()
    stats.add(successful_migrations=successful, failed_migrations=failed, checkpoint_time=8.0, restore_time=4.0)
    snap = stats.snapshot()
    n = successful + failed
    assert (snap.avg_checkpoint_time, snap.avg_restore_time) == ((8.0 / n, 4.0 / n) if n else (0.0, 0.0))


# ---- hot reload ----------------------------------------------------------------------

@pytest.mark.parametrize("successful", [0, 1, 4])
def test_hot_reload_averages_divide_by_successful_at_least_one(successful):
    """A.11: HotReloadStatsSnapshot averages divide by max(successful, 1)."""
    stats = HotReloadStats()
    stats.add(successful_reloads=successful, failed_reloads=2, total_drain_time=8.0, total_compile_time=4.0,
              total_swap_time=2.0)
    snap = stats.snapshot()
    n = max(successful, 1)
    assert (snap.avg_drain_time, snap.avg_compile_time, snap.avg_swap_time) == (8.0 / n, 4.0 / n, 2.0 / n)


def test_versions_count_from_one_and_requests_take_the_next():
    """A.11: register_kernel assigns the next version from a counter that starts at 1;
    request_reload assigns the new version."""
    manager = HotReloadManager.with_defaults()
    manager.register_kernel("a", KernelCodeSource.from_ptx(".version 7.0", "k"))
    manager.register_kernel("b", KernelCodeSource.from_ptx(".version 7.0", "k"))
    assert (manager.get_current_version("a"), manager.get_current_version("b")) == (1, 2)
    request = manager.request_reload("a", KernelCodeSource.from_ptx(".version 8.0", "k"))
    assert request.new_code.version_id == 3 and request.reload_elapsed() is None
    result = manager.execute_reload(request, MockCheckpointableKernel("a", 8))
    assert (result.old_version, result.new_version) == (1, 3) and request.reload_elapsed() is not None
    assert [c.version_id for c in manager.rule_registry()[KernelId("a")]] == [1, 3]


def test_with_rule_backend_performs_the_swap():
    """A.11: with_rule_backend(config, backend): the backend performs the swaps."""
    swaps = []
    manager = HotReloadManager.with_rule_backend(HotReloadConfig(), lambda kid, old, new: swaps.append(
        (kid, old.version_id, new.version_id)))
    manager.register_kernel("r", KernelCodeSource.from_wgsl("@compute fn main() {}", "main"))
    manager.execute_reload(manager.request_reload("r", KernelCodeSource.from_wgsl("fn main() {}", "main")),
                           MockCheckpointableKernel("r", 4))
    assert swaps == [("r", 1, 2)]


def test_code_source_formats_read_as_text_or_not():
    """A.11: as_str() is text for PTX, WGSL, MSL and SOURCE, None for binary formats; size() is bytes."""
    text = {f: KernelCodeSource.new(f, b"abc", "k").as_str() for f in KernelCodeFormat}
    assert {f for f, s in text.items() if s == "abc"} == {KernelCodeFormat.PTX, KernelCodeFormat.WGSL,
                                                           KernelCodeFormat.MSL, KernelCodeFormat.SOURCE}
    assert all(text[f] is None for f in (KernelCodeFormat.CUBIN, KernelCodeFormat.SPIRV, KernelCodeFormat.METALLIB))
    assert KernelCodeSource.new(KernelCodeFormat.CUBIN, b"\x00\x01\x02", "k").size() == 3


# ---- topology estimate and the router ------------------------------------------------

@pytest.mark.parametrize("a, b, kind", [
    ((Backend.CUDA, True, (8, 0)), (Backend.CUDA, True, (9, 0)), InterconnectType.NVLINK),
    ((Backend.CUDA, True, (8, 0)), (Backend.CUDA, True, (7, 5)), InterconnectType.PCIE),
    ((Backend.CUDA, True, None), (Backend.CUDA, True, (8, 0)), InterconnectType.PCIE),
    ((Backend.METAL, True, (8, 0)), (Backend.METAL, True, (8, 0)), InterconnectType.PCIE),
    ((Backend.CPU, True, None), (Backend.CPU, True, None), InterconnectType.PCIE),
    ((Backend.CUDA, True, (8, 0)), (Backend.METAL, True, (8, 0)), InterconnectType.NONE),
    ((Backend.CUDA, True, (8, 0)), (Backend.CUDA, False, (8, 0)), InterconnectType.NONE),
])
def test_discover_topology_estimates_links_as_documented(a, b, kind):
    """A.7: both p2p_capable and the same backend: CUDA with both majors >= 8 -> NVLINK, any other
    CUDA or backend -> PCIE; different backends or either not P2P-capable -> NONE; mirrored;
    NUMA never filled, probed stays False."""
    coord = MultiGpuBuilder().build()
    for i, (backend, p2p, cc) in enumerate((a, b)):
        coord.register_device(DeviceInfo(i, f"GPU {i}", backend, compute_capability=cc, p2p_capable=p2p))
    topo = coord.discover_topology()
    assert topo.get_connection(0, 1).interconnect is kind and topo.get_connection(1, 0).interconnect is kind
    assert topo.get_connection(0, 1).bandwidth_gbps == kind.estimated_bandwidth_gbps()
    assert (topo.probed, topo.numa_nodes) == (False, [None, None])


def test_the_router_does_not_consult_enable_p2p():
    """A.8: the router does not consult enable_p2p or can_p2p; only the topology matters."""
    coord = MultiGpuBuilder().enable_p2p(False).build()
    for i in range(2):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA, p2p_capable=True))
    coord.assign_kernel("a", 0)
    coord.assign_kernel("b", 1)
    assert not coord.can_p2p(0, 1)
    assert CrossGpuK2KRouter(coord).route_message("a", "b", b"x").kind is RoutingKind.DIRECT_P2P


# ---- hot reload switches ----------------------------------------------------------------

class CountingKernel(MockCheckpointableKernel):
    def __init__(self, kernel_id: str):
        super().__init__(kernel_id, 16)
        self.checkpoints = 0

    def create_checkpoint(self):
        self.checkpoints += 1
        return super().create_checkpoint()


def test_preserve_state_off_takes_no_checkpoint():
    """A.11 step 3: CHECKPOINTING serialises kernel.create_checkpoint() only if preserve_state."""
    for preserve in (True, False):
        manager = HotReloadManager(HotReloadConfig().with_preserve_state(preserve))
        manager.register_kernel("k", KernelCodeSource.from_ptx(".version 7.0", "k"))
        kernel = CountingKernel("k")
        result = manager.execute_reload(manager.request_reload("k", KernelCodeSource.from_ptx(".target sm_90", "k")),
                                        kernel)
        assert (kernel.checkpoints, result.state_preserved, result.checkpoint_size > 0) == (preserve,) * 3
        assert manager.stats().state_preserved_count == int(preserve)


def test_validate_before_swap_off_installs_code_the_rules_refuse():
    """A.11 step 4: code is validated (PTX needs ".version" or ".target") only if validate_before_swap."""
    bad = KernelCodeSource.from_ptx("no directive", "k")
    for validate in (True, False):
        manager = HotReloadManager(HotReloadConfig().with_validate_before_swap(validate))
        manager.register_kernel("k", KernelCodeSource.from_ptx(".version 7.0", "k"))
        request = manager.request_reload("k", bad)
        if validate:
            with pytest.raises(vkmulti.ValidationError, match="version/target"):
                manager.execute_reload(request, MockCheckpointableKernel("k", 4))
            assert manager.get_current_version("k") == 1
        else:
            manager.execute_reload(request, MockCheckpointableKernel("k", 4))
            assert manager.get_current_code("k").code == b"no directive"


def test_unregister_kernel_forgets_code_and_fallback():
    """A.11: unregister_kernel removes the code, the fallback and the active request."""
    manager = HotReloadManager.with_defaults()
    manager.register_kernel("k", KernelCodeSource.from_ptx(".version 7.0", "k"))
    manager.execute_reload(manager.request_reload("k", KernelCodeSource.from_ptx(".version 8.0", "k")),
                           MockCheckpointableKernel("k", 4))
    manager.unregister_kernel("k")
    assert not manager.is_registered("k") and manager.get_current_code("k") is None
    assert manager.list_kernels() == [] and not manager.is_reload_in_progress("k")
    with pytest.raises(vkmulti.ValidationError, match="No fallback available"):
        manager.rollback("k")
    with pytest.raises(vkmulti.KernelNotFoundError):
        manager.request_reload("k", KernelCodeSource.from_ptx(".version 9.0", "k"))


def test_the_estimate_has_no_links_to_placeholders_or_offline_devices():
    """The seed's estimate fills every ordered pair (NONE at 16 GB/s for placeholders, which are
    not P2P-capable); vkmulti's gives placeholders and offline devices no link (seed-defects.md)."""
    coord = MultiGpuBuilder().build()
    for i in (0, 2, 3):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA))
    coord.unregister_device(3)
    topo = coord.discover_topology()
    assert topo.get_connection(0, 2).interconnect is InterconnectType.NONE
    assert [topo.get_connection(0, d) for d in (1, 3)] == [None, None]
    assert [topo.get_connection(s, 0) for s in (1, 3)] == [None, None]
    assert topo.bisection_bandwidth_gbps() == 16.0   # 0 -> 2 only; the seed's would count 0 -> 3 and 1 -> 2, 3
