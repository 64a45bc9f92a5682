"""Bar charts for benches and the demo: matplotlib when installed (the `plot` extra),
else a plain Pillow drawing with the same content.

Every chart has a title that names the machine, labelled axes with units,
and a legend; values are printed on the bars.
"""
from __future__ import annotations

import io
import os
from typing import Sequence

from .cli_args import save_image, write_output
from .._core.checks import short_repr

__all__ = ["bar_chart", "have_matplotlib"]

_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127)]


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported (pip install 'vkmulti[plot]')."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _check(groups: Sequence[str], series: Sequence[str], values: dict[tuple[str, str], float], path: str) -> None:
    if not groups or not series:
        raise ValueError("a chart needs at least one group and one series")
    if not isinstance(path, str) or not path:
        raise ValueError(f"path must be a non-empty str, got {short_repr(path)}")
    for key, v in values.items():
        if not isinstance(v, (int, float)) or v != v or v < 0:
            raise ValueError(f"value for {key} must be a number >= 0, got {short_repr(v)}")


def bar_chart(groups: Sequence[str], series: Sequence[str], values: dict[tuple[str, str], float], *, title: str,
              ylabel: str, xlabel: str, path: str, machine: str) -> str:
    """Write a grouped bar chart to `path` (PNG): one group per `groups` entry, one bar
    per `series` entry, heights `values[(group, series)]` (missing: no bar).

    `machine` is added to the title; returns which library drew it ("matplotlib" or "pillow").
    """
    _check(groups, series, values, path)
    full_title = f"{title}\n{machine}"
    if have_matplotlib():
        _matplotlib(groups, series, values, full_title, ylabel, xlabel, path)
        return "matplotlib"
    _pillow(groups, series, values, full_title, ylabel, xlabel, path)
    return "pillow"


def _matplotlib(groups: Sequence[str], series: Sequence[str], values: dict[tuple[str, str], float], title: str,
                ylabel: str, xlabel: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) * max(1, len(series)) / 2), 4.8), dpi=110)
    try:
        width = 0.8 / len(series)
        for j, name in enumerate(series):
            xs = [i + (j - (len(series) - 1) / 2) * width for i, g in enumerate(groups) if (g, name) in values]
            ys = [values[(g, name)] for g in groups if (g, name) in values]
            color = tuple(c / 255 for c in _COLORS[j % len(_COLORS)])
            bars = ax.bar(xs, ys, width * 0.95, label=name, color=color)
            ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=7, padding=2)
        ax.set_xticks(range(len(groups)), list(groups))
        ax.set_ylabel(ylabel)
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(0, max(values.values(), default=1.0) * 1.25 or 1.0)   # room for the legend and labels
        ax.legend(fontsize=8, loc="upper left", ncols=min(4, len(series)))
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format=os.path.splitext(path)[1][1:].lower() or "png")
        write_output(path, buf.getvalue())
    finally:
        plt.close(fig)


def _pillow(groups: Sequence[str], series: Sequence[str], values: dict[tuple[str, str], float], title: str,
            ylabel: str, xlabel: str, path: str) -> None:
    from PIL import Image, ImageDraw

    top = max(values.values(), default=0.0) * 1.15 or 1.0
    W, H, left, bottom, topm = max(700, 140 * len(groups) * max(1, len(series)) // 2), 560, 80, 90, 60
    img = Image.new("RGB", (W, H), "white")
    g = ImageDraw.Draw(img)
    for k, line in enumerate(title.split("\n")):
        g.text((left, 10 + 14 * k), line, fill="black")
    g.text((10, topm - 20), ylabel, fill="black")
    plot_h = H - bottom - topm
    for k in range(6):
        y = H - bottom - plot_h * k / 5
        g.line([(left, y), (W - 20, y)], fill=(220, 220, 220))
        g.text((10, y - 6), f"{top * k / 5:.3g}", fill="black")
    g.line([(left, topm), (left, H - bottom)], fill="black")
    g.line([(left, H - bottom), (W - 20, H - bottom)], fill="black")
    group_w = (W - left - 20) / len(groups)
    bar_w = group_w * 0.8 / len(series)
    for i, group in enumerate(groups):
        x0 = left + i * group_w + group_w * 0.1
        for j, name in enumerate(series):
            v = values.get((group, name))
            if v is None:
                continue
            h = plot_h * v / top
            x = x0 + j * bar_w
            g.rectangle([x, H - bottom - h, x + bar_w - 2, H - bottom], fill=_COLORS[j % len(_COLORS)])
            g.text((x, H - bottom - h - 12), f"{v:.3g}", fill="black")
        g.text((x0, H - bottom + 8), group, fill="black")
    g.text((left + (W - left) // 2 - 4 * len(xlabel), H - bottom + 26), xlabel, fill="black")
    for j, name in enumerate(series):
        g.rectangle([left + j * 150, H - 30, left + j * 150 + 12, H - 18], fill=_COLORS[j % len(_COLORS)])
        g.text((left + j * 150 + 16, H - 30), name, fill="black")
    save_image(img, path)
