"""protorl's tasks through Gymnasium's API (`protorl.gym`): registered, valid for Gymnasium's checker, and the same
environment as protorl's own."""

from __future__ import annotations

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium")

from gymnasium.utils.env_checker import check_env  # noqa: E402

import protorl  # noqa: E402
import protorl.gym  # noqa: E402,F401 -- registers protorl/<task>-v0
from protorl.envs import DMCEnv, list_tasks  # noqa: E402


def test_every_task_is_registered():
    assert {f"protorl/{task}-v0" for task in list_tasks()} <= set(gymnasium.registry)


@pytest.mark.slow
@pytest.mark.parametrize(("task", "obs"), [("walker_walk", "states"), ("point_mass_maze_explore", "pixels")])
# the suite's state observations are unbounded (dm_control's specs say so): the checker's advice, not a failure
@pytest.mark.filterwarnings("ignore:.*Box observation space (minimum|maximum) value is:UserWarning")
def test_gymnasium_checker_passes_a_suite_task_and_a_paper_task(task, obs):
    env = gymnasium.make(f"protorl/{task}-v0", obs=obs, image_size=32, render_mode="rgb_array", render_size=32)
    check_env(env.unwrapped)  # reset/step signatures, spaces, seeding determinism, rendering
    env.reset(seed=0)
    assert env.render().shape == (32, 32, 3)


@pytest.mark.slow
def test_pixels_of_an_environment_whose_renderer_is_not_installed_are_one_line(tmp_path):
    """Pendulum renders with pygame: where pygame is missing, task=gym:Pendulum-v1 env.obs=pixels is a user error
    (exit status 2) naming the package, and nothing is written."""
    try:
        import pygame  # noqa: F401
        pytest.skip("pygame is installed: the environment renders")
    except ImportError:
        pass
    from tests.runs import assert_user_error, run

    result = run("train", "task=gym:Pendulum-v1", "env.obs=pixels", "preset=small", run_dir=tmp_path / "run")
    assert_user_error(result, "task=gym:Pendulum-v1 env.obs=pixels", "pygame is not installed")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_same_frames_stack_action_repeat_and_time_limit_as_protorls_env():
    """Same seed, same actions: the Gymnasium environment returns protorl's observations and rewards, and its
    episode ends truncated where protorl's ends (1000 frames: 125 steps of 8)."""
    settings = dict(obs="pixels", image_size=32, frame_stack=3, action_repeat=8, seed=5)
    env = gymnasium.make("protorl/point_mass_maze_explore-v0", **settings)
    own = DMCEnv("point_mass_maze_explore", **settings)
    obs, _ = env.reset()
    time_step = own.reset()
    assert obs.shape == env.observation_space.shape == (9, 32, 32) and obs.dtype == np.uint8
    np.testing.assert_array_equal(obs, time_step.obs)
    rng = np.random.default_rng(0)
    steps, truncated = 0, False
    while not truncated and steps < 200:
        action = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
        obs, reward, terminated, truncated, info = env.step(action)
        time_step = own.step(action)
        steps += 1
        np.testing.assert_array_equal(obs, time_step.obs)
        assert reward == time_step.reward and info["discount"] == time_step.discount
        assert truncated == time_step.last and not terminated
    assert steps == 125
    # a reset with a seed reseeds the task: the same first observation as a fresh environment with that seed
    first, _ = env.reset(seed=9)
    np.testing.assert_array_equal(first, DMCEnv("point_mass_maze_explore", **{**settings, "seed": 9}).reset().obs)


@pytest.mark.slow
@pytest.mark.parametrize("obs", ["states", "pixels"])
def test_pretrain_and_finetune_on_a_gymnasium_environment(obs, tmp_path):
    """task=gym:<id>: a tiny Proto-RL pre-training and fine-tuning from its snapshot, through the real command."""
    import protorl
    from tests.agents import tiny_config

    run_dir = tmp_path / "run"
    pretrain, finetune = protorl.train(
        task="gym:InvertedPendulum-v5", env={"obs": obs, "image_size": 32, "action_repeat": 4},
        training={"seed_transitions": 20}, replay={"capacity": 1000}, evaluation={"episodes": 1, "every_frames": 400},
        analyses={"every_frames": 400}, snapshots={"at_frames": []},
        logging={"progress_bar": False, "tensorboard": False}, runtime={"threads": 1},
        pretrain_frames=400, finetune_frames=400,
        agent=tiny_config("proto", anti_collapse="center", reward_space="raw"), run_dir=str(run_dir))
    assert (pretrain.frames, finetune.frames) == (400, 400) and pretrain.episodes > 0
    assert pretrain.snapshots and pretrain.snapshots[-1].is_file()
    from tests.runs import read_rows

    rows = read_rows(run_dir / "pretrain" / "analysis.csv")  # the reward variance needs no physical state
    assert rows and rows[-1]["variance/proto_mean"] != "" and rows[-1]["coverage/entropy"] == ""
    evals = read_rows(run_dir / "finetune" / "eval.csv")
    assert [r["frames"] for r in evals] == ["0", "400"]


@pytest.mark.slow
def test_a_gymnasium_id_that_does_not_exist_is_one_clear_error(tmp_path):
    from tests.runs import STATES, assert_user_error, run

    result = run("pretrain", *STATES, "task=gym:NoSuchEnv-v0", run_dir=tmp_path / "run")
    assert_user_error(result, "NoSuchEnv-v0")
    assert not (tmp_path / "run").exists()


def test_a_checkpointed_random_state_continues_the_same_episodes():
    """What a checkpoint keeps of a Gymnasium task (its generator) makes a fresh environment start the next
    episode where the first would have."""
    from protorl.envs.gymnasium_env import GymnasiumEnv

    first = GymnasiumEnv("gym:InvertedPendulum-v5", obs="states", action_repeat=2, seed=3)
    first.reset()
    state = first.rng_state()
    expected = first.reset().obs
    resumed = GymnasiumEnv("gym:InvertedPendulum-v5", obs="states", action_repeat=2, seed=3)
    assert not np.array_equal(resumed.reset().obs, expected)  # the seed's first episode is another one
    resumed.set_rng_state(state)
    np.testing.assert_array_equal(resumed.reset().obs, expected)


def test_a_camera_on_a_gymnasium_environment_is_refused_in_plain_words():
    """A Gymnasium environment renders its own view: an env.camera_id is refused saying so (not "cameras 0 to -1")."""
    from protorl.agents.proto.agent import ProtoConfig
    from protorl.app.plan import validate
    from protorl.config import Config, ConfigError, EnvConfig

    config = Config(agent=ProtoConfig(), task="gym:InvertedPendulum-v5", env=EnvConfig(obs="states", camera_id=0))
    with pytest.raises(ConfigError, match="has no cameras to choose from") as info:
        validate(config, "pretrain")
    assert "-1" not in str(info.value)


class InfiniteAfterAWhile(gymnasium.Env):
    """A Gymnasium environment whose observation becomes infinite on its 40th step."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.steps += 1
        obs = np.full(3, np.inf if self.steps == 40 else 0.0, np.float32)
        return obs, 0.0, False, self.steps >= 100, {}


def test_an_infinite_observation_stops_the_run_as_diverged(tmp_path):
    from protorl.errors import TrainingDiverged
    from tests.agents import tiny

    gymnasium.register("InfiniteAfterAWhile-v0", entry_point=InfiniteAfterAWhile)
    with pytest.raises(TrainingDiverged, match="non-finite observation"):
        protorl.pretrain(tiny(tmp_path / "run", task="gym:InfiniteAfterAWhile-v0", env={"action_repeat": 1}))


class UnboundedActions(InfiniteAfterAWhile):
    action_space = gymnasium.spaces.Box(-np.inf, np.inf, (1,), np.float32)


@pytest.mark.parametrize(("env_id", "fragment"), [("CartPole-v1", "bounded Box action space"),
                                                  ("UnboundedActions-v0", "bounded Box action space")])
def test_a_gymnasium_space_protorl_cannot_use_is_refused_before_anything_is_written(tmp_path, env_id, fragment):
    from protorl.errors import ConfigError
    from tests.agents import tiny

    if "UnboundedActions-v0" not in gymnasium.registry:
        gymnasium.register("UnboundedActions-v0", entry_point=UnboundedActions)
    with pytest.raises(ConfigError, match=fragment):
        protorl.pretrain(tiny(tmp_path / "run", task=f"gym:{env_id}"))
    assert not (tmp_path / "run").exists()


class DictObservation(gymnasium.Wrapper):
    """InvertedPendulum-v5 with its state inside a Dict observation."""

    def __init__(self, **kwargs):
        super().__init__(gymnasium.make("InvertedPendulum-v5", **kwargs))
        self.observation_space = gymnasium.spaces.Dict({"state": self.env.observation_space})

    def reset(self, **kwargs):
        observation, info = self.env.reset(**kwargs)
        return {"state": observation}, info

    def step(self, action):
        observation, *rest = self.env.step(action)
        return {"state": observation}, *rest


@pytest.mark.slow
def test_a_dict_observation_trains_from_pixels_and_is_refused_from_states(tmp_path):
    from protorl.errors import ConfigError
    from tests.agents import tiny

    gymnasium.register("DictObservation-v0", entry_point=DictObservation, max_episode_steps=1000)
    with pytest.raises(ConfigError, match="needs a Box observation space"):
        protorl.pretrain(tiny(tmp_path / "states", task="gym:DictObservation-v0", env={"obs": "states"}))
    assert not (tmp_path / "states").exists()
    results = protorl.train(tiny(tmp_path / "pixels", task="gym:DictObservation-v0",
                                 env={"obs": "pixels", "image_size": 32}, replay={"capacity": 500}))
    assert [(result.phase, result.frames) for result in results] == [("pretrain", 1000), ("finetune", 1000)]
