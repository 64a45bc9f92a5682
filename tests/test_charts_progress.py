"""Charts (matplotlib, or Pillow without it) and progress bars (rich, tqdm, or nothing)."""
from __future__ import annotations

import io
import sys

import pytest
from PIL import Image as PILImage

import vkmulti.apps.charts as charts
from vkmulti.apps.progress import progress

VALUES = {("4K image", "host_shared"): 41.0, ("4K image", "seed"): 5.4, ("256 MiB", "host_shared"): 45.7}


@pytest.mark.parametrize("matplotlib", [True, False])
def test_bar_chart_draws_with_or_without_matplotlib(tmp_path, monkeypatch, matplotlib):
    if matplotlib and not charts.have_matplotlib():
        pytest.skip("matplotlib is not installed (pip install 'vkmulti[plot]')")
    monkeypatch.setattr(charts, "have_matplotlib", lambda: matplotlib)
    path = str(tmp_path / "c.png")
    used = charts.bar_chart(["4K image", "256 MiB"], ["host_shared", "seed"], VALUES, title="bandwidth",
                            ylabel="GB/s", xlabel="case", path=path, machine="2x test GPU")
    assert used == ("matplotlib" if matplotlib else "pillow")
    with PILImage.open(path) as img:
        assert img.size[0] >= 600 and img.size[1] >= 400
        assert len(img.convert("RGB").getcolors(1 << 16) or ()) > 4   # more than a blank canvas


def test_bar_chart_bad_input(tmp_path):
    kw = dict(title="t", ylabel="y", xlabel="x", machine="m", path=str(tmp_path / "c.png"))
    with pytest.raises(ValueError, match="at least one group"):
        charts.bar_chart([], ["a"], {}, **kw)
    with pytest.raises(ValueError, match="number >= 0"):
        charts.bar_chart(["g"], ["a"], {("g", "a"): -1.0}, **kw)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("library", ["rich", "tqdm"])
def test_progress_draws_on_a_terminal_and_is_quiet_otherwise(monkeypatch, library):
    pytest.importorskip(library)
    if library == "tqdm":
        monkeypatch.setitem(sys.modules, "rich.progress", None)   # as if rich were absent
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    with progress(3, "steps") as bar:
        for _ in range(3):
            bar()
        bar.say("a line above the bar")
    assert "a line above the bar" in term.getvalue()
    quiet = _Terminal()
    monkeypatch.setattr(sys, "stderr", quiet)
    with progress(3, "steps", quiet=True) as bar:
        bar()
    assert quiet.getvalue() == ""
    with pytest.raises(ValueError):
        with progress(-1, "bad"):
            pass
