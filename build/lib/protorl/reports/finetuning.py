"""Fine-tuning diagnostics of a run's downstream phases, for `protorl-analyze`: whether fine-tuning keeps what
pre-training learned.

For each downstream directory (`finetune/` or `finetune_<task>/`) one row of panels: the evaluation return with
the success rate (evaluation episodes with any positive reward), the distance of the policy's mean action from
the pre-trained actor's (`actor_drift`, on each update's batch), and the intrinsic share of the reward
(`intr_reward_share`, Proto-RL downstream, from a snapshot or online).
"""

from __future__ import annotations

from pathlib import Path

from protorl.plots import Curve, Panel, Rows, has, plot_curves, series
from protorl.reports.io import read_csv
from protorl.reports.paths import inside
from protorl.reports.report import RETURN_LABEL, phase_title
from protorl.storage.run_files import SCRATCH_PREFIX, downstream_dirs, downstream_name

TRAIN_DIAGNOSTICS = {  # train.csv column -> (panel title, y label)
    "actor_drift": ("policy's distance from the pre-trained actor",
                    "distance of mean actions\n(0: the pre-trained actor's)"),
    "intr_reward_share": ("share of the reward that is intrinsic",
                          "alpha r_intr / (|r| + alpha r_intr)\n(0: the task reward only)"),
}
SUCCESS_LABEL = "success rate: share of evaluation\nepisodes with any reward"


def evaluated_downstream_dirs(run_dir: Path) -> list[Path]:
    """The run's downstream phase directories holding an eval.csv, in name order."""
    return [phase for phase in downstream_dirs(run_dir) if (phase / "eval.csv").is_file()]


def plot_finetuning(run_dir: Path, path: Path) -> tuple[Path | None, list[str]]:
    """`path` (one row of panels per downstream task) and summary lines; (None, []) without downstream phases."""
    panels, lines = [], []
    names = {phase: downstream_name(phase, "finetune") for phase in evaluated_downstream_dirs(run_dir)}
    compared = {name.removeprefix(SCRATCH_PREFIX) for name in names.values() if name.startswith(SCRATCH_PREFIX)}
    for phase, task in names.items():
        title = phase_title("finetune", phase.name, task.removeprefix(SCRATCH_PREFIX),
                            task.removeprefix(SCRATCH_PREFIX) in compared)
        evals = read_csv(inside(phase / "eval.csv", run_dir))[1]
        train = read_csv(inside(phase / "train.csv", run_dir))[1]
        panels.append(_return_panel(title, evals))
        panels += [Panel(f"{title}\n{what}", label, [Curve(*series(train, key), fmt=".-")])
                   for key, (what, label) in TRAIN_DIAGNOSTICS.items() if has(train, key)]
        lines += _lines(task, evals, train)
    if not panels:
        return None, []
    plot_curves(panels, [path], "fine-tuning diagnostics", cols=1 + len(TRAIN_DIAGNOSTICS))
    return path, lines


def _return_panel(title: str, evals: Rows) -> Panel:
    twin = Curve(*series(evals, "success_rate"), SUCCESS_LABEL, "s:", "tab:green") if has(evals, "success_rate") \
        else None
    return Panel(f"{title}\nevaluation", RETURN_LABEL,
                 [Curve(*series(evals, "episode_reward"), "evaluation return", "o-")], twin=twin,
                 twin_ylim=(0.0, 1.05))


def _lines(task: str, evals: Rows, train: Rows) -> list[str]:
    if not evals:
        return [f"  {task}: no evaluation yet"]
    returns = ", ".join(f"{row['episode_reward']:.0f}" for row in evals)
    lines = [f"  {task}: evaluation returns {returns}"]
    if has(evals, "success_rate"):
        rates = ", ".join(f"{row['success_rate']:.2f}" for row in evals if "success_rate" in row)
        successes = sum(row.get("episode_success", 0.0) for row in train)
        lines.append(f"    success rate {rates}; training episodes with reward {successes:.0f} of {len(train)}")
    drift = series(train, "actor_drift")[1]
    if drift:
        lines.append(f"    policy's distance from the pre-trained actor: {drift[0]:.3f} in the first logged episode, "
                     f"{drift[-1]:.3f} in the last")
    return lines
