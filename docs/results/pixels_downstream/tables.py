"""The page's tables from `evaluations.csv` (every run's evaluation returns): per arm, rliable's IQM of the score (the
mean of a run's evaluations), of the last evaluation and of the success rate where known, with 95% stratified-bootstrap
intervals (2000 resamples), and the paired differences (a pre-trained arm minus DrQ from scratch, seed by seed);
and the evaluation curves, each arm's mean over its seeds with each seed's run beside it, into curves.png.

    python docs/results/pixels_downstream/tables.py
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np
from rliable import library, metrics

ARMS = ("paper_finetune", "finetune", "scratch")
REFERENCE = "scratch"
LABELS = {"paper_finetune": "(a) the paper's fine-tuning", "finetune": "(b) protorl's fine-tuning",
          "scratch": "(c) DrQ, no pre-training"}
FRAMES = (0, 5000, 10000, 15000, 20000, 25000, 30000)
RESAMPLES = 2000


def read_scores(path: Path) -> dict[str, dict[int, list[float]]]:
    """arm -> seed -> the run's evaluation returns, in order of frames."""
    runs: dict[str, dict[int, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    with path.open() as file:
        for row in csv.DictReader(file):
            runs[row["arm"]][int(row["seed"])].append((int(row["frames"]), float(row["eval_return"])))
    return {arm: {seed: [value for _, value in sorted(evals)] for seed, evals in seeds.items()}
            for arm, seeds in runs.items()}


def interval(scores: dict[str, np.ndarray]) -> dict[str, tuple[float, float, float]]:
    """name -> (IQM, low, high) of a (seeds, 1) array each."""
    points, cis = library.get_interval_estimates(scores, lambda x: np.array([metrics.aggregate_iqm(x)]),
                                                 reps=RESAMPLES)
    return {name: (float(points[name][0]), float(cis[name][0][0]), float(cis[name][1][0])) for name in scores}


def main() -> None:
    np.random.seed(0)  # rliable's bootstrap draws from NumPy's global generator: the same intervals on every run
    runs = read_scores(Path(__file__).with_name("evaluations.csv"))
    seeds = sorted(set.intersection(*(set(runs[arm]) for arm in ARMS)))
    print(f"seeds with every arm: {seeds}")
    plot_curves(runs, seeds, Path(__file__).with_name("curves.png"))
    for label, summary in (("score (mean of the evaluations)", np.mean), ("last evaluation", lambda v: v[-1])):
        per_arm = {arm: np.array([[summary(runs[arm][seed])] for seed in seeds]) for arm in ARMS}
        differences = {f"{arm} - {REFERENCE}": per_arm[arm] - per_arm[REFERENCE] for arm in ARMS if arm != REFERENCE}
        print(f"\n{label}:")
        for name, (point, low, high) in interval(per_arm).items():
            print(f"  {name:<26} {point:8.1f} [{low:.1f}, {high:.1f}]")
        for name, (point, low, high) in interval(differences).items():
            print(f"  {name:<26} {point:+8.1f} [{low:+.1f}, {high:+.1f}]")
        for name, values in differences.items():
            print(f"  {name} by seed: {', '.join(f'{value:+.1f}' for value in values[:, 0])}")


def plot_curves(runs: dict[str, dict[int, list[float]]], seeds: list[int], path: Path) -> None:
    """Each arm's evaluation return against frames: the mean over `seeds` and each seed's run, thin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for arm, colour in zip(ARMS, ("tab:blue", "tab:orange", "tab:gray"), strict=True):
        values = np.array([runs[arm][seed] for seed in seeds])  # (seeds, evaluations)
        for run in values:
            axes.plot(FRAMES, run, color=colour, alpha=0.25, linewidth=0.8)
        axes.plot(FRAMES, values.mean(axis=0), color=colour, linewidth=2.2, label=f"{LABELS[arm]} (mean)")
    axes.set_xlabel("fine-tuning frames")
    axes.set_ylabel("evaluation return (5 episodes)")
    axes.set_title(f"point_mass_maze_reach_top_left from pixels, seeds {seeds[0]}-{seeds[-1]}")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
