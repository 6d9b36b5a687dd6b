"""rliable's statistics over normalised final scores: interval estimates of four aggregate metrics and
performance profiles, with their tables and plots. rliable (the `sweep` extra) is imported only here, when used.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from protorl.errors import ResultsError
from protorl.plots import save, style

METRICS = {"IQM": "aggregate_iqm", "Mean": "aggregate_mean", "Median": "aggregate_median",  # -> rliable.metrics
           "Optimality Gap": "aggregate_optimality_gap"}
ESTIMATE_COLUMNS = ["method", "metric", "point", "ci_low", "ci_high"]  # aggregate.csv
Scores = dict[str, np.ndarray]  # per method, normalised final scores (seeds, tasks)


def require_rliable() -> None:
    """ResultsError, saying how to install it, unless rliable (the `sweep` extra) imports."""
    try:
        from rliable import library, metrics  # noqa: F401
    except ImportError as error:
        raise ResultsError(f"the statistics over complete records need rliable, which does not import ({error}): "
                           'pip install -e ".[sweep]"') from error


def interval_estimates(matrices: Scores, reps: int) -> tuple[dict, dict]:
    """rliable's point estimates (metrics,) and 95% stratified-bootstrap CIs (2, metrics) per method."""
    from rliable import library, metrics

    functions = [getattr(metrics, name) for name in METRICS.values()]
    return library.get_interval_estimates(matrices, lambda scores: np.array([f(scores) for f in functions]), reps=reps)


def write_estimates(points: dict, intervals: dict, path: Path) -> Path:
    """`aggregate.csv`: one row per (method, metric)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(ESTIMATE_COLUMNS)
        for method in points:
            for i, metric in enumerate(METRICS):
                writer.writerow([method, metric, points[method][i], intervals[method][0, i], intervals[method][1, i]])
    return path


def _plot_utils():
    """rliable's plot_utils, which draw through pyplot: on the Agg backend, chosen before pyplot is imported."""
    import matplotlib

    matplotlib.use("Agg")
    from rliable import plot_utils

    return plot_utils


def plot_estimates(points: dict, intervals: dict, colors: dict[str, str], paths: list[Path],
                   xlabel: str) -> list[Path]:
    """rliable's interval plot: per metric, each method's point estimate and 95% CI."""
    plot_utils = _plot_utils()
    from matplotlib import pyplot as plt

    height = 0.5 * len(points)  # inches; rliable places the x label in figure coordinates: 0.6 in below the axes
    with style():
        fig, _ = plot_utils.plot_interval_estimates(
            points, intervals, list(METRICS), colors=colors, row_height=0.5, subfigure_width=4.0, wspace=0.25,
            xlabel_y_coordinate=0.11 - 0.6 / height, xlabel=xlabel)
        save(fig, paths)
    plt.close(fig)
    return paths


def plot_profiles(matrices: Scores, reps: int, colors: dict[str, str], paths: list[Path]) -> list[Path]:
    """Fraction of (seed, task) scores above each threshold in [0, 1], with 95% bootstrap CIs."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from rliable import library

    plot_utils = _plot_utils()
    taus = np.linspace(0.0, 1.0, 101)
    profiles, cis = library.create_performance_profile(matrices, taus, reps=reps)
    with style():
        fig = Figure(figsize=(7.0, 4.5), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        plot_utils.plot_performance_profiles(profiles, taus, performance_profile_cis=cis, ax=ax, colors=colors,
                                             xlabel=r"normalised score $\tau$ (a curve further up and right is better)",
                                             legend=False)
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=min(len(matrices), 3))
        return save(fig, paths)
