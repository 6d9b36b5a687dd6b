"""URLB's quadruped stand and jump (protorl/envs/quadruped_tasks.py) on real MuJoCo physics."""

from __future__ import annotations

import numpy as np
import pytest

from protorl.envs import DMCEnv, check_task, list_tasks, split_task
from protorl.envs.catalog import task_description
from protorl.envs.dmc import _suite
from protorl.envs.quadruped_tasks import JUMP_HEIGHT, TASKS

suite = _suite()  # dm_control's suite, imported as protorl imports it

OBS_DIM, ACTION_DIM = 78, 12  # the suite's quadruped: 44 + 3 + 1 + 6 + 24 observations, 12 actuators
EPISODE_FRAMES = 1000  # 20 s of 0.02 s control steps


@pytest.fixture(scope="module")
def envs() -> dict[str, DMCEnv]:
    envs = {name: DMCEnv(name, obs="states", seed=0) for name in TASKS}
    for env in envs.values():
        env.reset()
    return envs


def _set_state(physics, quaternion, height: float, joints: np.ndarray, qvel: np.ndarray) -> None:
    with physics.reset_context():
        physics.named.data.qpos["root"][:3] = (0.3, -0.2, height)
        physics.named.data.qpos["root"][3:] = quaternion / np.linalg.norm(quaternion)
        physics.data.qpos[7:] = joints
        physics.data.qvel[:] = qvel


def _expected_rewards(physics) -> dict[str, float]:
    """The rewards by URLB's formulas, from the root's quaternion and the bodies' masses and positions (not from the
    task's own code or the model's sensors)."""
    w, x, y, z = physics.named.data.qpos["root"][3:]
    torso_zz = 1 - 2 * (x * x + y * y)  # z component of the rotated z axis
    upright = (1 + torso_zz) / 2
    mass, centres = physics.model.body_mass[1:], physics.data.xipos[1:]  # every body but the world
    height = float(mass @ centres[:, 2] / mass.sum())
    return {"quadruped_stand": upright, "quadruped_jump": upright * min(1.0, (1 + height / JUMP_HEIGHT) / 2),
            "height": height}


def _reward(env: DMCEnv) -> float:
    return float(env._env.task.get_reward(env.physics))


def test_tasks_are_listed_in_the_quadruped_domain_and_described():
    assert set(TASKS) <= set(list_tasks())
    for name in TASKS:
        assert split_task(name) == ("quadruped", name)
        assert "URLB" in task_description(name)
        with pytest.raises(ValueError, match=f"did you mean {name}"):
            check_task(name[:-1])
    # URLB's walk and run are the suite's: no second copy under another name
    assert not [name for name in list_tasks() if name.startswith("quadruped_") and "urlb" in name]


def test_reward_matches_urlbs_formula_at_random_states(envs):
    rng = np.random.default_rng(0)
    seen = {name: [] for name in (*TASKS, "height")}
    for _ in range(8):
        quaternion, height = rng.normal(size=4), rng.uniform(0.3, 2.5)
        model = envs["quadruped_stand"].physics.model
        joints, qvel = rng.uniform(-0.5, 0.5, model.nq - 7), rng.normal(size=model.nv)
        for name, env in envs.items():
            _set_state(env.physics, quaternion, height, joints, qvel)
            expected = _expected_rewards(env.physics)
            assert _reward(env) == pytest.approx(expected[name], abs=1e-9), name
            seen[name].append(expected[name])
        seen["height"].append(expected["height"])
    for name in TASKS:
        assert np.ptp(seen[name]) > 0.2, name  # the states span a range of rewards
    assert min(seen["height"]) < JUMP_HEIGHT < max(seen["height"])  # both sides of the jump term's bound


def test_rewards_at_their_limits(envs):
    model = envs["quadruped_stand"].physics.model
    joints, qvel = np.zeros(model.nq - 7), np.zeros(model.nv)
    upright, upside_down = np.array([1.0, 0, 0, 0]), np.array([0.0, 1, 0, 0])
    for name, env in envs.items():
        _set_state(env.physics, upright, 3.0, joints, qvel)  # centre of mass well above 1 m
        assert _reward(env) == pytest.approx(1.0, abs=1e-12), name
        _set_state(env.physics, upside_down, 3.0, joints, qvel)
        assert _reward(env) == pytest.approx(0.0, abs=1e-12), name
    jump = envs["quadruped_jump"]
    _set_state(jump.physics, upright, 0.6, joints, qvel)  # standing height: the centre of mass is below 1 m
    assert 0.5 < _reward(jump) < 1.0


def test_initial_states_are_the_suites_random_orientations_without_contacts():
    walk = suite.load("quadruped", "walk", task_kwargs={"random": 3})
    walk.reset()
    orientations = []
    for name in TASKS:
        env = DMCEnv(name, obs="states", seed=3)
        for episode in range(2):
            ts = env.reset()
            assert env.physics.data.ncon == 0
            np.testing.assert_array_equal(env.physics.data.qvel, 0.0)
            if episode == 0:  # the same draw as the suite's walk task with the same seed
                np.testing.assert_array_equal(env.physics.data.qpos, walk.physics.data.qpos)
                np.testing.assert_allclose(
                    ts.obs, np.concatenate([np.ravel(v) for v in walk.task.get_observation(walk.physics).values()]),
                    rtol=1e-6)
            orientations.append(tuple(env.physics.named.data.qpos["root"][3:]))
    assert len(set(orientations)) == 2  # episodes differ; both tasks draw the same sequence


@pytest.mark.parametrize("name", list(TASKS))
def test_steps_and_episode_length(name):
    env = DMCEnv(name, obs="states", action_repeat=2, seed=1)
    assert env.action_shape == (ACTION_DIM,) and env.obs_shape == (OBS_DIM,)
    assert env.spec() == DMCEnv("quadruped_walk", obs="states", action_repeat=2, seed=0).spec()  # shared snapshots
    ts, steps, rng = env.reset(), 0, np.random.default_rng(0)
    assert ts.obs.shape == (OBS_DIM,) and ts.obs.dtype == np.float32
    while not ts.last:
        ts = env.step(rng.uniform(-1, 1, ACTION_DIM))
        steps += 1
        assert ts.obs.shape == (OBS_DIM,) and np.all(np.isfinite(ts.obs))
        assert 0.0 <= ts.reward <= 2.0 and ts.discount == 1.0  # two frames' rewards, each in [0, 1]
    assert steps * env.action_repeat == EPISODE_FRAMES


def test_pixels_from_the_quadrupeds_camera():
    env = DMCEnv("quadruped_jump", obs="pixels", image_size=24, seed=0)
    assert env.camera_id == 2
    ts = env.reset()
    assert ts.obs.shape == (9, 24, 24) and ts.obs.dtype == np.uint8 and ts.frame.std() > 1.0
