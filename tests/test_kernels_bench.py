"""bench/placement.py: its figures, its ratio line, and that its baseline is the
seed's algorithm (same answers as the coordinator where the seed has no defect)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vkmulti import DeviceInfo, Backend, LoadBalancingStrategy
from script_support import load_script

BENCH = Path(__file__).resolve().parent.parent / "bench" / "placement.py"


@pytest.fixture(scope="module")
def placement():
    return load_script(BENCH, "placement_bench")


def test_bench_prints_figures_and_a_ratio_line(placement, capsys):
    assert placement.main(["--section", "strategies", "--seconds", "0.02", "--kernels", "200", "--devices", "4"]) == 0
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith("ratio: select_device slowest built-in strategy")
    figures = json.loads("\n".join(out[:-1]))
    for s in placement.BUILT_IN:
        name = s.name.lower()
        assert figures[f"select_{name}_per_s"] > 0 and figures[f"seed_select_{name}_per_s"] > 0
    assert figures["select_custom_per_s"] > 0 and figures["place_and_remove_pairs_per_s"] > 0
    with pytest.raises(SystemExit):
        placement.main(["--seconds", "0"])


def test_baseline_answers_like_the_seed(placement):
    """Distinct loads, memory and capabilities: no tie, nobody full, so the seed's rules
    and the coordinator's agree; on an all-zero registry the seed's MEMORY_BASED and
    COMPUTE_CAPABILITY take the last device (max_by), vkmulti the first."""
    S = LoadBalancingStrategy
    for strategy in placement.BUILT_IN:
        coord = placement.populated(strategy, 5, 23)
        seed = placement.SeedSelect(coord, strategy)
        assert [seed.select() for _ in range(4)] == [coord.select_device() for _ in range(4)], strategy
    for strategy in (S.MEMORY_BASED, S.COMPUTE_CAPABILITY):
        coord = placement.MultiGpuCoordinator(placement.MultiGpuConfig(load_balancing=strategy))
        for i in range(3):
            coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA))
        assert placement.SeedSelect(coord, strategy).select() == 2 and coord.select_device() == 0
