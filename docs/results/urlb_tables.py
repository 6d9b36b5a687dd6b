"""The tables of a page on URLB's protocol from its `scores.csv` (one row per run: fine-tuning, pre-training frames,
seed, task, the last evaluation's return), beside URLB's published figures (`urlb_published.csv`: URLB's expert
scores and its agents' means and standard errors, with their sources):

- per task, each arm's score per seed and its mean, beside URLB's Proto-RL and the best published agent on the task;
- per arm, rliable's IQM and mean of the expert-normalised scores over tasks x seeds, with 95% stratified-bootstrap
  intervals (2000 resamples, NumPy seed 0 before each arm, as `protorl-aggregate --seed 0` draws them), and the
  published agents' expert-normalised means over the same tasks.

    python docs/results/urlb_tables.py docs/results/walker_urlb_2m
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from rliable import library, metrics

RESAMPLES = 2000
PUBLISHED = Path(__file__).with_name("urlb_published.csv")


def read_scores(path: Path) -> dict[tuple[str, int], dict[str, dict[int, float]]]:
    """(fine-tuning, pre-training frames) -> task -> seed -> score."""
    arms: dict = defaultdict(lambda: defaultdict(dict))
    with path.open() as file:
        for row in csv.DictReader(file):
            arms[(row["fine_tuning"], int(row["pretrain_frames"]))][row["task"]][int(row["seed"])] = float(row["score"])
    return arms


def read_published(path: Path) -> dict[str, dict[str, tuple[float, float | None]]]:
    """task -> agent ("expert" included) -> (mean, standard error or None)."""
    published: dict = defaultdict(dict)
    with path.open() as file:
        for row in csv.DictReader(file):
            error = float(row["standard_error"]) if row["standard_error"] else None
            published[row["task"]][row["agent"]] = (float(row["mean"]), error)
    return published


def published_text(value: tuple[float, float | None] | None) -> str:
    """A published figure: "mean ± standard error", the mean alone where none was published, "none"."""
    if value is None:
        return "none"
    mean, error = value
    return f"{mean:.0f}" if error is None else f"{mean:.0f} ± {error:.0f}"


def arm_name(arm: tuple[str, int]) -> str:
    """An arm as the page says it: "paper from 2M", "departures from 500k", "scratch, no pre-training"."""
    fine_tuning, frames = arm
    if frames == 0:
        return f"{fine_tuning}, no pre-training"
    return f"{fine_tuning} from {frames // 1000}k" if frames < 1_000_000 else f"{fine_tuning} from {frames // 10**6}M"


def main(page: Path) -> None:
    """Print the tables of the page in the directory `page`."""
    arms = read_scores(page / "scores.csv")
    published = read_published(PUBLISHED)
    tasks = sorted({task for arm in arms.values() for task in arm}, key=list(published).index)
    expert = np.array([published[task]["expert"][0] for task in tasks])
    print("per task: each arm's seeds (mean); URLB's Proto-RL; the best of the published agents listed")
    for task in tasks:
        agents = {agent: value for agent, value in published[task].items() if agent != "expert"}
        best = max(agents, key=lambda agent: agents[agent][0])
        proto = agents.get("Proto-RL")
        cells = []
        for arm in sorted(arms):
            seeds = arms[arm].get(task, {})
            if seeds:
                values = [seeds[seed] for seed in sorted(seeds)]
                cells.append(f"{arm_name(arm)}: {', '.join(f'{v:.0f}' for v in values)} ({np.mean(values):.0f})")
        print(f"  {task}: {'; '.join(cells)}; URLB Proto-RL {published_text(proto)}; best {best} "
              f"{published_text(agents[best])}")
    print("\nexpert-normalised, over tasks x seeds: IQM [95% CI], mean [95% CI]")
    for arm in sorted(arms):
        seeds = sorted(set.intersection(*(set(arms[arm].get(task, {})) for task in tasks)))
        if not seeds:
            print(f"  {arm_name(arm)}: no seed has every task")
            continue
        matrix = np.array([[arms[arm][task][seed] for task in tasks] for seed in seeds]) / expert  # (seeds, tasks)
        np.random.seed(0)  # rliable's bootstrap draws from NumPy's global generator
        points, intervals = library.get_interval_estimates(
            {"arm": matrix}, lambda x: np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)]),
            reps=RESAMPLES)
        (iqm, mean), ((iqm_low, mean_low), (iqm_high, mean_high)) = points["arm"], intervals["arm"]
        print(f"  {arm_name(arm)} (seeds {', '.join(map(str, seeds))}): IQM {iqm:.3f} [{iqm_low:.3f}, {iqm_high:.3f}], "
              f"mean {mean:.3f} [{mean_low:.3f}, {mean_high:.3f}]")
    agents = set.intersection(*(set(published[task]) for task in tasks)) - {"expert"}
    means = {agent: np.mean([published[task][agent][0] for task in tasks] / expert) for agent in agents}
    print("\npublished agents' expert-normalised means over the same tasks:")
    for agent in sorted(means, key=means.get, reverse=True):
        print(f"  {agent}: {means[agent]:.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
