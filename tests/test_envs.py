"""`DMCEnv` on real MuJoCo physics and rendering, compared with dm_control's suite directly."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from protorl.envs import EXTRA_TASKS, DMCEnv, check_task, list_tasks, split_task
from protorl.envs.dmc import _suite
from protorl.replay import ReplayBuffer

suite = _suite()  # dm_control's suite, imported as protorl imports it


@pytest.fixture(scope="module")
def point_mass() -> DMCEnv:
    return DMCEnv("point_mass_easy", seed=3)


def _render(env: DMCEnv, camera_id: int) -> np.ndarray:
    return env.physics.render(84, 84, camera_id=camera_id).transpose(2, 0, 1)


@pytest.mark.slow
def test_pixel_observation_shapes_and_reset_stack(point_mass):
    assert point_mass.obs_shape == (9, 84, 84)
    assert point_mass.frame_shape == (3, 84, 84)
    assert point_mass.frame_dtype == np.uint8
    ts = point_mass.reset()
    assert ts.first and not ts.last
    assert ts.obs.shape == (9, 84, 84) and ts.obs.dtype == np.uint8
    assert ts.frame.shape == (3, 84, 84) and ts.frame.dtype == np.uint8
    assert ts.frame.std() > 1.0  # an actual rendered image, not a blank buffer
    for i in range(3):
        np.testing.assert_array_equal(ts.obs[3 * i: 3 * i + 3], ts.frame)
    np.testing.assert_array_equal(ts.frame, _render(point_mass, 0))


def test_step_shifts_the_frame_stack(point_mass):
    rng = np.random.default_rng(0)
    ts = point_mass.reset()
    changed = 0
    for _ in range(6):
        nxt = point_mass.step(rng.uniform(-1, 1, size=point_mass.action_shape))
        assert not nxt.first
        assert nxt.obs.shape == (9, 84, 84)
        np.testing.assert_array_equal(nxt.obs[:6], ts.obs[3:])
        np.testing.assert_array_equal(nxt.obs[6:], nxt.frame)
        np.testing.assert_array_equal(nxt.frame, _render(point_mass, 0))  # the frame after the step
        changed += not np.array_equal(nxt.frame, ts.frame)
        ts = nxt
    assert changed >= 4  # the mass moves, so the checks above compare different images


def test_action_repeat_sums_rewards_like_the_raw_suite():
    seed = 11
    env = DMCEnv("point_mass_easy", obs="states", seed=seed)
    raw = suite.load("point_mass", "easy", task_kwargs={"random": seed})
    assert env.action_repeat == 2
    env.reset()
    raw.reset()
    np.testing.assert_array_equal(env.physics.get_state(), raw.physics.get_state())  # same seed
    # start next to the target, moving through it, so rewards are non-zero and change every control step
    for physics in (env.physics, raw.physics):
        with physics.reset_context():
            physics.data.qpos[:] = [0.04, 0.005]
            physics.data.qvel[:] = [-0.5, 0.0]
    actions = [[0.3, -0.2], [-0.5, 0.1], [0.0, 0.0], [0.9, 0.4], [-1.0, 1.0], [0.2, 0.2]]
    differs_from_one_step = 0
    for action in actions:
        ts = env.step(np.array(action))
        first, second = raw.step(action), raw.step(action)
        assert ts.reward == pytest.approx(first.reward + second.reward, abs=1e-9)
        assert ts.discount == 1.0
        differs_from_one_step += abs(ts.reward - second.reward) > 1e-3
        # the [-1, 1] -> [low, high] rescaling may round the action in its last bit
        np.testing.assert_allclose(env.physics.get_state(), raw.physics.get_state(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(ts.frame, np.concatenate([np.ravel(v) for v in second.observation.values()]),
                                   rtol=1e-6)
    assert differs_from_one_step >= 4


def test_actions_in_unit_box_map_onto_the_action_spec():
    # quadruped's bounds are not [-1, 1] (e.g. [-1, 1.1] and [-0.8, 0.8]), so the rescaling is visible
    env = DMCEnv("quadruped_walk", obs="states", seed=5)
    spec = suite.load("quadruped", "walk").action_spec()
    assert not np.array_equal(spec.maximum, np.ones(env.action_shape))
    env.reset()
    ones = np.ones(env.action_shape)
    for action, expected_ctrl in ((-ones, spec.minimum), (ones, spec.maximum),
                                  (0 * ones, (spec.minimum + spec.maximum) / 2),
                                  (5 * ones, spec.maximum), (-5 * ones, spec.minimum)):
        env.step(action)
        np.testing.assert_allclose(env.physics.data.ctrl, expected_ctrl, rtol=0, atol=1e-12)
    with pytest.raises(ValueError):
        env.step(np.zeros(3))


@pytest.mark.slow
def test_camera_ids():
    quadruped = DMCEnv("quadruped_walk", seed=0)
    assert quadruped.camera_id == 2
    ts = quadruped.reset()
    np.testing.assert_array_equal(ts.frame, _render(quadruped, 2))
    assert not np.array_equal(ts.frame, _render(quadruped, 0))
    assert DMCEnv("walker_walk").camera_id == 0
    assert DMCEnv("cheetah_run").camera_id == 0
    assert DMCEnv("walker_walk", camera_id=1).camera_id == 1


@pytest.mark.parametrize(("task", "domain", "name"), [("walker_walk", "walker", "walk"),
                                                      ("point_mass_easy", "point_mass", "easy")])
def test_state_observations_are_flat_float32(task, domain, name):
    env = DMCEnv(task, obs="states", seed=2)
    raw = suite.load(domain, name, task_kwargs={"random": 2})
    size = sum(int(np.prod(spec.shape)) for spec in raw.observation_spec().values())
    assert env.frame_shape == env.obs_shape == (size,)
    assert env.frame_dtype == np.float32
    ts = env.reset()
    expected = np.concatenate([np.ravel(v) for v in raw.reset().observation.values()]).astype(np.float32)
    assert ts.obs.shape == (size,) and ts.obs.dtype == np.float32
    np.testing.assert_array_equal(ts.obs, expected)
    ts = env.step(np.zeros(env.action_shape))
    assert ts.obs.shape == (size,) and ts.obs.dtype == np.float32
    if task == "walker_walk":
        assert size == 24  # orientations 14 + height (a scalar) 1 + velocity 9


def test_episode_ends_on_the_time_limit_after_500_agent_steps():
    point_mass = DMCEnv("point_mass_easy", obs="states")  # the limit is the physics', whatever is observed
    rng = np.random.default_rng(1)
    ts = point_mass.reset()
    steps = 0
    while not ts.last:
        ts = point_mass.step(rng.uniform(-1, 1, size=point_mass.action_shape))
        steps += 1
        assert steps <= 500
        if not ts.last:
            assert ts.discount == 1.0
    assert steps == 500  # 1000 env frames with action repeat 2
    assert ts.discount == 1.0  # a time limit, not a terminal state
    assert point_mass.physics.data.time == pytest.approx(20.0)
    assert point_mass.reset().first


def test_unknown_task_points_to_the_task_list_and_suggests_close_names():
    with pytest.raises(ValueError, match=r"unknown task 'walker_sprint': protorl-tasks lists every task"):
        DMCEnv("walker_sprint")
    with pytest.raises(ValueError, match=r"'pointmass_easy' \(did you mean point_mass_easy\?\)"):
        check_task("pointmass_easy")
    with pytest.raises(ValueError):
        DMCEnv("point_mass_easy", obs="rgb")


def test_list_tasks_and_split_task():
    tasks = list_tasks()
    for name in ("cartpole_swingup_sparse", "ball_in_cup_catch", "point_mass_easy", "walker_walk"):
        assert name in tasks
    assert set(tasks) == {f"{domain}_{task}" for domain, task in suite.ALL_TASKS} | set(EXTRA_TASKS)
    assert split_task("ball_in_cup_catch") == ("ball_in_cup", "catch")
    assert split_task("cartpole_swingup_sparse") == ("cartpole", "swingup_sparse")


@pytest.mark.slow
def test_replay_rebuilds_the_env_observations():
    """Store frames as the trainer does and check the buffer reproduces every stacked observation."""
    env = DMCEnv("point_mass_easy", seed=9)
    replay = ReplayBuffer(env.frame_shape, env.frame_dtype, env.action_shape, capacity=200,
                          frame_stack=env.frame_stack, seed=0)
    rng = np.random.default_rng(2)
    observations = []  # env obs per absolute replay index
    successors: dict[bytes, list[bytes]] = {}  # obs -> the next obs after one step
    for num_steps in (12, 10, 8):
        ts = env.reset()
        replay.add_first(ts.frame)
        observations.append(ts.obs)
        for _ in range(num_steps):
            action = rng.uniform(-1, 1, size=env.action_shape).astype(np.float32)
            nxt = env.step(action)
            replay.add(nxt.frame, action, nxt.reward, nxt.discount)
            successors.setdefault(ts.obs.tobytes(), []).append(nxt.obs.tobytes())
            observations.append(nxt.obs)
            ts = nxt
    assert len(replay) == 30
    distinct = {obs.tobytes() for obs in observations}
    assert len(distinct) > 25  # the stacks differ, so matching them is informative
    rebuilt = replay.stack_at(np.arange(len(observations)))
    for index, obs in enumerate(observations):
        np.testing.assert_array_equal(rebuilt[index], obs)
    batch = replay.sample(64)
    for obs, next_obs in zip(batch.obs.numpy(), batch.next_obs.numpy(), strict=True):
        assert next_obs.tobytes() in successors[obs.tobytes()]


def test_protorl_tasks_describes_every_task_by_domain(capsys):
    """Each task `task=` accepts is listed once, under its domain, with what earns its reward; each domain says
    what it is."""
    from protorl.app.tools import tasks
    from protorl.envs.catalog import catalog

    listed = [(domain, what, task, description) for domain, what, named in catalog() for task, description in named]
    assert sorted(task for _, _, task, _ in listed) == list_tasks()
    for domain, what, task, description in listed:
        assert split_task(task)[0] == domain and what and description, task
    tasks([])
    out = capsys.readouterr().out
    assert "walker: a planar biped\n" in out
    assert re.search(r"\n  point_mass_maze_reach_top_left +reach the top-left corner, in the start square", out)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed (torch's CPU builds)")
def test_rendering_with_egl_then_building_an_optimiser_runs_where_triton_is_installed():
    """CUDA builds of torch install triton, which crashed the process when first imported after Mesa's EGL had
    loaded; torch imports it when it builds an optimiser."""
    code = ("from protorl.envs.dmc import _suite\nenv = _suite().load('point_mass', 'easy')\nenv.reset()\n"
            "env.physics.render(32, 32)\nimport torch\ntorch.optim.Adam([torch.zeros(1, requires_grad=True)])\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MUJOCO_GL": "egl"}, timeout=300)
    assert done.returncode == 0
