"""Fine-tuning on the pre-training's data (`snapshots.with_replay`, `replay.pretrain_data_share`): the relabelled
rewards are the ones the task pays, each batch holds the share asked for, and a run with it resumes exactly."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from protorl.envs import DMCEnv
from protorl.replay import ReplayBuffer
from protorl.storage.checkpoints import list_checkpoints
from protorl.storage.snapshots import load_snapshot
from protorl.training.pretrain_data import mixed_batch, relabelled_replay
from tests.runs import STATES, assert_ok, assert_user_error, read_rows, run


def _trajectory(task: str, actions: np.ndarray, keep_states: bool) -> tuple[ReplayBuffer, list[float]]:
    """One episode prefix of `task` (seed 3, action repeat 1) under `actions`, in a replay, and its rewards."""
    env = DMCEnv(task, obs="states", action_repeat=1, seed=3)
    replay = ReplayBuffer(env.frame_shape, env.frame_dtype, env.action_shape, capacity=1000, frame_stack=1,
                          physical_state_shape=env.physical_state_shape if keep_states else None)
    time_step = env.reset()
    replay.add_first(time_step.frame, time_step.physical_state if keep_states else None)
    rewards = []
    for action in actions:
        time_step = env.step(action)
        replay.add(time_step.frame, action, time_step.reward, time_step.discount,
                   time_step.physical_state if keep_states else None)
        rewards.append(time_step.reward)
    return replay, rewards


@pytest.mark.parametrize("task", ["point_mass_easy", "walker_walk"])  # the first's reward depends on the action
def test_reward_at_is_the_reward_the_environment_paid(task):
    env = DMCEnv(task, obs="states", action_repeat=1, seed=0)
    check = DMCEnv(task, obs="states", action_repeat=1, seed=1)
    rng = np.random.default_rng(0)
    env.reset()
    for _ in range(40):
        action = rng.uniform(-1, 1, env.action_shape).astype(np.float32)
        time_step = env.step(action)
        assert check.reward_at(time_step.physical_state, action) == pytest.approx(time_step.reward, abs=1e-9)


def test_relabelled_pretraining_data_pays_what_the_downstream_task_paid_on_the_same_path():
    """The exploration task pays nothing; relabelled for reach_top_left, its transitions earn exactly what
    reach_top_left paid for the same actions from the same start (the start square holds that target)."""
    actions = np.random.default_rng(0).uniform(-1, 1, (300, 2)).astype(np.float32)
    explored, explore_rewards = _trajectory("point_mass_maze_explore", actions, keep_states=True)
    _, task_rewards = _trajectory("point_mass_maze_reach_top_left", actions, keep_states=False)
    assert sum(explore_rewards) == 0 and sum(task_rewards) > 0
    relabelled = relabelled_replay(explored.state_dict(), DMCEnv("point_mass_maze_reach_top_left", obs="states",
                                                                  action_repeat=1, seed=0), action_repeat=1, seed=0)
    assert relabelled.rewards[1:301].tolist() == task_rewards
    assert relabelled.rewards[0] == 0  # the episode's first frame ends no transition
    np.testing.assert_array_equal(relabelled.frames[:301], explored.frames[:301])


def _replay_with_actions(value: float, seed: int) -> ReplayBuffer:
    replay = ReplayBuffer((3,), np.float32, (2,), capacity=50, frame_stack=1, seed=seed)
    replay.add_first(np.zeros(3, np.float32))
    for step in range(20):
        replay.add(np.full(3, step, np.float32), np.full(2, value, np.float32), value, 1.0)
    return replay


@pytest.mark.parametrize(("share", "from_pretraining"), [(0.25, 2), (0.5, 4), (0.1, 1)])
def test_a_mixed_batch_holds_the_share_from_the_pretraining_data(share, from_pretraining):
    online, pretraining = _replay_with_actions(0.5, seed=0), _replay_with_actions(-0.5, seed=1)
    batch = mixed_batch(online, pretraining, 8, share, torch.device("cpu"))
    assert batch.obs.shape == batch.next_obs.shape == (8, 3) and batch.action.shape == (8, 2)
    assert batch.reward[:, 0].tolist() == [0.5] * (8 - from_pretraining) + [-0.5] * from_pretraining
    assert torch.equal(batch.action[:, 0], batch.reward[:, 0])  # whole transitions, not fields mixed up


PRETRAIN = [*STATES, "pretrain_frames=2000", "snapshots.with_replay=true"]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("pretrain_data") / "pretrain"
    assert_ok(run("pretrain", *PRETRAIN, run_dir=run_dir))
    return run_dir / "pretrain" / "snapshots" / "snapshot_2000.pt"


@pytest.mark.slow
def test_a_snapshot_holds_the_pretraining_replay_with_physical_states(snapshot):
    replay = load_snapshot(snapshot)["replay"]
    # 250 agent steps and three episodes' first frames (the third reset when the second ended)
    assert replay["num_written"] == 2000 // 8 + 3
    assert replay["arrays"]["physical_states"].shape == (253, 4)  # point_mass: qpos (2), qvel (2)
    assert replay["arrays"]["physical_states"][:, :2].abs().max() > 0  # positions, not the zeros it starts with


FINETUNE = [*STATES, "replay.pretrain_data_share=0.5", "finetune_frames=3000", "checkpoints.every_frames=1000",
            "checkpoints.keep=5", "checkpoints.keep_completed=true"]


@pytest.mark.slow
def test_a_fine_tuning_on_the_pretraining_data_resumes_exactly(snapshot, tmp_path):
    """Run straight, then again from its frame-1000 checkpoint: the same rows, so the pre-training data's sampling
    state is in the checkpoint."""
    straight = tmp_path / "straight"
    result = run("finetune", *FINETUNE, f"snapshot={snapshot}", run_dir=straight)
    assert_ok(result)
    assert "pre-training data: 250 transitions" in result.stdout + result.stderr
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    (resumed / "finetune" / "result.json").unlink()
    for checkpoint in list_checkpoints(resumed / "finetune" / "checkpoints")[1:]:
        checkpoint.unlink()
    assert_ok(result := run("finetune", *FINETUNE, f"snapshot={snapshot}", run_dir=resumed))
    assert "resuming finetune from" in result.stdout + result.stderr
    for log in ("train.csv", "eval.csv"):
        assert read_rows(resumed / "finetune" / log) == read_rows(straight / "finetune" / log), log


@pytest.mark.slow
def test_pretraining_data_needs_a_snapshot_with_a_replay(tmp_path):
    run_dir = tmp_path / "pretrain"
    assert_ok(run("pretrain", *STATES, "pretrain_frames=2000", run_dir=run_dir))
    snapshot = run_dir / "pretrain" / "snapshots" / "snapshot_2000.pt"
    result = run("finetune", *STATES, "replay.pretrain_data_share=0.5", f"snapshot={snapshot}",
                 run_dir=tmp_path / "ft")
    assert_user_error(result, "holds no replay buffer", "snapshots.with_replay=true")
    assert not (tmp_path / "ft").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "fragment"), [
    (["replay.pretrain_data_share=1.0", "snapshots.with_replay=true"], "replay.pretrain_data_share=1.0"),
    (["replay.pretrain_data_share=0.5"], "snapshots.with_replay"),
])
def test_bad_pretraining_data_settings_are_refused_before_anything_is_written(overrides, fragment, tmp_path):
    result = run("train", *STATES, "pretrain_frames=2000", *overrides, run_dir=tmp_path / "run")
    assert_user_error(result, fragment)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("updates_per_step", [1, 3])
def test_updates_per_step_is_the_number_of_updates_at_each_step(updates_per_step, tmp_path):
    """After the 20 seeding steps, every agent step runs `training.updates_per_step` updates: counted in the
    checkpoint."""
    from protorl.storage.checkpoints import load_checkpoint

    run_dir = tmp_path / "run"
    assert_ok(run("pretrain", *STATES, "pretrain_frames=1000", "training.update_every_steps=1",
                  f"training.updates_per_step={updates_per_step}", "checkpoints.every_frames=1000",
                  "checkpoints.keep_completed=true", run_dir=run_dir))
    state = load_checkpoint(list_checkpoints(run_dir / "pretrain" / "checkpoints")[-1])
    assert state["agent_steps"] == 125
    assert state["updates"] == updates_per_step * (125 - 20)
