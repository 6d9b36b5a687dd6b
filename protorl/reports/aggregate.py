"""`protorl-aggregate PATH [PATH ...]`: learning curves, final-score tables and rliable statistics over runs.

By default each downstream phase (`finetune/` or `finetune_<task>/`) of each run directory found under the
paths is one record, its curve the evaluation return (`eval.csv`); with `--metric COLUMN` (e.g.
`coverage/entropy`, figure 9) each pre-training phase is one, its curve that column of `analysis.csv`
(`protorl.reports.records`). Only complete records enter the curves, the tables and the statistics: partial
curves are left out, and every (method, task, seed) of the grid without a complete record is listed in
`summary.txt`. Writes into the output directory: `curves.png/.pdf`, `scores.csv/.md`, `aggregate.csv`,
`aggregate.png/.pdf`, `profiles.png/.pdf`, `runs.csv` (each record's score) and `summary.txt`; with `--versus KEY`
also `versus.csv` and `versus.png/.pdf`. The statistics need rliable (the `sweep` extra).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from protorl.errors import ResultsError
from protorl.plots import Curve, Level, Panel, plot_curves
from protorl.reports.records import (
    COMPLETE,
    RETURN,
    Metric,
    Record,
    check_metric_column,
    check_references,
    deduplicate,
    discover_runs,
    not_complete,
    read_records,
    up_to,
)
from protorl.reports.stats import (
    interval_estimates,
    plot_estimates,
    plot_profiles,
    require_rliable,
    write_estimates,
)
from protorl.reports.versus import estimates, label_by_setting, plot_versus, read_baseline, summary_lines, write_versus
from protorl.storage.run_files import PRETRAIN_DIR, SWEEP_INDEX_FILE, is_complete, scratch_dir_name


def score_table(complete: list[Record], metric: Metric = RETURN) -> list[dict]:
    """Per (task, method): mean and population std (ddof=0) of the scores (`metric.score`) over seeds."""
    groups = defaultdict(list)
    for record in complete:
        groups[record.task, record.method].append(metric.score(record))
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
    lines = [f"{metric.score_label.capitalize()}: mean ± population std (ddof=0) over seeds.", "",
             "| task | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for task in sorted({row["task"] for row in rows}):
        lines.append(f"| {task} | " + " | ".join(cells.get((task, m), "–") for m in methods) + " |")
    return "\n".join(lines)


def score_matrices(complete: list[Record], metric: Metric) -> tuple[dict[str, np.ndarray], list[str]]:
    """Per method, normalised scores (`metric.score`; seeds, tasks) over its tasks and the seeds complete on all
    of them; and a line per method: the seeds and tasks used, or why it is skipped."""
    by_method = defaultdict(dict)
    for record in complete:
        by_method[record.method][record.task, record.seed] = metric.score(record) / metric.normaliser(record.task)
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


def seed_curve(seeds: list[Record]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(frames, mean, population std) over the records' values at the frames they all evaluated at."""
    frames = np.array(sorted(set.intersection(*(set(r.frames) for r in seeds))))
    curves = [dict(zip(r.frames, r.values, strict=True)) for r in seeds]
    values = np.array([[curve[x] for x in frames] for curve in curves])  # (seeds, frames)
    return frames, values.mean(axis=0), values.std(axis=0)


def _pretrains(agent: str) -> bool:
    """Whether the registered agent named `agent` has a task-agnostic pre-training phase (one no longer
    registered is taken to have one)."""
    from protorl.agents import registered_agents

    cls = registered_agents().get(agent)
    return cls is None or cls.supports("pretrain")


def method_titles(records: list[Record]) -> dict[str, str]:
    """Each method's name in the figures: the docs' name (`Record.title`) where its records agree on one and no
    other method has it, else the method's label."""
    found = defaultdict(set)
    for record in records:
        found[record.method].add(record.title or record.method)
    titles = {method: next(iter(names)) if len(names) == 1 else method for method, names in found.items()}
    shared = {title for title in titles.values() if list(titles.values()).count(title) > 1}
    return {method: method if title in shared else title for method, title in titles.items()}


def curve_panel(task: str, complete: list[Record], colors: dict[str, str], ylabel: str,
                all_curves: bool = False, titles: dict[str, str] | None = None) -> Panel:
    """Mean ± std over seeds on their shared frames per method that pre-trains (or every method with
    `all_curves`); per method that does not (DrQ), its final mean as a dashed line, as the paper's figures
    draw DrQ. `titles`: the methods' names in the legend (default: their labels)."""
    titles = titles or {}
    by_method = defaultdict(list)
    for record in complete:
        if record.task == task:
            by_method[record.method, all_curves or _pretrains(record.agent)].append(record)
    curves, levels = [], []
    for (method, as_curve), seeds in sorted(by_method.items()):
        if as_curve:
            frames, mean, std = seed_curve(seeds)
            curves.append(Curve(frames, mean, f"{titles.get(method, method)} ({len(seeds)} seeds)",
                                color=colors[method], spread=std))
        else:
            levels.append(Level(f"{titles.get(method, method)} (final, {len(seeds)} seeds)",
                                float(np.mean([r.final for r in seeds])), colors[method]))
    return Panel(task, ylabel, curves, levels)


def varies_with_pretraining(record: Record) -> bool:
    """Whether a record's score can vary with a pre-training setting: a pre-trained agent's, not one fine-tuned
    without pre-training (`finetune_scratch_<task>`) nor one of an agent without pre-training (DrQ)."""
    return _pretrains(record.agent) and record.path.name != scratch_dir_name(record.task)


PRETRAINING_UNFINISHED = "pre-training running or stopped, no downstream phase yet"


def _pretraining_unfinished(run_dir: Path) -> bool:
    """Whether the run's pre-training has started and not completed."""
    pretrain = run_dir / PRETRAIN_DIR
    return pretrain.is_dir() and not is_complete(pretrain)


def stopped_jobs(paths: list[Path], records: list) -> list[str]:
    """The jobs that a sweep's `index.csv` marks as not complete and that left no record of their own (e.g. refused
    before writing anything)."""
    stopped = []
    for path in paths:
        index = path / SWEEP_INDEX_FILE
        if not index.is_file():
            continue
        with open(index, newline="") as file:
            for row in csv.DictReader(file):
                run_dir = path / row.get("run_dir", "")
                if row.get("complete") == "false" and not any(run_dir in r.path.parents for r in records):
                    stopped.append(f"{run_dir}: stopped before completing ({row.get('overrides', '')}; index.csv)")
    return stopped


def aggregate_runs(paths: list[Path], out: Path, group_by: list[str], reps: int = 2000, seed: int = 0,
                   metric: Metric = RETURN, tasks: list[str] | None = None, all_curves: bool = False,
                   versus: str | None = None,
                   baselines: Sequence[tuple[Path, str, float | None]] = ()) -> str:
    """Write the tables, statistics and plots of the runs under `paths` into `out`; returns the summary. `tasks`:
    only the records of these tasks (default: all); `all_curves`: methods without pre-training drawn as curves
    too, not as a line at their final mean; `versus`: a numeric config key (e.g. `pretrain_frames`) to plot the
    statistics against (`protorl.reports.versus`), with `baselines` ((aggregate.csv, method, value) of earlier
    aggregates) as lines across, or as points where the value is given.

    Symlinks: a run is read only if it stays inside the path it was found under, and its files only if they
    stay inside the run directory. One leading elsewhere (a run directory linked into a sweep, a config.yaml or
    CSV linked to another run's) raises ResultsError before anything is written, so that the results are
    those of exactly the runs named, none silently dropped or mixed in. To include a linked run, name its target
    as a path."""
    runs = discover_runs(paths)
    records = [r for run in runs for r in read_records(run, group_by, metric)]
    if metric.at is not None:
        records = [up_to(r, metric.at) for r in records]
    where, baseline_rows = {}, []
    if versus is not None:
        records, where = label_by_setting(records, versus, varies_with_pretraining)
        baseline_rows = [row for path, method, value in baselines for row in read_baseline(path, method, value)]
    if tasks is not None:
        unknown = sorted(set(tasks) - {r.task for r in records})
        if unknown:
            raise ResultsError(f"no record of task {', '.join(unknown)} (--tasks) under {', '.join(map(str, paths))}")
        records = [r for r in records if r.task in tasks]
    check_references(records, paths, metric)
    check_metric_column(records, runs, metric)
    records, duplicates = deduplicate(records, frozenset({versus} if versus else ()))
    normalised = metric.normalised_label
    titles = method_titles(records)
    complete = [r for r in records if r.status == COMPLETE]
    matrices, used = score_matrices(complete, metric)
    if matrices:
        require_rliable()
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"protorl aggregate of {', '.join(map(str, paths))}",
             f"  {len(runs)} runs, {len(records)} {'downstream' if metric.downstream else 'pre-training'} records "
             f"of {metric.label} ({len(complete)} complete)",
             f"  methods: {', '.join(_named(method, titles) for method in sorted(titles)) or 'none'}",
             f"  tasks: {', '.join(sorted({r.task for r in records})) or 'none'}"]
    without = [run for run in runs if not any(run in r.path.parents for r in records + duplicates)]
    unfinished = [run for run in without if _pretraining_unfinished(run)]
    lines += [f"  {PRETRAINING_UNFINISHED if run in unfinished else 'run without such a phase'}: {run}"
              for run in without]  # why a run has no record
    lines += [f"  duplicate ignored: {r.path}" for r in duplicates]
    missing = not_complete(records) + stopped_jobs(paths, records) + [f"{run}: {PRETRAINING_UNFINISHED}"
                                                                      for run in unfinished]
    lines.append(f"  not complete ({len(missing)} of methods x tasks x seeds):" if missing else "  all complete")
    lines += [f"    {line}" for line in missing]
    written = []
    if not complete:
        lines.append("  no complete record: no table, statistics or plot written")
    else:
        rows = score_table(complete, metric)
        colors = {method: f"C{i}" for i, method in enumerate(sorted({r.method for r in complete}))}
        panels = [curve_panel(task, complete, colors, _higher_is_better(metric), all_curves, titles)
                  for task in sorted({r.task for r in complete})]
        written += write_scores(rows, out, metric) + [write_runs(complete, out / "runs.csv", metric)]
        written += plot_curves(panels, _png_pdf(out / "curves"))
        lines += ["", markdown_table(rows, metric), ""]
        lines.append(f"  rliable ({normalised}, {reps} bootstrap reps, numpy seed {seed}):")
        lines += [f"    {line}" for line in used]
        if matrices:
            np.random.seed(seed)  # rliable's stratified bootstrap draws from numpy's global RNG
            points, intervals = interval_estimates(matrices, reps)
            written.append(write_estimates(points, intervals, out / "aggregate.csv"))
            shown = {titles[method]: method for method in matrices}  # the figures name the methods as the docs do
            written += plot_estimates({name: points[method] for name, method in shown.items()},
                                      {name: intervals[method] for name, method in shown.items()},
                                      {name: colors[method] for name, method in shown.items()},
                                      _png_pdf(out / "aggregate"),
                                      f"normalised score ({normalised}); higher is better, the optimality gap lower")
            written += plot_profiles({name: matrices[method] for name, method in shown.items()}, reps,
                                     {name: colors[method] for name, method in shown.items()},
                                     _png_pdf(out / "profiles"))
            if versus is not None:
                against = estimates(points, intervals, matrices, where) + baseline_rows
                lines += ["", f"  against {versus} (95% CIs):"]
                lines += [f"    {line}" for line in summary_lines(against, versus)]
                written.append(write_versus(against, versus, out / "versus.csv"))
                written += plot_versus(against, versus, _png_pdf(out / "versus"), normalised)
    written.append(out / "summary.txt")
    lines.append("  files: " + ", ".join(map(str, written)))
    text = "\n".join(lines)
    (out / "summary.txt").write_text(text + "\n")
    return text


def write_runs(complete: list[Record], path: Path, metric: Metric) -> Path:
    """`runs.csv`: each complete record's score and normalised score, with its phase directory."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "task", "seed", "score", "normalised", "phase"])
        for r in complete:
            score = metric.score(r)
            writer.writerow([r.method, r.task, r.seed, score, score / metric.normaliser(r.task), r.path])
    return path


def _named(method: str, titles: dict[str, str]) -> str:
    """`method`, with its name in the figures if that differs."""
    return method if titles[method] == method else f"{method} ({titles[method]})"


def _higher_is_better(metric: Metric) -> str:
    """The y label of a learning-curve panel: the metric, and which way is better where that is known."""
    return f"{metric.label} (higher is better)" if metric.downstream or metric.column.startswith("coverage/") \
        else metric.label


def _png_pdf(stem: Path) -> list[Path]:
    return [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
