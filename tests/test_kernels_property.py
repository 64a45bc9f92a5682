"""Property test: random register / assign / place / remove / migrate /
unregister / select sequences keep the coordinator consistent: counts equal
the map, offline devices hold no kernels, selection never returns an offline,
placeholder or full device, and bad calls change nothing."""
from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from vkmulti import (Backend, DeviceInfo, DeviceNotAvailableError, InvalidConfigError, KernelNotFoundError,
                     LoadBalancingStrategy, MultiGpuConfig, MultiGpuCoordinator)

S = LoadBalancingStrategy
DEVICES = st.integers(0, 3)
KERNELS = st.sampled_from([f"k{i}" for i in range(12)])


class CoordinatorMachine(RuleBasedStateMachine):
    @initialize(strategy=st.sampled_from([S.FIRST_AVAILABLE, S.LEAST_LOADED, S.ROUND_ROBIN, S.MEMORY_BASED,
                                          S.COMPUTE_CAPABILITY, S.CUSTOM]),
                cap=st.integers(1, 3), preferred=st.lists(DEVICES, unique=True, max_size=2))
    def setup(self, strategy, cap, preferred):
        self.cap = cap
        self.coord = MultiGpuCoordinator(MultiGpuConfig(load_balancing=strategy, max_kernels_per_device=cap,
                                                        preferred_devices=preferred))
        if strategy is S.CUSTOM:   # the least-loaded device with room, among every slot
            self.coord.set_custom_selector(lambda statuses, options: min(
                (s for s in statuses if s.available), key=lambda s: s.kernel_count, default=statuses[0]).info.index)
        self.state = self.snapshot()

    def snapshot(self):
        return self.coord.kernel_map(), [(s.kernel_count, s.online) for s in self.coord.get_all_status()]

    def unchanged(self):
        assert self.snapshot() == self.state

    def changed(self):
        self.state = self.snapshot()

    @rule(index=DEVICES, memory=st.integers(0, 100), cc=st.sampled_from([None, (7, 0), (8, 0), (9, 0)]),
          p2p=st.booleans())
    def register(self, index, memory, cc, p2p):
        self.coord.register_device(DeviceInfo(index, f"GPU {index}", Backend.CUDA, total_memory=100,
                                              available_memory=memory, compute_capability=cc, p2p_capable=p2p))
        self.changed()

    @rule(index=st.integers(0, 5))
    def unregister(self, index):
        before = self.coord.is_device_online(index)
        held = set(self.coord.kernels_on_device(index))
        result = self.coord.unregister_device(index)
        registered = index < self.coord.device_count() and self.coord.device(index).name != "Unknown"
        assert result.success == registered
        assert {p.kernel_id for p in result.kernels_to_migrate} | set(result.orphaned_kernels) == \
            (held if before else set())
        for p in result.kernels_to_migrate:
            assert self.coord.get_kernel_device(p.kernel_id) == p.target_device != index
        for k in result.orphaned_kernels:
            assert self.coord.get_kernel_device(k) is None
        self.changed()

    @rule(kernel=KERNELS, index=st.integers(0, 5))
    def assign(self, kernel, index):
        try:
            self.coord.assign_kernel(kernel, index)
        except DeviceNotAvailableError:
            assert not self.coord.is_device_online(index)
            self.unchanged()
            return
        assert self.coord.get_kernel_device(kernel) == index
        self.changed()

    @rule(kernel=KERNELS)
    def place(self, kernel):
        try:
            index = self.coord.place_kernel(kernel)
        except (DeviceNotAvailableError, InvalidConfigError) as exc:
            self.unchanged()
            if isinstance(exc, DeviceNotAvailableError) and self.coord.config.load_balancing is not S.CUSTOM:
                assert not any(s.available for s in self.candidates())
            return
        except Exception as exc:   # BackendUnavailableError: no slot, or no preferred slot exists
            assert type(exc).__name__ == "BackendUnavailableError", exc
            self.unchanged()
            return
        assert self.coord.is_device_online(index)
        assert self.coord.get_kernel_device(kernel) == index
        status = self.coord.get_device_status(index)
        assert status.kernel_count <= self.cap, "placed on a full device"
        self.changed()

    def candidates(self):
        pref = set(self.coord.config.preferred_devices)
        return [s for s in self.coord.get_all_status() if not pref or s.info.index in pref]

    @rule()
    def select(self):
        try:
            index = self.coord.select_device()
        except (DeviceNotAvailableError, InvalidConfigError) as exc:
            if isinstance(exc, DeviceNotAvailableError) and self.coord.config.load_balancing is not S.CUSTOM:
                assert not any(s.available for s in self.candidates())
            return
        except Exception as exc:
            assert type(exc).__name__ == "BackendUnavailableError", exc
            return
        status = self.coord.get_device_status(index)
        assert status.online and status.available and status.kernel_count < self.cap
        self.unchanged()

    @rule(kernel=KERNELS)
    def remove(self, kernel):
        where = self.coord.get_kernel_device(kernel)
        assert self.coord.remove_kernel(kernel) == where
        assert self.coord.get_kernel_device(kernel) is None
        self.changed()

    @rule(kernel=KERNELS, dest=st.integers(0, 5))
    def migrate(self, kernel, dest):
        target = dest
        try:
            req = self.coord.request_migration(kernel, target)
        except (KernelNotFoundError, InvalidConfigError, DeviceNotAvailableError):
            self.unchanged()
            return
        assert req.path[0] == req.source_device and req.path[-1] == target
        self.coord.complete_migration(req)
        assert self.coord.get_kernel_device(kernel) == target
        self.changed()

    @rule(kernel=KERNELS)
    def k2k(self, kernel):
        try:
            index = self.coord.select_device_for_k2k(kernel)
        except Exception:   # the fallback select_device found nothing: checked in select()
            return
        assert self.coord.is_device_online(index)

    @invariant()
    def consistent(self):
        if not hasattr(self, "coord"):
            return
        kmap = self.coord.kernel_map()
        total = 0
        for s in self.coord.get_all_status():
            on = sorted(k for k, d in kmap.items() if d == s.info.index)
            assert s.kernel_count == len(on) and sorted(s.kernels) == on
            if not s.online:
                assert s.kernel_count == 0 and not s.available
            assert s.available == (s.online and s.kernel_count < self.cap)
            total += s.kernel_count
        assert total == len(kmap) == self.coord.stats().total_kernels
        assert all(0 <= d < self.coord.device_count() for d in kmap.values())


TestCoordinatorProperties = CoordinatorMachine.TestCase
TestCoordinatorProperties.settings = settings(max_examples=300, stateful_step_count=50, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
