"""The analyses that show what exploration achieved: the uniform-random policy's coverage over the same frames
(every run's own baseline) and the reward field (the reward of the point at rest at every cell of the maze)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protorl.envs import DMCEnv
from protorl.exploration.coverage import coverage_spec, histogram
from protorl.exploration.maps import cell_centres, inside_walls, reward_field, wall_rectangles
from protorl.exploration.random_reference import REFERENCE_SEED_OFFSET, RandomPolicyCoverage

TASK = "point_mass_maze_explore"


@pytest.fixture(scope="module")
def maze():
    env = DMCEnv(TASK, obs="states", seed=0)
    env.reset()
    return env, coverage_spec(env.domain, env.physics, bins=10), wall_rectangles(env.physics)


def test_observe_at_places_the_point_at_rest(maze):
    env, _, _ = maze
    state = np.zeros(env.physical_state_shape)
    state[:2] = (0.2, -0.15)
    np.testing.assert_allclose(env.observe_at(state), [0.2, -0.15, 0.0, 0.0], atol=1e-6)  # position, velocity
    pixels = DMCEnv(TASK, obs="pixels", image_size=32, seed=0)
    pixels.reset()
    left = pixels.observe_at(state)
    state[0] = -0.2
    right = pixels.observe_at(state)
    assert left.shape == (9, 32, 32) and np.array_equal(left[:3], left[6:])  # a motionless stack
    assert not np.array_equal(left, right)  # the point is drawn where it was put


def test_reward_field_evaluates_every_free_cell_at_its_centre(maze):
    env, spec, walls = maze
    seen = []

    def score(obs):  # stands in for the agent: "reward" = the observed x position
        seen.append(len(obs))
        return obs[:, 0]

    field = reward_field(score, env, spec, walls)
    centres = cell_centres(spec).reshape(10, 10, 2)
    blocked = inside_walls(centres.reshape(-1, 2), walls).reshape(10, 10)
    assert blocked.any() and not blocked.all()
    np.testing.assert_allclose(field[~blocked], centres[..., 0][~blocked], atol=1e-6)
    assert np.isnan(field[blocked]).all() and seen == [int((~blocked).sum())]


@pytest.mark.slow
def test_random_reference_is_a_uniform_random_rollout_of_the_same_frames(maze):
    env, spec, _ = maze
    reference = RandomPolicyCoverage(TASK, action_repeat=2, spec=spec, seed=3)
    early = reference.counts_at(1000)
    late = reference.counts_at(2600)
    # every visited state is counted once: an episode's first state plus one per agent step
    assert early.sum() == 1 + 500 and late.sum() == 3 + 1300  # 2600 frames: a third episode has begun
    # built in pieces or at once: the same rollout
    np.testing.assert_array_equal(RandomPolicyCoverage(TASK, 2, spec, seed=3).counts_at(2600), late)
    # resumed from a checkpoint's state: on from the last episode's end (2000 frames), as the straight rollout goes
    resumed = RandomPolicyCoverage(TASK, 2, spec, seed=3)
    resumed.load_state_dict(reference.state_dict())
    assert resumed.frames == 2000
    np.testing.assert_array_equal(resumed.counts_at(2600), late)
    np.testing.assert_array_equal(resumed.counts_at(4100), reference.counts_at(4100))
    at_an_end = RandomPolicyCoverage(TASK, 2, spec, seed=3)  # rolled to an episode's last frame: kept from there
    at_an_end.counts_at(1000)
    resumed = RandomPolicyCoverage(TASK, 2, spec, seed=3)
    resumed.load_state_dict(at_an_end.state_dict())
    assert resumed.frames == 1000
    np.testing.assert_array_equal(resumed.counts_at(2600), late)
    assert not np.array_equal(RandomPolicyCoverage(TASK, 2, spec, seed=4).counts_at(2600), late)
    # the rollout is uniform-random: it matches a direct rollout with the same streams
    direct = DMCEnv(TASK, obs="states", action_repeat=2, seed=3 + REFERENCE_SEED_OFFSET)
    rng = np.random.default_rng([3, REFERENCE_SEED_OFFSET])
    states = [direct.reset().physical_state]
    for _ in range(500):
        states.append(direct.step(rng.uniform(-1.0, 1.0, size=direct.action_shape)).physical_state)
    np.testing.assert_array_equal(histogram(np.stack(states), spec).reshape(spec.shape), early)


# -- downstream seed transitions ------------------------------------------------------------------------------
def test_downstream_seed_transitions_come_from_the_pretrained_actor(tmp_path):
    """From a snapshot, the exploration actor collects the seed transitions (the paper's code); without one
    (no pre-training) they are uniform-random. The snapshot's actor is made to push hard right and up."""
    import torch

    from protorl.agents import make_agent
    from protorl.training import Trainer, phase_of
    from tests.agents import config_of, tiny_config

    cfg = config_of({"task": "point_mass_maze_reach_top_left", "finetune_frames": 800, "run_dir": str(tmp_path),
                     "env": {"obs": "states", "action_repeat": 8}, "training": {"seed_transitions": 100},
                     "replay": {"capacity": 500}, "snapshots": {"at_frames": []},
                     "checkpoints": {"every_frames": None}, "evaluation": {"episodes": 0},
                     "analyses": {"every_frames": None}, "logging": {"tensorboard": False, "progress_bar": False}},
                    agent=tiny_config("proto"))
    explorer = make_agent(cfg.agent, "states", (4,), (2,), torch.device("cpu"), "pretrain")
    with torch.no_grad():  # mean tanh(3) ~ +0.995 on both actions, std e^-10
        last = explorer.sac.actor.policy[-1]
        last.weight.zero_()
        last.bias.copy_(torch.tensor([3.0, 3.0, -100.0, -100.0]))
    env_spec = {"domain": "point_mass_maze", "obs_type": "states", "obs_shape": [4], "action_shape": [2],
                "action_repeat": 8}
    snapshot = {"agent": explorer.representation_state(), "env_spec": env_spec,
                "config": {"agent": dataclasses.asdict(cfg.agent)}, "frames": 1000}
    seeded = Trainer(cfg, phase_of(cfg, "frozen"), tmp_path / "from_snapshot", snapshot)
    seeded.run()
    plain = Trainer(dataclasses.replace(cfg, agent=tiny_config("drq")), phase_of(cfg, "online"),
                    tmp_path / "no_pretraining")
    plain.run()
    for trainer, actor in ((seeded, True), (plain, False)):
        actions = trainer.replay.actions[1:101]  # the 100 seed steps (slot 0 holds the first frame): no update ran
        if actor:
            assert np.all(actions > 0.99)
        else:
            assert -1 <= actions.min() < -0.5 and 0.5 < actions.max() <= 1 and abs(actions.mean()) < 0.15
