"""The end-of-run report: a short text table of the phases and a PNG of their learning curves."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from protorl.results.io import read_csv, series
from protorl.results.plots import Curve, Panel, plot_curves

if TYPE_CHECKING:
    from protorl.training import PhaseResult


def plot_run(results: list[PhaseResult], path: Path) -> Path:
    """One panel per phase: episode reward (train and eval) and the mean intrinsic reward."""
    plot_curves([_phase_panel(result) for result in results], [path], cols=len(results))
    return path


def _phase_panel(result: PhaseResult) -> Panel:
    train = read_csv(result.out_dir / "train.csv")[1]
    evals = read_csv(result.out_dir / "eval.csv")[1]
    curves = [Curve(*series(train, "episode_reward"), "train episode reward", "o-")]
    if evals:
        curves.append(Curve(*series(evals, "episode_reward"), "eval episode reward", "s-"))
    intrinsic = Curve(*series(train, "intr_reward_mean"), "intrinsic reward (mean)", "--", "tab:red")
    return Panel(f"{result.phase}: {result.task}", "episode reward", curves,
                 twin=intrinsic if intrinsic.frames else None)


def summary(results: list[PhaseResult], plot: Path) -> str:
    """Per phase: its frames, episodes, time and speed, eval rewards, snapshots and logs; then the plot."""
    lines = ["", "protorl run summary (frames are environment frames)"]
    for r in results:
        lines.append(f"  {r.phase:<9} {r.task:<24} {r.frames:>8} frames  {r.episodes:>4} episodes  "
                     f"{r.wall_time_s / 60:6.1f} min  ({r.frames / max(r.wall_time_s, 1e-9):.0f} fps)")
        if r.eval_rewards:
            curve = ", ".join(f"{frames}: {reward:.1f}" for frames, reward in r.eval_rewards)
            lines.append(f"            eval episode reward by frames: {curve}")
        for snapshot in r.snapshots:
            lines.append(f"            snapshot: {snapshot}")
        logs = [r.out_dir / name for name in ("train.csv", "eval.csv", "tb") if (r.out_dir / name).exists()]
        lines.append(f"            logs: {', '.join(map(str, logs))}")
    lines.append(f"  curves: {plot}")
    return "\n".join(lines)
