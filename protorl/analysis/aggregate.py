"""`protorl-aggregate PATH [PATH ...]`: learning curves, final-score tables and rliable statistics over runs.

By default each downstream phase (`finetune/` or `finetune_<task>/`) of each run directory found under the
paths is one record, its curve the evaluation return (`eval.csv`); with `--metric COLUMN` (e.g.
`coverage/entropy`, figure 9) each pre-training phase is one, its curve that column of `analysis.csv`. A
record is complete (values and `result.json`), running or stopped (values, no `result.json`) or with
no evaluation yet. Only complete records enter the curves, the tables and the statistics: partial curves are
left out, and every (method, task, seed) of the grid without a complete record is listed in `summary.txt`.
Writes into the output directory: `curves.png/.pdf`, `scores.csv/.md`, `aggregate.csv`, `aggregate.png/.pdf`,
`profiles.png/.pdf` and `summary.txt`. The statistics need rliable (the `sweep` extra), imported only then.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from omegaconf import DictConfig, OmegaConf

from protorl.analysis.paths import inside
from protorl.sweep import agent_choice

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# DMC rewards lie in [0, 1] per control step, so a task's returns lie in [0, control steps per episode]:
# 1000 for the suite's tasks, the maze and the walker set; 250 for Reach Duplo (appendix C.1). Dividing by
# that maps scores to [0, 1] for rliable's aggregates and performance profiles.
DMC_MAX_RETURN = 1000.0
METRICS = {"IQM": "aggregate_iqm", "Mean": "aggregate_mean", "Median": "aggregate_median",  # -> rliable.metrics
           "Optimality Gap": "aggregate_optimality_gap"}
COMPLETE, RUNNING, NOT_EVALUATED = "complete", "running or stopped", "no evaluation yet"
DRQ = "drq"


@dataclass(frozen=True)
class Metric:
    """What a record's curve holds: a column of a CSV of a run's downstream or pre-training phases."""

    column: str
    csv_name: str
    downstream: bool  # finetune*/ phases (one per task); else the pretrain/ phase
    scale: float | None  # final values are divided by this for rliable (scores in [0, 1]); None: max_return()
    label: str

    def normaliser(self, task: str) -> float:
        return max_return(task) if self.scale is None else self.scale


RETURN = Metric("episode_reward", "eval.csv", True, None, "eval episode return")


def pretraining_metric(column: str) -> Metric:
    """A column of `pretrain/analysis.csv`, e.g. `coverage/entropy` (already in [0, 1])."""
    return Metric(column, "analysis.csv", False, 1.0, column)


def max_return(task: str) -> float:
    """The highest return of `task`: one per control step of its episode (DMC rewards lie in [0, 1])."""
    from protorl.envs import reach_duplo, split_task

    try:
        domain = split_task(task)[0]
    except ValueError:  # a task this protorl does not know: the suite's episode length
        return DMC_MAX_RETURN
    return float(reach_duplo.EPISODE_STEPS) if domain == reach_duplo.DOMAIN else DMC_MAX_RETURN


class AggregateError(ValueError):
    """A path that does not exist or holds no run, a run whose config lacks a `--group-by` key, a `--metric`
    column that no run has, or rliable missing when the statistics need it."""


@dataclass
class Record:
    """One phase of one run (downstream, or pre-training for `--metric`): its curve and whether it finished."""

    method: str
    agent: str
    task: str
    seed: int
    frames: np.ndarray  # (evals,) environment frames, increasing
    values: np.ndarray  # (evals,) the metric at those frames, e.g. the mean eval episode return
    status: str
    path: Path

    @property
    def final(self) -> float:
        """The metric at the last evaluation (e.g. the mean return)."""
        return float(self.values[-1])


def discover_runs(paths: list[Path]) -> list[Path]:
    """The run directories (holding `config.yaml`) at or below `paths`, without looking inside a run.

    A directory below a path that is a symlink leading outside that path raises OutsideRunError: name its
    target as a path itself. One leading inside is not followed (the walk finds its target)."""
    runs = []
    for path in paths:
        if not path.is_dir():
            raise AggregateError(f"{path} does not exist" if not path.exists() else f"{path} is not a directory")
        found = []
        for root, dirs, files in os.walk(path):
            if "config.yaml" in files:
                found.append(Path(root))
                dirs.clear()
            dirs[:] = sorted(d for d in dirs if d != ".hydra")  # Hydra's own copy of the unresolved config
            for name in dirs:
                inside(Path(root, name), path)
        if not found:
            raise AggregateError(f"{path} holds no protorl run (no directory with a config.yaml below it)")
        runs.extend(found)
    return sorted(set(runs))


def method_label(cfg: DictConfig, group_by: list[str], run_dir: Path) -> str:
    """The value alone for one key (`--group-by agent.name`, `--group-by agent`: the agent config chosen, e.g.
    proto_paper), otherwise `key=value` parts joined by spaces."""
    absent = object()
    values = [agent_choice(run_dir, cfg) if key == "agent" else OmegaConf.select(cfg, key, default=absent)
              for key in group_by]
    for key, value in zip(group_by, values, strict=True):
        if value is absent:
            raise AggregateError(f"{run_dir}/config.yaml has no key {key} (from --group-by)")
    if len(group_by) == 1 and group_by[0] in ("agent", "agent.name"):
        return str(values[0])
    return " ".join(f"{key}={value}" for key, value in zip(group_by, values, strict=True))


def read_curve(path: Path, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(frames, column) of a CSV sorted by frames; rows with a missing value are skipped."""
    points = []
    if path.is_file():
        with open(path, newline="") as f:
            points = [(float(row["frames"]), float(row[column])) for row in csv.DictReader(f)
                      if row.get("frames") and row.get(column)]
    points.sort()
    return np.array([p[0] for p in points]), np.array([p[1] for p in points])


def phases(run_dir: Path, cfg: DictConfig, metric: Metric) -> list[tuple[Path, str]]:
    """(phase directory, task) pairs of the run that `metric` reads."""
    if not metric.downstream:
        return [(run_dir / "pretrain", cfg.get("pretrain_env") or cfg.env)] if (run_dir / "pretrain").is_dir() else []
    return [(phase, cfg.env if phase.name == "finetune" else phase.name.removeprefix("finetune_"))
            for phase in sorted(run_dir.glob("finetune*"))
            if phase.is_dir() and (phase.name == "finetune" or phase.name.startswith("finetune_"))]


def read_records(run_dir: Path, group_by: list[str], metric: Metric = RETURN) -> list[Record]:
    """One record per phase directory of the run that `metric` reads; OutsideRunError if a symlink leads a
    file it reads (`config.yaml`, `.hydra/hydra.yaml`, a phase's CSV or `result.json`) outside the run."""
    cfg = OmegaConf.load(inside(run_dir / "config.yaml", run_dir))
    inside(run_dir / ".hydra" / "hydra.yaml", run_dir)  # read by method_label for --group-by agent
    method = method_label(cfg, group_by, run_dir)
    records = []
    for phase, task in phases(run_dir, cfg, metric):
        frames, values = read_curve(inside(phase / metric.csv_name, run_dir), metric.column)
        result = inside(phase / "result.json", run_dir)
        status = NOT_EVALUATED if not len(frames) else COMPLETE if result.is_file() else RUNNING
        records.append(Record(method, str(cfg.agent.name), task, int(cfg.seed), frames, values, status, phase))
    return records


def check_metric_column(records: list[Record], runs: list[Path], metric: Metric) -> None:
    """AggregateError unless a pre-training record's CSV has the `--metric` column; the message lists the
    columns those CSVs have."""
    if metric.downstream:
        return
    files = [r.path / metric.csv_name for r in records if (r.path / metric.csv_name).is_file()]
    if not files:
        raise AggregateError(f"--metric {metric.column}: none of the runs read ({len(runs)}) has a "
                             f"pretrain/{metric.csv_name}")
    columns = set()
    for path in files:
        with open(path, newline="") as f:
            columns.update(next(csv.reader(f), []))
    if metric.column not in columns:
        raise AggregateError(f"--metric {metric.column}: no such column in the pretrain/{metric.csv_name} of the "
                             f"{len(files)} runs that have one; their columns: "
                             f"{', '.join(sorted(columns - {'frames'})) or 'none'}")


def require_rliable() -> None:
    """AggregateError, saying how to install it, unless rliable (the `sweep` extra) imports."""
    try:
        from rliable import library, metrics  # noqa: F401
    except ImportError as error:
        raise AggregateError(f"the statistics over complete records need rliable, which does not import ({error}): "
                             'pip install -e ".[sweep]"') from error


def flat_config(run_dir: Path) -> dict[str, object]:
    """The run's config as {dotted key: value}, without `run_dir`."""
    def flatten(node, prefix: str = ""):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from flatten(value, f"{prefix}{key}.")
        else:
            yield prefix[:-1], node

    config = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    return {key: value for key, value in flatten(config) if key != "run_dir"}


def deduplicate(records: list[Record]) -> tuple[list[Record], list[Record]]:
    """One record per (method, task, seed), preferring complete ones, then the longest curve; and the rest.

    Records of one (method, task, seed) from runs whose configs differ are different experiments, not
    repeats: that raises `AggregateError` naming the keys to add to `--group-by`."""
    groups = defaultdict(list)
    for record in records:
        groups[record.method, record.task, record.seed].append(record)
    kept, dropped = [], []
    for (method, task, seed), group in groups.items():
        configs = [flat_config(record.path.parent) for record in group] if len(group) > 1 else [{}]
        differing = sorted({key for config in configs[1:] for key in config.keys() | configs[0].keys()
                            if config.get(key) != configs[0].get(key)})
        if differing:
            raise AggregateError(f"{method} on {task} seed {seed} comes from runs with different configs "
                                 f"({', '.join(str(r.path.parent) for r in group)}; they differ in "
                                 f"{', '.join(differing)}): add the keys that tell them apart to --group-by, "
                                 f"e.g. --group-by agent.name {differing[0]}")
        group.sort(key=lambda r: (r.status != COMPLETE, -len(r.frames), str(r.path)))
        kept.append(group[0])
        dropped.extend(group[1:])
    return sorted(kept, key=lambda r: (r.task, r.method, r.seed)), dropped


def not_complete(records: list[Record]) -> list[str]:
    """Every (method, task, seed) of the grid seen among the records without a complete record, and why."""
    by_key = {(r.method, r.task, r.seed): r for r in records}
    lines = []
    for key in itertools.product(*(sorted({k[i] for k in by_key}) for i in range(3))):
        record = by_key.get(key)
        if record is None:
            lines.append(f"{key[0]}  {key[1]}  seed {key[2]}: never ran")
        elif record.status == RUNNING:
            lines.append(f"{key[0]}  {key[1]}  seed {key[2]}: {RUNNING}, last evaluation at "
                         f"{record.frames[-1]:.0f} frames ({record.path})")
        elif record.status == NOT_EVALUATED:
            lines.append(f"{key[0]}  {key[1]}  seed {key[2]}: {NOT_EVALUATED} ({record.path})")
    return lines


def score_table(complete: list[Record]) -> list[dict]:
    """Per (task, method): mean and population std (ddof=0) of the final scores over seeds."""
    groups = defaultdict(list)
    for record in complete:
        groups[record.task, record.method].append(record.final)
    return [{"task": task, "method": method, "mean": float(np.mean(scores)), "std": float(np.std(scores)),
             "n_seeds": len(scores)} for (task, method), scores in sorted(groups.items())]


def write_scores(rows: list[dict], out: Path, metric: Metric) -> list[Path]:
    """`scores.csv` (tidy) and `scores.md` (one row per task, one column per method)."""
    with open(out / "scores.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["task", "method", "mean", "std", "n_seeds"])
        writer.writeheader()
        writer.writerows(rows)
    (out / "scores.md").write_text(markdown_table(rows, metric) + "\n")
    return [out / "scores.csv", out / "scores.md"]


def markdown_table(rows: list[dict], metric: Metric) -> str:
    """One row per task, one column per method, cells `mean ± std (n seeds)`."""
    methods = sorted({row["method"] for row in rows})
    digits = 1 if metric.scale is None else 3  # returns in the hundreds; analysis values around [0, 1]
    cells = {(row["task"], row["method"]): f"{row['mean']:.{digits}f} ± {row['std']:.{digits}f} "
                                           f"({row['n_seeds']} seed{'s' if row['n_seeds'] > 1 else ''})"
             for row in rows}
    lines = [f"Final {metric.label}: mean ± population std (ddof=0) over seeds.", "",
             "| task | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for task in sorted({row["task"] for row in rows}):
        lines.append(f"| {task} | " + " | ".join(cells.get((task, m), "–") for m in methods) + " |")
    return "\n".join(lines)


def score_matrices(complete: list[Record], metric: Metric) -> tuple[dict[str, np.ndarray], list[str]]:
    """Per method, normalised final scores (seeds, tasks) over its tasks and the seeds complete on all of
    them; and a line per method: the seeds and tasks used, or why it is skipped."""
    by_method = defaultdict(dict)
    for record in complete:
        by_method[record.method][record.task, record.seed] = record.final / metric.normaliser(record.task)
    matrices, lines = {}, []
    for method, scores in sorted(by_method.items()):
        tasks = sorted({task for task, _ in scores})
        seeds = sorted(set.intersection(*({s for t, s in scores if t == task} for task in tasks)))
        if not seeds:
            lines.append(f"{method}: skipped (no seed complete on all of its tasks {', '.join(tasks)})")
            continue
        matrices[method] = np.array([[scores[task, seed] for task in tasks] for seed in seeds])
        lines.append(f"{method}: seeds {', '.join(map(str, seeds))} x tasks {', '.join(tasks)}")
    return matrices, lines


def interval_estimates(matrices: dict[str, np.ndarray], reps: int) -> tuple[dict, dict]:
    """rliable's point estimates (metrics,) and 95% stratified-bootstrap CIs (2, metrics) per method."""
    from rliable import library, metrics

    functions = [getattr(metrics, name) for name in METRICS.values()]
    return library.get_interval_estimates(matrices, lambda scores: np.array([f(scores) for f in functions]), reps=reps)


def write_estimates(points: dict, intervals: dict, path: Path) -> Path:
    """`aggregate.csv`: one row per (method, metric)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "metric", "point", "ci_low", "ci_high"])
        for method in points:
            for i, metric in enumerate(METRICS):
                writer.writerow([method, metric, points[method][i], intervals[method][0, i], intervals[method][1, i]])
    return path


def save(fig: Figure, stem: Path) -> list[Path]:
    """`stem.png` and `stem.pdf`."""
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    return paths


def seed_curve(seeds: list[Record]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(frames, mean, population std) over the records' values at the frames they all evaluated at."""
    frames = np.array(sorted(set.intersection(*(set(r.frames) for r in seeds))))
    curves = [dict(zip(r.frames, r.values, strict=True)) for r in seeds]
    values = np.array([[curve[x] for x in frames] for curve in curves])  # (seeds, frames)
    return frames, values.mean(axis=0), values.std(axis=0)


def plot_curves(complete: list[Record], colors: dict[str, str], stem: Path, ylabel: str) -> list[Path]:
    """One panel per task: mean ± std over seeds on their shared frames per method; DrQ's final mean as a
    dashed line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tasks = sorted({r.task for r in complete})
    cols = min(3, len(tasks))
    fig = Figure(figsize=(4.5 * cols, 3.5 * math.ceil(len(tasks) / cols)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(math.ceil(len(tasks) / cols), cols, squeeze=False).flat)
    for task, ax in zip(tasks, axes, strict=False):
        on_task = [r for r in complete if r.task == task]
        for method in sorted({r.method for r in on_task if r.agent != DRQ}):
            seeds = [r for r in on_task if r.method == method]
            frames, mean, std = seed_curve(seeds)
            ax.plot(frames, mean, color=colors[method], label=f"{method} ({len(seeds)} seeds)")
            ax.fill_between(frames, mean - std, mean + std, color=colors[method], alpha=0.2)
        drq = [r.final for r in on_task if r.agent == DRQ]
        if drq:
            ax.axhline(np.mean(drq), color="k", linestyle="--", label="DrQ")
        ax.set(title=task, xlabel="environment frames", ylabel=ylabel)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes[len(tasks):]:  # the unused panels of the last row
        ax.set_visible(False)
    return save(fig, stem)


def _plot_utils():
    """rliable's plot_utils, which draw through pyplot: on the Agg backend, chosen before pyplot is imported."""
    import matplotlib

    matplotlib.use("Agg")
    from rliable import plot_utils

    return plot_utils


def plot_estimates(points: dict, intervals: dict, colors: dict[str, str], stem: Path, xlabel: str) -> list[Path]:
    """rliable's interval plot: per metric, each method's point estimate and 95% CI."""
    plot_utils = _plot_utils()
    from matplotlib import pyplot as plt

    height = 0.5 * len(points)  # inches; rliable places the x label in figure coordinates: 0.6 in below the axes
    fig, _ = plot_utils.plot_interval_estimates(
        points, intervals, list(METRICS), colors=colors, row_height=0.5, subfigure_width=4.0, wspace=0.25,
        xlabel_y_coordinate=0.11 - 0.6 / height, xlabel=xlabel)
    paths = save(fig, stem)
    plt.close(fig)
    return paths


def plot_profiles(matrices: dict[str, np.ndarray], reps: int, colors: dict[str, str], stem: Path) -> list[Path]:
    """Fraction of (seed, task) scores above each threshold in [0, 1], with 95% bootstrap CIs."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from rliable import library

    plot_utils = _plot_utils()
    taus = np.linspace(0.0, 1.0, 101)
    profiles, cis = library.create_performance_profile(matrices, taus, reps=reps)
    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    plot_utils.plot_performance_profiles(profiles, taus, performance_profile_cis=cis, ax=ax, colors=colors,
                                         xlabel=r"normalised score $\tau$", legend=True, legendsize="small")
    return save(fig, stem)


def aggregate_runs(paths: list[Path], out: Path, group_by: list[str], reps: int = 2000, seed: int = 0,
                   metric: Metric = RETURN) -> str:
    """Write the tables, statistics and plots of the runs under `paths` into `out`; returns the summary.

    Symlinks: a run is read only if it stays inside the path it was found under, and its files only if they
    stay inside the run directory. One leading elsewhere (a run directory linked into a sweep, a config.yaml or
    CSV linked to another run's) raises OutsideRunError before anything is written, so that the results are
    those of exactly the runs named, none silently dropped or mixed in. To include a linked run, name its target
    as a path."""
    runs = discover_runs(paths)
    records = [r for run in runs for r in read_records(run, group_by, metric)]
    check_metric_column(records, runs, metric)
    records, duplicates = deduplicate(records)
    normalised = metric.label if metric.scale == 1 else f"{metric.label} / the task's maximum return"
    complete = [r for r in records if r.status == COMPLETE]
    matrices, used = score_matrices(complete, metric)
    if matrices:
        require_rliable()
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"protorl aggregate of {', '.join(map(str, paths))}",
             f"  {len(runs)} runs, {len(records)} {'downstream' if metric.downstream else 'pre-training'} records "
             f"of {metric.label} ({len(complete)} complete)",
             f"  methods: {', '.join(sorted({r.method for r in records})) or 'none'}",
             f"  tasks: {', '.join(sorted({r.task for r in records})) or 'none'}"]
    lines += [f"  run without such a phase: {run}" for run in runs if not any(run in r.path.parents
                                                                                      for r in records)]
    lines += [f"  duplicate ignored: {r.path}" for r in duplicates]
    missing = not_complete(records)
    lines.append(f"  not complete ({len(missing)} of methods x tasks x seeds):" if missing else "  all complete")
    lines += [f"    {line}" for line in missing]
    written = []
    if not complete:
        lines.append("  no complete record: no table, statistics or plot written")
    else:
        rows = score_table(complete)
        colors = {method: f"C{i}" for i, method in enumerate(sorted({r.method for r in complete}))}
        written += write_scores(rows, out, metric) + plot_curves(complete, colors, out / "curves", metric.label)
        lines += ["", markdown_table(rows, metric), ""]
        lines.append(f"  rliable ({normalised}, {reps} bootstrap reps, numpy seed {seed}):")
        lines += [f"    {line}" for line in used]
        if matrices:
            np.random.seed(seed)  # rliable's stratified bootstrap draws from numpy's global RNG
            points, intervals = interval_estimates(matrices, reps)
            written.append(write_estimates(points, intervals, out / "aggregate.csv"))
            written += plot_estimates(points, intervals, colors, out / "aggregate", f"normalised score ({normalised})")
            written += plot_profiles(matrices, reps, colors, out / "profiles")
    written.append(out / "summary.txt")
    lines.append("  files: " + ", ".join(map(str, written)))
    text = "\n".join(lines)
    (out / "summary.txt").write_text(text + "\n")
    return text
