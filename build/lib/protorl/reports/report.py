"""The end-of-run report: a short text table of the phases and a PNG of their learning curves."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from protorl.plots import Curve, Panel, plot_curves, series
from protorl.reports.io import read_csv
from protorl.storage.run_files import scratch_dir_name

if TYPE_CHECKING:
    from protorl.training import PhaseResult


def plot_run(results: list[PhaseResult], path: Path) -> Path:
    """`run_panels` side by side, saved to `path`."""
    plot_curves(run_panels(results), [path], cols=len(results))
    return path


def run_panels(results: list[PhaseResult]) -> list[Panel]:
    """One panel per phase: the evaluation and training episode returns, and the mean intrinsic reward."""
    scratch = {r.task for r in results if r.out_dir.name == scratch_dir_name(r.task)}
    return [_phase_panel(result, result.task in scratch) for result in results]


def phase_title(phase: str, dir_name: str, task: str, compared: bool) -> str:
    """A phase's panel title: what it learned from, and its task. `compared`: the task is also fine-tuned without
    pre-training in the run, so its other fine-tuning starts from the snapshot."""
    if phase == "pretrain":
        return f"pre-training without task reward\n{task}"
    if dir_name == scratch_dir_name(task):
        return f"fine-tuning without pre-training\n{task}"
    return f"fine-tuning{' from the snapshot' if compared else ''}\n{task}"


RETURN_LABEL = "episode return (higher is better)"
INTRINSIC_LABEL = "intrinsic reward per step (episode mean)"


def _phase_panel(result: PhaseResult, compared: bool) -> Panel:
    """Pre-training: its intrinsic reward (the task reward is hidden); downstream: the returns, the intrinsic
    reward on a second axis."""
    train = read_csv(result.out_dir / "train.csv")[1]
    evals = read_csv(result.out_dir / "eval.csv")[1]
    title = phase_title(result.phase, result.out_dir.name, result.task, compared)
    intrinsic = Curve(*series(train, "intr_reward_mean"), INTRINSIC_LABEL, ".--", "tab:red")
    returns = [Curve(*series(evals, "episode_reward"), "evaluation return", "s-")] if evals else []
    if result.phase == "pretrain" and not returns:
        return Panel(title, INTRINSIC_LABEL, [intrinsic] if intrinsic.frames else [])
    returns.append(Curve(*series(train, "episode_reward"), "training episode return", "o-"))
    return Panel(title, RETURN_LABEL, returns, twin=intrinsic if intrinsic.frames else None)


def summary(results: list[PhaseResult], plot: Path, comparison_note: str | None = None) -> str:
    """Per phase: its frames, episodes, time and speed, eval rewards, snapshots and logs; then the plot, and the
    fine-tuning comparison followed by `comparison_note`."""
    lines = ["", "protorl run summary (frames are environment frames)"]
    for r in results:
        phase = "scratch" if r.out_dir.name == scratch_dir_name(r.task) else r.phase  # fine-tuned, no pre-training
        lines.append(f"  {phase:<9} {r.task:<24} {r.frames:>8} frames  {r.episodes:>4} episodes  "
                     f"{r.wall_time_s / 60:6.1f} min  ({r.frames / max(r.wall_time_s, 1e-9):.0f} fps)")
        if r.eval_rewards:
            curve = ", ".join(f"{frames}: {reward:.1f}" for frames, reward in r.eval_rewards)
            lines.append(f"            eval episode reward by frames: {curve}")
        for snapshot in r.snapshots:
            lines.append(f"            snapshot: {snapshot}")
        logs = [r.out_dir / name for name in ("train.csv", "eval.csv", "tb") if (r.out_dir / name).exists()]
        lines.append(f"            logs: {', '.join(map(str, logs))}")
    lines.append(f"  curves: {plot}")
    compared = comparison(results)
    lines += compared
    if compared and comparison_note:
        lines += textwrap.wrap(comparison_note, width=116, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines)


def comparison(results: list[PhaseResult]) -> list[str]:
    """For each task fine-tuned both from the snapshot and without pre-training (`compare_without_pretraining`):
    their evaluations side by side, the mean over the fine-tuning first (how soon the task was solved)."""
    finetunes = [r for r in results if r.phase == "finetune"]
    lines = []
    for scratch in finetunes:
        if scratch.out_dir.name != scratch_dir_name(scratch.task):
            continue
        pretrained = next((r for r in finetunes if r.task == scratch.task and r is not scratch
                           and r.out_dir.name != scratch_dir_name(r.task)), None)
        if pretrained is None:
            continue
        if not lines:
            lines.append("fine-tuning from the snapshot against the same fine-tuning without pre-training "
                         "(evaluation return: mean over the evaluations, last; success rate: mean)")
        for name, result in (("pre-trained", pretrained), ("no pre-training", scratch)):
            evals = read_csv(result.out_dir / "eval.csv")[1]
            returns = [row["episode_reward"] for row in evals]
            success = [row["success_rate"] for row in evals if "success_rate" in row]
            if not returns:
                continue
            rate = f", success rate {sum(success) / len(success):.2f}" if success else ""
            lines.append(f"  {scratch.task:<34} {name:<16} return {sum(returns) / len(returns):6.1f}, last "
                         f"{returns[-1]:6.1f}{rate}  ({', '.join(f'{r:.0f}' for r in returns)})")
    return lines
