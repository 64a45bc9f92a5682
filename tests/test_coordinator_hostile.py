"""The coordinator layer under hostile values and orderings that the broader
coordinator tests (test_kernels_coordinator.py) do not reach."""
from __future__ import annotations

import pytest

from vkmulti import (Backend, BackendUnavailableError, DeviceInfo, LoadBalancingStrategy, MultiGpuConfig,
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
