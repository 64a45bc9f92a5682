"""bench/migration.py: its figures and its ratio line (small sizes, one repeat)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from script_support import load_script

BENCH = Path(__file__).resolve().parent.parent / "bench" / "migration.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(BENCH, "migration_bench")


def test_bench_prints_figures_and_a_ratio_line(bench, capsys):
    assert bench.main(["--sizes", "64K,1M", "--repeats", "1"]) == 0
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[-1].startswith("ratio: live migration 1 MiB = ")
    assert "hot-reload swap" in out[-1]
    figures = json.loads("\n".join(out[:-1]))
    rows = figures["migrate"]
    assert [r["state_bytes"] for r in rows] == [64 << 10, 1 << 20]
    for r in rows:
        assert r["checksums_matched"] and r["state_intact"] and r["kernel_counts_on"]
        assert r["live_us"] > 0 and r["host_bytes_us"] > 0 and r["raw_copy_us"] > 0
        assert r["live_us"] >= r["live_transfer_us"]
        assert r["crc_engine"] in ("host", "shader") and r["host_crc32"] in ("zlib-ng", "zlib")
        for name in ("shader_interleaved", "shader_contiguous") + (("host",) if r["crc_engine"] == "host" else ()):
            assert len(r["crc_us"][name]) == 2 and min(r["crc_us"][name]) > 0   # each device's side
        if r["crc_engine"] == "host":   # a CPU pair: the shader's check is timed as well
            assert r["live_shader_crc_us"] > 0 and r["ratio_host_to_live_shader_crc"] > 0
    assert figures["reload"]["swap_us"] > 0 and figures["reload"]["relaunch_us"] > 0


def test_bench_rejects_bad_sizes(bench):
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "12"])
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "0"])
