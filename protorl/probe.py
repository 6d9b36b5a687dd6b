"""What a frozen encoder knows: a linear probe from its features to the environment's physical state.

    import protorl
    result = protorl.probe_snapshot("runs/maze/pretrain/snapshots/snapshot_100000.pt")
    print(result.table())     # R^2 per state dimension and their mean, for each kind of features

A uniform-random policy with a fixed seed collects `samples` observations of the snapshot's pre-training task, in
short episodes (many starting points), with their physical states (MuJoCo's qpos and qvel: for the U-maze the
point's x, y and velocity). A ridge regression from features (centred, one scale for all) to states is fit on the
first `1 - test_fraction` of them (each state dimension's strength chosen by 5-fold cross-validation on those)
and scored on the rest: R^2 per state dimension, and their mean. The features: the snapshot's encoder (and for
Proto-RL its projections), the same architecture randomly initialised (one row per init seed), and the
observations themselves (pixels average-pooled to `pool` x `pool` per channel, or the states): the reference
points a reader needs to tell learned features from an architecture's or the input's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from protorl.agents.capabilities import Prototypes
from protorl.envs import DMCEnv
from protorl.pretrained import Pretrained, load_pretrained

RIDGE_STRENGTHS = tuple(10.0**k for k in range(-4, 6))  # times N, on features of unit mean square
CV_FOLDS = 5  # contiguous blocks of the fitted frames, each held out in turn to choose the ridge strengths
EPISODE_STEPS = 50  # agent steps per episode of the random policy that collects the frames


@dataclass
class ProbeFrames:
    """Observations (N, *obs_shape) and their physical states (N, S), in the order the policy met them."""

    obs: np.ndarray
    states: np.ndarray
    state_names: list[str]  # S names, e.g. "position root_x", "velocity root_y"


def collect_frames(task: str, samples: int, seed: int, obs: str = "states", image_size: int = 84,
                   frame_stack: int = 3, action_repeat: int = 2, camera_id: int | None = None,
                   episode_steps: int = EPISODE_STEPS) -> ProbeFrames:
    """`samples` observations of a uniform-random policy on `task`, in episodes of at most `episode_steps` agent
    steps (many starts, so that the first frames and the held-out last ones come from the same distribution), the
    environment and the actions seeded by `seed`: the same frames on every call with the same arguments."""
    env = DMCEnv(task, obs=obs, image_size=image_size, frame_stack=frame_stack, action_repeat=action_repeat,
                 camera_id=camera_id, seed=seed)
    rng = np.random.default_rng(seed)
    observations, states = [], []
    time_step, steps = env.reset(), 0
    while len(observations) < samples:
        observations.append(time_step.obs)
        states.append(time_step.physical_state)
        if time_step.last or steps == episode_steps:
            time_step, steps = env.reset(), 0
        else:
            time_step, steps = env.step(rng.uniform(-1.0, 1.0, env.action_shape)), steps + 1
    names = state_names(env)
    env.close()
    return ProbeFrames(np.stack(observations), np.stack(states)[:, :len(names)], names)


def state_names(env: DMCEnv) -> list[str]:
    """The names of the physical state's position and velocity entries (qpos, then qvel)."""
    data = env.physics.named.data
    return ([f"position {name}" for name in data.qpos.axes.row.names] +
            [f"velocity {name}" for name in data.qvel.axes.row.names])


def ridge_r2(features: np.ndarray, targets: np.ndarray, test_fraction: float = 0.25) -> np.ndarray:
    """R^2 per target dimension (S,) of a ridge regression from features (N, F) to targets (N, S), fit on the first
    `1 - test_fraction` of the rows and scored on the rest; nan for a dimension constant on the scored rows. Each
    dimension's strength is the one with the least error over `CV_FOLDS` contiguous blocks of the fitted rows, each
    held out in turn."""
    x = torch.as_tensor(features, dtype=torch.float64).flatten(1)
    y = torch.as_tensor(targets, dtype=torch.float64)
    split = int(len(x) * (1 - test_fraction))
    fit_x, fit_y, test_x, test_y = x[:split], y[:split], x[split:], y[split:]
    validation = torch.zeros(len(RIDGE_STRENGTHS), y.shape[1], dtype=torch.float64)  # (K, S)
    for block in torch.arange(split).chunk(CV_FOLDS):
        kept = torch.ones(split, dtype=torch.bool)
        kept[block] = False
        fits = _ridge_fits(fit_x[kept], fit_y[kept], RIDGE_STRENGTHS)
        validation += torch.stack([_squared_error(predict, fit_x[block], fit_y[block]) for predict in fits])
    best = validation.argmin(dim=0)  # each state dimension's own strength, (S,)
    errors = torch.stack([_squared_error(predict, test_x, test_y)
                          for predict in _ridge_fits(fit_x, fit_y, RIDGE_STRENGTHS)])  # (K, S)
    error = errors.gather(0, best[None]).squeeze(0)  # (S,)
    total = ((test_y - test_y.mean(dim=0)) ** 2).sum(dim=0)  # (S,)
    r2 = 1 - error / total
    return torch.where(total > 0, r2, torch.nan).numpy()


def _ridge_fits(x: torch.Tensor, y: torch.Tensor, strengths: Sequence[float]
                ) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """Ridge regressions from features x (N, F), centred and divided by their overall RMS (one scale for all, so
    that a feature nearly constant on these rows is not blown up), to targets y (N, S), one per strength (penalty
    strength * N): their prediction functions (M, F) -> (M, S). One eigendecomposition, of X'X (F, F) or of XX'
    (N, N) whichever is smaller, serves them all."""
    mean = x.mean(dim=0)
    scale = (x - mean).square().mean().sqrt().clamp(min=torch.finfo(x.dtype).tiny)
    xs, y_mean = (x - mean) / scale, y.mean(dim=0)
    centred = y - y_mean
    primal = xs.shape[1] <= xs.shape[0]
    eigenvalues, eigenvectors = torch.linalg.eigh(xs.T @ xs if primal else xs @ xs.T)
    rotated = eigenvectors.T @ (xs.T @ centred if primal else centred)  # (F or N, S)
    fits = []
    for strength in strengths:
        solved = eigenvectors @ (rotated / (eigenvalues.clamp(min=0) + strength * len(x))[:, None])
        weights = solved if primal else xs.T @ solved  # (F, S)
        fits.append(lambda new, w=weights: ((new - mean) / scale) @ w + y_mean)
    return fits


def _squared_error(predict: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor
                   ) -> torch.Tensor:
    """The summed squared error per target dimension (S,) of `predict` on x (M, F) against y (M, S)."""
    return ((predict(x) - y) ** 2).sum(dim=0)


def pooled(obs: np.ndarray, pool: int) -> np.ndarray:
    """Observations as features: pixels (N, C, H, W) average-pooled to (N, C * pool * pool) in [0, 1]; states
    (N, S) as they are."""
    if obs.ndim == 2:
        return obs.astype(np.float32)
    frames = torch.as_tensor(obs, dtype=torch.float32) / 255.0
    return F.adaptive_avg_pool2d(frames, pool).flatten(1).numpy()


@torch.no_grad()
def encoded(pretrained: Pretrained, obs: np.ndarray, project: bool = False, chunk: int = 256) -> np.ndarray:
    """The frozen encoder's features (N, R) of observations (N, *obs_shape), or its L2-normalised projections."""
    encode = pretrained.project if project else pretrained.encode
    return torch.cat([encode(obs[i:i + chunk]).float().cpu() for i in range(0, len(obs), chunk)]).numpy()


def randomly_initialised(pretrained: Pretrained, seed: int) -> Pretrained:
    """An untrained `Pretrained` of the same agent and architecture, its networks initialised under `seed`."""
    agent = pretrained.agent
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        twin = type(agent)(agent.obs_type, pretrained.obs_shape, agent.action_shape, agent.cfg, agent.device,
                           "frozen")
    return Pretrained(twin, pretrained.env_spec, pretrained.config, frames=0)


@dataclass
class ProbeResult:
    """R^2 per state dimension for each kind of features (rows), on `samples` frames of `task`."""

    task: str
    samples: int
    seed: int
    state_names: list[str]
    rows: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # features -> R^2 (S,)

    def mean(self, features: str) -> float:
        """The mean R^2 over the state dimensions (those not constant on the scored frames)."""
        return float(np.nanmean(self.rows[features]))

    def table(self) -> str:
        """The rows as a text table: features, mean R^2, R^2 per state dimension."""
        width = max(len(name) for name in self.rows)
        header = f"{'features':<{width}}  {'mean':>6}  " + "  ".join(f"{n:>18}" for n in self.state_names)
        lines = [f"linear state probe on {self.samples} frames of {self.task} (uniform-random policy, seed "
                 f"{self.seed}; R^2 on the held-out quarter)", header]
        for name, r2 in self.rows.items():
            lines.append(f"{name:<{width}}  {self.mean(name):6.3f}  " + "  ".join(f"{v:18.3f}" for v in r2))
        return "\n".join(lines)

    def csv_rows(self) -> list[dict[str, str | float]]:
        """One dict per features: `features`, `r2_mean` and `r2/<state dimension>`."""
        return [{"features": name, "r2_mean": self.mean(name),
                 **{f"r2/{dim}": float(v) for dim, v in zip(self.state_names, r2, strict=True)}}
                for name, r2 in self.rows.items()]


def probe_snapshot(path: str | Path, samples: int = 4000, seed: int = 0, init_seeds: Sequence[int] = (1, 2, 3),
                   pool: int = 16, test_fraction: float = 0.25, device: str | torch.device = "auto") -> ProbeResult:
    """The linear state probe of a pre-training snapshot (module docstring): its encoder, its projections
    (Proto-RL), randomly initialised encoders of the same architecture (`init_seeds`) and the pooled observations,
    on `samples` frames of its pre-training task collected with `seed`."""
    pretrained = load_pretrained(path, device)
    config = pretrained.config
    task = config.get("pretrain_env") or config["env"]
    spec = pretrained.env_spec
    frames = collect_frames(task, samples, seed, obs=spec["obs_type"], image_size=config["image_size"],
                            frame_stack=config["frame_stack"], action_repeat=spec["action_repeat"],
                            camera_id=config.get("camera_id"))
    result = ProbeResult(task, samples, seed, frames.state_names)

    def probe(features: np.ndarray) -> np.ndarray:
        return ridge_r2(features, frames.states, test_fraction)

    result.rows[f"encoder ({pretrained.frames} frames)"] = probe(encoded(pretrained, frames.obs))
    if isinstance(pretrained.agent, Prototypes):
        result.rows[f"projection ({pretrained.frames} frames)"] = probe(encoded(pretrained, frames.obs, project=True))
    for init_seed in init_seeds:
        result.rows[f"random encoder (init seed {init_seed})"] = probe(
            encoded(randomly_initialised(pretrained, init_seed), frames.obs))
    result.rows["observation" + (f" (pooled {pool}x{pool})" if frames.obs.ndim > 2 else "")] = probe(
        pooled(frames.obs, pool))
    return result
