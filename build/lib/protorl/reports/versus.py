"""The scores against a numeric setting (`protorl-aggregate --versus KEY`), e.g. the pre-training budget
`pretrain_frames` as in the paper's figure that varies it: per method and value of the setting, rliable's IQM and
mean with their 95% CIs, one curve per method. A method without pre-training does not vary with a pre-training
setting: it is a line across, and so is a method read from another aggregate's `aggregate.csv` (`--baseline`),
unless it names the value it was measured at (`METHOD@VALUE`): then it is a point of its own at that value.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from protorl.errors import ResultsError
from protorl.plots import save, style
from protorl.reports.records import Record
from protorl.reports.stats import ESTIMATE_COLUMNS, METRICS
from protorl.storage.run_files import CONFIG_FILE, read_run_config

SHOWN = ("IQM", "Mean")  # the metrics of rliable's four that the figure draws; versus.csv holds all four
COLUMNS = ["method", "setting", "value", "metric", "point", "ci_low", "ci_high", "n_seeds"]


@dataclass(frozen=True)
class Setting:
    """Where a method label sits: the method without the setting, and the setting's value (None: a line across)."""

    method: str
    value: float | None


@dataclass(frozen=True)
class Estimate:
    """One method's aggregate metric at one value of the setting (None: a line across, the same at every value)."""

    method: str
    value: float | None
    metric: str
    point: float
    low: float
    high: float
    n_seeds: int


def label_by_setting(records: list[Record], key: str,
                     varies: Callable[[Record], bool]) -> tuple[list[Record], dict[str, Setting]]:
    """The records, each whose score `varies` with the setting (e.g. a pre-trained agent's, for a pre-training
    setting) relabelled `<method> <key>=<value>`; and where each label sits. A record that does not vary keeps its
    label: a line across. ResultsError naming the run where `key` is missing or not a number, or where one label
    would hold records that vary and records that do not."""
    relabelled, where = [], {}
    for record in records:
        if not varies(record):
            setting = Setting(record.method, None)
        else:
            run_dir = record.path.parent
            value = OmegaConf.select(read_run_config(run_dir / CONFIG_FILE), key, default=None)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ResultsError(f"--versus {key}: {run_dir}/config.yaml has "
                                   f"{'no ' + key if value is None else f'{key}={value}, not a number'}")
            setting = Setting(record.method, float(value))
            named = f"{key}={_number(float(value))}"
            record = replace(record, method=f"{record.method} {named}",
                             title=f"{record.title or record.method} {named}")
        if (where.get(record.method, setting) != setting
                or any(s.method == setting.method and (s.value is None) != (setting.value is None)
                       for s in where.values())):
            raise ResultsError(f"--versus {key}: method {setting.method} has runs whose score varies with {key} "
                               f"and runs whose score does not (e.g. {record.path}): tell them apart with --group-by")
        where[record.method] = setting
        relabelled.append(record)
    return relabelled, where


def estimates(points: dict[str, np.ndarray], intervals: dict[str, np.ndarray], matrices: dict[str, np.ndarray],
              where: dict[str, Setting]) -> list[Estimate]:
    """The rows of `versus.csv` from rliable's estimates per method label (`interval_estimates`), one per metric."""
    order = sorted(points, key=lambda m: (where[m].method, where[m].value is not None, where[m].value or 0.0))
    return [Estimate(where[label].method, where[label].value, metric, float(points[label][i]),
                     float(intervals[label][0, i]), float(intervals[label][1, i]), len(matrices[label]))
            for label in order for i, metric in enumerate(METRICS)]


def baseline_method(text: str) -> tuple[str, float | None]:
    """`METHOD` or `METHOD@VALUE` (the value of the setting the method was measured at) as (method, value);
    ResultsError if VALUE is not a finite number."""
    method, at, value = text.rpartition("@")
    if not at:
        return text, None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not method or not math.isfinite(number):
        raise ResultsError(f"--baseline: {text!r} is not METHOD or METHOD@VALUE with VALUE a number, "
                           f"e.g. proto@100000")
    return method, number


def read_baseline(path: Path, method: str, value: float | None = None) -> list[Estimate]:
    """Method `method`'s rows of an `aggregate.csv` that protorl-aggregate wrote: lines across, or a point at
    `value` of the setting when it was measured at one; ResultsError if the file is not one or has no such
    method."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != ESTIMATE_COLUMNS:
                raise ResultsError(f"--baseline {path}: not an aggregate.csv of protorl-aggregate (its columns: "
                                   f"{', '.join(reader.fieldnames or []) or 'none'})")
            rows = list(reader)
    except OSError as error:
        raise ResultsError(f"--baseline {path}: {error.strerror}") from error
    except (UnicodeDecodeError, csv.Error) as error:
        raise ResultsError(f"--baseline {path}: not an aggregate.csv of protorl-aggregate ({error})") from error
    found = {row["metric"]: row for row in rows if row["method"] == method}
    if set(found) != set(METRICS):
        names = sorted({row["method"] for row in rows})
        raise ResultsError(f"--baseline {path}: no complete rows of method {method!r} (methods: "
                           f"{', '.join(names) or 'none'})")
    try:
        return [Estimate(f"{method} ({path.parent.name})", value, metric, float(row["point"]), float(row["ci_low"]),
                         float(row["ci_high"]), 0) for metric, row in found.items()]
    except ValueError as error:
        raise ResultsError(f"--baseline {path}: {error}") from error


def write_versus(rows: list[Estimate], key: str, path: Path) -> Path:
    """`versus.csv`: one row per method, value of the setting (empty: a line across) and metric."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([row.method, key, "" if row.value is None else _number(row.value), row.metric,
                             row.point, row.low, row.high, row.n_seeds or ""])
    return path


def summary_lines(rows: list[Estimate], key: str) -> list[str]:
    """The IQM and mean with their CIs per method and value, one line each."""
    by_point = defaultdict(dict)
    for row in rows:
        by_point[row.method, row.value][row.metric] = row
    lines = []
    for (method, value), metrics in by_point.items():
        where = "at every value" if value is None else f"{key}={_number(value)}"
        seeds = next(iter(metrics.values())).n_seeds
        lines.append(f"{method}, {where}{f' ({seeds} seeds)' if seeds else ''}: " + ", ".join(
            f"{name} {metrics[name].point:.3f} [{metrics[name].low:.3f}, {metrics[name].high:.3f}]"
            for name in SHOWN))
    return lines


def plot_versus(rows: list[Estimate], key: str, paths: list[Path], normalised: str) -> list[Path]:
    """One panel per metric of `SHOWN`: each method's point estimates against the setting with bars and a band for
    the 95% CIs; lines across (with their band) for the methods without a value; a log axis when the values span a
    factor of 10 or more. `normalised`: what the scores are, for the figure's title."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    methods = sorted({row.method for row in rows}, key=lambda m: (_first(rows, m).value is None, m))
    values = sorted({row.value for row in rows if row.value is not None})
    with style():
        fig = Figure(figsize=(5.0 * len(SHOWN), 4.0), layout="constrained")
        FigureCanvasAgg(fig)
        for ax, metric in zip(fig.subplots(1, len(SHOWN)), SHOWN, strict=True):
            for i, method in enumerate(methods):
                mine = sorted((row for row in rows if row.method == method and row.metric == metric),
                              key=lambda row: row.value)
                color = f"C{i}"
                if mine[0].value is None:
                    ax.axhline(mine[0].point, color=color, linestyle="--", label=method)
                    ax.axhspan(mine[0].low, mine[0].high, color=color, alpha=0.12)
                    continue
                x = [row.value for row in mine]
                ax.errorbar(x, [row.point for row in mine], yerr=[[row.point - row.low for row in mine],
                                                                 [row.high - row.point for row in mine]],
                            fmt="o-", capsize=3, color=color, label=method)  # the bars show a lone value's CI
                ax.fill_between(x, [row.low for row in mine], [row.high for row in mine], color=color, alpha=0.2)
            if values and values[0] > 0 and values[-1] / values[0] >= 10:
                ax.set_xscale("log")
            if values:
                ax.set_xticks(values, [_number(v, grouped=True) for v in values], rotation=30)
                ax.minorticks_off()
            ax.set(title=f"{metric} (95% CI)", xlabel=key, ylabel="normalised score (higher is better)")
        fig.suptitle(f"scores: {normalised}", fontsize="small")
        handles, labels = fig.axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3))
        return save(fig, paths)


def _first(rows: list[Estimate], method: str) -> Estimate:
    return next(row for row in rows if row.method == method)


def _number(value: float, grouped: bool = False) -> str:
    """`value` as written in a config: an integer without a decimal point (with thousands separators if
    `grouped`), else in full."""
    if value.is_integer():
        return f"{int(value):,}" if grouped else str(int(value))
    return repr(value)
