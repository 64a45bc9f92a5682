"""The coordinator's registry at scale (issue 23, N and the DeviceInfo bounds):
registering devices costs O(1) amortised work each, so registering n devices
is linear in n (before: each registration rebuilt the candidate and live
lists, O(n), and 20,000 devices took 400 million steps). The work is counted
as Python line events inside the coordinator's modules, not timed; timings
are in bench/coordinator_registry.py."""
from __future__ import annotations

import sys

import pytest

from vkmulti import Backend, DeviceInfo, LoadBalancingStrategy, MultiGpuConfig, MultiGpuCoordinator
from vkmulti.kernels.coordinator import coordinator as coordinator_module
from vkmulti.kernels.coordinator import records as records_module
from vkmulti.kernels.coordinator.records import MAX_DEVICE_INDEX

_FILES = {coordinator_module.__file__, records_module.__file__}


class _Budget(Exception):
    pass


def _work(fn, budget: int) -> int:
    """Line events `fn()` runs in the coordinator's registry modules; _Budget past `budget` (so a
    quadratic regression fails at once instead of running for minutes)."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if count > budget:
                raise _Budget
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename in _FILES else None
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(old)
    return count


def _register(n: int, strategy=LoadBalancingStrategy.LEAST_LOADED, preferred=()):
    coord = MultiGpuCoordinator(MultiGpuConfig(load_balancing=strategy, preferred_devices=list(preferred)))
    infos = [DeviceInfo(i, f"gpu{i}", Backend.VULKAN) for i in range(n)]

    def run():
        for info in infos:
            coord.register_device(info)
    return coord, run


@pytest.mark.parametrize("preferred", [(), (1, 3, 5)])
def test_registration_is_linear(preferred):
    per_device = 120
    work = {}
    for n in (10_000, 20_000):
        coord, run = _register(n, preferred=preferred)
        try:
            work[n] = _work(run, budget=per_device * n)
        except _Budget:
            pytest.fail(f"registering {n} devices took more than {per_device} steps per device (quadratic?)")
        assert coord.device_count() == n
    assert work[20_000] <= 2.2 * work[10_000], work


def test_selection_and_registry_stay_right_out_of_order():
    """Devices registered out of order, unregistered and registered again: selection
    sees exactly the live candidates, in index order."""
    coord = MultiGpuCoordinator(MultiGpuConfig(load_balancing=LoadBalancingStrategy.FIRST_AVAILABLE,
                                               preferred_devices=[2, 4, 6, 8]))
    for i in (8, 2, 6):
        coord.register_device(DeviceInfo(i, f"gpu{i}", Backend.VULKAN))
    assert coord.select_device() == 2
    coord.unregister_device(2)
    assert coord.select_device() == 6
    coord.register_device(DeviceInfo(4, "gpu4", Backend.VULKAN))
    assert coord.select_device() == 4
    coord.register_device(DeviceInfo(2, "gpu2", Backend.VULKAN))
    coord.register_device(DeviceInfo(2, "gpu2 again", Backend.VULKAN))
    assert coord.select_device() == 2
    assert coord.online_devices() == [2, 4, 6, 8]
    rr = MultiGpuCoordinator(MultiGpuConfig(load_balancing=LoadBalancingStrategy.ROUND_ROBIN))
    for i in (3, 0, 1):
        rr.register_device(DeviceInfo(i, f"gpu{i}", Backend.VULKAN))
    rr.unregister_device(1)
    picks = []
    for k in range(4):
        picks.append(rr.place_kernel(f"k{k}"))
    assert picks == [0, 3, 0, 3]


@pytest.mark.parametrize("field, value", [("index", 2 ** 70), ("index", MAX_DEVICE_INDEX + 1),
                                          ("total_memory", 2 ** 80), ("available_memory", 2 ** 64),
                                          ("max_threads_per_block", 2 ** 40), ("multiprocessor_count", 2 ** 40)])
def test_device_info_fields_are_bounded(field, value):
    """Before: DeviceInfo(2**70, ...) and a memory size of 2**80 were accepted (a registry
    slot for every index up to 2**70)."""
    kw = {"index": 0, "name": "gpu", "backend": Backend.VULKAN, field: value}
    with pytest.raises(ValueError, match=f"DeviceInfo.{field}"):
        DeviceInfo(**kw)
    info = DeviceInfo(0, "gpu", Backend.VULKAN)
    setattr(info, field, value)
    coord = MultiGpuCoordinator()
    with pytest.raises(ValueError, match=f"DeviceInfo.{field}"):
        coord.register_device(info)
    assert coord.device_count() == 0
    DeviceInfo(MAX_DEVICE_INDEX, "top", Backend.VULKAN, total_memory=2 ** 64 - 1, available_memory=2 ** 64 - 1)
    coord.register_device(DeviceInfo(0, "gpu", Backend.VULKAN, total_memory=0))
    with pytest.raises(ValueError, match="available_memory"):
        coord.update_device_memory(0, 2 ** 80)
