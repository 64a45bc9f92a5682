"""bench/scaling.py: the stencil on 2 .. N devices, each against its one-device run,
fields checked identical, a ratio line and a plot (small grids on virtual devices)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image as PILImage

from script_support import load_script

BENCH = Path(__file__).resolve().parent.parent / "bench" / "scaling.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(BENCH, "scaling_bench")


@pytest.mark.lavapipe
def test_bench_runs_each_count_checks_fields_and_plots(bench, tmp_path, capsys):
    png, out = tmp_path / "scaling.png", tmp_path / "scaling.json"
    assert bench.main(["--virtual", "3", "--size", "96x72", "--steps", "6", "--json", str(out),
                       "--plot", str(png)]) == 0
    lines = capsys.readouterr().out.rstrip().splitlines()
    assert lines[-1].startswith("ratio: stencil speed-up: 2 GPUs ")
    assert "3 GPUs" in lines[-1] and lines[-1].endswith("fields identical in every run")
    figures = json.loads(out.read_text())
    assert [r["gpus"] for r in figures["runs"]] == [2, 3]
    for r in figures["runs"]:
        assert r["identical"] and r["size"] == [96, 72] and r["steps"] == 6
        assert r["speedup"] == pytest.approx(r["step_ms_single"] / r["step_ms_multi"], rel=1e-6)
        assert len(r["devices"]) == r["gpus"]
    assert figures["fields_identical"] and len({r["checksum"] for r in figures["runs"]}) == 1
    with PILImage.open(png) as img:
        assert img.size[0] >= 400 and img.size[1] >= 300


def test_a_failed_run_is_reported_and_fails_the_bench(bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "RUN_TIMEOUT", 0.01)
    assert bench.main(["--virtual", "2", "--size", "64x48", "--steps", "2"]) == 1
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert "2 GPUs failed (did not finish within" in last and last.endswith("FIELDS DIFFER OR A RUN FAILED")


@pytest.mark.parametrize("argv", [["--heavy", "--size", "64x48"], ["--max-gpus", "0"], ["--size", "big"],
                                  ["--steps", "-1"]])
def test_bad_arguments(bench, argv, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err
