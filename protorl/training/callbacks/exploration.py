"""The pre-training analyses on a schedule: state coverage, figure 1's map and the reward variance.

A training callback (`protorl.training.callbacks`): every time step's physical state is kept (a list append) and,
at the episode's end, binned into a cumulative histogram of every state visited in the phase (unlike the
ring buffer, it never forgets). Every `analyses.every_frames`, at the next episode end, and once at the
end of the phase, one row goes to `analysis.csv` and TensorBoard:

- `coverage/entropy`, `coverage/visited_fraction`: of the cumulative histogram;
- `coverage/replay_entropy`: of the states in the replay buffer now, the paper's reading of section 5.6
  (differs from the cumulative one once the buffer has wrapped);
- `coverage/random_entropy`, `coverage/random_visited_fraction`: the same for a uniform-random policy over
  the same number of frames (`random_reference`; `protorl.exploration.random_reference`);
- `variance/*` (agents with prototypes): `protorl.exploration.reward_variance.reward_variance` on a probe set drawn
  once, at the first analysis, from the replay;
- for the point-mass arenas, `maps/map_<frames>.png` (also TensorBoard image `maps/visitation`), and
  at the end `maps/maps.gif`; for Proto-RL the map has a second panel, the reward field.

Each analysis draws from its own generators seeded by (seed, frames), and the histogram, the probes, the
schedule and the CSV position are in `state_dict()`: a resumed run logs the same rows as a straight one.
"""

from __future__ import annotations

import time
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import torch
import torch.nn.functional as F

from protorl.agents.capabilities import Prototypes
from protorl.config import AnalysesConfig, EnvConfig
from protorl.envs import Env, Simulated, TimeStep, make_env
from protorl.errors import CheckpointError
from protorl.exploration.coverage import coverage_entropy, coverage_spec, histogram, visited_fraction
from protorl.exploration.maps import (
    MAP_DOMAINS,
    closest_samples,
    landmarks,
    map_paths,
    render_map,
    reward_field,
    wall_rectangles,
    write_animation,
)
from protorl.exploration.probe import ProbeFrames, collect_frames, ridge_r2
from protorl.exploration.random_reference import RandomPolicyCoverage
from protorl.exploration.reward_variance import ReplayProjections, embed, reward_variance
from protorl.logs.logger import CSVFile, Logger
from protorl.replay import ReplayBuffer
from protorl.training.callbacks import Callback, Every

COLUMNS = [
    "frames", "coverage/entropy", "coverage/visited_fraction", "coverage/replay_entropy",
    "coverage/random_entropy", "coverage/random_visited_fraction",
    "variance/proto_mean", "variance/proto_std", "variance/proto_cv",
    "variance/uniform_mean", "variance/uniform_std", "variance/uniform_cv",
    "probe/encoder_r2", "probe/projection_r2", "analysis/time_s",
]
# why a checkpoint is refused when it was written with analyses on or off and this run has them the other way
OTHER_SETTINGS = ("checkpoint was written with analyses {}: resume with the run's own analyses.every_frames, or "
                  "start over with start_over=true")


class AnalysisMonitor(Callback):
    """Coverage, maps and reward variance of one pre-training phase, written into `out_dir`."""

    def __init__(self, cfg: AnalysesConfig, env_cfg: EnvConfig, seed: int, downstream_tasks: list[str],
                 total_frames: int, env: Env, agent, replay: ReplayBuffer, logger: Logger, out_dir: Path):
        """`env_cfg`, `seed`: how the training environment was made, for the probe's own frames; `downstream_tasks`:
        the targets marked on the maps; `total_frames`: the phase's budget."""
        self.cfg, self.env_cfg, self.seed, self.total_frames = cfg, env_cfg, seed, total_frames
        self.agent, self.replay, self.logger = agent, replay, logger
        self.schedule = Every(cfg.every_frames)
        self.last_frames = -1  # frames of the latest analysis
        self.env = env  # the training environment: its task and physics, read only
        self.spec = coverage_spec(env.domain, env.physics, cfg.coverage_bins) if isinstance(env, Simulated) else None
        self.counts = None if self.spec is None else np.zeros(self.spec.shape, dtype=np.int64)
        self._pending: list[np.ndarray] = []  # this episode's physical states, binned at its end
        self.probes: np.ndarray | None = None  # (P, *obs_shape), drawn at the first analysis
        self.map_dir = out_dir / "maps"
        draws_maps = self.spec is not None and env.domain in MAP_DOMAINS
        self.walls = wall_rectangles(env.physics) if draws_maps else None
        self.landmarks = landmarks(env.domain, downstream_tasks) if draws_maps else None
        self.random_policy = None  # the coverage of a uniform-random policy over the same frames
        if self.spec is not None and cfg.random_reference:
            self.random_policy = RandomPolicyCoverage(env.task, env.action_repeat, self.spec, seed)
        self.probe_frames: ProbeFrames | None = None  # the state probe's frames, collected at the first analysis
        self.probe_env = None  # renders the reward map's observations, apart from the training environment
        if draws_maps and isinstance(agent, Prototypes):
            self.probe_env = make_env(env.task, env_cfg, seed=seed)
        self.csv = CSVFile(out_dir / "analysis.csv", COLUMNS)

    def on_time_step(self, time_step: TimeStep) -> None:
        self._pending.append(time_step.physical_state)

    def on_episode_end(self, frames: int) -> None:
        """Bin the episode's states; analyse if an analysis is due."""
        if self.counts is not None and self._pending:
            self.counts += histogram(np.stack(self._pending), self.spec).reshape(self.spec.shape)
        self._pending.clear()
        if self.schedule.due(frames):
            self.analyze(frames)

    def on_phase_end(self, frames: int) -> None:
        """A last analysis (unless one just ran) and the maps' animation."""
        self.on_episode_end(frames)
        if self.last_frames != frames:
            self.analyze(frames)
        paths = map_paths(self.map_dir, frames)
        if paths:
            write_animation(paths, self.map_dir / "maps.gif")
        self.csv.close()

    def analyze(self, frames: int) -> dict[str, float]:
        """Compute, write and log one row of analyses at `frames`."""
        started = time.time()
        rng = np.random.default_rng([self.seed, frames])
        row: dict[str, float] = {"frames": frames}
        if self.spec is not None:
            replay_counts = histogram(self.replay.stored_physical_states(), self.spec)
            row.update({"coverage/entropy": coverage_entropy(self.counts),
                        "coverage/visited_fraction": visited_fraction(self.counts),
                        "coverage/replay_entropy": coverage_entropy(replay_counts)})
        if self.random_policy is not None:
            random_counts = self.random_policy.counts_at(frames)
            row.update({"coverage/random_entropy": coverage_entropy(random_counts),
                        "coverage/random_visited_fraction": visited_fraction(random_counts)})
        # the replay's projections, each observation encoded once for the reward variance and the map
        projections = ReplayProjections(self.agent, self.replay) if isinstance(self.agent, Prototypes) else None
        if projections is not None and len(self.replay) > 0:
            if self.probes is None:
                self.probes = self.replay.stack_at(self.replay.sample_indices(self.cfg.variance_probes, rng))
            generator = torch.Generator(device=self.agent.device).manual_seed(int(rng.integers(2**62)))
            row.update(reward_variance(self.agent, self.replay, self.probes, self.cfg.variance_repeats, rng,
                                       generator, projections))
        if self.cfg.probe_samples is not None and isinstance(self.env, Simulated):
            row.update(self._probe())
        if self.walls is not None:
            self._write_map(frames, rng, projections)
        row["analysis/time_s"] = time.time() - started
        self.csv.write(row)
        self.logger.log_scalars(row)
        self.last_frames = frames
        return row

    @torch.no_grad()
    def _probe(self) -> dict[str, float]:
        """The state probe's mean R^2 of the online encoder (and the projections) on fixed uniform-random frames."""
        if self.probe_frames is None:
            env_cfg = self.env_cfg
            self.probe_frames = collect_frames(self.env.task, self.cfg.probe_samples, self.seed, obs=env_cfg.obs,
                                               image_size=env_cfg.image_size, frame_stack=env_cfg.frame_stack,
                                               action_repeat=env_cfg.action_repeat, camera_id=env_cfg.camera_id)
        obs, states = self.probe_frames.obs, self.probe_frames.states
        chunks = [torch.as_tensor(obs[i:i + 256], device=self.agent.device) for i in range(0, len(obs), 256)]
        row = {"probe/encoder_r2": float(np.nanmean(ridge_r2(
            torch.cat([self.agent.encoder(chunk).float().cpu() for chunk in chunks]).numpy(), states)))}
        if isinstance(self.agent, Prototypes):
            projections = F.normalize(self.agent.embed(torch.as_tensor(obs, device=self.agent.device)), dim=1)
            row["probe/projection_r2"] = float(np.nanmean(ridge_r2(projections.float().cpu().numpy(), states)))
        return row

    def _write_map(self, frames: int, rng: np.random.Generator, projections: ReplayProjections | None) -> None:
        prototype_xy = reward = None
        if projections is not None and len(self.replay) > 0:
            ends = self.replay.sample_indices(self.cfg.map_samples, rng)
            closest = closest_samples(F.normalize(projections.at(ends), dim=1), self.agent.prototypes)
            states = self.replay.physical_states[ends[closest.cpu().numpy()] % self.replay.capacity]
            prototype_xy = states[:, self.spec.columns]  # (M, 2)
        if self.probe_env is not None:  # before the queue holds k candidates, an empty panel of the same size
            reward = (reward_field(self._score, self.probe_env, self.spec, self.walls) if self.agent.can_score
                      else np.full(self.spec.shape, np.nan))
        image = render_map(self.counts, self.spec, self.walls, prototype_xy, frames, reward, self.landmarks)
        self.map_dir.mkdir(parents=True, exist_ok=True)
        iio.imwrite(self.map_dir / f"map_{frames}.png", image)
        self.logger.log_image("maps/visitation", image, frames)

    @torch.no_grad()
    def _score(self, obs: np.ndarray) -> np.ndarray:
        """The agent's intrinsic reward of observations (N, *obs_shape) against its queue now, unchanged: (N,)."""
        return self.agent.score(embed(self.agent, obs)).squeeze(1).cpu().numpy()

    # -- checkpoints -------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Drop the rows and maps an earlier attempt of this phase wrote without leaving a checkpoint."""
        self.csv.reset()
        for path in map_paths(self.map_dir, self.total_frames) if self.map_dir.is_dir() else []:
            path.unlink()

    def state_dict(self) -> dict:
        pending = np.stack(self._pending) if self._pending else np.zeros((0, 0))
        self.csv.sync()
        return {"monitor": {
            "next_frames": self.schedule.next, "last_frames": self.last_frames, "csv": self.csv.tell(),
            "counts": None if self.counts is None else torch.from_numpy(self.counts.copy()),
            "pending": torch.from_numpy(pending),
            "probes": None if self.probes is None else torch.from_numpy(self.probes.copy())}}

    def load_state_dict(self, checkpoint: dict) -> None:
        """Continue from `state_dict()`; rows written after it are dropped from `analysis.csv`."""
        state = checkpoint["monitor"]
        if state is None:
            raise CheckpointError(OTHER_SETTINGS.format("off"))
        saved_shape = None if state["counts"] is None else tuple(state["counts"].shape)
        if saved_shape != (None if self.counts is None else self.counts.shape):
            raise CheckpointError(f"checkpoint's coverage histogram has shape {saved_shape}, this run's "
                                  f"{None if self.counts is None else self.counts.shape}: resume with the run's "
                                  "own analyses.coverage_bins, or start over with start_over=true")
        self.schedule.next, self.last_frames = int(state["next_frames"]), int(state["last_frames"])
        self.csv.truncate(state["csv"])
        if self.counts is not None:
            self.counts[...] = state["counts"].numpy()
        self._pending = list(state["pending"].numpy())
        self.probes = None if state["probes"] is None else state["probes"].numpy()


class NoAnalyses(Callback):
    """A phase without analyses: its checkpoints say so, and one written with analyses is refused."""

    def state_dict(self) -> dict:
        return {"monitor": None}

    def load_state_dict(self, checkpoint: dict) -> None:
        if checkpoint["monitor"] is not None:
            raise CheckpointError(OTHER_SETTINGS.format("on"))
