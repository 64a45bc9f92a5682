"""`python -m vkmulti bench transfer`: figures as JSON, a ratio line and a PNG plot."""
from __future__ import annotations

import json

import pytest
from PIL import Image as PILImage

from vkmulti.apps.benchmarks import interleaved, main
from vkmulti import TransferMethod


def test_bench_transfer_quick_writes_json_ratios_and_plot(tmp_path, capsys):
    png, out = tmp_path / "bw.png", tmp_path / "bw.json"
    assert main(["--quick", "--reps", "1", "--no-torch", "--plot", str(png), "--json", str(out),
                 "--methods", "host_shared,staging_copy"]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    got = {(c["case"], c["method"]) for c in res["cases"]}
    for case in ("image 3840x2160", "buffer 64 MiB"):
        for m in (TransferMethod.HOST_SHARED, TransferMethod.STAGING_COPY, "seed_baseline"):
            assert (case, m) in got
    assert all(c["gbps"] > 0 and c["min_s"] <= c["median_s"] for c in res["cases"])
    assert set(res["rings"]) == {TransferMethod.HOST_SHARED, TransferMethod.STAGING_COPY}
    assert res["ratios"]["image 3840x2160: host_shared/seed"] > 0
    assert printed.rstrip().splitlines()[-1].startswith("ratio: image 3840x2160: host_shared/seed = ")
    with PILImage.open(png) as img:
        assert img.size[0] >= 600 and img.size[1] >= 400


@pytest.mark.parametrize("argv", [["--reps", "0"], ["--slot-size", "0"], ["--methods", "teleport"],
                                  ["--src", "7"]])
def test_bench_transfer_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--quick", "--no-torch"] + argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_interleaved_runs_contenders_in_warm_blocks():
    calls: list[str] = []
    times = interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, reps=5, warmup=1,
                        block=3)
    # warm-up; round 1: one untimed + 3 timed each; round 2: one untimed + the 2 left
    assert calls == ["a", "b"] + ["a"] * 4 + ["b"] * 4 + ["a"] * 3 + ["b"] * 3
    assert {k: len(v) for k, v in times.items()} == {"a": 5, "b": 5}
