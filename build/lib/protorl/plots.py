"""protorl's one plot style and its one curve plot: panels of values over environment frames, from a CSV's
rows (`Rows`)."""

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
PANEL_INCHES = (5.0, 3.5)  # width, height of one panel of `plot_curves` with a one-line title and no legend
LINE_INCHES = 0.22  # the height a panel grows by per line of its legend, and of its title beyond the first
Rows = list[dict[str, float]]  # a CSV's rows keyed by environment frames: per row, its non-empty values
LONG_LABEL = 30  # characters: a legend with a longer label has one column
SHARED_LEGEND_COLUMNS = 4


def has(rows: Rows, key: str) -> bool:
    """Whether a row has a value of `key`."""
    return any(key in row for row in rows)


def series(rows: Rows, key: str) -> tuple[list[float], list[float]]:
    """(frames, values) of the rows that have `key`, in the file's order."""
    points = [(row["frames"], row[key]) for row in rows if key in row]
    return [p[0] for p in points], [p[1] for p in points]


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
    twin_ylim: tuple[float, float] | None = None
    xlabel: str = "environment frames"


def plot_curves(panels: Sequence[Panel], paths: Sequence[Path], title: str | None = None,
                cols: int = 3) -> list[Path]:
    """Draw `panels` (`curves_figure`) and save the figure to each of `paths`."""
    with style():
        return save(curves_figure(panels, title, cols), paths)


def curves_figure(panels: Sequence[Panel], title: str | None = None, cols: int = 3) -> Figure:
    """`panels` in rows of at most `cols`; call inside `style()`. Legends sit outside the data: one below the
    figure when every panel has the same entries, else one below each panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(cols, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(PANEL_INCHES[0] * cols, PANEL_INCHES[1] * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    legends = [_draw(ax, panel) for ax, panel in zip(axes, panels, strict=False)]
    for ax in axes[len(panels):]:  # the unused panels of the last row
        ax.set_visible(False)
    labels = [labels for _, labels in legends]
    if len(panels) > 1 and labels[0] and all(other == labels[0] for other in labels):
        fig.legend(*legends[0], loc="outside lower center", ncols=min(len(labels[0]), SHARED_LEGEND_COLUMNS))
        legend_lines = math.ceil(len(labels[0]) / SHARED_LEGEND_COLUMNS) / rows
    else:
        legend_lines = max(_panel_legend(ax, *legend) for ax, legend in zip(axes, legends, strict=False))
    extra_lines = legend_lines + max(panel.title.count("\n") for panel in panels)  # lines beyond one title's
    fig.set_size_inches(PANEL_INCHES[0] * cols, (PANEL_INCHES[1] + LINE_INCHES * extra_lines) * rows)
    if title:
        fig.suptitle(title)
    return fig


def _panel_legend(ax: Axes, handles: list, labels: list[str]) -> int:
    """A legend below `ax`, in two columns where its labels are short; its number of lines."""
    if not labels:
        return 0
    columns = 2 if max(len(label) for label in labels) <= LONG_LABEL else 1
    ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=columns, frameon=False)
    return sum(label.count("\n") + 1 for label in labels[::columns])


def _draw(ax: Axes, panel: Panel) -> tuple[list, list[str]]:
    """Draw `panel` on `ax`; its legend's handles and labels (the twin axis's included)."""
    for curve in panel.curves:
        _line(ax, curve)
    for level in panel.levels:
        ax.axhline(level.value, color=level.color, linestyle="--", label=level.label)
    ax.set(title=panel.title, xlabel=panel.xlabel, ylabel=panel.ylabel)
    if panel.ylim is not None:
        ax.set_ylim(panel.ylim)
    handles, labels = ax.get_legend_handles_labels()
    if panel.twin is not None:
        twin = ax.twinx()
        twin.grid(False)
        _line(twin, panel.twin)
        twin.set_ylabel(panel.twin.label, color=panel.twin.color or "black")
        if panel.twin_ylim is not None:
            twin.set_ylim(panel.twin_ylim)
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    return handles, labels


def _line(ax: Axes, curve: Curve) -> None:
    (line,) = ax.plot(curve.frames, curve.values, curve.fmt, color=curve.color, label=curve.label)
    if curve.spread is not None:
        values, spread = np.asarray(curve.values), np.asarray(curve.spread)
        ax.fill_between(curve.frames, values - spread, values + spread, color=line.get_color(), alpha=0.2)
