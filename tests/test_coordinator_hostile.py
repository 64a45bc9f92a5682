"""The coordinator layer under hostile values and orderings that the broader
coordinator tests (test_kernels_coordinator.py) do not reach."""
from __future__ import annotations

import numpy as np
import pytest

from vkmulti import (Backend, BackendUnavailableError, DeviceInfo, GpuConnection, InterconnectType,
                     KernelNotFoundError, LoadBalancingStrategy, MigrationRequest, MultiGpuConfig,
                     MultiGpuCoordinator)

S = LoadBalancingStrategy


@pytest.mark.parametrize("strict", [True, False])
def test_custom_without_a_selector_filters_by_preference_first(strict):
    """Seed (A.2): the preferred filter comes before CUSTOM's no-selector answer, so no
    preferred slot that exists is BackendUnavailableError (before: InvalidConfigError
    with strict, device 0, outside the preferred list, without)."""
    coord = MultiGpuCoordinator(MultiGpuConfig(load_balancing=S.CUSTOM, preferred_devices=[5], strict=strict))
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.VULKAN))
    with pytest.raises(BackendUnavailableError, match="preferred"):
        coord.select_device()
    with pytest.raises(BackendUnavailableError, match="preferred"):
        coord.place_kernel("k")
    assert coord.kernel_map() == {}


@pytest.mark.parametrize("value, error", [(10**400, ValueError), (-10**400, ValueError), (np.True_, TypeError),
                                          (np.bool_(False), TypeError), (True, TypeError)])
def test_speeds_bandwidths_and_latencies_refuse_bools_and_out_of_range_ints(value, error):
    """check_number's promise, TypeError or ValueError (before: an int past float range
    raised OverflowError, and a numpy bool passed as 1.0 or 0.0 where a bool is refused)."""
    coord = MultiGpuCoordinator()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.VULKAN))
    with pytest.raises(error):
        coord.set_device_speed(0, value)
    assert coord.device_speed(0) == 1.0
    for field in ("bandwidth_gbps", "latency_us"):
        with pytest.raises(error):
            GpuConnection(0, 1, InterconnectType.PCIE, **{field: value})


def test_migration_requests_are_checked_again_where_they_are_used():
    """MigrationRequest's fields are assignable. Before: complete_migration of a request
    whose kernel_id became a plain str raised AttributeError, a bool target was taken as
    device 1, and estimate_transfer_time raised ZeroDivisionError for a bandwidth set to 0
    and OverflowError for a size past float range."""
    coord = MultiGpuCoordinator()
    for i in range(2):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.VULKAN))
    coord.assign_kernel("k", 0)
    req = coord.request_migration("k", 1)
    req.kernel_id = "gone"
    with pytest.raises(KernelNotFoundError, match="gone"):
        coord.complete_migration(req)
    req.kernel_id, req.target_device = "k", True
    with pytest.raises(TypeError):
        coord.complete_migration(req)
    assert coord.get_kernel_device("k") == 0
    req = MigrationRequest("k", 0, 1, [0, 1], 16.0, 10.0)
    with pytest.raises(ValueError):
        req.estimate_transfer_time(10**400)
    req.estimated_bandwidth_gbps = 0.0
    with pytest.raises(ValueError):
        req.estimate_transfer_time(10)
