"""The figures read without the source: legends outside the data, a title per phase that says what it learned
from, the maze's start and targets, and the methods named as the docs name them."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from protorl.envs import point_mass_maze
from protorl.exploration.maps import landmarks
from protorl.plots import Curve, Panel, curves_figure, style
from protorl.reports.records import method_title
from protorl.reports.report import run_panels
from protorl.storage.run_files import PRETRAIN_DIR, scratch_dir_name
from protorl.training import PhaseResult

FRAMES = [0, 1000, 2000, 3000]


def overlaps(a, b) -> bool:
    """Whether two display-space boxes share any area."""
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def legend_and_data_boxes(panels: list[Panel]) -> tuple[list, list]:
    """The drawn figure's legends and its panels' plotting areas, in display coordinates."""
    with style():
        fig = curves_figure(panels)
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [fig.legends[0].get_window_extent(renderer)] if fig.legends else []
    legends += [ax.get_legend().get_window_extent(renderer) for ax in fig.axes if ax.get_legend() is not None]
    return legends, [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]


def test_legends_sit_outside_the_data():
    """Curves that fill their panels, with many legend entries: no legend covers a plotting area, whether each
    panel has its own legend or the panels share one."""
    filling = [Curve(FRAMES, [0.0, 1.0, 0.0, 1.0], f"a long label for curve number {i}") for i in range(4)]
    for panels in ([Panel("one", "y", filling), Panel("two", "y", filling[:2])],  # a legend per panel
                   [Panel("one", "y", filling), Panel("two", "y", filling)],  # one legend for both
                   [Panel("alone", "y", filling, twin=Curve(FRAMES, [1, 0, 1, 0], "on the right"))]):
        legends, areas = legend_and_data_boxes(panels)
        assert legends
        assert not any(overlaps(legend, area) for legend in legends for area in areas), [p.title for p in panels]


def phase(run_dir: Path, name: str, kind: str, task: str, train: list[dict], evals: list[dict]) -> PhaseResult:
    """A phase directory with its CSVs, as a run leaves it."""
    out = run_dir / name
    out.mkdir(parents=True)
    for file, rows in (("train.csv", train), ("eval.csv", evals)):
        columns = sorted({key for row in rows for key in row}) or ["frames"]
        with open(out / file, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
    return PhaseResult(kind, task, FRAMES[-1], 3, 1.0, out)


def test_each_phase_of_the_main_job_has_its_own_title_and_no_flat_zero_reward(tmp_path):
    """Pre-training, fine-tuning from the snapshot and the same fine-tuning without pre-training: three titles
    that differ; the pre-training's panel draws what it optimises (the intrinsic reward), not the hidden task
    reward's zeros."""
    task = "point_mass_maze_reach_top_left"
    train = [{"frames": f, "episode_reward": 0.0, "intr_reward_mean": 0.1 * i} for i, f in enumerate(FRAMES)]
    finetune_train = [{**row, "episode_reward": 100.0 * i} for i, row in enumerate(train)]
    evals = [{"frames": f, "episode_reward": 200.0 * i} for i, f in enumerate(FRAMES)]
    results = [phase(tmp_path, PRETRAIN_DIR, "pretrain", "point_mass_maze_explore", train, []),
               phase(tmp_path, f"finetune_{task}", "finetune", task, finetune_train, evals),
               phase(tmp_path, scratch_dir_name(task), "finetune", task, finetune_train, evals)]
    panels = run_panels(results)
    titles = [panel.title for panel in panels]
    assert len(set(titles)) == 3 and all(task in title for title in titles[1:]), titles
    assert "without pre-training" in titles[2] and "without pre-training" not in titles[1], titles
    pretraining = panels[0]
    assert [list(curve.values) for curve in pretraining.curves] == [[row["intr_reward_mean"] for row in train]]
    assert all("higher is better" in panel.ylabel for panel in panels[1:])


def test_the_maze_map_marks_where_episodes_start_and_the_runs_target():
    """The start square holds every episode's start, and the target marked is the downstream task's, where its
    reward is."""
    task = "point_mass_maze_reach_bottom_right"
    marks = landmarks(point_mass_maze.DOMAIN, ["point_mass_maze_explore", task])
    x0, y0, x1, y1 = marks.start
    env = point_mass_maze.load(point_mass_maze.TARGETS["reach_bottom_right"], seed=0)
    for _ in range(5):
        env.reset()
        x, y = env.physics.named.data.qpos[["root_x", "root_y"]]
        assert x0 <= x <= x1 and y0 <= y <= y1
    assert list(marks.targets) == [task]
    target = np.array(marks.targets[task])
    near, far = target + [marks.target_radius * 0.9, 0], target + [marks.target_radius * 1.1, 0]
    assert point_mass_maze.reach_reward(np.array([*near, 0.0]), tuple(target)) == 1.0
    assert point_mass_maze.reach_reward(np.array([*far, 0.0]), tuple(target)) == 0.0
    assert landmarks("walker", ["walker_walk"]) == landmarks("walker", [])


def test_aggregate_figures_name_the_methods_as_the_docs_do():
    """The walker page's three methods from their run configs: Proto-RL and Random fine-tuned from snapshots,
    DrQ from states (SAC without an image to augment), and Proto-RL without pre-training."""
    def config(agent: str, obs: str = "states", **settings) -> object:
        return OmegaConf.create({"agent": {"name": agent}, "env": {"obs": obs}, "pretrain_frames": 100000,
                                 **settings})

    assert method_title(config("proto"), scratch=False, downstream=True) == "Proto-RL pre-trained"
    assert method_title(config("random"), scratch=False, downstream=True) == "Random pre-trained"
    assert method_title(config("drq"), scratch=False, downstream=True) == "SAC from scratch"
    assert method_title(config("drq", obs="pixels"), scratch=False, downstream=True) == "DrQ"
    assert method_title(config("proto"), scratch=True, downstream=True) == "Proto-RL online"
    assert method_title(config("proto", pretrain_frames=0), scratch=False, downstream=True) == "Proto-RL online"
    assert method_title(config("proto"), scratch=False, downstream=False) == "Proto-RL"
