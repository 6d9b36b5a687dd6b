"""protorl's one plot style and its one curve plot: panels of values over environment frames."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

STYLE = {"figure.dpi": 100, "savefig.dpi": 100, "savefig.bbox": "tight", "axes.grid": True, "grid.alpha": 0.3,
         "legend.fontsize": "small"}  # matplotlib rcParams
PANEL_INCHES = (5.0, 3.5)  # width, height of one panel of `plot_curves`


@contextmanager
def style() -> Iterator[None]:
    """protorl's look for every figure created and saved inside the block (rliable's included)."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        yield


def save(fig: Figure, paths: Sequence[Path]) -> list[Path]:
    """Write `fig` to each of `paths`, in the format its suffix names; call inside `style()`."""
    for path in paths:
        fig.savefig(path)
    return list(paths)


@dataclass(frozen=True)
class Curve:
    """One line: values over environment frames, with a shaded band of ± `spread` if given."""

    frames: Sequence[float]
    values: Sequence[float]
    label: str | None = None
    fmt: str = "-"
    color: str | None = None
    spread: Sequence[float] | None = None  # (len(frames),) e.g. the std over seeds


@dataclass(frozen=True)
class Level:
    """A dashed horizontal line across a panel: a reference value."""

    label: str
    value: float
    color: str = "k"


@dataclass(frozen=True)
class Panel:
    """One axes of `plot_curves`; `twin`: a curve against a second y axis, labelled with its label."""

    title: str
    ylabel: str
    curves: Sequence[Curve]
    levels: Sequence[Level] = ()
    ylim: tuple[float, float] | None = None
    twin: Curve | None = None


def plot_curves(panels: Sequence[Panel], paths: Sequence[Path], title: str | None = None,
                cols: int = 3) -> list[Path]:
    """Draw `panels` in rows of at most `cols` and save the figure to each of `paths`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(cols, len(panels))
    rows = math.ceil(len(panels) / cols)
    with style():
        fig = Figure(figsize=(PANEL_INCHES[0] * cols, PANEL_INCHES[1] * rows), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax, panel in zip(axes, panels, strict=False):
            _draw(ax, panel)
        for ax in axes[len(panels):]:  # the unused panels of the last row
            ax.set_visible(False)
        if title:
            fig.suptitle(title)
        return save(fig, paths)


def _draw(ax: Axes, panel: Panel) -> None:
    for curve in panel.curves:
        _line(ax, curve)
    for level in panel.levels:
        ax.axhline(level.value, color=level.color, linestyle="--", label=level.label)
    ax.set(title=panel.title, xlabel="environment frames", ylabel=panel.ylabel)
    if panel.ylim is not None:
        ax.set_ylim(panel.ylim)
    if panel.twin is not None:
        twin = ax.twinx()
        twin.grid(False)
        _line(twin, panel.twin)
        twin.set_ylabel(panel.twin.label, color=panel.twin.color)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _line(ax: Axes, curve: Curve) -> None:
    (line,) = ax.plot(curve.frames, curve.values, curve.fmt, color=curve.color, label=curve.label)
    if curve.spread is not None:
        values, spread = np.asarray(curve.values), np.asarray(curve.spread)
        ax.fill_between(curve.frames, values - spread, values + spread, color=line.get_color(), alpha=0.2)
