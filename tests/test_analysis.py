"""The pre-training analyses (protorl/exploration/ and the analyses callback): coverage math against hand
computations, the maze's walls, the reward-variance statistics and their isolation from training's RNGs, exact
resume with analyses on, and a real maze run through `protorl-pretrain` and `protorl-analyze`."""

from __future__ import annotations

import copy
import math
import re
import shutil

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from protorl.app.plan import validate
from protorl.app.tools import analyze
from protorl.config import AnalysesConfig, Config, ConfigError, EnvConfig
from protorl.envs import DMCEnv
from protorl.errors import CheckpointError, ResultsError
from protorl.exploration.analysis import Analysis, Report, Visits, register_analysis, unregister_analysis
from protorl.exploration.coverage import (
    CoverageSpec,
    bin_indices,
    coordinates,
    coverage_entropy,
    coverage_spec,
    histogram,
    visited_fraction,
)
from protorl.exploration.maps import closest_samples, wall_rectangles
from protorl.exploration.reward_variance import (
    ReplayProjections,
    embed,
    knn_reward,
    proto_candidates,
    reward_variance,
    spread,
)
from protorl.logs.logger import Logger
from protorl.plots import Curve, Panel, plot_curves, series
from protorl.replay import ReplayBuffer
from protorl.reports.analyze import analyze_run
from protorl.training import Trainer, phase_of
from protorl.training.callbacks.exploration import AnalysisMonitor, analysis_columns
from tests.agents import config_of
from tests.agents import tiny_config as tiny_agent_config
from tests.runs import TINY, assert_ok, read_csv, run

UNIT_SQUARE_2X2 = CoverageSpec(("x", "y"), np.array([0, 1]), np.zeros(2), np.ones(2), np.zeros(2, dtype=bool), 2)


# -- coverage math -----------------------------------------------------------------------------------------
def test_coverage_entropy_by_hand():
    # p = (1/2, 1/4, 1/4, 0): H = -(1/2 ln 1/2 + 2 * 1/4 ln 1/4) = 1.5 ln 2; / ln 4 = 0.75
    assert coverage_entropy(np.array([2, 1, 1, 0])) == pytest.approx(0.75, abs=1e-12)
    # p = (3/4, 1/4) over 3 cells: H = -(3/4 ln 3/4 + 1/4 ln 1/4) = 0.562335; / ln 3 = 0.511860
    assert coverage_entropy(np.array([3, 0, 1])) == pytest.approx(0.5118595, abs=1e-6)
    assert coverage_entropy(np.full((20, 20), 7)) == pytest.approx(1.0, abs=1e-12)  # uniform visits
    assert coverage_entropy(np.eye(1, 400, 123).reshape(20, 20) * 50) == 0.0  # one cell
    assert coverage_entropy(np.zeros(4)) == 0.0  # no visits yet
    assert visited_fraction(np.array([2, 1, 1, 0])) == 0.75


def test_coverage_of_a_small_synthetic_buffer_by_hand():
    """Four states on a 2 x 2 grid of the unit square, written to a ring that then wraps."""
    replay = ReplayBuffer((1,), np.dtype(np.float32), (1,), capacity=4, frame_stack=1, physical_state_shape=(3,))
    # (x, y, unused): cells (0, 0), (0, 0), (1, 0), (1, 1); 1.7 is beyond the range: the edge bin
    states = [(0.1, 0.1, 9.0), (0.2, 0.4, 9.0), (0.9, 0.3, 9.0), (0.6, 1.7, 9.0)]
    replay.add_first(np.zeros(1), np.array(states[0]))
    for state in states[1:]:
        replay.add(np.zeros(1), np.zeros(1), 0.0, 1.0, np.array(state))
    counts = histogram(replay.stored_physical_states(), UNIT_SQUARE_2X2)
    assert counts.tolist() == [2, 0, 1, 1]  # flat index x * 2 + y
    assert coverage_entropy(counts) == pytest.approx(0.75)  # as above
    assert visited_fraction(counts) == 0.75
    replay.add(np.zeros(1), np.zeros(1), 0.0, 1.0, np.array([0.7, 0.1, 9.0]))  # overwrites the first slot
    counts = histogram(replay.stored_physical_states(), UNIT_SQUARE_2X2)
    assert counts.tolist() == [1, 0, 2, 1]
    # p = (1/4, 1/2, 1/4): the same entropy, deterministic given the buffer's contents
    assert coverage_entropy(counts) == pytest.approx(0.75)


def test_angles_wrap_and_ranges_clip():
    spec = CoverageSpec(("angle",), np.array([0]), np.array([-math.pi]), np.array([math.pi]), np.array([True]), 4)
    angles = np.array([[0.1], [1.5 * math.pi], [-0.1], [7.0], [-math.pi]])  # 1.5 pi = -pi/2; 7 = 0.717
    assert bin_indices(angles, spec).tolist() == [2, 1, 1, 2, 0]
    clipped = np.array([[-5.0, 0.5], [0.5, 5.0]])
    assert bin_indices(clipped, UNIT_SQUARE_2X2).tolist() == [0 * 2 + 1, 1 * 2 + 1]


def test_maze_coverage_and_walls_come_from_the_model():
    env = DMCEnv("point_mass_maze_explore", obs="states", seed=0)
    spec = coverage_spec(env.domain, env.physics, bins=20)
    assert spec.labels == ("x", "y") and spec.shape == (20, 20)
    np.testing.assert_allclose(spec.low, [-0.29, -0.29])  # the slide joints' range
    np.testing.assert_allclose(spec.high, [0.29, 0.29])
    time_step = env.reset()
    np.testing.assert_array_equal(time_step.physical_state[spec.columns], env.physics.named.data.qpos[["root_x",
                                                                                                       "root_y"]])
    walls = sorted(wall_rectangles(env.physics))  # appendix E: left, right and top walls
    np.testing.assert_allclose(walls, [(-0.12, -0.1, -0.08, 0.1), (-0.12, 0.1, 0.12, 0.14), (0.08, -0.1, 0.12, 0.1)],
                               atol=1e-9)
    assert wall_rectangles(DMCEnv("point_mass_easy", obs="states", seed=0).physics) == []
    assert coverage_spec("humanoid", env.physics, bins=20) is None  # no coordinates defined: no coverage


def test_uprightness_is_the_world_z_part_of_the_body_z_axis():
    """A free body's quaternion (w, x, y, z) -> R_zz = 1 - 2 (x² + y²): upright 1, on its back -1, on its side 0,
    whatever its heading."""
    half = math.sqrt(0.5)
    spec = CoverageSpec(("upright",), np.array([0]), np.array([-1.0]), np.array([1.0]), np.array([False]), 4,
                        np.array([True]))
    quaternions = np.array([[1.0, 0, 0, 0],  # upright
                            [0, 1.0, 0, 0],  # half a turn about x: on its back
                            [half, 0, half, 0],  # a quarter turn about y: on its side
                            [half, 0, 0, half],  # a quarter turn about z: upright, another heading
                            [0.5, 0.5, 0.5, 0.5],  # a third of a turn about (1, 1, 1): z goes to x, R_zz 0
                            [math.cos(0.5), math.sin(0.5), 0, 0]])  # 1 radian about x: R_zz = cos 1
    np.testing.assert_allclose(coordinates(quaternions, spec)[:, 0], [1, -1, 0, 1, 0, math.cos(1)], atol=1e-12)
    # bins of 0.5 over [-1, 1], 1 in the edge bin; cos 1 = 0.54 in [0.5, 1)
    assert bin_indices(quaternions[[0, 1, 3, 5]], spec).tolist() == [3, 0, 3, 3]


def test_quadruped_coverage_is_the_torso_position_height_and_tilt():
    env = DMCEnv("quadruped_walk", obs="states", seed=0)
    spec = coverage_spec(env.domain, env.physics, bins=20)
    assert spec.labels == ("torso x", "torso y", "torso z", "torso upright") and spec.shape == (20,) * 4
    rng = np.random.default_rng(0)
    time_step, states, expected = env.reset(), [], []
    for _ in range(200):  # the torso starts in a random orientation and falls to the floor
        states.append(time_step.physical_state)
        physics = env.physics
        expected.append([*physics.named.data.qpos["root"][:3], physics.torso_upright()])
        time_step = env.step(rng.uniform(-1, 1, env.action_shape))
    values = coordinates(np.array(states), spec)
    np.testing.assert_allclose(values, expected, atol=1e-6)  # dm_control's own torso_upright: xmat['torso', 'zz']
    assert values[:, 3].min() < 0.9  # the uprightness moved


def test_visits_written_without_coverage_are_refused_where_the_domain_now_has_it():
    """A checkpoint from a protorl that had no coverage coordinates for the domain kept no histogram: resuming it
    would count the coverage from the resume on, so it is refused, saying why."""
    env = DMCEnv("quadruped_walk", obs="states", seed=0)
    before = Visits(None)
    before.add(env.reset().physical_state)
    with pytest.raises(CheckpointError, match="kept no coverage histogram .* start_over=true"):
        Visits(coverage_spec(env.domain, env.physics, bins=20)).load_state_dict(before.state_dict())


def test_replay_keeps_physical_states_through_a_checkpoint():
    replay = ReplayBuffer((2,), np.dtype(np.float32), (1,), capacity=3, frame_stack=1, physical_state_shape=(2,))
    with pytest.raises(ValueError, match="physical state"):
        replay.add_first(np.zeros(2))
    for i in range(5):
        (replay.add_first if i == 0 else lambda f, s: replay.add(f, np.zeros(1), 0.0, 1.0, s))(
            np.zeros(2), np.array([i, -i], dtype=np.float64))
    assert replay.stored_physical_states()[:, 0].tolist() == [3, 4, 2]  # slot order after the ring wrapped
    restored = ReplayBuffer((2,), np.dtype(np.float32), (1,), capacity=3, frame_stack=1, physical_state_shape=(2,))
    restored.load_state_dict(replay.state_dict())
    np.testing.assert_array_equal(restored.stored_physical_states(), replay.stored_physical_states())
    with pytest.raises(RuntimeError, match="no physical states"):
        ReplayBuffer((2,), np.dtype(np.float32), (1,), 3, 1).stored_physical_states()


# -- maps and reward variance --------------------------------------------------------------------------------
def test_each_prototype_is_placed_at_its_closest_sample():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    prototypes = torch.tensor([[0.6, 0.8], [-0.8, -0.6], [0.8, -0.6]])
    assert closest_samples(z, prototypes).tolist() == [1, 2, 0]


def test_spread_by_hand():
    rewards = np.array([[1.0, 2.0, 0.0], [3.0, 2.0, 0.0]])  # 2 repeats of 3 probes
    # probe means (2, 2, 0), population stds (1, 0, 0), cvs (0.5, 0, 0 for the all-zero probe)
    assert spread(rewards) == pytest.approx((4 / 3, 1 / 3, 0.5 / 3))


def test_reward_variance_leaves_training_state_alone(build_agent, replay):
    agent = build_agent()
    agent.queue.enqueue(torch.randn(5, agent.cfg.proj_dim))
    queue, replay_rng = copy.deepcopy(agent.queue.state_dict()), copy.deepcopy(replay._rng.bit_generator.state)
    torch_rng, numpy_rng = torch.get_rng_state(), np.random.get_state()[1].copy()
    probes = replay.stack_at(replay.sample_indices(6, np.random.default_rng(0)))

    def measure(seed: int) -> dict[str, float]:
        rng, generator = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
        return reward_variance(agent, replay, probes, 4, rng, generator)

    first = measure(1)
    assert first == measure(1) and first != measure(2)  # reproducible from its own generators
    assert set(first) == {f"variance/{s}_{stat}" for s in ("proto", "uniform") for stat in ("mean", "std", "cv")}
    assert all(math.isfinite(v) and v >= 0 for v in first.values())
    assert first["variance/proto_mean"] > 0 and first["variance/uniform_mean"] > 0
    candidates = proto_candidates(agent, replay, np.random.default_rng(0), torch.Generator().manual_seed(0))
    assert candidates.shape == (agent.queue.capacity, agent.cfg.proj_dim)  # the agent's M x T
    torch.testing.assert_close(candidates.norm(dim=1), torch.ones(len(candidates)))
    # nothing of the agent's or the replay's state moved
    assert torch.equal(agent.queue.items, queue["items"]) and agent.queue.pointer == queue["pointer"]
    assert replay._rng.bit_generator.state == replay_rng
    assert torch.equal(torch.get_rng_state(), torch_rng) and (np.random.get_state()[1] == numpy_rng).all()


def test_replay_observations_are_encoded_once_with_the_same_projections(build_agent, replay, monkeypatch):
    agent = build_agent()
    rng, batch = np.random.default_rng(0), agent.cfg.batch_size
    draws = [replay.sample_indices(n * batch, rng) for n in (5, 1, 8)]  # whole batches, as the analyses draw
    tails = [replay.sample_indices(n, rng) for n in (batch + 5, 3)]
    projections = ReplayProjections(agent, replay)
    encoded = []
    monkeypatch.setattr(agent, "encoder", lambda obs, encode=agent.encoder: encoded.append(len(obs)) or encode(obs))
    for ends in draws:  # bit for bit what embedding the draw itself gives
        assert torch.equal(projections.at(ends), embed(agent, replay.stack_at(ends)))
    for ends in tails:  # a last chunk of 1-3 rows takes another path in the BLAS: equal to float rounding
        torch.testing.assert_close(projections.at(ends), embed(agent, replay.stack_at(ends)))
    draws += tails
    distinct = len(np.unique(np.concatenate(draws)))
    assert sum(encoded) - sum(len(ends) for ends in draws) < distinct + len(draws) * agent.cfg.batch_size


def test_reward_variance_equals_its_definition_with_every_draw_encoded(build_agent, replay):
    """The shared projections change nothing: the reward variance as defined, each draw embedded on its own."""
    agent = build_agent()
    agent.queue.enqueue(torch.randn(5, agent.cfg.proj_dim))
    probes = replay.stack_at(replay.sample_indices(6, np.random.default_rng(0)))
    rng, generator = np.random.default_rng(3), torch.Generator().manual_seed(3)
    measured = reward_variance(agent, replay, probes, 3, rng, generator)
    rng, generator = np.random.default_rng(3), torch.Generator().manual_seed(3)
    z, k, batch = agent.reward_points(embed(agent, probes)), agent.cfg.knn_k, agent.cfg.batch_size

    def drawn(count: int) -> torch.Tensor:
        return embed(agent, replay.stack_at(replay.sample_indices(count, rng)))

    proto = [knn_reward(z, torch.cat([agent.candidates(drawn(batch), generator)
                                      for _ in range(agent.cfg.candidates_per_prototype)]), k) for _ in range(3)]
    uniform = [knn_reward(z, agent.reward_points(drawn(agent.queue.capacity)), k) for _ in range(3)]
    for scheme, rewards in (("proto", proto), ("uniform", uniform)):
        expected = spread(torch.cat(rewards, dim=1).t().numpy())
        assert tuple(measured[f"variance/{scheme}_{stat}"] for stat in ("mean", "std", "cv")) == expected


@pytest.mark.slow
def test_agents_without_prototypes_get_coverage_and_a_map(tmp_path):
    """A monitor over an agent with no head: coverage and the visitation map, no reward variance."""
    env = DMCEnv("point_mass_maze_explore", obs="states", seed=0)
    replay = ReplayBuffer(env.frame_shape, env.frame_dtype, env.action_shape, 100, 1,
                          physical_state_shape=env.physical_state_shape)
    monitor = AnalysisMonitor(AnalysesConfig(every_frames=100), EnvConfig(obs="states"), 1, [env.task], 120, env,
                              object(), replay, Logger(tmp_path, (), tensorboard=False), tmp_path)
    time_step = env.reset()
    replay.add_first(time_step.frame, time_step.physical_state)
    monitor.on_time_step(time_step)
    for _ in range(60):
        time_step = env.step(np.ones(2))
        replay.add(time_step.frame, np.ones(2), 0.0, 1.0, time_step.physical_state)
        monitor.on_time_step(time_step)
    monitor.on_episode_end(120)
    row = dict(read_csv(tmp_path / "analysis.csv")[1][0])
    assert row["frames"] == "120" and row["variance/proto_cv"] == ""
    assert 0 < float(row["coverage/entropy"]) < 1 and 0 < float(row["coverage/visited_fraction"]) < 1
    assert row["coverage/entropy"] == row["coverage/replay_entropy"]  # the ring has not wrapped
    assert monitor.visits.counts.sum() == 61 and (tmp_path / "maps" / "map_120.png").exists()


# -- in the training loop -------------------------------------------------------------------------------------
def tiny_run_config(run_dir, **overrides) -> Config:
    """Maze from states, 125 agent steps per episode, analyses every 1000 frames (every episode end); `overrides`
    as `tests.agents.config_of` takes them (a group as a dict of some of its keys)."""
    values = {
        "task": "point_mass_maze_explore", "pretrain_frames": 3000, "run_dir": str(run_dir),
        "agent": tiny_agent_config("proto"),
        "env": {"obs": "states", "action_repeat": 8},
        "training": {"seed_transitions": 20},
        "replay": {"capacity": 500},
        "snapshots": {"at_frames": []},
        "checkpoints": {"every_frames": 1000, "keep": 5, "keep_completed": True},
        "evaluation": {"episodes": 1},
        "analyses": {"every_frames": 1000, "variance_probes": 8, "variance_repeats": 3, "map_samples": 32},
        "logging": {"tensorboard": False, "progress_bar": False},
    }
    return config_of(values, **overrides)


def without(rows: list[dict[str, str]], *columns: str) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in columns} for row in rows]


@pytest.mark.slow
def test_exact_resume_with_analyses_and_no_effect_on_training(tmp_path):
    """A phase resumed from its 1000-frame checkpoint writes the same analyses and maps as the straight run,
    and a run without analyses trains identically (the analyses draw from their own generators)."""
    cfg = tiny_run_config(tmp_path)
    straight = tmp_path / "straight"
    Trainer(cfg, phase_of(cfg, "pretrain", cfg.task), straight).run()
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    (resumed / "result.json").unlink()
    trainer = Trainer(cfg, phase_of(cfg, "pretrain", cfg.task), resumed)
    trainer.load_state_dict(torch.load(resumed / "checkpoints" / "checkpoint_1000.pt", weights_only=True))
    assert len(read_csv(resumed / "analysis.csv")[1]) == 1  # rows after the checkpoint dropped
    trainer.run()

    rows = read_csv(straight / "analysis.csv")[1]
    assert [row["frames"] for row in rows] == ["1000", "2000", "3000"]
    assert without(read_csv(resumed / "analysis.csv")[1], "analysis/time_s") == without(rows, "analysis/time_s")
    for name in ("map_3000.png", "maps.gif"):
        assert (resumed / "maps" / name).read_bytes() == (straight / "maps" / name).read_bytes()

    plain = tmp_path / "plain"
    Trainer(tiny_run_config(tmp_path, analyses={"every_frames": None}), phase_of(cfg, "pretrain", cfg.task),
            plain).run()
    assert not (plain / "analysis.csv").exists()
    timing = ("fps", "total_time_s")
    assert without(read_csv(plain / "train.csv")[1], *timing) == without(read_csv(straight / "train.csv")[1], *timing)


class Reach(Analysis):
    """An analysis of one's own: how far from the arena's centre the replay's states reach, and how many times it
    has measured (kept over a resume)."""

    columns = ("reach/max_distance", "reach/measurements")

    def __init__(self, context):
        super().__init__(context)
        self.measurements = 0

    def measure(self, moment):
        self.measurements += 1
        xy = self.context.replay.stored_physical_states()[:, :2]
        return {"reach/max_distance": float(np.linalg.norm(xy, axis=1).max()), "reach/measurements": self.measurements}

    def state_dict(self):
        return {"reach_measurements": self.measurements}

    def load_state_dict(self, state):
        self.measurements = state["reach_measurements"]

    outputs = ("reach.png",)

    @classmethod
    def report(cls, run):
        frames, reach = series(run.rows, "reach/max_distance")
        plot_curves([Panel("how far the replay's states reach", "distance from the centre (m)",
                           [Curve(frames, reach, fmt="o-")])], [run.out_dir / "reach.png"])
        return Report([f"  reach at {frames[-1]:.0f} frames: {reach[-1]:.3f} m"], [run.out_dir / "reach.png"])


@pytest.mark.slow
def test_an_analysis_of_ones_own_is_one_class_registered_and_resumes(tmp_path):
    """Adding an analysis: a class and `register_analysis`; its columns follow the built-in ones in analysis.csv,
    it measures at every scheduled moment, a run resumed from a checkpoint continues its state, and protorl-analyze
    shows its report beside the built-in ones'."""
    register_analysis(Reach)
    try:
        cfg = tiny_run_config(tmp_path)
        straight = tmp_path / "straight"
        Trainer(cfg, phase_of(cfg, "pretrain", cfg.task), straight).run()
        columns, rows = read_csv(straight / "analysis.csv")
        assert columns[-3:] == ["reach/max_distance", "reach/measurements", "analysis/time_s"]
        assert [row["reach/measurements"] for row in rows] == ["1", "2", "3"]
        assert all(0 < float(row["reach/max_distance"]) < 0.5 for row in rows)  # the maze is 0.6 m across
        resumed = tmp_path / "resumed"
        shutil.copytree(straight, resumed)
        (resumed / "result.json").unlink()
        trainer = Trainer(cfg, phase_of(cfg, "pretrain", cfg.task), resumed)
        trainer.load_state_dict(torch.load(resumed / "checkpoints" / "checkpoint_1000.pt", weights_only=True))
        trainer.run()
        assert without(read_csv(resumed / "analysis.csv")[1], "analysis/time_s") == without(rows, "analysis/time_s")
        summary = analyze_run(straight)
        last = rows[-1]
        assert (f"  reach at {float(last['frames']):.0f} frames: {float(last['reach/max_distance']):.3f} m"
                in summary.splitlines())
        assert (straight / "analysis" / "reach.png").is_file() and f"coverage at {last['frames']} frames" in summary
    finally:
        unregister_analysis(Reach)
    assert "reach/max_distance" not in analysis_columns()


@pytest.mark.slow
def test_resuming_with_other_analysis_settings_is_refused_with_a_reason(tmp_path):
    cfg = tiny_run_config(tmp_path)
    run_dir = tmp_path / "run"
    Trainer(cfg, phase_of(cfg, "pretrain", cfg.task), run_dir).run()
    state = torch.load(run_dir / "checkpoints" / "checkpoint_1000.pt", weights_only=True)
    for other, reason in [(tiny_run_config(tmp_path, analyses={"every_frames": None}), "written with analyses on"),
                          (tiny_run_config(tmp_path, analyses={"coverage_bins": 7}),
                           "coverage histogram has shape (20, 20)")]:
        trainer = Trainer(other, phase_of(other, "pretrain", cfg.task),
                          tmp_path / f"other_{other.analyses.coverage_bins}")
        with pytest.raises(CheckpointError, match=re.escape(reason)):
            trainer.load_state_dict(state)


def test_config_checks_analysis_values():
    for key, value in (("every_frames", 0), ("coverage_bins", 1), ("variance_repeats", 1),
                       ("variance_probes", 0), ("map_samples", 0)):
        with pytest.raises(ConfigError, match=rf"analyses\.{key}="):
            validate(tiny_run_config(".", analyses={key: value}), "pretrain")


# -- end to end: a pixel maze run, then protorl-analyze --------------------------------------------------------
@pytest.fixture(scope="module")
def maze_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("analysis") / "maze"
    # the first analysis (1000 frames = 125 agent steps) comes before the first update (seeding: 130 steps), when
    # Proto-RL's queue is still empty; the second after it
    overrides = [o for o in TINY if not o.startswith(("logging.tensorboard=", "training.seed_transitions="))]
    assert_ok(run("pretrain", *overrides, "logging.tensorboard=true", "training.seed_transitions=130",
                  "task=point_mass_maze_explore", "pretrain_frames=2000", "snapshots.at_frames=[]",
                  "analyses.every_frames=1000", "analyses.variance_probes=16", "analyses.variance_repeats=4",
                  "analyses.map_samples=64", run_dir=run_dir))
    return run_dir


@pytest.mark.slow
def test_maze_pretraining_writes_coverage_variance_and_maps(maze_run):
    phase = maze_run / "pretrain"
    columns, rows = read_csv(phase / "analysis.csv")
    assert [row["frames"] for row in rows] == ["1000", "2000"]
    for row in rows:
        for key in ("coverage/entropy", "coverage/visited_fraction", "coverage/replay_entropy"):
            assert 0.0 < float(row[key]) <= 1.0, (key, row)
        for scheme in ("proto", "uniform"):
            assert float(row[f"variance/{scheme}_mean"]) > 0 and float(row[f"variance/{scheme}_cv"]) >= 0
    assert float(rows[1]["coverage/visited_fraction"]) >= float(rows[0]["coverage/visited_fraction"])  # cumulative
    maps = [iio.imread(phase / "maps" / f"map_{frames}.png") for frames in (1000, 2000)]
    assert maps[0].ndim == 3 and maps[0].shape == maps[1].shape and maps[0].std() > 0
    assert iio.imread(phase / "maps" / "maps.gif", index=None).shape[0] == 2

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(phase / "tb"))
    events.Reload()
    assert {"coverage/entropy", "coverage/visited_fraction", "variance/proto_cv"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Images("maps/visitation")] == [1000, 2000]


@pytest.mark.slow
def test_analyze_command_writes_plots_and_summary(maze_run, capsys):
    analyze([str(maze_run)])
    printed = capsys.readouterr().out
    out = maze_run / "analysis"
    assert printed.strip() == (out / "analysis.txt").read_text().strip()
    assert "pre-training on point_mass_maze_explore: 2000 frames, complete" in printed
    assert "agent proto, seed" in printed  # the agent config chosen, as Hydra recorded it (agent=proto by default)
    assert "coverage at 2000 frames: normalised entropy" in printed and "uniform / proto" in printed
    for name in ("coverage.png", "variance.png", "map.png"):
        assert iio.imread(out / name).ndim == 3
    assert analyze_run(maze_run / "pretrain").startswith("protorl analysis")  # a phase directory works too


@pytest.mark.slow
def test_the_summary_names_the_agent_config_the_run_chose(maze_run, tmp_path):
    """agent=proto and agent=proto_variant share agent.name "proto": the summary names the one Hydra recorded."""
    variant = tmp_path / "variant"
    shutil.copytree(maze_run, variant)
    record = OmegaConf.load(variant / ".hydra" / "hydra.yaml")
    record.hydra.runtime.choices.agent = "proto_variant"
    OmegaConf.save(record, variant / ".hydra" / "hydra.yaml")
    assert "agent proto_variant, seed" in analyze_run(variant)


def test_analyze_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        analyze([str(tmp_path)])
    assert exit_info.value.code == 2
    assert "protorl: error:" in capsys.readouterr().err and "not a protorl run directory" in str(
        pytest.raises(ResultsError, analyze_run, tmp_path).value)
    with pytest.raises(ResultsError, match="not a directory"):
        analyze_run(tmp_path / "missing")
