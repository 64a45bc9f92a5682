"""The 2D Jacobi stencil tile kernel: bit-identical to a numpy reference on one
tile, on several tiles of one device (halo rows as local K2K messages) and on
tiles of two devices (halo rows moved by the transfer engine)."""
from __future__ import annotations

import numpy as np
import pytest

from kernel_support import runtime_fixture
from vkmulti import CrossGpuK2KRouter
from vkmulti.kernels import stencil_kernel
from vkmulti.kernels.reference import jacobi_reference, split_rows, stencil_field, stencil_tile_state


def run_tiles(rt, field, top, bottom, devices, steps):
    h, w = field.shape
    parts = split_rows(h, len(devices))
    tiles = [rt.launch(stencil_kernel(w, n, rt.payload_size), f"tile{i}", device=dev,
                       state=stencil_tile_state(field, r0, n, top, bottom))
             for i, ((r0, n), dev) in enumerate(zip(parts, devices))]
    for i, (tile, (_, n)) in enumerate(zip(tiles, parts)):
        up = tiles[i - 1].address if i > 0 else 0
        down = tiles[i + 1].address if i + 1 < len(tiles) else 0
        tile.set_params(up, down, w, n)
    for _ in range(steps):
        ticket = rt.step(tiles)
        assert not ticket.deferred, ticket.deferred
    rt.synchronize()
    out = np.vstack([stencil_field(rt.read_state(t, steps % 2), w, n) for t, (_, n) in zip(tiles, parts)])
    for t in tiles:
        t.destroy()
    return out


def problem(h, w, seed):
    rng = np.random.default_rng(seed)
    field = rng.integers(0, 1 << 24, size=(h, w), dtype=np.int32)
    top = rng.integers(0, 1 << 24, size=w, dtype=np.int32)
    bottom = np.zeros(w, np.int32)
    return field, top, bottom


runtime = runtime_fixture(max_kernels=64, payload_size=128)


@pytest.mark.parametrize("h,w,tiles,steps", [(9, 13, 1, 7), (24, 40, 3, 12), (17, 70, 4, 9), (5, 3, 5, 4)])
def test_tiles_on_one_device_match_numpy(runtime, h, w, tiles, steps):
    field, top, bottom = problem(h, w, h * w)
    got = run_tiles(runtime, field, top, bottom, [0] * tiles, steps)
    np.testing.assert_array_equal(got, jacobi_reference(field, top, bottom, steps))


def test_tiles_on_two_devices_match_one_device(manager, runtime):
    """Halo rows cross GPUs as K2K messages (70-cell rows: 3 messages of 128 bytes per side)."""
    field, top, bottom = problem(20, 70, 3)
    one = run_tiles(runtime, field, top, bottom, [0], 10)
    router = CrossGpuK2KRouter(runtime.coordinator, runtime)
    try:
        two = run_tiles(runtime, field, top, bottom, [0, 1], 10)
        four = run_tiles(runtime, field, top, bottom, [0, 1, 1, 0], 10)
        assert router.batches > 0
    finally:
        router.detach()
    np.testing.assert_array_equal(one, jacobi_reference(field, top, bottom, 10))
    np.testing.assert_array_equal(two, one)
    np.testing.assert_array_equal(four, one)


def test_stencil_spec_rejects_bad_shapes():
    with pytest.raises(ValueError, match="width"):
        stencil_kernel(2, 4, 256)
    with pytest.raises(ValueError, match="height"):
        stencil_kernel(8, 0, 256)
    with pytest.raises(ValueError, match="255"):
        stencil_kernel(20000, 4, 256)
