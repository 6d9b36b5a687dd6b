"""The wall-time estimate before a run: it counts the updates and environment steps the run will make, and a run
that would take days on this machine is refused before anything is written, naming what to run instead."""

from __future__ import annotations

import subprocess
import sys

import pytest

from protorl.app.duration import PhaseDuration, RunDuration, check_duration, env_steps_of, updates_of
from protorl.config import ConfigError
from protorl.training import Trainer
from protorl.training.phases import planned_phases
from tests.agents import tiny
from tests.runs import assert_user_error, environment, read_csv


def test_the_estimate_counts_what_a_run_does(tmp_path):
    """Updates, agent steps and evaluation steps of a real fine-tuning, against the estimate's counts (with an
    evaluation that does not fall on the phase's last frame)."""
    cfg = tiny(tmp_path, finetune_frames=3000, evaluation={"every_frames": 2000}, training={"update_every_steps": 2})
    (phase,) = planned_phases(cfg, "finetune", snapshot_given=False)
    trainer = Trainer(cfg, phase, tmp_path / "finetune")
    trainer.run()
    evaluations = len(read_csv(tmp_path / "finetune" / "eval.csv")[1])
    assert updates_of(cfg, phase) == trainer.updates
    episode_steps = 1000 // cfg.env.action_repeat  # point_mass: 1000-frame episodes
    assert env_steps_of(cfg, phase) == trainer.agent_steps + evaluations * cfg.evaluation.episodes * episode_steps


def test_a_run_longer_than_max_hours_is_refused_with_what_to_run_instead(tmp_path):
    cfg = tiny(tmp_path, runtime={"max_hours": 0.5})
    long = RunDuration((PhaseDuration("pretrain", 200_000, 0.864, 0, 0.015),), "CPU")  # 172800 s
    with pytest.raises(ConfigError, match=r"at least 2\.0 days .* runtime\.max_hours=0\.5: .*protorl-train "
                                          r".*preset=small.*runtime\.max_hours=null"):
        check_duration(cfg, planned_phases(cfg, "pretrain", snapshot_given=False), estimate=long)
    unlimited = tiny(tmp_path, runtime={"max_hours": None})
    assert check_duration(unlimited, planned_phases(unlimited, "pretrain", snapshot_given=False), estimate=long) is long
    short = RunDuration((PhaseDuration("pretrain", 100, 0.9, 100, 0.015),), "CPU")
    assert check_duration(cfg, planned_phases(cfg, "pretrain", snapshot_given=False), estimate=short) is short


def newcomer(command: str, cwd, timeout: float) -> subprocess.CompletedProcess:
    """`protorl-<command>` with no arguments, as a newcomer types it, in an empty directory, without a GPU."""
    return subprocess.run([sys.executable, "-c", f"from protorl.app.cli import {command}; {command}()"], cwd=cwd,
                          env={**environment(), "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_pretrain_without_arguments_says_it_would_take_days_and_what_finishes(tmp_path):
    """`protorl-pretrain` is the paper's 500k-frame pixel pre-training at batch 512: a CPU runs it in days. It is
    refused before it starts, with the estimate and the commands that finish in minutes."""
    try:
        result = newcomer("pretrain", tmp_path, timeout=400)
    except subprocess.TimeoutExpired:
        assert (tmp_path / "runs").is_dir(), "no refusal and no run within 400 s"
        pytest.skip("this machine's CPU runs the paper's pre-training within runtime.max_hours: it started")
    line = assert_user_error(result, "this run would take at least", "runtime.max_hours=24", "protorl-train",
                             "preset=small", "runtime.max_hours=null")
    assert " days " in line or " hours " in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_finetune_without_arguments_names_the_commands_that_make_a_snapshot(tmp_path):
    result = newcomer("finetune", tmp_path, timeout=150)
    assert_user_error(result, "snapshot=", "protorl-pretrain preset=small", "protorl-finetune preset=small",
                      "protorl-train")
    assert not (tmp_path / "runs").exists()
