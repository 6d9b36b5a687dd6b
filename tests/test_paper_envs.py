"""The paper's own environments (appendices E and F) on real MuJoCo physics and rendering."""

from __future__ import annotations

import numpy as np
import pytest

from protorl.envs import DMCEnv, check_task, list_tasks
from protorl.envs import point_mass_maze as maze
from protorl.envs.dmc import _suite
from protorl.envs.reach_duplo import BRICK_POSITIONS
from protorl.envs.walker_tasks import TASKS as WALKER_TASKS
from protorl.storage.snapshots import SnapshotError, check_spec

suite = _suite()  # dm_control's suite, imported as protorl imports it

MAZE_TASKS = ["point_mass_maze_explore"] + [f"point_mass_maze_{suffix}" for suffix in maze.TARGETS]
NEW_TASKS = MAZE_TASKS + list(WALKER_TASKS) + ["reach_duplo", *BRICK_POSITIONS]
POINT_RADIUS = 0.01
WALLS = ("maze_x", "maze_neg_x", "maze_y")


def _set_state(physics, qpos: dict[str, float] | np.ndarray, qvel: dict[str, float] | None = None) -> None:
    """Zero the state, then set the given joint positions / velocities (by name, or all positions)."""
    with physics.reset_context():
        physics.data.qpos[:] = 0.0
        physics.data.qvel[:] = 0.0
        if isinstance(qpos, dict):
            for joint, value in qpos.items():
                physics.named.data.qpos[joint] = value
        else:
            physics.data.qpos[:] = qpos
        for joint, value in (qvel or {}).items():
            physics.named.data.qvel[joint] = value


def _reward(env: DMCEnv) -> float:
    return float(env._env.task.get_reward(env.physics))


def _wall_boxes(physics) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """World-frame (low, high) (x, y) corners of each maze wall, from the compiled model."""
    boxes = {}
    for wall in WALLS:
        centre = physics.named.data.geom_xpos[wall]
        half = np.abs(physics.named.data.geom_xmat[wall].reshape(3, 3)) @ physics.named.model.geom_size[wall]
        boxes[wall] = ((centre - half)[:2], (centre + half)[:2])
    return boxes


# -- point-mass maze --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def explore() -> DMCEnv:
    return DMCEnv("point_mass_maze_explore", obs="states", seed=0)


def test_walls_are_where_appendix_e_puts_them(explore):
    boxes = _wall_boxes(explore.physics)
    np.testing.assert_allclose(np.concatenate(boxes["maze_x"]), [-0.12, -0.1, -0.08, 0.1], atol=1e-12)
    np.testing.assert_allclose(np.concatenate(boxes["maze_neg_x"]), [0.08, -0.1, 0.12, 0.1], atol=1e-12)
    np.testing.assert_allclose(np.concatenate(boxes["maze_y"]), [-0.12, 0.1, 0.12, 0.14], atol=1e-12)


@pytest.mark.parametrize("start, action, axis, face, side", [
    ((-0.2, 0.0), (1.0, 0.0), 0, -0.12, -1),   # left of maze_x, pushed right
    ((0.0, 0.0), (-1.0, 0.0), 0, -0.08, 1),    # inside the U, pushed left into maze_x
    ((0.0, 0.0), (1.0, 0.0), 0, 0.08, -1),     # inside the U, pushed right into maze_neg_x
    ((0.0, 0.0), (0.0, 1.0), 1, 0.10, -1),     # inside the U, pushed up into maze_y
    ((0.0, 0.25), (0.0, -1.0), 1, 0.14, 1),    # above the U, pushed down onto maze_y
])
def test_a_pushed_point_does_not_pass_a_maze_wall(explore, start, action, axis, face, side):
    explore.reset()
    _set_state(explore.physics, {"root_x": start[0], "root_y": start[1]})
    positions = []
    for _ in range(150):  # 300 frames = 6 s at full force
        explore.step(np.array(action))
        positions.append(explore.physics.named.data.geom_xpos["pointmass", axis])
    positions = np.array(positions)
    assert np.all(side * (positions - face) > 0)  # the centre never reaches the wall's face
    assert side * (positions[-1] - face) < POINT_RADIUS + 2e-3  # it was pressed against the wall


def test_without_a_wall_in_the_way_the_same_push_crosses_that_line(explore):
    explore.reset()
    _set_state(explore.physics, {"root_x": -0.2, "root_y": -0.2})  # below the maze
    for _ in range(150):
        explore.step(np.array([1.0, 0.0]))
    assert explore.physics.named.data.geom_xpos["pointmass", 0] > -0.08


def test_initial_states_are_in_the_top_left_square_and_depend_on_the_seed():
    starts = []
    for seed in range(5):
        env = DMCEnv("point_mass_maze_reach_center", obs="states", seed=seed)
        for _ in range(2):
            env.reset()
            position = env.physics.named.data.qpos[["root_x", "root_y"]].copy()
            assert np.all(position >= maze.START_LOW) and np.all(position <= maze.START_HIGH)
            np.testing.assert_array_equal(env.physics.data.qvel, 0.0)
            starts.append(position)
    assert len({tuple(s) for s in starts}) == len(starts)  # differ across seeds and across episodes
    again = DMCEnv("point_mass_maze_reach_center", obs="states", seed=3)
    again.reset()
    np.testing.assert_array_equal(again.physics.named.data.qpos[["root_x", "root_y"]], starts[6])


def test_reach_center_reward_is_one_exactly_inside_radius_0_07():
    env = DMCEnv("point_mass_maze_reach_center", obs="states", seed=0)
    env.reset()
    for position, expected in [((0.0, 0.0), 1.0), ((0.069, 0.0), 1.0), ((0.0, -0.0699), 1.0),
                               ((0.05, 0.05), 0.0), ((0.071, 0.0), 0.0), ((0.0, -0.2), 0.0), ((-0.2, 0.2), 0.0)]:
        _set_state(env.physics, {"root_x": position[0], "root_y": position[1]})
        assert _reward(env) == expected, position


def test_explore_reward_is_zero_and_draws_no_target(explore):
    explore.reset()
    _set_state(explore.physics, {"root_x": 0.0, "root_y": 0.0})
    assert _reward(explore) == 0.0
    assert "target" not in [explore.physics.model.id2name(i, "geom") for i in range(explore.physics.model.ngeom)]


@pytest.mark.parametrize("suffix", list(maze.TARGETS))
def test_each_target_is_marked_reachable_and_clear_of_the_walls(suffix):
    env = DMCEnv(f"point_mass_maze_{suffix}", obs="states", seed=0)
    env.reset()
    target = np.array(maze.TARGETS[suffix])
    np.testing.assert_allclose(env.physics.named.data.geom_xpos["target", :2], target)
    assert np.all(np.abs(target) + maze.TARGET_RADIUS <= 0.29)  # the reward disc is inside the joint range
    for low, high in _wall_boxes(env.physics).values():
        gap = np.linalg.norm(np.maximum(0.0, np.maximum(low - target, target - high)))
        # every rewarded centre position is free: the point can be anywhere in the disc (the centre's disc
        # exactly fits the U's 0.16 m inner width)
        assert gap >= maze.TARGET_RADIUS + POINT_RADIUS - 1e-12, suffix
    _set_state(env.physics, {"root_x": target[0], "root_y": target[1]})
    assert _reward(env) == 1.0
    away = np.array([0.0, -0.2]) if suffix == "reach_center" else np.zeros(2)
    _set_state(env.physics, {"root_x": away[0], "root_y": away[1]})
    assert _reward(env) == 0.0


# -- walker -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def walkers() -> dict[str, DMCEnv]:
    envs = {name: DMCEnv(name, obs="states", seed=0) for name in WALKER_TASKS}
    for env in envs.values():
        env.reset()
    return envs


def _walker_rewards(walkers, qvel: dict[str, float]) -> dict[str, float]:
    """Each task's reward with the walker standing straight (torso at 1.3 m) and moving with `qvel`."""
    rewards = {}
    for name, env in walkers.items():
        _set_state(env.physics, {}, qvel)
        rewards[name] = _reward(env)
    return rewards


def test_run_rewards_increase_in_their_direction(walkers):
    forward, backward = _walker_rewards(walkers, {"rootx": 4.0}), _walker_rewards(walkers, {"rootx": -4.0})
    assert forward["walker_run_forward"] > forward["walker_run_backward"]
    assert backward["walker_run_backward"] > backward["walker_run_forward"]
    assert forward["walker_run_forward"] == pytest.approx(backward["walker_run_backward"])
    fast_backward = _walker_rewards(walkers, {"rootx": -9.0})
    assert fast_backward["walker_run_backward"] == pytest.approx(1.0)  # standing, upright, >= 8 m/s backward


def test_flip_rewards_increase_in_their_direction(walkers):
    # +omega_y tips the torso's top towards +x, the way the walker faces: a forward flip
    forward, backward = _walker_rewards(walkers, {"rooty": 2.0}), _walker_rewards(walkers, {"rooty": -2.0})
    assert forward["walker_flip_forward"] > forward["walker_flip_backward"]
    assert backward["walker_flip_backward"] > backward["walker_flip_forward"]
    assert forward["walker_flip_forward"] == pytest.approx(1.0)  # L_y = 2 rad/s * ~7.2 kg m^2 > 5
    slow = _walker_rewards(walkers, {"rooty": 0.2})["walker_flip_forward"]
    assert 1 / 6 < slow < forward["walker_flip_forward"]


def test_run_forward_is_the_suites_walker_run(walkers):
    raw = suite.load("walker", "run", task_kwargs={"random": 0})
    env = walkers["walker_run_forward"]
    rng = np.random.default_rng(0)
    for _ in range(5):
        qpos = rng.uniform(-0.5, 0.5, env.physics.model.nq) + np.array([0.2] + [0.0] * 8)
        qvel = {"rootx": rng.uniform(-10, 10), "rooty": rng.uniform(-3, 3)}
        for physics in (env.physics, raw.physics):
            _set_state(physics, qpos, qvel)
        assert _reward(env) == pytest.approx(raw.task.get_reward(raw.physics), abs=1e-12)


# -- reach duplo ------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", list(BRICK_POSITIONS))
def test_duplo_brick_is_at_its_fixed_position(name):
    for seed in (0, 1):
        env = DMCEnv(name, obs="states", seed=seed)
        env.reset()
        np.testing.assert_allclose(env.physics.named.data.xpos["duplo2x4/", :2], BRICK_POSITIONS[name], atol=1e-4)


@pytest.mark.slow
def test_single_task_duplo_brick_is_placed_anywhere_in_the_original_workspace():
    from dm_control.manipulation import reach

    box = reach._DUPLO_WORKSPACE.target_bbox
    positions = []
    for seed in (0, 1, 2):
        env = DMCEnv("reach_duplo", obs="states", seed=seed)
        env.reset()
        xy = env.physics.named.data.xpos["duplo2x4/", :2]
        assert np.all(xy >= np.asarray(box.lower[:2]) - 1e-3) and np.all(xy <= np.asarray(box.upper[:2]) + 1e-3)
        positions.append(xy.copy())
    assert np.ptp(np.stack(positions), axis=0).max() > 0.01  # the seed moves the brick


@pytest.mark.slow
def test_duplo_renders_from_the_front_camera():
    env = DMCEnv("reach_duplo_top_left", seed=0)
    assert env.physics.model.id2name(env.camera_id, "camera") == "front_close"
    assert env.action_shape == (9,)
    ts = env.reset()
    np.testing.assert_array_equal(ts.frame, env.physics.render(84, 84, camera_id=0).transpose(2, 0, 1))


@pytest.mark.parametrize("name, frames", [("point_mass_maze_explore", 1000), ("walker_flip_backward", 1000),
                                          ("reach_duplo_bottom_left", 250)])
@pytest.mark.slow
def test_episode_lengths(name, frames):
    env = DMCEnv(name, obs="states", action_repeat=1, seed=0)
    ts, steps = env.reset(), 0
    while not ts.last:
        ts = env.step(np.zeros(env.action_shape))
        steps += 1
    assert steps == frames


# -- all new tasks ----------------------------------------------------------------------------------------
def test_new_tasks_are_listed_and_suggested_for_a_mistyped_name():
    assert set(NEW_TASKS) <= set(list_tasks())
    for name in NEW_TASKS:
        with pytest.raises(ValueError) as error:
            check_task(name[:-1])  # the last letter lost
        assert f"did you mean {name}" in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW_TASKS)
def test_pixels_and_states_through_dmcenv(name):
    env = DMCEnv(name, obs="pixels", seed=0)
    ts = env.reset()
    assert ts.obs.shape == (9, 84, 84) and ts.obs.dtype == np.uint8
    assert ts.frame.std() > 1.0
    ts = env.step(np.full(env.action_shape, 0.5))
    assert ts.obs.shape == (9, 84, 84) and np.isfinite(ts.reward)
    states = DMCEnv(name, obs="states", seed=0)
    ts = states.reset()
    assert ts.obs.dtype == np.float32 and ts.obs.shape == states.obs_shape and len(ts.obs.shape) == 1
    ts = states.step(np.full(states.action_shape, -0.5))
    assert ts.obs.shape == states.obs_shape and np.all(np.isfinite(ts.obs))


@pytest.mark.parametrize("pretrain, downstream, domain", [
    ("point_mass_maze_explore", "point_mass_maze_reach_center", "point_mass_maze"),
    ("walker_run_backward", "walker_walk", "walker"),
    ("reach_duplo_top_left", "reach_duplo_bottom_right", "reach_duplo"),
])
def test_snapshot_specs_match_within_a_domain(pretrain, downstream, domain):
    """A snapshot of the pre-training task fits its downstream task (same spec), and the spec is not a constant:
    it names the domain and the observations, so the same domain's snapshot from the other observation type is
    refused."""
    specs = {obs: DMCEnv(pretrain, obs=obs, seed=0).spec() for obs in ("pixels", "states")}
    for obs, spec in specs.items():
        assert (spec["domain"], spec["obs_type"]) == (domain, obs)
        assert spec == DMCEnv(downstream, obs=obs, seed=1).spec()
    with pytest.raises(SnapshotError, match="obs_type: snapshot has 'pixels', this environment has 'states'"):
        check_spec("snapshot.pt", specs["pixels"], specs["states"])


def test_the_maze_is_not_point_mass_easy():
    with pytest.raises(SnapshotError, match="domain"):
        check_spec("snapshot.pt", DMCEnv("point_mass_maze_explore", seed=0).spec(),
                   DMCEnv("point_mass_easy", seed=0).spec())
