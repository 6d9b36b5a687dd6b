"""Overlapping the environment's step with the agent's update (`runtime.overlap_env_step`) changes nothing: the
run's logs, networks, optimisers, replay and random states are the serial run's bit for bit, through a real
pre-training from pixels (the loop is the same for every phase). Bit for bit is a promise for the CPU (on a GPU
two runs of the same command already differ in their last bits: docs/runs.md), so these runs are on the CPU."""

from __future__ import annotations

import pytest
import torch

import protorl
from protorl.config import Config
from protorl.storage.checkpoints import load_newest_checkpoint
from tests.agents import config_of, tiny_config
from tests.runs import read_rows

pytestmark = pytest.mark.slow  # the slow tier: this module runs protorl's commands or real training

# wall times, the logs' byte lengths (their rows hold wall times) and the run's own settings (its directory and
# runtime.overlap_env_step): the entries of a checkpoint that may differ
UNTIMED = {"elapsed_s", "wall_time_s", "logger", "settings"}


def tiny_pixels(run_dir, overlap_env_step: bool, **fields) -> Config:
    """Pre-training on point_mass_easy from 32x32 pixels: 125 agent steps, the final checkpoint kept."""
    settings = {
        "task": "point_mass_easy", "pretrain_frames": 1000, "run_dir": str(run_dir),
        "agent": tiny_config("proto", anti_collapse="center", reward_space="raw"),
        "env": {"obs": "pixels", "image_size": 32, "action_repeat": 8},
        "training": {"seed_transitions": 20},
        "replay": {"capacity": 500},
        "evaluation": {"episodes": 1, "every_frames": 1000},
        "analyses": {"every_frames": None},
        "snapshots": {"at_frames": []},
        "checkpoints": {"every_frames": 1000, "keep_completed": True},
        "logging": {"progress_bar": False, "tensorboard": False},
        "runtime": {"device": "cpu", "threads": 1, "overlap_env_step": overlap_env_step},
    }
    return config_of(settings, **fields)


def flatten(state, prefix: str = "") -> dict:
    """A checkpoint as {dotted key: tensor or plain value}, wall times left out."""
    if isinstance(state, dict):
        return {k: v for key, value in state.items() if key not in UNTIMED
                for k, v in flatten(value, f"{prefix}{key}.").items()}
    if isinstance(state, list | tuple):
        return {k: v for i, value in enumerate(state) for k, v in flatten(value, f"{prefix}{i}.").items()}
    return {prefix: state}


def assert_same_run(run_dir, reference) -> None:
    run_dir, reference = run_dir / "pretrain", reference / "pretrain"
    for log in ("train.csv", "eval.csv"):
        assert read_rows(run_dir / log) == read_rows(reference / log), log
    state = flatten(load_newest_checkpoint(run_dir / "checkpoints")[1])
    expected = flatten(load_newest_checkpoint(reference / "checkpoints")[1])
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key
        else:
            assert state[key] == value, key


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("serial") / "run"
    results = protorl.pretrain(tiny_pixels(run_dir, overlap_env_step=False))
    assert [r.frames for r in results] == [1000]
    return run_dir


def test_overlapped_environment_steps_give_the_serial_run(serial, tmp_path):
    protorl.pretrain(tiny_pixels(tmp_path / "run", overlap_env_step=True))
    assert_same_run(tmp_path / "run", serial)


def test_the_comparison_sees_a_different_run(serial, tmp_path):
    """The check above is not blind: another seed's run differs from the serial one."""
    protorl.pretrain(tiny_pixels(tmp_path / "run", overlap_env_step=False, seed=2))
    with pytest.raises(AssertionError):
        assert_same_run(tmp_path / "run", serial)
