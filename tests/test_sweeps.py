"""Sweeps on Hydra's launchers (joblib and submitit's local executor), the sweep index, the paper's
experiment presets, and one pre-training serving several downstream tasks (`finetune_tasks`)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from protorl.config import Config
from tests.runs import TINY, assert_ok, assert_user_error, environment, run

pytestmark = pytest.mark.slow  # the slow tier: this module runs protorl's commands or real training

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parents[1] / "protorl" / "conf" / "experiment").glob("*.yaml"))
SWEEP_TIMEOUT_S = 600
# States (no rendering) and one episode per phase: these tests are about launching, not learning.
TINY_TRAIN = ["preset=small", *TINY, "env.obs=states", "pretrain_frames=1000", "finetune_frames=1000",
              "snapshots.at_frames=[]",
              "checkpoints.every_frames=null", "analyses.every_frames=null"]


def sweep(command: str, sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """`protorl-<command> -m ...` writing its jobs under `sweep_dir`."""
    code = f"from protorl.app.cli import {command}; {command}()"
    return subprocess.run([sys.executable, "-c", code, "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"],
                          capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S, env=environment(),
                          cwd=sweep_dir.parent)


def read_index(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "index.csv", newline="") as f:
        return list(csv.DictReader(f))


def assert_one_complete_run_per_job(sweep_dir: Path, expected: set[tuple[str, int]]) -> None:
    run_dirs = sorted(p for p in sweep_dir.iterdir() if (p / "config.yaml").is_file())
    assert len(run_dirs) == len(expected), run_dirs
    found = set()
    for run_dir in run_dirs:
        cfg = OmegaConf.load(run_dir / "config.yaml")
        found.add((cfg.task, cfg.seed))
        for phase in ("pretrain", "finetune"):
            result = json.loads((run_dir / phase / "result.json").read_text())
            assert result["task"] == cfg.task and result["frames"] == 1000
        assert len((run_dir / "finetune" / "eval.csv").read_text().splitlines()) >= 2  # header + evaluations
    assert found == expected
    rows = read_index(sweep_dir)
    assert {(r["task"], int(r["seed"])) for r in rows} == expected
    assert all(r["complete"] == "true" and r["phases"] == "pretrain:complete finetune:complete" for r in rows), rows


@pytest.mark.parametrize("launcher", [
    ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"],
], ids=["joblib", "submitit_local"])
def test_two_tasks_by_two_seeds_sweep_gives_one_run_per_job(tmp_path, launcher):
    sweep_dir = tmp_path / "sweep"
    result = sweep("train", sweep_dir, *TINY_TRAIN, *launcher, "task=point_mass_easy,cartpole_balance", "seed=1,2")
    assert_ok(result)
    assert_one_complete_run_per_job(sweep_dir, {(env, seed) for env in ("point_mass_easy", "cartpole_balance")
                                                for seed in (1, 2)})
    if "submitit" in launcher[0]:
        assert (sweep_dir / ".submitit").is_dir()  # the jobs really went through submitit
        return
    from protorl.app.tools import aggregate  # the sweep's runs flow into protorl-aggregate

    aggregate([str(sweep_dir), "--out", str(tmp_path / "agg"), "--reps", "20"])
    with open(tmp_path / "agg" / "scores.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["task"], r["method"], r["n_seeds"]) for r in rows} == {
        ("point_mass_easy", "proto", "2"), ("cartpole_balance", "proto", "2")}


def test_a_job_that_stops_when_it_starts_does_not_stop_the_sweep_and_the_index_names_it(tmp_path):
    sweep_dir = tmp_path / "sweep"  # the memory a job needs is checked when it starts
    result = sweep("pretrain", sweep_dir, *TINY_TRAIN, "task=point_mass_easy", "replay.capacity=10000000000000,2000")
    assert result.returncode == 1, result.stderr
    assert "protorl: error: invalid config value replay.capacity=10000000000000" in result.stderr
    rows = {next(o for o in row["overrides"].split() if o.startswith("replay.capacity=")): row
            for row in read_index(sweep_dir)}
    assert rows["replay.capacity=10000000000000"]["complete"] == "false"  # stopped before any phase
    done = rows["replay.capacity=2000"]
    assert (done["complete"], done["phases"]) == ("true", "pretrain:complete")  # ran after the failed job


def test_a_bad_value_in_any_job_stops_the_sweep_before_the_first_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = sweep("pretrain", sweep_dir, *TINY_TRAIN, "task=point_mass_easy", "seed=1,2", "agent.lr=0.0001,-1")
    assert result.returncode == 2, result.stderr
    error = result.stderr[result.stderr.index("protorl: error:"):].splitlines()
    assert error[0] == "protorl: error: 2 of the sweep's 4 jobs would stop, nothing has run:"
    assert [line.split(" (")[0].strip() for line in error[1:]] == ["job 1", "job 3"]  # seed-major, as Hydra runs
    assert all("agent.lr=-1" in line and "invalid config value agent.lr=-1.0" in line for line in error[1:])
    assert not sweep_dir.exists()


def test_an_option_hydra_cannot_find_in_one_job_stops_the_sweep_before_the_first_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = sweep("pretrain", sweep_dir, *TINY_TRAIN, "task=point_mass_easy", "agent=proto,no_such_agent")
    assert result.returncode == 2, result.stderr
    error = result.stderr[result.stderr.index("protorl: error:"):].splitlines()
    assert error[0] == "protorl: error: 1 of the sweep's 2 jobs would stop, nothing has run:"
    assert error[1].strip().startswith("job 1 (")  # the line a single run gets: the agents there are
    assert "): agent=no_such_agent: no such agent; the agents are apt, drq, icm, proto" in error[1]
    assert not sweep_dir.exists()


def test_rerunning_a_sweep_with_other_settings_is_refused_before_any_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    jobs = [*TINY_TRAIN, "task=point_mass_easy", "seed=1,2"]
    assert_ok(sweep("pretrain", sweep_dir, *jobs))
    logs = {path: path.read_bytes() for path in sweep_dir.rglob("train.csv")}
    assert_ok(sweep("pretrain", sweep_dir, *jobs))  # the same settings: each job finds its phase complete
    result = sweep("pretrain", sweep_dir, *jobs, "agent.lr=0.001")
    assert result.returncode == 2, result.stderr
    error = result.stderr[result.stderr.index("protorl: error:"):].splitlines()
    assert error[0] == "protorl: error: 2 of the sweep's 2 jobs would stop, nothing has run:"
    assert "0_proto_variant_point_mass_easy_seed1 holds a run with other settings" in error[1]
    assert {path: path.read_bytes() for path in sweep_dir.rglob("train.csv")} == logs


def test_a_sweep_of_an_experiment_preset_is_checked_job_by_job_as_hydra_expands_it(tmp_path):
    sweep_dir = tmp_path / "sweep"  # fig4_small: 2 tasks x 5 agents x 2 seeds, from the preset's sweeper params
    result = sweep("train", sweep_dir, "experiment=fig4_small", "pretrain_frames=-5")
    assert result.returncode == 2, result.stderr
    error = result.stderr[result.stderr.index("protorl: error:"):].splitlines()
    assert error[0] == "protorl: error: 20 of the sweep's 20 jobs would stop, nothing has run:"
    assert error[-1].strip() == "and 15 more" and len(error) == 7
    job = "job 0 (task=cartpole_balance agent=proto_variant seed=1 experiment=fig4_small pretrain_frames=-5)"
    assert job in error[1]
    assert not sweep_dir.exists()


def test_one_pretraining_serves_several_downstream_tasks(tmp_path):
    run_dir = tmp_path / "multi"
    tasks = ["point_mass_maze_reach_center", "point_mass_maze_reach_top_left"]
    assert_ok(run("train", *TINY_TRAIN, "pretrain_task=point_mass_maze_explore", f"task={tasks[0]}",
                  f"finetune_tasks=[{','.join(tasks)}]", run_dir=run_dir))
    assert json.loads((run_dir / "pretrain" / "result.json").read_text())["task"] == "point_mass_maze_explore"
    for task in tasks:
        result = json.loads((run_dir / f"finetune_{task}" / "result.json").read_text())
        assert result["task"] == task and result["frames"] == 1000
    assert not (run_dir / "finetune").exists()


def test_downstream_task_of_another_domain_is_refused_before_any_output(tmp_path):
    run_dir = tmp_path / "bad"
    result = run("train", *TINY_TRAIN, "pretrain_task=point_mass_maze_explore", "task=point_mass_maze_reach_center",
                 "finetune_tasks=[point_mass_maze_reach_center,cartpole_balance]", run_dir=run_dir)
    assert_user_error(result, "cartpole_balance", "point_mass_maze")
    assert not run_dir.exists()


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_preset_composes_to_a_valid_sweep(name):
    """Each figure's preset composes with the right command and sweeps only over valid values."""
    from hydra import compose, initialize_config_module

    from protorl.app.cli import register_configs

    register_configs()  # the schema the commands' configs build on
    from protorl.app.plan import validate
    from protorl.envs import check_task

    command = ("pretrain" if name.startswith(("fig9", "fig10", "explore")) or "_pretrain" in name else
               "finetune" if "_finetune" in name else "train")
    given = ["pretrain_sweep=multirun/stage1"] if command == "finetune" else []  # the second stage's input
    with initialize_config_module("protorl.conf", version_base="1.3"):
        cfg = compose(command, overrides=[f"experiment={name}", *given], return_hydra_config=True)
    params = dict(cfg.hydra.sweeper.params)
    assert params, f"experiment {name} sweeps nothing"
    assert name in cfg.hydra.sweep.dir
    values = {key: str(value).split(",") for key, value in params.items() if not str(value).startswith("range(")}
    for task in values.get("task", []):  # every task is valid; one of them is composed below
        check_task(task)
    values = {key: options[:1] if key == "task" else options for key, options in values.items()}
    jobs = [[f"{key}={option}"] for key, options in values.items() for option in options]  # each value once
    for job in jobs:
        with initialize_config_module("protorl.conf", version_base="1.3"):
            job_cfg = compose(command, overrides=[f"experiment={name}", *given, *job])
        config: Config = OmegaConf.to_object(OmegaConf.merge(job_cfg, {"run_dir": "."}))
        validate(config, command)
        if name.endswith("_small"):
            assert config.pretrain_frames <= 8000 and config.finetune_frames <= 4000 and config.agent.batch_size <= 32
        elif name == "explore_pixels_long":  # the largest pixel budget of a two-hour sweep
            assert config.agent.batch_size == 32 and config.env.obs == "pixels"
            assert config.training.update_every_steps == 1
            assert config.pretrain_frames >= 20_000 and config.replay.capacity >= config.pretrain_frames
            assert all(frames < config.pretrain_frames for frames in config.snapshots.at_frames)
        elif name.startswith(("explore", "maze_downstream")):  # CPU-scale studies from states, batch 32
            assert config.agent.batch_size == 32 and config.pretrain_frames <= 40_000
            if name.startswith("maze_downstream"):  # the main job's fine-tuning
                assert config.finetune_frames <= 10_000 and config.env.obs == "states"
        elif name.endswith("_pixels_probe"):  # the state probe from pixels at a CPU budget
            assert config.agent.batch_size == 32 and config.env.obs == "pixels"
            assert config.analyses.probe_samples is not None
            assert config.pretrain_frames <= 10_000
        elif name.startswith("maze_pixels_"):  # the pixel study: explore_pixels_long's settings, >= 40k frames
            fast = name == "maze_pixels_fast"  # with the three departures that make it faster, and only those
            ssl_every = getattr(config.agent, "ssl_update_every", 1)  # Random has no L_SSL step
            assert (config.training.update_every_steps, ssl_every, config.agent.bf16_autocast) == (
                (2, 2, True) if fast else (1, 1, False))
            assert config.agent.batch_size == 32 and config.env.obs == "pixels"
            assert config.pretrain_frames >= 40_000 and config.replay.capacity >= config.pretrain_frames
            if command == "finetune":  # the main job's fine-tuning comparison, from pixels
                assert config.compare_without_pretraining and config.finetune_frames <= 20_000
        elif name.startswith("pixels_downstream"):  # pre-training from pixels, then three 30k-frame arms
            assert config.agent.batch_size == 32 and config.env.obs == "pixels"
            assert config.training.update_every_steps == 1 and not config.agent.bf16_autocast
            assert config.replay.capacity >= max(config.pretrain_frames, config.finetune_frames)
            if command == "pretrain":
                assert config.pretrain_frames == 40_000 and config.snapshots.with_replay
            else:  # every arm: the same task, frames and evaluations
                assert (config.task, config.finetune_frames, config.evaluation.every_frames,
                        config.evaluation.episodes) == ("point_mass_maze_reach_top_left", 30_000, 5000, 5)
                assert config.pretrain_frames == (0 if command == "train" else 40_000)
                assert not config.compare_without_pretraining
                paper = name.endswith("paper_finetune")
                assert (config.replay.pretrain_data_share > 0) == (config.agent.actor_anchor_coef > 0) == (
                    not paper) if command == "finetune" else config.agent.name == "drq"
        elif name.startswith("maze_far"):  # the main job's settings, longer: targets outside the start room
            assert config.agent.batch_size == 32 and config.env.obs == "states"
            assert config.pretrain_frames in (0, 100_000)
            if command != "pretrain":
                assert config.finetune_frames == 20_000
        elif "_urlb" in name:  # URLB's protocol from states at the main job's settings: walker, quadruped, Jaco
            assert config.agent.batch_size == 32 and config.env.obs == "states" and config.finetune_frames == 100_000
            walker_tasks = {"walker": ["walker_stand", "walker_walk", "walker_run", "walker_flip_forward"],
                            "quadruped": ["quadruped_stand", "quadruped_walk", "quadruped_run", "quadruped_jump"],
                            "reach_duplo": [f"reach_duplo_{corner}" for corner in
                                            ("top_left", "top_right", "bottom_left", "bottom_right")],
                            }[name.split("_urlb")[0]]
            assert config.pretrain_task.startswith(name.split("_urlb")[0])
            if name.endswith("_online"):  # no pre-training, one job per task
                assert config.pretrain_frames == 0 and set(config.finetune_tasks) <= set(walker_tasks)
                assert sorted(params["finetune_tasks"].split(",")) == sorted(f"[{task}]" for task in walker_tasks)
            else:
                assert list(config.finetune_tasks) == walker_tasks and config.pretrain_frames in (0, 100_000, 2_000_000)
            if name.endswith("finetune_2m"):  # at 2M the paper's fine-tuning is the default, the departures named
                departures = "_departures_" in name
                assert (config.replay.pretrain_data_share > 0) == (config.agent.actor_anchor_coef > 0) == departures
        else:
            assert config.agent.batch_size == 512 and config.finetune_frames == 500_000

