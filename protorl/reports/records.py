"""The phases of many runs as records for protorl-aggregate: discovery, reading, deduplication, what is missing.

A record is one phase of one run (downstream, or pre-training with `--metric`): its curve of a metric over
frames, complete (values and `result.json`), running or stopped (values, no `result.json`) or with no
evaluation yet. A fine-tuning without pre-training (`compare_without_pretraining`: `finetune_scratch_<task>/`) is a
record of its task under the run's method label followed by "without pre-training".
"""

from __future__ import annotations

import itertools
import os
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from protorl.errors import ResultsError
from protorl.plots import series
from protorl.reports.io import agent_choice, read_csv, read_result
from protorl.reports.paths import inside
from protorl.storage.run_files import (
    CONFIG_FILE,
    PRETRAIN_DIR,
    RESULT_FILE,
    SCRATCH_PREFIX,
    downstream_dirs,
    downstream_name,
    read_run_config,
    scratch_dir_name,
)
from protorl.storage.rundir import result_changing_differences

# DMC rewards lie in [0, 1] per control step, so a task's returns lie in [0, control steps per episode]:
# 1000 for the suite's tasks, the maze and the walker set; 250 for Reach Duplo (appendix C.1). Dividing by
# that maps scores to [0, 1] for rliable's aggregates and performance profiles.
DMC_MAX_RETURN = 1000.0
WITHOUT_PRETRAINING = "without pre-training"  # the method label's suffix for `finetune_scratch_<task>` runs
COMPLETE, RUNNING, NOT_EVALUATED = "complete", "running or stopped", "no evaluation yet"
UNVERIFIED = "its result.json does not match its digest (changed after it was written)"  # not taken as complete
ENDED_SHORT = "ended before the frames asked for"  # a finished phase that stopped short of `Metric.at`


@dataclass(frozen=True)
class Metric:
    """What a record's curve holds: a column of a CSV of a run's downstream or pre-training phases."""

    column: str
    csv_name: str
    downstream: bool  # finetune*/ phases (one per task); else the pretrain/ phase
    scale: float | None  # scores are divided by this for rliable (scores in [0, 1]); None: max_return()
    label: str
    over: str = "final"  # a record's score: its "final" value, or the "mean" over its evaluations (area under curve)
    references: Mapping[str, float] | None = None  # per task, a reference score to divide by (e.g. an expert's)
    at: int | None = None  # read each curve as it stood at these frames (e.g. a pre-training budget); None: whole

    def normaliser(self, task: str) -> float:
        if self.references is not None:
            return self.references[task]
        return max_return(task) if self.scale is None else self.scale

    @property
    def normalised_label(self) -> str:
        """What rliable's scores are: the score itself, or the score over the divisor."""
        if self.references is not None:
            scores = ", ".join(f"{task} {score:g}" for task, score in sorted(self.references.items()))
            return f"{self.score_label} / the reference score ({scores})"
        return self.score_label if self.scale == 1 else f"{self.score_label} / the task's maximum return"

    def score(self, record: Record) -> float:
        """The record's score: its value at the last evaluation, or the mean of its curve (`over`)."""
        return record.final if self.over == "final" else float(np.mean(record.values))

    @property
    def score_label(self) -> str:
        if self.at is not None:
            return f"{self.label} at {self.at:,} frames" if self.over == "final" else \
                f"{self.label}, mean over the evaluations up to {self.at:,} frames"
        return f"final {self.label}" if self.over == "final" else f"{self.label}, mean over the evaluations"


RETURN = Metric("episode_reward", "eval.csv", True, None, "eval episode return")
SUCCESS = Metric("success_rate", "eval.csv", True, 1.0, "eval success rate")  # sparse tasks
SCORES = ("final", "mean")  # Metric.over


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


@dataclass
class Record:
    """One phase of one run: its curve and whether it finished."""

    method: str
    agent: str
    task: str
    seed: int
    frames: np.ndarray  # (evals,) environment frames, increasing
    values: np.ndarray  # (evals,) the metric at those frames, e.g. the mean eval episode return
    status: str
    path: Path
    title: str = ""  # the method as the docs name it (`method_title`); empty: `method`

    @property
    def final(self) -> float:
        """The metric at the last evaluation (e.g. the mean return)."""
        return float(self.values[-1])


def up_to(record: Record, frames: int) -> Record:
    """The record as it stood at `frames`: its curve up to there; complete (its score its last value at or before
    `frames`) once the run has passed `frames`, finished or not."""
    keep = record.frames <= frames
    if keep.any() and (record.frames >= frames).any():
        status = COMPLETE
    else:
        status = NOT_EVALUATED if not keep.any() else ENDED_SHORT if record.status == COMPLETE else record.status
    return replace(record, frames=record.frames[keep], values=record.values[keep], status=status)


def discover_runs(paths: list[Path]) -> list[Path]:
    """The run directories (holding `config.yaml`) at or below `paths`, without looking inside a run.

    A directory below a path that is a symlink leading outside that path raises ResultsError: name its
    target as a path itself. One leading inside is not followed (the walk finds its target)."""
    runs = []
    for path in paths:
        if not path.is_dir():
            raise ResultsError(f"{path} does not exist" if not path.exists() else f"{path} is not a directory")
        found = []
        for root, dirs, files in os.walk(path):
            if CONFIG_FILE in files:
                found.append(Path(root))
                dirs.clear()
            dirs[:] = sorted(d for d in dirs if d != ".hydra")  # Hydra's own copy of the unresolved config
            for name in dirs:
                inside(Path(root, name), path)
        if not found:
            raise ResultsError(f"{path} holds no protorl run (no directory with a config.yaml below it)")
        runs.extend(found)
    return sorted(set(runs))


def method_label(config: DictConfig, group_by: list[str], run_dir: Path) -> str:
    """The value alone for one key (`--group-by agent.name`, `--group-by agent`: the agent config chosen, e.g.
    proto_variant), otherwise `key=value` parts joined by spaces."""
    absent = object()
    values = [agent_choice(run_dir, config) if key == "agent" else OmegaConf.select(config, key, default=absent)
              for key in group_by]
    for key, value in zip(group_by, values, strict=True):
        if value is absent:
            raise ResultsError(f"{run_dir}/config.yaml has no key {key} (from --group-by)")
    if len(group_by) == 1 and group_by[0] in ("agent", "agent.name"):
        return str(values[0])
    return " ".join(f"{key}={value}" for key, value in zip(group_by, values, strict=True))


def method_title(config: DictConfig, scratch: bool, downstream: bool) -> str:
    """The method of a run's phase as the docs name it: e.g. "Proto-RL pre-trained" and "Proto-RL online" (no
    pre-training) downstream, "SAC from scratch" (DrQ from states), "Proto-RL" for a pre-training; the agent's
    name for an agent no longer registered."""
    from protorl.agents import registered_agents

    name = str(config.agent.name)
    agent = registered_agents().get(name)
    if agent is None:
        return name
    title = agent.method_title(str(OmegaConf.select(config, "env.obs", default="pixels")))
    if not downstream or not agent.supports("pretrain"):
        return title
    pretrained = not scratch and (config.get("snapshot") or config.get("pretrain_sweep")
                                  or config.get("pretrain_frames", 1))
    return f"{title} {'pre-trained' if pretrained else 'online'}"


def read_curve(path: Path, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(frames, column) of a CSV sorted by frames; rows with a missing value are skipped."""
    points = sorted(zip(*series(read_csv(path)[1], column), strict=True))
    return np.array([frames for frames, _ in points]), np.array([value for _, value in points])


def phases(run_dir: Path, config: DictConfig, metric: Metric) -> list[tuple[Path, str]]:
    """(phase directory, task) pairs of the run that `metric` reads."""
    if not metric.downstream:
        pretrain = run_dir / PRETRAIN_DIR
        return [(pretrain, config.get("pretrain_task") or config.task)] if pretrain.is_dir() else []
    return [(phase, downstream_name(phase, config.task).removeprefix(SCRATCH_PREFIX))
            for phase in downstream_dirs(run_dir)]


def read_records(run_dir: Path, group_by: list[str], metric: Metric = RETURN) -> list[Record]:
    """One record per phase directory of the run that `metric` reads; ResultsError if a symlink leads a file
    it reads (`config.yaml`, `.hydra/hydra.yaml`, a phase's CSV or `result.json`) outside the run."""
    config = read_run_config(inside(run_dir / CONFIG_FILE, run_dir))
    inside(run_dir / ".hydra" / "hydra.yaml", run_dir)  # read by method_label for --group-by agent
    method = method_label(config, group_by, run_dir)
    records = []
    for phase, task in phases(run_dir, config, metric):
        frames, values = read_curve(inside(phase / metric.csv_name, run_dir), metric.column)
        inside(phase / RESULT_FILE, run_dir)
        status = (NOT_EVALUATED if not len(frames) else COMPLETE if read_result(phase) is not None else
                  UNVERIFIED if (phase / RESULT_FILE).is_file() else RUNNING)
        scratch = phase.name == scratch_dir_name(task)
        label = f"{method} {WITHOUT_PRETRAINING}" if scratch else method
        title = method_title(config, scratch, metric.downstream) if group_by == ["agent.name"] else label
        records.append(Record(label, str(config.agent.name), task, int(config.seed), frames, values, status, phase,
                              title))
    return records


def check_metric_column(records: list[Record], runs: list[Path], metric: Metric) -> None:
    """ResultsError unless a pre-training record's CSV has the `--metric` column; the message lists the
    columns those CSVs have."""
    if metric.downstream:
        return
    files = [r.path / metric.csv_name for r in records if (r.path / metric.csv_name).is_file()]
    if not files:
        raise ResultsError(f"--metric {metric.column}: none of the runs read ({len(runs)}) has a "
                           f"pretrain/{metric.csv_name}")
    columns = {column for path in files for column in read_csv(path)[0]}
    if metric.column not in columns:
        raise ResultsError(f"--metric {metric.column}: no such column in the pretrain/{metric.csv_name} of the "
                           f"{len(files)} runs that have one; their columns: "
                           f"{', '.join(sorted(columns - {'frames'})) or 'none'}")


def check_references(records: list[Record], paths: list[Path], metric: Metric) -> None:
    """ResultsError unless `--reference` names exactly the tasks of the records, each once."""
    if metric.references is None:
        return
    found = {r.task for r in records}
    unknown, unscored = sorted(set(metric.references) - found), sorted(found - set(metric.references))
    if unknown:
        raise ResultsError(f"--reference: no record of task {', '.join(unknown)} under "
                           f"{', '.join(map(str, paths))} (tasks found: {', '.join(sorted(found)) or 'none'})")
    if unscored:
        raise ResultsError(f"--reference: no reference score for task {', '.join(unscored)}; give one per task "
                           f"(or keep only the scored tasks with --tasks)")


def flat_config(run_dir: Path) -> dict[str, object]:
    """The run's config as {dotted key: value}, without `run_dir`."""
    def flatten(node, prefix: str = ""):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from flatten(value, f"{prefix}{key}.")
        else:
            yield prefix[:-1], node

    config = OmegaConf.to_container(read_run_config(run_dir / CONFIG_FILE))
    return {key: value for key, value in flatten(config) if key != "run_dir"}


def deduplicate(records: list[Record], ignored: frozenset[str] = frozenset()) -> tuple[list[Record], list[Record]]:
    """One record per (method, task, seed), preferring complete ones, then the longest curve; and the rest.

    Records of one (method, task, seed) from runs whose configs differ in a setting that changes results are
    different experiments, not repeats: that raises `ResultsError` naming the keys to add to `--group-by`. The
    settings a rerun may change (checkpoints, logging, devices; where a snapshot recorded by its content lives) and
    the `ignored` keys (`--versus`'s, for a method whose score does not vary with it) do not tell runs apart."""
    groups = defaultdict(list)
    for record in records:
        groups[record.method, record.task, record.seed].append(record)
    kept, dropped = [], []
    for (method, task, seed), group in groups.items():
        configs = [flat_config(record.path.parent) for record in group] if len(group) > 1 else [{}]
        differing = sorted({key for config in configs[1:]
                            for key in result_changing_differences(configs[0], config, symmetric=True)}
                           - ignored)
        if differing:
            raise ResultsError(f"{method} on {task} seed {seed} comes from runs with different configs "
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
        elif record.status in (RUNNING, ENDED_SHORT, UNVERIFIED):
            lines.append(f"{key[0]}  {key[1]}  seed {key[2]}: {record.status}, last evaluation at "
                         f"{record.frames[-1]:.0f} frames ({record.path})")
        elif record.status == NOT_EVALUATED:
            lines.append(f"{key[0]}  {key[1]}  seed {key[2]}: {NOT_EVALUATED} ({record.path})")
    return lines
